"""Sampling: the KV-cached loop agrees with full recomputation, seeds and top-k behave, limits hold."""

import pytest
import torch

from burnout.config import ModelConfig
from burnout.data.tokenizer import load_tokenizer
from burnout.errors import BurnoutError
from burnout.generate.sampling import (
    _cut_at_stop,
    generate_batch,
    generate_text,
    process_logits,
    stream_text,
    stream_tokens,
)
from burnout.models import Transformer

CONTEXT = 32
VOCAB = 50
FAMILIES = {
    "gpt2": dict(family="gpt2"),
    "llama": dict(family="llama", n_kv_head=2),  # grouped-query attention: 4 query heads share 2 kv heads
}


def tiny_model(family: str, sharp: bool = True, seed: int = 0, **fields) -> Transformer:
    """A random tiny model. `sharp` rescales the weights so that next-token distributions are peaked
    (argmax never a near tie); otherwise they are the near-uniform ones of a fresh init."""
    cfg = ModelConfig(**{"vocab_size": VOCAB, "n_layer": 2, "d_model": 32, "n_head": 4, "context_length": CONTEXT,
                         "ffn_multiple_of": 32, **FAMILIES[family], **fields})
    torch.manual_seed(seed)
    model = Transformer(cfg)
    if sharp:
        with torch.no_grad():
            for p in model.parameters():
                p.normal_(0.0, 0.3)
    return model.eval()


def greedy_without_cache(model: Transformer, prompt: list[int], n: int) -> list[int]:
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(model(torch.tensor([ids]))[0, -1].argmax()))
    return ids[len(prompt):]


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_with_cache_equals_full_recomputation(family):
    model = tiny_model(family)
    prompt = [3, 14, 15, 9, 26]
    expected = greedy_without_cache(model, prompt, 20)
    assert len(set(expected)) > 1  # not one token repeated
    assert list(stream_tokens(model, prompt, 20, temperature=0)) == expected


