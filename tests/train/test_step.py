"""The train step's one collective: the loss averaged across ranks carries the stop flags, so every rank
learns in the same all-reduce whether any rank's time is up or got a signal."""

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from burnout.config import load_run_config
from burnout.train.distributed import DistContext
from burnout.train.step import TrainStep

MODEL = {"family": "llama", "vocab_size": 64, "n_layer": 1, "d_model": 32, "n_head": 2, "n_kv_head": 1,
         "context_length": 16, "ffn_multiple_of": 16}


class _Batches:
    """Each rank's own tokens, so the ranks' losses differ."""

    def __init__(self, rank: int):
        self.rank = rank

    def get_batch(self, index: int):
        g = torch.Generator().manual_seed(100 * self.rank + index)
        x = torch.randint(0, 64, (2, 16), generator=g)
        return x, x


def _rank(rank: int, world_size: int, init_file: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    try:
        cfg = load_run_config({"model": MODEL, "train": {"device": "cpu", "precision": "fp32", "batch_size": 2,
                                                         "seq_len": 16, "warmup_steps": 0}})
        torch.manual_seed(0)
        from burnout.models import Transformer

        step = TrainStep(Transformer(cfg.model), cfg.train, torch.device("cpu"), "fp32", end_of_run=10,
                         dist=DistContext(rank=rank, world_size=world_size))
        # Rank 1 alone raises the second flag (a signal); nobody raises the first (time is up).
        flags = [False, rank == 1]
        local_loss = step.model(*_Batches(rank).get_batch(rank)).item()
        result = step(_Batches(rank), 0, flags=lambda: flags)
        torch.save({"flags": result.flags, "loss": result.loss, "local_loss": local_loss}, f"{out}.{rank}")
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_stop_flags_ride_on_the_loss_all_reduce(tmp_path):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    out = str(tmp_path / "result")
    mp.spawn(_rank, args=(2, str(tmp_path / "init"), out), nprocs=2, join=True)
    results = [torch.load(f"{out}.{rank}", weights_only=True) for rank in range(2)]
    for r in results:
        assert r["flags"] == [False, True]  # rank 0 learns of rank 1's signal in the same step
    mean = (results[0]["local_loss"] + results[1]["local_loss"]) / 2
    assert results[0]["loss"] == results[1]["loss"]
    assert abs(results[0]["loss"] - mean) < 1e-5


def test_fp16_steps_through_the_grad_scaler_and_skips_an_overflow():
    """Under fp16 the loss is scaled before backward and the gradients unscaled before clipping (the norm is
    fp32's, not 65,536 times it); a scale so large that fp16's backward overflows skips the update and halves
    the scale, as GradScaler promises."""
    from burnout.models import Transformer

    norms = {}
    for precision in ("fp32", "fp16"):
        cfg = load_run_config({"model": MODEL, "train": {"device": "cpu", "precision": precision, "batch_size": 2,
                                                         "seq_len": 16, "warmup_steps": 0, "grad_clip": 1.0}})
        torch.manual_seed(0)
        step = TrainStep(Transformer(cfg.model), cfg.train, torch.device("cpu"), precision, end_of_run=10)
        weights = {name: p.detach().clone() for name, p in step.model.named_parameters()}
        norms[precision] = step(_Batches(0), 0).grad_norm
    assert abs(norms["fp16"] / norms["fp32"] - 1) < 0.02, norms
    moved = {name: (p - weights[name]).abs().max().item() for name, p in step.model.named_parameters()}
    assert min(moved.values()) > 0, moved  # a finite step: every parameter updated through the scaler
    assert step.scaler.get_scale() == 2.0 ** 16 and step.scaler._get_growth_tracker() == 1  # 65,536 at first

    step.scaler.update(new_scale=2.0 ** 120)  # fp16 tops out at 65504: the scaled backward overflows
    weights = {name: p.detach().clone() for name, p in step.model.named_parameters()}
    step(_Batches(0), 1)
    assert all(torch.equal(p, weights[name]) for name, p in step.model.named_parameters())  # skipped
    assert step.scaler.get_scale() == 2.0 ** 119 and step.scaler._get_growth_tracker() == 0


def test_a_model_this_machine_cannot_hold_is_refused_before_it_is_built(monkeypatch):
    """build_model, which train, bench and the fine-tunes build with, counts the fp32 weights first."""
    import pytest

    from burnout.errors import BurnoutError
    from burnout.models import size
    from burnout.train import step

    cfg = load_run_config({"model": MODEL, "train": {"device": "cpu"}})
    built = []
    monkeypatch.setattr(step, "model_for", lambda cfg: built.append(cfg))
    monkeypatch.setattr(size, "machine_memory", lambda: (size.weights_bytes(cfg.model) - 1, "there is less"))
    with pytest.raises(BurnoutError, match=r"^the run's model, .* needs .* and there is less; choose a smaller model"):
        step.build_model(cfg, torch.device("cpu"))
    assert not built
