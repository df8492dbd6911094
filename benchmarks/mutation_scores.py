"""Mutation score per module from the last `mutmut run` (`make mutation`): killed / (killed + survived).

    python -m benchmarks.mutation_scores [PATTERN ...]

PATTERNs (mutmut's names, `*` wildcards, as `mutmut run` takes them) limit the table to those mutants; mutants
not yet run are left out.

Reads mutmut's own result files (mutants/**/*.py.meta: each mutant's exit code) and classifies them with
mutmut's table: a mutant that made a test fail (or time out) is killed; one that every test passed is a
survivor; a mutant no selected test reaches counts as a survivor too (no test holds that code). Prints one
row per module and the survivors' names, which `mutmut show NAME` prints as a diff.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from fnmatch import fnmatch
from pathlib import Path

from mutmut.stats import status_by_exit_code


def scores(patterns: list[str], root: Path = Path("mutants")) -> list[tuple[str, Counter, list[str]]]:
    rows = []
    for meta in sorted(root.rglob("*.py.meta")):
        codes = json.loads(meta.read_text())["exit_code_by_key"]
        statuses = {name: status_by_exit_code[code] for name, code in codes.items()
                    if code is not None and (not patterns or any(fnmatch(name, p) for p in patterns))}
        if not statuses:
            continue
        rows.append((str(meta.relative_to(root))[:-len(".meta")], Counter(statuses.values()),
                     sorted(name for name, status in statuses.items() if status in ("survived", "no tests"))))
    return rows


def main() -> None:
    rows = scores(sys.argv[1:])
    if not rows:
        raise SystemExit("no mutmut results under mutants/ for these mutants; run `make mutation` first")
    print(f"{'module':<36} {'mutants':>8} {'killed':>7} {'survived':>9} {'no test':>8} {'score':>6}")
    for module, counts, _ in rows:
        killed = counts["killed"] + counts["timeout"]
        survived, untested = counts["survived"], counts["no tests"]
        total = killed + survived + untested
        print(f"{module:<36} {sum(counts.values()):>8} {killed:>7} {survived:>9} {untested:>8} "
              f"{killed / total if total else 0:>6.1%}")
    for module, _, survivors in rows:
        if survivors:
            print(f"\n{module}: {len(survivors)} survivors\n  " + "\n  ".join(survivors))


if __name__ == "__main__":
    main()
