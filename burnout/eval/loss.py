"""Validation loss: mean next-token cross-entropy over fixed, non-overlapping windows of a split (or the
first batches of an SFT split, counting its assistant tokens alone)."""

from __future__ import annotations

import math

import torch

from burnout.core.device import autocast
from burnout.data.loader import TokenLoader
from burnout.models import Transformer


@torch.no_grad()
def evaluate_loss(model: Transformer, loader: TokenLoader, num_batches: int, device: torch.device,
                  precision: str = "fp32") -> float:
    """Mean loss per target token (y != -1) over the first `num_batches` batches of the loader's split."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    for x, y in loader.iter_eval_batches(num_batches):
        x, y = x.to(device), y.to(device)
        with autocast(device, precision):
            loss = model(x, y)
        # Weighted by the batch's targets: SFT batches hold -1 (no target) off the assistant tokens.
        targets = int((y != -1).sum())
        if targets:
            total += loss.item() * targets
            count += targets
    model.train(was_training)
    return total / count if count else math.nan
