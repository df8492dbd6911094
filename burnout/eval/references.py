"""Published scores of public models near our sizes (references.yaml, each with its source), as a table beside
a run's own: what a score of 0.29 on HellaSwag means depends on what a 160M or 1B model gets."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import yaml

REFERENCES_FILE = Path(__file__).with_name("references.yaml")
METRICS = ("acc", "acc_norm", "perplexity", "reported")


def load_references() -> list[dict]:
    return yaml.safe_load(REFERENCES_FILE.read_text(encoding="utf-8"))["models"]


def reference_table(tasks: Iterable[str]) -> str | None:
    """A Markdown table of the published scores on `tasks` (a column per task and metric some model reports,
    a row per model reporting any), or None when none of them is reported."""
    models = load_references()
    columns = [(task, metric) for task in dict.fromkeys(tasks) for metric in METRICS
               if any(metric in model["scores"].get(task, {}) for model in models)]
    if not columns:
        return None
    lines = ["| model | parameters | tokens | " + " | ".join(f"{t} {m}" for t, m in columns) + " | settings | source |",
             "|---|---:|---:|" + "---:|" * len(columns) + "---|---|"]
    for model in models:
        cells = [model["scores"].get(task, {}).get(metric) for task, metric in columns]
        if any(cell is not None for cell in cells):
            lines.append(f"| {model['name']} | {model['parameters']} | {model['tokens']} | "
                         + " | ".join("" if c is None else f"{c:.4f}" for c in cells)
                         + f" | {model['settings']} | {model['source']} |")
    return "\n".join(lines) + "\n"
