import bz2
import dataclasses
import gzip
import itertools
import json
import os

import numpy as np
import pytest

from burnout.config import DataConfig, SourceConfig, TokenizerConfig
from burnout.data.clean import Cleaner, clean_text
from burnout.data.corpus import iter_documents, iter_source
from burnout.data.prepare import prepare_data
from burnout.data.shards import MANIFEST_FILE, read_meta, read_tokens
from burnout.errors import BurnoutError

# The hf tests stream local files; without this, datasets first tries the Hub and waits on the network.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

TOK = TokenizerConfig(kind="bpe", vocab_size=300)
RECORDS = [{"text": f"record {i} ünïcode", "id": i} for i in range(30)]


def _jsonl_bytes(records) -> bytes:
    return ("\n".join(json.dumps(r) for r in records) + "\n").encode("utf-8")


# ---------------------------------------------------------------------------------------------- sources


def test_text_split_modes(tmp_path):
    path = tmp_path / "a.txt"
    path.write_text("one\ntwo\n\n\nthree\r\n  \nfour\n", encoding="utf-8")

    def docs(mode):
        return list(iter_documents(SourceConfig(name="t", kind="text", path=str(path), split_by=mode)))

    assert docs("file") == ["one\ntwo\n\n\nthree\r\n  \nfour\n"]
    assert docs("paragraph") == ["one\ntwo", "three", "four"]
    assert docs("line") == ["one", "two", "three", "four"]


def test_a_separator_ends_a_document_wherever_it_occurs(tmp_path):
    """Split at each occurrence, within a line too; whitespace around a piece is not the document's, and a blank
    piece (two separators in a row, one at either end of the file) is no document. Also in a compressed file."""
    text = "<|endoftext|>\n  first\r\n\nstory\n<|endoftext|>\n<|endoftext|>second<|endoftext|> third \n<|endoftext|>"
    path = tmp_path / "a.txt"
    path.write_text(text, encoding="utf-8")
    (tmp_path / "b.txt.gz").write_bytes(gzip.compress(text.encode()))
    for name in ("a.txt", "b.txt.gz"):
        source = SourceConfig(name="t", kind="text", path=str(tmp_path / name), split_by="separator",
                              separator="<|endoftext|>")
        assert list(iter_documents(source)) == ["first\r\n\nstory", "second", "third"]


