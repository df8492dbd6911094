"""Validation loss: mean next-token cross-entropy over fixed, non-overlapping windows of a split."""

from __future__ import annotations

import math

import torch

from burnout.core.device import autocast
from burnout.data.loader import TokenLoader
from burnout.models import Transformer


@torch.no_grad()
def evaluate_loss(model: Transformer, loader: TokenLoader, num_batches: int, device: torch.device,
                  precision: str = "fp32") -> float:
    """Token-weighted mean loss over the first `num_batches` windows of the loader's split."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    for x, y in loader.iter_eval_batches(num_batches):
        x, y = x.to(device), y.to(device)
        with autocast(device, precision):
            loss = model(x, y)
        total += loss.item() * y.numel()
        count += y.numel()
    model.train(was_training)
    return total / count if count else math.nan
