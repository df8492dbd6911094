"""Training throughput on one CUDA GPU against transformers' own model of the same shape, side by side.

    python -m benchmarks.bench_gpu [--shapes llama-1b gpt2-134m] [--steps 10] [--fp8 [RECIPE ...]] [--profile]
                                   [--memory [SHAPE ...]] [--curve DATA_DIR] [--packing SFT_DATA_DIR] [--no-peer]

For each shape, `TrainStep` (the step `burnout train` runs: bf16 autocast, torch.compile, fused AdamW, SDPA,
grad clipping) and the peer (benchmarks/peer_step.py: transformers' LlamaForCausalLM / GPT2LMHeadModel, the same
settings) run one after the other in fresh processes on random tokens, the peer at the same micro-batch and
tokens per step (half the micro-batch, accumulated twice, where it runs out of memory). Printed: tokens/s (median
step after two warm-up steps), MFU over the GPU's dense bf16 datasheet peak (burnout/configs/hardware.yaml; FLOPs
per token as `burnout model info` counts them, for both), peak memory (torch.cuda.max_memory_allocated), ours /
peer, and the memory planner's compiled prediction against our step's peak.

    --fp8 [RECIPE ...]  also our llama-1b step with train.precision=fp8 (torchao Float8Linear) at each
               train.fp8_recipe named (none named: tensorwise), and its ratio to our bf16
    --profile  a torch.profiler kernel breakdown of our step (where the time goes, by kernel family)
    --memory [SHAPE ...]  the memory planner's prediction (`burnout plan`) against max_memory_allocated, eager
               and with activation checkpointing, and the step's tokens/s (the mean of steps 2 and 3), for the
               cases of MEMORY_CASES (llama-1b, gpt2-134m, and llama-2b/3b at the fixes that fit them on 80 GB)
    --curve    llama-1b loss curves on prepared data, two runs at a time: bf16 at seeds 0 and 1 (how far two
               bf16 runs differ), and fp8 at seed 0 for each recipe --fp8 names; mean loss over the last 50 steps
    --packing SFT_DATA_DIR  llama-1b fine-tuning steps on a prepared SFT data folder (a `burnout sft` run's data/),
               padded to the batch's longest (sft.pad_to_longest) and packed (sft.packing): assistant targets/s

Every figure comes from this invocation on this machine; nothing is typed in. Each figure the docs quote is
appended to benchmarks/results.jsonl (benchmarks/results.py), with the GPU, its driver and torch.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import get_args, get_type_hints

from benchmarks import results
from burnout.config import PerfConfig

REPO = Path(__file__).resolve().parent.parent
# (micro-batch, sequence length) per shape: llama-1b at the blog's 16 × 2048, gpt2-134m at its context.
SHAPES = {"llama-1b": (16, 2048), "gpt2-134m": (64, 512)}
# (shape, micro-batch, checkpointing) at the shape's sequence length; llama-2b/3b at the two fixes `burnout plan`
# names for one 80 GB GPU: activation checkpointing at micro-batch 8, or micro-batch 2 eager (3b).
MEMORY_CASES = [("llama-1b", 4, False), ("llama-1b", 8, False), ("llama-1b", 8, True), ("llama-1b", 16, True),
                ("gpt2-134m", 16, False), ("gpt2-134m", 32, False), ("gpt2-134m", 32, True), ("gpt2-134m", 64, True),
                ("llama-2b", 8, True), ("llama-3b", 8, True), ("llama-3b", 2, False)]
MEMORY_SEQ = {"llama-2b": 2048, "llama-3b": 2048, **{shape: seq for shape, (_, seq) in SHAPES.items()}}
CURVE = {"batch": 8, "seq": 1024, "steps": 300, "tail": 50}
PACKING = {"batch": 8, "warmup": 6}
FP8_RECIPES = list(get_args(get_type_hints(PerfConfig)["fp8_recipe"]))  # train.fp8_recipe's values
GIB = 2**30


# ----------------------------------------------------------------------------------------------
# Workers: each measurement in a fresh process, so compile caches and memory peaks are its own.


def run_config(shape: str, batch: int, seq: int, precision: str, compile_: bool, checkpointing: bool = False,
               vocab: int | None = None, device: str = "cuda", **train):
    """The run config of every step timed here, ours and the peer's (benchmarks/peer_step.py)."""
    from burnout.config import load_run_config

    model = {"preset": shape, **({"vocab_size": vocab} if vocab else {})}
    return load_run_config({"model": model, "train": {
        "device": device, "precision": precision, "compile": compile_, "activation_checkpointing": checkpointing,
        "batch_size": batch, "seq_len": seq, "grad_accum": 1, "max_steps": 100_000, "warmup_steps": 10,
        "lr": 3e-4, "min_lr": 3e-5, "grad_clip": 1.0, **train}})


