"""The names of what data and run folders hold, and how a file there is written and read: atomically (the old
file or the new one, never half), JSON lines that survive a torn last line, sha256 of large files.

In one place so that a name means one file everywhere, and every stage writes in a way a kill cannot damage.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import stat
from collections.abc import Callable
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
# A run folder's checkpoints: RUN/checkpoints/step_N (burnout/core/checkpoint.py).
CHECKPOINT_DIR = "checkpoints"
# `burnout report`'s folder inside a run.
REPORT_DIR = "report"
# `burnout compare`'s table of the same prompts at each checkpoint, inside a run.
COMPARE_MD, COMPARE_JSON = "compare.md", "compare.json"
# `burnout data audit`'s findings, in DATA/audit/ for a prepared folder: its suspicious strings are looked for in
# training's samples.
AUDIT_DIR, AUDIT_JSON = "audit", "audit.json"
# The prompts a run samples at each evaluation (its train.sample_prompt, or words drawn from its val split), which
# every command that shows or suggests its samples reads (burnout/generate/prompts.py).
SAMPLE_PROMPTS_FILE = "sample_prompts.json"
# What a run folder holds besides its checkpoints and data: the record of the run, which train.mirror_dir
# keeps a copy of.
RUN_LOG_FILES = (RUN_CONFIG_FILE, METRICS_FILE, LAUNCHES_FILE, PHASES_FILE, RESUMES_FILE, SAMPLE_PROMPTS_FILE)


def tokenizer_file(path: str | Path) -> Path:
    """The tokenizer.json at `path`, or inside the folder `path` (a data folder, a checkpoint, an HF folder)."""
    path = Path(path)
    if path.is_dir():
        path = path / TOKENIZER_FILE
    if not path.is_file():
        raise BurnoutError(f"tokenizer file '{path}' does not exist; give the path of a {TOKENIZER_FILE}")
    return path


def write_atomic(path: str | Path, data: str | bytes) -> None:
    """Write `data` (text as UTF-8, or bytes) to a temporary name beside `path`, then rename it over
    `path`: a reader, or a crash, sees the old file or the new one, never half of one."""
    write_atomic_with(path, lambda tmp: tmp.write_text(data, encoding="utf-8") if isinstance(data, str)
                      else tmp.write_bytes(data))


def write_atomic_with(path: str | Path, write: Callable[[Path], object]) -> None:
    """write_atomic for a file another library writes: `write(tmp)` writes it at a temporary name beside `path`,
    which is then renamed over `path`. The file gets the mode any new file gets here (the umask applied), however
    `write` made it: safetensors writes through a private temporary file of its own, mode 0600."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        tmp.unlink(missing_ok=True)  # one a killed process of this PID left, with whatever mode it had
        tmp.touch()
        mode = stat.S_IMODE(tmp.stat().st_mode)
        write(tmp)
        os.chmod(tmp, mode)
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
    return [record for _, record in numbered_jsonl(path)]


def numbered_jsonl(path: str | Path) -> list[tuple[int, dict]]:
    """(line number, record) of every record of a JSON-lines file ([] when it does not exist), skipping blank
    and torn lines: for a reader that names the line of a record it cannot use."""
    path = Path(path)
    if not path.is_file():
        return []
    records = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            records.append((number, json.loads(line)))
        except ValueError:  # a line torn by a kill while it was written
            continue
    return records


def user_cache_dir() -> Path:
    """$BURNOUT_CACHE_DIR, else $XDG_CACHE_HOME/gpuburnout or ~/.cache/gpuburnout: what burnout keeps for the user
    between commands (measurements, the traces of internal errors)."""
    root = os.environ.get("BURNOUT_CACHE_DIR") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache",
                                                       "gpuburnout")
    return Path(root)


def not_a_file_or_folder(path: str | Path) -> str | None:
    """What `path` is when it exists but is neither a file nor a folder ("a named pipe (FIFO)", "a socket", "a
    device"), for a line that says so instead of "does not exist"; None otherwise."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    if stat.S_ISFIFO(mode):
        return "a named pipe (FIFO)"
    return "a socket" if stat.S_ISSOCK(mode) else "a device"
