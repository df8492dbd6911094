"""Autoregressive sampling with a KV cache: temperature, top-k, top-p, repetition penalty, stop sequences,
batched prompts and streaming.

Logits are processed in Hugging Face's order: repetition penalty → temperature → top-k → top-p.
Each prompt samples from its own generator seeded with `seed` (or its own entry of a list of seeds), so a
prompt continues the same way alone or inside a batch.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterator, Sequence

import torch

from burnout.base.files import EOT_TOKEN
from burnout.core.device import autocast, configure_backends, resolve_precision
from burnout.data.tokenizer import encode_text
from burnout.errors import BurnoutError
from burnout.models import Transformer
from burnout.models.cpu_paths import few_row_products, linear, packs_weights

# An empty continuation as every place that shows one says it (a log line, the report, compare, `burnout generate`),
# rather than printing nothing.
EMPTY_CONTINUATION = "(empty: the model ended the text at once)"


def shown(continuation: str, stop: Sequence[str] = ()) -> str:
    """A continuation as a person is shown it: an empty one said as such (with `stop` sequences, which may have
    cut it, said too)."""
    if continuation:
        return continuation
    return "(empty: the model ended the text, or began a stop sequence, at once)" if stop else EMPTY_CONTINUATION


def shown_sample(sample: str, prompt: str) -> str:
    """A sample (`prompt` and its continuation, as training logs it) as a person is shown it: an empty
    continuation said after the prompt."""
    return f"{sample} {shown('')}" if sample == prompt else sample


def check_sampling(model: Transformer, prompt_ids: Sequence[int], temperature: float, top_k: int | None,
                   top_p: float | None, repetition_penalty: float) -> None:
    context = model.cfg.context_length
    if not prompt_ids:
        raise BurnoutError("the prompt is empty after tokenization; give at least one character")
    if len(prompt_ids) >= context:
        raise BurnoutError(
            f"the prompt is {len(prompt_ids)} tokens but the model's context is {context}; shorten the prompt"
        )
    # Written so that NaN fails them: every comparison with NaN is false.
    if not (math.isfinite(temperature) and temperature >= 0):
        raise BurnoutError(f"temperature {temperature} must be a finite number, 0 (greedy) or more")
    if top_k is not None and top_k < 1:
        raise BurnoutError(f"top-k {top_k} must be at least 1 (or unset for no top-k)")
    if top_p is not None and not 0 < top_p <= 1:
        raise BurnoutError(f"top-p {top_p} must be in (0, 1]")
    if not (math.isfinite(repetition_penalty) and repetition_penalty > 0):
        raise BurnoutError(f"repetition penalty {repetition_penalty} must be a finite positive number (1 means none)")


def process_logits(
    logits: torch.Tensor,
    recent: Sequence[int],
    temperature: float,
    top_k: int | None,
    top_p: float | None,
    repetition_penalty: float,
) -> torch.Tensor:
    """(V,) logits → the logits actually sampled from; filtered tokens get -inf."""
    if repetition_penalty != 1.0 and recent:
        # CTRL's penalty, as HF applies it: shrink positive logits, push negative ones further down.
        ids = torch.tensor(sorted(set(recent)), device=logits.device)
        seen = logits[ids]
        logits = logits.clone()
        logits[ids] = torch.where(seen > 0, seen / repetition_penalty, seen * repetition_penalty)
    if temperature == 0:
        return logits
    logits = logits / temperature
    if top_k is not None and top_k < logits.numel():
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = logits.sort(descending=True)
        probs = sorted_logits.softmax(dim=-1)
        # Keep the smallest prefix whose mass reaches top_p: drop a token once the mass before it does.
        drop = probs.cumsum(dim=-1) - probs >= top_p
        logits = logits.masked_fill(drop.scatter(0, order, drop), float("-inf"))
    return logits


def sample_next(logits: torch.Tensor, temperature: float, generator: torch.Generator) -> int:
    if temperature == 0:
        return int(logits.argmax())
    return int(torch.multinomial(logits.softmax(dim=-1), 1, generator=generator))


@torch.inference_mode()
def stream_batch(
    model: Transformer,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    repetition_penalty: float = 1.0,
    repetition_window: int = 64,
    seed: int | Sequence[int] | None = None,
    stop_id: int | Collection[int] | None = None,
    is_done: Callable[[int, list[int]], bool] | None = None,
) -> Iterator[list[int | None]]:
    """Decode prompts together; each step yields every row's new token (None once done).

    Prompts of different lengths are padded on the left: a row's pad slots are masked out of every
    attention and its positions count from its own first token, so it continues as it would alone, up to
    float rounding (the padded batch's kernels sum in another order). A row is done at stop_id (one id or
    several; not yielded), when is_done(row, its new ids) says so, after max_new_tokens, or when the
    context window is full (for the longest prompt).
    """
    for p in prompts:
        check_sampling(model, p, temperature, top_k, top_p, repetition_penalty)
    stop_ids = {stop_id} if isinstance(stop_id, int) else set(stop_id or ())
    device = model.tok_emb.weight.device
    precision = resolve_precision("auto", device)
    configure_backends(device)
    # A list of seeds gives each row its own: copies of one prompt then sample different continuations.
    seeds = list(seed) if isinstance(seed, Sequence) else [seed] * len(prompts)
    generators = [_generator(device, row_seed) for row_seed in seeds]
    context, length = model.cfg.context_length, max(len(p) for p in prompts)
    steps = min(max_new_tokens, context - length)
    if steps <= 0:
        return
    was_training = model.training
    model.eval()
    history = [list(p) for p in prompts]
    new: list[list[int]] = [[] for _ in prompts]
    done = [False] * len(prompts)
    cache = model.new_cache(len(prompts), length + steps)
    pads = torch.tensor([length - len(p) for p in prompts], device=device)  # (B,)
    step_input = torch.tensor([[0] * (length - len(p)) + list(p) for p in prompts], dtype=torch.long, device=device)
    # With pads: each step's positions and attention mask (None: one length, the model's own causal mask).
    masking = _pad_masking(pads, length, steps) if bool(pads.any()) else None
    # Greedy without a penalty needs no per-row processing: one argmax for the whole batch, and its
    # result is the next step's input as it is (no Python list turned back into a tensor).
    plain_greedy = temperature == 0 and repetition_penalty == 1.0
    packed = packs_weights(model)
    try:
        for t in range(steps):
            positions, mask = masking(t) if masking is not None else (None, None)
            # The prompt runs under autocast on a GPU (bf16, fp16 before Ampere): many tokens at once, where
            # tensor cores and flash attention pay. A one-token step is bound by reading the weights, and
            # autocast would cast each of them anew at every step (its cast cache lasts one autocast region),
            # so those steps stay fp32 (TF32).
            with autocast(device, precision if step_input.size(1) > 1 else "fp32"), few_row_products(packed):
                # The head at the last position only: over the whole prompt, a 50k vocabulary's head
                # cost more than the rest of the prefill (benchmarks/bench_harness.py; docs/PERFORMANCE.md).
                hidden = model.hidden_states(step_input, cache, positions, mask, last_only=True)
                logits = linear(model.lm_head, hidden[:, -1])  # (B, V)
            if plain_greedy:
                next_ids = logits.argmax(dim=-1)
                tokens = next_ids.tolist()
            else:
                logits = logits.float()
            out: list[int | None] = []
            for row in range(len(prompts)):
                if done[row]:
                    out.append(None)
                    continue
                if plain_greedy:
                    token = tokens[row]
                else:
                    recent = history[row][-repetition_window:] if repetition_window > 0 else history[row]
                    processed = process_logits(logits[row], recent, temperature, top_k, top_p, repetition_penalty)
                    token = sample_next(processed, temperature, generators[row])
                history[row].append(token)
                if token in stop_ids:
                    done[row] = True
                    out.append(None)
                    continue
                new[row].append(token)
                out.append(token)
                if is_done is not None and is_done(row, new[row]):
                    done[row] = True
            if all(t is None for t in out):
                return
            yield out
            if all(done):
                return
            # Finished rows keep being fed their last token: the batch stays rectangular, their output is ignored.
            if plain_greedy and not any(done):
                step_input = next_ids.view(-1, 1)
            else:
                step_input = torch.tensor([[h[-1]] for h in history], dtype=torch.long, device=device)
    finally:
        model.train(was_training)


def _generator(device: torch.device, seed: int | None) -> torch.Generator:
    generator = torch.Generator(device=device)
    if seed is not None:
        generator.manual_seed(seed)
    else:  # a fresh Generator starts from one fixed default seed: without this, every call samples alike
        generator.seed()
    return generator


def _pad_masking(pads: torch.Tensor, length: int, steps: int):
    """For left-padded prompts (pads: each row's pad count, `length` the padded width): step t → (positions
    (B, T), mask (B, T, keys)). Step 0 is the prompt; step t > 0 is the token in slot length + t - 1."""
    slots = torch.arange(length + steps, device=pads.device)
    real = slots[None, :] >= pads[:, None]  # (B, S): the slots holding a row's own tokens
    prompt_positions = (slots[None, :length] - pads[:, None]).clamp(min=0)  # (B, L)
    causal = torch.ones(length, length, dtype=torch.bool, device=pads.device).tril()
    # A pad slot's query sees itself only: a row of the mask with no key at all would give NaN in softmax,
    # and NaN values, even weighted by 0, would reach the real tokens.
    prompt_mask = (causal[None] & real[:, None, :length]) | torch.eye(length, dtype=torch.bool, device=pads.device)

    def at(t: int) -> tuple[torch.Tensor, torch.Tensor]:
        if t == 0:
            return prompt_positions, prompt_mask
        return (length - pads + t - 1)[:, None], real[:, None, : length + t]

    return at


def stream_tokens(model: Transformer, prompt_ids: Sequence[int], max_new_tokens: int, **sampling) -> Iterator[int]:
    """Yield one prompt's new token ids one at a time (temperature 0 means greedy); see stream_batch."""
    for (token,) in stream_batch(model, [prompt_ids], max_new_tokens, **sampling):
        if token is not None:
            yield token


