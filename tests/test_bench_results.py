"""benchmarks/results.py: what a record holds, which record of a claim is current, and how the README's cells are
filled from the current records."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from datetime import datetime
from importlib import metadata
from pathlib import Path

import pytest

from benchmarks import results
from burnout.base.files import read_jsonl

REPO_ROOT = Path(__file__).resolve().parent.parent


def test_a_record_holds_the_claim_the_command_the_code_the_machine_and_the_load(tmp_path, monkeypatch):
    path = tmp_path / "results.jsonl"
    monkeypatch.setenv("BURNOUT_RESULTS", str(path))
    monkeypatch.setattr(sys, "argv", ["benchmarks/bench_shakespeare.py", "--data", "my data"])
    results.record("shakespeare.wall_s", 31.5, load_before=0.4, load_after=1.25)
    results.record("shakespeare.wall_s", 45.0, load_before=0.5, load_during=(0.7, 2.4), note="second")
    first, second = read_jsonl(path)
    head = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"], capture_output=True, text=True)
    assert (first["id"], second["id"]) == ("shakespeare.wall_s/1", "shakespeare.wall_s/2")
    assert first["claim_text"] == results.CLAIMS["shakespeare.wall_s"].words
    assert (first["value"], first["unit"], first["target"]) == (31.5, "s", {"op": "<=", "value": 40.0})
    assert (first["met"], second["met"]) == (True, False)  # 31.5 ≤ 40, 45 is not
    assert first["command"].endswith("--data 'my data'")
    assert first["commit"] == head.stdout.strip() and isinstance(first["dirty"], bool)
    assert datetime.strptime(first["date"], "%Y-%m-%dT%H:%M:%S%z")
    assert first["machine"]["cores"] == os.cpu_count() and first["machine"]["cpu"]
    assert first["torch"] == metadata.version("torch")
    assert (first["load_before"], first["load_after"]) == (0.4, 1.25)
    assert second["load_after"] == pytest.approx(os.getloadavg()[0], abs=2.0) and second["note"] == "second"
    assert (first["load_during"], second["load_during"]) == (None, [0.7, 2.4])
    assert first["transcribed"] is False and first["source"] is None


def test_an_unknown_claim_is_a_benchmarks_bug(tmp_path, monkeypatch):
    monkeypatch.setenv("BURNOUT_RESULTS", str(tmp_path / "results.jsonl"))
    with pytest.raises(KeyError):
        results.record("shakespeare.wal_s", 1.0, load_before=None)
    assert not (tmp_path / "results.jsonl").exists()


def _rec(claim: str, value: float, loads: tuple, cores: int | None = 2, met: bool | None = None) -> dict:
    return {"id": f"{claim}/{value}", "claim": claim, "value": value, "machine": {"cores": cores},
            "load_before": loads[0], "load_after": loads[1], "load_during": None, "met": met,
            "target": {"op": "<=", "value": 40.0} if claim == "shakespeare.wall_s" else None}


def test_a_record_taken_under_load_never_replaces_a_quiet_one_for_a_speed_claim():
    quiet, busy = _rec("shakespeare.wall_s", 30.0, (0.3, 1.9)), _rec("shakespeare.wall_s", 55.0, (2.5, 3.1))
    assert results.current([quiet, busy])["shakespeare.wall_s"] is quiet
    newer_quiet = _rec("shakespeare.wall_s", 33.0, (0.1, 2.0))  # a load equal to the cores is not above them
    assert results.current([quiet, busy, newer_quiet])["shakespeare.wall_s"] is newer_quiet
    assert results.current([busy])["shakespeare.wall_s"] is busy  # while the claim has no other
    unknown = _rec("shakespeare.wall_s", 35.0, (None, None))
    assert results.current([quiet, unknown, busy])["shakespeare.wall_s"] is unknown


def test_the_load_is_judged_against_the_machines_own_cores():
    assert results.loaded(_rec("shakespeare.wall_s", 30.0, (3.0, 3.5), cores=4)) is False
    assert results.loaded(_rec("shakespeare.wall_s", 30.0, (3.0, 4.5), cores=4)) is True
    assert results.loaded({**_rec("shakespeare.wall_s", 30.0, (0.5, 0.5)), "load_during": [0.5, 2.2]}) is True
    assert results.loaded(_rec("shakespeare.wall_s", 30.0, (3.0, 3.5), cores=None)) is None


def test_a_claim_that_does_not_depend_on_speed_takes_its_newest_record_whatever_the_load():
    quiet, busy = _rec("shakespeare.val_loss", 1.86, (0.2, 0.9)), _rec("shakespeare.val_loss", 1.87, (7.0, 9.0))
    assert results.current([quiet, busy])["shakespeare.val_loss"] is busy


def test_a_speed_target_is_not_called_met_under_load():
    assert results.verdict(_rec("shakespeare.wall_s", 30.0, (0.5, 1.8), met=True)) == "≤ 40.0 s: yes"
    assert results.verdict(_rec("shakespeare.wall_s", 30.0, (0.5, 2.8), met=True)).endswith("not judged "
                                                                                             "(load above the cores)")
    assert results.verdict(_rec("shakespeare.wall_s", 50.0, (0.5, 1.8), met=False)) == "≤ 40.0 s: no"
    assert results.verdict(_rec("shakespeare.val_loss", 1.9, (0.5, 1.8))) == "–"


def test_the_readme_cells_are_the_current_figures():
    chosen = {"shakespeare.wall_s": {**_rec("shakespeare.wall_s", 28.24, (0.1, 1.0)), "torch": "2.13.0+cpu"},
              "planner.eager.llama-1b.4x2048": _rec("planner.eager.llama-1b.4x2048", 21.3, (None, None)),
              "planner.eager.gpt2-134m.32x512": _rec("planner.eager.gpt2-134m.32x512", 7.2, (None, None))}
    fill, cell = results.fill_cell, "in {shakespeare.wall_s}[ (nanoGPT: {shakespeare.nanogpt_s})]"
    assert fill(cell, chosen) == "in 28.2 s"  # the part naming a claim without a record is left out
    chosen["shakespeare.nanogpt_s"] = _rec("shakespeare.nanogpt_s", 101.0, (None, None))
    assert fill(cell, chosen) == "in 28.2 s (nanoGPT: 101.0 s)"
    assert fill("torch {shakespeare.wall_s:torch}", chosen) == "torch 2.13.0"
    assert fill("{range:planner.eager.}", chosen) == "+7.2% to +21.3%"
    assert fill("{cpu10m.nanogpt_ratio}", chosen) == "no record yet"
    two = "a[, {shakespeare.wall_s} and {cpu10m.nanogpt_ratio}]"
    assert fill(two, chosen) == "a"  # dropped while any claim it names has no record


def test_the_code_is_dirty_when_a_tracked_file_other_than_the_docs_and_the_records_differs(tmp_path, monkeypatch):
    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    (tmp_path / "benchmarks").mkdir()
    files = {"bench.py": "x = 1\n", "README.md": "# hi\n", "benchmarks/results.jsonl": "{}\n"}
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    git("init", "-q")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "start")
    monkeypatch.setattr(results, "REPO", tmp_path)
    (tmp_path / "README.md").write_text("# changed\n")
    (tmp_path / "benchmarks" / "results.jsonl").write_text("{}\n{}\n")
    (tmp_path / "notes.txt").write_text("untracked\n")
    commit, dirty = results._commit()
    assert len(commit) == 40 and dirty is False
    (tmp_path / "bench.py").write_text("x = 2\n")
    assert results._commit() == (commit, True)


def test_every_claim_a_benchmark_names_is_defined():
    """A claim id written in a benchmark (whole, or the fixed start of an f-string) is a claim of benchmarks/claims.py
    or the start of some: a typo would otherwise fail only at the end of an hour's run."""
    import ast

    from benchmarks.claims import CLAIMS, GROUPS

    looks_like_claim = re.compile(rf"^({'|'.join(GROUPS)})\.[\w.\-]*$")
    unknown = []
    for path in sorted((REPO_ROOT / "benchmarks").glob("*.py")):
        if path.name == "claims.py":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        parts = {id(part) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for part in node.values}
        for node in ast.walk(tree):
            whole = isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in parts
            start = isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant)
            text = node.value if whole else node.values[0].value if start else None
            if text is None or not looks_like_claim.match(text) or text.endswith((".yaml", ".json", ".py")):
                continue
            if (whole and text not in CLAIMS and not any(c.startswith(text + ".") for c in CLAIMS)) or (
                    not whole and not any(c.startswith(text) for c in CLAIMS)):
                unknown.append(f"{path.name}:{node.lineno}: {text}")
    assert not unknown, "claims named but not defined:\n" + "\n".join(unknown)