def _precision(variant: str) -> tuple[str, str]:
    """("fp8", "rowwise") for "fp8:rowwise"; a variant without a recipe runs the default, tensorwise."""
    precision, _, recipe = variant.partition(":")
    return precision, recipe or "tensorwise"


def _flops_per_token(cfg, model) -> int:
    from burnout.models.info import flops_per_token, matmul_parameters

    return flops_per_token(cfg.model, cfg.train.seq_len, matmul_parameters(model))["flops_per_token"]


def _bf16_peak() -> tuple[str, float]:
    import torch

    from burnout.train.hardware import get_hardware

    hw = get_hardware("auto", "bf16", device=torch.device("cuda"))
    return hw.name, hw.peak_flops


def worker_step(shape: str, batch: int, seq: int, steps: int, variant: str, compile_: bool,
                checkpointing: bool, profile: bool) -> dict:
    import torch

    from burnout.core.device import configure_backends
    from burnout.train.probe import RandomBatches
    from burnout.train.step import TrainStep, build_model

    precision, recipe = _precision(variant)
    cfg = run_config(shape, batch, seq, precision, compile_, checkpointing, fp8_recipe=recipe)
    device = torch.device("cuda")
    configure_backends(device)
    planned = None
    if precision == "bf16":  # the planner's prediction of this very step, less its context and margin line
        from burnout.train.plan import Variant, predict_memory

        lines = predict_memory(cfg, "bf16", "cuda", 1, batch, Variant(compile_, checkpointing))
        planned = (lines["total"] - lines.get("overhead", 0)) / GIB
    torch.manual_seed(0)
    model = build_model(cfg, device)
    step = TrainStep(model, cfg.train, device, precision, end_of_run=cfg.train.max_steps)
    batches = RandomBatches(cfg.model.vocab_size, batch, seq, device)
    t0 = time.perf_counter()
    step(batches, 0)
    first = time.perf_counter() - t0
    step(batches, 1)
    times = []
    for i in range(steps):
        t0 = time.perf_counter()
        step(batches, 2 + i)  # ends in a host sync (the loss and grad norm are read)
        times.append(time.perf_counter() - t0)
    median = statistics.median(times)
    gpu, peak = _bf16_peak()
    tokens_per_s = batch * seq / median
    result = {"who": "ours", "shape": shape, "batch": batch, "seq": seq, "precision": variant, "compile": compile_,
              "checkpointing": checkpointing, "tokens_per_s": tokens_per_s, "ms_per_step": median * 1000,
              "first_step_s": first, "peak_gib": torch.cuda.max_memory_allocated() / GIB,
              "flops_per_token": _flops_per_token(cfg, model), "gpu": gpu, "peak_flops": peak,
              "planned_gib": planned}
    result["mfu"] = result["flops_per_token"] * tokens_per_s / peak
    if profile:
        result["kernels"] = _kernel_breakdown(lambda: step(batches, 99))
    return result


# Kernel families by name, first match wins: where a step's GPU time goes.
FAMILIES = [("attention (flash/cudnn)", ("flash", "fmha", "sdpa", "attention")),
            ("matmul (cuBLAS/CUTLASS)", ("gemm", "cutlass", "sm90_xmma", "nvjet", "cublas", "scaled_mm")),
            ("optimizer (fused AdamW)", ("adam",)),
            ("loss / softmax", ("cross_entropy", "log_softmax", "nll")),
            ("fused elementwise (triton)", ("triton",)),
            ("copies / casts", ("copy", "cast", "fill", "memset", "memcpy")),
            ("reductions (norm, clip)", ("reduce", "norm"))]


