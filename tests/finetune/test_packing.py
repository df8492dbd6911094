"""Packed SFT (sft.packing): conversations packed into full rows, best fit, each attending only to itself with its
own positions: the loss and gradients per assistant token equal the padded path's, and a packed run resumes exactly."""

import dataclasses
import shutil

import numpy as np
import pytest
import safetensors.torch
import torch

from burnout.config import load_run_config
from burnout.core.checkpoint import list_checkpoints
from burnout.core.model_files import load_model
from burnout.finetune.tokenized import PackedSFTBatches, SFTBatches, pack_rows
from burnout.models import Transformer
from burnout.runs import resume_training, start_training
from burnout.train.step import accumulate_gradients

SEQ_LEN = 64  # chat_run's data were prepared at this length


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

    class Padded:  # a loader whose batch 0 is those conversations, padded
        def get_batch(self, index):
            return px, py

    def loss_and_grads(loader):
        """Through the training step itself, which must hand a packed batch's positions to the model."""
        model.zero_grad()
        loss, _ = accumulate_gradients(model, loader, 0, 1, torch.device("cpu"), "fp32")
        return loss, {n: p.grad.clone() for n, p in model.named_parameters()}

    packed_loss, packed_grads = loss_and_grads(packed)
    padded_loss, padded_grads = loss_and_grads(Padded())
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
    resumed = tmp_path / "resumed"
    shutil.copytree(whole, resumed)
    shutil.rmtree(list_checkpoints(resumed)[-1])  # the last checkpoint gone: the resume trains steps 3 and 4 again
    assert resume_training(resumed, [], on_event=lambda line: None, progress=False).step == 4
    a = safetensors.torch.load_file(list_checkpoints(whole)[-1] / "model.safetensors")
    b = safetensors.torch.load_file(list_checkpoints(resumed)[-1] / "model.safetensors")
    for key in a:
        assert torch.equal(a[key], b[key]), key
