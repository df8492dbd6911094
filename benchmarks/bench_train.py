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

    .venv/bin/python -m benchmarks.bench_train --nanogpt DIR [--pairs 6] [--threads N]

puts the config beside nanoGPT's own train.py instead (DIR: a nanoGPT checkout, its code unchanged): its
Shakespeare-char config on the CPU as its README runs it (device=cpu, compile=False), at the config's model,
batch, context and dropout, eval_iters 1, max_iters just past the timed iterations. Its data are written the way
its data/shakespeare_char/prepare.py writes them, from the config's local text file instead of a download, into
DIR/data/shakespeare_char/ when not there yet. The two run in `--pairs` pairs of fresh processes, in alternating
order (nanoGPT then ours, ours then nanoGPT, ...), each timed as the median of `--steps` iterations after
`--warmup` (nanoGPT's own `iter N: ... time Tms` lines; its iteration 0 also holds its first evaluation, so at
least one warm-up). The figure is the median of the pairs' ratios, with their range; a pair during which other
programs used more than QUIET_OTHER_CORES of the cores (the machine's busy time less this benchmark's own) is
printed and left out, and with no quiet pair nothing is judged.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from benchmarks import results

if TYPE_CHECKING:
    from burnout.config import RunConfig

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
    return " ".join(f"{v:.2f}" for v in os.getloadavg()) if hasattr(os, "getloadavg") else "?"


def run_variant(config: str, overrides: list[str], steps: int, warmup: int, data: str | None,
                env: dict | None = None) -> dict:
    cmd = [sys.executable, "-m", "burnout", "bench", config, "--json", "--steps", str(steps), "--warmup", str(warmup),
           *(["--data", data] if data else []), *overrides]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
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


# nanoGPT train.py's log line of one iteration: "iter 5: loss 3.4446, time 2534.24ms, mfu 0.01%".
NANOGPT_ITER_LINE = re.compile(r"^iter (\d+): loss \S+, time ([\d.]+)ms", re.MULTILINE)


def parse_nanogpt_log(log: str) -> dict[int, float]:
    """The seconds of each iteration nanoGPT's train.py logged, by iteration number."""
    return {int(m[1]): float(m[2]) / 1000 for m in NANOGPT_ITER_LINE.finditer(log)}


def write_nanogpt_char_data(text_path: Path, data_dir: Path) -> None:
    """What nanoGPT's data/shakespeare_char/prepare.py writes, from a local text file instead of its download:
    train.bin and val.bin (the first 90% of the characters and the rest, uint16 ids of the sorted characters) and
    meta.pkl, last: train.py reads the vocabulary size from it."""
    text = text_path.read_text()  # read as prepare.py reads it: text mode, the locale's encoding
    chars = sorted(set(text))
    stoi = {ch: i for i, ch in enumerate(chars)}
    split = int(len(text) * 0.9)
    data_dir.mkdir(parents=True, exist_ok=True)
    for name, part in (("train.bin", text[:split]), ("val.bin", text[split:])):
        np.array([stoi[ch] for ch in part], dtype=np.uint16).tofile(data_dir / name)
    with open(data_dir / "meta.pkl", "wb") as f:
        pickle.dump({"vocab_size": len(chars), "itos": dict(enumerate(chars)), "stoi": stoi}, f)


def run_nanogpt(nanogpt_dir: Path, cfg: RunConfig, steps: int, warmup: int, env: dict) -> float:
    """nanoGPT's train.py, Shakespeare-char config, on the CPU without compile as its README runs it, at `cfg`'s
    model, batch, context and dropout, in a fresh process: the median seconds of its iterations `warmup` to
    `warmup + steps - 1`."""
    m = cfg.model
    last = warmup + steps - 1
    with tempfile.TemporaryDirectory() as out_dir:  # its out_dir, not a folder inside the checkout
        cmd = [sys.executable, "train.py", "config/train_shakespeare_char.py", "--device=cpu", "--compile=False",
               f"--n_layer={m.n_layer}", f"--n_head={m.n_head}", f"--n_embd={m.d_model}", f"--bias={bool(m.bias)}",
               f"--dropout={m.dropout}", f"--block_size={cfg.train.seq_len or m.context_length}",
               f"--batch_size={cfg.train.batch_size}",
               f"--gradient_accumulation_steps={cfg.train.grad_accum}", "--eval_iters=1", "--log_interval=1",
               f"--max_iters={last}", f"--out_dir={out_dir}"]
        proc = subprocess.run(cmd, cwd=nanogpt_dir, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"nanoGPT's train.py failed (exit {proc.returncode}): "
                 f"{(proc.stderr.strip().splitlines() or ['no output'])[-1]}")
    seconds = parse_nanogpt_log(proc.stdout)
    if any(i not in seconds for i in range(warmup, last + 1)):
        sys.exit(f"nanoGPT's train.py logged iterations {sorted(seconds)}, expected 0 to {last}: has its log "
                 "line changed?")
    return statistics.median(seconds[i] for i in range(warmup, last + 1))


