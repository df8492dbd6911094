"""The records of what the benchmarks measured, and the pages made from them.

    python -m benchmarks.results           rewrite docs/RESULTS.md and the README's headline table from the records
    python -m benchmarks.results --check   change nothing; exit 1 naming each page that differs from the records

benchmarks/results.jsonl holds one JSON object a line, appended and never rewritten: a benchmark calls
`record(CLAIM, value, load_before=...)` once for each figure it prints (the claims are in benchmarks/claims.py),
and the record keeps the claim, the command, the commit, the date, the machine, torch, the load and the target.
Records transcribed from the docs' earlier text say so (`"transcribed": true`). BURNOUT_RESULTS names another
file (tests write there).
"""

from __future__ import annotations

import argparse
import operator
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.claims import CLAIMS, GROUPS, README_ROWS, UNIT_FORMATS
from burnout.base.files import append_jsonl, read_jsonl

REPO = Path(__file__).resolve().parent.parent
RESULTS_FILE = REPO / "benchmarks" / "results.jsonl"
RESULTS_PAGE = REPO / "docs" / "RESULTS.md"
README = REPO / "README.md"
README_BEGIN = "<!-- made by `python -m benchmarks.results` from benchmarks/results.jsonl: edit those, not this -->"
README_END = "<!-- /results -->"
COMPARE = {">=": operator.ge, "<=": operator.le, ">": operator.gt, "<": operator.lt}
SYMBOLS = {">=": "≥", "<=": "≤", ">": ">", "<": "<"}


def results_file() -> Path:
    return Path(os.environ.get("BURNOUT_RESULTS") or RESULTS_FILE)


def load() -> float | None:
    """The 1-minute load average: the threads that ran or waited for a core, on average over the last minute."""
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else None


def record(claim: str, value: float, *, load_before: float | None, load_after: float | None = None,
           load_during: tuple[float, float] | None = None, note: str | None = None) -> dict:
    """Append one record of `claim` measured at `value` (its unit is the claim's) and print one line saying so. The
    load after is read now unless given; `load_during`: the lowest and highest reading taken while it ran (the
    readings between the runs of a side-by-side), which judge it as the readings before and after do."""
    spec = CLAIMS[claim]  # an unknown claim is a bug of the benchmark: KeyError
    path = results_file()
    target = {"op": spec.target[0], "value": spec.target[1]} if spec.target else None
    commit, dirty = _commit()
    entry = {
        "id": f"{claim}/{1 + sum(r.get('claim') == claim for r in read_jsonl(path))}",
        "claim": claim, "claim_text": spec.words, "value": value, "unit": spec.unit, "target": target,
        "met": COMPARE[target["op"]](value, target["value"]) if target else None,
        "command": _command(), "commit": commit, "dirty": dirty,
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "machine": _machine(), "torch": _torch(),
        "load_before": load_before, "load_after": load() if load_after is None else load_after,
        "load_during": list(load_during) if load_during else None,
        "transcribed": False, "source": None, "note": note,
    }
    append_jsonl(path, entry)
    print(f"recorded {entry['id']} = {format_value(claim, value)} in {path}")
    return entry


def _command() -> str:
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    program = f"python -m {spec.name}" if spec is not None else f"python {sys.argv[0]}"
    return " ".join([program, *map(shlex.quote, sys.argv[1:])])


def _commit() -> tuple[str | None, bool | None]:
    """HEAD of this checkout, and whether a tracked file other than the docs and the records differs from it."""
    try:
        head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10)
        status = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no", "--", ".",
                                 ":(exclude)*.md", ":(exclude)benchmarks/results.jsonl"],
                                capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):  # no git here
        return None, None
    if head.returncode or status.returncode:
        return None, None
    return head.stdout.strip(), bool(status.stdout.strip())


