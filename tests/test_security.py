"""Nothing from outside is unpickled, and the playground serves only what it was given.

A checkpoint's weights are safetensors; its other state is read with torch.load(weights_only=True), so a
state.pt carrying a pickle whose __reduce__ would run a command is refused with one line, and the command
never runs — in both the raw-pickle and torch's zip format, through the API and the real CLI.
"""

import json
import os
import pickle
import shutil
import subprocess
import sys

import pytest
import torch

from burnout.base.files import sha256_file
from burnout.core.checkpoint import MANIFEST_FILE, list_checkpoints, load_checkpoint
from burnout.errors import BurnoutError
from burnout.playground.catalog import ModelCache, discover


class Payload:
    """Unpickling this runs a shell command that creates `marker`."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return os.system, (f"echo pwned > '{self.marker}'",)


def _poisoned_checkpoint(sampled_runs, tmp_path, fmt):
    run = tmp_path / "run"
    shutil.copytree(sampled_runs[0], run)
    ckpt = list_checkpoints(run)[-1]
    marker = tmp_path / "PWNED"
    if fmt == "raw-pickle":
        (ckpt / "state.pt").write_bytes(pickle.dumps({"step": 24, "optimizer": Payload(marker)}))
    else:  # torch's zip format, the payload inside data.pkl
        torch.save({"step": 24, "optimizer": Payload(marker)}, ckpt / "state.pt")
    # Whoever can write the file can write its recorded sha256 too: only weights_only stands in the way.
    manifest = json.loads((ckpt / MANIFEST_FILE).read_text())
    (ckpt / MANIFEST_FILE).write_text(json.dumps({**manifest, "state.pt": sha256_file(ckpt / "state.pt")}))
    assert not marker.exists()
    return run, ckpt, marker


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["raw-pickle", "torch-zip"])
def test_a_malicious_pickle_in_state_pt_is_refused_and_never_runs(sampled_runs, tmp_path, fmt):
    run, ckpt, marker = _poisoned_checkpoint(sampled_runs, tmp_path, fmt)
    with pytest.raises(BurnoutError) as refused:
        load_checkpoint(ckpt)
    assert str(refused.value) == (f"checkpoint {ckpt} is unreadable: state.pt (UnpicklingError: it holds objects other "
                                  "than tensors, which are never unpickled); use another checkpoint of the run or "
                                  "train again")
    assert not marker.exists()

    # Through the real CLI: one command per format keeps the interpreter start-ups to two.
    command = {"raw-pickle": ["generate", str(run), "--prompt", "The ", "--max-new-tokens", "4"],
               "torch-zip": ["train", "--resume", str(run), "train.max_steps=30"]}
    for argv in [command[fmt]]:
        proc = subprocess.run([sys.executable, "-m", "burnout", *argv], capture_output=True, text=True, timeout=300)
        assert proc.returncode == 2, proc.stderr[-2000:]
        lines = proc.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("burnout: error: checkpoint "), proc.stderr
        assert "state.pt" in lines[0] and "Traceback" not in proc.stderr
        assert not marker.exists(), "the pickle's payload ran"


def test_playground_serves_only_the_checkpoints_it_was_given(sampled_runs, tmp_path):
    fast, slow = sampled_runs
    entries = discover([fast])
    assert all(e.path.is_relative_to(fast.resolve()) for e in entries.values())
    cache = ModelCache(entries, 2**30)
    # A request names a label; a path — inside or outside the served run — is not one.
    for label in (str(list_checkpoints(slow)[-1]), str(list_checkpoints(fast)[-1]), "../slow/checkpoints/step_0000024",
                  "/etc/passwd", "fast · step 24/../../slow", ""):
        with pytest.raises(BurnoutError, match="unknown checkpoint"):
            cache.get(label)
    assert cache.cached_labels() == []
    assert cache.get("fast · step 24").model is not None
