import hashlib
import json

import numpy as np
import pytest

from burnout.config import DataConfig, SourceConfig, TokenizerConfig
from burnout.data.corpus import mix_documents
from burnout.data.prepare import prepare_data, read_meta
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
    assert sorted(p.name for p in out.iterdir()) == ["meta.json", "tokenizer.json", "train.bin", "val.bin"]
    assert json.loads((out / "meta.json").read_text()) == meta
    assert meta["format"] == "burnout-tokens-v1" and meta["dtype"] == "uint16"
    assert meta["vocab_size"] == 512 and meta["tokenizer_kind"] == "bpe"
    assert meta["tokenizer_sha256"] == tokenizer_sha256(load_tokenizer(out / "tokenizer.json"))
    for split, info in meta["splits"].items():
        raw = (out / info["file"]).read_bytes()
        assert len(raw) == 2 * info["tokens"]
        assert hashlib.sha256(raw).hexdigest() == info["sha256"]
        tokens = np.frombuffer(raw, dtype="<u2")
        assert (tokens == meta["eot_id"]).sum() == info["documents"]
        assert tokens[-1] == meta["eot_id"]
    per_source = meta["sources"]["per_source"]
    assert sum(s["train_tokens"] for s in per_source.values()) == meta["splits"]["train"]["tokens"]
    assert sum(s["val_tokens"] for s in per_source.values()) == meta["splits"]["val"]["tokens"]
    assert meta["data_config"]["max_chars"] == 200_000 and meta["tokenizer_config"]["vocab_size"] == 512
    assert read_meta(out) == meta


def test_train_bin_decodes_to_the_train_documents(prepared):
    out, meta = prepared
    tok = load_tokenizer(out / "tokenizer.json")
    train_docs, val_docs, _ = mix_documents(DATA_CFG)
    for split, docs in (("train", train_docs), ("val", val_docs)):
        tokens = np.fromfile(out / f"{split}.bin", dtype="<u2")
        ends = np.flatnonzero(tokens == meta["eot_id"])
        pieces = np.split(tokens, ends + 1)[:-1]  # each piece is one document plus its eot
        decoded = [tok.decode(piece[:-1].tolist(), skip_special_tokens=False) for piece in pieces]
        assert decoded == docs


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
    train = tmp_path / meta["splits"]["train"]["file"]
    train.write_bytes(train.read_bytes()[:-2])
    with pytest.raises(BurnoutError, match="train.bin.*truncated"):
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