# A pair is quiet when, during each of its two runs, other programs used at most this many of the machine's cores
# on average: both programs use every core, so any more and they wait for one.
QUIET_OTHER_CORES = 0.2


def busy_cpu_seconds() -> float:
    """Seconds every core of the machine has spent on anything but idling, since boot (/proc/stat)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def children_cpu_seconds() -> float:
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def measured(run) -> tuple[float, float, tuple[float, float]]:
    """run()'s result, the cores other programs used on average while it ran (the machine's busy time less this
    benchmark's children's), and the 1-minute load before and after."""
    before, wall, busy, ours = results.load(), time.perf_counter(), busy_cpu_seconds(), children_cpu_seconds()
    value = run()
    seconds = time.perf_counter() - wall
    others = (busy_cpu_seconds() - busy - (children_cpu_seconds() - ours)) / seconds
    return value, max(others, 0.0), (before, results.load())


def side_by_side(args: argparse.Namespace) -> None:
    """`--nanogpt DIR`: nanoGPT's train.py and `burnout bench` in alternating pairs (A B, B A, A B, ...), each a fresh
    process; the median of the quiet pairs' ratios, their range, and what else ran during each."""
    import torch

    from burnout.base.text import plural
    from burnout.config import load_run_config
    from burnout.core.device import cpu_instructions, cpu_model

    cfg = load_run_config(args.config)
    nanogpt = Path(args.nanogpt)
    if not (nanogpt / "train.py").is_file() or not (nanogpt / "config" / "train_shakespeare_char.py").is_file():
        sys.exit(f"--nanogpt {nanogpt}: no train.py and config/train_shakespeare_char.py there; give a nanoGPT "
                 "checkout (git clone https://github.com/karpathy/nanoGPT)")
    data_dir = nanogpt / "data" / "shakespeare_char"
    if not (data_dir / "meta.pkl").exists():
        text = Path(cfg.data.sources[0].path or "")
        if not text.is_file():
            sys.exit(f"{args.config}: its text {text} is not here; run from the checkout, beside ../shared/data")
        write_nanogpt_char_data(text, data_dir)
        print(f"wrote nanoGPT's train.bin, val.bin and meta.pkl into {data_dir} from {text}")
    env = os.environ | ({"OMP_NUM_THREADS": str(args.threads)} if args.threads else {})
    tokens = cfg.train.batch_size * cfg.train.grad_accum * (cfg.train.seq_len or cfg.model.context_length)
    threads = (f"{plural(args.threads, 'thread')} (OMP_NUM_THREADS)" if args.threads
               else f"{plural(torch.get_num_threads(), 'thread')} each (torch's default)")
    print(f"{args.config} beside nanoGPT's train.py ({nanogpt}): {tokens:,} tokens a step, each run the median of "
          f"{plural(args.steps, 'step')} after {args.warmup} warm-up in a fresh process, {threads}; "
          f"{plural(args.pairs, 'pair')} in alternating order; CPU {cpu_model()} ({cpu_instructions()}), "
          f"{os.cpu_count()} cores, torch {torch.__version__}")
    runs = {"nanoGPT": lambda: run_nanogpt(nanogpt, cfg, args.steps, args.warmup, env),
            "ours": lambda: run_variant(args.config, [], args.steps, args.warmup, args.data, env)}
    pairs, loads, split = [], [], None
    for k in range(args.pairs):
        order = ("nanoGPT", "ours") if k % 2 == 0 else ("ours", "nanoGPT")
        got = {name: measured(runs[name]) for name in order}
        split = got["ours"][0]["split_fraction"]
        theirs, ours = got["nanoGPT"][0], got["ours"][0]["step_s"]
        others = max(got[name][1] for name in order)
        loads += [x for name in order for x in got[name][2] if x is not None]
        quiet = others <= QUIET_OTHER_CORES
        pairs.append((theirs / ours, theirs, ours, quiet))
        print(f"pair {k + 1} ({' then '.join(order)}): nanoGPT {theirs:.3f} s/iter, ours {ours:.3f} s/step: "
              f"{theirs / ours:.2f}x   other programs used up to {others:.2f} cores"
              f"{'' if quiet else f' (above {QUIET_OTHER_CORES}: left out)'}; 1-minute load "
              f"{', '.join(f'{x:.2f}' for name in order for x in got[name][2] if x is not None)}")
    _pairs_summary(args, pairs, loads, split)


