"""A newcomer's first hour, scripted: raw text to a model that chats and loads in transformers, on this machine.

    python -m benchmarks.bench_first_hour [--root runs/first-hour] [--text FILE] [--train-minutes 6]
                                          [--sft-minutes 5] [--model llama-tiny]

The commands the README's "Your own text, end to end" walks through, each timed as a whole command:
1. `burnout data prepare TEXT` (no YAML; default WikiText-2's raw test split from the shared data, 1.3 MB);
2. `burnout train --data … --model MODEL --minutes N`: the step measured, the steps planned, the LR schedule
   ending at the budget;
3. `burnout generate` from it;
4. `burnout sft` on Alpaca (../shared/data/sft/alpaca_5000.json) with `--minutes N`;
5. `burnout generate --chat`: does the answer end at `<|im_end|>` rather than at the token limit;
6. `burnout export`, then transformers' AutoModelForCausalLM loads the folder and continues a prompt.

For each: wall minutes, and for the runs the steps planned and run, the last step's LR against the schedule's
final value, and the last val loss (from the run's own metrics.jsonl). The load average and CPU model are printed
with them: on a busy machine the minutes grow, the plan shrinks, and the LR must still end at its final value.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from benchmarks import results

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared" / "data"


def burnout(*args: str) -> tuple[str, float]:
    """Run `burnout ARGS` to the end: (its output, its wall minutes); exits naming the command if it fails."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "burnout", *args], cwd=REPO, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"burnout {' '.join(args)} failed:\n{done.stderr[-2000:]}")
    return done.stdout + done.stderr, (time.perf_counter() - start) / 60


def run_figures(run: Path) -> str:
    """The last step, its LR, the last val loss and the planned steps of a run, from its own files."""
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = [r for r in records if "lr" in r]
    vals = [r["val_loss"] for r in records if "val_loss" in r]
    last = steps[-1]
    return (f"step {last['step']}, last LR {last['lr']:.3g}, "
            + (f"val loss {vals[-1]:.3f}" if vals else "no val loss logged"))


def final_lr_line(log: str) -> str:
    """The run's last line about its budget: the steps trained of those planned, and the last step's LR against
    the schedule's final value."""
    lines = [line.strip() for line in log.splitlines() if line.startswith("budget")]
    return lines[-1] if lines else "(no budget line)"


# A command runner: burnout's arguments in, (its output, its wall minutes) out; `burnout` by default.
Runner = Callable[..., tuple[str, float]]


def first_hour(root: Path, text: Path, alpaca: Path, model: str, train_minutes: float, sft_minutes: float,
               run: Runner = burnout, prepare_options: Sequence[str] = (), train_options: Sequence[str] = (),
               sft_options: Sequence[str] = ()) -> list[tuple[str, float, str]]:
    """The first hour's commands, everything made under `root`, each command run by `run`: rows of (step, minutes,
    what it gave). The options (flags, KEY=VALUE) go to data prepare, train and sft: a short test's smaller ones."""
    rows = []
    _, minutes = run("data", "prepare", str(text), "--out", str(root / "data"), *prepare_options)
    rows.append(("data prepare", minutes, ""))
    log, minutes = run("train", "--data", str(root / "data"), "--model", model, "--out", str(root / "run"),
                       "--minutes", str(train_minutes), *train_options)
    rows.append(("train", minutes, f"{final_lr_line(log)}; {run_figures(root / 'run')}"))
    out, minutes = run("generate", str(root / "run"), "--prompt", "The ", "--max-new-tokens", "40", "--seed", "0")
    rows.append(("generate", minutes, repr(out.strip().splitlines()[0][:80])))
    log, minutes = run("sft", str(root / "run"), "--data", str(alpaca), "--out", str(root / "chat"),
                       "--minutes", str(sft_minutes), *sft_options)
    rows.append(("sft", minutes, f"{final_lr_line(log)}; {run_figures(root / 'chat')}"))
    out, minutes = run("generate", str(root / "chat"), "--chat", "--prompt", "Give three tips for staying healthy.",
                       "--max-new-tokens", "200", "--seed", "0")
    answer = out.strip().splitlines()[0] if out.strip() else ""
    rows.append(("generate --chat", minutes, f"{len(answer.split())} words: {answer[:60]!r}"))
    _, minutes = run("export", str(root / "chat"), "--to", str(root / "hf"))
    rows.append(("export", minutes, str(root / "hf")))

    start = time.perf_counter()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    hf_model, tokenizer = AutoModelForCausalLM.from_pretrained(root / "hf"), AutoTokenizer.from_pretrained(root / "hf")
    ids = tokenizer("The ", return_tensors="pt").input_ids
    continued = tokenizer.decode(hf_model.generate(ids, max_new_tokens=20, do_sample=False)[0])
    rows.append(("transformers loads the export", (time.perf_counter() - start) / 60, repr(continued[:60])))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", default="runs/first-hour", help="a new folder for everything this makes")
    parser.add_argument("--text", default=str(SHARED / "wikitext2" / "wiki.test.raw"), help="your raw text file")
    parser.add_argument("--model", default="llama-tiny", help="a model preset (default llama-tiny)")
    parser.add_argument("--train-minutes", type=float, default=6.0)
    parser.add_argument("--sft-minutes", type=float, default=5.0)
    args = parser.parse_args()
    root = Path(args.root)
    if root.exists():
        sys.exit(f"{root} exists; give a new --root")
    load_before = results.load()
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, load {load_before:.1f} "
          f"at the start")
    rows = first_hour(root, Path(args.text), SHARED / "sft" / "alpaca_5000.json", args.model, args.train_minutes,
                      args.sft_minutes)
    print(f"load {os.getloadavg()[0]:.1f} at the end\n")
    print("| step | minutes | what it gave |\n|---|---:|---|")
    for name, minutes, what in rows:
        print(f"| {name} | {minutes:.2f} | {what} |")
    print(f"| all | {sum(m for _, m, _ in rows):.2f} | |")
    defaults = parser.parse_args([])
    if all(getattr(args, key) == getattr(defaults, key) for key in ("text", "model", "train_minutes", "sft_minutes")):
        results.record("quickstart.first_hour_minutes", sum(m for _, m, _ in rows), load_before=load_before)


if __name__ == "__main__":
    main()
