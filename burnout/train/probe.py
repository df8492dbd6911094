"""Trial steps before a run: how long a step takes (a time budget plans its steps by it: train.max_minutes, the
quickstart) and the largest micro-batch that fits in memory (`--auto-batch`). Both run the training step itself
(burnout/train/step.py)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path

import torch

from burnout.config import RunConfig, TrainConfig
from burnout.core.device import resolve_device
from burnout.errors import BurnoutError
from burnout.train.hardware import training_precision
from burnout.train.recipe import Pretraining, Recipe
from burnout.train.step import TrainStep, build_model


def measure_step_seconds(cfg: RunConfig, data_dir: Path, recipe: Recipe | None = None,
                         device: torch.device | None = None, precision: str | None = None, steps: int = 6) -> float:
    """The fastest of six timed training steps of `recipe` (default: pretraining) for this config, on one rank (no
    collectives), after one warm-up step (weights discarded). A time budget plans the steps that fit at this pace,
    and the clock places the slower ones (budget.TimeBudget), so the run ends at its budget; a plan made from a
    slower step ends early when the run's steps go faster than the probe's (docs/PERFORMANCE.md)."""
    tc, recipe = cfg.train, recipe or Pretraining()
    device = device or resolve_device(tc.device)
    loader = recipe.loaders(cfg, data_dir, tc.seq_len or cfg.model.context_length)["train"]
    # The precision the run will train in (on a CPU, auto as measured): a step timed in another one
    # mis-sizes the quickstart's budget (docs/PERFORMANCE.md).
    precision = precision or training_precision(tc.precision, device, say=lambda line: None)
    objective = recipe.objective(recipe.build_model(cfg, device), cfg, resumed=False)
    train_step = TrainStep(objective, tc, device, precision, end_of_run=tc.max_steps)
    times = []
    for step in range(steps + 1):
        t0 = time.perf_counter()
        train_step(loader, step)
        times.append(time.perf_counter() - t0)
    return min(times[1:])


def oom_message(tc: TrainConfig, seq_len: int) -> str:
    if tc.batch_size > 1:
        half = tc.batch_size // 2
        fix = (f"try train.batch_size={half} train.grad_accum={tc.grad_accum * tc.batch_size // half}"
               " (about the same tokens per step), or --auto-batch")
    else:
        fix = "try train.activation_checkpointing=true, a shorter train.seq_len or a smaller model"
    return f"out of GPU memory at micro-batch train.batch_size={tc.batch_size} × {seq_len} tokens; {fix}"


def largest_micro_batch(seqs_per_step: int, fits: Callable[[int], bool]) -> int:
    """The largest divisor of `seqs_per_step` (sequences per step per rank) for which `fits` holds."""
    for b in sorted((d for d in range(1, seqs_per_step + 1) if seqs_per_step % d == 0), reverse=True):
        if fits(b):
            return b
    raise BurnoutError("--auto-batch: not even a micro-batch of one sequence fits in memory; try "
                       "train.activation_checkpointing=true, a shorter train.seq_len or a smaller model")


@dataclasses.dataclass
class RandomBatches:
    """Batches of random token ids, shaped as the loader's: memory depends on shapes, not on the text."""
    vocab_size: int
    batch_size: int
    seq_len: int
    device: torch.device

    def get_batch(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randint(0, self.vocab_size, (self.batch_size, self.seq_len), device=self.device)
        return x, x


def memory_probe(cfg: RunConfig, device: torch.device, precision: str, seq_len: int,
                 build: Callable[[RunConfig, torch.device], torch.nn.Module] = build_model) -> Callable[[int], bool]:
    """fits(b): whether a full training step (forward, backward, optimizer) at micro-batch b fits on `device`,
    for the model `build` makes (the run's recipe's).

    Under torchrun each rank probes an unwrapped replica on its own: trial steps wrapped in DDP/FSDP would
    be collectives, and an out-of-memory on one rank mid-collective leaves the others waiting for it. DDP
    holds what the replica holds; FSDP holds less (its shards), so the batch found is one that fits."""
    model = build(cfg, device)
    # One micro-batch per step: accumulation adds no memory beyond the gradients every step keeps.
    # The optimizer's moments are allocated on the first step and kept for the next tries.
    train_step = TrainStep(model, dataclasses.replace(cfg.train, grad_accum=1), device, precision,
                           end_of_run=cfg.train.max_steps)

    def fits(b: int) -> bool:
        ok = True
        try:
            train_step(RandomBatches(cfg.model.vocab_size, b, seq_len, device), 0)
        except torch.OutOfMemoryError:
            ok = False
        # Outside the except block, so the traceback no longer pins the failed step's tensors.
        train_step.optimizer.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.empty_cache()
        return ok

    return fits
