"""The test suite against the clock: `make test`'s pytest, or `make test-fast`'s, timed from its start.

    .venv/bin/python -m benchmarks.bench_suite [--fast]

Runs pytest as the Makefile does, under CI=true (a test that needs ../shared/data fails rather than skips), prints
its summary line, its wall minutes and the load before and after, and appends the minutes to
benchmarks/results.jsonl: testing.suite_minutes, or with --fast testing.fast_minutes (`make test-fast`'s target: 3
minutes on 2 cores). A suite that fails is not recorded.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

from benchmarks import results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fast", action="store_true", help="the tests `make test-fast` runs (not marked slow)")
    args = parser.parse_args()
    selection = ["-m", "not slow and not gpu"] if args.fast else []
    before = results.load()
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *selection],
                          capture_output=True, text=True, env={**os.environ, "CI": "true"})
    minutes = (time.perf_counter() - start) / 60
    after = results.load()
    print(proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr[-2000:])
    print(f"  {minutes:.2f} minutes wall from its start; 1-min load {before:.2f} before, {after:.2f} after")
    if proc.returncode:
        sys.exit(f"pytest exited {proc.returncode}: not recorded\n{proc.stdout[-3000:]}")
    results.record("testing.fast_minutes" if args.fast else "testing.suite_minutes", minutes, load_before=before,
                   load_after=after)


if __name__ == "__main__":
    main()
