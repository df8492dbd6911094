"""Learning-rate schedules: linear warmup, then cosine or linear decay to min_lr, or
warmup-stable-decay (flat at lr, then a linear decay over the last `decay_fraction` of the steps).

A run with a time budget (train.max_minutes) plans its steps from a step's seconds (train.step_seconds) and
places each step on the schedule at the larger of its step and the share of the budget spent (`TimeBudget`):
when the machine slows down, warmup and decay still end at the budget, and the last step is at the final LR.
A run without one is placed by its step alone, as it always was."""

import math
import statistics

from burnout.config import TrainConfig

# A time-budgeted run warms up over at most this share of its planned steps, so that a short budget decays too.
BUDGET_WARMUP_SHARE = 0.1
# A time budget predicts a step's seconds by the median of the session's last few: on a busy machine neighbouring
# steps differ widely (docs/PERFORMANCE.md). The step about to run is predicted by the latest step where that took
# longer: the median of five alone follows a sudden slowdown only after three steps, each over the budget.
PREDICT_FROM_STEPS = 5


def lr_at(step: float, cfg: TrainConfig, total_steps: int | None = None) -> float:
    """LR for the update made at `step` (0-based; a time-budgeted run's may lie between two steps) of a run
    whose schedule ends at `total_steps` (default: train.max_steps)."""
    total = cfg.max_steps if total_steps is None else total_steps
    warmup = warmup_steps(cfg, total)
    if step < warmup:
        return cfg.lr * (step + 1) / warmup
    if cfg.schedule == "wsd":
        decay_start = max(warmup, total - round(cfg.decay_fraction * total))
        progress = min(1.0, max(0, step - decay_start) / max(1, total - decay_start))
        return cfg.lr - (cfg.lr - cfg.min_lr) * progress
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    if cfg.schedule == "linear":
        return cfg.lr - (cfg.lr - cfg.min_lr) * progress
    return cfg.min_lr + 0.5 * (cfg.lr - cfg.min_lr) * (1.0 + math.cos(math.pi * progress))


def warmup_steps(cfg: TrainConfig, total: int) -> int:
    """train.warmup_steps; in a time-budgeted run at most BUDGET_WARMUP_SHARE of the `total` steps it planned
    (a user who sets max_steps below warmup_steps chose both; a budget's steps are the plan's)."""
    if cfg.max_minutes is None:
        return cfg.warmup_steps
    return min(cfg.warmup_steps, max(1, int(BUDGET_WARMUP_SHARE * total)))


def budget_steps(minutes: float, step_seconds: float) -> int:
    """The steps of `step_seconds` each that fit in `minutes`: the plan of a time budget."""
    return max(1, int(minutes * 60 / step_seconds))


def total_steps(cfg: TrainConfig, tokens_per_step: int, train_tokens: int) -> int:
    """The step the run ends at: the earliest of max_steps, max_tokens, max_epochs and the steps that
    max_minutes plans at step_seconds each."""
    limits = [cfg.max_steps]
    if cfg.max_minutes is not None and cfg.step_seconds is not None:
        limits.append(budget_steps(cfg.max_minutes, cfg.step_seconds))
    if cfg.max_tokens is not None:
        limits.append(math.ceil(cfg.max_tokens / tokens_per_step))
    if cfg.max_epochs is not None:
        limits.append(math.ceil(cfg.max_epochs * train_tokens / tokens_per_step))
    return max(1, min(limits))


class TimeBudget:
    """Where a time-budgeted run's steps sit on its schedule, and when its budget is spent.

    `fraction` is the share of the budget at whose end the step about to run is predicted to end, agreed
    across ranks (each rank's prediction rides on the train step's all-reduce; their mean is used, and never
    goes down). A step is placed at the larger of its own step and that share of the `total` steps planned,
    at most the last: a step predicted to end at or past the budget gets the final LR, and is the last
    (`spent`). A session's first step is predicted from the checkpoint's elapsed_s and the plan's step, the same
    on every rank."""

    def __init__(self, tc: TrainConfig, total: int, elapsed_before: float):
        self.seconds, self.total = tc.max_minutes * 60, total
        self.planned_step_seconds = tc.step_seconds
        self.fraction = (elapsed_before + tc.step_seconds) / self.seconds
        self.local = self.fraction  # this rank's prediction for the next step, before agreement
        self.recent: list[float] | None = None  # this session's last steps' seconds, from its second step on

    def step_starts(self, elapsed: float) -> None:
        """At a step's start, `elapsed` into the run: predict where the step after it ends (two steps on)."""
        if self.recent:  # the step about to run like the latest, if slower, and the one after like the median
            median = statistics.median(self.recent)
            self.local = (elapsed + max(median, self.recent[-1]) + median) / self.seconds
        else:
            self.local = (elapsed + 2 * self.planned_step_seconds) / self.seconds

    def step_took(self, seconds: float) -> None:
        """A session's first step (compilation, warm-up) predicts nothing; the later ones predict the next."""
        if self.recent is None:
            self.recent = []
        else:
            self.recent = [*self.recent, seconds][-PREDICT_FROM_STEPS:]

    def schedule_step(self, step: int) -> float:
        """The schedule position of the update made at `step`."""
        return min(self.total - 1, max(step, self.fraction * self.total - 1))

    def agree(self, agreed: float) -> bool:
        """After a step, with the ranks' agreed prediction: whether that step was the budget's last."""
        spent = self.fraction >= 1
        self.fraction = max(self.fraction, agreed)
        return spent
