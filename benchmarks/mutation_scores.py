"""Mutation score per module from the last `mutmut run` (`make mutation`): killed / (killed + survived).

    python -m benchmarks.mutation_scores

Reads mutmut's own result files (mutants/**/*.py.meta: each mutant's exit code) and classifies them with
mutmut's table: a mutant that made a test fail (or time out) is killed; one that every test passed is a
survivor; a mutant no selected test reaches counts as a survivor too (no test holds that code). Prints one
row per module and the survivors' names, which `mutmut show NAME` prints as a diff.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from mutmut.stats import status_by_exit_code


def scores(root: Path = Path("mutants")) -> list[tuple[str, Counter, list[str]]]:
    rows = []
    for meta in sorted(root.rglob("*.py.meta")):
        codes = json.loads(meta.read_text())["exit_code_by_key"]
        if not codes:
            continue
        statuses = {name: status_by_exit_code[code] for name, code in codes.items()}
        rows.append((str(meta.relative_to(root))[:-len(".meta")], Counter(statuses.values()),
                     sorted(name for name, status in statuses.items() if status in ("survived", "no tests"))))
    return rows


def main() -> None:
    rows = scores()
    if not rows:
        raise SystemExit("no mutmut results under mutants/; run `make mutation` first")
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
