"""Disk full while saving a checkpoint: `burnout train --resume` under RLIMIT_FSIZE (files may not grow past
64 KB, SIGXFSZ ignored so writes fail with EFBIG as they would with ENOSPC) gives one clear line and exit
code 74, leaves the previous checkpoint intact and loadable and no temporary folder behind, and the same
command without the limit continues the run."""

import hashlib
import resource
import shutil
import signal
import subprocess
import sys

import pytest

from burnout.core.checkpoint import list_checkpoints, load_checkpoint

pytestmark = pytest.mark.slow  # every test here trains, installs or drives a browser: not in `make test-fast`

LIMIT_BYTES = 64 * 1024  # config, metrics and logs fit; the weights (~300 KB) do not


def _full_disk():
    resource.setrlimit(resource.RLIMIT_FSIZE, (LIMIT_BYTES, LIMIT_BYTES))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)


def _tree(path):
    return {str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(path.rglob("*")) if p.is_file()}


def test_disk_full_while_saving_keeps_the_previous_checkpoint(tiny_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(tiny_run.run_dir, run)
    before = list_checkpoints(run)
    assert before[-1].name == "step_0000024"
    checkpoints_before = {p.name: _tree(p) for p in before}
    cmd = [sys.executable, "-m", "burnout", "train", "--resume", str(run), "train.max_steps=26"]

    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, preexec_fn=_full_disk)
    assert proc.returncode == 74, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("burnout: error: could not write checkpoint step_0000026"), lines[0]
    assert "File too large" in lines[0] and "step_0000024, which is intact" in lines[0] and "--resume" in lines[0]

    # The previous checkpoints are byte for byte what they were, load, and no half-written folder is left.
    assert {p.name: _tree(p) for p in list_checkpoints(run)} == checkpoints_before
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == sorted(checkpoints_before)
    assert load_checkpoint(run).info["step"] == 24

    # With space again, the same command continues from step 24.
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert list_checkpoints(run)[-1].name == "step_0000026"
