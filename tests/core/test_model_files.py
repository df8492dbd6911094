"""burnout/core/model_files.py: `burnout export --to` writes into a new or empty folder or an export of the same
checkpoint; an export of another checkpoint is replaced only with --overwrite, which leaves anything else there."""

from __future__ import annotations

from burnout.cli import main
from burnout.core.checkpoint import list_checkpoints


def test_export_rewrites_its_own_and_replaces_another_checkpoints_only_with_overwrite(sampled_runs, tmp_path, capsys):
    first, last = list_checkpoints(sampled_runs[0])[0], list_checkpoints(sampled_runs[0])[-1]
    hf = tmp_path / "hf"
    assert main(["export", str(first), "--to", str(hf)]) == 0
    assert main(["export", str(first), "--to", str(hf)]) == 0  # the same checkpoint's export: written again
    (hf / "README.md").write_text("my notes on this model\n")
    weights = (hf / "model.safetensors").read_bytes()
    capsys.readouterr()

    assert main(["export", str(sampled_runs[0]), "--to", str(hf)]) == 2  # the run's latest: another checkpoint
    err = capsys.readouterr().err
    assert err == (f"burnout: error: --to {hf} holds a Hugging Face export of {first.resolve()}, not of "
                   f"{last.resolve()}; pass --overwrite to replace it, or choose another folder\n")
    assert (hf / "model.safetensors").read_bytes() == weights

    assert main(["export", str(sampled_runs[0]), "--to", str(hf), "--overwrite"]) == 0
    assert (hf / "model.safetensors").read_bytes() != weights
    assert (hf / "README.md").read_text() == "my notes on this model\n"
    assert main(["export", str(last), "--to", str(hf)]) == 0  # now the folder is that checkpoint's export
    assert main(["export", str(first), "--to", str(hf)]) == 2
