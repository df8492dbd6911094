"""The random number generators a run draws from (Python, NumPy, torch CPU and CUDA), saved into a
checkpoint's state.pt and restored on resume, so that a resumed run draws what the uninterrupted one would."""

from __future__ import annotations

import random

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def rng_state(device: torch.device) -> dict:
    """Every generator's state as tensors, numbers and tuples, which torch.load(weights_only=True) accepts."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    state = {
        "python_rng": random.getstate(),
        "numpy_rng": {"keys": torch.from_numpy(keys.astype(np.int64)), "pos": pos, "has_gauss": has_gauss,
                      "cached": cached},
        "torch_rng": torch.get_rng_state(),
    }
    if device.type == "cuda":
        state["cuda_rng"] = torch.cuda.get_rng_state(device)
    return state


def restore_rng_state(state: dict, device: torch.device) -> None:
    """Put back what rng_state saved (a checkpoint's state.pt holds those keys beside the rest)."""
    random.setstate(state["python_rng"])
    numpy = state["numpy_rng"]
    np.random.set_state(("MT19937", numpy["keys"].numpy().astype(np.uint32), numpy["pos"], numpy["has_gauss"],
                         numpy["cached"]))
    torch.set_rng_state(state["torch_rng"])
    if device.type == "cuda" and "cuda_rng" in state:
        torch.cuda.set_rng_state(state["cuda_rng"], device)
