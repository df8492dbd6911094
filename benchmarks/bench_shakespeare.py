"""Tiny Shakespeare char to val loss ≤ 1.88 against the clock: `burnout train shakespeare-fast`, timed from
the command's start to its exit, against nanoGPT's CPU recipe (100 s to val 1.886 on this machine type).

    .venv/bin/python -m benchmarks.bench_shakespeare [--config shakespeare-fast] [--data DIR] [--include-prepare]
                                                     [KEY=VALUE ...]

The data (nanoGPT's split: first 90% of the characters train, last 10% val) are prepared first, timed on
their own, unless --data names a prepared folder; --include-prepare instead lets the train command
prepare them inside the timed run. The final val loss is the config's: over every whole 64-token window
of the val split (111,488 of its 111,541 tokens). Prints wall seconds, val loss, tokens/s, the CPU
seconds the command used and the machine's load around it (timings on a shared machine are noisy).
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

TARGET_LOSS, TARGET_S, NANOGPT_S = 1.88, 40.0, 100.0


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="shakespeare-fast")
    parser.add_argument("--data", help="a prepared folder of the config's data (skips preparing)")
    parser.add_argument("--include-prepare", action="store_true", help="prepare the data inside the timed command")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        data = args.data
        if data is None and not args.include_prepare:
            data = str(Path(tmp) / "data")
            wall, cpu, _ = burnout("data", "prepare", args.config, "--out", data)
            print(f"data prepare ({args.config}'s data, untimed below): {wall:.1f} s wall, {cpu:.1f} s CPU")
        load_before = os.getloadavg()[0]
        cmd = ["train", args.config, "--out", str(Path(tmp) / "run"), *(["--data", data] if data else []),
               *args.overrides]
        wall, cpu, out = burnout(*cmd)
        load_after = os.getloadavg()[0]
    done = re.search(r"step (\d+), ([\d,]+) tokens, train loss ([\d.]+), val loss ([\d.]+), ([\d,]+) tokens/s", out)
    if done is None:
        sys.exit(f"could not read the result line of:\n{out}")
    steps, tokens, val, rate = int(done[1]), done[2], float(done[4]), done[5]
    print(f"burnout {' '.join(cmd[:2])}{' (prepares its data)' if not data else ''}: {steps} steps, {tokens} tokens, "
          f"{rate} tokens/s while training")
    print(f"  wall {wall:.1f} s from the command's start (target ≤ {TARGET_S:.0f} s; nanoGPT {NANOGPT_S:.0f} s → "
          f"{NANOGPT_S / wall:.2f}x), val loss {val:.4f} (target ≤ {TARGET_LOSS})")
    print(f"  {cpu:.1f} CPU seconds on {os.cpu_count()} cores; "
          f"1-min load {load_before:.2f} before, {load_after:.2f} after")
    print(f"  reached: loss {'yes' if val <= TARGET_LOSS else 'NO'}, time {'yes' if wall <= TARGET_S else 'NO'}")


if __name__ == "__main__":
    main()
