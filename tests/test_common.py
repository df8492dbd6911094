"""Shared helpers: write_atomic (the old file or the new one, never half of one, no temporary left), and
retain_freed_memory (repeated training steps stop page-faulting their activations in afresh), and
available_memory (the kernel's MemAvailable, a cgroup's limit)."""

import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from burnout import common
from burnout.common import FolderLock, write_atomic
from burnout.errors import BurnoutError


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


_STEP_FAULTS = """
import ctypes, resource, sys
from burnout.common import retain_freed_memory
if sys.argv[1] == "retain":
    assert retain_freed_memory()
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.free.argtypes = ctypes.c_void_p, [ctypes.c_void_p]
def step():  # a training step's activations, in small: blocks written in full, then all freed
    blocks = [libc.malloc(4 << 20) for _ in range(8)]
    for block in blocks:
        ctypes.memset(block, 1, 4 << 20)
    for block in blocks:
        libc.free(block)
step(); step()
for _ in range(5):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    step()
    print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_retained_freed_memory_ends_the_page_faults_of_repeated_steps():
    """Steps that each write and free 8 blocks of 4 MiB, as a training step does its activations, after two
    warm-up ones. With glibc's defaults the first freed block raises the mmap threshold to its size and the
    trim threshold to twice that, so the 32 MiB freed at the heap's top go back to the kernel and every step
    faults them in again (8,160 faults a step on an AVX2 EPYC); kept in the heap, no step faults.

    The blocks come from malloc itself, not torch: within a real step Python's and torch's small allocations
    split the freed blocks, so how many steps fault before the heap settles differs from machine to machine
    (a 4-layer GPT's fp32 steps: thousands of faults each on one, none on CI's)."""
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES" and not k.startswith("MALLOC_")}

    def median_faults(mode: str) -> int:
        out = subprocess.run([sys.executable, "-c", _STEP_FAULTS, mode], env=env, check=True, capture_output=True,
                             text=True)
        return statistics.median(int(n) for n in out.stdout.split())

    # Under transparent huge pages a fault maps 2 MiB, so the default's count may be as low as 16.
    assert median_faults("default") >= 16
    assert median_faults("retain") == 0


def test_available_memory_reads_the_kernels_figure(tmp_path):
    """MemAvailable in bytes; None without the line or the file (not Linux); on Linux, within the machine's total."""
    from burnout.common import available_memory

    fake, none = tmp_path / "meminfo", tmp_path / "no-cgroup"
    fake.write_text("MemTotal:       16384000 kB\nMemFree:         1000000 kB\nMemAvailable:    8192000 kB\n")
    assert available_memory(fake, none) == 8192000 * 1024
    # A container's cgroup (v2) with 1 GB left of its 3 GB, 0.5 GB of it cache it would drop: 1.5 GB.
    cgroup = tmp_path / "cgroup"
    cgroup.mkdir()
    (cgroup / "memory.max").write_text("3000000000\n")
    (cgroup / "memory.current").write_text("2000000000\n")
    (cgroup / "memory.stat").write_text("anon 1500000000\ninactive_file 500000000\n")
    assert available_memory(fake, cgroup) == 1_500_000_000
    (cgroup / "memory.max").write_text("max\n")  # no limit: the kernel's figure
    assert available_memory(fake, cgroup) == 8192000 * 1024
    fake.write_text("MemTotal:       16384000 kB\n")
    assert available_memory(fake, none) is None
    assert available_memory(tmp_path / "missing", none) is None
    if sys.platform.startswith("linux"):
        meminfo = Path("/proc/meminfo").read_text().splitlines()
        total = int(next(line for line in meminfo if line.startswith("MemTotal:")).split()[1]) * 1024
        assert 0 < available_memory() <= total


def test_a_lock_file_removed_by_its_holder_after_another_writer_opened_it_is_not_taken_as_the_lock(tmp_path,
                                                                                                  monkeypatch):
    """FolderLock.release removes the lock file while still holding it. A writer that opened the file just before
    then gets its flock, on a file no longer in the folder: it must start over on the folder's own file, or two
    writers would each hold a lock."""
    first = FolderLock(tmp_path)
    real_flock = common.fcntl.flock

    def holder_lets_go_first(fd, operation):  # between the second writer's open and its flock
        monkeypatch.setattr(common.fcntl, "flock", real_flock)
        first.release()
        return real_flock(fd, operation)

    monkeypatch.setattr(common.fcntl, "flock", holder_lets_go_first)
    second = FolderLock(tmp_path)
    try:
        with pytest.raises(BurnoutError, match=f"^{tmp_path} is being written by burnout process {os.getpid()} "):
            FolderLock(tmp_path)
    finally:
        second.release()


def test_a_command_that_needs_an_extra_says_how_to_install_it_from_pypi_and_from_a_clone(tmp_path, monkeypatch,
                                                                                          capsys):
    """The line names the extra that holds the missing package (pyproject.toml, as installed), as both commands."""
    from importlib.metadata import requires

    from burnout.cli import main

    text = tmp_path / "notes.txt"
    text.write_text("Some words of a first document.\n\nSome words of a second one.\n")
    monkeypatch.setitem(sys.modules, "datasketch", None)  # import datasketch → ImportError
    monkeypatch.setitem(sys.modules, "gradio", None)
    monkeypatch.delitem(sys.modules, "burnout.playground.app", raising=False)  # imported again, without Gradio
    for argv, package, extra in ((["data", "audit", str(text), "--out", str(tmp_path / "audit")], "datasketch", "data"),
                                 (["playground", str(tmp_path)], "gradio", "playground")):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and f"needs {package}" in err.lower(), err
        assert f"pip install 'gpuburnout[{extra}]'" in err and f"pip install -e '.[{extra}]'" in err, err
        assert any(r.startswith(package) and f'extra == "{extra}"' in r for r in requires("gpuburnout")), extra


def test_the_idle_cores_are_measured_between_none_and_every_core():
    idle = common.idle_cores(0.1)
    assert idle is not None and 0 <= idle <= os.cpu_count()
