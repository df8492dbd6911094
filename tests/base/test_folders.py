"""FolderLock: one writer per folder, even when the lock file is removed between a second writer's open and its
flock."""

import os

import pytest

from burnout.base import folders
from burnout.base.folders import FolderLock
from burnout.errors import BurnoutError


def test_a_lock_file_removed_by_its_holder_after_another_writer_opened_it_is_not_taken_as_the_lock(tmp_path,
                                                                                                  monkeypatch):
    """FolderLock.release removes the lock file while still holding it. A writer that opened the file just before
    then gets its flock, on a file no longer in the folder: it must start over on the folder's own file, or two
    writers would each hold a lock."""
    first = FolderLock(tmp_path)
    real_flock = folders.fcntl.flock

    def holder_lets_go_first(fd, operation):  # between the second writer's open and its flock
        monkeypatch.setattr(folders.fcntl, "flock", real_flock)
        first.release()
        return real_flock(fd, operation)

    monkeypatch.setattr(folders.fcntl, "flock", holder_lets_go_first)
    second = FolderLock(tmp_path)
    try:
        with pytest.raises(BurnoutError, match=f"^{tmp_path} is being written by burnout process {os.getpid()} "):
            FolderLock(tmp_path)
    finally:
        second.release()
