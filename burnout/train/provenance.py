"""What a run was launched with: one line in RUN/launches.jsonl per start or resume, so a report can say
which command, code and machine produced its numbers.

    time, step        when, and the step training started from (0, or the resumed checkpoint's)
    argv, cwd         the command line as the process received it, and where it ran
    git_commit        the commit of the burnout checkout (with "-dirty" when it has uncommitted changes),
                      or null for an installed package
    versions          burnout, torch, python
    device            what the steps ran on: the GPU's name, or the CPU's model and thread count
    precision         what the steps ran in (fp32, bf16, fp16, fp8): train.precision, `auto` as it resolved here
    world_size        processes under torchrun (1 otherwise)
    data              the data folder it trained on and its fingerprint (data/shards.py: data_fingerprint), which
                      a resume checks the folder it finds against (trained_data)
    lineage           a continued run's first launch (train.init_from): the checkpoint its step 0 loaded, its
                      run and step, the parent's data folder and this run's, the loaded weights' sha256
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

import torch

from burnout.base.files import LAUNCHES_FILE, append_jsonl, read_jsonl
from burnout.core.device import describe_device
from burnout.data.shards import data_fingerprint


def record_launch(run_dir: Path, step: int, device: torch.device, world_size: int, data_dir: Path,
                  lineage: dict | None = None, precision: str | None = None) -> None:
    entry = {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "step": step,
        "argv": sys.argv,
        "cwd": os.getcwd(),
        "git_commit": git_commit(),
        "versions": {"burnout": _package_version(), "torch": torch.__version__, "python": platform.python_version()},
        "device": describe_device(device),
        "world_size": world_size,
        "data": {"dir": str(Path(data_dir).resolve()), "sha256": data_fingerprint(data_dir)},
    }
    if precision is not None:
        entry["precision"] = precision
    if lineage is not None:
        entry["lineage"] = lineage
    append_jsonl(run_dir / LAUNCHES_FILE, entry)


def lineage_of(run_dir: Path) -> dict | None:
    """What a continued run started from (its first launch's lineage), or None for a run that started afresh."""
    return next((launch["lineage"] for launch in read_launches(run_dir) if "lineage" in launch), None)


def trained_data(run_dir: Path) -> dict | None:
    """The data folder a run's newest launch trained on, and its fingerprint ({"dir", "sha256"}); None for a run
    launched before launches recorded them."""
    return next((launch["data"] for launch in reversed(read_launches(run_dir))
                 if isinstance(launch.get("data"), dict) and launch["data"].get("sha256")), None)


def read_launches(run_dir: Path) -> list[dict]:
    """Every recorded launch; a line torn by a kill while it was written left no record."""
    return read_jsonl(Path(run_dir) / LAUNCHES_FILE)


def git_commit() -> str | None:
    """HEAD of the git checkout burnout runs from (+ "-dirty" with uncommitted changes), else None."""
    root = Path(__file__).resolve().parents[2]
    try:
        found = subprocess.run(["git", "-C", str(root), "rev-parse", "--show-toplevel", "HEAD"],
                               capture_output=True, text=True, timeout=10)
        lines = found.stdout.splitlines()
        # An installed package can sit inside some other repository (a venv in a project): not ours.
        if found.returncode or len(lines) != 2 or Path(lines[0]).resolve() != root:
            return None
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):  # no git on this machine
        return None
    return lines[1] + ("-dirty" if dirty else "")


def _package_version() -> str:
    try:
        return metadata.version("gpuburnout")
    except metadata.PackageNotFoundError:
        return "unknown"
