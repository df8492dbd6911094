"""The docs checked against the code, so they cannot drift: the preset table, the README's length and tree, and
every link."""

from __future__ import annotations

import re
from pathlib import Path

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
# The README: a newcomer's first hour, and a tree that lists every file

README_MAX_LINES = 200
PACKAGE = README.parent / "burnout"


def test_the_readme_fits_a_first_sitting():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; move details to docs/"


def _tree_files() -> set[str]:
    """The files the README's tree lists under burnout/ (`train/loop.py`, `cli.py`): one line a file, a
    package's files indented under it."""
    block = README.read_text(encoding="utf-8").split("## The tree", 1)[1].split("```", 2)[1]
    files, folder = set(), ""
    for line in block.splitlines():
        indent, name = len(line) - len(line.lstrip()), (line.split() or [""])[0]
        if indent == 2 and name.endswith("/"):
            folder = name
        elif indent == 2:
            files.add(name)
        elif indent == 4:
            files.add(folder + name)
    return files


def test_the_readme_tree_lists_every_module_once():
    modules = {p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py")
               if p.name not in ("__init__.py", "__main__.py")}
    listed = {f for f in _tree_files() if f.endswith(".py")}
    assert listed == modules, (f"not in README.md's tree: {sorted(modules - listed)}; "
                               f"listed but gone: {sorted(listed - modules)}")


def test_every_relative_link_in_the_docs_points_to_a_file_that_exists():
    root = README.parent
    broken = []
    for page in [README, *sorted((root / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text(encoding="utf-8")):
            if "://" not in target and not (page.parent / target).exists():
                broken.append(f"{page.relative_to(root)}: {target}")
    assert not broken, "links to files that do not exist:\n" + "\n".join(broken)
