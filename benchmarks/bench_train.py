"""Training throughput on this machine: tokens/s and MFU of a small preset at fp32 and bf16 autocast.

    .venv/bin/python benchmarks/bench_train.py [--preset llama-tiny] [--batch-size 8] [--seq-len 256] [--steps 10]

MFU = tokens/s × training FLOPs per token (burnout.models.info) / peak FLOP/s. On a CPU the peak is
measured (best 1024³ matmul in the same precision, burnout.train.hardware), so the two MFUs have
different denominators; on a GPU it is the configs/hardware.yaml figure. Data are random token ids:
this measures the model step (forward, backward, AdamW), not the loader.
"""

from __future__ import annotations

import argparse
import time

import torch

from burnout.config import TrainConfig, load_model_preset
from burnout.models import Transformer
from burnout.models.info import flops_per_token, matmul_parameters
from burnout.train.device import autocast, configure_backends, resolve_device
from burnout.train.hardware import get_hardware
from burnout.train.loop import make_optimizer


def bench(preset: str, precision: str, batch_size: int, seq_len: int, steps: int, device: torch.device) -> dict:
    torch.manual_seed(0)
    cfg = load_model_preset(preset)
    model = Transformer(cfg).to(device)
    optimizer = make_optimizer(model, TrainConfig(), device)
    x = torch.randint(0, cfg.vocab_size, (batch_size, seq_len + 1), device=device)
    times = []
    for _ in range(steps + 2):  # two warm-up steps
        t0 = time.perf_counter()
        with autocast(device, precision):
            loss = model(x[:, :-1], x[:, 1:])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        loss.item()
        times.append(time.perf_counter() - t0)
    step_s = sorted(times[2:])[len(times[2:]) // 2]
    tokens_per_s = batch_size * seq_len / step_s
    fpt = flops_per_token(cfg, seq_len, matmul_parameters(model))["flops_per_token"]
    hw = get_hardware("auto", precision, device=device)
    return {"precision": precision, "step_s": step_s, "tokens_per_s": tokens_per_s,
            "achieved_gflops": tokens_per_s * fpt / 1e9, "peak_gflops": hw.peak_flops / 1e9,
            "mfu": tokens_per_s * fpt / hw.peak_flops, "hardware": hw.name}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="llama-tiny")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--device", default="auto")
    args = parser.parse_args()
    device = resolve_device(args.device)
    configure_backends(device)
    print(f"{args.preset}, batch {args.batch_size} × {args.seq_len} tokens, median of {args.steps} steps, "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    for precision in ("fp32", "bf16"):
        r = bench(args.preset, precision, args.batch_size, args.seq_len, args.steps, device)
        print(f"{precision}: {r['tokens_per_s']:>9,.0f} tokens/s  {r['step_s'] * 1000:>7.1f} ms/step  "
              f"{r['achieved_gflops']:>7.1f} GFLOP/s of a {r['peak_gflops']:.1f} peak → MFU {r['mfu']:.1%}"
              f"  ({r['hardware']})")


if __name__ == "__main__":
    main()
