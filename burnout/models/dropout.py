"""Dropout whose mask costs two random bytes an element on the CPU.

torch's CPU dropout draws a float per element with a Bernoulli sampler, several times as slow as drawing
random bytes; with dropout on, it dominates a small model's forward pass (docs/PERFORMANCE.md). Here the mask
is `random 16-bit integer < threshold`, four elements from each 64-bit draw: the keep probability is (1 - p)
rounded to a multiple of 1/65536 (0.8 → 0.8000030518), and kept values are scaled by its exact inverse, so the
expectation is the input's exactly (in fp32; bf16 rounds the scaled values to its 8 bits, as torch's dropout
does) and the variance differs from torch's by less than 1e-5 relative. The words come from numpy's PCG64,
about twice as fast as torch's CPU generator (docs/PERFORMANCE.md), seeded by one draw from torch's default
generator per mask: the state checkpoints save and resume restores still replays every mask. Compiled graphs and
GPUs keep F.dropout: inductor and CUDA draw their masks fast already.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch._subclasses.fake_tensor import is_fake

LEVELS = 1 << 16  # a 16-bit draw per element


def keep_probability(p: float) -> float:
    """The probability an element is kept: 1 - p on a 1/65536 grid."""
    return round((1 - p) * LEVELS) / LEVELS


def dropout(x: torch.Tensor, p: float, training: bool = True) -> torch.Tensor:
    if not training or p == 0:
        return x
    if x.device.type != "cpu" or torch.compiler.is_compiling() or not 0 < keep_probability(p) < 1:
        return F.dropout(x, p, training=True)
    keep = keep_probability(p)
    draws = random_words((x.numel() + 3) // 4, x).view(torch.int16)[: x.numel()].view(x.shape)  # [-32768, 32767]
    # 1 or 0 in x's dtype straight from the comparison: a bool mask needs torch.where or a cast, which do not
    # vectorize on a CPU.
    kept = torch.lt(draws, round(keep * LEVELS) - LEVELS // 2, out=torch.empty_like(x))  # P = keep
    return x * kept * (1 / keep)


def random_words(count: int, like: torch.Tensor) -> torch.Tensor:
    """`count` uniform 64-bit words (int64), from a PCG64 seeded by torch's default generator; for a fake tensor
    `like` (the memory plan runs the model on them: models/memory.py), from torch's generator, as no seed can be
    read there."""
    if is_fake(like):
        return torch.empty(count, dtype=torch.int64).random_(-(1 << 63), (1 << 63) - 1)
    seed = int(torch.randint(0, 1 << 62, (), dtype=torch.int64))
    return torch.from_numpy(np.random.PCG64(seed).random_raw(count).view(np.int64))


class Dropout(nn.Module):
    """nn.Dropout with `dropout`'s cheaper mask."""

    def __init__(self, p: float):
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"
