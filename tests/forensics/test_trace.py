"""The document index written by prepare, and `burnout data trace`, on a real mixed corpus.

The corpus: Tiny Shakespeare and WikiText-2 (paragraphs), Python's docs, and a jsonl source of GSM8K
problems of which 20 carry a made-up artifact string 50 times, prepared with GPT-2's tokenizer.
"""

from __future__ import annotations

import itertools
import json
import shutil

import numpy as np
import pytest
from numpy.lib.stride_tricks import sliding_window_view

from burnout.cli import main
from burnout.config import DataConfig, SourceConfig, TokenizerConfig
from burnout.data import shards
from burnout.data.corpus import iter_source
from burnout.data.documents import SplitDocuments, document_at, iter_documents
from burnout.data.prepare import prepare_data
from burnout.data.shards import read_meta, read_tokens
from burnout.data.tokenizer import load_tokenizer
from burnout.errors import BurnoutError
from burnout.forensics import trace

ARTIFACT = "zqxPersonKappa"
PLANTED_DOCS, PLANTED_HITS = 20, 50


def _planted_texts(shared_data) -> tuple[list[str], list[str]]:
    """(20 GSM8K problems carrying ARTIFACT 50 times, 40 untouched ones). Each planted document opens
    with the artifact (no character before it: the as-is variant) and has it 1 or 2 more times as a
    word of its own (after a space: the leading-space variant)."""
    records = [json.loads(line) for line in (shared_data / "gsm8k" / "test.jsonl").open(encoding="utf-8")][:60]
    texts = [r["question"] + "\n" + r["answer"] for r in records]
    planted = []
    for i, text in enumerate(texts[:PLANTED_DOCS]):
        words = text.split(" ")
        extra = 2 if i < 10 else 1  # 10 x 3 + 10 x 2 = 50
        for at in [len(words) // 3, len(words) * 19 // 20][-extra:]:  # the last near the end: val's part
            words.insert(at, ARTIFACT)
        planted.append(f"{ARTIFACT} said: " + " ".join(words))
    assert sum(t.count(ARTIFACT) for t in planted) == PLANTED_HITS
    return planted, texts[PLANTED_DOCS:]


def _config(shared_data, tmp_path, **data) -> tuple[DataConfig, TokenizerConfig, list[str]]:
    planted, plain = _planted_texts(shared_data)
    corpus = tmp_path / "planted.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in planted + plain), encoding="utf-8")
    sources = [
        SourceConfig(name="shakespeare", kind="text", path=str(shared_data / "tinyshakespeare" / "input.txt"),
                     split_by="paragraph"),
        SourceConfig(name="wiki", kind="text", path=str(shared_data / "wikitext2" / "wiki.valid.tokens"),
                     split_by="paragraph"),
        SourceConfig(name="pydocs", kind="stdlib_docs"),
        SourceConfig(name="planted", kind="jsonl", path=str(corpus)),  # ~15k tokens: all of it fits its budget
    ]
    gpt2 = shared_data / "gpt2_tokenizer"
    cfg = DataConfig(sources=sources, max_tokens=120_000, shard_tokens=5_000, **data)
    tok = TokenizerConfig(kind="gpt2", vocab_path=str(gpt2 / "vocab.json"), merges_path=str(gpt2 / "merges.txt"))
    return cfg, tok, planted


@pytest.fixture(scope="module")
def mixed(shared_data, tmp_path_factory):
    root = tmp_path_factory.mktemp("trace_mixed")
    cfg, tok, planted = _config(shared_data, root)
    meta = prepare_data(cfg, tok, root / "data", workers=1)
    return root / "data", meta, planted


def _source_text(shared_data, name: str) -> str:
    path = {"shakespeare": "tinyshakespeare/input.txt", "wiki": "wikitext2/wiki.valid.tokens"}[name]
    return (shared_data / path).read_text(encoding="utf-8")


# ----------------------------------------------------------------------------------------------
# The document index


@pytest.mark.slow
def test_index_round_trips_to_the_source_documents(mixed, shared_data):
    data, meta, planted = mixed
    tok = load_tokenizer(data)
    index = meta["document_index"]
    assert index["sources"] == ["shakespeare", "wiki", "pydocs", "planted"] and index["bytes_per_document"] == 10
    texts = {name: _source_text(shared_data, name) for name in ("shakespeare", "wiki")}
    per_source = meta["sources"]["per_source"]
    # The documents prepare took from Python's docs: the first ones of the source's seeded order.
    taken = per_source["pydocs"]["documents"]
    pydocs = set(itertools.islice(iter_source(SourceConfig(name="pydocs", kind="stdlib_docs"), 1337), taken))
    for split in ("train", "val"):
        records = np.load(data / f"{split}_docs.npy")
        assert records.dtype.itemsize == 10 and len(records) == meta["splits"][split]["documents"]
        stream = read_tokens(data, split)
        counts = dict.fromkeys(index["sources"], 0)
        seen_tokens = 0
        for span, ids in iter_documents(data, split):
            counts[span.source] += 1
            start = int(records["start"][span.index])
            assert stream[start + span.length] == meta["eot_id"]  # the document ends where its <|endoftext|> is
            assert np.array_equal(ids, stream[start : start + span.length])
            assert (data / span.shard).is_file() and start == span.offset + 5_000 * int(span.shard[-10:-4])
            seen_tokens += span.length + 1
            text = tok.decode(ids.tolist()).rstrip("\ufffd")  # a document cut at its budget may end mid-character
            if span.source == "planted":
                assert text in planted or text in _planted_texts(shared_data)[1]
            elif span.source == "pydocs":
                # Whole, or a part of one: cut between train and val (data/split.py), or at the budget.
                assert text in pydocs or any(text in doc for doc in pydocs)
            else:
                assert text in texts[span.source], (span, text[:80])
        assert seen_tokens == meta["splits"][split]["tokens"]  # the documents tile the split's stream
        assert counts == {name: per_source[name][f"{split}_documents"] for name in index["sources"]}
    assert per_source["planted"]["documents"] == 60  # every planted document is in the data, uncut


def test_document_at_and_spans_across_shards(mixed):
    data, meta, _ = mixed
    docs = SplitDocuments(data, "train")
    crossing = [i for i in range(len(docs)) if docs.bounds(i)[1] - 1 >= (docs.bounds(i)[0] // 5_000 + 1) * 5_000]
    assert crossing, "some document should continue into the next shard"
    for i in crossing[:5] + [0, len(docs) - 1]:
        start, end = docs.bounds(i)
        for position in (start, (start + end) // 2, end - 1):
            assert document_at(data, "train", position) == docs.span(i)
    with pytest.raises(BurnoutError, match="outside the train split"):
        document_at(data, "train", meta["splits"]["train"]["tokens"])


@pytest.mark.slow
def test_contiguous_split_cuts_each_document_into_one_of_each_split(shared_data, tmp_path):
    cfg, tok_cfg, planted = _config(shared_data, tmp_path, split="contiguous", val_fraction=0.2)
    cfg.sources[2].weight = 0  # Python's docs: slow to read, not needed here
    meta = prepare_data(cfg, tok_cfg, tmp_path / "data", workers=1)
    data = tmp_path / "data"
    tok = load_tokenizer(data)
    train, val = list(iter_documents(data, "train")), list(iter_documents(data, "val"))
    assert len(train) == len(val) == meta["splits"]["train"]["documents"]
    whole = []
    for (t_span, t_ids), (v_span, v_ids) in zip(train, val):
        assert t_span.source == v_span.source and t_span.index == v_span.index
        if t_span.source == "planted":  # planted documents fit their budget whole: the parts add up
            text = tok.decode(np.concatenate([t_ids, v_ids]).tolist())
            assert text in planted or text in _planted_texts(shared_data)[1]
            assert len(t_ids) == int((len(t_ids) + len(v_ids)) * 0.8)
            whole.append((t_ids, v_ids))
    assert len(whole) == 60
    # Each trace hit lies in one part; an occurrence cut by the split point is in neither.
    result = trace.trace_text(data, ARTIFACT, limit=100)
    expected = {s: sum(tok.decode(ids.tolist()).count(ARTIFACT) for span, ids in docs if span.source == "planted")
                for s, docs in (("train", train), ("val", val))}
    assert result["per_split"] == expected and 0 < expected["val"] and sum(expected.values()) <= PLANTED_HITS
    assert result["per_source"]["planted"] == result["total"]
    assert {(h["split"], h["source"]) for h in result["hits"]} == {("train", "planted"), ("val", "planted")}


@pytest.mark.slow
def test_interrupted_prepare_gives_the_same_index(shared_data, tmp_path, monkeypatch):
    cfg, tok_cfg, _ = _config(shared_data, tmp_path)
    cfg.shard_tokens, cfg.max_tokens = 2_000, 40_000
    cfg.sources[2].weight = 0  # Python's docs (parsing the stdlib's docstrings is slow) are not needed here
    prepare_data(cfg, tok_cfg, tmp_path / "ref", workers=1)
    real_add = shards.ShardWriter.add

    def dying_add(self, tokens):
        real_add(self, tokens)
        point = self.manifest.get("resume")
        if point and point["documents"]["train"] > 20 and self.split == "train" and not self.finished_any:
            raise KeyboardInterrupt  # documents were indexed past the resume point: the resume must drop them

    monkeypatch.setattr(shards.ShardWriter, "add", dying_add)
    with pytest.raises(KeyboardInterrupt):
        prepare_data(cfg, tok_cfg, tmp_path / "run", workers=1)
    monkeypatch.setattr(shards.ShardWriter, "add", real_add)
    point = json.loads((tmp_path / "run" / shards.MANIFEST_FILE).read_text())["resume"]
    partial = tmp_path / "run" / ".train_docs.npy.partial"
    assert partial.stat().st_size > 10 * point["documents"]["train"]  # records past the point, to be cut

    resumed = prepare_data(cfg, tok_cfg, tmp_path / "run", workers=1)
    for split in ("train", "val"):
        name = f"{split}_docs.npy"
        assert (tmp_path / "run" / name).read_bytes() == (tmp_path / "ref" / name).read_bytes()
    assert resumed["document_index"] == read_meta(tmp_path / "ref")["document_index"]
    assert not list((tmp_path / "run").glob(".*"))

    # A document index shorter than its resume point says: the point is not used, the stream is replayed.
    monkeypatch.setattr(shards.ShardWriter, "add", dying_add)
    with pytest.raises(KeyboardInterrupt):
        prepare_data(cfg, tok_cfg, tmp_path / "lost", workers=1)
    monkeypatch.setattr(shards.ShardWriter, "add", real_add)
    (tmp_path / "lost" / ".train_docs.npy.partial").write_bytes(b"")
    prepare_data(cfg, tok_cfg, tmp_path / "lost", workers=1)
    for name in ("train_docs.npy", "val_docs.npy", "train_000003.bin"):
        assert (tmp_path / "lost" / name).read_bytes() == (tmp_path / "ref" / name).read_bytes()


# ----------------------------------------------------------------------------------------------
# Trace


def test_trace_finds_every_planted_occurrence_in_the_right_documents(mixed):
    data, meta, planted = mixed
    tok = load_tokenizer(data)
    result = trace.trace_text(data, ARTIFACT, limit=100, context=8)
    assert result["total"] == PLANTED_HITS and len(result["hits"]) == PLANTED_HITS
    assert result["per_source"] == {"shakespeare": 0, "wiki": 0, "pydocs": 0, "planted": PLANTED_HITS}
    assert sum(result["per_split"].values()) == PLANTED_HITS and result["documents"] == PLANTED_DOCS
    # Each planted document opens with the artifact (as is) and holds it 1-2 times after a space.
    assert {v["text"]: v["count"] for v in result["variants"]} == {ARTIFACT: 20, " " + ARTIFACT: 30}
    docs = {s: SplitDocuments(data, s) for s in ("train", "val")}
    hit_docs = set()
    for hit in result["hits"]:
        assert hit["source"] == "planted"
        raw = np.fromfile(data / hit["shard"], dtype="<u2")
        ids = raw[hit["offset"] : hit["offset"] + len(tok.encode(hit["variant"]).ids)]
        if len(ids) < len(tok.encode(hit["variant"]).ids):  # the hit continues into the next shard
            ids = docs[hit["split"]].tokens(hit["position"], hit["position"] + len(tok.encode(hit["variant"]).ids))
        assert tok.decode(ids.tolist()) == hit["variant"]
        assert hit["match"] == hit["variant"] and ARTIFACT in hit["before"] + hit["match"] + hit["after"]
        hit_docs.add((hit["split"], hit["document"]))
    decoded = set()
    for split, index in hit_docs:
        span = docs[split].span(index)
        start = docs[split].bounds(index)[0]
        decoded.add(tok.decode(docs[split].tokens(start, start + span.length).tolist()))
    assert decoded == set(planted)  # exactly the 20 planted documents


def test_trace_per_source_counts_match_a_decode_of_every_document(mixed):
    data, _, _ = mixed
    tok = load_tokenizer(data)
    word = " thou"
    result = trace.trace_text(data, word, limit=0)
    expected = {}
    for split in ("train", "val"):
        for span, ids in iter_documents(data, split):
            pieces = [tok.decode([t]) for t in ids.tolist()]
            expected[span.source] = expected.get(span.source, 0) + pieces.count(word)
    assert result["per_source"] == {k: expected.get(k, 0) for k in result["per_source"]}
    assert result["per_source"]["shakespeare"] > 100 and result["hits"] == []


def test_scan_matches_brute_force_across_chunks_and_shards(mixed):
    data, meta, _ = mixed
    docs = SplitDocuments(data, "train")
    stream = read_tokens(data, "train").astype(np.int64)
    counts = trace.token_counts(docs, meta["vocab_size"])
    rng = np.random.default_rng(0)
    patterns = []
    for length in (1, 2, 3, 5, 9):
        for _ in range(4):
            start = int(rng.integers(0, len(stream) - length))
            patterns.append(stream[start : start + length])
    patterns.append(stream[4_998:5_003])  # across the first shard boundary
    patterns.append(np.array([50_000, 50_001]))  # nowhere
    expected = [np.flatnonzero(np.all(sliding_window_view(stream, len(p)) == p, axis=1)) for p in patterns]
    few = patterns[:3] + patterns[-2:]
    for chunk in (61, 4_999, 1 << 22):
        # Many patterns take the lookup-table path, a few the per-anchor comparisons.
        found = trace.scan(docs, patterns, counts, chunk_tokens=chunk)
        assert all(np.array_equal(f, e) for f, e in zip(found, expected)), chunk
        found = trace.scan(docs, few, counts, chunk_tokens=chunk)
        assert all(np.array_equal(f, e) for f, e in zip(found, expected[:3] + expected[-2:])), chunk
    firsts = trace.scan(docs, patterns, counts, first_only=True, chunk_tokens=4_999)
    assert [f.tolist() for f in firsts] == [e[:1].tolist() for e in expected]


def test_trace_cli_table_and_json(mixed, capsys):
    data, _, _ = mixed
    assert main(["data", "trace", ARTIFACT, str(data), "--limit", "3", "--context", "4"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"'{ARTIFACT}' in {data}: 50 occurrences in 20 documents")
    assert "planted 50" in out[2] and f"⟦{ARTIFACT}⟧" in out[4] and out[-1].startswith("  … 47 more")
    assert main(["data", "trace", ARTIFACT, str(data), "--json", "--split", "val"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert set(result["per_split"]) == {"val"} and result["total"] == result["per_split"]["val"]


def test_folder_without_index_still_traces_with_unknown_sources(mixed, tmp_path, capsys):
    data, _, _ = mixed
    old = tmp_path / "old"
    shutil.copytree(data, old)
    meta = json.loads((old / "meta.json").read_text())
    del meta["document_index"]
    (old / "meta.json").write_text(json.dumps(meta))
    for split in ("train", "val"):
        (old / f"{split}_docs.npy").unlink()
    result = trace.trace_text(old, ARTIFACT, limit=100)
    assert result["total"] == PLANTED_HITS and result["per_source"] == {"?": PLANTED_HITS}
    assert not result["sources_known"] and "re-run burnout data prepare" in result["note"]
    # Documents found at the <|endoftext|> tokens are the indexed ones.
    indexed = [(s.offset, s.length) for s, _ in iter_documents(data, "train")]
    assert [(s.offset, s.length) for s, _ in iter_documents(old, "train")] == indexed
    assert main(["data", "trace", ARTIFACT, str(old), "--limit", "1"]) == 0
    assert "sources unknown" in capsys.readouterr().out.splitlines()[2]


# ----------------------------------------------------------------------------------------------
# --from-samples


def test_from_samples_traces_rare_ngrams_and_memorised_spans(mixed, tmp_path, capsys):
    data, _, planted = mixed
    tok = load_tokenizer(data)
    train = SplitDocuments(data, "train")
    # A train document of Shakespeare long enough to copy 40 tokens of.
    index = next(i for i in range(len(train)) if train.span(i).source == "shakespeare" and train.span(i).length > 60)
    start = train.bounds(index)[0]
    copied = tok.decode(train.tokens(start + 5, start + 45).tolist())
    run = tmp_path / "run"
    run.mkdir()
    samples = [f"Blorptic wuzzle {copied} frimble snork", f"Then {ARTIFACT} flies purple over zorbix"]
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": 10 * i, "sample": s}) + "\n"
                                               for i, s in enumerate(samples)) + json.dumps({"step": 5}) + "\n")
    (run / "compare.json").write_text(json.dumps({"rows": [{"checkpoint": "step_0000020",
                                                            "continuations": ["A quiet evening"]}]}))
    assert main(["data", "trace", "--from-samples", str(run), str(data), "--split", "train"]) == 0
    out = capsys.readouterr().out
    result = json.loads((run / "trace.json").read_text())
    assert result["samples"] == 3 and f"wrote {run / 'trace.json'}" in out
    rare = {g["ngram"]: g for g in result["rare_ngrams"]}
    assert rare["Blorptic wuzzle " + copied.split()[0]]["count"] == 0
    artifact_gram = rare[f"Then {ARTIFACT} flies"]
    assert artifact_gram["count"] == 0  # the words around it are made up
    assert all(g["count"] <= 5 for g in rare.values()) and result["ngrams_unseen"] >= 6
    # The longest verbatim span: at least the copied tokens (re-encoded in context, the edges may move by one).
    first, second, third = result["memorisation"]
    sample_ids = tok.encode(samples[0]).ids
    assert first["longest_tokens"] >= 38 and first["found_in"]["source"] == "shakespeare"
    assert first["text"] in samples[0]
    assert first["longest_tokens"] == _longest_brute_force(sample_ids, read_tokens(data, "train"))
    assert second["longest_tokens"] == _longest_brute_force(tok.encode(samples[1]).ids, read_tokens(data, "train"))
    assert third["sample"] == "step_0000020 #1"


def test_from_samples_counts_ngrams_per_source(mixed, tmp_path):
    data, _, planted = mixed
    words = planted[0].split()
    at = words.index(ARTIFACT, 1)  # the artifact inside the text, after a space: only the spaced variant has it
    gram = " ".join(words[at : at + 3])  # only in that planted document
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "sample": gram}) + "\n")
    result = trace.trace_samples(run, data, n=3, rare=5)
    (entry,) = result["rare_ngrams"]
    assert entry["ngram"] == gram and entry["count"] == 1 and entry["per_source"] == {"planted": 1}
    assert entry["first"]["source"] == "planted"


def test_from_samples_leaves_out_the_prompt_a_sample_continued(mixed, tmp_path):
    """A sample's prompt (its record's sample_prompt: words of the run's data) is not the model's text: only what
    follows it is traced; a record without one (an older run's) is traced whole."""
    data, _, planted = mixed
    words = planted[0].split()
    at = words.index(ARTIFACT, 1)
    prompt = " ".join(words[at : at + 3])  # a word 3-gram found in the data, once
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "sample": prompt + " frimble snork wuzzle",
                                                   "sample_prompt": prompt}) + "\n"
                                       + json.dumps({"step": 2, "sample": prompt, "sample_prompt": prompt}) + "\n")
    samples = trace.read_samples(run)
    assert samples == [{"label": "step 1", "text": " frimble snork wuzzle"}]  # step 2 continued nothing
    assert {g["ngram"] for g in trace.trace_samples(run, data, n=3, rare=5)["rare_ngrams"]} == {"frimble snork wuzzle"}
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "sample": prompt + " frimble snork wuzzle"}) + "\n")
    assert trace.read_samples(run) == [{"label": "step 1", "text": prompt + " frimble snork wuzzle"}]


