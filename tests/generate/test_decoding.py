"""Top-p, repetition penalty, batched prompts, stop sequences and streaming."""

import pytest
import torch

from burnout.data.tokenizer import load_tokenizer
from burnout.errors import BurnoutError
from burnout.generate import sampling
from burnout.generate.sampling import (
    generate_batch,
    generate_text,
    generate_texts,
    process_logits,
    stream_continuation,
    stream_text,
    stream_tokens,
)

from .test_sampling import VOCAB, greedy_without_cache, tiny_model

transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize("top_p", [0.05, 0.5, 0.9, 1.0])
@pytest.mark.parametrize("penalty", [1.0, 1.3, 0.7])
def test_logit_processing_equals_transformers(top_p, penalty):
    """Same filtered logits as HF's RepetitionPenalty → Temperature → TopK → TopP processors."""
    from transformers import (
        LogitsProcessorList,
        RepetitionPenaltyLogitsProcessor,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    g = torch.Generator().manual_seed(int(top_p * 100 + penalty * 10))
    logits = torch.randn(VOCAB, generator=g) * 3
    recent = [1, 5, 5, 9, 20, 33]
    procs = LogitsProcessorList([TemperatureLogitsWarper(0.7), TopKLogitsWarper(20)])
    if penalty != 1.0:
        procs.insert(0, RepetitionPenaltyLogitsProcessor(penalty))
    if top_p < 1.0:
        procs.append(TopPLogitsWarper(top_p))
    theirs = procs(torch.tensor([recent]), logits[None].clone())[0]
    ours = process_logits(logits, recent, 0.7, 20, top_p, penalty)
    assert torch.equal(torch.isinf(ours), torch.isinf(theirs))
    kept = ~torch.isinf(ours)
    torch.testing.assert_close(ours[kept], theirs[kept])


def test_top_p_samples_only_from_the_nucleus():
    model = tiny_model("llama", sharp=False)
    prompt = [4, 8]
    tokens = list(stream_tokens(model, prompt, 20, temperature=1.0, top_p=0.3, seed=0))
    ids = list(prompt)
    with torch.no_grad():
        for token in tokens:
            probs = model(torch.tensor([ids]))[0, -1].softmax(-1)
            sorted_probs, order = probs.sort(descending=True)
            nucleus = order[: int((sorted_probs.cumsum(0) < 0.3).sum()) + 1].tolist()
            assert token in nucleus
            ids.append(token)
    assert list(stream_tokens(model, prompt, 20, temperature=1.0, top_p=1e-9, seed=5)) == list(
        stream_tokens(model, prompt, 20, temperature=0))


def test_repetition_penalty_discourages_repeats():
    model = tiny_model("gpt2")
    prompt = [3, 14, 15]
    plain = list(stream_tokens(model, prompt, 25, temperature=0))
    penalised = list(stream_tokens(model, prompt, 25, temperature=0, repetition_penalty=3.0, repetition_window=25))
    assert len(set(penalised)) > len(set(plain))


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_batched_prompts_equal_one_at_a_time(family):
    model = tiny_model(family)
    prompts = [[1, 2, 3], [7, 8, 9], [4, 5], [10, 11, 12, 13, 14], [6, 6]]
    greedy = generate_batch(model, prompts, 12, temperature=0)
    assert greedy == [greedy_without_cache(model, p, 12) for p in prompts]
    sampled = generate_batch(model, prompts, 12, temperature=1.0, top_k=10, seed=3)
    assert sampled == [list(stream_tokens(model, p, 12, temperature=1.0, top_k=10, seed=3)) for p in prompts]


def test_batched_rows_stop_on_their_own():
    model = tiny_model("llama")
    prompts = [[1, 2, 3], [7, 8, 9]]
    full = generate_batch(model, prompts, 15, temperature=0)
    stop = full[0][4]
    cut = generate_batch(model, prompts, 15, temperature=0, stop_id=stop)
    for row, ids in enumerate(full):
        expected = ids[: ids.index(stop)] if stop in ids else ids
        assert cut[row] == expected


def test_stop_sequences_and_streaming(tiny_bpe_data):
    tokenizer = load_tokenizer(tiny_bpe_data / "tokenizer.json")
    model = tiny_model("llama", vocab_size=tokenizer.get_vocab_size())
    prompt = "def f(x):"
    full = generate_text(model, tokenizer, prompt, 30, temperature=0)
    continuation = full[len(prompt):]
    assert len(continuation) > 6
    stop = continuation[3:6]
    first = continuation.find(stop)
    pieces = list(stream_text(model, tokenizer, prompt, 30, temperature=0, stop=[stop]))
    assert "".join(pieces) == continuation[:first]
    assert generate_text(model, tokenizer, prompt, 30, temperature=0, stop=[stop]) == prompt + continuation[:first]
    # Streaming without a stop sequence gives the whole continuation, in several pieces.
    pieces = list(stream_text(model, tokenizer, prompt, 30, temperature=0))
    assert "".join(pieces) == continuation and len(pieces) > 1
    # Batched text generation applies the same stop.
    assert (generate_texts(model, tokenizer, [prompt, "The "], 30, temperature=0, stop=[stop])[0]
            == prompt + continuation[:first])


@pytest.mark.parametrize("stops_in_order", [False, True])
def test_the_first_of_overlapping_stop_sequences_to_occur_wins(tiny_bpe_data, stops_in_order):
    """Two stop sequences that overlap and complete with the same token, both in the text once it arrives: the
    text ends before the one that starts first, whichever way they are listed (red when the cut is at the last
    one, or at the first or last listed)."""
    tokenizer = load_tokenizer(tiny_bpe_data / "tokenizer.json")
    model = tiny_model("llama", vocab_size=tokenizer.get_vocab_size())
    prompt, settings = "def f(x):", dict(temperature=1.0, seed=0)
    continuation = generate_text(model, tokenizer, prompt, 30, **settings)[len(prompt):]
    early, late = continuation[2:10], continuation[7:10]  # end at the same character: complete at the same step
    assert continuation.find(early) == 2 and continuation.find(late) == 7
    stops = [early, late] if stops_in_order else [late, early]
    expected = continuation[:2]
    assert "".join(stream_text(model, tokenizer, prompt, 30, stop=stops, **settings)) == expected
    assert generate_text(model, tokenizer, prompt, 30, stop=stops, **settings) == prompt + expected
    assert generate_texts(model, tokenizer, [prompt, "The "], 30, stop=stops, **settings)[0] == prompt + expected


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_decoding_reads_no_cache_slot_before_writing_it(monkeypatch, family):
    """The KV cache is not zeroed (torch.empty): every step must read only the slots written so far, pads
    included. With the cache's memory NaN to begin with, a padded batch and a lone prompt decode as from a zeroed
    cache (red when a step reads a slot never written: NaN times an attention weight of 0 is NaN)."""
    model = tiny_model(family)
    prompts = [[1, 2, 3], [4, 5], [10, 11, 12, 13, 14]]

    def decode_from_cache_filled_with(value: float) -> list[list[int]]:
        def new_cache(batch_size, max_len=None):
            cache = type(model).new_cache(model, batch_size, max_len)
            cache.k.fill_(value)
            cache.v.fill_(value)
            return cache

        monkeypatch.setattr(model, "new_cache", new_cache)
        padded = generate_batch(model, prompts, 12, temperature=0, pad=True)
        return padded + generate_batch(model, prompts[:1], 12, temperature=0)

    zeroed = decode_from_cache_filled_with(0.0)
    assert zeroed[-1] == greedy_without_cache(model, prompts[0], 12)
    assert decode_from_cache_filled_with(float("nan")) == zeroed


class CharTokenizer:
    """One character a token: the pieces a stream yields can be predicted token by token."""

    def __init__(self, text: str):
        self.chars = list(text)

    def decode(self, ids: list[int]) -> str:
        return "".join(self.chars[i] for i in ids)


@pytest.mark.parametrize("text, stops, pieces", [
    ("ab", [], ["a", "b"]),  # a piece per token, and no empty one at the end
    ("ab\n\nUx\n\nUser:z", ["\n\nUser:"], ["a", "b", "\n\nUx"]),  # held until it can't be the stop; then cut
    ("ab\n\nU", ["\n\nUser:"], ["a", "b", "\n\nU"]),  # the held-back tail is printed when the stream ends
    ("a\n\n\nb", ["\n\nUser:"], ["a", "\n", "\n\nb"]),  # only the longest suffix that could grow is held
    ("a!b<c", ["<|", "!?"], ["a", "!b", "<c"]),  # every stop sequence holds back its own prefixes
    ("a<|end|>", ["<|end|>"], ["a"]),  # the stop arrives right after a printed piece: nothing more, not ""
])
def test_streaming_holds_back_what_could_become_a_stop_sequence(monkeypatch, text, stops, pieces):
    """Each token's text is printed as soon as no stop sequence could still start inside it; a stop sequence
    split over tokens is never printed, even in part; no piece is empty."""
    monkeypatch.setattr(sampling, "stream_tokens", lambda *args, **kwargs: iter(range(len(text))))
    streamed = list(stream_continuation(None, CharTokenizer(text), [0], len(text), stop=stops, stop_ids=[]))
    assert streamed == pieces


def test_bad_sampling_settings_are_burnout_errors():
    model = tiny_model("llama")
    with pytest.raises(BurnoutError, match="top-p"):
        list(stream_tokens(model, [1, 2], 5, top_p=1.5))
    with pytest.raises(BurnoutError, match="top-k"):
        list(stream_tokens(model, [1, 2], 5, top_k=0))
    with pytest.raises(BurnoutError, match="repetition penalty"):
        list(stream_tokens(model, [1, 2], 5, repetition_penalty=0))
    with pytest.raises(BurnoutError, match="context"):
        generate_batch(model, [[1, 2], list(range(40))], 5)


def test_chat_streams_continuations_and_changes_settings(tiny_bpe_data):
    import io

    from burnout.generate.chat import chat

    tokenizer = load_tokenizer(tiny_bpe_data / "tokenizer.json")
    model = tiny_model("llama", vocab_size=tokenizer.get_vocab_size())
    lines = iter(["/temp 0", "/len 6", "/topk nope", "def f(x):", "x " * 40, "/quit", "never read"])
    settings = {"max_new_tokens": 50, "temperature": 0.8, "top_k": 50, "top_p": None, "repetition_penalty": 1.0,
                "repetition_window": 64, "seed": None}
    out = io.StringIO()
    chat(model, tokenizer, settings, read=lambda _: next(lines), out=out)
    assert settings["temperature"] == 0.0 and settings["max_new_tokens"] == 6 and settings["top_k"] == 50
    text = out.getvalue()
    assert "/topk needs a number" in text
    greedy = generate_text(model, tokenizer, "def f(x):", 6, temperature=0, top_k=50)
    assert greedy + "\n" in text
    assert "error: the prompt is" in text  # a too-long line is reported and the loop goes on
    assert next(lines) == "never read"