def _kernel_breakdown(run_step) -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(2):
            run_step()
        torch.cuda.synchronize()
    totals: dict[str, float] = {}
    top = []
    for event in prof.key_averages():
        us = getattr(event, "self_device_time_total", 0) or getattr(event, "self_cuda_time_total", 0)
        if us <= 0:
            continue
        name = event.key.lower()
        family = next((f for f, keys in FAMILIES if any(k in name for k in keys)), "other")
        totals[family] = totals.get(family, 0.0) + us / 2e3  # ms per step
        top.append((us / 2e3, event.key[:90]))
    return {"families_ms": dict(sorted(totals.items(), key=lambda kv: -kv[1])),
            "top_kernels_ms": sorted(top, reverse=True)[:12]}


def worker_memory(shape: str, batch: int, seq: int, checkpointing: bool) -> dict:
    import torch

    from burnout.core.device import configure_backends
    from burnout.train.plan import Variant, predict_memory
    from burnout.train.probe import RandomBatches
    from burnout.train.step import TrainStep, build_model

    cfg = run_config(shape, batch, seq, "bf16", False, checkpointing)
    device = torch.device("cuda")
    configure_backends(device)
    predicted = predict_memory(cfg, "bf16", "cuda", 1, batch, Variant(False, checkpointing))
    step = TrainStep(build_model(cfg, device), cfg.train, device, "bf16", end_of_run=cfg.train.max_steps)
    batches = RandomBatches(cfg.model.vocab_size, batch, seq, device)
    times = []
    for i in range(3):
        t0 = time.perf_counter()
        step(batches, i)  # ends in a host sync
        times.append(time.perf_counter() - t0)
    # torch.cuda.max_memory_allocated counts the allocator's tensors only: compare with the prediction less
    # its CUDA context and allocator margin (the "overhead" line, which no allocator figure shows).
    allocated = predicted["total"] - predicted.get("overhead", 0)
    measured = torch.cuda.max_memory_allocated()
    return {"shape": shape, "batch": batch, "seq": seq, "checkpointing": checkpointing,
            "predicted_gib": allocated / GIB, "predicted_total_gib": predicted["total"] / GIB,
            "measured_gib": measured / GIB, "error": allocated / measured - 1,
            "reserved_gib": torch.cuda.max_memory_reserved() / GIB,
            "tokens_per_s": batch * seq / statistics.mean(times[1:])}


