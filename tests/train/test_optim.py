"""burnout/train/optim.py: Muon with its Newton–Schulz iteration in the step's precision; torchao's 8-bit AdamW
keeps the state the planner counts."""

from __future__ import annotations

import sys

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass

from benchmarks.bench_optimizer_state import tensor_bytes
from burnout.errors import BurnoutError
from burnout.models import Transformer
from burnout.models.memory import param_counts, static_bytes
from burnout.train.optim import Muon, make_optimizer, orthogonalize

COEFFICIENTS = (3.4445, -4.7750, 2.0315)


def _matrices(seed: int) -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(shape, generator=g)) for shape in ((24, 40), (40, 24), (32, 32))]


def _step_three_times(optimizer: torch.optim.Optimizer, params: list[torch.nn.Parameter]) -> None:
    g = torch.Generator().manual_seed(1)
    for _ in range(3):
        for p in params:
            p.grad = torch.randn(p.shape, generator=g)
        optimizer.step()


@pytest.mark.parametrize("settings", [dict(), dict(nesterov=False, weight_decay=0.0),
                                      dict(adjust_lr_fn="match_rms_adamw", momentum=0.9)])
def test_in_bf16_muon_updates_bitwise_as_torch_does(settings):
    ours, theirs = _matrices(0), _matrices(0)
    _step_three_times(Muon(ours, orthogonalize_dtype=torch.bfloat16, lr=0.05, **settings), ours)
    reference = torch.optim.Muon(theirs, lr=0.05, **settings)
    _step_three_times(reference, theirs)
    for a, b in zip(ours, theirs):
        assert torch.equal(a, b)
    # The same state, so a checkpoint written by either loads into the other.
    mine = Muon(ours, lr=0.05, **settings)
    mine.load_state_dict(reference.state_dict())
    assert all(torch.equal(mine.state[a]["momentum_buffer"], reference.state[b]["momentum_buffer"])
               for a, b in zip(ours, theirs))


def test_orthogonalize_in_fp32_stays_near_the_fp64_iteration():
    for shape in ((24, 40), (40, 24)):
        m = torch.randn(shape, generator=torch.Generator().manual_seed(2))
        exact = orthogonalize(m.double(), torch.float64, COEFFICIENTS, 5, 1e-7)
        fp32 = orthogonalize(m, torch.float32, COEFFICIENTS, 5, 1e-7)
        bf16 = orthogonalize(m, torch.bfloat16, COEFFICIENTS, 5, 1e-7)
        assert fp32.dtype == torch.float32 and fp32.shape == shape
        assert (fp32.double() - exact).abs().max() < 1e-5
        assert (bf16.double() - exact).abs().max() > 1e-3  # what bf16 would have cost
        # Roughly orthogonal: the singular values in Muon's band around 1.
        singular = torch.linalg.svdvals(exact)
        assert singular.min() > 0.5 and singular.max() < 1.5


class _MatmulDtypes(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.seen: set[torch.dtype] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket in (torch.ops.aten.mm, torch.ops.aten.addmm):
            self.seen.add(args[1].dtype)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("precision, dtype",
                         [("fp32", torch.float32), ("bf16", torch.bfloat16), ("fp8", torch.bfloat16)])
def test_muon_orthogonalizes_in_the_steps_precision(tiny_run_config, precision, dtype):
    cfg = tiny_run_config(optimizer="muon", muon_lr=0.05)
    model = Transformer(cfg.model)
    x = torch.randint(0, cfg.model.vocab_size, (2, 16))
    model(x, x).backward()
    muon, _ = make_optimizer(model, cfg.train, precision).optimizers
    with _MatmulDtypes() as matmuls:
        muon.step()
    assert matmuls.seen == {dtype}


@pytest.mark.slow
def test_adamw8bit_keeps_the_state_bytes_the_planner_counts(tiny_run_config):
    """After a step, torchao's moments (uint8 codes, block scales and lookup tables; fp32 for the norms) take
    what models/memory.py predicts, about a quarter of AdamW's."""
    cfg = tiny_run_config(optimizer="adamw8bit")
    model = Transformer(cfg.model)
    x = torch.randint(0, cfg.model.vocab_size, (2, 16))
    model(x, x).backward()
    (adamw8bit,) = make_optimizer(model, cfg.train).optimizers
    adamw8bit.step()
    moments = [t for state in adamw8bit.state.values() for key, t in state.items() if key != "step"]
    assert any(is_traceable_wrapper_subclass(t) for t in moments) and len(moments) == 2 * len(adamw8bit.state)
    counts = param_counts(cfg.model)
    assert sum(map(tensor_bytes, moments)) == static_bytes(counts, "adamw8bit")["optimizer"]
    assert static_bytes(counts, "adamw8bit")["optimizer"] < 0.4 * static_bytes(counts, "adamw")["optimizer"]


def test_adamw8bit_steps_at_the_lr_the_schedule_sets(tiny_run_config):
    """torchao keeps each group's LR as a tensor: scaled to 0 the step leaves every weight as it was (no update, no
    decay); scaled back, it moves them."""
    cfg = tiny_run_config(optimizer="adamw8bit")
    model = Transformer(cfg.model)
    x = torch.randint(0, cfg.model.vocab_size, (2, 16))
    optimizer = make_optimizer(model, cfg.train)
    before = [p.detach().clone() for p in model.parameters()]
    for factor, moved in ((0.0, False), (0.5, True)):
        model(x, x).backward()
        optimizer.scale_lr(factor)
        assert [float(g["lr"]) for g in optimizer.param_groups] == pytest.approx([factor * cfg.train.lr] * 2)
        optimizer.step()
        optimizer.zero_grad()
        assert any(not torch.equal(p, b) for p, b in zip(model.parameters(), before)) == moved


def test_adamw8bit_without_torchao_is_one_line_saying_how_to_install_it(tiny_run_config, monkeypatch):
    monkeypatch.setitem(sys.modules, "torchao.optim", None)  # import torchao.optim now fails as if not installed
    cfg = tiny_run_config(optimizer="adamw8bit")
    with pytest.raises(BurnoutError) as info:
        make_optimizer(Transformer(cfg.model), cfg.train)
    assert str(info.value) == ("train.optimizer=adamw8bit needs torchao: pip install 'gpuburnout[adamw8bit]' "
                               "(from a clone: pip install -e '.[adamw8bit]')")
