"""The output folders commands write: whose they are (OWNER_FILE) and their one writer (FolderLock).

A command writes only into a folder it made or one holding its own kind of output, and never beside another
writer: what a user owns is never overwritten, and two processes never write one run.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shlex
import socket
import sys
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from burnout.base.files import write_atomic
from burnout.errors import BurnoutError

# In a folder a command made: the kind of output it holds and what that output is of ({"kind", "source"}), so
# that a later command tells its own folder from anyone else's (check_output_folder).
OWNER_FILE = ".burnout.json"
# In a run or data folder while a process writes it: the flock of its one writer, and who that is (FolderLock).
LOCK_FILE = ".burnout.lock"
# Each kind of output folder, as a refusal names it.
OUTPUT_KINDS = {"data": "prepared data", "run": "a run", "export": "a Hugging Face export", "audit": "a data audit",
                "report": "a report", "mirror": "a mirror", "ladder": "a scaling ladder",
                "speedrun": "a speedrun"}


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
