"""Log-likelihood scoring, computed the way lm-evaluation-harness's HF causal-LM model computes it.

For a request (context, continuation), as in lm_eval/api/model.py `_encode_pair` and
lm_eval/models/huggingface.py `_loglikelihood_tokens`:

  1. trailing spaces of the context move to the front of the continuation;
  2. whole = encode(context + continuation), context_ids = encode(context),
     continuation_ids = whole[len(context_ids):]  (so a merge across the boundary counts as continuation);
     an empty context is replaced by the prefix token (<|endoftext|>, lm-eval's BOS-or-EOS prefix);
  3. the model reads (context_ids + continuation_ids)[-(window + 1):][:-1], i.e. too-long inputs lose
     tokens on the left, and the last len(continuation_ids) positions predict the continuation;
  4. the result is (sum of the continuation's token log-probs, whether every token is the argmax).

Then, per task (lm_eval/api/task.py `process_results`): acc = [argmax loglik == gold],
acc_norm = [argmax loglik / len(choice in characters) == gold]; LAMBADA: acc = greedy match,
perplexity = exp(-mean loglik) over examples.

The numbers are lm-eval's; the work is less (see `loglikelihoods`): a multiple-choice item's context is
computed once for all its choices, and the LM head runs only where a continuation token is predicted.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F
from tokenizers import Tokenizer

from burnout.common import EOT_TOKEN, first_line
from burnout.core.device import autocast, configure_backends, resolve_precision
from burnout.errors import BurnoutError
from burnout.eval.tasks import Example
from burnout.models import Transformer


def encode_requests(
    tokenizer: Tokenizer, requests: list[tuple[str, str]], prefix_id: int | None
) -> list[tuple[list[int], list[int]]]:
    """(context ids, continuation ids) for each (context, continuation), split as lm-eval splits them."""
    pairs = []
    for context, continuation in requests:
        n_spaces = len(context) - len(context.rstrip())
        if n_spaces:
            continuation = context[-n_spaces:] + continuation
            context = context[:-n_spaces]
        pairs.append((context, continuation))
    if prefix_id is None and any(not c for c, _ in pairs):
        raise BurnoutError("an empty context needs a prefix token, and this tokenizer has no <|endoftext|>")
    try:
        contexts = tokenizer.encode_batch([c for c, _ in pairs if c])
        wholes = tokenizer.encode_batch([c + k for c, k in pairs])
    except Exception as exc:  # the Rust side raises a bare Exception, e.g. a char tokenizer's unseen character
        raise BurnoutError(
            f"the tokenizer cannot encode the task text ({first_line(exc)}); "
            "score with a byte-level BPE model, which encodes any text"
        ) from None
    out, ctx_iter = [], iter(contexts)
    for (context, _), whole in zip(pairs, wholes):
        if not context:  # lm-eval: the continuation alone, after the prefix token
            cont = whole.ids
            out.append(([prefix_id], cont) if cont[:1] != [prefix_id] else (cont[:1], cont[1:]))
            continue
        ctx_ids = next(ctx_iter).ids
        out.append((ctx_ids, whole.ids[len(ctx_ids):]))
    return out


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
        inp = (ctx_ids + cont_ids)[-(window + 1) :][:-1]
        groups.setdefault(tuple(inp[: len(inp) - len(cont_ids) + 1]), []).append(i)
    return [(list(prefix), members) for prefix, members in groups.items()]


@torch.no_grad()
def loglikelihoods(
    model: Transformer,
    tokenizer: Tokenizer,
    requests: list[tuple[str, str]],
    batch_size: int = 16,
    progress: Callable[[int], None] | None = None,
) -> list[tuple[float, bool]]:
    """(log P(continuation | context), continuation is the greedy output) for each request.

    Each group of requests that share a prefix (see `shared_prefix_groups`) is one row of the batch:
    the prefix, then every request's continuation (without its last token) as a branch at the positions
    that follow the prefix. The attention mask lets a branch see the prefix and itself, never another
    branch, so each request is computed exactly as if alone. Only positions that predict continuation
    tokens go through the LM head: with a 50K vocabulary the head costs more than the layers of a
    small model.
    """
    if batch_size < 1:
        raise BurnoutError(f"the batch size must be at least 1, not {batch_size}")
    prefix_id = tokenizer.token_to_id(EOT_TOKEN)
    encoded = encode_requests(tokenizer, requests, prefix_id)
    window = model.cfg.context_length
    for i, (_, cont_ids) in enumerate(encoded):
        if not cont_ids:
            raise BurnoutError(f"request {i}: the continuation encodes to no tokens; it must be non-empty")
        if len(cont_ids) > window:
            raise BurnoutError(
                f"request {i}: the continuation is {len(cont_ids)} tokens, more than the model's "
                f"context of {window}; it cannot be scored"
            )
    groups = shared_prefix_groups(encoded, window)
    # Longest rows first, as lm-eval orders its requests: neighbours have similar lengths, so little padding.
    groups.sort(key=lambda g: -(len(g[0]) + sum(len(encoded[i][1]) - 1 for i in g[1])))
    device = model.tok_emb.weight.device
    # On a GPU, bf16 (fp16 before Ampere) with TF32: tensor cores for the matmuls, and half the bytes for
    # activations and for the attention scores a masked row materializes. On CPU it is fp32, so the scores
    # there equal lm-eval's exactly.
    precision = resolve_precision("auto", device)
    configure_backends(device)
    was_training = model.training
    model.eval()
    results: list[tuple[float, bool] | None] = [None] * len(encoded)
    try:
        for batch in _batches(groups, batch_size):
            rows = [(prefix, [encoded[i][1] for i in group]) for prefix, group in batch]
            lls, greedy = _score_batch(model, rows, precision)
            members = [i for _, group in batch for i in group]
            for i, ll, g in zip(members, lls, greedy):
                results[i] = (ll, g)
            if progress is not None:
                progress(len(members))
    finally:
        model.train(was_training)
    return results  # type: ignore[return-value]


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


def _score_batch(model: Transformer, rows: list[tuple[list[int], list[list[int]]]],
                 precision: str) -> tuple[list, list]:
    """Summed log-probs and greedy flags of each row's continuations, rows being (prefix, continuations);
    the layers run under autocast in `precision`."""
    device = model.tok_emb.weight.device
    tokens, positions, branches = [], [], []
    head_at, target_row, targets, lengths = [], [], [], []  # flat positions the head reads; per target token
    width = max(len(prefix) + sum(len(c) - 1 for c in conts) for prefix, conts in rows)
    for r, (prefix, conts) in enumerate(rows):
        n, base = len(prefix), r * width
        row_tok, row_pos, row_branch = list(prefix), list(range(n)), [0] * n
        # The prefix's last position predicts every continuation's first token: one head row for all.
        first = len(head_at)
        head_at.append(base + n - 1)
        for b, cont in enumerate(conts, start=1):
            at, k = base + len(row_tok), len(head_at)
            row_tok += cont[:-1]
            row_pos += range(n, n + len(cont) - 1)
            row_branch += [b] * (len(cont) - 1)
            head_at += range(at, at + len(cont) - 1)
            target_row += [first, *range(k, k + len(cont) - 1)]
            targets += cont
            lengths.append(len(cont))
        pad = width - len(row_tok)
        tokens.append(row_tok + [0] * pad)
        positions.append(row_pos + [0] * pad)
        # Padding is its own branch (-1): real tokens never see it, and each pad token sees itself, so no
        # softmax row is empty (an empty one is NaN, and NaN times a zero attention weight spreads).
        branches.append(row_branch + [-1] * pad)
    branch = torch.tensor(branches, device=device)
    causal = torch.ones(width, width, dtype=torch.bool, device=device).tril()
    mask = causal & ((branch[:, None, :] == 0) | (branch[:, None, :] == branch[:, :, None]))  # (B, query, key)
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


def score_examples(
    model: Transformer,
    tokenizer: Tokenizer,
    task: str,
    examples: list[Example],
    batch_size: int = 16,
    progress: Callable[[int], None] | None = None,
) -> tuple[dict[str, float], list[dict]]:
    """Task metrics and one record per example (its log-likelihoods and predictions)."""
    requests = [(ex.context, cont) for ex in examples for cont in ex.continuations]
    results = iter(loglikelihoods(model, tokenizer, requests, batch_size, progress))
    samples = []
    for ex in examples:
        lls, greedy = zip(*(next(results) for _ in ex.choices))
        lengths = np.array([float(len(c)) for c in ex.choices])
        samples.append({
            "context": ex.context,
            "choices": list(ex.choices),
            "gold": ex.gold,
            "loglikelihoods": list(lls),
            "greedy": list(greedy),
            # np.argmax takes the first of equal maxima, as lm-eval's does.
            "pred": int(np.argmax(lls)),
            "pred_norm": int(np.argmax(np.array(lls) / lengths)),
        })
    n = len(samples)
    if task == "lambada":
        metrics = {
            "acc": sum(s["greedy"][0] for s in samples) / n,
            "perplexity": math.exp(-sum(s["loglikelihoods"][0] for s in samples) / n),
        }
    else:
        metrics = {
            "acc": sum(s["pred"] == s["gold"] for s in samples) / n,
            "acc_norm": sum(s["pred_norm"] == s["gold"] for s in samples) / n,
        }
    return {**metrics, "examples": n}, samples
