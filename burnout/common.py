"""Helpers every stage shares: file names and special tokens, atomic writes, JSON lines, file sha256, error text,
and the output folders commands write: whose they are, and their one writer.

It imports nothing from burnout but errors, so any module may import it.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import math
import os
import shlex
import socket
import stat
import sys
import time
from collections.abc import Callable, Iterable, Iterator
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
# What a run folder holds besides its checkpoints and data: the record of the run, which train.mirror_dir
# keeps a copy of.
RUN_LOG_FILES = (RUN_CONFIG_FILE, METRICS_FILE, LAUNCHES_FILE, PHASES_FILE, RESUMES_FILE)
# In a folder a command made: the kind of output it holds and what that output is of ({"kind", "source"}), so
# that a later command tells its own folder from anyone else's (check_output_folder).
OWNER_FILE = ".burnout.json"
# In a run or data folder while a process writes it: the flock of its one writer, and who that is (FolderLock).
LOCK_FILE = ".burnout.lock"
# Each kind of output folder, as a refusal names it.
OUTPUT_KINDS = {"data": "prepared data", "run": "a run", "export": "a Hugging Face export", "audit": "a data audit",
                "report": "a report", "mirror": "a mirror"}
# The seeds a user gives (train.seed, data.seed, --seed, chat's /seed): what NumPy's legacy seeding, which
# seed_everything uses, accepts.
SEED_MAX = 2**32 - 1


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


def folder_owner(folder: str | Path) -> dict | None:
    """What OWNER_FILE says `folder` holds ({"kind", "source"}), or None where it says nothing."""
    try:
        owner = json.loads((Path(folder) / OWNER_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return owner if isinstance(owner, dict) and owner.get("kind") in OUTPUT_KINDS else None


def folder_contents(folder: str | Path) -> list[str]:
    """The names in `folder` besides OWNER_FILE and LOCK_FILE, sorted; [] when it does not exist."""
    try:
        return sorted(name for name in os.listdir(folder) if name not in (OWNER_FILE, LOCK_FILE))
    except (FileNotFoundError, NotADirectoryError):
        return []


def check_output_folder(folder: str | Path, label: str, kind: str, source: str | None = None, *,
                        reads: Iterable[str | Path] = (), overwrite: bool | None = None,
                        recognise: Callable[[Path], dict | None] | None = None) -> None:
    """Refuse, in one line, to write `kind` output (of `source`) into `folder` (named `label` in the line) unless it
    is new or empty, or holds that kind of output of the same source; of another source only with `overwrite`
    (None: the command has no --overwrite). `folder` must neither be nor hold a path of `reads`, what the command
    reads. `recognise(folder)` tells the {"kind", "source"} of a folder without an OWNER_FILE from its content
    (one made before it existed), or None. Writes nothing: a refusal leaves the folder as it was."""
    folder = Path(folder)
    noun = OUTPUT_KINDS[kind]
    for path in reads:
        if Path(path).exists() and Path(path).resolve().is_relative_to(folder.resolve()):
            relation = "is" if Path(path).resolve() == folder.resolve() else "holds"
            raise BurnoutError(f"{label} {folder} {relation} {path}, which this command reads; choose another folder "
                               f"for {noun}")
    if folder.is_file():
        raise BurnoutError(f"{label} {folder} is a file; give a folder for {noun}")
    contents = folder_contents(folder)
    if not contents:
        return
    owner = folder_owner(folder) or (recognise(folder) if recognise is not None else None)
    if owner is None:
        shown = ", ".join(contents[:3]) + (", ..." if len(contents) > 3 else "")
        raise BurnoutError(f"{label} {folder} holds files that are not burnout's ({shown}); choose a new or empty "
                           f"folder for {noun}")
    if owner["kind"] != kind:
        raise BurnoutError(f"{label} {folder} holds {OUTPUT_KINDS[owner['kind']]} made by burnout, not {noun}; "
                           "choose a new or empty folder")
    if source is not None and owner.get("source") != source and not overwrite:
        fix = "pass --overwrite to replace it, or choose another folder" if overwrite is not None else \
            "choose another folder"
        raise BurnoutError(f"{label} {folder} holds {noun} of {owner.get('source')}, not of {source}; {fix}")


def mark_folder(folder: str | Path, kind: str, source: str | None = None) -> None:
    """Make `folder` if need be and record in it (OWNER_FILE) that it holds `kind` output of `source`: in a folder
    still empty, or over a record that says otherwise. A folder its content tells as burnout's stays as it is."""
    folder, owner = Path(folder), {"kind": kind, "source": source}
    folder.mkdir(parents=True, exist_ok=True)
    found = folder_owner(folder)
    if found != owner and (found is not None or not folder_contents(folder)):
        write_atomic(folder / OWNER_FILE, json.dumps(owner) + "\n")


@contextlib.contextmanager
def writing_into(folder: str | Path, kind: str, source: str | None = None, lock: bool = False) -> Iterator[Path]:
    """`folder`, made if need be and marked (OWNER_FILE) as holding `kind` output of `source`, for the block to
    write; with `lock`, locked against any other writer (FolderLock) until the block ends. Check the folder with
    check_output_folder first. A block that fails having written nothing there takes the mark away again, and
    the folder if it made it."""
    folder = Path(folder)
    made = not folder.exists()
    held = FolderLock(folder) if lock else None
    try:
        mark_folder(folder, kind, source)
        yield folder
    except BaseException:
        if not folder_contents(folder):
            (folder / OWNER_FILE).unlink(missing_ok=True)
        raise
    finally:
        if held is not None:
            held.release()
        if made:
            with contextlib.suppress(OSError):  # removed only when empty: the block failed having written nothing
                folder.rmdir()


