"""What the machine has to give a command: memory available now, idle cores, glibc's malloc kept from returning
freed blocks, OpenMP's wait for a machine whose every core is busy.

Read before torch loads or a size is chosen, so that a run fits the memory and shares busy cores fairly.
"""

from __future__ import annotations

import functools
import os
import sys
import time
from pathlib import Path

# mallopt(3)'s parameter numbers, and the largest mmap threshold glibc accepts on 64-bit.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _MMAP_THRESHOLD_MAX = -1, -3, 32 << 20


def available_memory(meminfo: Path = Path("/proc/meminfo"), cgroup: Path = Path("/sys/fs/cgroup")) -> int | None:
    """Bytes of memory the kernel can hand out now without swapping (Linux: /proc/meminfo's MemAvailable), and no
    more than the process's cgroup (a container's memory limit) has left: its limit less its use, the cache it
    would drop first (inactive files) not counted as used."""
    found = None
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found = int(line.split()[1]) * 1024
    except OSError:  # not Linux
        pass
    # cgroup v2, then v1: (limit, usage, memory.stat's key for inactive file pages)
    for limit, usage, inactive in (("memory.max", "memory.current", "inactive_file"),
                                   ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes",
                                    "total_inactive_file")):
        try:
            cap = int((cgroup / limit).read_text())  # "max" (no limit) is not a number
            used = int((cgroup / usage).read_text())
            stat = dict(line.split() for line in (cgroup / limit).with_name("memory.stat").read_text().splitlines())
        except (OSError, ValueError):
            continue
        left = max(0, cap - used + int(stat.get(inactive, 0)))
        return left if found is None else min(found, left)
    return found


def retain_freed_memory() -> bool:
    """Have glibc's malloc keep freed blocks up to 32 MiB in the heap instead of returning them to the kernel.

    By default each step's large activations are fresh mmap'd (or re-grown heap) pages that fault in zeroed,
    every step, at a cost in kernel time (docs/PERFORMANCE.md); none once the blocks are kept. The process's
    memory then stays at its peak instead of shrinking between steps. Returns whether it applied (Linux with
    glibc only).
    """
    import ctypes
    import platform

    if platform.libc_ver()[0] != "glibc":
        return False
    libc = ctypes.CDLL(None)
    return bool(libc.mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_MAX) and libc.mallopt(_M_TRIM_THRESHOLD, 1 << 30))


def idle_cores(interval: float = 0.2) -> float | None:
    """The cores idle over the next `interval` seconds, this process's own use counted as idle (/proc/stat and
    /proc/self/stat); None where those are not there."""
    try:
        before = _cpu_times()
        time.sleep(interval)
        after = _cpu_times()
    except (OSError, ValueError, IndexError):
        return None
    idle, total, own = (b - a for a, b in zip(before, after))
    cores = os.cpu_count()
    if total <= 0 or not cores:
        return None
    return min(cores, (idle + own) / total * cores)


def _cpu_times() -> tuple[int, int, int]:
    """(idle, total) clock ticks of all cores since boot, and this process's own (user + system)."""
    cpu = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    own = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
    return cpu[3] + cpu[4], sum(cpu), int(own[11]) + int(own[12])


@functools.cache
def idle_cores_at_start() -> float | None:
    """idle_cores, measured once per process: what a command's CPU threads are chosen by."""
    return idle_cores()


def spare_busy_cores() -> None:
    """For a command that computes on the CPU, before torch loads: where other programs keep every core busy,
    torch's threads are to sleep while they wait for each other (OpenMP's passive wait) instead of spinning, so each
    gives its core back to the program beside it and runs in its own share of that core; core/device.use_idle_cores
    then keeps a thread per core. On an idle machine spinning is faster, and stays (docs/PERFORMANCE.md, "The
    quickstart"). OMP_WAIT_POLICY or OMP_NUM_THREADS, when set, decide instead."""
    if "torch" in sys.modules or {"OMP_WAIT_POLICY", "OMP_NUM_THREADS"} & set(os.environ):
        return  # OpenMP reads its wait policy once, when torch loads it
    idle = idle_cores_at_start()
    if idle is not None and idle < 0.5:
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
