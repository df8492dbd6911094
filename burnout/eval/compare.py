"""`burnout compare`: the same prompts, with the same sampling settings and seed, at several checkpoints of a
run: how the model's answers change as it trains. Saved as RUN/compare.md (for the report) and
RUN/compare.json.

Each checkpoint's answers get a degeneration summary (eval/degeneration.py): how many are loops or carry
a suspicious string (from `--suspicious`, e.g. what `burnout data audit` found), and their distinct-n.

A fine-tune's table starts with the model it started from (sft.base or dpo.base), so the report shows what
the fine-tuning changed. A chat model answers each prompt as one user message in its chat template, up to
<|im_end|>; a base model continues the prompt as text. An empty answer is said as such in compare.md (compare.json
keeps it as generated).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

from tqdm import tqdm

from burnout.base.files import COMPARE_JSON, COMPARE_MD, RUN_CONFIG_FILE, TOKENIZER_FILE, write_atomic
from burnout.config import load_run_config
from burnout.core.chat_template import is_chat_model
from burnout.core.checkpoint import list_checkpoints
from burnout.core.device import resolve_device
from burnout.core.model_files import load_model
from burnout.data.tokenizer import load_tokenizer
from burnout.errors import BurnoutError
from burnout.eval.degeneration import summarize
from burnout.generate.chat import chat_replies
from burnout.generate.prompts import COMPARE_PROMPTS, builtin_prompts_for, sample_prompts
from burnout.generate.sampling import generate_texts, shown


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
    prompts: Sequence[str] | None = None,
    max_new_tokens: int = 60,
    device: str = "auto",
    say: Callable[[str], None] = print,
    suspicious: Sequence[str] = (),
    **sampling,
) -> str:
    """Generate every prompt at each chosen checkpoint; returns (and writes) the Markdown comparison. `prompts`: the
    user's, each of which must encode; None: a base model's run its own sample prompts (generate/prompts.py's
    sample_prompts), a chat model's or a run without any the built-in COMPARE_PROMPTS its tokenizer can encode."""
    run_dir = Path(run_dir)
    paths = select_checkpoints(run_dir, checkpoints)
    if prompts is None and not is_chat_model(load_run_config(paths[-1] / RUN_CONFIG_FILE)):
        prompts = sample_prompts(run_dir) or None
    if prompts is None:  # the newest checkpoint's tokenizer: a fine-tune's base has the same characters
        prompts = builtin_prompts_for(load_tokenizer(paths[-1] / TOKENIZER_FILE), COMPARE_PROMPTS, say)
    dev = resolve_device(device, "--device")
    rows = []
    models = [*_starting_model(paths[-1], say), *((p.name, p) for p in paths)]
    # A checkpoint's prompts decode in batches together, so the bar moves a checkpoint at a time.
    with tqdm(total=len(models) * len(prompts), desc="compare", unit="answer", disable=None, leave=False) as bar:
        for label, path in models:
            model, tokenizer, ckpt = load_model(path, dev)
            texts = answers(model, tokenizer, ckpt.config, list(prompts), max_new_tokens, **sampling)
            rows.append({"checkpoint": label, "step": ckpt.info.get("step"), "tokens": ckpt.info.get("tokens"),
                         "chat": is_chat_model(ckpt.config), "continuations": texts,
                         "degeneration": summarize(texts, suspicious)})
            bar.update(len(prompts))
            say(f"generated with {label} (step {ckpt.info.get('step')})")
    settings = {"max_new_tokens": max_new_tokens, **sampling}
    lines = ["# Checkpoint comparison", "",
             "Settings: " + ", ".join(f"{k}={v}" for k, v in settings.items()), ""]
    if any(r["chat"] for r in rows):
        lines += ["Chat models (marked 💬) answer each prompt as a user message; the others continue it.", ""]
    lines += ["| checkpoint | step | degenerate answers | mean distinct-3 | suspicious strings |",
              "|---|---:|---:|---:|---|"]
    lines += [f"| {r['checkpoint']} | {r['step']} | {r['degeneration']['degenerate']} of {len(prompts)} | "
              f"{r['degeneration']['mean_distinct_3']:.2f} | {_cell(', '.join(r['degeneration']['suspicious']))} |"
              for r in rows]
    given = f"{len(suspicious)} given" if suspicious else "none given: --suspicious FILE"
    lines += ["", f"Degenerate: half or more of an answer's word 3-grams repeat, or it holds a suspicious string "
                  f"({given}).", ""]
    for i, prompt in enumerate(prompts):
        lines += [f"## {_cell(prompt)}", "", "| checkpoint | step | tokens | answer |", "|---|---:|---:|---|"]
        lines += [f"| {r['checkpoint']}{' 💬' if r['chat'] else ''} | {r['step']} | {r['tokens'] or ''} | "
                  f"{_cell(shown(r['continuations'][i]))} |" for r in rows]
        lines.append("")
    table = "\n".join(lines)
    write_atomic(run_dir / COMPARE_MD, table)
    write_atomic(run_dir / COMPARE_JSON, json.dumps({"settings": settings, "prompts": list(prompts), "rows": rows},
                                                indent=2) + "\n")
    return table


def answers(model, tokenizer, cfg, prompts: list[str], max_new_tokens: int, **sampling) -> list[str]:
    """A chat model's answer to each prompt as a user message, or a base model's continuation of it."""
    if is_chat_model(cfg):
        return chat_replies(model, tokenizer, prompts, max_new_tokens, **sampling)
    texts = generate_texts(model, tokenizer, prompts, max_new_tokens, **sampling)
    return [text[len(prompt):] for prompt, text in zip(prompts, texts)]


def _starting_model(checkpoint: Path, say: Callable[[str], None]) -> list[tuple[str, Path]]:
    """("base", the checkpoint a fine-tune started from) when the run is a fine-tune and that is still there."""
    cfg = load_run_config(checkpoint / RUN_CONFIG_FILE)
    section = cfg.fine_tune
    if section is None:
        return []
    base = Path(section.base)
    if not (base / "config.yaml").is_file() and not list_checkpoints(base):
        say(f"the base model {base} is gone; the table shows this run's checkpoints alone")
        return []
    return [("base", base)]


def _cell(text: str) -> str:
    """Text on one Markdown table line: newlines shown as ⏎, pipes escaped."""
    return text.replace("|", "\\|").replace("\r", "").replace("\n", "⏎")
