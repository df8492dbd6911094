"""The data-stage commands through the real CLI: data mixes, inspect, tokenizer train/encode/decode."""

import json

import pytest

from burnout.cli import main
from burnout.data.tokenizer import load_tokenizer

SMALL = ["data.max_chars=60000", "tokenizer.vocab_size=300"]


def test_tokenizer_train_encode_decode_round_trip(tmp_path, capsys):
    out = tmp_path / "tok.json"
    assert main(["tokenizer", "train", "default", "--out", str(out), *SMALL]) == 0
    assert load_tokenizer(out).get_vocab_size() == 300
    capsys.readouterr()

    text = "def main():\n    return 'héllo'  # ünïcode\n"
    assert main(["tokenizer", "encode", str(out), text]) == 0
    encoded = json.loads(capsys.readouterr().out)
    assert len(encoded["ids"]) == len(encoded["tokens"]) > 1
    assert main(["tokenizer", "decode", str(out), " ".join(map(str, encoded["ids"]))]) == 0
    assert capsys.readouterr().out == text + "\n"

    # Nothing is overwritten without being asked.
    before = out.read_bytes()
    assert main(["tokenizer", "train", "default", "--out", str(out), *SMALL]) == 2
    assert out.read_bytes() == before
    assert main(["tokenizer", "decode", str(out), "300"]) == 2
    assert "outside this tokenizer's vocabulary" in capsys.readouterr().err


@pytest.mark.slow
def test_prepare_mix_with_overrides_then_inspect(tmp_path, capsys):
    out = tmp_path / "data"
    assert main(["data", "prepare", "default", "--out", str(out), "--workers", "1", *SMALL,
                 "data.shard_tokens=5000"]) == 0
    meta = json.loads((out / "meta.json").read_text())
    assert meta["vocab_size"] == 300
    assert len(meta["splits"]["train"]["shards"]) > 1
    capsys.readouterr()
    assert main(["data", "inspect", str(out), "--verify", "--sample-tokens", "30"]) == 0
    printed = capsys.readouterr().out
    assert f"{meta['splits']['train']['tokens']:,}" in printed and "sample of train" in printed

    assert main(["data", "prepare", "default", "--out", str(out), *SMALL]) == 2
    assert "already holds prepared data" in capsys.readouterr().err


def test_unknown_mix_is_one_line(capsys):
    assert main(["data", "prepare", "no-such-recipe", "--out", "x"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not found" in err[0]


@pytest.mark.slow
def test_prepare_with_an_existing_tokenizer_encodes_with_it_as_it_is(tiny_bpe_data, tmp_path, capsys):
    # A tokenizer.json or a folder holding one (a data folder, a checkpoint): the tokenizer of a run continued with
    # `burnout train --init-from`, for your text and for a data mix alike.
    from burnout.data.shards import read_meta
    from burnout.data.tokenizer import tokenizer_sha256

    given = load_tokenizer(tiny_bpe_data)
    text = tmp_path / "mine.txt"
    text.write_text("\n\n".join(f"Paragraph {i}: the quick brown fox, again and again." for i in range(300)))
    for source, spec, out in ((str(text), str(tiny_bpe_data), tmp_path / "own"),
                              ("default", str(tiny_bpe_data / "tokenizer.json"), tmp_path / "recipe")):
        assert main(["data", "prepare", source, "--out", str(out), "--tokenizer", spec, "data.max_chars=60000"]) == 0
        assert tokenizer_sha256(load_tokenizer(out)) == tokenizer_sha256(given)
        assert read_meta(out)["vocab_size"] == given.get_vocab_size()
    capsys.readouterr()
    assert main(["data", "prepare", str(text), "--out", str(tmp_path / "none"), "--tokenizer", str(tmp_path)]) == 2
    assert "holds no tokenizer.json" in capsys.readouterr().err
