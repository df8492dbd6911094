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
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F
from tokenizers import Tokenizer

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
            f"the tokenizer cannot encode the task text ({str(exc).splitlines()[0]}); "
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


@torch.no_grad()
def loglikelihoods(
    model: Transformer,
    tokenizer: Tokenizer,
    requests: list[tuple[str, str]],
    batch_size: int = 16,
    progress: Callable[[int], None] | None = None,
) -> list[tuple[float, bool]]:
    """(log P(continuation | context), continuation is the greedy output) for each request."""
    prefix_id = tokenizer.token_to_id("<|endoftext|>")
    encoded = encode_requests(tokenizer, requests, prefix_id)
    window = model.cfg.context_length
    device = model.tok_emb.weight.device
    was_training = model.training
    model.eval()
    # Longest first, as lm-eval orders them: each batch is padded to its first row's length.
    order = sorted(range(len(encoded)), key=lambda i: -(len(encoded[i][0]) + len(encoded[i][1])))
    results: list[tuple[float, bool] | None] = [None] * len(encoded)
    try:
        for start in range(0, len(order), batch_size):
            rows = order[start : start + batch_size]
            inputs, conts = [], []
            for i in rows:
                ctx_ids, cont_ids = encoded[i]
                if not cont_ids:
                    raise BurnoutError(f"request {i}: the continuation encodes to no tokens; it must be non-empty")
                if len(cont_ids) > window:
                    raise BurnoutError(
                        f"request {i}: the continuation is {len(cont_ids)} tokens, more than the model's "
                        f"context of {window}; it cannot be scored"
                    )
                inputs.append((ctx_ids + cont_ids)[-(window + 1) :][:-1])
                conts.append(cont_ids)
            width = max(len(x) for x in inputs)
            # Right padding: a causal model's outputs at real positions never see the pad tokens after them.
            batch = torch.zeros(len(rows), width, dtype=torch.long)
            for r, x in enumerate(inputs):
                batch[r, : len(x)] = torch.tensor(x)
            logprobs = F.log_softmax(model(batch.to(device)).float(), dim=-1)
            for r, i in enumerate(rows):
                n, cont = len(inputs[r]), torch.tensor(conts[r], device=device)
                lp = logprobs[r, n - len(cont) : n]  # (len(cont), V)
                greedy = bool((lp.argmax(dim=-1) == cont).all())
                results[i] = (float(lp.gather(1, cont[:, None]).sum()), greedy)
            if progress is not None:
                progress(len(rows))
    finally:
        model.train(was_training)
    return results  # type: ignore[return-value]


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
