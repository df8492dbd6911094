"""burnout/train/run.py: one process writes a run folder. The same `burnout train` started twice on one folder (a
spot machine's boot script run twice) refuses the second in one line naming the first (PID, command line); a first
killed with SIGKILL leaves the folder free; a resume takes the same lock. A run names data inside its folder relative
to it, so a copy resumes on its own copy; a resume refuses, in one line, data that are gone or other than the run's."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from burnout.cli import main
from burnout.train.provenance import read_launches

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}


def _error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and err.startswith("burnout: error: "), err
    return err.strip()


@pytest.mark.slow
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
    holder = subprocess.Popen([sys.executable, "-c", "import sys; from burnout.base.folders import FolderLock; "
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


@pytest.mark.slow
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


# ----------------------------------------------------------------------------------------------
# A run's data: named relative to the run folder when they live in it, checked when it resumes


@pytest.fixture(scope="module")
def own_data_run(tmp_path_factory, tiny_run_config) -> Path:
    """A 2-step run whose config's sources `burnout train` prepared into RUN/data (no --data). Copy it first."""
    root = tmp_path_factory.mktemp("own_data_run")
    config = root / "run.yaml"
    cfg = tiny_run_config(max_steps=2, ckpt_interval=2, eval_interval=2).to_dict()
    cfg["data"]["max_chars"] = 60_000
    config.write_text(yaml.safe_dump(cfg))
    assert main(["train", str(config), "--out", str(root / "run")]) == 0
    return root / "run"


def _resume(run: Path, *overrides: str) -> int:
    return main(["train", "--resume", str(run), "train.max_steps=4", *overrides])


@pytest.mark.slow
def test_a_run_names_its_own_data_relative_to_itself_and_a_copy_resumes_on_its_copy(own_data_run, tmp_path,
                                                                                     capsys):
    original, copy = tmp_path / "original", tmp_path / "copy"
    shutil.copytree(own_data_run, original)
    for config in (original / "config.yaml", *original.glob("checkpoints/step_*/config.yaml")):
        assert yaml.safe_load(config.read_text())["data"]["prepared_dir"] == "data", config
    shutil.copytree(original, copy)
    shutil.rmtree(original / "data")  # the original's data gone: the copy must not need them
    capsys.readouterr()
    assert _resume(copy) == 0
    out = capsys.readouterr().out
    assert f"data: {copy / 'data'} (the data the run trained on, checked)" in out, out
    assert "done: step 4" in out
    assert [launch["data"]["dir"] for launch in read_launches(copy)] == [str((own_data_run / "data").resolve()),
                                                                         str((copy / "data").resolve())]
    assert main(["eval", str(copy), "--tasks", "val"]) == 0  # its checkpoints name the copy's data too


def test_a_copy_whose_data_were_deleted_is_refused_in_one_line_and_resumes_where_they_are(own_data_run, tmp_path,
                                                                                           capsys):
    copy = tmp_path / "copy"
    shutil.copytree(own_data_run, copy)
    shutil.rmtree(copy / "data")
    before = _snapshot(copy)
    capsys.readouterr()
    assert _resume(copy) == 2
    line = _error_line(capsys)
    assert f"--resume {copy}: its data folder {copy / 'data'} (data.prepared_dir) is gone" in line, line
    assert f"burnout train --resume {copy} data.prepared_dir=DIR" in line, line
    assert _snapshot(copy) == before
    assert main(["eval", str(copy), "--tasks", "val"]) == 2
    assert f"the data it trained on, {copy / 'data'} (data.prepared_dir), are gone" in _error_line(capsys)
    # Where they are now (the original's, the same data): the resume goes on as the original's own resume does.
    original = tmp_path / "original"
    shutil.copytree(own_data_run, original)
    assert _resume(copy, f"data.prepared_dir={original / 'data'}") == 0
    assert f"data: {original / 'data'} (the data the run trained on, checked)" in capsys.readouterr().out
    assert _resume(original) == 0
    step = "checkpoints/step_0000004/model.safetensors"
    assert (copy / step).read_bytes() == (original / step).read_bytes()


def test_a_resume_on_other_data_of_the_same_tokenizer_is_refused(own_data_run, tmp_path, capsys):
    copy, other = tmp_path / "copy", tmp_path / "other"
    shutil.copytree(own_data_run, copy)
    # Other text, encoded with the run's own tokenizer: the check of the tokenizer alone lets it through.
    (tmp_path / "notes.txt").write_text("\n\n".join(f"note {i}: " + "words and more words " * (i % 9 + 1)
                                                    for i in range(400)))
    assert main(["data", "prepare", str(tmp_path / "notes.txt"), "--out", str(other), "--tokenizer",
                 str(copy / "data")]) == 0
    assert (other / "tokenizer.json").read_bytes() == (copy / "data" / "tokenizer.json").read_bytes()
    before = _snapshot(copy)
    capsys.readouterr()
    assert _resume(copy, f"data.prepared_dir={other}") == 2
    line = _error_line(capsys)
    assert f"--resume {copy}: {other} holds other data than the run trained on" in line, line
    assert f"those its last launch recorded, in {(own_data_run / 'data').resolve()}" in line, line
    assert _snapshot(copy) == before


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("name, setting", [("launches.jsonl", "--out"), ("metrics.jsonl", "--out"),
                                           ("launches.jsonl", "train.mirror_dir")])
def test_a_file_of_yours_under_a_run_logs_name_is_not_appended_to(tiny_run, tmp_path, capsys, name, setting):
    """A folder without .burnout.json is a run's (or a mirror's) by its checkpoints or logs in burnout's own format:
    a launches.jsonl or metrics.jsonl of your own leaves it yours, refused in one line as export refuses one."""
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(tiny_run.cfg.to_dict()))
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / name).write_text('{"step": 1, "loss": 2.5, "note": "my own log"}\n')
    out, extra = (mine, []) if setting == "--out" else (tmp_path / "run", [f"train.mirror_dir={mine}"])
    before = _snapshot(tmp_path)
    assert main(["train", str(config), "--out", str(out), "--data", str(tiny_run.data_dir), "train.max_steps=1",
                 *extra]) == 2
    assert f"{setting} {mine} holds files that are not burnout's ({name})" in _error_line(capsys)
    assert _snapshot(tmp_path) == before


def test_resuming_a_start_point_grown_from_imported_weights_is_one_line(tiny_run, tmp_path, capsys):
    """Imported weights name no data: a model grown from them neither, and its resume is one line, not a crash."""
    assert main(["export", str(tiny_run.run_dir), "--to", str(tmp_path / "hf")]) == 0
    assert main(["import", str(tmp_path / "hf"), "--to", str(tmp_path / "imported")]) == 0
    grown = tmp_path / "grown"
    assert main(["grow", str(tmp_path / "imported"), "--out", str(grown), "model.n_layer=3"]) == 0
    capsys.readouterr()
    assert main(["train", "--resume", str(grown)]) == 2
    line = _error_line(capsys)
    assert f"--resume {grown}: its config.yaml names no data (data.prepared_dir)" in line, line
    assert f"burnout train --init-from {grown} --data DIR --out NEW_RUN" in line, line
