"""The training step, the only one: the loop, `burnout bench`, the quickstart's step timing and the
auto-batch memory probe all run `TrainStep`, so a benchmark times exactly what training runs.

One step: the learning rate of this step from the schedule, forward and backward over the step's
micro-batches (gradients synchronized across ranks on the last one only), the loss averaged across
ranks, the grad scaler unscaled (fp16), gradients clipped, and the update applied unless the loss or
the gradient is not finite.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from burnout.config import RunConfig, TrainConfig
from burnout.core.checkpoint import model_for
from burnout.core.device import autocast, to_float8_training
from burnout.errors import BurnoutError
from burnout.models import Transformer
from burnout.models.memory import checkpoint_blocks
from burnout.models.size import check_weights_fit
from burnout.models.transformer import unwrapped
from burnout.train.distributed import DistContext, grad_sync, mean_across_ranks
from burnout.train.optim import make_optimizer
from burnout.train.schedule import lr_at

# Called with the name of the part of a step that just ended ("data", "forward", "backward" once per
# micro-batch, "optimizer" once per step): how `burnout bench` splits a step's time.
Clock = Callable[[str], None]


def _no_clock(part: str) -> None:
    pass


def build_model(cfg: RunConfig, device: torch.device) -> Transformer:
    """A freshly initialized model on `device`, as training runs it: the run's module tree (core's model_for:
    with LoRA adapters when the run trains them, so a resumed run's checkpoint loads into it as saved);
    train.activation_checkpointing: each block's activations recomputed during backward instead of kept;
    train.precision=fp8: the blocks' linear layers in fp8."""
    if cfg.adapters is not None and cfg.train.precision == "fp8":
        raise BurnoutError(f"train.precision: fp8 converts the linear layers LoRA adapts; use bf16 with "
                           f"{cfg.adapters[0]}")
    check_weights_fit(cfg.model, "the run's model", "choose a smaller model (model.n_layer, model.d_model)")
    model = model_for(cfg).to(device)
    if cfg.train.precision == "fp8":
        model = to_float8_training(model, cfg.train.perf.fp8_recipe)
    return checkpoint_blocks(model) if cfg.train.perf.activation_checkpointing else model


def batch_index(step: int, micro: int, grad_accum: int, dist: DistContext) -> int:
    """The stream batch that micro-batch `micro` of this rank reads at `step` (see accumulate_gradients)."""
    return (step * dist.world_size + dist.rank) * grad_accum + micro


def batch_indices(start_step: int, grad_accum: int, dist: DistContext) -> Iterator[int]:
    """Every batch this rank reads from `start_step` on, in order: what a Prefetcher reads ahead."""
    for step in itertools.count(start_step):
        for micro in range(grad_accum):
            yield batch_index(step, micro, grad_accum, dist)


def accumulate_gradients(model, loader, step: int, grad_accum: int, device: torch.device, precision: str,
                         dist: DistContext | None = None, scaler: torch.amp.GradScaler | None = None,
                         clock: Clock = _no_clock) -> tuple[torch.Tensor, int]:
    """Forward and backward over one optimizer step's micro-batches; returns this rank's mean loss and the
    token positions it computed (a fine-tune with sft.pad_to_longest computes fewer than batch × seq_len).

    Micro-batch m of rank r at step s is batch (s·W + r)·A + m of the stream: a pure function of the
    step, so a resumed run sees the same data, and the same for every split of a global batch into
    ranks × accumulation, so W ranks accumulating A equal one process accumulating W·A.
    """
    dist = dist or DistContext()
    loss_sum = torch.zeros((), device=device)
    batches = [loader.get_batch(batch_index(step, micro, grad_accum, dist)) for micro in range(grad_accum)]
    # A loss that is a mean over rows (e.g. over preference pairs) rather than over target tokens: plain 1/A.
    objective = unwrapped(model)
    per_row = getattr(objective, "loss_per_row", False)
    weights = None if per_row else target_weights([batch[1] for batch in batches])
    positions = 0
    for micro, (x, y, *packed) in enumerate(batches):
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        # A packed batch also gives each token's position in its own sequence (finetune/tokenized.py).
        packing = {"positions": packed[0].to(device, non_blocking=True)} if packed else {}
        clock("data")
        with grad_sync(model, micro == grad_accum - 1):
            with autocast(device, precision):
                loss = model(x, y, **packing)
                # The model's loss is the mean over its micro-batch's targets (y != -1); the step's loss is the
                # mean over all the step's targets, so each micro-batch weighs by its share of them. Where
                # every micro-batch has as many targets (pretraining: all of them) this is the plain 1/A.
                loss = loss / grad_accum if weights is None else loss * weights[micro]
            clock("forward")
            (scaler.scale(loss) if scaler is not None else loss).backward()
            clock("backward")
        loss_sum += loss.detach()
        # An objective that builds its own batch from the one it is given (RL: the answers it samples) says how
        # many positions that batch had.
        built = getattr(objective, "positions_built", None)
        positions += x.numel() if built is None else built
    return loss_sum, positions


