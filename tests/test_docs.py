"""Tables in the README that say they match the code, checked against it, so the docs cannot drift."""

from __future__ import annotations

import re
from pathlib import Path

from burnout.config import MODEL_PRESET_DIR, load_model_preset
from burnout.models.info import model_info

README = Path(__file__).resolve().parent.parent / "README.md"


def _preset_rows() -> dict[str, list[str]]:
    section = README.read_text().split("## Model presets", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 6 and cells[0].startswith("`"):
            rows[cells[0].strip("`")] = cells[1:]
    return rows


def test_the_readme_preset_table_equals_the_presets():
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