def generate_batch(model: Transformer, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                   is_done: Callable[[int, list[int]], bool] | None = None, pad: bool = False,
                   **sampling) -> list[list[int]]:
    """New token ids for each prompt. Prompts of equal length decode together in one batch; with `pad`, all of
    them in one left-padded batch, however many lengths. Either way a row continues as it would alone up to float
    rounding: a GEMM over more rows may sum in another order (logits within ~1e-6). is_done(prompt index, its new
    ids) ends a prompt early; `seed` may be a list, one per prompt."""
    seed = sampling.pop("seed", None)
    by_length: dict[int, list[int]] = {}
    for i, p in enumerate(prompts):
        by_length.setdefault(0 if pad else len(p), []).append(i)
    out: list[list[int]] = [[] for _ in prompts]
    for rows in by_length.values():
        row_done = (lambda r, ids, rows=rows: is_done(rows[r], ids)) if is_done is not None else None
        seeds = [seed[i] for i in rows] if isinstance(seed, Sequence) else seed
        for step in stream_batch(model, [prompts[i] for i in rows], max_new_tokens, is_done=row_done, seed=seeds,
                                 **sampling):
            for r, token in enumerate(step):
                if token is not None:
                    out[rows[r]].append(token)
    return out


# ----------------------------------------------------------------------------------------------
# Text


