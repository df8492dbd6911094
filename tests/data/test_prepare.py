import hashlib
import json
import random
import resource
import signal
import subprocess
import sys

import numpy as np
import pytest

from burnout.base.folders import mark_folder
from burnout.cli import main
from burnout.config import DataConfig, SourceConfig, TokenizerConfig
from burnout.data.prepare import SMALLEST_PRESET_PARAMS, prepare_data
from burnout.data.shards import read_meta, read_tokens, verify_checksums
from burnout.data.tokenizer import load_tokenizer, tokenizer_sha256, train_tokenizer
from burnout.errors import BurnoutError

from .test_own_text import decoded_documents, write_stories

DATA_CFG = DataConfig(max_chars=200_000)
TOK_CFG = TokenizerConfig(kind="bpe", vocab_size=512)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    out = tmp_path_factory.mktemp("prepared")
    meta = prepare_data(DATA_CFG, TOK_CFG, out)
    return out, meta


@pytest.mark.slow
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


@pytest.mark.slow
def test_prepare_is_deterministic_and_worker_count_does_not_matter(tmp_path):
    cfg = DataConfig(max_chars=60_000, max_tokens=12_000, shard_tokens=1_000, clean="balanced", dedup=True)
    one = prepare_data(cfg, TOK_CFG, tmp_path / "one", workers=1)
    two = prepare_data(cfg, TOK_CFG, tmp_path / "two", workers=2)
    assert one == two
    assert one["splits"]["train"]["tokens"] + one["splits"]["val"]["tokens"] == 12_000
    other = prepare_data(DataConfig(max_chars=60_000, max_tokens=12_000, seed=7), TOK_CFG, tmp_path / "seed7")
    assert other["splits"]["train"]["shards"][0]["sha256"] != one["splits"]["train"]["shards"][0]["sha256"]


@pytest.mark.slow
def test_refuses_existing_output_unless_overwrite(prepared, tmp_path):
    out, _ = prepared
    with pytest.raises(BurnoutError, match="already holds prepared data"):
        prepare_data(DATA_CFG, TOK_CFG, out)
    small = DataConfig(max_chars=20_000)
    first = prepare_data(small, TOK_CFG, tmp_path)
    again = prepare_data(small, TOK_CFG, tmp_path, overwrite=True)
    assert again == first
    assert not [p for p in tmp_path.iterdir() if ".tmp" in p.name]


@pytest.mark.slow
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


@pytest.mark.slow
def test_read_meta_detects_truncation(tmp_path):
    meta = prepare_data(DataConfig(max_chars=20_000), TOK_CFG, tmp_path)
    train = tmp_path / meta["splits"]["train"]["shards"][0]["file"]
    train.write_bytes(train.read_bytes()[:-2])
    with pytest.raises(BurnoutError, match="train_000000.bin.*truncated"):
        read_meta(tmp_path)


def test_read_meta_without_meta_or_dir(tmp_path):
    """Each kind of folder that is not a finished data folder is told apart: one whose preparation started (its
    manifest, or its owner file), one where none did, a file (your text, most likely), nothing at all."""
    with pytest.raises(BurnoutError, match=r"is not a prepared data folder \(no meta.json, and no preparation was "
                                           r"started there\); .*burnout data prepare .* --out DATA"):
        read_meta(tmp_path)
    (tmp_path / "manifest.json").write_text("{}")
    with pytest.raises(BurnoutError, match="never finished"):
        read_meta(tmp_path)
    (tmp_path / "manifest.json").unlink()
    mark_folder(tmp_path, "data")  # killed before its manifest: the owner file says what it was becoming
    with pytest.raises(BurnoutError, match="never finished"):
        read_meta(tmp_path)
    (tmp_path / "notes.txt").write_text("my text")
    with pytest.raises(BurnoutError, match=r"is a file, not a prepared data folder; prepare it into one first "
                                           r"\(burnout data prepare .*notes.txt --out DATA\)"):
        read_meta(tmp_path / "notes.txt")
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


