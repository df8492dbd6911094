"""Log-likelihood scoring, computed the way lm-evaluation-harness's HF causal-LM model computes it.

The numbers are lm-eval's (requests split as `encode_requests` says, the metrics of `item_metrics`), so that a
score here is one a reader can check with lm-eval itself (tests/eval/test_lm_eval_equality.py); the work is less
(`score_requests`): requests that share a prefix (a multiple-choice item's context; a schema item's few-shot text
and the start of its options) are computed once as masked branches of one row, and the LM head runs only where a
continuation token is predicted.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from tokenizers import Tokenizer

from burnout.base.files import EOT_TOKEN
from burnout.core.device import autocast, configure_backends, resolve_precision
from burnout.data.tokenizer import unencodable, unencodable_error
from burnout.errors import BurnoutError
from burnout.eval.tasks import Example, Item
from burnout.models import Transformer


class RequestScore(NamedTuple):
    loglikelihood: float  # sum of the continuation's token log-probs
    greedy: bool  # every continuation token is the argmax at its position
    tokens: int  # continuation tokens
    truncated: bool  # the context lost tokens on the left to fit the model's window


# A row of a batch: a prefix, then branches (tokens fed after the prefix, the tokens they predict).
Group = tuple[list[int], list[tuple[int, list[int], list[int]]]]  # (prefix, [(request, branch, targets)])


def encode_requests(
    tokenizer: Tokenizer, requests: list[tuple[str, str]], prefix_id: int | None
) -> list[tuple[list[int], list[int]]]:
    """(context ids, continuation ids) for each (context, continuation), split as lm-eval splits them
    (lm_eval/api/model.py `_encode_pair`, lm_eval/models/huggingface.py `_loglikelihood_tokens`):

      1. trailing spaces of the context move to the front of the continuation;
      2. whole = encode(context + continuation), context_ids = encode(context),
         continuation_ids = whole[len(context_ids):]  (so a merge across the boundary counts as continuation);
         an empty context is replaced by the prefix token (<|endoftext|>, lm-eval's BOS-or-EOS prefix);
      3. the model reads (context_ids + continuation_ids)[-(window + 1):][:-1], i.e. too-long inputs lose
         tokens on the left, and the last len(continuation_ids) positions predict the continuation;
      4. the result is (sum of the continuation's token log-probs, whether every token is the argmax).
    """
    pairs = []
    for context, continuation in requests:
        n_spaces = len(context) - len(context.rstrip())
        if n_spaces:
            continuation = context[-n_spaces:] + continuation
            context = context[:-n_spaces]
        pairs.append((context, continuation))
    if prefix_id is None and any(not c for c, _ in pairs):
        raise BurnoutError("an empty context needs a prefix token, and this tokenizer has no <|endoftext|>")
    # Choices share their context: each distinct context is encoded once (a few-shot prompt is long).
    unique = list(dict.fromkeys(c for c, _ in pairs if c))
    try:
        context_ids = dict(zip(unique, (e.ids for e in tokenizer.encode_batch(unique))))
        wholes = tokenizer.encode_batch([c + k for c, k in pairs])
    except Exception as exc:  # the Rust side raises a bare Exception (an unseen character), TypeError (a surrogate)
        failing = next((text for text in unique + [c + k for c, k in pairs] if unencodable(tokenizer, text)), "")
        raise unencodable_error(tokenizer, failing, "the task text", "score with a byte-level BPE model, which "
                                "encodes any text", exc) from None
    out = []
    for (context, _), whole in zip(pairs, wholes):
        if not context:  # lm-eval: the continuation alone, after the prefix token
            cont = whole.ids
            out.append(([prefix_id], cont) if cont[:1] != [prefix_id] else (cont[:1], cont[1:]))
            continue
        ctx_ids = context_ids[context]
        out.append((ctx_ids, whole.ids[len(ctx_ids):]))
    return out


def _model_input(ctx_ids: list[int], cont_ids: list[int], window: int) -> list[int]:
    return (ctx_ids + cont_ids)[-(window + 1):][:-1]


def shared_prefix_groups(encoded: list[tuple[list[int], list[int]]], window: int) -> list[tuple[list[int], list[int]]]:
    """(prefix, indices of the requests that share it), in order of first appearance.

    A request's model input is (context + continuation)[-(window + 1):][:-1]; its prefix is that input
    without the continuation's tokens past the first, so the prefix's last position predicts the
    continuation's first token and the rest come after it. Requests with equal prefixes (a multiple-choice
    item's choices) then need the prefix computed once. Grouping by the truncated input itself, not by
    the context, keeps left truncation exact: a request whose context lost tokens on the left only shares
    with requests that lost the very same ones.
    """
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, (ctx_ids, cont_ids) in enumerate(encoded):
        inp = _model_input(ctx_ids, cont_ids, window)
        groups.setdefault(tuple(inp[: len(inp) - len(cont_ids) + 1]), []).append(i)
    return [(list(prefix), members) for prefix, members in groups.items()]


def _groups(encoded: list[tuple[list[int], list[int]]], window: int,
            items: Sequence[Hashable] | None) -> list[Group]:
    """Rows to compute: `shared_prefix_groups`, then the groups of one item (`items[i]` names request i's)
    merged into one row on their inputs' longest common prefix when that costs no more attention than
    the separate rows (a schema item: the options differ near their end, the continuation is shared)."""
    inputs = [_model_input(c, k, window) for c, k in encoded]
    groups: list[Group] = []
    for prefix, members in shared_prefix_groups(encoded, window):
        groups.append((prefix, [(i, inputs[i][len(prefix):], encoded[i][1]) for i in members]))
    if items is None:
        return groups
    by_item: dict[Hashable, list[int]] = {}
    for g, (_, members) in enumerate(groups):
        by_item.setdefault(items[members[0][0]], []).append(g)
    merged, done = [], set()
    for g, group in enumerate(groups):
        if g in done:
            continue
        family = by_item[items[group[1][0][0]]]
        done.update(family)
        if len(family) == 1:
            merged.append(group)
            continue
        members = [m for f in family for m in groups[f][1]]
        seqs = [inputs[i] for i, _, _ in members]
        # The prefix may end no later than where a member's first target is predicted.
        cap = min(len(inputs[i]) - len(targets) + 1 for i, _, targets in members)
        common = 0
        first = seqs[0]
        while common < cap and all(len(s) > common and s[common] == first[common] for s in seqs):
            common += 1
        width = common + sum(len(s) - common for s in seqs)
        separate = [len(groups[f][0]) + sum(len(b) for _, b, _ in groups[f][1]) for f in family]
        if common and width * width <= sum(w * w for w in separate):
            merged.append((first[:common], [(i, inputs[i][common:], t) for i, _, t in members]))
        else:
            merged.extend(groups[f] for f in family)
    return merged


@torch.no_grad()
def score_requests(
    model: Transformer,
    tokenizer: Tokenizer,
    requests: list[tuple[str, str]],
    batch_size: int = 16,
    progress: Callable[[list[int]], None] | None = None,
    items: Sequence[Hashable] | None = None,
    names: Callable[[int], str] | None = None,
) -> list[RequestScore]:
    """The score of each (context, continuation) request (see `RequestScore`).

    Each group of requests that share a prefix (see `shared_prefix_groups`; with `items`, the requests of
    one item may share their longest common prefix, see `_groups`) is one row of the batch: the prefix,
    then every request's remaining input as a branch at the positions that follow the prefix. The
    attention mask lets a branch see the prefix and itself, never another branch, so each request is
    computed exactly as if alone. Only positions that predict continuation tokens go through the LM head:
    with a 50K vocabulary the head costs more than the layers of a small model. `names(i)` says which
    request an error is about (default "request i").
    """
    if batch_size < 1:
        raise BurnoutError(f"the batch size must be at least 1, not {batch_size}")
    encoded = encode_requests(tokenizer, requests, tokenizer.token_to_id(EOT_TOKEN))
    return score_encoded(model, encoded, batch_size, progress, items, names)


@torch.no_grad()
def score_encoded(
    model: Transformer,
    encoded: list[tuple[list[int], list[int]]],
    batch_size: int = 16,
    progress: Callable[[list[int]], None] | None = None,
    items: Sequence[Hashable] | None = None,
    names: Callable[[int], str] | None = None,
) -> list[RequestScore]:
    """`score_requests` on requests already encoded as (context ids, continuation ids). `progress` is called
    with the indices of the requests each batch scored."""
    if batch_size < 1:
        raise BurnoutError(f"the batch size must be at least 1, not {batch_size}")
    name = names or (lambda i: f"request {i}")
    window = model.cfg.context_length
    for i, (ctx_ids, cont_ids) in enumerate(encoded):
        if not cont_ids:
            raise BurnoutError(f"{name(i)}: the continuation encodes to no tokens; it must be non-empty")
        if len(cont_ids) > window:
            raise BurnoutError(
                f"{name(i)}: the continuation is {len(cont_ids)} tokens and the prompt {len(ctx_ids)}, so it "
                f"cannot fit the model's context of {window} tokens even with the prompt cut on the left"
            )
    groups = _groups(encoded, window, items)
    # Longest rows first, as lm-eval orders its requests: neighbours have similar lengths, so little padding.
    groups.sort(key=lambda g: -(len(g[0]) + sum(len(b) for _, b, _ in g[1])))
    device = model.tok_emb.weight.device
    # On a GPU, bf16 (fp16 before Ampere) with TF32: tensor cores for the matmuls, and half the bytes for
    # activations and for the attention scores a masked row materializes. On CPU it is fp32, so the scores
    # there equal lm-eval's exactly.
    precision = resolve_precision("auto", device)
    configure_backends(device)
    was_training = model.training
    model.eval()
    results: list[RequestScore | None] = [None] * len(encoded)
    try:
        for batch in _batches(groups, batch_size):
            rows = [(prefix, [(branch, targets) for _, branch, targets in members]) for prefix, members in batch]
            lls, greedy = _score_batch(model, rows, precision)
            members = [i for _, group in batch for i, _, _ in group]
            for i, ll, g in zip(members, lls, greedy):
                ctx_ids, cont_ids = encoded[i]
                results[i] = RequestScore(ll, g, len(cont_ids), len(ctx_ids) + len(cont_ids) > window + 1)
            if progress is not None:
                progress(members)
    finally:
        model.train(was_training)
    return results  # type: ignore[return-value]


def loglikelihoods(
    model: Transformer,
    tokenizer: Tokenizer,
    requests: list[tuple[str, str]],
    batch_size: int = 16,
    progress: Callable[[list[int]], None] | None = None,
) -> list[tuple[float, bool]]:
    """(log P(continuation | context), continuation is the greedy output) for each request."""
    return [(s.loglikelihood, s.greedy) for s in score_requests(model, tokenizer, requests, batch_size, progress)]


def _batches(groups: list, batch_size: int):
    """Consecutive groups, up to `batch_size` requests a batch (a larger group is a batch of its own)."""
    batch, n = [], 0
    for group in groups:
        if batch and n + len(group[1]) > batch_size:
            yield batch
            batch, n = [], 0
        batch.append(group)
        n += len(group[1])
    if batch:
        yield batch


def _score_batch(model: Transformer, rows: list[tuple[list[int], list[tuple[list[int], list[int]]]]],
                 precision: str) -> tuple[list, list]:
    """Summed log-probs and greedy flags of each row's branches, rows being (prefix, [(branch, targets)]):
    a branch's input is prefix + branch, whose last len(targets) positions predict the targets (at most
    the first of them from the prefix's last position). The layers run under autocast in `precision`."""
    device = model.tok_emb.weight.device
    tokens, positions, branches = [], [], []
    head_at, target_row, targets, lengths = [], [], [], []  # flat positions the head reads; per target token
    width = max(len(prefix) + sum(len(b) for b, _ in members) for prefix, members in rows)
    for r, (prefix, members) in enumerate(rows):
        n, base = len(prefix), r * width
        row_tok, row_pos, row_branch = list(prefix), list(range(n)), [0] * n
        shared = None  # the head row of the prefix's last position, which may predict several first tokens
        for b, (branch, cont) in enumerate(members, start=1):
            at = base + len(row_tok)
            row_tok += branch
            row_pos += range(n, n + len(branch))
            row_branch += [b] * len(branch)
            start = len(branch) - len(cont)  # the branch offset predicting the first target; -1: the prefix's end
            rows_of = []
            if start < 0:
                if shared is None:
                    shared = len(head_at)
                    head_at.append(base + n - 1)
                rows_of.append(shared)
                start = 0
            k = len(head_at)
            head_at += range(at + start, at + len(branch))
            target_row += rows_of + list(range(k, k + len(branch) - start))
            targets += cont
            lengths.append(len(cont))
        pad = width - len(row_tok)
        tokens.append(row_tok + [0] * pad)
        positions.append(row_pos + [0] * pad)
        # Padding is its own branch (-1): real tokens never see it, and each pad token sees itself, so no
        # softmax row is empty (an empty one is NaN, and NaN times a zero attention weight spreads).
        branches.append(row_branch + [-1] * pad)
    branch_t = torch.tensor(branches, device=device)
    causal = torch.ones(width, width, dtype=torch.bool, device=device).tril()
    mask = causal & ((branch_t[:, None, :] == 0) | (branch_t[:, None, :] == branch_t[:, :, None]))  # (B, q, k)
    with autocast(device, precision):
        hidden = model.hidden_states(torch.tensor(tokens, device=device),
                                     positions=torch.tensor(positions, device=device), mask=mask)
    # The head runs outside autocast, in fp32: it reads only the positions that predict a continuation token,
    # so this costs little, while bf16 logits would each be rounded by up to 2^-9 of their size.
    logits = model.lm_head(hidden.flatten(0, 1)[torch.tensor(head_at, device=device)].float())
    logprobs = F.log_softmax(logits, -1)
    rows_t, target = torch.tensor(target_row, device=device), torch.tensor(targets, device=device)
    token_lp = logprobs[rows_t, target]
    # Greedy means the target is the argmax, the first of equal maxima. A full argmax over the vocabulary
    # is slow on CPU; amax is not, and only targets that reach the max need the tie check.
    greedy = token_lp == logprobs.amax(-1)[rows_t]
    hit = greedy.nonzero().squeeze(1)
    greedy[hit] = logprobs[rows_t[hit]].argmax(-1) == target[hit]
    owner = torch.repeat_interleave(torch.tensor(lengths, device=device))  # the request of each target token
    lls = torch.zeros(len(lengths), dtype=torch.float64, device=device).index_add_(0, owner, token_lp.double())
    misses = torch.zeros(len(lengths), dtype=torch.long, device=device).index_add_(0, owner, (~greedy).long())
    return lls.tolist(), (misses == 0).tolist()


def score_items(
    model: Transformer,
    tokenizer: Tokenizer,
    task_type: str,
    items: list[Item],
    batch_size: int = 16,
    progress: Callable[[int], None] | None = None,
) -> tuple[dict[str, float], list[dict]]:
    """Metrics of `items` of `task_type` (item_metrics) and one record per item: its log-likelihoods,
    continuation token counts, greedy flags and predictions. "truncated" counts the items with a request
    whose prompt lost tokens on the left to fit the model's window."""
    requests = [r for it in items for r in it.requests]
    owner = [k for k, it in enumerate(items) for _ in it.requests]
    left = [len(it.requests) for it in items]  # requests not scored yet, per item

    def count_items(done: list[int]) -> None:  # `progress` counts items: those whose last request was scored
        finished = 0
        for i in done:
            left[owner[i]] -= 1
            finished += left[owner[i]] == 0
        progress(finished)

    scores = iter(score_requests(model, tokenizer, requests, batch_size, progress and count_items, items=owner,
                                 names=lambda i: items[owner[i]].where or f"item {owner[i]}"))
    samples = []
    for it in items:
        if len(it.choices) != len(it.requests):
            raise ValueError(f"{it.where}: {len(it.choices)} choices for {len(it.requests)} requests")
        got = [next(scores) for _ in it.requests]
        lls = np.array([s.loglikelihood for s in got])
        tokens = np.array([float(s.tokens) for s in got])
        with np.errstate(divide="ignore", invalid="ignore"):  # an empty choice: lm-eval divides by 0 too
            normed = lls / np.array([float(len(c)) for c in it.choices])
        samples.append({
            "index": it.index,
            "category": it.category,
            "context": it.requests[0][0],
            "continuations": [c for _, c in it.requests],
            "choices": list(it.choices),
            "gold": it.gold,
            "loglikelihoods": lls.tolist(),
            "tokens": [s.tokens for s in got],
            "greedy": [s.greedy for s in got],
            "truncated": any(s.truncated for s in got),
            # np.argmax takes the first of equal maxima, as lm-eval's and llm-foundry's (list.index(min)) do.
            "pred": int(np.argmax(lls)),
            "pred_norm": int(np.argmax(normed)),
            "pred_per_token": int(np.argmax(lls / tokens)),
        })
    return item_metrics(task_type, samples), samples


def item_metrics(task_type: str, samples: list[dict]) -> dict[str, float]:
    """The task type's metrics over scored items (`score_items`' records); lm_eval/api/task.py `process_results`
    and llm-foundry's ICL metrics:

        multiple_choice  acc = [argmax loglik == gold], acc_norm = [argmax loglik / len(choice in characters)
                         == gold] (lm-eval), acc_per_token = [argmax loglik / continuation tokens == gold]
                         (llm-foundry's InContextLearningMultipleChoiceAccuracy: the lowest per-token perplexity)
        schema           acc = [argmax loglik == gold] over the context options (the continuation is the same)
        language_model.  acc = greedy exact match (every continuation position's argmax is its token, llm-foundry's
                         InContextLearningLMAccuracy and lm-eval's lambada acc); perplexity = exp(-mean loglik)
    """
    n = len(samples)
    if task_type == "language_modeling":
        metrics = {
            "acc": sum(s["greedy"][0] for s in samples) / n,
            "perplexity": math.exp(-sum(s["loglikelihoods"][0] for s in samples) / n),
        }
    elif task_type == "schema":
        metrics = {"acc": sum(s["pred"] == s["gold"] for s in samples) / n}
    else:
        metrics = {
            "acc": sum(s["pred"] == s["gold"] for s in samples) / n,
            "acc_norm": sum(s["pred_norm"] == s["gold"] for s in samples) / n,
            "acc_per_token": sum(s["pred_per_token"] == s["gold"] for s in samples) / n,
        }
    return {**metrics, "examples": n, "truncated": sum(s["truncated"] for s in samples)}


def chance_accuracy(samples: list[dict]) -> float:
    """The accuracy of a uniform guess among each item's choices, over scored items: the mean of 1 / choices (0.25
    for four). What a multiple-choice or schema task's acc is read against."""
    return sum(1 / len(s["choices"]) for s in samples) / len(samples)


def score_examples(
    model: Transformer,
    tokenizer: Tokenizer,
    task: str,
    examples: list[Example],
    batch_size: int = 16,
    progress: Callable[[int], None] | None = None,
) -> tuple[dict[str, float], list[dict]]:
    """A built-in task's metrics (lambada: acc, perplexity; the others: acc, acc_norm) and one record per
    example, for `Example`s from burnout.eval.tasks.load_task."""
    items = [Item(tuple((ex.context, c) for c in ex.continuations), ex.choices, ex.gold, i)
             for i, ex in enumerate(examples)]
    task_type = "language_modeling" if task == "lambada" else "multiple_choice"
    metrics, samples = score_items(model, tokenizer, task_type, items, batch_size, progress)
    keep = ("acc", "perplexity") if task == "lambada" else ("acc", "acc_norm")
    return {**{k: metrics[k] for k in keep}, "examples": metrics["examples"]}, samples
