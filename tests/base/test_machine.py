"""retain_freed_memory (repeated training steps stop page-faulting their activations in afresh), available_memory
(the kernel's MemAvailable, a cgroup's limit), and the idle cores."""

import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from burnout.base import machine

_STEP_FAULTS = """
import ctypes, resource, sys
from burnout.base.machine import retain_freed_memory
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
    from burnout.base.machine import available_memory

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


def test_the_idle_cores_are_measured_between_none_and_every_core():
    idle = machine.idle_cores(0.1)
    assert idle is not None and 0 <= idle <= os.cpu_count()
