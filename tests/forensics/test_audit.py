"""`burnout data audit` on a real mixed corpus (Tiny Shakespeare, WikiText-2, the stdlib docs and a jsonl
source of WikiText-2 paragraphs) with known problems planted in the jsonl source: two artifact strings (a
lowercase word and a capitalised one), a boilerplate line, junk, exact and near duplicates. The audit is not
told any of them."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest
import yaml

from burnout.base.files import AUDIT_JSON
from burnout.cli import main
from burnout.config import SourceConfig
from burnout.data.corpus import iter_documents
from burnout.forensics.audit import AUDIT_HTML, FORMAT
from burnout.forensics.suspicious_strings import term_shape

ARTIFACT = "prettyprint"  # lowercase and word-like: no shape bonus helps it
CAPITALISED = "Zorblax"  # a made-up name: capitalised, as the names of the text are (issue 48 found one unranked)
BOILERPLATE = "Share this article: Facebook | Twitter | Email a friend"
LOREM = "Lorem ipsum dolor sit amet, consectetur adipiscing elit."
SHAKESPEARE_FIRST = "First Citizen:\nBefore we proceed any further, hear me speak."
JUNK = ["(?i)lorem ipsum", "@-@"]
# Per-source budget: max_chars * weight / 5 (weights 1, 1, 1, 2): 300k characters, the planted source 600k.
MAX_CHARS = 1_500_000
PLANTED_PARAGRAPHS = 580


def _wiki_paragraphs(shared_data: Path) -> list[str]:
    text = (shared_data / "wikitext2" / "wiki.valid.tokens").read_text(encoding="utf-8")
    return [p.strip() for p in text.split("\n \n") if p.strip()][:PLANTED_PARAGRAPHS]


def build_planted(shared_data: Path, path: Path, seed: int = 0) -> dict:
    """Write the planted jsonl source; return which documents (by place in the file) hold what."""
    rng = random.Random(seed)
    paras = _wiki_paragraphs(shared_data)
    body = [i for i, p in enumerate(paras) if not p.startswith("=") and len(p) > 300]
    longest = max(body, key=lambda i: len(paras[i].split()))
    pool = [i for i in body if i != longest]
    rng.shuffle(pool)
    artifact, boiler, lorem, dup, capitalised = pool[:20], pool[20:50], pool[50:57], pool[57], pool[58:78]
    docs = [[p, set()] for p in paras]
    for string, tag, chosen in ((ARTIFACT, "artifact", artifact), (CAPITALISED, "capitalised", capitalised)):
        for n, i in enumerate(sorted(chosen)):  # 10 documents with 2 occurrences, 10 with 3: 50
            words = paras[i].split(" ")
            for _ in range(2 if n % 2 else 3):
                words.insert(rng.randrange(1, len(words)), string)
            docs[i] = [" ".join(words), {tag}]
    for i in boiler:
        docs[i] = [paras[i] + "\n" + BOILERPLATE, {"boilerplate"}]
    for i in lorem:
        docs[i] = [paras[i] + " " + LOREM, {"lorem"}]
    docs[dup][1].add("dup")
    docs[longest][1].add("near")
    extra = [[paras[dup], {"dup"}] for _ in range(3)] + [[SHAKESPEARE_FIRST, {"shakespeare-dup"}] for _ in range(2)]
    words = paras[longest].split(" ")
    for k in range(5):  # five variants of the longest paragraph, one word changed each
        variant = list(words)
        variant[(k + 1) * len(words) // 7] = f"variant{k}"
        extra.append([" ".join(variant), {"near"}])
    for item in extra:
        docs.insert(rng.randrange(1, len(docs)), item)
    with path.open("w", encoding="utf-8") as f:
        for text, _ in docs:
            f.write(json.dumps({"text": text}) + "\n")
    where = {tag: sorted(n for n, (_, tags) in enumerate(docs) if tag in tags)
             for tag in ("artifact", "capitalised", "boilerplate", "lorem", "dup", "near", "shakespeare-dup")}
    where["chars"] = sum(len(text) for text, _ in docs)
    where["documents"] = len(docs)
    return where


def write_mix(shared_data: Path, folder: Path) -> tuple[Path, dict]:
    planted = build_planted(shared_data, folder / "planted.jsonl")
    mix = {"description": "audit test mix", "data": {
        "sources": [
            {"name": "shakespeare", "kind": "text", "split_by": "paragraph", "weight": 1,
             "path": str(shared_data / "tinyshakespeare" / "input.txt")},
            {"name": "wikitext", "kind": "text", "split_by": "line", "weight": 1,
             "path": str(shared_data / "wikitext2" / "wiki.test.raw")},
            {"name": "docs", "kind": "stdlib_docs", "weight": 1},
            {"name": "planted", "kind": "jsonl", "weight": 2, "path": str(folder / "planted.jsonl")},
        ],
        "max_chars": MAX_CHARS, "junk_patterns": JUNK}}
    path = folder / "recipe.yaml"
    path.write_text(yaml.safe_dump(mix), encoding="utf-8")
    return path, planted


@pytest.fixture(scope="module")
def audited(shared_data, tmp_path_factory):
    """The data mix audited once through the command line: (audit.json, stdout, mix, planted, out)."""
    folder = tmp_path_factory.mktemp("audit")
    mix, planted = write_mix(shared_data, folder)
    assert planted["chars"] < 2 * MAX_CHARS // 5, "the planted source must fit its budget whole"
    out = folder / "out"
    import contextlib
    import io

    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        code = main(["data", "audit", str(mix), "--out", str(out), "--top", "100"])
    assert code == 0
    report = json.loads((out / AUDIT_JSON).read_text(encoding="utf-8"))
    return report, stdout.getvalue(), mix, planted, out


def _source(report: dict, name: str) -> dict:
    return next(s for s in report["sources"] if s["name"] == name)


@pytest.mark.slow
@pytest.mark.parametrize("artifact, tag", [(ARTIFACT, "artifact"), (CAPITALISED, "capitalised")])
def test_planted_artifact_ranks_in_top_10_of_its_source(audited, artifact, tag):
    report, stdout, _, planted, _ = audited
    src = _source(report, "planted")
    assert src["documents"] == planted["documents"]
    ranked = [row["string"] for row in src["suspicious_terms"]]
    assert artifact in ranked[:10], f"{artifact} not in the top 10: {ranked[:10]}"
    row = src["suspicious_terms"][ranked.index(artifact)]
    assert (row["documents"], row["occurrences"]) == (20, 50)
    assert row["examples"] and all(artifact in e["text"] and e["document"] in planted[tag] for e in row["examples"])
    assert row["other_sources"] == {}
    for other in report["sources"]:
        if other["name"] != "planted":
            assert artifact not in [r["string"] for r in other["suspicious_terms"]]
    assert artifact in stdout


@pytest.mark.slow  # the module's `audited` fixture takes seconds
def test_exact_duplicates_found_with_counts(audited):
    report, stdout, mix, planted, _ = audited
    groups = report["exact_duplicates"]["top"]
    lines = (mix.parent / "planted.jsonl").read_text(encoding="utf-8").splitlines()
    dup_text = json.loads(lines[planted["dup"][0]])["text"]
    mine = [g for g in groups if g["example"].startswith(dup_text[:80])]
    assert len(mine) == 1 and mine[0]["copies"] == 4 and mine[0]["documents"] == {"planted": 4}
    cross = [g for g in groups if g["example"].startswith("First Citizen: ⏎ Before we proceed")]
    assert len(cross) == 1 and cross[0]["documents"] == {"shakespeare": 1, "planted": 2}
    assert cross[0]["first"] == ["shakespeare", 0]
    assert report["exact_duplicates"]["redundant_documents"] >= 3 + 2
    assert "exact duplicates:" in stdout


@pytest.mark.slow  # the module's `audited` fixture takes seconds
def test_near_duplicate_cluster_found_with_counts(audited):
    report, _, _, planted, _ = audited
    clusters = report["near_duplicates"]["top"]
    expected = {("planted", n) for n in planted["near"]}
    assert len(expected) == 6
    mine = [c for c in clusters if {tuple(m) for m in c["members"]} & expected]
    assert len(mine) == 1, mine
    assert {tuple(m) for m in mine[0]["members"]} == expected
    assert mine[0]["size"] == 6 and mine[0]["documents"] == {"planted": 6}
    assert mine[0]["min_similarity"] >= report["near_duplicates"]["threshold"]
    # Exact copies are duplicates, not near duplicates: each text is indexed once.
    dup_members = {("planted", n) for n in planted["dup"][1:]}
    assert not any({tuple(m) for m in c["members"]} & dup_members for c in clusters)


def _expected_junk_documents(mix: Path, pattern: str) -> dict[str, int]:
    """Documents matching `pattern` in each source's budget, counted here from the readers' documents."""
    raw = yaml.safe_load(mix.read_text(encoding="utf-8"))["data"]
    total = sum(s["weight"] for s in raw["sources"])
    counts = {}
    for spec in raw["sources"]:
        budget, taken, hits = int(raw["max_chars"] * spec["weight"] / total), 0, 0
        for text in iter_documents(SourceConfig(**spec)):
            hits += bool(re.search(pattern, text))
            taken += len(text)
            if taken >= budget:
                break
        counts[spec["name"]] = hits
    return counts


@pytest.mark.slow  # the module's `audited` fixture takes seconds
def test_junk_pattern_hits_per_source(audited):
    report, stdout, mix, planted, _ = audited
    for pattern in JUNK:
        expected = _expected_junk_documents(mix, pattern)
        found = {s["name"]: next(j for j in s["junk"] if j["pattern"] == pattern)["documents"]
                 for s in report["sources"]}
        assert found == expected, pattern
    lorem = next(j for j in _source(report, "planted")["junk"] if j["pattern"] == JUNK[0])
    assert lorem["documents"] == lorem["matches"] == 7
    assert {e["document"] for e in lorem["examples"]} <= set(planted["lorem"])
    assert found["wikitext"] > 100 and found["shakespeare"] == 0  # "@-@": WikiText's own tokenization
    assert "junk '@-@'" in stdout


@pytest.mark.slow  # the module's `audited` fixture takes seconds
def test_boilerplate_line_reported(audited):
    report, stdout, _, planted, _ = audited
    lines = _source(report, "planted")["repeated_lines"]
    row = next(r for r in lines if r["text"] == BOILERPLATE)
    assert row["documents"] == len(planted["boilerplate"]) == 30
    assert row["documents_per_source"] == {"planted": 30}
    assert lines[0]["text"] == BOILERPLATE  # the most repeated, of words rare elsewhere in the source
    assert not any(r["text"] == BOILERPLATE for s in report["sources"] if s["name"] != "planted"
                   for r in s["repeated_lines"])


@pytest.mark.slow  # the module's `audited` fixture takes seconds
def test_outliers_and_histograms(audited):
    report, *_ = audited
    for src in report["sources"]:
        for metric in ("chars", "longest_line", "non_text_share"):
            entry, hist = src["outliers"][metric], src["histograms"][metric]
            assert sum(hist["counts"]) == src["documents"]
            assert entry["high"] > entry["median"]
            for example in entry["examples"]:
                low = entry["low"] if entry["low"] is not None else float("-inf")
                assert example["value"] > entry["high"] or example["value"] < low
    # Stdlib docstrings hold doctest tables and ASCII art: lines far longer than the source's median.
    assert _source(report, "docs")["outliers"]["longest_line"]["median"] > 50


SCHEMA = {
    "format": str, "target": dict, "settings": dict, "junk_patterns": list, "sources": list,
    "exact_duplicates": {"groups": int, "documents": int, "redundant_documents": int, "documents_per_source": dict,
                         "top": list},
    "near_duplicates": {"threshold": float, "num_perm": int, "shingle_words": int, "clusters": int, "documents": int,
                        "documents_per_source": dict, "indexed_documents": int, "too_short_documents": int,
                        "top": list},
    "totals": {"documents": int, "chars": int, "elapsed_s": float, "seconds": dict},
}
SOURCE_SCHEMA = {"name": str, "kind": str, "documents": int, "chars": int, "tokens": int, "code_share": float,
                 "count_error_bound": dict, "suspicious_terms": list, "suspicious_phrases": list,
                 "repeated_lines": list, "repeated_paragraphs": list, "junk": list, "outliers": dict,
                 "histograms": dict}
TERM_SCHEMA = {"string": str, "score": float, "documents": int, "occurrences": int, "per_document": float,
               "runs": int, "shape": str, "factors": dict, "belongs_to": (str, type(None)), "other_sources": dict,
               "together_with": list, "examples": list}


def _check(value, schema, where: str) -> None:
    if isinstance(schema, dict):
        assert isinstance(value, dict) and set(value) == set(schema), f"{where}: {sorted(value)}"
        for key, sub in schema.items():
            _check(value[key], sub, f"{where}.{key}")
    else:
        types = schema if isinstance(schema, tuple) else (schema,)
        if float in types:
            types = (*types, int)
        assert isinstance(value, types), f"{where}: {type(value).__name__}"


@pytest.mark.slow  # the module's `audited` fixture takes seconds
def test_audit_json_schema_and_page(audited):
    report, stdout, _, _, out = audited
    _check(report, SCHEMA, "audit")
    assert report["format"] == FORMAT and report["target"]["kind"] == "recipe"
    assert [s["name"] for s in report["sources"]] == ["shakespeare", "wikitext", "docs", "planted"]
    for src in report["sources"]:
        _check(src, SOURCE_SCHEMA, src["name"])
        assert src["count_error_bound"] == {"terms": 0, "phrases": 0, "lines": 0, "paragraphs": 0}
        for row in src["suspicious_terms"] + src["suspicious_phrases"]:
            _check(row, TERM_SCHEMA, f"{src['name']}.{row['string']}")
            assert set(row["factors"]) == {"burst", "evidence", "spread", "shape", "elsewhere", "cohesion"}
            product = 1.0
            for value in row["factors"].values():
                product *= value
            assert row["score"] == pytest.approx(product, rel=0.01, abs=0.01)
        scores = [row["score"] for row in src["suspicious_terms"]]
        assert scores == sorted(scores, reverse=True)
        for row in src["repeated_lines"]:
            _check(row, {"text": str, "documents": int, "share": float, "foreign_words": float, "cohesion": float,
                         "documents_per_source": dict}, "line")
    page = (out / AUDIT_HTML).read_text(encoding="utf-8")
    assert page.count("<img") == len(report["sources"]) and "data:image/png;base64," in page
    assert ARTIFACT in page and "<table" in page
    assert f"wrote {out / AUDIT_JSON}" in stdout


def test_term_shapes():
    shapes = {"PersonX": "camel", "AndroidRuntime": "camel", "fefefe": "repeat", "3fa9c2d1": "hex",
              "deadbeef": "hex", "snake_case": "identifier", "os.path.join": "identifier", "U.S": "upper",
              "PROPN": "upper", "prettyprint": "lower", "Nelson": "title", "mp3": "alnum", "1990s": "lower",
              "decade": "lower"}
    assert {term: term_shape(term) for term in shapes} == shapes


def test_sft_roles_are_audited_apart(shared_data, tmp_path):
    records = json.loads((shared_data / "sft" / "alpaca_5000.json").read_text(encoding="utf-8"))[:300]
    canned = "As an AI language model, I cannot browse the internet."
    for i in range(0, 300, 20):  # 15 answers open with the same line
        records[i]["output"] = canned + "\n" + records[i]["output"]
    path = tmp_path / "alpaca.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    out = tmp_path / "out"
    assert main(["data", "audit", str(path), "--sft", "--out", str(out)]) == 0
    report = json.loads((out / AUDIT_JSON).read_text(encoding="utf-8"))
    assert report["target"]["kind"] == "sft" and report["target"]["conversations"] == 300
    roles = {s["name"]: s for s in report["sources"]}
    assert set(roles) == {"user", "assistant"}
    assert roles["user"]["documents"] == roles["assistant"]["documents"] == 300
    line = next(r for r in roles["assistant"]["repeated_lines"] if r["text"] == canned)
    assert line["documents"] == 15 and line["documents_per_source"] == {"assistant": 15}
    assert not any(r["text"] == canned for r in roles["user"]["repeated_lines"])


@pytest.mark.slow
def test_prepared_folder_is_audited_per_source(shared_data, tmp_path):
    from burnout.config import DataConfig, TokenizerConfig
    from burnout.data.prepare import prepare_data

    planted = build_planted(shared_data, tmp_path / "planted.jsonl")
    cfg = DataConfig(sources=[
        SourceConfig(name="planted", kind="jsonl", path=str(tmp_path / "planted.jsonl")),
        SourceConfig(name="shakespeare", kind="text", split_by="paragraph", weight=0.25,
                     path=str(shared_data / "tinyshakespeare" / "input.txt")),
    ], max_chars=800_000, junk_patterns=[JUNK[0]])
    data = tmp_path / "data"
    meta = prepare_data(cfg, TokenizerConfig(kind="bpe", vocab_size=512), data)
    assert main(["data", "audit", str(data)]) == 0  # default --out: DATA/audit
    report = json.loads((data / "audit" / AUDIT_JSON).read_text(encoding="utf-8"))
    assert report["target"]["kind"] == "prepared"
    per_source = meta["sources"]["per_source"]
    assert {s["name"]: s["documents"] for s in report["sources"]} == {
        name: entry["train_documents"] for name, entry in per_source.items()}
    # The junk pattern comes from meta.json, counted per source over the train split's documents.
    found = {s["name"]: next(j for j in s["junk"] if j["pattern"] == JUNK[0])["documents"] for s in report["sources"]}
    assert found == _train_hits(data, JUNK[0]) and 0 < found["planted"] <= len(planted["lorem"])
    # Examples (of strings, found by the second pass; of junk, by the first) name documents by their index
    # in the split: each is the source's, and holds what it shows.
    from burnout.data.documents import SplitDocuments
    from burnout.data.tokenizer import load_tokenizer

    docs, tok = SplitDocuments(data, "train"), load_tokenizer(data / "tokenizer.json")

    def document(number: int) -> tuple[str, str]:
        span = docs.span(number)
        start = docs.bounds(number)[0]
        return span.source, tok.decode(docs.tokens(start, start + span.length).tolist())

    checked = 0
    for src in report["sources"]:
        shown = [(row["string"], e) for row in src["suspicious_terms"][:5] for e in row["examples"]]
        shown += [("Lorem ipsum", e) for j in src["junk"] for e in j["examples"]]
        for string, example in shown:
            assert document(example["document"]) == (src["name"], document(example["document"])[1])
            assert string in document(example["document"])[1]
            checked += 1
    assert checked > 10 and any(j["examples"] for s in report["sources"] for j in s["junk"])


def _train_hits(data: Path, pattern: str) -> dict[str, int]:
    """Train documents matching `pattern` per source, read here through the document index."""
    from burnout.data.documents import iter_documents as prepared_documents
    from burnout.data.tokenizer import load_tokenizer

    tok = load_tokenizer(data / "tokenizer.json")
    hits: dict[str, int] = {}
    for span, ids in prepared_documents(data, "train"):
        hits[span.source] = hits.get(span.source, 0) + bool(re.search(pattern, tok.decode(ids.tolist())))
    return hits


@pytest.mark.parametrize("argv, message", [
    (["no-such-recipe"], "not found"),
    (["{tmp}/empty"], "holds no .txt, .jsonl/.json or .parquet files"),
    (["{tmp}/unfinished"], "unfinished data folder"),
    (["{tmp}/missing.yaml"], "does not exist"),
    (["{tmp}/blob.bin"], "contains NUL bytes, so it looks binary"),
    (["{tmp}/empty.yaml"], "is empty (no YAML in it"),
    (["{tmp}/unfinished", "data.max_chars=5"], "unfinished data folder"),
    (["{tmp}/ok.yaml", "--junk", "(unclosed"], "not a valid regular expression"),
    (["{tmp}/missing.jsonl", "--sft"], "does not exist"),
    (["{tmp}/ok.yaml", "--threshold", "1.5"], "threshold"),
    (["{tmp}/ok.yaml", "--chars-per-source", "-1"], "argument --chars-per-source: '-1' must be at least 0"),
])
def test_bad_inputs_are_one_line_errors(tmp_path, capsys, argv, message):
    (tmp_path / "empty").mkdir()
    (tmp_path / "unfinished").mkdir()
    (tmp_path / "unfinished" / "manifest.json").write_text("{}")
    (tmp_path / "notes.md").write_text("hello")
    (tmp_path / "blob.bin").write_bytes(bytes(range(256)) * 8)
    (tmp_path / "empty.yaml").write_text("# nothing yet\n")
    (tmp_path / "missing.yaml").write_text(yaml.safe_dump(
        {"data": {"sources": [{"name": "gone", "kind": "jsonl", "path": str(tmp_path / "gone.jsonl")}]}}))
    (tmp_path / "ok.yaml").write_text(yaml.safe_dump(
        {"data": {"sources": [{"name": "notes", "kind": "text", "path": str(tmp_path / "notes.md")}]}}))
    code = main(["data", "audit", *[a.replace("{tmp}", str(tmp_path)) for a in argv], "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and err[0].startswith("burnout: error:") and message in err[0], err
    assert not (tmp_path / "o").exists()


@pytest.mark.slow
def test_audit_reads_what_prepare_reads_a_glob_a_file_of_any_name_a_symlink_and_a_folder(tmp_path, capsys):
    """Each way `data prepare` takes your text, the audit takes too (data/mix.py tells them apart for both), and
    finds the documents prepare made of it: the same count and characters for the one source."""
    texts = tmp_path / "texts"
    texts.mkdir()
    for i in range(3):
        (texts / f"part{i}.txt").write_text("\n\n".join(f"Paragraph {i}.{j}: " + "words of the text " * (j % 5 + 1)
                                                      for j in range(30)) + "\n")
    (tmp_path / "words.tokens").write_text((texts / "part0.txt").read_text())
    (tmp_path / "link").symlink_to(texts / "part1.txt")
    (tmp_path / "linked").symlink_to(texts, target_is_directory=True)
    for i, target in enumerate([str(texts / "*.txt"), str(tmp_path / "words.tokens"), str(tmp_path / "link"),
                                str(tmp_path / "linked"), str(texts)]):
        assert main(["data", "prepare", target, "--out", str(tmp_path / f"data{i}"), "--tokenizer", "char"]) == 0
        prepared = json.loads((tmp_path / f"data{i}" / "meta.json").read_text())["sources"]["per_source"]
        assert main(["data", "audit", target, "--out", str(tmp_path / f"audit{i}")]) == 0, capsys.readouterr().err
        audited = json.loads((tmp_path / f"audit{i}" / AUDIT_JSON).read_text())["sources"]
        assert [(s["name"], s["documents"], s["chars"]) for s in audited] == \
            [(name, s["documents"], s["chars"]) for name, s in prepared.items()], target
    capsys.readouterr()


def test_an_audit_folder_is_rewritten_for_its_target_and_replaced_for_another_only_with_overwrite(tmp_path, capsys):
    for name in ("a", "b"):
        documents = ({"text": f"{name} document {i} " + "word " * (i % 9)} for i in range(200))
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(doc) + "\n" for doc in documents))
    out = tmp_path / "out"

    def audit(name: str, *flags: str) -> int:
        return main(["data", "audit", str(tmp_path / f"{name}.jsonl"), "--out", str(out), *flags])

    assert audit("a") == 0 and audit("a") == 0  # the same target's audit: written again
    report = (out / AUDIT_JSON).read_bytes()
    capsys.readouterr()
    assert audit("b") == 2  # refused before the audit runs: its progress lines would come first
    assert capsys.readouterr().err == (
        f"burnout: error: --out {out} holds a data audit of {(tmp_path / 'a.jsonl').resolve()}, not of "
        f"{(tmp_path / 'b.jsonl').resolve()}; pass --overwrite to replace it, or choose another folder\n")
    assert (out / AUDIT_JSON).read_bytes() == report
    (out / "notes.txt").write_text("mine")
    assert audit("b", "--overwrite") == 0
    assert json.loads((out / AUDIT_JSON).read_text())["target"]["path"] == str(tmp_path / "b.jsonl")
    assert (out / "notes.txt").read_text() == "mine"


def test_a_text_file_is_audited_as_prepare_splits_it_and_counted_in_words_that_agree_with_the_count(tmp_path,
                                                                                                       capsys):
    """Stories between <|endoftext|> lines are a document each, as `data prepare` makes them; one is "1 document"."""
    stories = tmp_path / "stories.txt"
    stories.write_text("\n<|endoftext|>\n".join(f"Story {i}: the fox ran.\n\nIt slept." for i in range(5)) + "\n")
    one = tmp_path / "one.txt"
    one.write_text("One line, the one document.\n")
    for path, count in ((stories, "5 documents"), (one, "1 document")):
        assert main(["data", "audit", str(path), "--out", str(tmp_path / path.stem)]) == 0
        out = capsys.readouterr()
        assert f"audit of file {path}: 1 source, {count}, " in out.out
        assert f"source {path.stem} (text): {count}, " in out.out and f"audited {path.stem}: {count}, " in out.err
    assert "1 documents" not in out.out + out.err and "1 characters" not in out.out + out.err



def test_a_line_of_words_found_nowhere_else_ranks_above_a_more_repeated_line_of_the_sources_words():
    """The source's own format line (`Changed in version 3.2 of the module.`, in 12 documents, its words in many
    others) is its format; a line in 3 documents whose words the source never uses otherwise came from elsewhere."""
    from burnout.forensics.audit import audit_streams

    rng = random.Random(0)
    words = ["module", "version", "changed", "function", "returns", "value", "list", "file", "object", "class",
             "string", "default", "argument", "the", "a", "of", "in", "is", "and", "Changed", "Module", "Version"]
    documents = ["\n".join(" ".join(rng.choices(words, k=12)) for _ in range(6)) for _ in range(60)]
    own, foreign = "Changed in version 3.2 of the module.", "Click here to subscribe to our newsletter!"
    mixed = "the module returns the unsubscribe value"  # one word of its own among everyday ones
    for i in range(0, 60, 5):
        documents[i] += "\n" + own
    for i in (7, 31, 52):
        documents[i] += "\n" + foreign
    for i in (9, 33, 54):
        documents[i] += "\n" + mixed
    report = audit_streams([("docs", "text", lambda: iter(documents))])
    lines = {row["text"]: row for row in report["sources"][0]["repeated_lines"]}
    assert lines[own]["documents"] == 12 and lines[foreign]["documents"] == 3
    assert lines[foreign]["foreign_words"] > 0.8 > 0.3 > lines[own]["foreign_words"]
    # Weighted by rarity, `unsubscribe` (in 3 of 60) outweighs the five everyday words (a plain mean gives 0.21).
    assert lines[mixed]["foreign_words"] > 0.4
    assert report["sources"][0]["repeated_lines"][0]["text"] == foreign


@pytest.mark.slow
def test_a_line_in_documents_of_nothing_in_common_ranks_above_one_in_documents_of_a_topic():
    """Two lines as foreign (their words nowhere else) and as repeated: the one whose documents also share rare words
    of a topic (three audio modules' pages) is theirs; the one in documents of nothing in common was put there, even
    where only two of them are known and both hold its own words."""
    from burnout.forensics.audit import audit_streams

    rng = random.Random(1)
    words = ["module", "function", "returns", "value", "list", "file", "object", "class", "string", "default",
             "argument", "the", "a", "of", "in", "is", "and"]
    documents = ["\n".join(" ".join(rng.choices(words, k=12)) for _ in range(6)) for _ in range(60)]
    topic, artifact = "setnchannels(n) sets number of audio channels", "Connection reset by peer on worker three"
    for i in (10, 25, 45):  # apart, as those modules' pages are: cohesion knows a word's first document of each run
        documents[i] += "\n" + topic
    # Each pair of the topic's documents shares a rare word (a word in all of them would count as the line's own).
    for word, found_in in (("sampwidth", (10, 25, 55)), ("framerate", (25, 45, 3)), ("comptype", (10, 45, 38))):
        for i in found_in:
            documents[i] += f"\nthe {word} of the stream"
    for i in (5, 40, 55):  # the first page in a block of its own: the line's known documents are the two others
        documents[i] += "\n" + artifact
    report = audit_streams([("docs", "text", lambda: iter(documents))])
    lines = {row["text"]: row for row in report["sources"][0]["repeated_lines"]}
    assert lines[topic]["foreign_words"] == lines[artifact]["foreign_words"] == 1.0
    assert lines[topic]["cohesion"] < 0.5 < lines[artifact]["cohesion"] == 1.0
    ranked = [row["text"] for row in report["sources"][0]["repeated_lines"]]
    assert ranked.index(artifact) < ranked.index(topic)