def target_weights(targets: list[torch.Tensor]) -> list[float] | None:
    """Each micro-batch's share of the step's targets (y != -1), or None when they all hold as many (the
    plain 1/A, kept as a division so that pretraining's arithmetic is unchanged).

    Exact per token within a rank's step. Under DDP/FSDP the ranks' gradients are still averaged with equal
    weights: making that exact too would take one more all-reduce (of the counts) before the backward of
    every step, and the ranks' counts differ little once a batch holds many conversations.
    """
    if len(targets) < 2:
        return None
    counts = [int((y != -1).sum()) for y in targets]
    if len(set(counts)) == 1:
        return None
    total = sum(counts)
    return [count / total for count in counts]


@dataclass
class StepResult:
    loss: float  # mean over the step's micro-batches and ranks
    grad_norm: float  # before clipping
    lr: float  # train.lr's schedule at this step (Muon's LR follows it in proportion)
    applied: bool  # False: the loss or the gradient was not finite and the update was skipped
    positions: int  # the token positions the step computed, all ranks (tokens/s and MFU count these)
    flags: list[bool] = dataclasses.field(default_factory=list)  # the stop flags, agreed across ranks
    flag_means: list[float] = dataclasses.field(default_factory=list)  # each flag's mean over ranks


class TrainStep:
    """The model (DDP/FSDP-wrapped or not), its optimizer and grad scaler, and how one step runs.

    `model` is what the parameters belong to; with train.compile the forward runs through
    torch.compile(model). `end_of_run` is the step the LR schedule ends at.
    """

    def __init__(self, model: torch.nn.Module, tc: TrainConfig, device: torch.device, precision: str,
                 end_of_run: int, dist: DistContext | None = None):
        self.model = model
        self.tc = tc
        self.device = device
        self.precision = precision
        self.end_of_run = end_of_run
        self.dist = dist or DistContext()  # one process
        self.optimizer = make_optimizer(model, tc, precision)
        self.scaler = torch.amp.GradScaler(device.type) if precision == "fp16" else None
        self.forward = torch.compile(model) if tc.perf.compile else model

    def run_eager(self) -> None:
        """Drop torch.compile (bench falls back to eager where the compiler is missing or fails)."""
        self.forward = self.model

    def __call__(self, loader, step: int, clock: Clock = _no_clock,
                 flags: Callable[[], list[float]] | None = None, schedule_step: float | None = None) -> StepResult:
        """One step. `flags()` (the loop's stop conditions) are asked for just before the loss is averaged
        across ranks and ride on that all-reduce: StepResult.flags[i] is true if flag i is true on any rank, and
        flag_means[i] is its mean over ranks. `schedule_step`: where the step's LR is on the schedule, when not
        at `step` (a time-budgeted run's, agreed across ranks)."""
        tc = self.tc
        lr = lr_at(step if schedule_step is None else schedule_step, tc, self.end_of_run)
        self.optimizer.scale_lr(lr / tc.optim.lr)
        loss_sum, positions = accumulate_gradients(self.forward, loader, step, tc.grad_accum, self.device,
                                                   self.precision, self.dist, self.scaler, clock)
        local = flags() if flags is not None else []
        # NOTE: one collective per step carries the loss and the stop flags; a flag averaged over ranks is > 0
        # when any rank raised it.
        reduced = mean_across_ranks(torch.cat([loss_sum.reshape(1), loss_sum.new_tensor(local)]), self.dist)
        if self.scaler is not None:
            self.optimizer.unscale(self.scaler)
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), tc.optim.grad_clip or float("inf"))
        grad_norm = grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm  # FSDP's DTensor
        # One host sync per step: whether to apply the update depends on it.
        loss, *agreed, norm = torch.cat([reduced, grad_norm.reshape(1).to(reduced.dtype)]).tolist()
        # Under fp16 an infinite gradient is the scaler's business (it skips and lowers the scale).
        applied = math.isfinite(loss) and (self.scaler is not None or math.isfinite(norm))
        if applied:
            self.optimizer.step(self.scaler)
        if self.scaler is not None:
            self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        clock("optimizer")
        # Rank 0's positions stand for every rank's: counting all of them exactly would take a collective.
        return StepResult(loss, norm, lr, applied, positions * self.dist.world_size, [value > 0 for value in agreed],
                          agreed)
