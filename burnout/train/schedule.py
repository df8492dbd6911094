"""Learning-rate schedules: linear warmup, then cosine or linear decay to min_lr, or
warmup-stable-decay (flat at lr, then a linear decay over the last `decay_fraction` of the steps)."""

import math

from burnout.config import TrainConfig


def lr_at(step: int, cfg: TrainConfig, total_steps: int | None = None) -> float:
    """LR for the update made at `step` (0-based) of a run whose schedule ends at `total_steps`
    (default: train.max_steps)."""
    total = cfg.max_steps if total_steps is None else total_steps
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    if cfg.schedule == "wsd":
        decay_start = max(cfg.warmup_steps, total - round(cfg.decay_fraction * total))
        progress = min(1.0, max(0, step - decay_start) / max(1, total - decay_start))
        return cfg.lr - (cfg.lr - cfg.min_lr) * progress
    progress = min(1.0, (step - cfg.warmup_steps) / max(1, total - cfg.warmup_steps))
    if cfg.schedule == "linear":
        return cfg.lr - (cfg.lr - cfg.min_lr) * progress
    return cfg.min_lr + 0.5 * (cfg.lr - cfg.min_lr) * (1.0 + math.cos(math.pi * progress))


def total_steps(cfg: TrainConfig, tokens_per_step: int, train_tokens: int) -> int:
    """The step the run ends at: the earliest of max_steps, max_tokens and max_epochs."""
    limits = [cfg.max_steps]
    if cfg.max_tokens is not None:
        limits.append(math.ceil(cfg.max_tokens / tokens_per_step))
    if cfg.max_epochs is not None:
        limits.append(math.ceil(cfg.max_epochs * train_tokens / tokens_per_step))
    return max(1, min(limits))
