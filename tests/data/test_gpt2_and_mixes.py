import pytest

from burnout.config import DataConfig, SourceConfig, TokenizerConfig
from burnout.data.corpus import fetch_url, iter_documents
from burnout.data.inspect import inspect_data
from burnout.data.mix import load_mix, mix_names
from burnout.data.prepare import prepare_data
from burnout.data.shards import read_tokens
from burnout.data.tokenizer import build_tokenizer, eot_id, gpt2_tokenizer
from burnout.errors import BurnoutError

SHAKESPEARE_SHA = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"


@pytest.fixture(scope="module")
def gpt2(shared_data):
    folder = shared_data / "gpt2_tokenizer"
    return gpt2_tokenizer(folder / "vocab.json", folder / "merges.txt")


def test_gpt2_known_ids(gpt2):
    assert gpt2.encode("Hello world").ids == [15496, 995]
    assert eot_id(gpt2) == 50256 and gpt2.get_vocab_size() == 50257
    assert gpt2.encode("a<|endoftext|>b").ids == [64, 50256, 65]
    text = " ünïcode 😀\n\n  spaces"
    assert gpt2.decode(gpt2.encode(text).ids) == text


def test_gpt2_tiny_shakespeare_counts(gpt2, shared_data):
    # nanoGPT's shakespeare prep (tiktoken gpt2): 90/10 split by characters.
    text = (shared_data / "tinyshakespeare" / "input.txt").read_text(encoding="utf-8")
    n = int(len(text) * 0.9)
    assert len(gpt2.encode(text[:n]).ids) == 301_966
    assert len(gpt2.encode(text[n:]).ids) == 36_059


def test_gpt2_from_config_and_errors(shared_data, tmp_path):
    folder = shared_data / "gpt2_tokenizer"
    cfg = TokenizerConfig(kind="gpt2", vocab_path=str(folder / "vocab.json"), merges_path=str(folder / "merges.txt"))
    assert build_tokenizer(cfg).encode("Hello world").ids == [15496, 995]
    with pytest.raises(BurnoutError, match="tokenizer.merges_path"):
        TokenizerConfig(kind="gpt2", vocab_path="v.json").validate()
    with pytest.raises(BurnoutError, match="nope.json.*does not exist"):
        gpt2_tokenizer(tmp_path / "nope.json", folder / "merges.txt")


def test_prepare_with_gpt2_and_inspect(shared_data, tmp_path):
    folder = shared_data / "gpt2_tokenizer"
    tok_cfg = TokenizerConfig(kind="gpt2", vocab_path=str(folder / "vocab.json"),
                              merges_path=str(folder / "merges.txt"))
    source = SourceConfig(name="s", kind="text", path=str(shared_data / "tinyshakespeare" / "input.txt"),
                          split_by="paragraph")
    meta = prepare_data(DataConfig(sources=[source], max_tokens=50_000, shard_tokens=10_000), tok_cfg, tmp_path)
    assert meta["vocab_size"] == 50257 and meta["dtype"] == "uint16" and meta["eot_id"] == 50256
    assert meta["splits"]["train"]["tokens"] + meta["splits"]["val"]["tokens"] == 50_000
    lines = []
    report = inspect_data(tmp_path, sample_tokens=50, out=lines.append)
    assert "50,257" in lines[0] and any("source s" in line for line in lines)
    assert len(report["sample_ids"]) == 50 and report["sample_text"]
    assert (gpt2_tokenizer(folder / "vocab.json", folder / "merges.txt").decode(report["sample_ids"])
            == report["sample_text"])


def test_builtin_mixes_load():
    assert {"default", "shakespeare", "gpuburnout-1b"} <= set(mix_names())
    data, tok = load_mix("gpuburnout-1b")
    assert [s.weight for s in data.sources] == [0.87, 0.10, 0.03]
    assert all(s.kind == "hf" for s in data.sources) and data.sources[0].subset == "sample-10BT"
    assert tok.vocab_size == 32005 and tok.special_tokens == ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    data, tok = load_mix("default")
    assert data == DataConfig() and tok == TokenizerConfig()


@pytest.mark.slow
def test_shakespeare_mix_prepares(shared_data, tmp_path):
    data, tok = load_mix("shakespeare")
    assert data.sources[0].sha256 == SHAKESPEARE_SHA
    data.sources[0].path = str(shared_data / "tinyshakespeare" / "input.txt")
    meta = prepare_data(data, tok, tmp_path)
    assert meta["vocab_size"] == 66  # 65 characters + <|endoftext|>
    total = meta["splits"]["train"]["tokens"] + meta["splits"]["val"]["tokens"]
    assert meta["splits"]["val"]["tokens"] / total == pytest.approx(0.1, abs=0.01)
    # Every character of every speech, plus one <|endoftext|> each (the blank lines between are gone).
    speeches = list(iter_documents(data.sources[0]))
    assert total == sum(map(len, speeches)) + len(speeches)
    assert len(read_tokens(tmp_path, "val")) == meta["splits"]["val"]["tokens"]


def test_mix_errors(tmp_path):
    with pytest.raises(BurnoutError, match="recipe 'nope' not found"):
        load_mix("nope")
    bad = tmp_path / "r.yaml"
    bad.write_text("data:\n  sources: [{name: a, kind: text, path: x.txt}]\n  max_tokenz: 5\n", encoding="utf-8")
    with pytest.raises(BurnoutError, match="data.max_tokenz: unknown key; did you mean 'max_tokens'"):
        load_mix(bad)


def test_url_source_is_downloaded_once_and_checked(shared_data, tmp_path, monkeypatch):
    monkeypatch.setenv("BURNOUT_CACHE", str(tmp_path / "cache"))
    url = (shared_data / "tinyshakespeare" / "input.txt").resolve().as_uri()
    path = fetch_url(url, SHAKESPEARE_SHA)
    assert path.read_bytes() == (shared_data / "tinyshakespeare" / "input.txt").read_bytes()
    source = SourceConfig(name="s", kind="text", path=str(tmp_path / "missing.txt"), url=url, sha256=SHAKESPEARE_SHA)
    assert next(iter_documents(source)).startswith("First Citizen:")
    with pytest.raises(BurnoutError, match="sha256 86c4.*expected 0000"):
        fetch_url(url, "0" * 64)
