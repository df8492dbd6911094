import hashlib
import json

import numpy as np
import pytest

from burnout.config import DataConfig, SourceConfig, TokenizerConfig
from burnout.data.prepare import prepare_data
from burnout.data.shards import read_meta, read_tokens, verify_checksums
from burnout.data.tokenizer import load_tokenizer, tokenizer_sha256, train_tokenizer
from burnout.errors import BurnoutError

DATA_CFG = DataConfig(max_chars=200_000)
TOK_CFG = TokenizerConfig(kind="bpe", vocab_size=512)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    out = tmp_path_factory.mktemp("prepared")
    meta = prepare_data(DATA_CFG, TOK_CFG, out)
    return out, meta


def test_files_match_meta(prepared):
    out, meta = prepared
    names = sorted(p.name for p in out.iterdir())
    assert names == ["manifest.json", "meta.json", "tokenizer.json", "train_000000.bin", "train_docs.npy",
                     "val_000000.bin", "val_docs.npy"]
    assert json.loads((out / "meta.json").read_text()) == meta
    assert meta["format"] == "burnout-tokens-v2" and meta["dtype"] == "uint16"
    assert meta["vocab_size"] == 512 and meta["tokenizer_kind"] == "bpe"
    assert meta["tokenizer_sha256"] == tokenizer_sha256(load_tokenizer(out / "tokenizer.json"))
    for _split, info in meta["splits"].items():
        (shard,) = info["shards"]
        raw = (out / shard["file"]).read_bytes()
        assert len(raw) == 2 * info["tokens"] == 2 * shard["tokens"]
        assert hashlib.sha256(raw).hexdigest() == shard["sha256"]
        tokens = np.frombuffer(raw, dtype="<u2")
        assert (tokens == meta["eot_id"]).sum() == info["documents"]
        assert tokens[-1] == meta["eot_id"]
    per_source = meta["sources"]["per_source"]
    assert sum(s["train_tokens"] for s in per_source.values()) == meta["splits"]["train"]["tokens"]
    assert sum(s["val_tokens"] for s in per_source.values()) == meta["splits"]["val"]["tokens"]
    assert meta["data_config"]["max_chars"] == 200_000 and meta["tokenizer_config"]["vocab_size"] == 512
    assert read_meta(out) == meta
    verify_checksums(out)


def test_token_shares_match_the_weights(prepared):
    _, meta = prepared
    per_source = meta["sources"]["per_source"]
    total = meta["sources"]["total"]
    # Budget = tokens of the 200k-char tokenizer sample; each source fills exactly its weight of it.
    assert total["tokens"] == sum(s["tokens"] for s in per_source.values())
    assert per_source["docs"]["tokens"] == int(total["budget_tokens"] * 0.7)
    assert per_source["code"]["tokens"] == int(total["budget_tokens"] * 0.3)
    assert per_source["docs"]["share"] == pytest.approx(0.7, abs=1e-4)
    for entry in per_source.values():
        assert entry["shortfall_tokens"] == 0 and entry["val_documents"] >= 1
    # Whole documents go to val, so its share is only as fine as the documents (stdlib files are big).
    assert total["val_tokens"] / total["tokens"] == pytest.approx(0.05, abs=0.03)


def test_split_decodes_to_the_source_documents(tmp_path):
    folder = tmp_path / "texts"
    folder.mkdir()
    docs = [f"document {i}: " + "some words here " * (i % 7 + 1) for i in range(60)]
    for i, doc in enumerate(docs):
        (folder / f"{i:02d}.txt").write_text(doc, encoding="utf-8")
    cfg = DataConfig(sources=[SourceConfig(name="t", kind="text", path=str(folder))], max_tokens=10**6,
                     val_fraction=0.1)
    meta = prepare_data(cfg, TOK_CFG, tmp_path / "out", workers=2)
    tok = load_tokenizer(tmp_path / "out")
    decoded = {}
    for split in ("train", "val"):
        tokens = read_tokens(tmp_path / "out", split)
        pieces = np.split(tokens, np.flatnonzero(tokens == meta["eot_id"]) + 1)[:-1]
        decoded[split] = [tok.decode(p[:-1].tolist()) for p in pieces]
    # Everything fits the budget except the val cut: the val tail doc is cut and its rest dropped.
    assert set(decoded["train"]) <= set(docs)
    assert not set(decoded["train"]) & set(decoded["val"])
    assert len(decoded["train"]) + len(decoded["val"]) == 60
    assert sum(d in docs for d in decoded["val"]) >= len(decoded["val"]) - 1
    assert meta["sources"]["per_source"]["t"]["shortfall_tokens"] > 0  # the folder ran out before 10**6


