"""Training throughput of nanoGPT's 10.7M Shakespeare model (burnout/configs/shakespeare-10m.yaml) against nanoGPT.

    .venv/bin/python -m benchmarks.bench_train [--config shakespeare-10m] [--steps 5] [--variants fp32 bf16 ...]

Each variant is one `burnout bench CONFIG --json` in a fresh process, run back to back (so peak RSS is
that variant's own), and printed with tokens/s, the step split, MFU against the matmul peak measured in
that process, peak RSS, and the ratio to nanoGPT's figures on this machine type (torch 2.13 CPU, fp32,
no compile: 2.15 s/iteration = 1.9K tokens/s, 2.4 GB peak RSS). Variants are `burnout bench` overrides:

    fp32      train.precision=fp32 (the default on this CPU)
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
import subprocess
import sys

NANOGPT_TOKENS_PER_S = 16 * 256 / 2.15  # 1,905
NANOGPT_RSS_MB = 2.4 * 1024
TARGET_RATIO = 2.5

VARIANTS = {
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="shakespeare-10m")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--data", help="prepared data folder (default: prepared once into runs/bench-data/)")
    parser.add_argument("--variants", nargs="+", default=["fp32", "bf16"], choices=sorted(VARIANTS))
    args = parser.parse_args()
    print(f"{args.config}: median of {args.steps} steps after {args.warmup} warm-up, each variant in a fresh process")
    results = {}
    for name in args.variants:
        before = load()
        r = run_variant(args.config, VARIANTS[name], args.steps, args.warmup, args.data)
        results[name] = r
        split = "  ".join(f"{p} {v:.1%}" for p, v in r["split_fraction"].items())
        print(f"{name:<8} {r['tokens_per_s']:>8,.0f} tokens/s  {r['step_s']:.2f} s/step  "
              f"{r['tokens_per_s'] / NANOGPT_TOKENS_PER_S:.2f}x nanoGPT (target {TARGET_RATIO}x)  "
              f"MFU {r['mfu_measured']:.1%} of {r['peak_flops_measured'] / 1e9:.0f} GFLOP/s {r['setup']['precision']}  "
              f"peak RSS {r['peak_rss_mb']:,.0f} MB ({r['peak_rss_mb'] / NANOGPT_RSS_MB:.0%} of nanoGPT's)")
        print(f"         split: {split}   load before {before}, after {load()}")
    if "fp32" in results and "bf16" in results:
        print(f"bf16 / fp32 tokens/s: {results['bf16']['tokens_per_s'] / results['fp32']['tokens_per_s']:.2f}x")


if __name__ == "__main__":
    main()