def _machine() -> dict:
    from burnout.core.device import cpu_model

    machine = {"cpu": cpu_model(), "cores": os.cpu_count(), "gpu": None, "gpu_driver": None}
    torch = sys.modules.get("torch")  # a benchmark that ran on a GPU has imported torch
    if torch is not None and torch.cuda.is_available():
        machine["gpu"] = torch.cuda.get_device_name()
        try:
            smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=30)
            machine["gpu_driver"] = smi.stdout.split()[0] if smi.returncode == 0 and smi.stdout.split() else None
        except (OSError, subprocess.TimeoutExpired):
            pass
    return machine


def _torch() -> str | None:
    from importlib import metadata

    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return None


# ----------------------------------------------------------------------------------------------
# Which record is current


def loaded(rec: dict) -> bool | None:
    """Whether a load reading of the record exceeded the machine's cores (threads waited for a core), None where the
    record has no reading or no core count."""
    readings = [x for x in (rec.get("load_before"), rec.get("load_after"), *(rec.get("load_during") or ()))
                if x is not None]
    cores = (rec.get("machine") or {}).get("cores")
    return None if not readings or not cores else max(readings) > cores


def current(records: list[dict]) -> dict[str, dict]:
    """Each claim's current record: its newest (the records are in the order they were taken); for a claim that
    depends on the machine's speed, its newest that was not taken under load, while it has one."""
    by_claim: dict[str, list[dict]] = {}
    for rec in records:
        by_claim.setdefault(rec["claim"], []).append(rec)
    chosen = {}
    for claim, recs in by_claim.items():
        calm = [r for r in recs if loaded(r) is not True] if CLAIMS[claim].speed else recs
        chosen[claim] = (calm or recs)[-1]
    return chosen


def format_value(claim: str, value: float) -> str:
    spec = CLAIMS[claim]
    return (spec.fmt or UNIT_FORMATS.get(spec.unit, "{:g} " + spec.unit)).format(value)


def verdict(rec: dict) -> str:
    """Whether the record meets its claim's target: not called met for a speed claim measured under load."""
    target = rec.get("target")
    if not target:
        return "–"
    goal = f"{SYMBOLS[target['op']]} {format_value(rec['claim'], target['value'])}"
    if CLAIMS[rec["claim"]].speed and loaded(rec):
        return f"{goal}: not judged (load above the cores)"
    return f"{goal}: {'yes' if rec['met'] else 'no'}"


# ----------------------------------------------------------------------------------------------
# The pages


def _load_cell(rec: dict) -> str:
    before, after, during = rec.get("load_before"), rec.get("load_after"), rec.get("load_during")
    if during:
        text = f"{during[0]:g}" + (f"–{during[1]:g}" if during[1] != during[0] else "")
    elif before is not None or after is not None:
        text = " → ".join("?" if x is None else f"{x:.2f}" for x in (before, after))
    else:
        return "not recorded"
    return text + (" (above the cores)" if loaded(rec) else "")


def _machine_cell(rec: dict) -> str:
    m = rec.get("machine") or {}
    if m.get("gpu"):
        return m["gpu"] + (f", driver {m['gpu_driver']}" if m.get("gpu_driver") else "")
    return (m.get("cpu") or "not recorded") + (f", {m['cores']} cores" if m.get("cores") else "")


def _date_cell(rec: dict) -> str:
    date = rec["date"][:10] if rec.get("date") else "not recorded"
    if rec.get("commit"):
        date += f", {rec['commit'][:7]}{' (dirty)' if rec.get('dirty') else ''}"
    return date


def _code(text: str) -> str:
    """`text` as Markdown code, whatever backticks it holds."""
    return f"`` {text} ``" if "`" in text else f"`{text}`"