@pytest.mark.parametrize("family", FAMILIES)
def test_cached_logits_match_full_recomputation(family):
    """The cache's logits themselves, not only their argmax, equal those of a full forward pass."""
    model = tiny_model(family)
    ids = torch.randint(0, VOCAB, (1, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = model(ids)
        cache = model.new_cache(1)
        chunks = [model(ids[:, :10], cache=cache), *(model(ids[:, t : t + 1], cache=cache) for t in range(10, 24))]
    torch.testing.assert_close(torch.cat(chunks, dim=1), full, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_left_padded_batch_continues_each_prompt_as_it_would_alone(family):
    """Prompts of 3 to 17 tokens in one padded batch: each row's tokens are those of its own unpadded run
    (positions from its first token, pad slots masked), greedy and seeded sampling alike."""
    model = tiny_model(family)
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in (17, 3, 9, 17, 5)]
    alone = [generate_batch(model, [p], 12, temperature=0)[0] for p in prompts]
    assert generate_batch(model, prompts, 12, temperature=0, pad=True) == alone
    assert all(len(ids) == 12 for ids in alone) and len({tuple(ids) for ids in alone}) >= 3  # rows differ
    sampled = [generate_batch(model, [p], 12, temperature=1.0, seed=7)[0] for p in prompts]
    assert generate_batch(model, prompts, 12, temperature=1.0, seed=7, pad=True) == sampled


@pytest.mark.parametrize("family", FAMILIES)
def test_seeded_sampling_is_reproducible_and_seeds_differ(family):
    model = tiny_model(family, sharp=False)  # near-uniform: the seed decides almost everything
    prompt = [1, 2, 3]
    a = list(stream_tokens(model, prompt, 20, temperature=1.0, seed=1))
    b = list(stream_tokens(model, prompt, 20, temperature=1.0, seed=1))
    c = list(stream_tokens(model, prompt, 20, temperature=1.0, seed=2))
    assert a == b
    assert a != c
    assert len(a) == len(c) == 20 and all(0 <= t < VOCAB for t in a + c)


def test_no_seed_means_a_fresh_random_sample_each_time():
    model = tiny_model("llama", sharp=False)
    samples = {tuple(stream_tokens(model, [1, 2, 3], 20, temperature=1.0)) for _ in range(3)}
    assert len(samples) == 3
    # ... drawn from its own generator: torch's global RNG (which training checkpoints) is untouched.
    before = torch.get_rng_state()
    list(stream_tokens(model, [1, 2, 3], 20, temperature=1.0))
    list(stream_tokens(model, [1, 2, 3], 20, temperature=1.0, seed=4))
    assert torch.equal(torch.get_rng_state(), before)


def test_sampling_restores_training_mode():
    model = tiny_model("llama").train()
    list(stream_tokens(model, [1, 2], 3, temperature=0))
    assert model.training
    model.eval()
    list(stream_tokens(model, [1, 2], 3, temperature=0))
    assert not model.training


@pytest.mark.parametrize("family", FAMILIES)
def test_top_k_one_is_greedy(family):
    model = tiny_model(family)
    prompt = [5, 6, 7]
    greedy = list(stream_tokens(model, prompt, 15, temperature=0))
    for seed in (0, 1):
        assert list(stream_tokens(model, prompt, 15, temperature=1.5, top_k=1, seed=seed)) == greedy


def test_top_k_samples_only_among_the_k_most_likely():
    model = tiny_model("llama", sharp=False)
    prompt = [4, 8]
    k = 3
    tokens = list(stream_tokens(model, prompt, 25, temperature=2.0, top_k=k, seed=0))
    ids = list(prompt)
    with torch.no_grad():
        for token in tokens:
            top = model(torch.tensor([ids]))[0, -1].topk(k).indices.tolist()
            assert token in top
            ids.append(token)
    unrestricted = list(stream_tokens(model, prompt, 25, temperature=2.0, seed=0))
    assert any(  # without top-k, some token falls outside the top 3 (a near-uniform model over 50 tokens)
        t not in model(torch.tensor([prompt + unrestricted[:i]]))[0, -1].topk(k).indices.tolist()
        for i, t in enumerate(unrestricted)
    )


def test_stop_id_ends_generation_without_being_yielded():
    model = tiny_model("llama")
    prompt = [1, 2, 3]
    greedy = list(stream_tokens(model, prompt, 20, temperature=0))
    stop = next(i for i in range(3, 20) if greedy[i] not in greedy[:i])
    assert list(stream_tokens(model, prompt, 20, temperature=0, stop_id=greedy[stop])) == greedy[:stop]
    # A stop id that never comes changes nothing.
    absent = next(t for t in range(VOCAB) if t not in greedy)
    assert list(stream_tokens(model, prompt, 20, temperature=0, stop_id=absent)) == greedy


@pytest.mark.parametrize("family", FAMILIES)
def test_generation_stops_at_the_context(family):
    model = tiny_model(family)
    prompt = list(range(5))
    tokens = list(stream_tokens(model, prompt, 1000, temperature=0))
    assert len(tokens) == CONTEXT - len(prompt)
    assert tokens == greedy_without_cache(model, prompt, CONTEXT - len(prompt))
    assert len(list(stream_tokens(model, list(range(CONTEXT - 1)), 5, temperature=1.0, seed=0))) == 1


def test_bad_requests_are_burnout_errors():
    model = tiny_model("llama")
    with pytest.raises(BurnoutError, match="context"):
        list(stream_tokens(model, [1] * CONTEXT, 5))
    with pytest.raises(BurnoutError, match="context"):
        list(stream_tokens(model, [1] * (CONTEXT + 10), 5))
    with pytest.raises(BurnoutError, match="^the prompt is empty after tokenization; give at least one character$"):
        list(stream_tokens(model, [], 5))
    for top_p in (0.0, -0.1, 1.01):
        with pytest.raises(BurnoutError, match=r"top-p .* must be in \(0, 1\]"):
            list(stream_tokens(model, [1, 2], 5, top_p=top_p))
    assert len(list(stream_tokens(model, [1, 2], 3, top_p=1.0))) == 3  # 1 is in range: nothing cut
    with pytest.raises(BurnoutError, match="finite number, 0"):
        list(stream_tokens(model, [1, 2], 5, temperature=-0.5))
    for bad in (float("nan"), float("inf")):  # comparisons with NaN are false: a `< 0` check lets it through
        with pytest.raises(BurnoutError, match="temperature"):
            list(stream_tokens(model, [1, 2], 5, temperature=bad))
        with pytest.raises(BurnoutError, match="repetition penalty"):
            list(stream_tokens(model, [1, 2], 5, repetition_penalty=bad))
    assert list(stream_tokens(model, [1, 2], 0)) == []


def test_generate_text_is_the_prompt_plus_its_decoded_continuation(tiny_bpe_data):
    tokenizer = load_tokenizer(tiny_bpe_data / "tokenizer.json")
    vocab = tokenizer.get_vocab_size()
    model = tiny_model("llama", vocab_size=vocab)
    prompt = "The value of "
    text = generate_text(model, tokenizer, prompt, 12, temperature=0)
    prompt_ids = tokenizer.encode(prompt).ids
    new_ids = list(stream_tokens(model, prompt_ids, 12, temperature=0, stop_id=tokenizer.token_to_id("<|endoftext|>")))
    assert text.startswith(prompt)
    assert text == tokenizer.decode(prompt_ids + new_ids)
    assert len(new_ids) > 0 and len(text) > len(prompt)
    seeded = generate_text(model, tokenizer, prompt, 12, temperature=1.0, seed=3)
    assert seeded == generate_text(model, tokenizer, prompt, 12, temperature=1.0, seed=3)


def test_generate_text_stops_at_end_of_text(tiny_bpe_data):
    """A model whose every next token is <|endoftext|> adds nothing to the prompt."""
    tokenizer = load_tokenizer(tiny_bpe_data / "tokenizer.json")
    eot = tokenizer.token_to_id("<|endoftext|>")
    model = tiny_model("gpt2", vocab_size=tokenizer.get_vocab_size(), tie_embeddings=False)
    with torch.no_grad():
        # The final LayerNorm outputs its bias whatever the input; only eot's row points along it.
        model.norm.weight.zero_()
        model.norm.bias.copy_(torch.linspace(-1, 1, model.cfg.d_model))
        model.lm_head.weight.zero_()
        model.lm_head.weight[eot] = model.norm.bias
    assert generate_text(model, tokenizer, "def f(x):", 10, temperature=0) == "def f(x):"


@pytest.mark.parametrize("text, stop, cut", [("abcabc", ["c"], 2), ("stop here", ["stop"], 0), ("a.b!", ["!", "."], 1),
                                             ("abc", ["x", ""], None)])
def test_the_cut_is_at_the_first_stop_sequence_wherever_it_is(text, stop, cut):
    assert _cut_at_stop(text, stop) == cut


@pytest.mark.parametrize("setting", [{"temperature": -1.0}, {"top_k": 0}, {"top_p": 0.0}, {"repetition_penalty": 0.0}])
def test_stream_text_refuses_bad_settings_when_called_before_anything_streams(tiny_bpe_data, setting):
    tokenizer = load_tokenizer(tiny_bpe_data / "tokenizer.json")
    model = tiny_model("llama", vocab_size=tokenizer.get_vocab_size())
    stream_text(model, tokenizer, "The ", 2)  # the defaults (temperature 1, no top-k/p, no penalty) pass
    with pytest.raises(BurnoutError):
        stream_text(model, tokenizer, "The ", 2, **setting)  # raised by the call itself: nothing iterated


def test_the_repetition_penalty_divides_positive_logits_and_multiplies_the_rest():
    """CTRL's rule at its edges: a logit in (0, 1) is shrunk like any positive one, a negative one pushed down,
    0 stays, a token not seen recently is untouched."""
    logits = torch.tensor([2.0, 0.5, -1.0, 0.0, 3.0])
    out = process_logits(logits, [0, 1, 2, 3, 1], temperature=0, top_k=None, top_p=None, repetition_penalty=2.0)
    assert out.tolist() == [1.0, 0.25, -2.0, 0.0, 3.0]


def test_top_p_keeps_the_smallest_prefix_whose_mass_reaches_it():
    logits = torch.tensor([0.5, 0.25, 0.25]).log()
    kept = process_logits(logits, [], temperature=1.0, top_k=None, top_p=0.5, repetition_penalty=1.0).isfinite()
    assert kept.tolist() == [True, False, False]  # the first token's 0.5 reaches 0.5: the rest go
    kept = process_logits(logits, [], temperature=1.0, top_k=None, top_p=0.6, repetition_penalty=1.0).isfinite()
    assert kept[0] and kept.sum() == 2  # 0.5 falls short of 0.6: one of the 0.25s joins it, reaching 0.75


def test_decoding_takes_packed_weights_only_for_weights_read_from_memory_whose_copy_fits(monkeypatch):
    """stream_batch turns few_row_products on for a model of at least 32 MiB of weights and leaves it off for a
    smaller one, whose weights stay in the caches between steps (there the route measured slower), and for one whose
    packed copy would take more than half the memory available, unless that copy is already made."""
    from burnout.generate import sampling
    from burnout.models import cpu_paths
    from burnout.models.cpu_paths import STREAMED_WEIGHT_BYTES, forget_packed_weights, packs_weights

    seen = []
    real = sampling.few_row_products
    monkeypatch.setattr(sampling, "few_row_products", lambda on=True: (seen.append(on), real(on))[1])
    for vocab, packed in ((97, False), (50257, True)):
        torch.manual_seed(0)
        model = Transformer(ModelConfig(family="gpt2", vocab_size=vocab, n_layer=1, d_model=192, n_head=2,
                                        context_length=16, dropout=0.0))
        nbytes = sum(p.numel() * 4 for p in model.parameters())
        assert (nbytes >= STREAMED_WEIGHT_BYTES) == packed, nbytes
        packed &= cpu_paths._ONEDNN
        assert packs_weights(model) == packed
        seen.clear()
        generate_batch(model, [[1, 2, 3], [4, 5]], 3, temperature=0)
        assert seen and set(seen) == {packed}  # at every step
    if not cpu_paths._ONEDNN:
        return
    monkeypatch.setattr(cpu_paths, "available_memory", lambda: 2 * nbytes - 1)
    assert packs_weights(model)  # its copy was made by the generation above
    forget_packed_weights(model)
    assert not packs_weights(model)
    monkeypatch.setattr(cpu_paths, "available_memory", lambda: 2 * nbytes)
    assert packs_weights(model)
    monkeypatch.setattr(cpu_paths, "available_memory", lambda: None)  # not Linux: no figure to go by
    assert packs_weights(model)

