"""Packed scoring (burnout.eval.scoring) against the plain computation it replaces: each request alone, its
(context + continuation)[-(window + 1):][:-1] through the whole model, log-softmax over every position.

Real GPT-2 tokenizer and real HellaSwag / ARC-Easy items, random tiny models with a 48-token window so that
many requests are truncated on the left; gpt2 and llama (GQA) shapes, SDPA and the written-out attention.
"""

from __future__ import annotations

import pytest
import torch

from burnout.config import ModelConfig
from burnout.data.tokenizer import gpt2_tokenizer
from burnout.errors import BurnoutError
from burnout.eval.scoring import encode_requests, loglikelihoods, shared_prefix_groups
from burnout.eval.tasks import DEFAULT_FILES, load_task
from burnout.models import Transformer

WINDOW = 48
EOT = 50256
HELLASWAG_ITEMS = 8


@pytest.fixture(scope="module")
def tokenizer(shared_data):
    return gpt2_tokenizer(shared_data / "gpt2_tokenizer" / "vocab.json", shared_data / "gpt2_tokenizer" / "merges.txt")


@pytest.fixture(scope="module")
def task_requests(shared_data) -> list[tuple[str, str]]:
    examples = (load_task("hellaswag", shared_data / DEFAULT_FILES["hellaswag"], HELLASWAG_ITEMS)
                + load_task("arc_easy", shared_data / DEFAULT_FILES["arc_easy"], 4))
    return [(ex.context, cont) for ex in examples for cont in ex.continuations]


def build(family: str, attention: str) -> Transformer:
    torch.manual_seed(0)
    cfg = ModelConfig(family=family, vocab_size=50257, n_layer=2, d_model=64, n_head=4,
                      n_kv_head=2 if family == "llama" else None, context_length=WINDOW, attention=attention)
    model = Transformer(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:  # 5× GPT-2's init: far from uniform, so a wrong context shows in the scores
                p.normal_(0.0, 0.1)
    return model


@torch.no_grad()
def one_at_a_time(model, tokenizer, requests, window: int = WINDOW) -> list[tuple[float, bool]]:
    out = []
    for ctx, cont in encode_requests(tokenizer, requests, EOT):
        inp = (ctx + cont)[-(window + 1):][:-1]
        logprobs = model(torch.tensor([inp]))[0, -len(cont):].float().log_softmax(-1)
        target = torch.tensor(cont)
        out.append((float(logprobs.gather(1, target[:, None]).sum()), bool((logprobs.argmax(-1) == target).all())))
    return out


@torch.no_grad()
def greedy_requests(model, tokenizer, contexts: list[str]) -> list[tuple[str, str]]:
    """(context, the model's own 2-token greedy continuation) for the contexts whose continuation text
    encodes back to those very tokens: requests whose greedy flag must come out True."""
    out = []
    for context in contexts:
        ids = tokenizer.encode(context).ids[-(WINDOW - 2):]
        for _ in range(2):
            ids.append(int(model(torch.tensor([ids]))[0, -1].argmax()))
        text = tokenizer.decode(ids[-2:])
        if encode_requests(tokenizer, [(context, text)], EOT)[0][1] == ids[-2:]:
            out.append((context, text))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("family,attention", [("gpt2", "sdpa"), ("gpt2", "math"), ("llama", "sdpa"), ("llama", "math")])
def test_packed_scoring_equals_one_request_at_a_time(tokenizer, task_requests, family, attention):
    model = build(family, attention)
    edge = [
        ("", " The cat"),  # empty context: scored after the <|endoftext|> prefix token
        ("A man walks ", "into a bar"),  # the context's trailing space moves to the continuation
        ("Question: Is it?\nAnswer:", " yes"),  # a one-token continuation ...
        ("Question: Is it?\nAnswer:", " yes"),  # ... twice, as a duplicated choice
        ("Question: Is it?\nAnswer:", " no, it is not"),
    ]
    greedy = greedy_requests(model, tokenizer, [c for c, _ in task_requests[::4]])
    assert greedy, "no greedy continuation round-trips through the tokenizer"
    requests = task_requests + edge + greedy
    expected = one_at_a_time(model, tokenizer, requests)
    assert sum(g for _, g in expected) >= len(greedy)
    # Batches of one request (groups larger than the batch stay whole), of a few groups, of everything.
    for batch_size in (1, 5, 1000):
        got = loglikelihoods(model, tokenizer, requests, batch_size=batch_size)
        assert [g for _, g in got] == [g for _, g in expected], batch_size
        for (ll, _), (want, _), request in zip(got, expected, requests):
            assert ll == pytest.approx(want, abs=1e-4), (batch_size, request)
    # The tolerance has teeth: truncating one token more than lm-eval does is caught.
    truncated = [(r, e) for r, e in zip(requests, expected) if len(tokenizer.encode(r[0] + r[1]).ids) > WINDOW]
    off_by_one = one_at_a_time(model, tokenizer, [r for r, _ in truncated], window=WINDOW - 1)
    assert max(abs(a[0] - e[0]) for a, (_, e) in zip(off_by_one, truncated)) > 1e-2


def test_shared_prefix_groups_share_only_untruncated_contexts(tokenizer, task_requests):
    encoded = encode_requests(tokenizer, task_requests, EOT)
    groups = shared_prefix_groups(encoded, WINDOW)
    assert sorted(i for _, members in groups for i in members) == list(range(len(encoded)))
    for prefix, members in groups:
        for i in members:
            ctx, cont = encoded[i]
            # What the model would read for this request alone, with lm-eval's left truncation.
            assert prefix + cont[:-1] == (ctx + cont)[-(WINDOW + 1):][:-1]
    group_of = {i: g for g, (_, members) in enumerate(groups) for i in members}
    shared = split = 0
    for item in range(0, HELLASWAG_ITEMS * 4, 4):  # the HellaSwag items, 4 choices each
        choices = range(item, item + 4)
        fits = all(len(encoded[i][0]) + len(encoded[i][1]) <= WINDOW + 1 for i in choices)
        if fits:  # one group, whose prefix is the whole context
            assert len({group_of[i] for i in choices}) == 1
            assert groups[group_of[item]][0] == encoded[item][0]
            shared += 1
        else:  # truncation cut the context differently per choice
            split += len({group_of[i] for i in choices}) > 1
    assert shared and split


def test_bad_batch_size_is_one_error(tokenizer):
    with pytest.raises(BurnoutError, match="batch size must be at least 1"):
        loglikelihoods(build("gpt2", "sdpa"), tokenizer, [("a", " b")], batch_size=0)
