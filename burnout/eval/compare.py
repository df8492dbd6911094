"""`burnout compare`: the same prompts, with the same sampling settings and seed, at several checkpoints of a
run: how the model's answers change as it trains. Saved as RUN/compare.md (for the report) and
RUN/compare.json.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

from burnout.common import write_atomic
from burnout.core.checkpoint import list_checkpoints
from burnout.core.device import resolve_device
from burnout.core.model_files import load_model
from burnout.errors import BurnoutError
from burnout.generate.prompts import COMPARE_PROMPTS
from burnout.generate.sampling import generate_texts


def select_checkpoints(run_dir: Path, steps: Sequence[int | str] | None) -> list[Path]:
    """Every checkpoint of the run, or those whose step (or folder name) is in `steps`."""
    found = list_checkpoints(run_dir)
    if not found:
        raise BurnoutError(f"'{run_dir}' holds no checkpoints/step_* folders; give a run folder with checkpoints")
    if not steps:
        return found
    by_key = {p.name: p for p in found} | {str(int(p.name.removeprefix("step_"))): p for p in found}
    chosen = []
    for step in steps:
        if str(step) not in by_key:
            raise BurnoutError(
                f"checkpoint '{step}' is not in {run_dir}; it has steps "
                + ", ".join(str(int(p.name.removeprefix("step_"))) for p in found)
            )
        chosen.append(by_key[str(step)])
    return chosen


def compare_checkpoints(
    run_dir: str | Path,
    checkpoints: Sequence[int | str] | None = None,
    prompts: Sequence[str] = COMPARE_PROMPTS,
    max_new_tokens: int = 60,
    device: str = "auto",
    say: Callable[[str], None] = print,
    **sampling,
) -> str:
    """Generate every prompt at each chosen checkpoint; returns (and writes) the Markdown comparison."""
    run_dir = Path(run_dir)
    paths = select_checkpoints(run_dir, checkpoints)
    dev = resolve_device(device)
    rows = []
    for path in paths:
        model, tokenizer, ckpt = load_model(path, dev)
        texts = generate_texts(model, tokenizer, list(prompts), max_new_tokens, **sampling)
        rows.append({"checkpoint": path.name, "step": ckpt.info.get("step"), "tokens": ckpt.info.get("tokens"),
                     "continuations": [t[len(p):] for p, t in zip(prompts, texts)]})
        say(f"generated at step {ckpt.info.get('step')}")
    settings = {"max_new_tokens": max_new_tokens, **sampling}
    lines = ["# Checkpoint comparison", "",
             "Settings: " + ", ".join(f"{k}={v}" for k, v in settings.items()), ""]
    for i, prompt in enumerate(prompts):
        lines += [f"## {_cell(prompt)}", "", "| step | tokens | continuation |", "|---:|---:|---|"]
        lines += [f"| {r['step']} | {r['tokens'] or ''} | {_cell(r['continuations'][i])} |" for r in rows]
        lines.append("")
    table = "\n".join(lines)
    write_atomic(run_dir / "compare.md", table)
    write_atomic(run_dir / "compare.json", json.dumps({"settings": settings, "prompts": list(prompts), "rows": rows},
                                                indent=2) + "\n")
    return table


def _cell(text: str) -> str:
    """Text on one Markdown table line: newlines shown as ⏎, pipes escaped."""
    return text.replace("|", "\\|").replace("\r", "").replace("\n", "⏎")
