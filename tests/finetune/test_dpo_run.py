"""`burnout dpo` on the training engine: a tiny SFT'd chat model tuned on pairs made from held-out questions
(chosen = the right answer, rejected = its words shuffled). Step 1's loss is ln 2, rewards, margin and accuracy
are logged beside the loss, held-out accuracy rises, checkpoints hold the plain policy, a run killed mid-way
resumes to the same weights bitwise, the stall warning fires for a learning rate that cannot move the policy
(and not for one that does), and bad pairs are one line."""

import json
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import safetensors.torch
import torch

from burnout.cli import main
from burnout.config import load_run_config
from burnout.core.chat_template import is_chat_model
from burnout.core.checkpoint import list_checkpoints
from burnout.core.model_files import load_model
from burnout.finetune.dpo import LN2
from burnout.runs import resume_training, start_training

REPO = Path(__file__).resolve().parents[2]
SFT_TRAIN = {"device": "cpu", "precision": "fp32", "batch_size": 4, "seq_len": 64, "max_steps": 12, "lr": 3e-3,
             "min_lr": 3e-4, "warmup_steps": 2, "log_interval": 2, "eval_interval": 6, "eval_batches": 2,
             "ckpt_interval": 6, "keep_last": 5}
DPO_TRAIN = {**SFT_TRAIN, "max_steps": 12, "lr": 1e-3, "min_lr": 1e-4, "log_interval": 1, "eval_interval": 4,
             "eval_batches": 4, "ckpt_interval": 2, "keep_last": 20}
DPO_ARGS = ["dpo.val_fraction=0.25", "dpo.stall_steps=4", *(f"train.{k}={v}" for k, v in DPO_TRAIN.items())]


def _quiet(line):
    pass


@pytest.fixture(scope="module")
def sft_run(tiny_run_config, tiny_bpe_data, tmp_path_factory) -> Path:
    """A tiny pretrained llama, then 12 steps of SFT on 40 'What is i plus j?' chats: the DPO base."""
    root = tmp_path_factory.mktemp("dpo_run")
    start_training(tiny_run_config(max_steps=6), root / "base", data_dir=tiny_bpe_data, on_event=_quiet,
                   progress=False)
    chats = root / "chats.jsonl"
    chats.write_text("".join(json.dumps({"messages": [
        {"role": "user", "content": f"What is {i} plus {i % 7}?"},
        {"role": "assistant", "content": f"It is {i + i % 7}."}]}) + "\n" for i in range(40)))
    cfg = load_run_config({"train": SFT_TRAIN, "sft": {"base": str(root / "base"), "source": str(chats)}})
    start_training(cfg, root / "sft", on_event=_quiet, progress=False)
    return root / "sft"


@pytest.fixture(scope="module")
def pairs(tmp_path_factory) -> Path:
    """Pairs from questions the SFT never saw: chosen the right answer, rejected its words shuffled."""
    path = tmp_path_factory.mktemp("pairs") / "pairs.jsonl"
    rng = random.Random(0)
    lines = []
    for i in range(40, 120):
        answer = f"It is {i + i % 7}, I am quite sure of it."
        words = answer.split()
        while " ".join(words) == answer:
            rng.shuffle(words)
        lines.append(json.dumps({"prompt": f"What is {i} plus {i % 7}?", "chosen": answer,
                                 "rejected": " ".join(words)}))
    path.write_text("\n".join(lines) + "\n")
    return path


def _metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def dpo_run(sft_run, pairs, tmp_path_factory) -> Path:
    """Full DPO (the reference a frozen copy), 12 steps at a working learning rate."""
    run = tmp_path_factory.mktemp("dpo") / "full"
    events: list[str] = []
    cfg = load_run_config({"dpo": {"base": str(sft_run), "source": str(pairs)}}, DPO_ARGS)
    start_training(cfg, run, on_event=events.append, progress=False)
    (run / "events.txt").write_text("\n".join(events))
    return run


def test_step_1_is_ln_2_and_the_pair_metrics_are_logged_beside_the_loss(dpo_run):
    metrics = _metrics(dpo_run)
    assert metrics[0]["step"] == 1 and abs(metrics[0]["train_loss"] - LN2) < 1e-6
    assert metrics[0]["margin"] == 0.0 and metrics[0]["accuracy"] == 0.0  # policy = reference: no reward yet
    for record in metrics:
        assert {"rewards/chosen", "rewards/rejected", "margin", "accuracy"} <= record.keys(), record
    assert metrics[-1]["step"] == 12 and metrics[-1]["train_loss"] < LN2 - 0.05
    assert metrics[-1]["margin"] > 0 and metrics[-1]["accuracy"] > 0.5


def test_mfu_counts_the_reference_forward_too(dpo_run, sft_run):
    """Tokens/s counts both rows of a pair (chosen, rejected: StepResult.positions); MFU adds the reference's
    forward (a third of a training step's FLOPs) to the policy's forward and backward: 4/3 of an SFT step's
    FLOPs per position."""
    record = next(r for r in _metrics(dpo_run) if "tokens_per_s" in r)
    sft = next(r for r in _metrics(sft_run) if "tokens_per_s" in r)
    assert record["mfu"] / record["tokens_per_s"] == pytest.approx(sft["mfu"] / sft["tokens_per_s"] * 4 / 3, rel=1e-4)