def render_results(records: list[dict]) -> str:
    chosen = current(records)
    counts = {claim: sum(r["claim"] == claim for r in records) for claim in CLAIMS}
    lines = [
        "# Results",
        "",
        "The current figure of every claim the docs make, made by `python -m benchmarks.results` from the records in",
        "[benchmarks/results.jsonl](../benchmarks/results.jsonl); do not edit it by hand (tests/test_docs.py compares",
        "it with the records). Each benchmark appends one record per figure it prints: the claim, the command, the",
        "commit (\"dirty\": code differed from it), the date, the machine, torch, the 1-minute load average before and",
        "after, the value and its target. Why each default is what it is: [PERFORMANCE.md](PERFORMANCE.md); earlier",
        "figures: [LOG.md](LOG.md) and the records themselves.",
        "",
        "**Which record is current.** A claim's newest record. For a claim that depends on the machine's speed (a",
        "time, a rate, a ratio of two timed programs) a record whose load exceeded the machine's cores (threads were",
        "waiting for a core: another program took time the benchmark needed) never replaces one that was not; it is",
        "current only while the claim has no other, and its target is \"not judged\". **transcribed** marks a figure",
        "copied from the docs' earlier text, not measured by the benchmark that now records it: its fields are what",
        "the docs said, \"not recorded\" where they said nothing. Rerun its command to replace it.",
    ]
    for group, title in GROUPS.items():
        claims = [c for c in CLAIMS if c.split(".", 1)[0] == group]
        lines += ["", f"## {title}", "",
                  "| claim | current | target | machine | torch | date | load | record | command |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for claim in claims:
            rec = chosen.get(claim)
            if rec is None:
                cells = [CLAIMS[claim].words, "no record yet", "–", "", "", "", "", f"`{claim}`",
                         _code(CLAIMS[claim].command)]
            else:
                mark = " (transcribed)" if rec.get("transcribed") else ""
                older = f", {counts[claim] - 1} earlier" if counts[claim] > 1 else ""
                cells = [CLAIMS[claim].words, f"**{format_value(claim, rec['value'])}**", verdict(rec),
                         _machine_cell(rec), rec.get("torch") or "not recorded", _date_cell(rec), _load_cell(rec),
                         f"`{rec['id']}`{mark}{older}", _code(rec["command"])]
            lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(lines) + "\n"


_FIELD = re.compile(r"\{(range:)?([\w.\-]+)(:torch)?\}")


def fill_cell(template: str, chosen: dict[str, dict]) -> str:
    def one(m: re.Match) -> str:
        if m[1]:
            values = sorted((rec["value"], claim) for claim, rec in chosen.items() if claim.startswith(m[2]))
            if not values:
                return "no record yet"
            return f"{format_value(values[0][1], values[0][0])} to {format_value(values[-1][1], values[-1][0])}"
        rec = chosen.get(m[2])
        if rec is None:
            return "no record yet"
        return (rec.get("torch") or "torch not recorded").split("+")[0] if m[3] else format_value(m[2], rec["value"])

    def optional(m: re.Match) -> str:
        return m[1] if all(f[2] in chosen for f in _FIELD.finditer(m[1]) if not f[1]) else ""

    return _FIELD.sub(one, re.sub(r"\[([^\]]*\{[^\]]*)\]", optional, template))


def render_readme_table(records: list[dict]) -> str:
    chosen = current(records)
    rows = ["| headline result | measured ([RESULTS.md](docs/RESULTS.md): when, where, how to rerun) | evidence |",
            "|---|---|---|"]
    rows += [f"| {what} | {fill_cell(measured, chosen)} | {evidence} |" for what, measured, evidence in README_ROWS]
    return "\n".join([README_BEGIN, *rows, README_END])


def with_readme_table(readme: str, table: str) -> str:
    """The README with its marked block replaced by `table`; ValueError when the markers are missing."""
    start, end = readme.find(README_BEGIN), readme.find(README_END)
    if start < 0 or end < start:
        raise ValueError(f"README.md has no block between {README_BEGIN!r} and {README_END!r}")
    return readme[:start] + table + readme[end + len(README_END):]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a page differs")
    args = parser.parse_args()
    records = read_jsonl(results_file())
    pages = {RESULTS_PAGE: render_results(records),
             README: with_readme_table(README.read_text(encoding="utf-8"), render_readme_table(records))}
    stale = [path for path, text in pages.items() if not path.is_file() or path.read_text(encoding="utf-8") != text]
    if args.check:
        for path in stale:
            print(f"{path.relative_to(REPO)} differs from {results_file().name}: run python -m benchmarks.results")
        return 1 if stale else 0
    for path in stale:
        path.write_text(pages[path], encoding="utf-8")
        print(f"wrote {path.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
