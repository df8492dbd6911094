"""What the playground serves: discovery confined to the given runs, a bounded cache, bounded requests."""

import pytest

from burnout.errors import BurnoutError
from burnout.playground.catalog import MAX_NEW_TOKENS, MAX_PROMPT_CHARS, ModelCache, discover, stream_text


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
