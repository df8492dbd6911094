"""Helpers every stage shares: file names and special tokens, atomic writes, JSON lines, file sha256, error text.

It imports nothing from burnout but errors, so any module may import it.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
from pathlib import Path

from burnout.errors import BurnoutError

# The document separator every tokenizer here carries (GPT-2's end-of-text token).
EOT_TOKEN = "<|endoftext|>"

# Names inside data folders, run folders and checkpoints.
TOKENIZER_FILE = "tokenizer.json"
RUN_CONFIG_FILE = "config.yaml"
METRICS_FILE = "metrics.jsonl"
PHASES_FILE = "phases.jsonl"
LAUNCHES_FILE = "launches.jsonl"
# One line per resume that changed the config: when, the overrides, and the values they changed.
RESUMES_FILE = "resumes.jsonl"
# `burnout report`'s folder inside a run.
REPORT_DIR = "report"
# `burnout compare`'s table of the same prompts at each checkpoint, inside a run.
COMPARE_MD, COMPARE_JSON = "compare.md", "compare.json"
# `burnout data audit`'s findings, in DATA/audit/ for a prepared folder: its suspicious strings are looked for in
# training's samples.
AUDIT_DIR, AUDIT_JSON = "audit", "audit.json"
# What a run folder holds besides its checkpoints and data: the record of the run, which train.mirror_dir
# keeps a copy of.
RUN_LOG_FILES = (RUN_CONFIG_FILE, METRICS_FILE, LAUNCHES_FILE, PHASES_FILE, RESUMES_FILE)


def tokenizer_file(path: str | Path) -> Path:
    """The tokenizer.json at `path`, or inside the folder `path` (a data folder, a checkpoint, an HF folder)."""
    path = Path(path)
    if path.is_dir():
        path = path / TOKENIZER_FILE
    if not path.is_file():
        raise BurnoutError(f"tokenizer file '{path}' does not exist; give the path of a {TOKENIZER_FILE}")
    return path


def unwrapped(model):
    """The module inside torch.compile's and DDP's wrappers (torch-free: the wrappers are told by their
    attributes), whose parameter names carry no `_orig_mod.` or `module.` prefix."""
    while True:
        inner = getattr(model, "_orig_mod", None)
        if inner is None and type(model).__name__ == "DistributedDataParallel":
            inner = model.module
        if inner is None:
            return model
        model = inner


def kind_of(value) -> str:
    """What a value from a user's file is, for an error line: "empty", or its type's name."""
    return "empty" if value in ("", [], {}, None) else type(value).__name__


def write_atomic(path: str | Path, data: str | bytes) -> None:
    """Write `data` (text as UTF-8, or bytes) to a temporary name beside `path`, then rename it over
    `path`: a reader, or a crash, sees the old file or the new one, never half of one."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        if isinstance(data, str):
            tmp.write_text(data, encoding="utf-8")
        else:
            tmp.write_bytes(data)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def sha256_file(path: str | Path) -> str:
    """The sha256 of a file's bytes, read in 16 MB pieces (checkpoints and shards run to gigabytes)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            digest.update(chunk)
    return digest.hexdigest()


def append_jsonl(path: str | Path, record: dict) -> None:
    """Append `record` as one JSON line. Non-finite floats are written as null (JSON has no NaN).

    A process killed mid-append leaves a last line without its newline; the record after it starts
    on a fresh line, so one torn line costs only itself (read_jsonl skips it).
    """
    path = Path(path)
    clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}
    torn = False
    if path.exists() and path.stat().st_size:
        with path.open("rb") as f:
            f.seek(-1, os.SEEK_END)
            torn = f.read(1) != b"\n"
    with path.open("a", encoding="utf-8") as f:
        f.write(("\n" if torn else "") + json.dumps(clean, default=str) + "\n")


def read_jsonl(path: str | Path) -> list[dict]:
    """Every record of a JSON-lines file ([] when it does not exist), skipping blank and torn lines."""
    path = Path(path)
    if not path.is_file():
        return []
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except ValueError:  # a line torn by a kill while it was written
            continue
    return records


def is_finite_number(value) -> bool:
    """A real, finite int or float (a logged loss can be NaN, null or missing)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def checked_number(where: str, value, *, integer: bool = False, low: float | None = None,
                   high: float | None = None, low_open: bool = False) -> int | float:
    """`value` (a number, or a string as a flag gives it) as a finite number within [low, high] ((low, high] with
    `low_open`), a whole one with `integer`; else a one-line BurnoutError that begins with `where` (if given).

    Written so that NaN fails it: every comparison with NaN is false, so `value < low` alone lets it through.
    """
    shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
    kind = "a whole number" if integer else "a number"

    def refuse(problem: str) -> BurnoutError:
        return BurnoutError(f"{where}: {problem}" if where else problem)

    number = value
    if isinstance(value, str):
        try:
            number = int(value) if integer else float(value)
        except ValueError:
            number = None
    if not isinstance(number, (int, float)) or isinstance(number, bool):
        raise refuse(f"{shown} is not {kind}")
    if integer and isinstance(number, float) and number.is_integer():
        number = int(number)
    elif integer and not isinstance(number, int):
        raise refuse(f"{shown} is not {kind}")
    if not integer:
        number = float(number) if abs(number) <= sys.float_info.max else math.inf  # float() of a huge int raises
    if isinstance(number, float) and not math.isfinite(number):
        raise refuse(f"{shown} is not a finite number")
    below = low is not None and (number <= low if low_open else number < low)
    if below or (high is not None and number > high):
        if high is None:
            bound = f"more than {low:g}" if low_open else f"at least {low:g}"
        elif low is None:
            bound = f"at most {high:g}"
        else:
            bound = f"in {'(' if low_open else '['}{low:g}, {high:g}]"
        raise refuse(f"{shown} must be {bound}")
    return number


def first_line(error: BaseException | str, limit: int = 200) -> str:
    """The first non-empty line of an error's message (at most `limit` characters), or the
    exception's type name when the message is empty: error text fit for a one-line message."""
    text = str(error).strip()
    if not text:
        return type(error).__name__ if isinstance(error, BaseException) else ""
    return text.splitlines()[0][:limit]


def format_bytes(count: int) -> str:
    """'512 B', '3.4 MB', '12.0 GB' (powers of 1000, as `df -H` prints them)."""
    units = ("B", "kB", "MB", "GB", "TB")
    power = min(int(math.log10(max(count, 1)) // 3), len(units) - 1)
    return f"{count / 1000 ** power:.1f} {units[power]}" if power else f"{count} B"


def format_duration(seconds: float) -> str:
    """'1h05m' from an hour up, else '4m07s'."""
    seconds = int(seconds)
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 60}m{seconds % 60:02d}s"


# mallopt(3)'s parameter numbers, and the largest mmap threshold glibc accepts on 64-bit.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _MMAP_THRESHOLD_MAX = -1, -3, 32 << 20


def available_memory(meminfo: Path = Path("/proc/meminfo")) -> int | None:
    """Bytes of memory the kernel can hand out now without swapping (Linux: /proc/meminfo's MemAvailable)."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:  # not Linux
        pass
    return None


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
