"""Autoregressive sampling with a KV cache: temperature and top-k."""

from __future__ import annotations

from collections.abc import Iterator

import torch

from burnout.errors import BurnoutError
from burnout.models import Transformer


@torch.no_grad()
def stream_tokens(
    model: Transformer,
    prompt_ids: list[int],
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    seed: int | None = None,
    stop_id: int | None = None,
) -> Iterator[int]:
    """Yield new token ids one at a time. temperature 0 means greedy (argmax).

    Stops after max_new_tokens, at stop_id (not yielded), or when the context window is full.
    """
    context = model.cfg.context_length
    if not prompt_ids:
        raise BurnoutError("the prompt is empty after tokenization; give at least one character")
    if len(prompt_ids) >= context:
        raise BurnoutError(
            f"the prompt is {len(prompt_ids)} tokens but the model's context is {context}; shorten the prompt"
        )
    if temperature < 0:
        raise BurnoutError(f"temperature {temperature} is negative; use 0 (greedy) or more")
    device = model.tok_emb.weight.device
    generator = torch.Generator(device=device)
    if seed is not None:
        generator.manual_seed(seed)
    was_training = model.training
    model.eval()
    cache = model.new_cache(1, min(context, len(prompt_ids) + max_new_tokens))
    step_input = torch.tensor([prompt_ids], dtype=torch.long, device=device)
    try:
        for _ in range(min(max_new_tokens, context - len(prompt_ids))):
            logits = model(step_input, cache=cache)[0, -1].float()  # (V,)
            next_id = sample_next(logits, temperature, top_k, generator)
            if next_id == stop_id:
                return
            yield next_id
            step_input = torch.tensor([[next_id]], dtype=torch.long, device=device)
    finally:
        model.train(was_training)


def sample_next(logits: torch.Tensor, temperature: float, top_k: int | None, generator: torch.Generator) -> int:
    if temperature == 0:
        return int(logits.argmax())
    logits = logits / temperature
    if top_k is not None and top_k < logits.numel():
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = logits.softmax(dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator))


def generate_text(model: Transformer, tokenizer, prompt: str, max_new_tokens: int, **sampling) -> str:
    """The prompt followed by its continuation, decoded."""
    prompt_ids = tokenizer.encode(prompt).ids
    stop_id = tokenizer.token_to_id("<|endoftext|>")
    new_ids = list(stream_tokens(model, prompt_ids, max_new_tokens, stop_id=stop_id, **sampling))
    return tokenizer.decode(prompt_ids + new_ids)
