"""burnout/train/run.py: one process writes a run folder. The same `burnout train` started twice on one folder (a
spot machine's boot script run twice) refuses the second in one line naming the first (PID, command line); a first
killed with SIGKILL leaves the folder free; a resume takes the same lock."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import yaml

from burnout.cli import main

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}


def _error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and err.startswith("burnout: error: "), err
    return err.strip()


def test_the_boot_command_run_twice_refuses_the_second_and_a_killed_first_frees_the_folder(tiny_run, tmp_path,
                                                                                            capsys):
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(tiny_run.cfg.to_dict()))
    run = tmp_path / "run"
    # Long enough to be running when the second starts; no checkpoint, and a cap should the lock ever fail.
    boot = ["train", str(config), "--out", str(run), "--data", str(tiny_run.data_dir), "--resume-if-exists",
            "train.max_steps=100000", "train.ckpt_interval=100000", "train.log_interval=1", "train.max_minutes=3"]
    first = subprocess.Popen([sys.executable, "-m", "burnout", *boot], stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True, env=ENV)
    try:
        for line in first.stdout:
            if line.startswith("step 1/"):  # training: the folder's lock was taken before anything was written
                break
        assert main(boot) == 2
        line = _error_line(capsys)
        assert f"{run} is being written by burnout process {first.pid} (" in line, line
        assert f"train {config} --out {run}" in line, line
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=60)
    # The kernel let go of the dead process's lock: the same command resumes the run (ending it sooner).
    assert main([*boot, "train.max_steps=3"]) == 0
    assert "done: step 3" in capsys.readouterr().out


def test_a_resume_is_refused_while_another_process_writes_the_run(tiny_run, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(tiny_run.run_dir, run)
    holder = subprocess.Popen([sys.executable, "-c", "import sys; from burnout.common import FolderLock; "
                               "FolderLock(sys.argv[1]); print('held', flush=True); sys.stdin.read()", str(run)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=ENV)
    try:
        assert holder.stdout.readline() == "held\n"
        before = sorted(p.name for p in run.iterdir())
        assert main(["train", "--resume", str(run), "train.max_steps=30"]) == 2
        assert f"{run} is being written by burnout process {holder.pid} (" in _error_line(capsys)
        assert sorted(p.name for p in run.iterdir()) == before  # refused before resumes.jsonl was written
    finally:
        holder.kill()
        holder.wait(timeout=60)


def test_a_run_killed_while_it_prepares_its_data_is_resumed_by_the_command_resume_names(shared_data, tmp_path, capsys):
    """`burnout train CONFIG --out RUN` killed (SIGKILL) while it prepares the config's sources into RUN/data:
    `--resume RUN` has no config to go on with, so it names the command that started it, in one line; that
    command, run again, goes on with the preparation and trains."""
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({
        "model": {"family": "llama", "n_layer": 1, "d_model": 32, "n_head": 2, "n_kv_head": 2, "context_length": 32,
                  "ffn_multiple_of": 32},
        "data": {"sources": [{"name": "wiki", "kind": "text", "path": str(shared_data / "wikitext2/wiki.test.raw")}],
                 "max_chars": 1_300_000},
        "tokenizer": {"kind": "bpe", "vocab_size": 2048},
        "train": {"device": "cpu", "precision": "fp32", "batch_size": 2, "seq_len": 32, "max_steps": 2,
                  "sample_tokens": 0, "eval_batches": 1}}))
    run = tmp_path / "run"
    argv = ["train", str(config), "--out", str(run)]
    proc = subprocess.Popen([sys.executable, "-m", "burnout", *argv], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env=ENV)
    try:  # the data folder's manifest is written first, then the tokenizer trains for a while
        while proc.poll() is None and not (run / "data" / "manifest.json").exists():
            pass
    finally:
        proc.kill()
        proc.wait(timeout=60)
    assert not (run / "config.yaml").exists() and not (run / "data" / "meta.json").exists()
    assert main(["train", "--resume", str(run)]) == 2
    line = _error_line(capsys)
    assert "no training started there yet: it was stopped while preparing its data" in line, line
    command = line.split("run the command that started it again (")[1].split("), which goes on")[0]
    assert shlex.split(command) == ["burnout", *argv], line
    assert main(shlex.split(command)[1:]) == 0
    assert "done: step 2" in capsys.readouterr().out
