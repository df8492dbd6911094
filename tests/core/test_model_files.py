"""burnout/core/model_files.py: `burnout export --to` writes into a new or empty folder or an export of the same
checkpoint (told by its run's name and its weights' sha256, not by a path); an export of another checkpoint is
replaced only with --overwrite, which leaves anything else there. Its files, and a checkpoint's, have the mode the
umask gives."""

from __future__ import annotations

import os

from burnout.cli import main
from burnout.core.checkpoint import list_checkpoints


def test_export_rewrites_its_own_and_replaces_another_checkpoints_only_with_overwrite(sampled_runs, tmp_path, capsys,
                                                                                    export_label):
    first, last = list_checkpoints(sampled_runs[0])[0], list_checkpoints(sampled_runs[0])[-1]
    hf = tmp_path / "hf"
    assert main(["export", str(first), "--to", str(hf)]) == 0
    assert main(["export", str(first), "--to", str(hf)]) == 0  # the same checkpoint's export: written again
    (hf / "README.md").write_text("my notes on this model\n")
    weights = (hf / "model.safetensors").read_bytes()
    capsys.readouterr()

    assert main(["export", str(sampled_runs[0]), "--to", str(hf)]) == 2  # the run's latest: another checkpoint
    err = capsys.readouterr().err
    assert err == (f"burnout: error: --to {hf} holds a Hugging Face export of {export_label(first)}, not of "
                   f"{export_label(last)}; pass --overwrite to replace it, or choose another folder\n")
    assert (hf / "model.safetensors").read_bytes() == weights

    assert main(["export", str(sampled_runs[0]), "--to", str(hf), "--overwrite"]) == 0
    assert (hf / "model.safetensors").read_bytes() != weights
    assert (hf / "README.md").read_text() == "my notes on this model\n"
    assert main(["export", str(last), "--to", str(hf)]) == 0  # now the folder is that checkpoint's export
    assert main(["export", str(first), "--to", str(hf)]) == 2


def test_every_exported_and_checkpointed_file_has_the_mode_the_umask_gives(sampled_runs, tmp_path):
    """safetensors writes its file through a private temporary file (mode 0600); written atomically, the weights get
    the mode of every other file: 0644 under umask 022, 0600 under 077."""
    checkpoint = list_checkpoints(sampled_runs[0])[-1]
    files = sorted(p for p in checkpoint.iterdir() if p.is_file())
    assert "model.safetensors" in [p.name for p in files]
    assert {p.stat().st_mode & 0o777 for p in files} == {0o666 & ~_umask()}
    for umask, mode in ((0o022, 0o644), (0o077, 0o600)):
        old = os.umask(umask)
        try:
            assert main(["export", str(checkpoint), "--to", str(tmp_path / oct(umask))]) == 0
        finally:
            os.umask(old)
        exported = sorted(p for p in (tmp_path / oct(umask)).iterdir() if p.is_file())
        assert "model.safetensors" in [p.name for p in exported]
        assert {p.name: p.stat().st_mode & 0o777 for p in exported} == {p.name: mode for p in exported}


def _umask() -> int:
    """This process's umask (reading it means setting it)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask
