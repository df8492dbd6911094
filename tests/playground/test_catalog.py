"""What the playground serves: discovery confined to the given runs, a bounded cache, bounded requests, and examples
from the runs' own data."""

import shutil

import pytest

from burnout.errors import BurnoutError
from burnout.playground.catalog import (
    MAX_NEW_TOKENS,
    MAX_PROMPT_CHARS,
    ModelCache,
    _check_request,
    discover,
    example_prompts,
    sampling_settings,
    stream_text,
)


def test_discover_labels_every_checkpoint_of_each_run(sampled_runs):
    fast, slow = sampled_runs
    entries = discover([fast, slow / "checkpoints" / "step_0000016"])
    assert list(entries) == ["fast · step 8", "fast · step 16", "fast · step 24", "slow · step 16"]
    assert entries["slow · step 16"].path == (slow / "checkpoints" / "step_0000016").resolve()
    assert entries["fast · step 24"].info["step"] == 24

    with pytest.raises(BurnoutError, match="holds no checkpoint"):
        discover([fast / "checkpoints"])
    with pytest.raises(BurnoutError, match="does not exist"):
        discover([fast / "missing"])


def test_cache_is_bounded_and_refuses_unlisted_checkpoints(sampled_runs):
    entries = discover(sampled_runs)
    one_model = ModelCache(entries, 10**9).get("fast · step 8").bytes
    cache = ModelCache(entries, int(one_model * 2.5))
    first = cache.get("fast · step 8")
    assert cache.get("fast · step 8") is first  # cached, not reloaded
    cache.get("fast · step 16")
    cache.get("fast · step 8")  # now the most recently used
    cache.get("slow · step 24")
    assert cache.cached_labels() == ["fast · step 8", "slow · step 24"]
    assert cache.used_bytes() <= cache.max_bytes
    # A model's size is its weights' bytes (fp32 here); two models of exactly the bound both stay.
    assert first.bytes == 4 * sum(p.numel() for p in first.model.parameters())
    exact = ModelCache(entries, 2 * one_model)
    exact.get("fast · step 8")
    exact.get("fast · step 16")
    assert exact.cached_labels() == ["fast · step 8", "fast · step 16"]

    # A label is the only way to name a model: paths, even of real checkpoints, are refused.
    with pytest.raises(BurnoutError, match="unknown checkpoint"):
        cache.get(str(entries["fast · step 8"].path))


def test_stream_text_grows_from_the_prompt_and_bounds_requests(sampled_runs):
    loaded = ModelCache(discover(sampled_runs[:1]), 10**9).get("fast · step 24")
    texts = list(stream_text(loaded, "The ", 12, temperature=0.8, top_k=50, seed=0))
    assert texts[0] == "The " and len(texts[-1]) > len("The ")
    assert all(b.startswith(a) for a, b in zip(texts, texts[1:]))
    # The sampling settings reach the sampler, which checks them.
    with pytest.raises(BurnoutError, match="top-p"):
        next(stream_text(loaded, "The ", 5, top_p=1.5))

    for prompt, n, match in (("  ", 5, "empty"), ("x " * 500, 5, "context"),
                             ("a" * (MAX_PROMPT_CHARS + 1), 5, "at most"),
                             ("The ", MAX_NEW_TOKENS + 1, r"max new tokens: \d+ must be in \[1, "),
                             ("The ", 0, "must be in")):
        with pytest.raises(BurnoutError, match=match):
            next(stream_text(loaded, prompt, n))


def test_sampling_settings_hold_each_field_to_its_own_range():
    """The sliders' fields as the API may send them: each edge of each range taken, each step past it refused
    with the field's name and its range."""
    assert sampling_settings(0, 1, 1, 1e-9) == {"temperature": 0.0, "top_k": 1, "top_p": 1.0,
                                                 "repetition_penalty": 1e-9}
    assert sampling_settings("2.5", 40.0, 1e-9, 3) == {"temperature": 2.5, "top_k": 40, "top_p": 1e-9,
                                                       "repetition_penalty": 3.0}
    assert type(sampling_settings(1, 40.0, 1, 1)["top_k"]) is int
    for fields, refusal in [((-0.01, 1, 1, 1), "temperature: -0.01 must be at least 0"),
                            ((1, 0, 1, 1), "top-k: 0 must be at least 1"),
                            ((1, 2.5, 1, 1), "top-k: 2.5 is not a whole number"),
                            ((1, 1, 0, 1), "top-p: 0 must be in (0, 1]"),
                            ((1, 1, 1.01, 1), "top-p: 1.01 must be in (0, 1]"),
                            ((1, 1, 1, 0), "repetition penalty: 0 must be more than 0")]:
        with pytest.raises(BurnoutError) as refused:
            sampling_settings(*fields)
        assert str(refused.value) == refusal


def test_requests_refused_before_sampling_name_what_is_wrong(sampled_runs):
    loaded = ModelCache(discover(sampled_runs[:1]), 10**9).get("fast · step 24")
    for prompt, n, refusal in [
            (42, 5, "the prompt must be text, got int"),
            (" \n", 5, "the prompt is empty; type some text"),
            ("a" * (MAX_PROMPT_CHARS + 1), 5,
             f"the prompt is {MAX_PROMPT_CHARS + 1:,} characters; the playground takes at most {MAX_PROMPT_CHARS:,}"),
            ("The ", MAX_NEW_TOKENS + 1, f"max new tokens: {MAX_NEW_TOKENS + 1} must be in [1, {MAX_NEW_TOKENS}]")]:
        with pytest.raises(BurnoutError) as refused:
            next(stream_text(loaded, prompt, n))
        assert str(refused.value) == refusal
    # The edges themselves are taken (a prompt of exactly the limit is for a model with a longer context).
    assert _check_request("a" * MAX_PROMPT_CHARS, 1) == 1
    assert _check_request("The ", float(MAX_NEW_TOKENS)) == MAX_NEW_TOKENS
    with pytest.raises(BurnoutError, match="^the message is empty; type some text$"):
        _check_request("", 1, what="message")


def test_example_prompts_come_from_the_runs_own_data(sampled_runs, tiny_run, tmp_path):
    """Each run's recorded sample prompts (its train.sample_prompt, or the words of its val split it drew), each once;
    a run without the record (older) and without a train.sample_prompt: the words drawn from its data folder as
    training draws them; without that folder, "The "."""
    from burnout.data.tokenizer import load_tokenizer
    from burnout.generate.prompts import data_prompts, sample_prompts

    drawn = sample_prompts(tiny_run.run_dir)
    assert len(drawn) == 3 and "The " not in drawn
    assert example_prompts(discover([*sampled_runs, tiny_run.run_dir])) == ["The ", *drawn]

    older = tmp_path / "older"
    shutil.copytree(tiny_run.run_dir, older)
    (older / "sample_prompts.json").unlink()
    cfg = tiny_run.cfg
    assert example_prompts(discover([older])) == data_prompts(
        tiny_run.data_dir, cfg.train.seed, load_tokenizer(tiny_run.data_dir / "tokenizer.json"),
        cfg.model.context_length) == drawn
    config = older / "checkpoints" / "step_0000024" / "config.yaml"
    config.write_text(config.read_text().replace(str(tiny_run.data_dir.resolve()), str(tmp_path / "gone")))
    assert example_prompts(discover([older / "checkpoints" / "step_0000024"])) == ["The "]