@pytest.mark.slow
def test_token_budget_of_the_sample_does_not_depend_on_the_encode_chunk(tmp_path, monkeypatch):
    import burnout.data.prepare as prepare_module

    cfg = DataConfig(max_chars=30_000, shard_tokens=2_000)  # no max_tokens: the sample's token count is the budget
    whole = prepare_data(cfg, TOK_CFG, tmp_path / "whole")
    monkeypatch.setattr(prepare_module, "ENCODE_CHUNK_CHARS", 2_000)
    assert prepare_data(cfg, TOK_CFG, tmp_path / "chunked") == whole


def _full_disk():
    """Files may not grow past 64 KB, SIGXFSZ ignored: writes fail with EFBIG as they would with ENOSPC."""
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, 64 * 1024))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)


def test_a_full_disk_while_preparing_names_the_data_folder(tmp_path):
    """A write to an open file fails without a file name, and the line once said only "cannot read or write:
    File too large": it names the folder and what to do, and the same command then goes on."""
    words = [f"w{i}" for i in range(3000)]
    rng = random.Random(0)
    (tmp_path / "notes.txt").write_text("\n\n".join(" ".join(rng.choices(words, k=60)) for _ in range(2000)))
    command = [sys.executable, "-m", "burnout", "data", "prepare", str(tmp_path / "notes.txt"), "--out",
               str(tmp_path / "data"), "--tokenizer", "bpe:1024"]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=300, preexec_fn=_full_disk)
    assert proc.returncode == 74 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.stderr.splitlines()[-1] == (
        f"burnout: error: writing the prepared data into '{tmp_path / 'data'}' failed (File too large); free space "
        "on its disk, then run the same command again: it goes on where it stopped")
    proc = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert read_meta(tmp_path / "data")["splits"]["train"]["tokens"] > 64 * 1024 // 2  # past where it stopped


# ----------------------------------------------------------------------------------------------
# The data folder: one writer at a time, and told as burnout's whenever it holds anything