def test_prepare_is_deterministic_and_worker_count_does_not_matter(tmp_path):
    cfg = DataConfig(max_chars=60_000, max_tokens=12_000, shard_tokens=1_000, clean="balanced", dedup=True)
    one = prepare_data(cfg, TOK_CFG, tmp_path / "one", workers=1)
    two = prepare_data(cfg, TOK_CFG, tmp_path / "two", workers=2)
    assert one == two
    assert one["splits"]["train"]["tokens"] + one["splits"]["val"]["tokens"] == 12_000
    other = prepare_data(DataConfig(max_chars=60_000, max_tokens=12_000, seed=7), TOK_CFG, tmp_path / "seed7")
    assert other["splits"]["train"]["shards"][0]["sha256"] != one["splits"]["train"]["shards"][0]["sha256"]


def test_refuses_existing_output_unless_overwrite(prepared, tmp_path):
    out, _ = prepared
    with pytest.raises(BurnoutError, match="already holds prepared data"):
        prepare_data(DATA_CFG, TOK_CFG, out)
    small = DataConfig(max_chars=20_000)
    first = prepare_data(small, TOK_CFG, tmp_path)
    again = prepare_data(small, TOK_CFG, tmp_path, overwrite=True)
    assert again == first
    assert not [p for p in tmp_path.iterdir() if ".tmp" in p.name]


def test_given_tokenizer_is_reused(prepared, tmp_path):
    out, meta = prepared
    reused = prepare_data(
        DataConfig(max_chars=20_000), TokenizerConfig(kind="char"), tmp_path, tokenizer_path=out / "tokenizer.json"
    )
    assert reused["tokenizer_sha256"] == meta["tokenizer_sha256"]
    assert reused["tokenizer_kind"] == "bpe"


def test_char_tokenizer_covers_val_only_characters(tmp_path):
    folder = tmp_path / "texts"
    folder.mkdir()
    for i in range(20):
        (folder / f"{i:02d}.txt").write_text(f"doc {i} " + chr(0x4E00 + i), encoding="utf-8")
    cfg = DataConfig(sources=[SourceConfig(name="t", kind="text", path=str(folder))], max_chars=10_000)
    meta = prepare_data(cfg, TokenizerConfig(kind="char"), tmp_path / "out")
    assert meta["tokenizer_kind"] == "char" and meta["splits"]["val"]["documents"] == 1


def test_read_meta_detects_truncation(tmp_path):
    meta = prepare_data(DataConfig(max_chars=20_000), TOK_CFG, tmp_path)
    train = tmp_path / meta["splits"]["train"]["shards"][0]["file"]
    train.write_bytes(train.read_bytes()[:-2])
    with pytest.raises(BurnoutError, match="train_000000.bin.*truncated"):
        read_meta(tmp_path)


def test_read_meta_without_meta_or_dir(tmp_path):
    with pytest.raises(BurnoutError, match="never finished"):
        read_meta(tmp_path)
    with pytest.raises(BurnoutError, match="does not exist"):
        read_meta(tmp_path / "nope")
    (tmp_path / "meta.json").write_text('{"format": "something-else"}', encoding="utf-8")
    with pytest.raises(BurnoutError, match="format 'something-else'"):
        read_meta(tmp_path)


def test_bad_source_fails_before_writing_anything(tmp_path):
    cfg = DataConfig(sources=[SourceConfig(name="t", kind="text", path=str(tmp_path / "missing.txt"))])
    with pytest.raises(BurnoutError, match="missing.txt"):
        prepare_data(cfg, TOK_CFG, tmp_path / "out")
    assert not (tmp_path / "out" / "meta.json").exists()


def test_given_char_tokenizer_missing_characters_is_a_burnout_error(tmp_path):
    path = tmp_path / "tokenizer.json"
    train_tokenizer(["abc"], TokenizerConfig(kind="char")).save(str(path))
    with pytest.raises(BurnoutError, match="no token for .* character"):
        prepare_data(DataConfig(max_chars=20_000), TOK_CFG, tmp_path / "out", tokenizer_path=path)


def test_token_budget_of_the_sample_does_not_depend_on_the_encode_chunk(tmp_path, monkeypatch):
    import burnout.data.prepare as prepare_module

    cfg = DataConfig(max_chars=30_000, shard_tokens=2_000)  # no max_tokens: the sample's token count is the budget
    whole = prepare_data(cfg, TOK_CFG, tmp_path / "whole")
    monkeypatch.setattr(prepare_module, "ENCODE_CHUNK_CHARS", 2_000)
    assert prepare_data(cfg, TOK_CFG, tmp_path / "chunked") == whole
