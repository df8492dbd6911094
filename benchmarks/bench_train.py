"""Training throughput of nanoGPT's 10.7M Shakespeare model (burnout/configs/shakespeare-10m.yaml) beside a peer.

    .venv/bin/python -m benchmarks.bench_train [--config shakespeare-10m] [--steps 5] [--variants auto fp32 ...]

Each variant is one `burnout bench CONFIG --json` in a fresh process, and the peer runs in a fresh process of
its own between them, in the same invocation: the same shape in transformers' GPT2LMHeadModel with nanoGPT's
settings (6 layers × 384, 6 heads, block 256, batch 16, dropout 0.2, AdamW at lr 1e-3), fp32, eager, as
nanoGPT's train.py runs on a CPU. Printed per variant: tokens/s, the step split, MFU against the matmul peak
measured in that process, peak RSS, the ratio to the peer measured in the same invocation, and the ceiling of
that ratio: our step's FLOPs all at the variant's measured matmul peak, against the FLOP/s the peer achieved
(on a CPU without fast bf16, the most an fp32 step can gain on an fp32 peer). Variants are `burnout bench`
overrides:

    auto      the config as it is (precision auto: bf16 or fp32, as a measurement on this CPU decided)
    fp32      train.precision=fp32
    bf16      train.precision=bf16 (autocast)
    compile   train.compile=true
    math      model.attention=math (explicit attention instead of SDPA)
    nodrop    model.dropout=0 (nanoGPT's run uses dropout 0.2, as the preset does)

The machine's load (uptime) is printed with each figure: timings on a shared machine are noisy.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

TARGET_RATIO = 2.5

VARIANTS = {
    "auto": [],
    "fp32": ["train.precision=fp32"],
    "bf16": ["train.precision=bf16"],
    "compile": ["train.compile=true"],
    "math": ["model.attention=math"],
    "nodrop": ["model.dropout=0"],
}


def load() -> str:
    return os.getloadavg().__repr__() if hasattr(os, "getloadavg") else "?"


def run_variant(config: str, overrides: list[str], steps: int, warmup: int, data: str | None) -> dict:
    cmd = [sys.executable, "-m", "burnout", "bench", config, "--json", "--steps", str(steps), "--warmup", str(warmup),
           *(["--data", data] if data else []), *overrides]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out[out.index("{"):])


def run_peer(steps: int, warmup: int) -> dict:
    cmd = [sys.executable, "-m", "benchmarks.bench_train", "--peer-only", "--steps", str(steps),
           "--warmup", str(warmup)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out[out.index("{"):])


def peer(steps: int, warmup: int) -> dict:
    """nanoGPT's Shakespeare-char training step in transformers' GPT2LMHeadModel, fp32 eager, on random
    character ids (the step's cost does not depend on which ids)."""
    import resource

    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(vocab_size=65, n_positions=256, n_embd=384, n_layer=6, n_head=6, resid_pdrop=0.2,
                     embd_pdrop=0.2, attn_pdrop=0.2)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = GPT2LMHeadModel(cfg).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.99), weight_decay=0.1)
    x = torch.randint(0, 65, (16, 256))

    def step() -> float:
        start = time.perf_counter()
        loss = model(input_ids=x, labels=x).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return time.perf_counter() - start

    for _ in range(warmup):
        step()
    step_s = statistics.median(step() for _ in range(steps))
    return {"tokens_per_s": 16 * 256 / step_s, "step_s": step_s, "params": sum(p.numel() for p in model.parameters()),
            "threads": torch.get_num_threads(),
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="shakespeare-10m")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--data", help="prepared data folder (default: prepared once into runs/bench-data/)")
    parser.add_argument("--variants", nargs="+", default=["auto", "fp32"], choices=sorted(VARIANTS))
    parser.add_argument("--peer-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.peer_only:
        print(json.dumps(peer(args.steps, args.warmup)))
        return
    from burnout.core.device import cpu_model

    print(f"{args.config}: median of {args.steps} steps after {args.warmup} warm-up, each run in a fresh process, "
          f"the peer measured between our variants; CPU {cpu_model()}, {os.cpu_count()} cores")
    peers = []
    for name in args.variants:
        before = load()
        peers.append(run_peer(args.steps, args.warmup))
        p = peers[-1]
        print(f"peer     {p['tokens_per_s']:>8,.0f} tokens/s  {p['step_s']:.2f} s/step  transformers GPT2LMHeadModel "
              f"({p['params']:,} params), fp32 eager, dropout 0.2, {p['threads']} threads, "
              f"peak RSS {p['peak_rss_mb']:,.0f} MB   load before {before}, after {load()}")
        before = load()
        r = run_variant(args.config, VARIANTS[name], args.steps, args.warmup, args.data)
        split = "  ".join(f"{part} {v:.1%}" for part, v in r["split_fraction"].items())
        print(f"{name:<8} {r['tokens_per_s']:>8,.0f} tokens/s  {r['step_s']:.2f} s/step  "
              f"{r['tokens_per_s'] / p['tokens_per_s']:.2f}x the peer just measured (target {TARGET_RATIO}x)  "
              f"{r['setup']['precision']}  MFU {format(r['mfu_measured'], '.1%') if 'mfu_measured' in r else '-'} "
              f"of {r['peak_flops_measured'] / 1e9:.0f} "
              f"GFLOP/s  peak RSS {r['peak_rss_mb']:,.0f} MB")
        peer_flops = p["tokens_per_s"] * r["flops_per_token"]  # the same shape: the same FLOPs per token
        print(f"         ceiling {r['peak_flops_measured'] / peer_flops:.2f}x: every FLOP at the "
              f"{r['setup']['precision']} peak, against the peer's achieved {peer_flops / 1e9:.0f} GFLOP/s")
        print(f"         split: {split}   load before {before}, after {load()}")


if __name__ == "__main__":
    main()
