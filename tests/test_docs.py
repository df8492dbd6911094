"""The docs checked against the code, so they cannot drift: the preset table, the README's length and its tree
(every package; every module is in docs/ARCHITECTURE.md's map, which tests/test_architecture.py checks), every
link and anchor, and the figures: the README's headline table and docs/RESULTS.md against the records."""

from __future__ import annotations

import re
from pathlib import Path

from burnout.base.files import read_jsonl
from burnout.config import MODEL_PRESET_DIR, load_model_preset
from burnout.models.info import model_info

README = Path(__file__).resolve().parent.parent / "README.md"
USAGE = README.parent / "docs" / "USAGE.md"


def _preset_rows() -> dict[str, list[str]]:
    section = USAGE.read_text(encoding="utf-8").split("## Model presets", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 6 and cells[0].startswith("`"):
            rows[cells[0].strip("`")] = cells[1:]
    return rows


def test_the_preset_table_equals_the_presets():
    rows = _preset_rows()
    assert set(rows) == {p.stem for p in MODEL_PRESET_DIR.glob("*.yaml")}
    for name, (family, shape, vocab, context, params) in rows.items():
        cfg = load_model_preset(name).resolved()
        numbers = [int(n) for n in re.findall(r"\d+", shape.split(",")[0])]
        expected = [cfg.n_layer, cfg.d_model, cfg.n_head] + ([cfg.n_kv_head] if len(numbers) == 4 else [])
        assert (family, numbers) == (cfg.family, expected), name
        if cfg.n_kv_head != cfg.n_head:
            assert len(numbers) == 4, f"{name}: the table leaves out its {cfg.n_kv_head} key/value heads"
        assert int(vocab.split()[0].replace(",", "")) == cfg.vocab_size, name
        assert int(context) == cfg.context_length, name
        assert int(params.replace(",", "")) == model_info(cfg)["params_total"], name


# ----------------------------------------------------------------------------------------------
# The README: a newcomer's first hour, and a short tree that points to the map

README_MAX_LINES = 200
PACKAGE = README.parent / "burnout"


def test_the_readme_fits_a_first_sitting():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; move details to docs/"


README_TREE_MAX_LINES = 20


def _tree() -> list[str]:
    """The lines of the README's tree (the code block under "## The tree")."""
    return README.read_text(encoding="utf-8").split("## The tree", 1)[1].split("```", 2)[1].strip("\n").splitlines()


def test_the_readme_tree_is_short_names_every_unit_once_and_points_to_the_map():
    """The README's tree lists each of burnout/'s packages and top-level modules once (the map of every module is
    docs/ARCHITECTURE.md, which tests/test_architecture.py keeps true)."""
    tree = _tree()
    assert len(tree) <= README_TREE_MAX_LINES, f"README.md's tree has {len(tree)} lines; the map is ARCHITECTURE.md"
    section = README.read_text(encoding="utf-8").split("## The tree", 1)[1].split("\n## ", 1)[0]
    assert "(docs/ARCHITECTURE.md)" in section, "README.md's tree does not point to docs/ARCHITECTURE.md"
    listed = [name for line in tree if line.startswith("  ") for name in line.split("  ")[1].split()]
    units = sorted([p.name for p in PACKAGE.glob("*.py") if p.name != "__init__.py"]
                   + [p.parent.name + "/" for p in PACKAGE.glob("*/__init__.py")])
    assert sorted(listed) == units, (f"not in README.md's tree: {sorted(set(units) - set(listed))}; listed but gone: "
                                     f"{sorted(set(listed) - set(units))}; listed twice: "
                                     f"{sorted({n for n in listed if listed.count(n) > 1})}")


def _anchors(page: Path) -> set[str]:
    """The anchors GitHub makes of a page's headings (fenced code left out): lowercased, punctuation dropped,
    spaces as hyphens, a repeated one numbered."""
    anchors, fenced = set(), False
    for line in page.read_text(encoding="utf-8").splitlines():
        fenced ^= line.startswith("```")
        if not fenced and re.match(r"#{1,6} ", line):
            anchor = re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
            anchors.add(next(f"{anchor}-{n}" if n else anchor for n in range(100)
                             if (f"{anchor}-{n}" if n else anchor) not in anchors))
    return anchors


def test_every_relative_link_and_anchor_in_the_docs_resolves():
    root = README.parent
    broken = []
    for page in [README, *sorted((root / "docs").glob("*.md"))]:
        for target, anchor in re.findall(r"\]\(([^)#\s]*)(?:#([^)\s]*))?\)", page.read_text(encoding="utf-8")):
            if "://" in target:
                continue
            path = (page.parent / target) if target else page
            if not path.exists():
                broken.append(f"{page.relative_to(root)}: {target} does not exist")
            elif anchor and path.suffix == ".md" and anchor not in _anchors(path):
                broken.append(f"{page.relative_to(root)}: {target or page.name} has no heading #{anchor}")
    assert not broken, "links that do not resolve:\n" + "\n".join(broken)


# ----------------------------------------------------------------------------------------------
# The figures: docs/RESULTS.md and the README's headline table are made from benchmarks/results.jsonl

RESULTS_MAX_LINES, PERFORMANCE_MAX_LINES = 200, 400


def test_the_results_page_and_the_readme_table_are_what_the_records_give():
    from benchmarks import results

    records = read_jsonl(results.RESULTS_FILE)
    assert results.RESULTS_PAGE.read_text(encoding="utf-8") == results.render_results(records), (
        "docs/RESULTS.md differs from benchmarks/results.jsonl: run python -m benchmarks.results")
    readme = README.read_text(encoding="utf-8")
    assert readme == results.with_readme_table(readme, results.render_readme_table(records)), (
        "README.md's headline table differs from benchmarks/results.jsonl: run python -m benchmarks.results")


def test_every_record_is_of_a_claim_with_its_unit_and_says_where_it_came_from():
    from benchmarks.claims import CLAIMS
    from benchmarks.results import COMPARE, RESULTS_FILE

    keys = {"id", "claim", "claim_text", "value", "unit", "target", "met", "command", "commit", "dirty", "date",
            "machine", "torch", "load_before", "load_after", "load_during", "transcribed", "source", "note"}
    seen: dict[str, int] = {}
    for rec in read_jsonl(RESULTS_FILE):
        where = rec.get("id")
        assert set(rec) == keys, f"{where}: fields {sorted(set(rec) ^ keys)}"
        assert rec["claim"] in CLAIMS and rec["unit"] == CLAIMS[rec["claim"]].unit, where
        seen[rec["claim"]] = seen.get(rec["claim"], 0) + 1
        assert rec["id"] == f"{rec['claim']}/{seen[rec['claim']]}", where
        target = rec["target"]
        assert rec["met"] == (COMPARE[target["op"]](rec["value"], target["value"]) if target else None), where
        assert set(rec["machine"]) == {"cpu", "cores", "gpu", "gpu_driver"}, where
        if rec["transcribed"]:
            assert rec["source"], f"{where}: a transcribed figure names the text it came from"
        else:
            assert rec["date"] and rec["command"] and rec["source"] is None, where


def test_the_results_page_and_performance_md_stay_readable():
    for name, most in (("RESULTS.md", RESULTS_MAX_LINES), ("PERFORMANCE.md", PERFORMANCE_MAX_LINES)):
        lines = (README.parent / "docs" / name).read_text(encoding="utf-8").splitlines()
        assert len(lines) <= most, f"docs/{name} has {len(lines)} lines, more than {most}"
