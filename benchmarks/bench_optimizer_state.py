"""The optimizer's state per parameter, measured: AdamW's, Muon's and torchao's AdamW8bit's, on this machine.

    python -m benchmarks.bench_optimizer_state [--models llama-tiny llama-small ...] [--steps 6]

For each model preset and optimizer: the optimizer train.optimizer builds (burnout/train/optim.py:make_optimizer)
steps the model through `--steps` steps of random tokens; then the bytes of its state tensors are counted (a
torchao quantized moment counts its uint8 codes, block scales and lookup table), per parameter, beside what
`burnout plan` predicts for them (burnout/models/memory.py:static_bytes), and the median time of an optimizer
step after the first (whose torch.compile of torchao's update is not counted).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from benchmarks import results
from benchmarks.claims import CLAIMS
from burnout.config import load_run_config
from burnout.models import Transformer
from burnout.models.memory import param_counts, static_bytes
from burnout.train.optim import make_optimizer

OPTIMIZERS = ("adamw", "muon", "adamw8bit")


def tensor_bytes(t: torch.Tensor) -> int:
    """Bytes a state tensor holds: a tensor subclass's are its inner tensors'."""
    if is_traceable_wrapper_subclass(t):
        return sum(tensor_bytes(getattr(t, name)) for name in t.__tensor_flatten__()[0])
    return t.untyped_storage().nbytes()


def state_bytes(optimizer) -> int:
    """The moments (or momentum) of every parameter; the step counters left out, as the planner leaves them."""
    return sum(tensor_bytes(t) for opt in optimizer.optimizers for state in opt.state.values()
               for key, t in state.items() if key != "step")


def measure(preset: str, name: str, steps: int) -> dict:
    torch.manual_seed(0)
    cfg = load_run_config({"model": preset, "train": {"optimizer": name, "device": "cpu"}})
    model = Transformer(cfg.model)
    optimizer = make_optimizer(model, cfg.train)
    x = torch.randint(0, cfg.model.vocab_size, (1, 64))
    times = []
    for _ in range(steps):
        model(x, x).backward()
        start = time.perf_counter()
        optimizer.step()
        times.append(time.perf_counter() - start)
        optimizer.zero_grad()
    counts = param_counts(cfg.model)
    return {"params": counts.total, "measured": state_bytes(optimizer),
            "predicted": static_bytes(counts, name)["optimizer"], "step_s": statistics.median(times[1:])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=["llama-tiny", "llama-small"])
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    print(f"{'model':<14}{'optimizer':<11}{'params':>13}{'state MB':>11}{'bytes/param':>13}{'predicted':>11}"
          f"{'step ms':>10}")
    for preset in args.models:
        for name in OPTIMIZERS:
            load_before = results.load()
            m = measure(preset, name, args.steps)
            print(f"{preset:<14}{name:<11}{m['params']:>13,}{m['measured'] / 1e6:>11.2f}"
                  f"{m['measured'] / m['params']:>13.3f}{m['predicted'] / m['params']:>11.3f}"
                  f"{m['step_s'] * 1e3:>10.1f}", flush=True)
            if name == "adamw8bit" and f"runs.adamw8bit_bytes.{preset}" in CLAIMS:
                results.record(f"runs.adamw8bit_bytes.{preset}", m["measured"] / m["params"], load_before=load_before,
                               note=f"predicted {m['predicted'] / m['params']:.3f}")


if __name__ == "__main__":
    main()