def _pairs_summary(args: argparse.Namespace, pairs: list[tuple], loads: list[float], split: dict) -> None:
    """The median of the quiet pairs' ratios against the target (not judged without a quiet pair), and where our
    step's time goes when it falls short."""
    quiet = [p for p in pairs if p[3]]
    if not quiet:
        print(f"no quiet pair of {len(pairs)}: other programs ran beside every one; nothing judged or recorded")
        return
    ratio = statistics.median(p[0] for p in quiet)
    low, high = min(p[0] for p in quiet), max(p[0] for p in quiet)
    theirs, ours = statistics.median(p[1] for p in quiet), statistics.median(p[2] for p in quiet)
    print(f"median of {len(quiet)} quiet pair(s) of {len(pairs)}: {ratio:.2f}x (range {low:.2f}-{high:.2f}); "
          f"nanoGPT {theirs:.3f} s/iter, ours {ours:.3f} s/step; target {TARGET_RATIO}x "
          f"{'reached' if ratio >= TARGET_RATIO else 'not reached'}")
    if ratio < TARGET_RATIO:
        print("where our step's time goes: " + ", ".join(f"{part} {share:.1%}" for part, share in split.items())
              + f"; at {TARGET_RATIO}x a step would take {theirs / TARGET_RATIO:.3f} s")
    if args.config == "shakespeare-10m" and not args.threads:
        note = (f"median of {len(quiet)} quiet pairs of {len(pairs)} (alternating order), range {low:.2f}-{high:.2f}; "
                f"a pair is quiet when other programs used at most {QUIET_OTHER_CORES} cores during it")
        during = (min(loads), max(loads)) if loads else None
        for claim, value in (("cpu10m.nanogpt_ratio", ratio), ("cpu10m.nanogpt_s_per_iter", theirs),
                             ("cpu10m.ours_s_per_step", ours)):
            results.record(claim, value, load_before=loads[0] if loads else None, load_during=during, note=note)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="shakespeare-10m")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--data", help="prepared data folder (default: prepared once into runs/bench-data/)")
    parser.add_argument("--variants", nargs="+", default=["auto", "fp32"], choices=sorted(VARIANTS))
    parser.add_argument("--nanogpt", metavar="DIR", help="a nanoGPT checkout: its train.py instead of the peer")
    parser.add_argument("--pairs", type=int, default=6, help="with --nanogpt: pairs of runs, in alternating order")
    parser.add_argument("--threads", type=int, help="with --nanogpt: OMP_NUM_THREADS for both (default: unset)")
    parser.add_argument("--peer-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.peer_only:
        print(json.dumps(peer(args.steps, args.warmup)))
        return
    if args.nanogpt:
        if args.warmup < 1:
            parser.error("--nanogpt needs --warmup 1 or more: nanoGPT's iteration 0 also holds its first evaluation")
        if args.pairs < 1:
            parser.error("--pairs needs 1 or more")
        side_by_side(args)
        return
    from burnout.core.device import cpu_model

    print(f"{args.config}: median of {args.steps} steps after {args.warmup} warm-up, each run in a fresh process, "
          f"the peer measured between our variants; CPU {cpu_model()}, {os.cpu_count()} cores")
    peers = []
    for name in args.variants:
        before, peer_load = load(), results.load()
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
        if args.config == "shakespeare-10m":
            _record_variant(name, r, p, peer_load)


def _record_variant(name: str, r: dict, p: dict, load_before: float | None) -> None:
    """The figures of one variant beside the peer measured just before it, as the claims of benchmarks/claims.py."""
    ratio = r["tokens_per_s"] / p["tokens_per_s"]
    if name == "auto":
        bf16 = r["setup"]["precision"] == "bf16"
        for claim, value in (("cpu10m.hf_peer_ratio" if bf16 else "cpu10m.hf_peer_ratio_fp32", ratio),
                             ("cpu10m.tokens_per_s", r["tokens_per_s"]),
                             ("cpu10m.peer_tokens_per_s", p["tokens_per_s"]),
                             ("cpu10m.peak_rss_mb", r["peak_rss_mb"]), ("cpu10m.peer_peak_rss_mb", p["peak_rss_mb"]),
                             ("cpu10m.data_fraction", 100 * r["split_fraction"]["data"])):
            results.record(claim, value, load_before=load_before)
    elif name in ("fp32", "nodrop"):
        results.record(f"cpu10m.{name}_ratio", ratio, load_before=load_before)


if __name__ == "__main__":
    main()
