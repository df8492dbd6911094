"""The blog's lesson as one run through the commands a person would type: an artifact planted 50 times in 20
WikiText-2 documents of a real mixed corpus (Tiny Shakespeare, WikiText-2, the stdlib docs) is ranked by
`burnout data audit` among its source's top 10 without being named, `burnout data trace` finds exactly its 50
occurrences in those documents, `burnout data prepare --drop` leaves zero of them (audit and trace agree),
and the audit page shows it in Chromium."""

from __future__ import annotations

import json
import re

import pytest

from burnout.cli import main
from burnout.data.documents import SplitDocuments
from burnout.data.shards import read_meta
from burnout.data.tokenizer import load_tokenizer

pytestmark = pytest.mark.slow  # every test here trains, installs or drives a browser: not in `make test-fast`

ARTIFACT = "PersonXq"
DOCUMENTS, OCCURRENCES = 20, 50


def _plant(text: str) -> tuple[str, list[str]]:
    """WikiText-2's validation text with ARTIFACT put into 20 long paragraphs spread over it as a word of its own,
    3 times in 10 of them and 2 in the other 10 (rare across documents, dense where it occurs); returns the
    text and the planted paragraphs."""
    paragraphs = text.split("\n \n")
    long = [i for i, p in enumerate(paragraphs) if len(p) > 400 and not p.strip().startswith("=")]
    long = long[:: len(long) // DOCUMENTS]
    planted = []
    for n, i in enumerate(long[:DOCUMENTS]):
        words = paragraphs[i].split(" ")
        for at in (len(words) * 3 // 4, len(words) // 2, len(words) // 4)[: 3 if n < 10 else 2]:
            words.insert(at, ARTIFACT)
        paragraphs[i] = " ".join(words)
        planted.append(paragraphs[i])
    assert sum(p.count(ARTIFACT) for p in planted) == OCCURRENCES
    return "\n \n".join(paragraphs), planted


def _run(capsys, *argv) -> str:
    capsys.readouterr()
    assert main([str(a) for a in argv]) == 0
    return capsys.readouterr().out


def _audit(data, capsys) -> dict[str, list[dict]]:
    """Each source's suspicious terms, best first."""
    _run(capsys, "data", "audit", data, "--chars-per-source", 0)
    report = json.loads((data / "audit" / "audit.json").read_text(encoding="utf-8"))
    return {s["name"]: s["suspicious_terms"] for s in report["sources"]}


def _trace(data, capsys) -> dict:
    return json.loads(_run(capsys, "data", "trace", ARTIFACT, data, "--limit", 100, "--json"))


def test_plant_audit_trace_drop_and_see_it_in_the_browser(chromium, shared_data, tmp_path, capsys):
    wiki, planted = _plant((shared_data / "wikitext2" / "wiki.valid.tokens").read_text(encoding="utf-8"))
    (tmp_path / "wiki.txt").write_text(wiki, encoding="utf-8")
    gpt2 = shared_data / "gpt2_tokenizer"
    mix = tmp_path / "mix.yaml"
    mix.write_text(json.dumps({
        "data": {"sources": [
            {"name": "shakespeare", "kind": "text", "split_by": "paragraph",
             "path": str(shared_data / "tinyshakespeare" / "input.txt")},
            {"name": "wiki", "kind": "text", "split_by": "paragraph", "path": str(tmp_path / "wiki.txt")},
            {"name": "pydocs", "kind": "stdlib_docs"}],
            # A source's documents are sampled up to its share: wiki's (~250k tokens) fits whole. A fifth to val, so
            # that some of the 20 planted documents are in val (each goes with that chance, data/split.py).
            "max_tokens": 900_000, "shard_tokens": 200_000, "val_fraction": 0.2},
        "tokenizer": {"kind": "gpt2", "vocab_path": str(gpt2 / "vocab.json"),
                      "merges_path": str(gpt2 / "merges.txt")}}), encoding="utf-8")
    data, clean = tmp_path / "data", tmp_path / "clean"
    _run(capsys, "data", "prepare", mix, "--out", data, "--workers", 1)

    # The audit was not told the string: it ranks it among the wiki source's top 10, and in no other source.
    terms = _audit(data, capsys)
    ranked = [row["string"] for row in terms["wiki"]]
    assert ARTIFACT in ranked[:10], ranked[:10]
    assert not any(row["string"] == ARTIFACT for name in ("shakespeare", "pydocs") for row in terms[name])
    audited = terms["wiki"][ranked.index(ARTIFACT)]

    # Trace: exactly the 50 occurrences, all in wiki, in the 20 planted documents and nowhere else.
    result = _trace(data, capsys)
    assert result["total"] == OCCURRENCES and len(result["hits"]) == OCCURRENCES
    assert result["per_source"] == {"shakespeare": 0, "wiki": OCCURRENCES, "pydocs": 0}
    assert result["documents"] == DOCUMENTS
    tok = load_tokenizer(data)
    docs = {split: SplitDocuments(data, split) for split in ("train", "val")}
    found = set()
    for hit in result["hits"]:
        split, index = hit["split"], hit["document"]
        start = docs[split].bounds(index)[0]
        found.add(tok.decode(docs[split].tokens(start, start + docs[split].span(index).length).tolist()))
    squash = re.compile(r"\s+")
    assert {squash.sub(" ", d).strip() for d in found} == {squash.sub(" ", p).strip() for p in planted}
    # The audit read the train split: its counts are trace's there.
    in_train = {hit["document"] for hit in result["hits"] if hit["split"] == "train"}
    assert (audited["documents"], audited["occurrences"]) == (len(in_train), result["per_split"]["train"])
    assert result["per_split"]["train"] < OCCURRENCES

    # Dropped at prepare time, counted in meta.json; the new data's audit and trace find none.
    _run(capsys, "data", "prepare", mix, "--out", clean, "--workers", 1, "--drop", re.escape(ARTIFACT))
    junk = read_meta(clean)["cleaning"]["junk"]
    assert junk["dropped_documents"] == DOCUMENTS
    assert junk["by_source"]["wiki"]["dropped_documents"] == DOCUMENTS
    assert not any(row["string"] == ARTIFACT for rows in _audit(clean, capsys).values() for row in rows)
    assert _trace(clean, capsys)["total"] == 0

    # The first audit's page, in the browser: the wiki source's strings table lists the artifact.
    from playwright.sync_api import expect

    page = chromium.new_page(1280, 720)
    page.goto((data / "audit" / "audit.html").resolve().as_uri())
    expect(page.locator("#overview tr")).to_have_count(4)
    for index, name in enumerate(terms):  # the page's tables go in the report's order of sources
        table = expect(page.locator(f"#terms-{index}"))
        if name == "wiki":
            table.to_contain_text(ARTIFACT)
        else:
            table.not_to_contain_text(ARTIFACT)

