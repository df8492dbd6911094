"""A scaling ladder on each prepared corpus, then the held-out run the plan chooses at 4× the largest rung's compute
or more: every rung, the fit, the prediction and the truth (issue 50's Evidence).

    .venv/bin/python -m benchmarks.bench_ladder DATA [DATA ...] [--minutes 20] [--out DIR]
    .venv/bin/python -m benchmarks.bench_ladder DATA --compare [--minutes 2 --seq-len 64]

DATA is a folder `burnout data prepare` made, e.g. WikiText-2's test text (`burnout data prepare
../shared/data/wikitext2/wiki.test.raw --out data/wt2 --tokenizer bpe:4096`) and Python's docs (`burnout data prepare
default --out data/py`). Per corpus: `burnout ladder DATA --minutes M`; then `burnout plan --minutes H --ladder`, H
chosen so that the plan's run has at least HELD_OUT_FACTOR × the largest rung's FLOPs, with --write-config; `burnout
train` of that config; its final val loss against the prediction (within 3% and inside the interval is the goal).
Each run is a subprocess, as a user runs it. Nothing is appended to results.jsonl: the figures depend on the machine.

--compare: the ladder's two schedules on the same rungs. `burnout ladder --schedule linear` designs and trains its
rungs as separate runs; the same rungs are then trained as WSD branches (ladder.branched); last, a WSD ladder of its own
design for the same budget at the same step times (a larger C0). Printed: each rung's val loss under both, the FLOPs
each trained, and each ladder's held-out error (the top level predicted by a fit of the others). In this process
(run_ladder), not a subprocess: the later ladders are given their designs.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from burnout.config import load_run_config
from burnout.models.info import model_info
from burnout.train.ladder import branched, design, ladder_budget, run_ladder, trained_steps

HELD_OUT_FACTOR = 4.0
GOAL = 0.03  # the held-out run's val loss within 3% of the prediction


def burnout(*args: str) -> str:
    """Run `burnout ARGS` in a fresh process, echo its output, and return it; stop the benchmark if it fails."""
    proc = subprocess.run([sys.executable, "-m", "burnout", *args], capture_output=True, text=True)
    print(proc.stdout, end="")
    if proc.returncode:
        sys.exit(f"burnout {' '.join(args)} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return proc.stdout


def corpus(data: Path, out: Path, minutes: float) -> dict:
    """The ladder, the plan at HELD_OUT_FACTOR × its largest rung, the planned run: what each predicted and gave."""
    ladder_dir = out / "ladder"
    burnout("ladder", str(data), "--out", str(ladder_dir), "--minutes", f"{minutes:g}")
    ladder = json.loads((ladder_dir / "ladder.json").read_text())
    largest = max(ladder["design"]["rungs"], key=lambda r: r["flops"])
    # The plan buys minutes, the rungs' FLOP rate holds roughly: the largest rung's minutes × the factor, and 20% more
    # for a larger model's lower rate (the plan measures its own; the ratio reached is printed).
    held_minutes = HELD_OUT_FACTOR * largest["steps"] * largest["step_seconds"] / 60 * 1.2
    config, run = out / "held_out.yaml", out / "held_out"
    burnout("plan", "--minutes", f"{held_minutes:.3g}", "--ladder", str(ladder_dir), "--write-config", str(config))
    burnout("train", str(config), "--out", str(run))
    prediction = yaml.safe_load(config.read_text())["prediction"]
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    final = [r["val_loss"] for r in records if "val_loss" in r][-1]
    cfg = load_run_config(str(config))
    flops = model_info(cfg.model, seq_len=cfg.train.seq_len)["flops_per_token"] * prediction["tokens"]
    burnout("report", str(run), "--md")
    return {"data": str(data), "ratio": flops / largest["flops"], "prediction": prediction, "final": final,
            "held_out_error": ladder["fit"]["held_out"]["mean_abs_error"]}


def trained_flops(ladder: dict) -> float:
    """The FLOPs a ladder's rungs trained themselves (a branch: its decay alone)."""
    return sum(trained_steps(r) * r["flops"] / r["steps"] for r in ladder["design"]["rungs"])


