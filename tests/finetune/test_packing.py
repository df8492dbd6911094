"""Packed SFT (sft.packing): conversations packed into full rows, best fit, each attending only to itself with its
own positions: the loss and gradients per assistant token equal the padded path's, and a packed run resumes exactly.
Packed DPO (dpo.packing): pairs packed whole into rows of 2·seq_len, the loss and gradients of the same pairs the
padded path's, and a packed DPO run through `burnout dpo` starts at ln 2 and resumes exactly."""

import dataclasses
import json
import shutil

import numpy as np
import pytest
import safetensors.torch
import torch

from burnout.cli import main
from burnout.config import load_run_config
from burnout.core.checkpoint import list_checkpoints
from burnout.core.model_files import load_model
from burnout.finetune.dpo import LN2, DPOObjective
from burnout.finetune.tokenized import PackedPairBatches, PackedSFTBatches, PairBatches, SFTBatches, pack_rows
from burnout.models import Transformer
from burnout.runs import resume_training, start_training
from burnout.train.step import accumulate_gradients

SEQ_LEN = 64  # chat_run's data were prepared at this length


class _FirstBatch:
    """A loader whose batch 0 is (x, y)."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y

    def get_batch(self, index: int):
        return self.x, self.y


def _loss_and_grads(module: torch.nn.Module, loader) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Batch 0's loss and gradients through the training step itself, which must hand a packed batch's positions
    to the model (or the objective around it)."""
    module.zero_grad()
    loss, _ = accumulate_gradients(module, loader, 0, 1, torch.device("cpu"), "fp32")
    return loss, {n: p.grad.clone() for n, p in module.named_parameters()}


def test_best_fit_packs_every_example_once_within_the_capacity_and_alike_each_time():
    lengths = np.array([6, 5, 4, 3, 2, 8, 1])
    examples = np.arange(100, 107)
    rows = pack_rows(examples, lengths, 8, seed=0)
    packed = sorted(int(e) for row in rows for e in row)
    assert packed == list(examples)
    assert all(sum(lengths[int(e) - 100] for e in row) <= 8 for row in rows)
    # Longest first, each into the fullest row that holds it: 8 | 6+2 | 5+3 | 4+1.
    assert sorted(sorted(int(lengths[int(e) - 100]) for e in row) for row in rows) == [[1, 4], [2, 6], [3, 5], [8]]
    assert [r.tolist() for r in rows] == [r.tolist() for r in pack_rows(examples, lengths, 8, seed=0)]


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_a_packed_batch_gives_the_padded_loss_and_gradients_of_the_same_conversations(chat_run, family):
    """gpt2's learned positions catch positions that do not restart; llama's RoPE, relative, would not."""
    base, _, _ = load_model(chat_run)
    torch.manual_seed(0)
    model = Transformer(dataclasses.replace(base.cfg, family=family, n_kv_head=None if family == "gpt2" else
                                            base.cfg.n_kv_head))  # random weights: every attention weight counts
    data = chat_run / "data"
    packed = PackedSFTBatches(data, "train", 4, SEQ_LEN, seed=3)
    padded = SFTBatches(data, "train", 4, SEQ_LEN, seed=3)
    x, y, _ = packed.get_batch(0)
    examples = [int(e) for row in packed.examples_of(0) for e in packed.rows[row]]
    assert len(examples) > 4, "rows must hold several conversations each for this test to mean anything"
    px, py = padded._xy([padded.data.row(e) for e in examples], padded.meta["pad_id"])
    assert int((y != -1).sum()) == int((py != -1).sum())

    packed_loss, packed_grads = _loss_and_grads(model, packed)
    padded_loss, padded_grads = _loss_and_grads(model, _FirstBatch(px, py))  # those conversations, padded
    assert torch.allclose(packed_loss, padded_loss, atol=1e-5), (packed_loss, padded_loss)
    for name, grad in padded_grads.items():
        assert torch.allclose(packed_grads[name], grad, atol=1e-5, rtol=1e-4), name
    assert (x != packed.meta["pad_id"]).float().mean() > (px != padded.meta["pad_id"]).float().mean()


def test_a_packed_sft_run_resumed_from_a_checkpoint_ends_bitwise_as_the_whole_run(tiny_run, fine_tune_data, tmp_path):
    train = {"device": "cpu", "precision": "fp32", "batch_size": 2, "seq_len": SEQ_LEN, "max_steps": 4, "lr": 3e-3,
             "warmup_steps": 1, "eval_interval": 4, "eval_batches": 1, "ckpt_interval": 2, "keep_last": 10}
    cfg = load_run_config({"sft": {"base": str(tiny_run.run_dir), "source": str(fine_tune_data.chats),
                                   "packing": True}, "train": train})
    whole = tmp_path / "whole"
    start_training(cfg, whole, on_event=lambda line: None, progress=False)
    _assert_resumed_from_step_2_ends_bitwise(whole, tmp_path / "resumed")


