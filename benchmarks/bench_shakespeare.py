"""Tiny Shakespeare char to val loss ≤ 1.88 against the clock: `burnout train shakespeare-fast`, timed from
the command's start to its exit; with --nanogpt DIR, nanoGPT's own CPU recipe timed the same way.

    .venv/bin/python -m benchmarks.bench_shakespeare [--config shakespeare-fast] [--data DIR] [--include-prepare]
                                                     [--nanogpt DIR] [KEY=VALUE ...]

The data (nanoGPT's split: first 90% of the characters train, last 10% val) are prepared first, timed on
their own, unless --data names a prepared folder; --include-prepare instead lets the train command
prepare them inside the timed run. The final val loss is the config's: over every whole 64-token window
of the val split (111,488 of its 111,541 tokens). Prints wall seconds, val loss, tokens/s, the CPU
seconds the command used and the machine's load around it (timings on a shared machine are noisy).

--nanogpt DIR (a nanoGPT checkout, its code unchanged) also runs the command its README gives for a CPU
(config/train_shakespeare_char.py at 4 layers × 128, block 64, batch 12, 2,000 iterations, no dropout, no compile)
in a fresh process, timed from its start to its exit, and prints its last val loss: nanoGPT's estimate over
eval_iters (20) random batches, not the whole split. Its data are written as its data/shakespeare_char/prepare.py
writes them, from the config's local text file, when not there yet. Without --nanogpt no nanoGPT time is printed.
Each figure of the default config without overrides is appended to benchmarks/results.jsonl.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import results

TARGET_LOSS, TARGET_S = 1.88, 40.0
# nanoGPT's README, "I only have a macbook": its Shakespeare-char run on a CPU.
NANOGPT_CPU_RECIPE = ["--device=cpu", "--compile=False", "--eval_iters=20", "--log_interval=1", "--block_size=64",
                      "--batch_size=12", "--n_layer=4", "--n_head=4", "--n_embd=128", "--max_iters=2000",
                      "--lr_decay_iters=2000", "--dropout=0.0"]
# nanoGPT train.py's evaluation line: "step 2000: train loss 1.7648, val loss 1.8857".
NANOGPT_EVAL_LINE = re.compile(r"^step (\d+): train loss ([\d.]+), val loss ([\d.]+)", re.MULTILINE)


def burnout(*args: str) -> tuple[float, float, str]:
    """(wall seconds, CPU seconds, stdout) of one `burnout` command in a fresh process."""
    cpu_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "burnout", *args], capture_output=True, text=True)
    wall = time.perf_counter() - start
    cpu_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode:
        sys.exit(f"burnout {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}")
    cpu = (cpu_after.ru_utime - cpu_before.ru_utime) + (cpu_after.ru_stime - cpu_before.ru_stime)
    return wall, cpu, proc.stdout


def nanogpt(checkout: Path, text: Path) -> tuple[float, float]:
    """(wall seconds, last val loss) of nanoGPT's CPU recipe, in a fresh process from its checkout."""
    from benchmarks.bench_train import write_nanogpt_char_data

    if not (checkout / "train.py").is_file() or not (checkout / "config" / "train_shakespeare_char.py").is_file():
        sys.exit(f"--nanogpt {checkout}: no train.py and config/train_shakespeare_char.py there; give a nanoGPT "
                 "checkout (git clone https://github.com/karpathy/nanoGPT)")
    data_dir = checkout / "data" / "shakespeare_char"
    if not (data_dir / "meta.pkl").exists():
        if not text.is_file():
            sys.exit(f"the config's text {text} is not here; run from the checkout, beside ../shared/data")
        write_nanogpt_char_data(text, data_dir)
        print(f"wrote nanoGPT's train.bin, val.bin and meta.pkl into {data_dir} from {text}")
    with tempfile.TemporaryDirectory() as out_dir:  # its checkpoints, not in the checkout
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, "train.py", "config/train_shakespeare_char.py", *NANOGPT_CPU_RECIPE,
                               f"--out_dir={out_dir}"], cwd=checkout, capture_output=True, text=True)
        wall = time.perf_counter() - start
    evals = NANOGPT_EVAL_LINE.findall(proc.stdout)
    if proc.returncode or not evals:
        sys.exit(f"nanoGPT's train.py failed (exit {proc.returncode}) or printed no val loss: "
                 f"{(proc.stderr.strip().splitlines() or ['no output'])[-1]}")
    return wall, float(evals[-1][2])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="shakespeare-fast")
    parser.add_argument("--data", help="a prepared folder of the config's data (skips preparing)")
    parser.add_argument("--include-prepare", action="store_true", help="prepare the data inside the timed command")
    parser.add_argument("--nanogpt", metavar="DIR", help="a nanoGPT checkout: also time its own CPU recipe")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        data = args.data
        if data is None and not args.include_prepare:
            data = str(Path(tmp) / "data")
            wall, cpu, _ = burnout("data", "prepare", args.config, "--out", data)
            print(f"data prepare ({args.config}'s data, untimed below): {wall:.1f} s wall, {cpu:.1f} s CPU")
        load_before = results.load()
        cmd = ["train", args.config, "--out", str(Path(tmp) / "run"), *(["--data", data] if data else []),
               *args.overrides]
        wall, cpu, out = burnout(*cmd)
        load_after = results.load()
    done = re.search(r"step (\d+), ([\d,]+) tokens, train loss ([\d.]+), val loss ([\d.]+), ([\d,]+) tokens/s", out)
    if done is None:
        sys.exit(f"could not read the result line of:\n{out}")
    steps, tokens, val, rate = int(done[1]), done[2], float(done[4]), done[5]
    print(f"burnout {' '.join(cmd[:2])}{' (prepares its data)' if not data else ''}: {steps} steps, {tokens} tokens, "
          f"{rate} tokens/s while training")
    print(f"  wall {wall:.1f} s from the command's start (target ≤ {TARGET_S:.0f} s), val loss {val:.4f} "
          f"(target ≤ {TARGET_LOSS})")
    print(f"  {cpu:.1f} CPU seconds on {os.cpu_count()} cores; "
          f"1-min load {load_before:.2f} before, {load_after:.2f} after")
    print(f"  reached: loss {'yes' if val <= TARGET_LOSS else 'NO'}, time {'yes' if wall <= TARGET_S else 'NO'}")
    theirs = None
    if args.nanogpt:
        from burnout.config import load_run_config

        text = Path(load_run_config(args.config).data.sources[0].path or "")
        nanogpt_before = results.load()
        theirs = nanogpt(Path(args.nanogpt), text)
        print(f"nanoGPT's CPU recipe ({args.nanogpt}): wall {theirs[0]:.1f} s from its start, last val loss "
              f"{theirs[1]:.4f} (its estimate over 20 batches) → ours {theirs[0] / wall:.2f}x as fast; 1-min load "
              f"{nanogpt_before:.2f} before, {results.load():.2f} after")
    if args.config != "shakespeare-fast" or args.overrides:
        print("not recorded in benchmarks/results.jsonl: the claims are of shakespeare-fast as it is")
        return
    results.record("shakespeare.val_loss", val, load_before=load_before, load_after=load_after)
    results.record("shakespeare.with_prepare_s" if not data else "shakespeare.wall_s", wall, load_before=load_before,
                   load_after=load_after)
    if theirs is not None:
        results.record("shakespeare.nanogpt_s", theirs[0], load_before=nanogpt_before)
        results.record("shakespeare.nanogpt_val_loss", theirs[1], load_before=nanogpt_before)


if __name__ == "__main__":
    main()