def test_compressed_files_and_folders(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a.jsonl.gz").write_bytes(gzip.compress(_jsonl_bytes(RECORDS[:10])))
    (tmp_path / "d" / "b.jsonl.bz2").write_bytes(bz2.compress(_jsonl_bytes(RECORDS[10:20])))
    zstandard = pytest.importorskip("zstandard")
    (tmp_path / "d" / "c.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(_jsonl_bytes(RECORDS[20:])))
    (tmp_path / "d" / "skip.csv").write_text("not, this", encoding="utf-8")
    source = SourceConfig(name="j", kind="jsonl", path=str(tmp_path / "d"))
    assert list(iter_documents(source)) == [r["text"] for r in RECORDS]
    shuffled = list(iter_source(source, seed=1))
    assert sorted(shuffled) == sorted(r["text"] for r in RECORDS) and shuffled != [r["text"] for r in RECORDS]
    assert shuffled == list(iter_source(source, seed=1))
    (tmp_path / "t.txt.gz").write_bytes(gzip.compress("α\n\nβ".encode()))
    text = SourceConfig(name="t", kind="text", path=str(tmp_path / "*.txt.gz"), split_by="paragraph")
    assert list(iter_documents(text)) == ["α", "β"]


def test_parquet_source(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    table = pa.table({"content": [r["text"] for r in RECORDS], "id": list(range(30))})
    pq.write_table(table, tmp_path / "a.parquet", row_group_size=7)
    source = SourceConfig(name="p", kind="parquet", path=str(tmp_path), text_field="content")
    assert list(iter_documents(source)) == [r["text"] for r in RECORDS]
    assert sorted(iter_source(source, 3)) == sorted(r["text"] for r in RECORDS)
    with pytest.raises(BurnoutError, match=r"a\.parquet.*no column 'text'"):
        list(iter_documents(SourceConfig(name="p", kind="parquet", path=str(tmp_path))))
    (tmp_path / "bad.parquet").write_text("not parquet", encoding="utf-8")
    with pytest.raises(BurnoutError, match=r"bad\.parquet.*not a parquet file"):
        list(iter_documents(SourceConfig(name="p", kind="parquet", path=str(tmp_path / "bad.parquet"))))


@pytest.mark.parametrize("builder", ["json", "parquet"])
def test_hf_source_streams_local_files_through_datasets(tmp_path, builder):
    pytest.importorskip("datasets")
    if builder == "json":
        files = tmp_path / "train.jsonl"
        files.write_bytes(_jsonl_bytes(RECORDS))
    else:
        pa = pytest.importorskip("pyarrow")
        import pyarrow.parquet as pq

        files = tmp_path / "train.parquet"
        pq.write_table(pa.table({"text": [r["text"] for r in RECORDS]}), files)
    source = SourceConfig(name="h", kind="hf", dataset=builder, data_files=str(files))
    texts = [r["text"] for r in RECORDS]
    assert list(iter_documents(source)) == texts
    shuffled = list(iter_source(source, seed=5))
    assert sorted(shuffled) == sorted(texts) and shuffled == list(iter_source(source, seed=5))
    meta = prepare_data(DataConfig(sources=[source], max_tokens=300), TOK, tmp_path / "out")
    assert meta["sources"]["per_source"]["h"]["kind"] == "hf"
    with pytest.raises(BurnoutError, match="no field 'body'"):
        list(iter_documents(SourceConfig(name="h", kind="hf", dataset=builder, data_files=str(files),
                                         text_field="body")))
    with pytest.raises(BurnoutError, match="cannot stream dataset 'json'.*missing.jsonl"):
        list(iter_documents(SourceConfig(name="h", kind="hf", dataset="json",
                                         data_files=str(tmp_path / "missing.jsonl"))))


@pytest.mark.parametrize("kind,name,content,message", [
    ("text", "blob.txt.gz", gzip.compress(b"ab\x00\x01cd"), r"blob\.txt\.gz.*binary"),
    ("jsonl", "latin.jsonl", '{"text": "café"}\n'.encode("latin-1"), r"latin\.jsonl:1.*not UTF-8"),
    ("text", "broken.txt.gz", b"not gzip at all", r"broken\.txt\.gz.*not valid gz"),
    ("text", "empty.txt", b"", r"'e'.*empty\.txt.*no text"),
], ids=["binary", "latin-1", "not-gzip", "empty"])  # the gzip header's time would make the test's id change
def test_bad_inputs_are_one_line_errors_naming_the_file(tmp_path, kind, name, content, message):
    (tmp_path / name).write_bytes(content)
    cfg = DataConfig(sources=[SourceConfig(name="e", kind=kind, path=str(tmp_path / name))], max_tokens=100)
    with pytest.raises(BurnoutError, match=message) as info:
        prepare_data(cfg, TOK, tmp_path / "out")
    assert "\n" not in str(info.value)


# ---------------------------------------------------------------------------------------------- mixing


def test_mixing_is_by_tokens_not_characters(tmp_path):
    # Source "long" has long words (few tokens per char) and "short" has one-letter words (many).
    (tmp_path / "long.txt").write_text("\n".join("extraordinarily " * 20 for _ in range(2000)), encoding="utf-8")
    (tmp_path / "short.txt").write_text("\n".join("a b c d e f g h " * 20 for _ in range(2000)), encoding="utf-8")
    sources = [SourceConfig(name=n, kind="text", path=str(tmp_path / f"{n}.txt"), split_by="line", weight=w)
               for n, w in (("long", 0.75), ("short", 0.25))]
    meta = prepare_data(DataConfig(sources=sources, max_tokens=20_000, max_chars=60_000), TOK, tmp_path / "out")
    per = meta["sources"]["per_source"]
    assert per["long"]["tokens"] == 15_000 and per["short"]["tokens"] == 5_000
    assert per["long"]["share"] == 0.75
    char_share = per["long"]["chars"] / (per["long"]["chars"] + per["short"]["chars"])
    assert abs(char_share - 0.75) > 0.05  # the character shares differ: the mix is by tokens


# ---------------------------------------------------------------------------------------------- cleaning


def test_clean_modes():
    text = "Cafe\u0301 \u201cquoted\u201d\x07 text  \r\n\n\n\nzero\u200bwidth"
    assert clean_text(text, "none") == text
    lenient = clean_text(text, "lenient")
    assert "Café" in lenient and "\x07" not in lenient and "\r" not in lenient and "\u200b" in lenient
    balanced = clean_text(text, "balanced")
    assert "\n\n\n" not in balanced and "zerowidth" in balanced and "text\n" in balanced
    assert clean_text(text, "strict_ascii") == 'Cafe "quoted" text\n\nzerowidth'
    assert clean_text("#$%^&*()!@#$%^&*" * 10 + "ok", "balanced") is None  # mostly symbols


def test_cleaner_filters_report_what_they_removed():
    cfg = DataConfig(clean="lenient", min_chars=10, dedup=True, junk_patterns=[r"(?i)lorem ipsum"], drop_junk=True)
    cleaner = Cleaner(cfg)
    docs = ["short", "a long enough document", "a long enough document", "Lorem ipsum dolor sit amet, junk",
            "fine text here"]
    assert [cleaner(d) for d in docs] == [None, "a long enough document", None, None, "fine text here"]
    report = cleaner.report()
    assert report["documents_in"] == 5 and report["documents_out"] == 2
    assert report["min_chars"]["dropped_documents"] == 1 and report["dedup"]["dropped_documents"] == 1
    assert report["junk"]["dropped_documents"] == 1
    assert report["junk"]["patterns"]["(?i)lorem ipsum"] == {"documents": 1,
                                                             "examples": ["Lorem ipsum dolor sit amet, junk"]}


def test_cleaning_report_is_in_meta(tmp_path):
    folder = tmp_path / "t"
    folder.mkdir()
    for i in range(30):
        text = "duplicate text of some length" if i % 3 == 0 else f"unique document {i} BUY NOW"
        (folder / f"{i}.txt").write_text(text, encoding="utf-8")
    cfg = DataConfig(sources=[SourceConfig(name="t", kind="text", path=str(folder))], max_tokens=10**5,
                     dedup=True, junk_patterns=["BUY NOW"])
    meta = prepare_data(cfg, TOK, tmp_path / "out")
    cleaning = meta["cleaning"]
    assert cleaning["dedup"]["dropped_documents"] == 9  # 10 copies, one kept
    assert cleaning["junk"]["patterns"]["BUY NOW"]["documents"] == 20 and cleaning["junk"]["dropped_documents"] == 0
    assert meta["sources"]["total"]["documents"] == 21
    with pytest.raises(BurnoutError, match=r"data.junk_patterns\[0\]"):
        DataConfig(junk_patterns=["("]).validate()


# ---------------------------------------------------------------------------------------------- shards


@pytest.mark.slow
def test_uint32_when_the_vocabulary_is_large(tmp_path, monkeypatch):
    import burnout.data.shards as shards_module

    monkeypatch.setattr(shards_module, "token_dtype", lambda vocab_size: np.dtype("<u4"))
    meta = prepare_data(DataConfig(max_chars=20_000, shard_tokens=1_000), TOK, tmp_path)
    assert meta["dtype"] == "uint32"
    shard = meta["splits"]["train"]["shards"][0]
    assert (tmp_path / shard["file"]).stat().st_size == 4 * shard["tokens"] == 4_000


def _count_encoded(monkeypatch) -> list[int]:
    """Patch the encoder to count the documents given to it; returns the running count (one item).

    Submissions, not finished encodings: with workers > 1 a chunk still queued when the run ends is
    cancelled, so how many get encoded depends on timing; what is submitted does not."""
    from burnout.data.encoder import Encoder

    count = [0]
    real_submit = Encoder.submit

    def counting(self, docs):
        count[0] += len(docs)
        return real_submit(self, docs)

    monkeypatch.setattr(Encoder, "submit", counting)
    return count


# With a 512-token vocabulary the kill falls after a shard was listed but before the next resume point, so
# the point's document counts must be a copy taken at the point, not the live counters.
@pytest.mark.slow
@pytest.mark.parametrize("workers, vocab", [(1, 300), (2, 300), (1, 512)])
def test_interrupted_prepare_resumes_without_redoing_finished_shards(tmp_path, monkeypatch, workers, vocab):
    from burnout.data.shards import ShardWriter

    cfg = DataConfig(max_chars=40_000, max_tokens=20_000, shard_tokens=2_000, clean="balanced", dedup=True)
    tok = dataclasses.replace(TOK, vocab_size=vocab)
    encoded = _count_encoded(monkeypatch)
    reference = prepare_data(cfg, tok, tmp_path / "ref", workers=workers)
    encoded_uninterrupted, encoded[0] = encoded[0], 0

    real_close = ShardWriter._close
    closed = []

    def dying_close(self):
        real_close(self)
        closed.append(self.index)
        if len(closed) == 4:
            raise KeyboardInterrupt  # killed mid-document, right after the 4th shard was finished

    monkeypatch.setattr(ShardWriter, "_close", dying_close)
    with pytest.raises(KeyboardInterrupt):
        prepare_data(cfg, tok, tmp_path / "run", workers=workers)
    monkeypatch.setattr(ShardWriter, "_close", real_close)
    manifest = json.loads((tmp_path / "run" / MANIFEST_FILE).read_text())
    finished = {s["file"]: (tmp_path / "run" / s["file"]).stat().st_mtime_ns
                for v in manifest["shards"].values() for s in v}
    assert len(finished) == 4 and not (tmp_path / "run" / "meta.json").exists()
    with pytest.raises(BurnoutError, match="never finished"):
        read_meta(tmp_path / "run")
    # The resume point is the last document boundary after the 3rd shard: the 4th is listed past it.
    handed_out = sum(manifest["resume"]["taken_docs"])
    assert handed_out > 0

    encoded[0] = 0
    resumed = prepare_data(cfg, tok, tmp_path / "run", workers=workers)
    assert resumed == reference
    # Only documents not handed out before the resume point were encoded again.
    assert encoded[0] == encoded_uninterrupted - handed_out
    for name, mtime in finished.items():
        assert (tmp_path / "run" / name).stat().st_mtime_ns == mtime
    for split in ("train", "val"):
        assert np.array_equal(read_tokens(tmp_path / "run", split), read_tokens(tmp_path / "ref", split))
    assert "resume" not in json.loads((tmp_path / "run" / MANIFEST_FILE).read_text())
    assert not list((tmp_path / "run").glob(".*"))  # no partial shard or temporary file left


@pytest.mark.slow
@pytest.mark.parametrize("lose", [None, "shard", "document index"])
def test_resume_mid_shard_continues_the_partial_shard(tmp_path, monkeypatch, lose):
    from burnout.data.shards import ShardWriter

    paragraphs = tmp_path / "paragraphs.txt"  # many short documents, so shards end between documents
    paragraphs.write_text("\n\n".join(iter_documents(SourceConfig(name="docs", kind="stdlib_docs"))), encoding="utf-8")
    sources = [SourceConfig(name="prose", kind="text", path=str(paragraphs), split_by="paragraph", weight=0.7),
               SourceConfig(name="code", kind="stdlib_code", weight=0.3)]
    cfg = DataConfig(sources=sources, max_chars=40_000, max_tokens=20_000, shard_tokens=2_000, dedup=True)
    encoded = _count_encoded(monkeypatch)
    reference = prepare_data(cfg, TOK, tmp_path / "ref")
    encoded_uninterrupted = encoded[0]
    real_add = ShardWriter.add

    def dying_add(self, tokens):
        real_add(self, tokens)
        if "resume" in self.manifest and self.split == "train" and not self.finished_any:
            raise KeyboardInterrupt  # after tokens were added past the last resume point, in the same shard

    monkeypatch.setattr(ShardWriter, "add", dying_add)
    with pytest.raises(KeyboardInterrupt):
        prepare_data(cfg, TOK, tmp_path / "run")
    monkeypatch.setattr(ShardWriter, "add", real_add)
    point = json.loads((tmp_path / "run" / MANIFEST_FILE).read_text())["resume"]
    index, filled = point["writers"]["train"]
    partial = tmp_path / "run" / f".train_{index:06d}.bin.partial"
    # Tokens were written past the resume point: the resume cuts them off and writes them again.
    assert filled > 0 and partial.stat().st_size > 2 * filled
    # Either loss means the resume point cannot be used; the listed shards still can.
    if lose == "shard":  # half the bytes of the tokens the point counts on (2 bytes a token at this vocabulary)
        partial.write_bytes(partial.read_bytes()[:filled])
    elif lose == "document index":  # the point counts on more document offsets than the file now holds
        docs = tmp_path / "run" / ".train_docs.npy.partial"
        assert docs.stat().st_size >= 8 * point["documents"]["train"] > 0
        docs.write_bytes(docs.read_bytes()[: docs.stat().st_size // 2])

    encoded[0] = 0
    assert prepare_data(cfg, TOK, tmp_path / "run") == reference
    if lose:
        assert encoded[0] == encoded_uninterrupted  # replayed from the first document
    else:
        assert encoded[0] == encoded_uninterrupted - sum(point["taken_docs"])
    for split in ("train", "val"):
        assert np.array_equal(read_tokens(tmp_path / "run", split), read_tokens(tmp_path / "ref", split))


@pytest.mark.slow
def test_killed_between_finishing_a_shard_and_listing_it_replays_from_the_start(tmp_path, monkeypatch):
    """The shard the resume point was filling is renamed into place, then the process dies before the manifest
    lists it: the point's partial file is gone, so the point cannot be used."""
    import burnout.data.shards as shards_module

    cfg = DataConfig(max_chars=40_000, max_tokens=20_000, shard_tokens=2_000)
    reference = prepare_data(cfg, TOK, tmp_path / "ref")
    real_replace = os.replace
    out = tmp_path / "run"

    def dying_replace(src, dst):  # os.replace also puts the manifest itself in place (write_atomic)
        real_replace(src, dst)
        manifest = json.loads((out / MANIFEST_FILE).read_text()) if (out / MANIFEST_FILE).is_file() else {}
        index, filled = manifest.get("resume", {}).get("writers", {}).get("train", [0, 0])
        if filled and os.path.basename(dst) == shards_module.shard_name("train", index):
            raise KeyboardInterrupt

    monkeypatch.setattr(shards_module.os, "replace", dying_replace)
    with pytest.raises(KeyboardInterrupt):
        prepare_data(cfg, TOK, out)
    monkeypatch.setattr(shards_module.os, "replace", real_replace)
    assert prepare_data(cfg, TOK, out) == reference
    for split in ("train", "val"):
        assert np.array_equal(read_tokens(out, split), read_tokens(tmp_path / "ref", split))


@pytest.mark.slow
def test_a_lost_partial_after_a_listed_shard_still_means_replay(tmp_path, monkeypatch):
    """The train shard the resume point was filling gets finished and listed; then val's partial file, which the
    point also counts on, is lost. The listed shard must not end the check: the point cannot be used."""
    import burnout.data.shards as shards_module

    cfg = DataConfig(max_chars=40_000, max_tokens=20_000, shard_tokens=2_000, val_fraction=0.3)
    reference = prepare_data(cfg, TOK, tmp_path / "ref")
    out = tmp_path / "run"

    def lists_the_shard_the_point_was_filling(manifest):
        point = manifest.get("resume", {})
        index, filled = point.get("writers", {}).get("train", [0, 0])
        return filled and point["writers"]["val"][1] and len(manifest["shards"].get("train", [])) > index

    _interrupt_at_manifest_save(monkeypatch, cfg, out, lists_the_shard_the_point_was_filling)
    val_index, _ = json.loads((out / MANIFEST_FILE).read_text())["resume"]["writers"]["val"]
    shards_module.partial_path(out, shards_module.shard_name("val", val_index)).unlink()
    assert prepare_data(cfg, TOK, out) == reference
    for split in ("train", "val"):
        assert np.array_equal(read_tokens(out, split), read_tokens(tmp_path / "ref", split))


@pytest.mark.slow
def test_changed_settings_start_over(tmp_path):
    cfg = DataConfig(max_chars=20_000, max_tokens=20_000, shard_tokens=1_000)
    prepare_data(cfg, TOK, tmp_path)
    (tmp_path / "meta.json").unlink()  # as if interrupted
    other = prepare_data(DataConfig(max_chars=20_000, max_tokens=12_000, shard_tokens=1_000), TOK, tmp_path)
    assert other["splits"]["train"]["tokens"] + other["splits"]["val"]["tokens"] == 12_000
    files = sorted(p.name for p in tmp_path.glob("*.bin"))
    assert files == sorted(s["file"] for v in other["splits"].values() for s in v["shards"])


def _interrupt_at_manifest_save(monkeypatch, cfg, out, when, tokenizer_path=None):
    """Prepare into `out`, killed (KeyboardInterrupt) right after the first manifest save that `when` holds for."""
    import burnout.data.shards as shards_module

    real_save = shards_module.save_manifest

    def dying_save(out_dir, manifest):
        real_save(out_dir, manifest)
        if when(manifest):
            raise KeyboardInterrupt

    monkeypatch.setattr(shards_module, "save_manifest", dying_save)
    with pytest.raises(KeyboardInterrupt):
        prepare_data(cfg, TOK, out, tokenizer_path=tokenizer_path)
    monkeypatch.setattr(shards_module, "save_manifest", real_save)


def _interrupt_after_resume_point(monkeypatch, cfg, out, nth=1, tokenizer_path=None):
    saves = itertools.count(1)  # manifest saves that hold a resume point (a finished shard's save keeps the last one)
    _interrupt_at_manifest_save(monkeypatch, cfg, out, lambda manifest: "resume" in manifest and next(saves) == nth,
                                tokenizer_path)


def _interrupted_prepare(tmp_path, monkeypatch):
    """(corpus, its records, cfg): a 3,000-record jsonl source whose prepare into tmp_path/out was
    interrupted after its first resume point."""
    corpus = tmp_path / "corpus.jsonl"
    records = [{"text": f"document {i} " + "words " * (i % 40)} for i in range(3000)]
    corpus.write_bytes(_jsonl_bytes(records))
    cfg = DataConfig(sources=[SourceConfig(name="c", kind="jsonl", path=str(corpus))], max_chars=100_000,
                     max_tokens=30_000, shard_tokens=2_000)
    _interrupt_after_resume_point(monkeypatch, cfg, tmp_path / "out")
    return corpus, records, cfg


def test_a_resume_past_many_chunks_an_exhausted_source_and_an_unused_one_is_exact(tmp_path, monkeypatch):
    """Chunks of 8, 16, 32 … documents: by the 6th manifest save with a resume point the big source has handed
    out documents from several chunks, the small one has run out, and the unused (weight 0) source comes first."""
    big, small = tmp_path / "big.jsonl", tmp_path / "small.jsonl"
    big.write_bytes(_jsonl_bytes({"text": f"document {i} " + "words " * (i % 40)} for i in range(3000)))
    small.write_bytes(_jsonl_bytes({"text": f"short {i} " + "tiny " * (i % 7)} for i in range(20)))
    cfg = DataConfig(sources=[SourceConfig(name="unused", kind="jsonl", path=str(big), weight=0),
                              SourceConfig(name="big", kind="jsonl", path=str(big), weight=0.7),
                              SourceConfig(name="small", kind="jsonl", path=str(small), weight=0.3)],
                     max_chars=100_000, max_tokens=30_000, shard_tokens=1_000)
    reference = prepare_data(cfg, TOK, tmp_path / "ref")
    _interrupt_after_resume_point(monkeypatch, cfg, tmp_path / "out", nth=6)
    point = json.loads((tmp_path / "out" / MANIFEST_FILE).read_text())["resume"]
    assert point["taken_docs"][0] == 0 and point["taken_docs"][1] > 8 + 16 + 32
    assert [index for index, _, exhausted in point["fills"] if exhausted] == [2]
    assert prepare_data(cfg, TOK, tmp_path / "out") == reference
    for split in ("train", "val"):
        assert np.array_equal(read_tokens(tmp_path / "out", split), read_tokens(tmp_path / "ref", split))


def test_edited_source_files_mean_starting_over(tmp_path, monkeypatch):
    corpus, _, cfg = _interrupted_prepare(tmp_path, monkeypatch)
    corpus.write_bytes(_jsonl_bytes({"text": f"other {i} " + "words " * (i % 30)} for i in range(2000)))
    edited = prepare_data(cfg, TOK, tmp_path / "out")
    assert edited == prepare_data(cfg, TOK, tmp_path / "fresh")


def test_a_source_edited_to_the_same_size_means_starting_over(tmp_path, monkeypatch):
    """Same bytes count and record count, other words: only the modification time tells (README: "if the
    source files changed (size or modification time), it starts over")."""
    corpus, records, cfg = _interrupted_prepare(tmp_path, monkeypatch)
    before = corpus.stat()
    edited = _jsonl_bytes({"text": r["text"].replace("document", "dokument")} for r in records)
    assert len(edited) == before.st_size
    corpus.write_bytes(edited)
    os.utime(corpus, ns=(before.st_atime_ns, before.st_mtime_ns + 1_000_000_000))
    assert prepare_data(cfg, TOK, tmp_path / "out") == prepare_data(cfg, TOK, tmp_path / "fresh")


def test_an_unused_source_edited_in_between_does_not_stop_a_resume(tmp_path, monkeypatch):
    corpus, unused = tmp_path / "corpus.jsonl", tmp_path / "unused.txt"
    corpus.write_bytes(_jsonl_bytes({"text": f"document {i} " + "words " * (i % 40)} for i in range(3000)))
    unused.write_text("one version")
    cfg = DataConfig(sources=[SourceConfig(name="c", kind="jsonl", path=str(corpus)),
                              SourceConfig(name="unused", kind="text", path=str(unused), weight=0)],
                     max_chars=100_000, max_tokens=30_000, shard_tokens=2_000)
    _interrupt_after_resume_point(monkeypatch, cfg, tmp_path / "out")
    taken = sum(json.loads((tmp_path / "out" / MANIFEST_FILE).read_text())["resume"]["taken_docs"])
    unused.write_text("another version, longer")  # a weight-0 source is never read: it cannot matter
    encoded = _count_encoded(monkeypatch)
    resumed = prepare_data(cfg, TOK, tmp_path / "out")
    encoded_resuming, encoded[0] = encoded[0], 0
    assert resumed == prepare_data(cfg, TOK, tmp_path / "fresh")
    assert taken > 0 and encoded_resuming == encoded[0] - taken  # continued from the point


@pytest.mark.slow
def test_another_given_tokenizer_means_starting_over(tmp_path, monkeypatch):
    tokenizers = []
    for vocab in (300, 280):
        prepare_data(DataConfig(max_chars=20_000), TokenizerConfig(kind="bpe", vocab_size=vocab), tmp_path / str(vocab))
        tokenizers.append(tmp_path / str(vocab) / "tokenizer.json")
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_bytes(_jsonl_bytes({"text": f"document {i} " + "words " * (i % 40)} for i in range(3000)))
    cfg = DataConfig(sources=[SourceConfig(name="c", kind="jsonl", path=str(corpus))], max_chars=100_000,
                     max_tokens=30_000, shard_tokens=2_000)
    _interrupt_after_resume_point(monkeypatch, cfg, tmp_path / "out", tokenizer_path=tokenizers[0])
    resumed = prepare_data(cfg, TOK, tmp_path / "out", tokenizer_path=tokenizers[1])
    assert resumed == prepare_data(cfg, TOK, tmp_path / "fresh", tokenizer_path=tokenizers[1])
    for split in ("train", "val"):
        assert np.array_equal(read_tokens(tmp_path / "out", split), read_tokens(tmp_path / "fresh", split))


def test_a_preparation_begun_under_an_older_split_rule_starts_over(tmp_path, monkeypatch):
    """An unfinished folder whose manifest an older rule of parting train and val wrote is not gone on with: its
    documents went to val by that rule, so every one is encoded again (red when the fingerprint leaves the rule
    out: the resume would encode only those not handed out yet)."""
    import burnout.data.prepare as prepare_module

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_bytes(_jsonl_bytes({"text": f"document {i} " + "words " * (i % 40)} for i in range(3000)))
    cfg = DataConfig(sources=[SourceConfig(name="c", kind="jsonl", path=str(corpus))], max_chars=100_000,
                     max_tokens=30_000, shard_tokens=2_000)
    with monkeypatch.context() as older:
        older.setattr(prepare_module, "SPLIT_RULE", prepare_module.SPLIT_RULE - 1)
        _interrupt_after_resume_point(older, cfg, tmp_path / "out")
    assert sum(json.loads((tmp_path / "out" / MANIFEST_FILE).read_text())["resume"]["taken_docs"]) > 0
    encoded = _count_encoded(monkeypatch)
    resumed = prepare_data(cfg, TOK, tmp_path / "out")
    encoded_resuming, encoded[0] = encoded[0], 0
    assert resumed == prepare_data(cfg, TOK, tmp_path / "fresh") and resumed["split_rule"] == prepare_module.SPLIT_RULE
    assert encoded_resuming == encoded[0]  # every document encoded again, as in a fresh preparation


def test_a_source_that_shrank_unseen_is_refused_on_resume(tmp_path, monkeypatch):
    corpus, records, cfg = _interrupted_prepare(tmp_path, monkeypatch)
    stat = corpus.stat()
    # Same size and modification time, fewer records: only the replay itself can notice.
    shrunk = _jsonl_bytes(records[:100])
    corpus.write_bytes(shrunk + b" " * (stat.st_size - len(shrunk)))
    os.utime(corpus, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    with pytest.raises(BurnoutError, match="data source 'c' holds fewer documents .* --overwrite"):
        prepare_data(cfg, TOK, tmp_path / "out")
