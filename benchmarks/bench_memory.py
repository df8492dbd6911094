"""Predicted peak memory (`burnout plan`'s accounting) against the measured peak of real training steps.

    python -m benchmarks.bench_memory [--only NAME ...] [--device cpu|cuda]

Each case builds the model as training does (burnout.train.step.build_model), runs two training steps of
random tokens through TrainStep (the first allocates the optimizer's state), and compares the peak of
allocated bytes over both with burnout.train.plan.predict_memory for the same config:

- CPU: the peak of the CPU allocator's running total, from torch.profiler's allocation events
  (profile_memory=True) over building the model and both steps. Allocated bytes, not RSS.
- CUDA (when available or --device cuda): torch.cuda.max_memory_allocated over the same, beside
  max_memory_reserved; the prediction is compared without its assumed CUDA context and allocator margin
  (neither is in max_memory_allocated), and the full prediction with reserved + the context is printed too.

A ratio above 1 means the planner over-predicts. Each case prints one row as it finishes.
"""

from __future__ import annotations

import argparse
import time

import torch

from benchmarks import results
from burnout.config import load_run_config
from burnout.train.plan import GIB, Variant, predict_memory
from burnout.train.probe import RandomBatches
from burnout.train.step import TrainStep, build_model

# name: (model preset, train section). Small enough for a laptop CPU; accumulation 2 as the 1B run (4) has,
# so the peak is a micro-batch's with the gradients of the one before it already allocated.
CASES = {
    "llama-tiny": ("llama-tiny", {"batch_size": 8, "grad_accum": 2, "seq_len": 256, "precision": "bf16"}),
    "llama-tiny-ckpt": ("llama-tiny", {"batch_size": 8, "grad_accum": 2, "seq_len": 256, "precision": "bf16",
                                       "activation_checkpointing": True}),
    "gpt2-10m": ("gpt2-10m", {"batch_size": 16, "grad_accum": 2, "seq_len": 256, "precision": "bf16"}),
    "llama-small-fp32": ("llama-small", {"batch_size": 4, "grad_accum": 2, "seq_len": 512, "precision": "fp32"}),
    "gpt2-10m-compiled": ("gpt2-10m", {"batch_size": 16, "grad_accum": 2, "seq_len": 256, "precision": "bf16",
                                       "compile": True}),
    "llama-small-compiled": ("llama-small", {"batch_size": 4, "grad_accum": 2, "seq_len": 512, "precision": "bf16",
                                             "compile": True}),
}


def run_steps(cfg, device: torch.device) -> None:
    """Two training steps as `burnout train` runs them: the model built, then TrainStep on random tokens."""
    tc = cfg.train
    seq_len = tc.seq_len or cfg.model.context_length
    model = build_model(cfg, device)
    step = TrainStep(model, tc, device, tc.precision, end_of_run=tc.max_steps)
    batches = RandomBatches(cfg.model.vocab_size, tc.batch_size, seq_len, device)
    for i in range(2):
        step(batches, i)


def cpu_peak(cfg) -> int:
    """Peak of the CPU allocator's running total while `run_steps` runs, from the profiler's allocation events."""
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        run_steps(cfg, torch.device("cpu"))
    allocations = []
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        if node.tag == _EventType.Allocation and node.extra_fields.device.type == "cpu":
            allocations.append((node.start_time_ns, node.extra_fields.alloc_size))
        stack.extend(node.children)
    live = peak = 0
    for _, size in sorted(allocations):
        live += size
        peak = max(peak, live)
    return peak


def cuda_peak(cfg) -> tuple[int, int]:
    device = torch.device("cuda")
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    run_steps(cfg, device)
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device) - base, torch.cuda.max_memory_reserved(device)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", choices=list(CASES), help="run these cases only")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    target = "cpu"
    if args.device == "cuda":
        target = "cuda" if torch.cuda.get_device_capability() >= (8, 0) else "cuda-pre-ampere"
    print(f"device {args.device} (torch {torch.__version__}); GiB; predicted = planner, measured = "
          + ("torch.cuda.max_memory_allocated" if args.device == "cuda" else "profiler's peak of allocated bytes"))
    print(f"{'case':<22}{'variant':<18}{'predicted':>10}{'measured':>10}{'ratio':>8}{'plan s':>8}{'run s':>8}")
    for name in args.only or CASES:
        load_before = results.load()
        preset, train = CASES[name]
        cfg = load_run_config({"model": preset, "train": {**train, "device": args.device, "max_steps": 2}})
        tc = cfg.train
        variant = Variant(tc.perf.compile, tc.perf.activation_checkpointing)
        t0 = time.perf_counter()
        lines = predict_memory(cfg, tc.precision, target, 1, tc.batch_size, variant)
        t1 = time.perf_counter()
        if args.device == "cuda":
            measured, reserved = cuda_peak(cfg)
        else:
            measured, reserved = cpu_peak(cfg), None
        t2 = time.perf_counter()
        predicted = lines["total"] - lines.get("overhead", 0)  # what the allocator itself counts
        print(f"{name:<22}{variant.name:<18}{predicted / GIB:>10.4f}{measured / GIB:>10.4f}"
              f"{predicted / measured:>8.3f}{t1 - t0:>8.1f}{t2 - t1:>8.1f}", flush=True)
        if args.device == "cpu":
            results.record(f"runs.planner_cpu.{name}", 100 * (predicted / measured - 1), load_before=load_before)
        if reserved is not None:
            print(f"{'':<22}{'with overhead':<18}{lines['total'] / GIB:>10.4f}{reserved / GIB:>10.4f}"
                  f"{lines['total'] / reserved:>8.3f}  (predicted total vs max_memory_reserved, no context)")


if __name__ == "__main__":
    main()
