"""benchmarks/peer_step.py, the peer of the GPU figures: transformers' model of the very shape our step trains, with
our step's settings, and a step that runs on the CPU too."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks.bench_gpu import SHAPES, run_config
from benchmarks.peer_step import peer_model, peer_optimizer
from burnout.config import load_model_preset
from burnout.models import Transformer
from burnout.models.hf import from_hf_state_dict
from burnout.train.optim import make_optimizer

pytest.importorskip("transformers")
REPO_ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_the_peer_is_our_model_in_transformers_weight_for_weight(shape):
    """Every weight of the peer maps onto one of ours of the same shape, and none is left over (meta tensors: the
    1B costs no memory)."""
    cfg = load_model_preset(shape)
    with torch.device("meta"):
        ours, theirs = Transformer(cfg), peer_model(shape)
    mapped = from_hf_state_dict(cfg, theirs.state_dict())
    assert {k: v.shape for k, v in mapped.items()} == {k: v.shape for k, v in ours.state_dict().items()}
    assert sum(p.numel() for p in theirs.parameters()) == sum(p.numel() for p in ours.parameters())


def test_the_peer_trains_with_our_optimizer_settings():
    """The same learning rate, betas, weight decay and fused AdamW as our step's, the decay on the same weights
    (counted in parameters: the peer splits our fused qkv matrix in three)."""
    train = run_config("llama-tiny", 2, 32, "fp32", False, device="cpu").train
    theirs = peer_optimizer(peer_model("llama-tiny"), train)
    ours = make_optimizer(Transformer(load_model_preset("llama-tiny")), train).optimizers[0]

    def settings(opt):
        return [(g["lr"], g["betas"], g["weight_decay"], g["fused"], sum(p.numel() for p in g["params"]))
                for g in opt.param_groups]

    assert settings(theirs) == settings(ours)


@pytest.mark.slow
def test_the_peer_step_runs_on_the_cpu_at_a_tiny_size():
    out = subprocess.run([sys.executable, "-m", "benchmarks.peer_step", "llama-tiny", "2", "32", "--device", "cpu",
                          "--eager", "--precision", "fp32", "--steps", "2"], cwd=REPO_ROOT, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.splitlines()[-1])
    vocab = load_model_preset("llama-tiny").vocab_size
    assert result["params"] == sum(p.numel() for p in Transformer(load_model_preset("llama-tiny")).parameters())
    assert result["tokens_per_s"] > 0 and result["ms_per_step"] > 0 and result["peak_gib"] is None
    # Four steps on the same random batch, from a start at about a uniform guess: it learns that batch.
    assert math.log(vocab) - 3 < result["loss"] < math.log(vocab) - 0.5