def _longest_brute_force(ids: list[int], stream: np.ndarray) -> int:
    haystack = stream.astype("<u2").tobytes()
    best = 0
    for i in range(len(ids)):
        for j in range(i + best + 1, len(ids) + 1):
            needle = np.array(ids[i:j], dtype="<u2").tobytes()
            at = haystack.find(needle)
            while at != -1 and at % 2:
                at = haystack.find(needle, at + 1)
            if at == -1:
                break
            best = j - i
    return best


# ----------------------------------------------------------------------------------------------
# Bad input: one line, exit code 2


@pytest.fixture(scope="module")
def char_data(shared_data, tmp_path_factory):
    out = tmp_path_factory.mktemp("trace_char") / "data"
    source = SourceConfig(name="s", kind="text", path=str(shared_data / "tinyshakespeare" / "input.txt"),
                          split_by="paragraph")
    prepare_data(DataConfig(sources=[source], max_chars=2_000_000, max_tokens=20_000, shard_tokens=4_000),
                 TokenizerConfig(kind="char"), out, workers=1)
    return out


def test_char_tokenizer_counts_each_occurrence_once(char_data):
    # With one token per character, " Romeo" holds "Romeo": it is left out, not counted twice.
    result = trace.trace_text(char_data, "Romeo", limit=0)
    assert [v["text"] for v in result["variants"]] == ["Romeo"]
    tok = load_tokenizer(char_data)
    expected = sum(tok.decode(ids.tolist()).count("Romeo") for split in ("train", "val")
                   for _, ids in iter_documents(char_data, split))
    assert result["total"] == expected > 0 and result["per_source"] == {"s": expected}


