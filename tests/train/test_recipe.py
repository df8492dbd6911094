"""Continued pretraining (train.init_from, `burnout train ... --init-from RUN`): a new run whose step 0 is another
run's checkpoint, through the real `burnout train` command."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import safetensors.torch
import torch
import yaml

from burnout.base.files import METRICS_FILE, sha256_file
from burnout.cli import main
from burnout.core.checkpoint import list_checkpoints
from burnout.core.model_files import load_model
from burnout.data.loader import TokenLoader
from burnout.data.tokenizer import load_tokenizer, tokenizer_sha256
from burnout.train.provenance import read_launches

# The child's own settings: no model section (the parent's is taken), another seed, batch and schedule than the
# parent's (tests/conftest.py: tiny_run), a step logged each step.
CHILD = {"train": {"device": "cpu", "precision": "fp32", "batch_size": 2, "seq_len": 32, "max_steps": 2,
                   "seed": 7, "lr": 5e-4, "min_lr": 5e-5, "warmup_steps": 1, "schedule": "wsd",
                   "weight_decay": 0.05, "log_interval": 1, "eval_interval": 2, "eval_batches": 1,
                   "ckpt_interval": 2}}


def _child(tmp_path: Path, parent, name: str, *overrides: str) -> Path:
    config = tmp_path / f"{name}.yaml"
    config.write_text(yaml.safe_dump(CHILD))
    out = tmp_path / name
    assert main(["train", str(config), "--out", str(out), "--init-from", str(parent.run_dir), "--data",
                 str(parent.data_dir), *overrides]) == 0
    return out


def _records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / METRICS_FILE).read_text().splitlines()]


def test_the_first_step_of_a_continued_run_is_the_parents_loss_on_that_batch(tiny_run, tmp_path):
    child = _child(tmp_path, tiny_run, "child")
    parent_model, _, parent_ckpt = load_model(tiny_run.run_dir)
    parent_model.train()
    x, y = TokenLoader(tiny_run.data_dir, "train", 2, 32, 7).get_batch(0)  # the child's batch 0 (its seed)
    with torch.no_grad():
        expected = parent_model(x, y).item()
    first = next(r for r in _records(child) if r["step"] == 1)
    assert abs(first["train_loss"] - expected) < 1e-5
    saved = yaml.safe_load((child / "config.yaml").read_text())
    assert saved["model"] == yaml.safe_load((parent_ckpt.path / "config.yaml").read_text())["model"]
    assert saved["train"]["init_from"] == str(parent_ckpt.path.resolve())
    assert [c.name for c in list_checkpoints(child)] == ["step_0000002"]  # its own steps, from 0


def test_lineage_is_recorded_in_launches(tiny_run, tmp_path):
    child = _child(tmp_path, tiny_run, "child")
    parent = list_checkpoints(tiny_run.run_dir)[-1]
    [launch] = read_launches(child)
    assert launch["lineage"] == {
        "init_from": str(parent.resolve()), "parent_run": str(tiny_run.run_dir.resolve()),
        "parent_step": tiny_run.result.step, "parent_tokens": tiny_run.result.tokens,
        "parent_data": str(tiny_run.data_dir.resolve()), "data": str(tiny_run.data_dir.resolve()),
        "weights_sha256": sha256_file(parent / "model.safetensors")}


def _adam_moments(checkpoint: Path) -> tuple[list[dict], list[dict]]:
    """(each AdamW parameter's state, the param groups) of a checkpoint's optimizer."""
    [adamw] = torch.load(checkpoint / "state.pt", weights_only=True)["optimizer"]
    return [adamw["state"][i] for i in sorted(adamw["state"])], adamw["param_groups"]


def test_a_fresh_optimizer_by_default_and_the_parents_moments_with_carry(tiny_run, tmp_path):
    # One step from the same weights on the same batch: the same gradient, so the first moments differ by exactly
    # β1 × the parent's (AdamW: m = β1·m_before + (1 − β1)·g).
    fresh = _child(tmp_path, tiny_run, "fresh", "train.max_steps=1")
    carried = _child(tmp_path, tiny_run, "carried", "train.max_steps=1", "train.init_optimizer=carry")
    parent, _ = _adam_moments(list_checkpoints(tiny_run.run_dir)[-1])
    fresh_state, _ = _adam_moments(list_checkpoints(fresh)[-1])
    carried_state, groups = _adam_moments(list_checkpoints(carried)[-1])
    beta1 = tiny_run.cfg.train.beta1
    for before, f, c in zip(parent, fresh_state, carried_state, strict=True):
        torch.testing.assert_close(c["exp_avg"] - f["exp_avg"], beta1 * before["exp_avg"], atol=1e-7, rtol=1e-4)
        assert float(f["step"]) == 1 and float(c["step"]) == float(before["step"]) + 1
    # The moments are the parent's; the hyperparameters the child's own.
    assert {g["weight_decay"] for g in groups} <= {0.0, CHILD["train"]["weight_decay"]}


def test_a_resumed_continued_run_equals_the_uninterrupted_one(tiny_run, tmp_path):
    straight = _child(tmp_path, tiny_run, "straight", "train.max_steps=4")
    stopped = _child(tmp_path, tiny_run, "stopped", "train.max_steps=4", "train.phases=[{name: a, steps: 2}]")
    assert main(["train", "--resume", str(stopped)]) == 0
    [launch, resumed] = read_launches(stopped)
    assert "lineage" in launch and "lineage" not in resumed and resumed["step"] == 2
    a, b = (safetensors.torch.load_file(list_checkpoints(run)[-1] / "model.safetensors") for run in (straight, stopped))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert [r["train_loss"] for r in _records(straight)] == [r["train_loss"] for r in _records(stopped)]


def test_sources_not_yet_prepared_are_tokenized_with_the_parents_tokenizer(tiny_run, tmp_path, shared_data):
    text = tmp_path / "shakespeare.txt"
    text.write_text((shared_data / "tinyshakespeare" / "input.txt").read_text()[:60_000])
    raw = {**CHILD, "data": {"sources": [{"name": "s", "kind": "text", "path": str(text)}], "max_chars": 60_000}}
    config = tmp_path / "child.yaml"
    config.write_text(yaml.safe_dump(raw))
    out = tmp_path / "child"
    assert main(["train", str(config), "--out", str(out), "--init-from", str(tiny_run.run_dir)]) == 0
    parent = list_checkpoints(tiny_run.run_dir)[-1]
    assert tokenizer_sha256(load_tokenizer(out / "data")) == tokenizer_sha256(load_tokenizer(parent))
    assert read_launches(out)[0]["lineage"]["data"] == str((out / "data").resolve())


def test_a_start_point_without_training_state_is_accepted(tiny_run, tmp_path):
    # `burnout grow` writes a run folder whose checkpoint may hold no state.pt (nor lists it in sha256.json).
    grown = tmp_path / "grown"
    shutil.copytree(tiny_run.run_dir, grown)
    checkpoint = list_checkpoints(grown)[-1]
    (checkpoint / "state.pt").unlink()
    manifest = json.loads((checkpoint / "sha256.json").read_text())
    del manifest["state.pt"]
    (checkpoint / "sha256.json").write_text(json.dumps(manifest))
    config = tmp_path / "child.yaml"
    config.write_text(yaml.safe_dump(CHILD))
    out = tmp_path / "child"
    assert main(["train", str(config), "--out", str(out), "--init-from", str(grown), "--data",
                 str(tiny_run.data_dir)]) == 0
    assert read_launches(out)[0]["lineage"]["init_from"] == str(checkpoint.resolve())
    assert main(["train", str(config), "--out", str(tmp_path / "carried"), "--init-from", str(grown), "--data",
                 str(tiny_run.data_dir), "train.init_optimizer=carry"]) == 2
    assert not (tmp_path / "carried").exists()


def test_a_run_continued_with_its_parents_config_re_warms_to_a_lower_peak(tiny_run, tmp_path, capsys):
    """`burnout train --init-from RUN --out NEW` (what `burnout grow` prints next): the parent's config with its peak
    LRs × 0.3 (docs/USAGE.md measures why); an override sets its own; a CONFIG's schedule is its own."""
    grown = tmp_path / "grown"
    assert main(["grow", str(tiny_run.run_dir), "--out", str(grown), "model.n_layer=3"]) == 0
    short = ["train.max_steps=1", "train.ckpt_interval=1"]
    capsys.readouterr()
    assert main(["train", "--init-from", str(grown), "--out", str(tmp_path / "default"), *short]) == 0
    out = capsys.readouterr().out
    parent = tiny_run.cfg.train  # lr 3e-3, min_lr 3e-4, AdamW
    saved = yaml.safe_load((tmp_path / "default" / "config.yaml").read_text())["train"]["optim"]
    assert saved["lr"] == parent.lr * 0.3 and saved["min_lr"] == parent.min_lr * 0.3
    assert f"train.lr {parent.lr * 0.3:.3g}: the parent's × 0.3, the peak a run continued" in out, out
    assert main(["train", "--init-from", str(grown), "--out", str(tmp_path / "own"), *short, "train.lr=2e-3"]) == 0
    assert "the parent's × 0.3" not in capsys.readouterr().out
    assert yaml.safe_load((tmp_path / "own" / "config.yaml").read_text())["train"]["optim"]["lr"] == 2e-3
    child = _child(tmp_path, tiny_run, "configured")
    assert yaml.safe_load((child / "config.yaml").read_text())["train"]["optim"]["lr"] == CHILD["train"]["lr"]


def test_a_continued_run_measures_its_own_step_and_start_up(tiny_run_config, tiny_bpe_data, tmp_path):
    """A parent trained on a time budget keeps its measured step and start-up in config.yaml; the config a run
    continued from it starts from leaves both out, so that its own budget measures them (red when the parent's
    start-up would plan the new run's steps)."""
    from burnout.runs import parent_run_config, start_training

    parent = tmp_path / "parent"
    start_training(tiny_run_config(max_steps=2, max_minutes=10), parent, data_dir=tiny_bpe_data,
                   on_event=lambda line: None, progress=False)
    assert yaml.safe_load((parent / "config.yaml").read_text())["train"]["budget"]["startup_seconds"] > 0
    budget = parent_run_config(parent)["train"]["budget"]
    assert budget["max_minutes"] == 10 and not {"step_seconds", "startup_seconds"} & budget.keys()