def test_a_second_prepare_of_one_folder_is_refused_naming_the_first_and_a_killed_one_frees_it(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("\n\n".join(f"note {i}: " + "words " * (i % 30) for i in range(300)))
    data = tmp_path / "data"
    prepare = ["data", "prepare", str(tmp_path / "notes.txt"), "--out", str(data), "--tokenizer", "bpe:300"]
    holder = subprocess.Popen([sys.executable, "-c", "import sys; from burnout.base.folders import FolderLock; "
                               "FolderLock(sys.argv[1]); print('held', flush=True); sys.stdin.read()", str(data)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        assert main(prepare) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"burnout: error: {data} is being written by burnout process {holder.pid} (")
        assert len(err.splitlines()) == 1 and not (data / "manifest.json").exists()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=60)
    assert main(prepare) == 0  # the dead holder's lock went with it
    assert read_meta(data)["splits"]["train"]["tokens"] > 0


def test_a_prepare_stopped_while_its_tokenizer_trains_leaves_a_folder_it_goes_on_with(tmp_path, monkeypatch, capsys):
    """--overwrite of a finished folder keeps its tokenizer.json until the new one is trained: stopped then, the
    folder must still be told as burnout's data (its manifest is written first), not refused as someone else's."""
    (tmp_path / "notes.txt").write_text("\n\n".join(f"note {i}: " + "words " * (i % 30) for i in range(300)))
    data = tmp_path / "data"
    prepare = ["data", "prepare", str(tmp_path / "notes.txt"), "--out", str(data), "--tokenizer", "bpe:300"]
    assert main(prepare) == 0

    def stopped(*args):
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr("burnout.data.prepare.train_mix_tokenizer", stopped)
        assert main([*prepare, "--overwrite"]) == 130
    assert (data / "tokenizer.json").is_file() and not (data / "meta.json").exists()
    capsys.readouterr()
    assert main(prepare) == 0, capsys.readouterr().err
    assert read_meta(data)["splits"]["train"]["tokens"] > 0


def one_line_file(path, source, chars: int):
    """`chars` characters of `source`'s words on a single line: one document however long."""
    words = " ".join(source.read_text(encoding="utf-8").split())
    path.write_text((words + " ") * (chars // (len(words) + 1)) + words[: chars % (len(words) + 1)] + "\n")
    return path


def peak_rss_bytes(args: list[str], cwd) -> int:
    """Peak resident memory of `python -m burnout ARGS`, read in a fresh Python that runs it as its only child (so
    that no earlier child of the test process counts)."""
    probe = ("import resource, subprocess, sys; "
             "done = subprocess.run([sys.executable, '-m', 'burnout', *sys.argv[1:]], stdout=subprocess.DEVNULL, "
             "stderr=subprocess.PIPE, text=True); "
             "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, done.returncode, done.stderr[-300:])")
    out = subprocess.run([sys.executable, "-c", probe, *args], capture_output=True, text=True, cwd=cwd, check=True)
    kib, returncode, tail = out.stdout.split(" ", 2)
    assert returncode == "0", tail
    return int(kib) * 1024


@pytest.mark.slow
def test_a_document_on_one_line_is_prepared_in_memory_that_does_not_grow_with_it(tmp_path, shared_data):
    """Tokenizer training and encoding take a long document a piece at a time: memory beyond a small file's grows by
    a few bytes per character of the document (its text and its ids), where it grew by hundreds before
    (docs/PERFORMANCE.md, "Memory of data preparation")."""
    source = shared_data / "tinyshakespeare" / "input.txt"
    chars = 10_000_000
    peaks = {}
    for size in (100_000, chars):
        text = one_line_file(tmp_path / f"line_{size}.txt", source, size)
        out = tmp_path / f"data_{size}"
        peaks[size] = peak_rss_bytes(["data", "prepare", str(text), "--out", str(out), "data.split=contiguous"],
                                     tmp_path)
        meta = read_meta(out)
        total = meta["sources"]["total"]
        # The one document, cut into its train and val parts, counts once.
        counts = [total[k] for k in ("documents", "train_documents", "val_documents", "cut_documents")]
        assert counts == [1, 1, 1, 1]
        assert meta["splits"]["train"]["tokens"] > size // 10
    assert peaks[chars] - peaks[100_000] < 32 * chars


@pytest.mark.parametrize("tokenizer", ["bpe:1000", "char"])
def test_a_long_document_prepared_in_pieces_gives_the_shards_of_the_whole(tmp_path, shared_data, monkeypatch,
                                                                           tokenizer):
    from burnout.data import encoder as encoder_module
    from burnout.data import tokenizer as tokenizer_module

    text = one_line_file(tmp_path / "line.txt", shared_data / "tinyshakespeare" / "input.txt", 300_000)
    metas = []
    for piece, batch in ((10**9, 10**9), (500, 5_000)):  # whole, then in pieces of at most 500 characters
        monkeypatch.setattr(tokenizer_module, "PIECE_CHARS", piece)
        monkeypatch.setattr(encoder_module, "BATCH_CHARS", batch)
        out = tmp_path / f"data_{piece}"
        assert main(["data", "prepare", str(text), "--out", str(out), "--tokenizer", tokenizer,
                     "data.split=contiguous"]) == 0
        metas.append(read_meta(out))
    assert metas[0] == metas[1]  # the same tokenizer and shards, byte for byte (their sha256)


@pytest.mark.parametrize(("stories", "split_by"), [(1, ["--split-by", "file"]), (2, []), (5, [])])
def test_val_holds_its_fraction_of_a_text_of_a_few_long_documents(tmp_path, capsys, stories, split_by):
    """Whole documents cannot give val 10% of a text of two stories (one takes 50%) or of one (none): a document
    larger than val's share is cut instead, its end to val, the rest to train."""
    write_stories(tmp_path / "stories.txt", stories)
    out = tmp_path / "data"
    assert main(["data", "prepare", str(tmp_path / "stories.txt"), "--out", str(out), *split_by, "--workers", "1",
                 "data.val_fraction=0.1"]) == 0
    meta = read_meta(out)
    val = meta["splits"]["val"]["tokens"]
    total = val + meta["splits"]["train"]["tokens"]
    assert abs(val - 0.1 * total) <= 3  # a token's rounding and the <|endoftext|> a cut adds
    text = (tmp_path / "stories.txt").read_text(encoding="utf-8")
    assert all(part in text for part in decoded_documents(out, "train") + decoded_documents(out, "val"))
    assert "far from data.val_fraction" not in capsys.readouterr().err


def test_a_val_share_far_from_val_fraction_is_said_at_prepare_and_at_train(tmp_path, capsys):
    """Two short stories under a budget far above them: neither is larger than val's share of the budget, so they
    go whole, and the second, to give val its first document, takes about half the tokens."""
    write_stories(tmp_path / "stories.txt", 2)
    out = tmp_path / "data"
    assert main(["data", "prepare", str(tmp_path / "stories.txt"), "--out", str(out), "--workers", "1",
                 "data.max_tokens=1000000"]) == 0
    meta = read_meta(out)
    val = meta["splits"]["val"]["tokens"]
    total = val + meta["splits"]["train"]["tokens"]
    said = (f"warning: the val split holds {val / total:.0%} of the tokens ({val:,} of {total:,}), far from "
            "data.val_fraction 0.05")
    assert said in capsys.readouterr().err
    assert main(["train", "--data", str(out), "--model", "shakespeare-char", "--out", str(tmp_path / "run"),
                 "train.max_steps=1", "train.batch_size=2", "train.seq_len=8", "train.eval_batches=1",
                 "train.device=cpu", "train.precision=fp32", "train.sample_tokens=0"]) == 0
    assert said in capsys.readouterr().out
    # The same folder as an older rule of parting train and val left it (no split_rule): still used, the warning
    # saying to prepare it again.
    meta_path = out / "meta.json"
    meta_path.write_text(json.dumps({k: v for k, v in json.loads(meta_path.read_text()).items() if k != "split_rule"}))
    assert main(["train", "--data", str(out), "--model", "shakespeare-char", "--out", str(tmp_path / "run-2"),
                 "train.max_steps=1", "train.batch_size=2", "train.seq_len=8", "train.eval_batches=1",
                 "train.device=cpu", "train.precision=fp32", "train.sample_tokens=0"]) == 0
    out_text = capsys.readouterr().out
    assert said in out_text and "parted into train and val by an older rule of burnout's" in out_text


def test_the_smallest_preset_a_prepared_folder_is_measured_against_is_the_smallest_preset():
    from burnout.config import load_model_preset, model_preset_names
    from burnout.models.memory import param_counts

    assert SMALLEST_PRESET_PARAMS == min(param_counts(load_model_preset(name)).total for name in model_preset_names())


def test_the_characters_left_out_are_counted_once_across_an_interrupted_and_resumed_prepare(tmp_path, monkeypatch):
    """A char tokenizer given for text with rare characters it lacks: a prepare killed after its third shard and
    resumed counts what it left out exactly as one run through does (the count is in the resume point)."""
    from burnout.data.shards import ShardWriter

    docs = [f"line {i}: plain words here" + (" é中😀"[: 1 + i % 3] if i % 40 == 0 else "") for i in range(2000)]
    (tmp_path / "docs.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    train_tokenizer(["abcdefghijklmnopqrstuvwxyz 0123456789:"], TokenizerConfig(kind="char")).save(
        str(tmp_path / "tokenizer.json"))
    cfg = DataConfig(sources=[SourceConfig(name="j", kind="jsonl", path=str(tmp_path / "docs.jsonl"))],
                     max_tokens=1_000_000, shard_tokens=5_000)
    reference = prepare_data(cfg, TOK_CFG, tmp_path / "ref", tokenizer_path=tmp_path / "tokenizer.json", workers=1)
    expected = sum(len(" é中😀"[: 1 + i % 3]) - 1 for i in range(0, 2000, 40))  # the space is in the vocabulary
    assert reference["dropped_characters"]["characters"] == expected > 0
    real_close, closed = ShardWriter._close, []

    def dying_close(self):
        real_close(self)
        closed.append(self.index)
        if len(closed) == 3:
            raise KeyboardInterrupt

    monkeypatch.setattr(ShardWriter, "_close", dying_close)
    with pytest.raises(KeyboardInterrupt):
        prepare_data(cfg, TOK_CFG, tmp_path / "run", tokenizer_path=tmp_path / "tokenizer.json", workers=1)
    monkeypatch.setattr(ShardWriter, "_close", real_close)
    assert json.loads((tmp_path / "run" / "manifest.json").read_text())["resume"]["dropped"]  # counted before the kill
    resumed = prepare_data(cfg, TOK_CFG, tmp_path / "run", tokenizer_path=tmp_path / "tokenizer.json", workers=1)
    assert resumed["dropped_characters"] == reference["dropped_characters"] and resumed == reference
