"""Shared helpers: write_atomic (the old file or the new one, never half of one, no temporary left), and
retain_freed_memory (repeated training steps stop page-faulting their activations in afresh)."""

import os
import platform
import statistics
import subprocess
import sys

import pytest

from burnout import common
from burnout.common import write_atomic


@pytest.mark.parametrize("data", ["naïve café ✓\n", b"\x00\xffbytes"])
def test_write_atomic_writes_text_as_utf8_or_bytes_as_they_are_and_leaves_nothing_else(tmp_path, data):
    path = tmp_path / "out.json"
    path.write_bytes(b"old")
    write_atomic(path, data)
    assert path.read_bytes() == (data.encode("utf-8") if isinstance(data, str) else data)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]


def test_a_write_that_fails_keeps_the_old_file_and_removes_its_temporary(tmp_path, monkeypatch):
    path = tmp_path / "out.json"
    path.write_bytes(b"old")
    seen = []

    def failing_replace(src, dst):
        seen.append((os.path.basename(src), (tmp_path / os.path.basename(src)).read_bytes()))
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(common.os, "replace", failing_replace)
    with pytest.raises(OSError, match="No space left"):
        write_atomic(path, "new")
    # The new bytes went to a hidden name beside the target, this process's own, and are gone with the failure.
    assert seen == [(f".out.json.tmp-{os.getpid()}", b"new")]
    assert path.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]


_STEPS_FAULTS = """
import resource, sys, torch
from burnout.common import retain_freed_memory
if sys.argv[1] == "retain":
    assert retain_freed_memory()
from burnout.config import ModelConfig
from burnout.models import Transformer
model = Transformer(ModelConfig(family="gpt2", vocab_size=65, n_layer=4, d_model=256, n_head=4, context_length=256,
                                dropout=0.1))
ids = torch.randint(0, 65, (16, 256))
def step():
    model(ids, ids).backward()
step(); step()
for _ in range(5):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    step()
    print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_retained_freed_memory_ends_the_page_faults_of_repeated_training_steps():
    """Five fp32 training steps of a small GPT (activations of up to 16 MiB, ~300 MiB a step) after two
    warm-up ones: with glibc's defaults each step's activations land on fresh pages (thousands of faults a
    step), once freed blocks stay in the heap most steps fault none. Medians: an occasional step faults in a
    new block either way (seen: 0 to 10K on an AVX2 EPYC)."""
    def median_faults(mode: str) -> int:
        out = subprocess.run([sys.executable, "-c", _STEPS_FAULTS, mode], check=True, capture_output=True, text=True)
        return statistics.median(int(n) for n in out.stdout.split())

    default, retained = median_faults("default"), median_faults("retain")
    assert default > 1000, default  # what there is to end
    assert retained * 10 < default, (retained, default)