def test_held_out_accuracy_and_margin_rise(dpo_run):
    evals = [r for r in _metrics(dpo_run) if "val_loss" in r]
    assert [r["step"] for r in evals] == [4, 8, 12]
    assert evals[0]["val_loss"] < LN2 and evals[-1]["val_loss"] < evals[0]["val_loss"]
    assert evals[-1]["val_margin"] > evals[0]["val_margin"] > 0
    assert evals[-1]["val_accuracy"] >= 0.7, evals


def test_a_dpo_checkpoint_is_the_plain_policy_of_a_chat_model(dpo_run, sft_run):
    final = safetensors.torch.load_file(list_checkpoints(dpo_run)[-1] / "model.safetensors")
    assert not any(k.startswith("policy.") for k in final)
    model, _, ckpt = load_model(dpo_run)
    assert is_chat_model(ckpt.config) and ckpt.config.dpo.base == str(list_checkpoints(sft_run)[-1].resolve())
    base, _, _ = load_model(sft_run)
    assert not torch.equal(model.lm_head.weight, base.lm_head.weight)  # the policy moved


def test_the_report_has_a_fine_tuning_section_with_the_rewards(dpo_run, sft_run):
    from burnout.report.render import run_blocks
    from burnout.report.runlog import load_run

    _, blocks = run_blocks(load_run(dpo_run), log_scale=False)
    at = next(i for i, b in enumerate(blocks) if b.kind == "h2" and b.text == "Fine-tuning")
    about = dict(blocks[at + 1].rows)
    assert about["kind"] == "DPO, full fine-tuning"
    assert str(list_checkpoints(sft_run)[-1].resolve()) in about["started from"]
    assert blocks[at + 2].kind == "image" and blocks[at + 2].png.startswith(b"\x89PNG")
    last = _metrics(dpo_run)[-1]
    held_out = [r for r in _metrics(dpo_run) if "val_loss" in r][-1]
    assert blocks[at + 3].rows == [["reward accuracy", last["accuracy"], held_out["val_accuracy"]],
                                   ["reward margin", last["margin"], held_out["val_margin"]]]


def test_a_working_learning_rate_gives_no_stall_warning(dpo_run):
    assert "learning nothing" not in (dpo_run / "events.txt").read_text()


def test_a_tiny_learning_rate_warns_once_that_dpo_learns_nothing(sft_run, pairs, tmp_path):
    """LoRA DPO stopped at a phase end (step 3) and resumed (its adapters trained, the reference still the
    base with them off); the warning comes after dpo.stall_steps=4 steps, in the resumed session."""
    events: list[str] = []
    cfg = load_run_config({"dpo": {"base": str(sft_run), "source": str(pairs), "lora": {"r": 4}}},
                          [*DPO_ARGS, "train.lr=1e-9", "train.min_lr=1e-10", "train.max_steps=6",
                           "train.phases=[{name: a, steps: 3}, {name: b, steps: 6}]"])
    assert start_training(cfg, tmp_path / "stalled", on_event=events.append, progress=False).step == 3
    assert resume_training(tmp_path / "stalled", [], on_event=events.append, progress=False).step == 6
    warnings = [e for e in events if "learning nothing" in e]
    assert len(warnings) == 1 and warnings[0].startswith("warning: DPO loss 0.693") and "after 4 steps" in warnings[0]


_KILL_AT_CHECKPOINT = """
import os, signal, sys
def hook(event, args):
    if event == "os.rename" and str(args[1]).endswith("step_0000006"):
        os.kill(os.getpid(), signal.SIGKILL)
sys.addaudithook(hook)
from burnout.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_a_dpo_run_killed_mid_way_resumes_to_the_same_weights_bitwise(dpo_run, sft_run, pairs, tmp_path):
    killed = tmp_path / "killed"
    proc = subprocess.run([sys.executable, "-c", _KILL_AT_CHECKPOINT, "dpo", str(sft_run), "--data", str(pairs),
                           "--out", str(killed), *DPO_ARGS], env={**os.environ, "PYTHONPATH": str(REPO)},
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert [p.name for p in list_checkpoints(killed)] == ["step_0000002", "step_0000004"]
    assert resume_training(killed, [], on_event=_quiet, progress=False).step == 12
    a = safetensors.torch.load_file(list_checkpoints(dpo_run)[-1] / "model.safetensors")
    b = safetensors.torch.load_file(list_checkpoints(killed)[-1] / "model.safetensors")
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key
    assert [r["train_loss"] for r in _metrics(killed)] == [r["train_loss"] for r in _metrics(dpo_run)]


def test_a_pair_with_an_empty_side_is_one_line(sft_run, tmp_path, capsys):
    data = tmp_path / "bad.jsonl"
    data.write_text(json.dumps({"prompt": "Hi?", "chosen": "Hello.", "rejected": ""}) + "\n")
    assert main(["dpo", str(sft_run), "--data", str(data), "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("burnout: error:") and "\n" not in err and "empty" in err, err
    assert not list_checkpoints(tmp_path / "r")
