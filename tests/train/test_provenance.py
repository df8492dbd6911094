"""RUN/launches.jsonl: every start and resume records its command, code, versions, device and precision."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import torch

from burnout.base.files import LAUNCHES_FILE
from burnout.base.text import plural
from burnout.runs import resume_training
from burnout.train.provenance import git_commit, read_launches


def test_start_and_resume_each_record_a_launch(tiny_run, tmp_path, monkeypatch):
    run = tmp_path / "run"
    shutil.copytree(tiny_run.run_dir, run)
    [start] = read_launches(run)
    assert start["step"] == 0 and start["argv"] == sys.argv and start["world_size"] == 1
    assert start["versions"]["torch"] == torch.__version__
    assert start["device"].endswith(f", {plural(torch.get_num_threads(), 'thread')}")
    assert start["precision"] == tiny_run.cfg.train.precision == "fp32"  # what the steps ran in

    monkeypatch.setattr(sys, "argv", ["burnout", "train", "--resume", str(run), "train.max_steps=30"])
    resume_training(run, ["train.max_steps=30"], on_event=lambda line: None, progress=False)
    launches = read_launches(run)
    assert [launch["step"] for launch in launches] == [0, 24]
    assert launches[1]["argv"] == ["burnout", "train", "--resume", str(run), "train.max_steps=30"]
    assert launches[1]["precision"] == "fp32"


def test_git_commit_is_the_checkout_head():
    root = Path(__file__).resolve().parents[2]
    head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True)
    commit = git_commit()
    if head.returncode:  # run from an unpacked copy, not a checkout
        assert commit is None
    else:
        assert re.fullmatch(r"[0-9a-f]{40}(-dirty)?", commit) and commit.startswith(head.stdout.strip())


def test_a_torn_last_line_is_skipped(tiny_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(tiny_run.run_dir, run)
    with (run / LAUNCHES_FILE).open("a") as f:
        f.write('{"time": "2026-')  # killed while appending
    assert len(read_launches(run)) == 1