def _cut_at_stop(text: str, stop: Sequence[str]) -> int | None:
    hits = [i for s in stop if s and (i := text.find(s)) >= 0]
    return min(hits) if hits else None


def stream_text(model: Transformer, tokenizer, prompt: str, max_new_tokens: int, stop: Sequence[str] = (),
                where: str = "the prompt", **sampling) -> Iterator[str]:
    """The continuation of `prompt` as printable pieces, ending at <|endoftext|> or before the first stop
    sequence. Text that might be half a character, or the start of a stop sequence, is held back until
    the next tokens settle it. Bad settings, a too-long prompt or one the tokenizer cannot encode (named as
    `where`) raise here, before anything streams."""
    prompt_ids = encode_text(tokenizer, prompt, where)
    check_sampling(model, prompt_ids, sampling.get("temperature", 1.0), sampling.get("top_k"), sampling.get("top_p"),
                   sampling.get("repetition_penalty", 1.0))
    return stream_continuation(model, tokenizer, prompt_ids, max_new_tokens, stop, **sampling)


def stream_continuation(model: Transformer, tokenizer, prompt_ids: list[int], max_new_tokens: int,
                        stop: Sequence[str] = (), stop_ids: Collection[int] | None = None,
                        new_ids: list[int] | None = None, **sampling) -> Iterator[str]:
    """The text of the tokens sampled after `prompt_ids` as printable pieces, up to a stop id (default:
    <|endoftext|>'s; none of them printed) or before the first stop sequence (see stream_text). The sampled ids
    are appended to `new_ids` when given (for a caller that counts them)."""
    if stop_ids is None:
        stop_ids = [tokenizer.token_to_id(EOT_TOKEN)]
    if new_ids is None:
        new_ids = []
    printed = 0
    for token in stream_tokens(model, prompt_ids, max_new_tokens, stop_id=[i for i in stop_ids if i is not None],
                               **sampling):
        new_ids.append(token)
        # Decode the whole continuation each time: a byte-level token can be half a character.
        text = tokenizer.decode(new_ids)
        cut = _cut_at_stop(text, stop)
        if cut is not None:
            if cut > printed:
                yield text[printed:cut]
            return
        safe = len(text.rstrip("\ufffd"))
        for s in stop:  # hold back a suffix that could grow into a stop sequence
            for k in range(min(len(s) - 1, safe), 0, -1):
                if text[safe - k : safe] == s[:k]:
                    safe -= k
                    break
        if safe > printed:
            yield text[printed:safe]
            printed = safe
    text = tokenizer.decode(new_ids)
    if len(text) > printed:
        yield text[printed:]


def generate_text(model: Transformer, tokenizer, prompt: str, max_new_tokens: int, **sampling) -> str:
    """The prompt followed by its continuation."""
    return prompt + "".join(stream_text(model, tokenizer, prompt, max_new_tokens, **sampling))


def generate_texts(model: Transformer, tokenizer, prompts: Sequence[str], max_new_tokens: int,
                   stop: Sequence[str] = (), **sampling) -> list[str]:
    """Each prompt followed by its continuation, decoded in batches (see generate_batch). A prompt the tokenizer
    cannot encode is a BurnoutError naming it by its number, before anything is generated."""
    prompt_ids = [encode_text(tokenizer, p, f"prompt {number}") for number, p in enumerate(prompts, start=1)]
    new_ids = generate_batch(
        model, prompt_ids, max_new_tokens, stop_id=tokenizer.token_to_id(EOT_TOKEN),
        is_done=(lambda row, ids: _cut_at_stop(tokenizer.decode(ids), stop) is not None) if stop else None,
        **sampling,
    )
    out = []
    for prompt, ids in zip(prompts, new_ids):
        text = tokenizer.decode(ids)
        cut = _cut_at_stop(text, stop)
        out.append(prompt + (text if cut is None else text[:cut]))
    return out
