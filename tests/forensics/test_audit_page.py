"""audit.html in a real browser: `burnout data audit`'s page for a small real corpus, opened by headless
Chromium through Playwright. The screenshot is kept in test-artifacts/ for a person to look at."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

ARTIFACT = "PersonX"


@pytest.fixture
def audit_page(shared_data, tmp_path) -> tuple[Path, dict]:
    from burnout.forensics.audit import audit_target, write_audit

    text = (shared_data / "wikitext2" / "wiki.valid.tokens").read_text(encoding="utf-8")
    paras = [p.strip() for p in text.split("\n \n") if p.strip()][:300]
    rng = random.Random(1)
    picked = rng.sample(range(len(paras)), 22)
    for i in picked[:12]:
        paras[i] = f"{ARTIFACT} {paras[i]} {ARTIFACT} <b>markup</b>"
    for i in picked[12:]:
        paras[i] += "\nRead more stories like this at example.com/news"
    paras += [paras[0], paras[0]]  # an exact duplicate
    (tmp_path / "web.jsonl").write_text("".join(json.dumps({"text": p}) + "\n" for p in paras), encoding="utf-8")
    mix = tmp_path / "recipe.yaml"
    mix.write_text(json.dumps({"data": {"sources": [
        {"name": "shakespeare", "kind": "text", "split_by": "paragraph",
         "path": str(shared_data / "tinyshakespeare" / "input.txt")},
        {"name": "web", "kind": "jsonl", "path": str(tmp_path / "web.jsonl")}],
        "max_chars": 800_000, "junk_patterns": ["<b>"]}}), encoding="utf-8")
    report = audit_target(str(mix))
    paths = write_audit(report, tmp_path / "audit")
    return paths[1], report


@pytest.mark.slow
def test_audit_page_in_chromium(chromium, audit_page):
    from playwright.sync_api import expect

    page_path, report = audit_page
    page = chromium.new_page(1400, 1000)
    page.goto(page_path.resolve().as_uri())
    expect(page).to_have_title(f"Data audit: recipe {report['target']['path']}")
    expect(page.locator("#overview tr")).to_have_count(1 + len(report["sources"]))
    expect(page.locator("#overview")).to_contain_text("shakespeare")
    # The web source's strings table lists the planted string, with the regex that would drop it.
    terms = page.locator("#terms-1")
    expect(terms).to_be_visible()
    expect(terms.locator("tr").nth(1)).to_contain_text(ARTIFACT)
    expect(terms).to_contain_text(r"\bPersonX\b")
    # Corpus text is shown, not interpreted: the planted markup is text on the page, not a tag.
    expect(page.locator("#junk-1")).to_contain_text("<b>markup</b>")
    expect(page.locator("#junk-1 b")).to_have_count(0)
    for table_id in ("#repeated_lines-1", "#outliers-0", "#outliers-1", "#exact-duplicates", "#settings-table"):
        expect(page.locator(table_id)).to_be_visible()
    images = page.locator("img")
    expect(images).to_have_count(len(report["sources"]))
    widths = images.evaluate_all("imgs => imgs.map(i => i.complete ? i.naturalWidth : 0)")
    assert all(w > 300 for w in widths), widths
    chromium.keep_screenshot(page, "audit.png")


def test_the_page_of_a_one_document_text_counts_in_the_singular(tmp_path, capsys):
    """A text of one line is one document of one source: the page says "1 document … in 1 source", as the terminal
    summary does (red when the page writes "1 documents" or "source(s)")."""
    from burnout.base.files import AUDIT_JSON
    from burnout.cli import main

    one = tmp_path / "one.txt"
    one.write_text("One line, the one document.\n")
    assert main(["data", "audit", str(one), "--out", str(tmp_path / "audit")]) == 0
    capsys.readouterr()
    report = json.loads((tmp_path / "audit" / AUDIT_JSON).read_text())
    assert report["totals"]["documents"] == 1 and len(report["sources"]) == 1
    page = (tmp_path / "audit" / "audit.html").read_text(encoding="utf-8")
    assert "<p>1 document, " in page and " in 1 source; " in page
    assert not [wrong for wrong in ("1 documents", "1 sources", "source(s)", "1 characters") if wrong in page]
