"""The offline demo as `make demo` runs it: `burnout quickstart` in a fresh process, into a temporary folder.

    .venv/bin/python -m benchmarks.bench_quickstart [--minutes 3]

Prints the quickstart's own last line (steps, tokens, tokens/s, val loss against a uniform guess), its wall
seconds and the load before and after; at the default 3 minutes its val loss and tokens/s are appended to
benchmarks/results.jsonl. The quickstart sizes its run to the machine (a step measured, then the steps that fit),
so both figures depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import results

# burnout/quickstart.py's last line: "[4/4] done in 3.0 min: 567 steps, 1,161,216 tokens at 7,016 tokens/s; val loss
# 4.565 (a uniform guess scores 8.318)".
DONE_LINE = re.compile(r"\[4/4\] done in [\d.]+ min: (\d+) steps, ([\d,]+) tokens at ([\d,]+) tokens/s; "
                       r"val loss ([\d.]+)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=3.0, help="the quickstart's budget (default 3, as make demo)")
    args = parser.parse_args()
    before = results.load()
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "burnout", "quickstart", "--out", str(Path(tmp) / "quickstart"),
                               "--minutes", str(args.minutes)], capture_output=True, text=True)
        wall = time.perf_counter() - start
    after = results.load()
    done = DONE_LINE.search(proc.stdout)
    if proc.returncode or done is None:
        sys.exit(f"burnout quickstart failed (exit {proc.returncode}) or printed no result line:\n"
                 f"{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    print(done[0])
    print(f"  {wall:.0f} s wall from the command's start; 1-min load {before:.2f} before, {after:.2f} after")
    if args.minutes != 3.0:
        print("not recorded in benchmarks/results.jsonl: the claims are of the 3-minute quickstart")
        return
    results.record("quickstart.val_loss", float(done[4]), load_before=before, load_after=after)
    results.record("quickstart.tokens_per_s", float(done[3].replace(",", "")), load_before=before, load_after=after)


if __name__ == "__main__":
    main()