def _assert_resumed_from_step_2_ends_bitwise(whole, resumed) -> None:
    """A copy of the 4-step run `whole` without its last checkpoint, resumed, ends with the same weights bitwise."""
    shutil.copytree(whole, resumed)
    shutil.rmtree(list_checkpoints(resumed)[-1])  # the last checkpoint gone: the resume trains steps 3 and 4 again
    assert resume_training(resumed, [], on_event=lambda line: None, progress=False).step == 4
    a = safetensors.torch.load_file(list_checkpoints(whole)[-1] / "model.safetensors")
    b = safetensors.torch.load_file(list_checkpoints(resumed)[-1] / "model.safetensors")
    for key in a:
        assert torch.equal(a[key], b[key]), key


# ----------------------------------------------------------------------------------------------
# Packed DPO

DPO_TRAIN = {"device": "cpu", "precision": "fp32", "batch_size": 2, "seq_len": SEQ_LEN, "max_steps": 4, "lr": 1e-3,
             "warmup_steps": 1, "log_interval": 1, "eval_interval": 4, "eval_batches": 1, "ckpt_interval": 2,
             "keep_last": 10}


@pytest.fixture(scope="module")
def packed_dpo_run(chat_run, tmp_path_factory):
    """4 steps of DPO from chat_run with dpo.packing, through the real command, on pairs short enough for several
    to share a row of 2 × 64 positions; checkpoints at 2 and 4."""
    root = tmp_path_factory.mktemp("packed_dpo")
    pairs = root / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"prompt": f"Capital {i}?", "chosen": "Paris" + " is it" * (i % 3) + ".",
                                         "rejected": "it" + " is" * (i % 2) + " Paris."}) + "\n" for i in range(40)))
    run = root / "run"
    assert main(["dpo", str(chat_run), "--data", str(pairs), "--out", str(run), "dpo.packing=true",
                 "dpo.val_fraction=0.25", *(f"train.{key}={value}" for key, value in DPO_TRAIN.items())]) == 0
    return run


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_a_packed_dpo_batch_gives_the_padded_loss_and_gradients_of_the_same_pairs(packed_dpo_run, family):
    """Policy and reference two different random models, so that every log-prob of both counts."""
    base, _, _ = load_model(packed_dpo_run)
    cfg = dataclasses.replace(base.cfg, family=family, n_kv_head=None if family == "gpt2" else base.cfg.n_kv_head)
    torch.manual_seed(0)
    policy = Transformer(cfg)
    torch.manual_seed(1)
    objective = DPOObjective(policy, beta=0.5, reference=Transformer(cfg))
    data = packed_dpo_run / "data"
    packed = PackedPairBatches(data, "train", 2, SEQ_LEN, seed=3)
    pairs = [int(pair) for row in packed.examples_of(0) for pair in packed.rows[row]]
    assert len(pairs) > 2, "rows must hold several pairs each for this test to mean anything"
    padded = PairBatches(data, "train", len(pairs), SEQ_LEN, seed=3)
    px, py = padded._pair_rows(pairs)

    packed_loss, packed_grads = _loss_and_grads(objective, packed)
    padded_loss, padded_grads = _loss_and_grads(objective, _FirstBatch(px, py))  # those pairs, padded
    assert abs(packed_loss.item() - LN2) > 0.01  # the two models differ: the loss is not the trivial ln 2
    assert torch.allclose(packed_loss, padded_loss, atol=1e-5), (packed_loss, padded_loss)
    for name, grad in padded_grads.items():
        assert torch.allclose(packed_grads[name], grad, atol=1e-5, rtol=1e-4), name
    x = packed.get_batch(0)[0]
    assert x.shape == (2, 2 * SEQ_LEN)  # as many positions as a padded batch of 2 pairs
    assert (x != packed.meta["pad_id"]).float().mean() > (px != padded.meta["pad_id"]).float().mean()


def test_a_packed_dpo_run_starts_at_ln_2_and_resumed_ends_bitwise_as_the_whole_run(packed_dpo_run, tmp_path):
    metrics = [json.loads(line) for line in (packed_dpo_run / "metrics.jsonl").read_text().splitlines()]
    assert metrics[0]["train_loss"] == pytest.approx(LN2, abs=1e-6) and metrics[-1]["train_loss"] < LN2
    _assert_resumed_from_step_2_ends_bitwise(packed_dpo_run, tmp_path / "resumed")
