"""write_atomic: the old file or the new one, never half of one, no temporary left."""

import os

import pytest

from burnout.base import files
from burnout.base.files import write_atomic


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

    monkeypatch.setattr(files.os, "replace", failing_replace)
    with pytest.raises(OSError, match="No space left"):
        write_atomic(path, "new")
    # The new bytes went to a hidden name beside the target, this process's own, and are gone with the failure.
    assert seen == [(f".out.json.tmp-{os.getpid()}", b"new")]
    assert path.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]