class FolderLock:
    """The one process writing a folder: an flock on FOLDER/.burnout.lock (LOCK_FILE), which records its holder
    (PID, host, command line) for a second writer's one-line refusal to name.

    The kernel drops an flock when the last descriptor of its file closes, which a process's end does however it
    ends (SIGKILL included): a dead writer never leaves its folder locked, and a lock file it leaves behind is
    locked again by the next writer. release() removes the file while still holding it; whoever opened the
    removed file meanwhile finds, once it has the lock, that the file is no longer the folder's, and starts over.
    """

    def __init__(self, folder: str | Path):
        self.path = Path(folder) / LOCK_FILE
        while True:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 4096, 0)
                os.close(fd)
                raise BurnoutError(_in_use(self.path.parent, holder)) from None
            try:
                if os.stat(self.path).st_ino == os.fstat(fd).st_ino:
                    break
            except FileNotFoundError:
                pass
            os.close(fd)
        os.ftruncate(fd, 0)
        holder = {"pid": os.getpid(), "host": socket.gethostname(), "command": shlex.join(sys.argv)}
        os.write(fd, json.dumps(holder).encode())
        self.fd = fd

    def release(self) -> None:
        self.path.unlink(missing_ok=True)
        os.close(self.fd)

    def __enter__(self) -> FolderLock:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def killed_writer(folder: str | Path) -> list[str] | None:
    """The arguments (after the program's name) of a process that took `folder` with FolderLock and never released
    it: its lock file stays behind when it is killed, naming its command line. None where there is none to read."""
    try:
        return shlex.split(json.loads((Path(folder) / LOCK_FILE).read_text(encoding="utf-8"))["command"])[1:]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _in_use(folder: Path, record: bytes) -> str:
    """The refusal of a second writer: who holds `folder`, from its lock file's `record`."""
    try:
        holder = json.loads(record)
        where = "" if holder["host"] == socket.gethostname() else f" on {holder['host']}"
        who = f"burnout process {holder['pid']}{where} ({holder['command']})"
    except (ValueError, KeyError, TypeError):  # its holder has not written it yet
        who = "another burnout process"
    return f"{folder} is being written by {who}; wait for it to end or stop it, then run this again"


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
            bound = f"more than {_shown_bound(low)}" if low_open else f"at least {_shown_bound(low)}"
        elif low is None:
            bound = f"at most {_shown_bound(high)}"
        else:
            bound = f"in {'(' if low_open else '['}{_shown_bound(low)}, {_shown_bound(high)}]"
        raise refuse(f"{shown} must be {bound}")
    return number


def _shown_bound(bound: float) -> str:
    """A range's end as a person reads it: a whole number in full (a seed's 4294967295, not 4.29497e+09)."""
    return str(int(bound)) if float(bound).is_integer() and abs(bound) < 1e15 else f"{bound:g}"


def first_line(error: BaseException | str, limit: int = 200) -> str:
    """The first non-empty line of an error's message (at most `limit` characters), or the
    exception's type name when the message is empty: error text fit for a one-line message."""
    text = str(error).strip()
    if not text:
        return type(error).__name__ if isinstance(error, BaseException) else ""
    return text.splitlines()[0][:limit]


def install_extra(extra: str) -> str:
    """The command that installs burnout's optional dependencies `extra` (pyproject.toml's
    optional-dependencies), as installed from PyPI and from a clone, for the line of an error that needs it."""
    return f"pip install 'gpuburnout[{extra}]' (from a clone: pip install -e '.[{extra}]')"


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


def format_bytes(count: int) -> str:
    """'512 B', '3.4 MB', '12.0 GB' (powers of 1000, as `df -H` prints them)."""
    units = ("B", "kB", "MB", "GB", "TB", "PB", "EB")
    power = min(int(math.log10(max(count, 1)) // 3), len(units) - 1)
    return f"{count / 1000 ** power:.1f} {units[power]}" if power else f"{count} B"


def format_count(count: float) -> str:
    """'950', '3.0M', '29.4M', '11.8B': parameters, tokens or FLOPs as a person reads them."""
    for divisor, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if round(abs(count) / divisor, 1) >= 1:  # 999,960 is 1.0M, not 1000.0K
            return f"{count / divisor:.1f}{unit}"
    return f"{count:,.0f}"


def plural(count: int, noun: str, nouns: str | None = None) -> str:
    """'1 document', '2,048 documents' (with `nouns`: '1 match', '3 matches'): a count and its noun as a person
    writes them."""
    return f"{count:,} {noun if count == 1 else nouns or noun + 's'}"


def format_duration(seconds: float) -> str:
    """'1h05m' from an hour up, else '4m07s'."""
    seconds = int(seconds)
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 60}m{seconds % 60:02d}s"


def labelled(rows: Iterable[tuple[str, str]], indent: str = "") -> list[str]:
    """'label:' in a column, then its text: how quickstart, and each command's `next_steps`, list what it made."""
    return [f"{indent}{label + ':':<14}{text}" for label, text in rows]


def next_steps(rows: Iterable[tuple[str, str]]) -> list[str]:
    """The block a command ends with: what can be done next with what it made, one (label, command) a line."""
    rows = list(rows)
    return ["next:", *labelled(rows, "  ")] if rows else []


def needs_package(command: str, module: str, extra: str, note: str = "") -> str:
    """`command` and its `note`, or, where `module` (what the command needs of the optional dependencies `extra`) is
    not installed, how to install them first."""
    import importlib.util

    if importlib.util.find_spec(module) is None:
        return f"{command}   (first: {install_extra(extra)})"
    return f"{command}   ({note})" if note else command


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
