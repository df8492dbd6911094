"""data.split=contiguous: nanoGPT's split of one text, data[:int(n*0.9)] train and the rest val."""

from __future__ import annotations

import numpy as np

from burnout.config import DataConfig, SourceConfig, TokenizerConfig
from burnout.data.mix import load_mix
from burnout.data.prepare import prepare_data
from burnout.data.shards import read_tokens
from burnout.data.tokenizer import load_tokenizer


def _decoded(out, split: str, eot: int) -> str:
    tokens = read_tokens(out, split)
    assert tokens[-1] == eot and eot not in tokens[:-1]
    return load_tokenizer(out).decode(tokens[:-1].tolist())


def test_contiguous_split_of_one_file(tmp_path):
    text = "".join(f"line {i}: to be or not to be\n" for i in range(500))
    path = tmp_path / "input.txt"
    path.write_text(text, encoding="utf-8")
    cfg = DataConfig(sources=[SourceConfig(name="s", kind="text", path=str(path), split_by="file")],
                     split="contiguous", val_fraction=0.1, max_chars=10**6)
    meta = prepare_data(cfg, TokenizerConfig(kind="char"), tmp_path / "out", workers=1)
    n = len(text)
    cut = int(n * 0.9)
    assert _decoded(tmp_path / "out", "train", meta["eot_id"]) == text[:cut]
    assert _decoded(tmp_path / "out", "val", meta["eot_id"]) == text[cut:]
    assert meta["splits"]["train"]["tokens"] == cut + 1 and meta["splits"]["val"]["tokens"] == n - cut + 1


def test_tiny_shakespeare_is_split_as_nanogpt_splits_it(shared_data, tmp_path):
    text = (shared_data / "tinyshakespeare" / "input.txt").read_text(encoding="utf-8")
    data_cfg, tok_cfg = load_mix("shakespeare-char")
    meta = prepare_data(data_cfg, tok_cfg, tmp_path / "out")
    n = len(text)
    assert n == 1_115_394
    assert meta["splits"]["train"]["tokens"] - 1 == int(n * 0.9) == 1_003_854
    assert meta["splits"]["val"]["tokens"] - 1 == 111_540
    assert _decoded(tmp_path / "out", "val", meta["eot_id"]) == text[int(n * 0.9):]
    assert meta["vocab_size"] == 66  # 65 characters + <|endoftext|>
    assert np.array_equal(read_tokens(tmp_path / "out", "train")[:5],
                          [load_tokenizer(tmp_path / "out").token_to_id(c) for c in text[:5]])