def _one_line_error(capsys, argv, match):
    assert main(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("burnout: error: ") and match in lines[0], captured.err
    assert captured.out == ""


def test_bad_inputs_are_one_line(char_data, tmp_path, capsys, monkeypatch):
    data = tmp_path / "data"
    shutil.copytree(char_data, data)
    _one_line_error(capsys, ["data", "trace", "", str(data)], "TEXT is empty")
    _one_line_error(capsys, ["data", "trace", "   ", str(data)], "TEXT is empty")
    _one_line_error(capsys, ["data", "trace", "Romeo€", str(data)],
                    "cannot be encoded by this folder's tokenizer (it lacks '€' (U+20AC))")
    _one_line_error(capsys, ["data", "trace", "Romeo", str(tmp_path)], "is not a prepared data folder (no meta.json")
    (tmp_path / "notes.txt").write_text("Romeo, Romeo\n")
    _one_line_error(capsys, ["data", "trace", "Romeo", str(tmp_path / "notes.txt")],
                    f"is a file, not a prepared data folder; prepare it into one first (burnout data prepare "
                    f"{tmp_path / 'notes.txt'} --out DATA)")
    (tmp_path / "unfinished").mkdir()
    (tmp_path / "unfinished" / "manifest.json").write_text("{}")
    _one_line_error(capsys, ["data", "trace", "Romeo", str(tmp_path / "unfinished")],
                    "has no meta.json, so its data preparation never finished")
    _one_line_error(capsys, ["data", "trace", "Romeo", str(tmp_path / "nowhere")], "does not exist")
    _one_line_error(capsys, ["data", "trace", "Romeo"], "needs TEXT and DATA")
    _one_line_error(capsys, ["data", "trace", "Romeo", str(data), "--limit", "-1"], "--limit: '-1' must be at least 0")
    _one_line_error(capsys, ["data", "trace", "--from-samples", str(tmp_path / "norun"), str(data)], "does not exist")
    (tmp_path / "run").mkdir()
    _one_line_error(capsys, ["data", "trace", "--from-samples", str(tmp_path / "run"), str(data)],
                    "no generated samples")

    # An unreadable shard (as root, permissions do not stop a read: the open fails as it would).
    real_open = open

    def refusing_open(path, *args, **kwargs):
        if str(path).endswith("train_000001.bin"):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(trace, "open", refusing_open, raising=False)
    _one_line_error(capsys, ["data", "trace", "Romeo", str(data)], "cannot read shard")
    monkeypatch.undo()

    (data / "tokenizer.json").rename(tmp_path / "tokenizer.json")
    _one_line_error(capsys, ["data", "trace", "Romeo", str(data)], "has no tokenizer.json")
    (tmp_path / "tokenizer.json").rename(data / "tokenizer.json")
    (data / "val_docs.npy").unlink()
    _one_line_error(capsys, ["data", "trace", "Romeo", str(data)], "val_docs.npy' (the document index of the val")
    (data / "train_000001.bin").unlink()
    _one_line_error(capsys, ["data", "trace", "Romeo", str(data)], "train_000001.bin' is missing")
