"""Learning-rate schedules: linear warmup, then cosine or linear decay to min_lr, or
warmup-stable-decay (flat at lr, then a linear decay over the last `decay_fraction` of the steps).

The step a run ends at (`total_steps`) is the earliest of its limits, a time budget's planned steps among them
(`budget_steps`: train.max_minutes less the start-up, at train.step_seconds). Where a time-budgeted run's steps sit
on the schedule as the clock runs is train/budget.py's (TimeBudget); a run without one is placed by its step alone."""

import math

from burnout.config import TrainConfig

# A time-budgeted run warms up over at most this share of its planned steps, so that a short budget decays too.
BUDGET_WARMUP_SHARE = 0.1


def lr_at(step: float, cfg: TrainConfig, total_steps: int | None = None) -> float:
    """LR for the update made at `step` (0-based; a time-budgeted run's may lie between two steps) of a run
    whose schedule ends at `total_steps` (default: train.max_steps)."""
    total = cfg.max_steps if total_steps is None else total_steps
    warmup, optim = warmup_steps(cfg, total), cfg.optim
    if step < warmup:
        return optim.lr * (step + 1) / warmup
    if optim.schedule == "wsd":
        decay_start = max(warmup, total - round(optim.decay_fraction * total))
        progress = min(1.0, max(0, step - decay_start) / max(1, total - decay_start))
        return optim.lr - (optim.lr - optim.min_lr) * progress
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    if optim.schedule == "linear":
        return optim.lr - (optim.lr - optim.min_lr) * progress
    return optim.min_lr + 0.5 * (optim.lr - optim.min_lr) * (1.0 + math.cos(math.pi * progress))

def warmup_steps(cfg: TrainConfig, total: int) -> int:
    """train.warmup_steps; in a time-budgeted run at most BUDGET_WARMUP_SHARE of the `total` steps it planned
    (a user who sets max_steps below warmup_steps chose both; a budget's steps are the plan's)."""
    if cfg.budget.max_minutes is None:
        return cfg.optim.warmup_steps
    return min(cfg.optim.warmup_steps, max(1, int(BUDGET_WARMUP_SHARE * total)))


def budget_steps(minutes: float, step_seconds: float, startup_seconds: float = 0.0) -> int:
    """The steps of `step_seconds` each that fit in `minutes` less the `startup_seconds` the command spent before
    its first step: the plan of a time budget (at least one step)."""
    return max(1, int((minutes * 60 - startup_seconds) / step_seconds))


def total_steps(cfg: TrainConfig, tokens_per_step: int, train_tokens: int) -> int:
    """The step the run ends at: the earliest of max_steps, max_tokens, max_epochs and the steps that
    max_minutes plans at step_seconds each after its start-up (startup_seconds)."""
    limits = [cfg.max_steps]
    if cfg.budget.max_minutes is not None and cfg.budget.step_seconds is not None:
        budget = cfg.budget
        limits.append(budget_steps(budget.max_minutes, budget.step_seconds, budget.startup_seconds or 0.0))
    if cfg.max_tokens is not None:
        limits.append(math.ceil(cfg.max_tokens / tokens_per_step))
    if cfg.max_epochs is not None:
        limits.append(math.ceil(cfg.max_epochs * train_tokens / tokens_per_step))
    return max(1, min(limits))

