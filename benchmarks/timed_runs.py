"""What the benchmarks that train several runs share: a `burnout` command timed in its own process, and a run's
validation loss on any prepared data folder."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import torch


def burnout(*args: str) -> float:
    """Run one `burnout` command in a fresh process, on as many threads as torch has in this one; its wall seconds."""
    start = time.perf_counter()
    env = {**os.environ, "OMP_NUM_THREADS": str(torch.get_num_threads())}
    proc = subprocess.run([sys.executable, "-m", "burnout", *args], capture_output=True, text=True, env=env)
    if proc.returncode:
        sys.exit(f"burnout {' '.join(args)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return time.perf_counter() - start


def val_loss(run: Path, data: Path, batch_size: int, seq_len: int, batches: int) -> float:
    """The run's newest checkpoint's mean loss over the first `batches` val batches of `data`."""
    from burnout.core.model_files import load_model
    from burnout.data.loader import TokenLoader
    from burnout.eval.loss import evaluate_loss

    model, _, _ = load_model(run)
    loader = TokenLoader(data, "val", batch_size, seq_len, seed=0)
    with torch.no_grad():
        return evaluate_loss(model, loader, batches, torch.device("cpu"))