def worker_curve(data_dir: str, variant: str, seed: int) -> dict:
    import json as json_

    import torch

    from burnout.core.device import configure_backends
    from burnout.data.loader import TokenLoader
    from burnout.train.step import TrainStep, build_model

    vocab = json_.loads((Path(data_dir) / "meta.json").read_text())["vocab_size"]
    # Padded to a multiple of 64: the output head's GEMM runs on whole tensor-core tiles.
    precision, recipe = _precision(variant)
    cfg = run_config("llama-1b", CURVE["batch"], CURVE["seq"], precision, True, vocab=-(-vocab // 64) * 64,
                  max_steps=CURVE["steps"], warmup_steps=30, fp8_recipe=recipe)
    device = torch.device("cuda")
    configure_backends(device)
    torch.manual_seed(seed)
    model = build_model(cfg, device)
    step = TrainStep(model, cfg.train, device, precision, end_of_run=CURVE["steps"])
    loader = TokenLoader(Path(data_dir), "train", CURVE["batch"], CURVE["seq"], seed=seed)
    losses, times = [], []
    for i in range(CURVE["steps"]):
        t0 = time.perf_counter()
        losses.append(step(loader, i).loss)
        times.append(time.perf_counter() - t0)
    return {"precision": variant, "seed": seed, "losses": losses, "tail_mean": statistics.mean(losses[-CURVE["tail"]:]),
            "tokens_per_s": CURVE["batch"] * CURVE["seq"] / statistics.median(times[5:])}


def worker_packing(data_dir: str, packed: bool, steps: int) -> dict:
    import json as json_

    import torch

    from burnout.core.device import configure_backends
    from burnout.finetune.tokenized import PackedSFTBatches, SFTBatches
    from burnout.train.step import TrainStep, build_model

    meta = json_.loads((Path(data_dir) / "meta.json").read_text())
    batch, seq = PACKING["batch"], meta["seq_len"]
    cfg = run_config("llama-1b", batch, seq, "bf16", True, vocab=-(-meta["vocab_size"] // 64) * 64)
    device = torch.device("cuda")
    configure_backends(device)
    torch.manual_seed(0)
    step = TrainStep(build_model(cfg, device), cfg.train, device, "bf16", end_of_run=cfg.train.max_steps)
    loader = (PackedSFTBatches(data_dir, "train", batch, seq, seed=0) if packed else
              SFTBatches(data_dir, "train", batch, seq, seed=0, pad_to_longest=True))
    times, targets, positions = [], 0, 0
    for i in range(PACKING["warmup"] + steps):  # the warm-up covers the padded widths' recompile (dynamic shapes)
        t0 = time.perf_counter()
        step(loader, i)
        if i >= PACKING["warmup"]:
            times.append(time.perf_counter() - t0)
            x, y = loader.get_batch(i)[:2]
            targets, positions = targets + int((y != -1).sum()), positions + x.numel()
    seconds = sum(times)
    return {"packed": packed, "batch": batch, "seq": seq, "ms_per_step": 1000 * statistics.median(times),
            "targets_per_s": targets / seconds, "positions_per_s": positions / seconds,
            "peak_gib": torch.cuda.max_memory_allocated() / GIB}


# ----------------------------------------------------------------------------------------------
# The driver


def _spawn(args: list[str], timeout: float = 900) -> dict | str:
    """A worker's JSON result, or the last line of its error output."""
    done = subprocess.run([sys.executable, "-m", "benchmarks.bench_gpu", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    for line in reversed(done.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    return (done.stderr.strip().splitlines() or ["no output"])[-1]


def _peer(shape: str, batch: int, seq: int, steps: int) -> dict | str:
    """The peer (benchmarks/peer_step.py) at the same micro-batch; where that runs out of memory, half of it with 2
    accumulation steps (the same tokens per step)."""
    for b, accum in ((batch, 1), (batch // 2, 2)):
        done = subprocess.run([sys.executable, "-m", "benchmarks.peer_step", shape, str(b), str(seq), "--accum",
                               str(accum), "--steps", str(steps)], cwd=REPO, capture_output=True, text=True,
                              timeout=900)
        for line in reversed(done.stdout.splitlines()):
            if line.startswith("{"):
                return json.loads(line)
        failure = (done.stderr.strip().splitlines() or ["no output"])[-1]
        if "OutOfMemory" not in done.stderr:
            return failure
    return failure


def bench_shapes(args) -> list[dict]:
    rows = []
    load_before = results.load()
    for shape in args.shapes:
        batch, seq = SHAPES[shape]
        precisions = ["bf16"] + [f"fp8:{r}" for r in args.fp8 or [] if shape == "llama-1b"]
        print(f"\n== {shape} ==", flush=True)
        ours = {}
        for p in precisions:  # each printed as it comes: a session's timeout keeps what finished
            ours[p] = _spawn(["--worker", "step", shape, str(batch), str(seq), str(args.steps), p,
                              *(["--profile"] if args.profile and p == "bf16" else [])])
            _print_ours(p, ours[p])
        peer = "not run (--no-peer)" if args.no_peer else _peer(shape, batch, seq, args.steps)
        rows.append({"shape": shape, "ours": ours, "peer": peer})
        _print_shape(rows[-1])
        _record_shape(rows[-1], args.steps, load_before)
    return rows


# The claims (benchmarks/claims.py) of each shape's figures.
SHAPE_CLAIMS = {"llama-1b": "gpu.llama1b", "gpt2-134m": "gpu.gpt2_134m"}


def _record_shape(row: dict, steps: int, load_before: float | None) -> None:
    bf16, peer, claim = row["ours"].get("bf16"), row["peer"], SHAPE_CLAIMS[row["shape"]]
    if not isinstance(bf16, dict):
        return
    figures = [(f"{claim}.tokens_per_s", bf16["tokens_per_s"]), (f"{claim}.mfu", 100 * bf16["mfu"])]
    if bf16.get("planned_gib"):
        figures.append((f"planner.compiled.{row['shape']}.{bf16['batch']}x{bf16['seq']}",
                        100 * (bf16["planned_gib"] / bf16["peak_gib"] - 1)))
    if isinstance(peer, dict):
        figures.append((f"{claim}.peer_ratio", bf16["tokens_per_s"] / peer["tokens_per_s"]))
    fp8 = row["ours"].get("fp8:tensorwise")
    if isinstance(fp8, dict):
        figures.append(("gpu.fp8_ratio", fp8["tokens_per_s"] / bf16["tokens_per_s"]))
    for name, value in figures:
        results.record(name, value, load_before=load_before, note=f"median of {steps} steps")


def _print_ours(precision: str, r: dict | str) -> None:
    if isinstance(r, str):
        print(f"ours {precision}: FAILED: {r}", flush=True)
        return
    print(f"ours {precision}: B{r['batch']}xT{r['seq']} {r['tokens_per_s']:,.0f} tokens/s, {r['ms_per_step']:.0f} "
          f"ms/step, MFU {r['mfu']:.1%} (of {r['gpu']}'s {r['peak_flops'] / 1e12:.0f} TFLOP/s bf16), peak "
          f"{r['peak_gib']:.1f} GiB, first step {r['first_step_s']:.0f} s")
    for family, ms in r.get("kernels", {}).get("families_ms", {}).items():
        print(f"    {family:28s} {ms:8.1f} ms/step")
    for ms, name in r.get("kernels", {}).get("top_kernels_ms", []):
        print(f"      {ms:8.2f} ms  {name}")
    sys.stdout.flush()


def _print_shape(row: dict) -> None:
    bf16, peer = row["ours"]["bf16"], row["peer"]
    if isinstance(peer, str):
        print(f"peer: FAILED: {peer}")
    elif isinstance(bf16, dict):
        print(f"peer (transformers {row['shape']}, {peer['params']:,} params, compiled): B{peer['batch']}x"
              f"T{peer['seq']}xA{peer['accum']} {peer['tokens_per_s']:,.0f} tokens/s, {peer['ms_per_step']:.0f} "
              f"ms/step, peak {peer['peak_gib']:.1f} GiB, first step {peer['first_step_s']:.0f} s")
        print(f"peer MFU {bf16['flops_per_token'] * peer['tokens_per_s'] / bf16['peak_flops']:.1%}; "
              f"ours / peer = {bf16['tokens_per_s'] / peer['tokens_per_s']:.2f}x")
    if isinstance(bf16, dict) and bf16.get("planned_gib"):
        print(f"memory plan (compiled) {bf16['planned_gib']:.1f} GiB against {bf16['peak_gib']:.1f} measured: "
              f"{bf16['planned_gib'] / bf16['peak_gib'] - 1:+.1%}")
    for variant, fp8 in row["ours"].items():
        if variant != "bf16" and isinstance(fp8, dict) and isinstance(bf16, dict):
            print(f"{variant} / bf16 (ours) = {fp8['tokens_per_s'] / bf16['tokens_per_s']:.2f}x")


def memory_table(shapes: list[str]) -> list[dict]:
    rows = []
    load_before = results.load()
    print("\n== memory plan vs torch.cuda.max_memory_allocated (bf16, eager; 3 steps) ==")
    print(f"{'shape':10s} {'micro-batch':>11s} {'ckpt':>5s} {'predicted':>10s} {'measured':>9s} {'error':>7s} "
          f"{'tokens/s':>9s}")
    for shape, batch, ckpt in [case for case in MEMORY_CASES if not shapes or case[0] in shapes]:
        r = _spawn(["--worker", "memory", shape, str(batch), str(MEMORY_SEQ[shape]), *(["--ckpt"] if ckpt else [])])
        rows.append(r if isinstance(r, dict) else {"shape": shape, "batch": batch, "checkpointing": ckpt, "failed": r})
        if isinstance(r, str):
            print(f"{shape:10s} {batch:>11d} {str(ckpt):>5s} FAILED: {r}")
        else:
            print(f"{shape:10s} {batch:>11d} {str(ckpt):>5s} {r['predicted_gib']:>9.1f}G {r['measured_gib']:>8.1f}G "
                  f"{r['error']:>+7.1%} {r['tokens_per_s']:>9,.0f}")
            results.record(f"planner.eager.{shape}.{batch}x{MEMORY_SEQ[shape]}{'.ckpt' * ckpt}", 100 * r["error"],
                           load_before=load_before)
    return rows


def curves(data_dir: str, recipes: list[str]) -> dict:
    """Two runs at a time (a llama-1b at 8 x 1024 takes well under half of an 80 GB GPU): the losses are what is
    compared, and the tokens/s printed are those of a shared GPU."""
    print(f"\n== llama-1b loss curves, {CURVE['steps']} steps of {CURVE['batch']} x {CURVE['seq']} on {data_dir}, "
          f"mean loss over the last {CURVE['tail']} steps (tokens/s of a shared GPU) ==", flush=True)
    load_before = results.load()
    runs = {f"{variant} seed {seed}": (variant, seed) for variant, seed in
            [("fp8:" + recipes[0], 0), ("bf16", 0), ("bf16", 1)] + [(f"fp8:{r}", 0) for r in recipes[1:]]}
    out = {}
    with ThreadPoolExecutor(2) as pool:  # each printed as it comes: a session's timeout keeps what finished
        futures = {pool.submit(_spawn, ["--worker", "curve", data_dir, variant, str(seed)]): name
                   for name, (variant, seed) in runs.items()}
        for future in as_completed(futures):
            out[futures[future]] = r = future.result()
            print(f"{futures[future]}: " + (f"FAILED: {r}" if isinstance(r, str) else
                                            f"{r['tail_mean']:.4f} ({r['tokens_per_s']:,.0f} tokens/s)"), flush=True)
    reference = out.get("bf16 seed 0")
    if isinstance(reference, dict):
        for name, r in out.items():
            if isinstance(r, dict) and r is not reference:
                print(f"{name} against bf16 seed 0: {r['tail_mean'] / reference['tail_mean'] - 1:+.2%}")
                claim = {"fp8:tensorwise seed 0": "gpu.fp8_loss_gap", "fp8:rowwise seed 0": "gpu.fp8_rowwise_loss_gap"}
                if name in claim:
                    results.record(claim[name], 100 * (r["tail_mean"] / reference["tail_mean"] - 1),
                                   load_before=load_before, note="two runs at a time on one GPU")
    return out


def packing(data_dir: str, steps: int) -> dict:
    load_before = results.load()
    out = {name: _spawn(["--worker", "packing", data_dir, name, str(steps)]) for name in ("padded", "packed")}
    print(f"\n== llama-1b fine-tuning steps on {data_dir}, padded to the longest vs packed ==")
    for name, r in out.items():
        print(f"{name}: " + (f"FAILED: {r}" if isinstance(r, str) else
                             f"B{r['batch']}xT{r['seq']} {r['ms_per_step']:.0f} ms/step, {r['targets_per_s']:,.0f} "
                             f"assistant targets/s, {r['positions_per_s']:,.0f} positions/s, "
                             f"peak {r['peak_gib']:.1f} GiB"))
    if all(isinstance(r, dict) for r in out.values()):
        ratio = out["packed"]["targets_per_s"] / out["padded"]["targets_per_s"]
        print(f"packed / padded targets per second: {ratio:.2f}x")
        results.record("gpu.sft_packing_ratio", ratio, load_before=load_before, note=f"{steps} steps each")
    return out


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--worker":
        kind, rest = sys.argv[2], sys.argv[3:]
        if kind == "step":
            shape, batch, seq, steps, precision = rest[0], int(rest[1]), int(rest[2]), int(rest[3]), rest[4]
            print(json.dumps(worker_step(shape, batch, seq, steps, precision, True, False, "--profile" in rest)))
        elif kind == "memory":
            print(json.dumps(worker_memory(rest[0], int(rest[1]), int(rest[2]), "--ckpt" in rest)))
        elif kind == "packing":
            print(json.dumps(worker_packing(rest[0], rest[1] == "packed", int(rest[2]))))
        else:
            print(json.dumps(worker_curve(rest[0], rest[1], int(rest[2]))))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="*", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--no-peer", action="store_true", help="time ours alone")
    parser.add_argument("--fp8", nargs="*", choices=FP8_RECIPES, metavar="RECIPE",
                        help=f"train.fp8_recipe values to run ({', '.join(FP8_RECIPES)}; none named: tensorwise)")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--memory", nargs="*", choices=sorted(MEMORY_SEQ), help="these shapes' cases (none named: all)")
    parser.add_argument("--curve", metavar="DATA_DIR")
    parser.add_argument("--packing", metavar="SFT_DATA_DIR")
    parser.add_argument("--json", type=Path, help="write every figure here")
    args = parser.parse_args()
    if args.fp8 == []:
        args.fp8 = ["tensorwise"]
    import torch

    if not torch.cuda.is_available():
        sys.exit("bench_gpu: no CUDA GPU here; run it on a machine with one")
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, load {os.getloadavg()}")
    figures = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
               "shapes": bench_shapes(args) if args.shapes else []}
    if args.memory is not None:
        figures["memory"] = memory_table(args.memory)
    if args.curve:
        figures["curves"] = curves(args.curve, args.fp8 or ["tensorwise"])
    if args.packing:
        figures["packing"] = packing(args.packing, args.steps)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