def compare(data: Path, out: Path, minutes: float, seq_len: int) -> None:
    """The linear ladder, its rungs as WSD branches, and a WSD ladder of the same budget: printed side by side."""
    separate = run_ladder(data, out / "linear", ladder_budget(minutes, None, None, None, seq_len, "linear"))
    wsd_budget = ladder_budget(minutes, None, None, None, seq_len, "wsd")
    same = run_ladder(data, out / "wsd-same-rungs", wsd_budget, design_=branched(separate["design"]))
    # At the linear ladder's step times (measured once: a probe under another load would buy other compute).
    measured = {r["depth"]: r["step_seconds"] for r in separate["design"]["rungs"]}
    own = run_ladder(data, out / "wsd", wsd_budget, design_=design(data, wsd_budget, print, measured))
    print(f"\n{data}: {minutes:g} minutes, --seq-len {seq_len}; val loss of each rung, separate linear-decay runs "
          "against WSD branches of the same N and D")
    print(f"{'rung':<8}{'params':>10}{'tokens':>10}{'linear':>9}{'wsd':>9}{'wsd/lin':>9}")
    gaps = []
    for r in separate["design"]["rungs"]:
        lin, wsd = separate["done"][r["name"]]["val_loss"], same["done"][r["name"]]["val_loss"]
        gaps.append(wsd / lin - 1)
        kind = "trunk" if r["level"] == separate["design"]["levels"] - 1 else "branch"
        print(f"{r['name']:<8}{r['N']:>10,}{r['D']:>10,}{lin:>9.4f}{wsd:>9.4f}{gaps[-1]:>+9.2%}  {kind}")
    print(f"WSD against linear: mean {sum(gaps) / len(gaps):+.2%}, mean |gap| {sum(map(abs, gaps)) / len(gaps):.2%}, "
          f"from {min(gaps):+.2%} to {max(gaps):+.2%}")
    for name, ladder in (("linear", separate), ("wsd, same rungs", same), ("wsd, own design", own)):
        held = ladder["fit"]["held_out"]
        print(f"{name:<16} {len(ladder['design']['rungs']):>2} rungs, trained {trained_flops(ladder):.3e} FLOPs "
              f"({trained_flops(ladder) / trained_flops(separate):.0%} of linear's), largest rung "
              f"{max(r['flops'] for r in ladder['design']['rungs']):.3e}; held-out mean |error| "
              f"{held['mean_abs_error']:.2%} (" + ", ".join(f"{h['error']:+.2%}" for h in held["held_out"]) + ")")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data", nargs="+", type=Path, help="prepared data folders, one ladder each")
    parser.add_argument("--minutes", type=float, default=20.0, help="each ladder's budget (default 20)")
    parser.add_argument("--out", type=Path, help="where the ladders and runs go (default: a temporary folder)")
    parser.add_argument("--compare", action="store_true",
                        help="the two schedules on the same rungs, and a WSD ladder of the same budget (no plan)")
    parser.add_argument("--seq-len", type=int, default=256, help="with --compare: the rungs' sequence length")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = args.out or Path(tmp)
        if args.compare:
            for data in args.data:
                compare(data.absolute(), root / data.name, args.minutes, args.seq_len)
            return
        found = [corpus(data, root / data.name, args.minutes) for data in args.data]
    print(f"\nladders of {args.minutes:g} minutes; held-out run at ≥ {HELD_OUT_FACTOR:g}× the largest rung's compute")
    for f in found:
        p, final = f["prediction"], f["final"]
        off = final / p["val_loss"] - 1
        inside = p["low"] <= final <= p["high"]
        print(f"{f['data']}: predicted {p['val_loss']:.4f} ({p['level']:.0%} interval {p['low']:.4f}–{p['high']:.4f}) "
              f"for {p['params']:,} parameters × {p['tokens']:,} tokens; final val loss {final:.4f}, {off:+.2%}: "
              f"{'inside' if inside else 'outside'} the interval, {'within' if abs(off) <= GOAL else 'beyond'} "
              f"{GOAL:.0%}; at {f['ratio']:.1f}× the largest rung's compute; the ladder's own held-out error "
              f"{f['held_out_error']:.2%}")


if __name__ == "__main__":
    main()
