"""Training speed of a run config, measured: tokens/s, where a step's time goes, MFU, peak memory.

`bench` runs the training step the loop runs (burnout.train.step.TrainStep: same initialization, loader,
precision, grad scaler, LR schedule, compile setting) and splits each step into data (batch + copy to
the device), forward, backward and optimizer (loss across ranks, clipping, the update, zero_grad).
On a GPU each part is closed by a synchronize, so the parts add up to the step.
MFU is model FLOPs per token (burnout.models.info) × tokens/s over a matmul peak on the same device and
precision: on a CPU the best ever measured there, as training's (burnout.train.hardware.cpu_peak); on a GPU one
measured in the same process (on a known GPU, also over its datasheet peak). It never exceeds 100%.

`ablate` runs the optimization ladder of the GPUburnout blog on the same model and data, one change
per rung, each rung keeping the ones before it:

    baseline   memory-mapped tokens, per-sample Python batching, fp32, eager, explicit attention
    preload    the token files read into RAM once
    vectorize  a batch gathered with one fancy index instead of a Python loop over samples
    compile    torch.compile
    bf16       bf16 autocast (fp16 where the GPU has no bf16)
    sdpa       scaled_dot_product_attention (flash / memory-efficient kernels where available)

A rung whose feature is missing here (no C++ compiler for compile, ...) is reported as unavailable and
the ladder goes on without it. A rung whose step runs out of memory (explicit attention at a 1B's batch)
is reported as skipped and the ladder goes on from its setup: the later rungs only lower memory.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import resource
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from burnout.base.text import first_line
from burnout.config import RunConfig
from burnout.core.device import (
    configure_backends,
    cpu_instructions,
    describe_device,
    resolve_device,
    resolve_precision,
)
from burnout.core.rng import seed_everything
from burnout.data.loader import TokenLoader, check_compatible, loader_mode
from burnout.data.prepare import prepare_data
from burnout.data.shards import read_meta
from burnout.errors import BurnoutError
from burnout.models.info import flops_per_token, matmul_parameters
from burnout.train.hardware import (
    cpu_peak,
    cpu_precision_entry,
    detect,
    hardware_table,
    measure_gpu_peak,
    training_precision,
)
from burnout.train.probe import oom_message
from burnout.train.schedule import total_steps
from burnout.train.step import TrainStep, build_model

PARTS = ("data", "forward", "backward", "optimizer")


@dataclass(frozen=True)
class Setup:
    """How a step is run: where the tokens live, how a batch is gathered, compile, precision, attention."""
    loader: str = "preload"  # mmap | preload
    batching: str = "vectorized"  # python | vectorized
    compile: bool = False
    precision: str = "fp32"  # fp32 | bf16 | fp16
    attention: str = "sdpa"  # math | sdpa


# (key, label, change) — each rung applies its change on top of the previous rung's setup.
RUNGS: list[tuple[str, str, dict]] = [
    ("baseline", "mmap + per-sample Python batching, fp32, eager, explicit attention",
     {"loader": "mmap", "batching": "python", "compile": False, "precision": "fp32", "attention": "math"}),
    ("preload", "+ RAM preload of the token files", {"loader": "preload"}),
    ("vectorize", "+ vectorized batching (one fancy index)", {"batching": "vectorized"}),
    ("compile", "+ torch.compile", {"compile": True}),
    ("bf16", "+ bf16 autocast", {"precision": "bf16"}),
    ("sdpa", "+ SDPA / flash attention", {"attention": "sdpa"}),
]


# ----------------------------------------------------------------------------------------------
# Data


def bench_data_dir(cfg: RunConfig, data_dir: str | Path | None = None, cache_root: str | Path = "runs/bench-data",
                   on_event=print) -> Path:
    """`data_dir`, else data.prepared_dir, else the config's data prepared once into a cache folder
    named by a hash of the data and tokenizer sections (reused by later benches of the same data)."""
    if data_dir is None and cfg.data.prepared_dir:
        data_dir = cfg.data.prepared_dir
    if data_dir is not None:
        read_meta(data_dir)
        return Path(data_dir)
    key = json.dumps({"data": dataclasses.asdict(cfg.data), "tokenizer": dataclasses.asdict(cfg.tokenizer)},
                     sort_keys=True, default=str)
    folder = Path(cache_root) / hashlib.sha256(key.encode()).hexdigest()[:12]
    if not (folder / "meta.json").exists():
        on_event(f"preparing the config's data into {folder} (once; later benches reuse it)")
        prepare_data(cfg.data, cfg.tokenizer, folder, progress=False, overwrite=False)
    return folder


class PythonBatcher:
    """The blog's starting point: a Python loop over the batch's samples, each cut, converted and stacked
    on its own (nanoGPT's get_batch). Same offsets as TokenLoader.get_batch, so the same batches."""

    def __init__(self, loader: TokenLoader) -> None:
        self.loader = loader

    def get_batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        ld = self.loader
        rng = np.random.default_rng([ld.seed, step, ld.rank])
        offsets = rng.integers(0, ld.num_tokens - ld.seq_len, size=ld.batch_size)
        rows = [torch.from_numpy(ld.data.windows(np.array([o]), ld.seq_len + 1)[0]) for o in offsets.tolist()]
        x = torch.stack([r[:-1] for r in rows])
        y = torch.stack([r[1:] for r in rows])
        return x, y


# ----------------------------------------------------------------------------------------------
# Peaks and memory


def measure_peak(device: torch.device, precision: str, again: bool = False) -> float:
    """Best observed matmul FLOP/s on `device` in `precision`: the peak training's MFU is over on a CPU or a GPU
    missing from hardware.yaml, so bench and training MFU share one denominator (`again`: a CPU measured again)."""
    return cpu_peak(precision, measure_again=again) if device.type == "cpu" else measure_gpu_peak(device, precision)


def table_peak(device: torch.device, precision: str) -> tuple[str, float] | None:
    """(name, datasheet FLOP/s) of a GPU in burnout/configs/hardware.yaml, or None (CPU, unknown GPU)."""
    if device.type != "cuda":
        return None
    table = hardware_table()
    try:
        key = detect(table, device)
    except BurnoutError:
        return None
    peak = table[key].get("peak_tflops", {}).get(precision)
    return (table[key]["name"], float(peak) * 1e12) if peak else None


def peak_rss_mb() -> float:
    """This process's peak resident memory so far (Linux reports kilobytes, macOS bytes)."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / (1024 * 1024) if sys.platform == "darwin" else rss / 1024


# ----------------------------------------------------------------------------------------------
# One measurement


# A CPU without bf16 instructions emulates bf16 matmuls, too slowly for the ladder's bf16 rung to finish in
# reasonable time (docs/PERFORMANCE.md).
EMULATED_BF16_SLOWDOWN = 10


def emulated_bf16(device: torch.device) -> str | None:
    """Why the ladder leaves its bf16 rung out on this CPU (bf16 emulated, as measured for precision auto), or None."""
    if device.type != "cpu":
        return None
    entry, _ = cpu_precision_entry()
    if entry["bf16_gflops"] * EMULATED_BF16_SLOWDOWN >= entry["fp32_gflops"]:
        return None
    return (f"left out: this CPU runs bf16 matmuls at {entry['bf16_gflops']:.1f} GFLOP/s against "
            f"{entry['fp32_gflops']:.0f} in fp32 (emulated: no bf16 instructions); the later rungs stay fp32")


def effective_precision(precision: str, device: torch.device) -> str:
    """The ladder's bf16 rung on a GPU without bf16 tensor cores runs fp16, as `precision: auto` would."""
    if precision == "bf16" and device.type == "cuda":
        return resolve_precision("auto", device)
    return precision


class StepTimer:
    """The train step's clock (burnout.train.step.Clock): adds the time since the last tick to the part
    that just ended. On a GPU each tick synchronizes first, so the parts add up to the step."""

    def __init__(self, device: torch.device):
        self.device = device
        self.parts = dict.fromkeys(PARTS, 0.0)
        self.last = time.perf_counter()

    def __call__(self, part: str) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        now = time.perf_counter()
        self.parts[part] += now - self.last
        self.last = now


def bench_step(cfg: RunConfig, data_dir: Path, setup: Setup, device: torch.device) -> tuple[TrainStep, object]:
    """The training step `burnout train` runs for `cfg` (model initialized from train.seed, as the loop's
    is), changed only as `setup` says, and the batches it reads."""
    tc = cfg.train
    precision = effective_precision(setup.precision, device)
    seq_len = tc.seq_len or cfg.model.context_length
    meta = read_meta(data_dir)
    check_compatible(meta, cfg.model.vocab_size, seq_len)
    loader = TokenLoader(data_dir, "train", tc.batch_size, seq_len, tc.seed, mode=setup.loader)
    batches = PythonBatcher(loader) if setup.batching == "python" else loader
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, attention=setup.attention),
                              train=dataclasses.replace(tc, perf=dataclasses.replace(tc.perf, compile=setup.compile)))
    seed_everything(tc.seed)
    model = build_model(cfg, device)
    model.train()
    end_of_run = total_steps(tc, tc.batch_size * tc.grad_accum * seq_len, meta["splits"]["train"]["tokens"])
    return TrainStep(model, cfg.train, device, precision, end_of_run), batches


def measure(cfg: RunConfig, data_dir: Path, setup: Setup, steps: int, warmup: int = 2,
            device: torch.device | None = None) -> dict:
    """Run `warmup` + `steps` training steps of `cfg` as `setup` says; medians of the timed steps."""
    tc = cfg.train
    device = device or resolve_device(tc.device)
    configure_backends(device)
    train_step, batches = bench_step(cfg, data_dir, setup, device)
    note = None
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)

    def one_step(step: int) -> tuple[dict, float]:
        timer = StepTimer(device)
        return timer.parts, train_step(batches, step, clock=timer).loss

    t_start = time.perf_counter()
    try:
        one_step(0)
    except torch.OutOfMemoryError:
        raise  # the setup does not fit; eager would need more memory, not less
    except Exception as exc:  # noqa: BLE001 - a compiler missing or failing: fall back to eager, say why
        if not setup.compile:
            raise
        note = f"torch.compile failed ({type(exc).__name__}: {first_line(exc, 120)}); ran eager"
        torch._dynamo.reset()
        train_step.run_eager()
        one_step(0)
    first_step_s = time.perf_counter() - t_start
    for step in range(1, warmup):
        one_step(step)
    records, losses = [], []
    for step in range(warmup, warmup + steps):
        parts, loss = one_step(step)
        records.append(parts)
        losses.append(loss)
    split = {p: statistics.median(r[p] for r in records) for p in PARTS}
    step_s = statistics.median(sum(r.values()) for r in records)
    seq_len = tc.seq_len or cfg.model.context_length
    tokens_per_step = tc.batch_size * tc.grad_accum * seq_len
    tokens_per_s = tokens_per_step / step_s
    model = train_step.model
    fpt = flops_per_token(cfg.model, seq_len, matmul_parameters(model))["flops_per_token"]
    result = {
        "setup": dataclasses.asdict(setup) | {"precision": train_step.precision,
                                              "compile": setup.compile and note is None},
        "steps": steps,
        "tokens_per_step": tokens_per_step,
        "step_s": step_s,
        "tokens_per_s": tokens_per_s,
        "split_s": split,
        "split_fraction": {p: split[p] / sum(split.values()) for p in PARTS},
        "first_step_s": first_step_s,
        "flops_per_token": fpt,
        "achieved_flops": tokens_per_s * fpt,
        "final_loss": losses[-1],
        "params": sum(p.numel() for p in model.parameters()),
        "note": note,
    }
    if device.type == "cuda":
        result["peak_memory_mb"] = torch.cuda.max_memory_allocated(device) / 2**20
    result["peak_rss_mb"] = peak_rss_mb()
    return result


def _add_mfu(result: dict, device: torch.device) -> dict:
    """MFU over the measured peak, left out (`mfu_left_out` says why) where the step outran every measurement."""
    precision = result["setup"]["precision"]
    peak = measure_peak(device, precision)
    # A peak below what the model just achieved was measured in a burst of other load (on a shared CPU it printed an
    # MFU above 100%; docs/PERFORMANCE.md): measured again, twice at most, best kept.
    for _ in range(2):
        if result["achieved_flops"] <= peak:
            break
        peak = max(peak, measure_peak(device, precision, again=True))
    result["peak_flops_measured"] = peak
    if result["achieved_flops"] <= peak:
        result["mfu_measured"] = result["achieved_flops"] / peak
    else:  # over 100% is impossible: the machine was busy at every measurement
        result["mfu_left_out"] = (f"left out: the step ran {result['achieved_flops'] / 1e9:,.1f} GFLOP/s, above the "
                                  f"{peak / 1e9:,.1f} GFLOP/s {precision} matmul peak measured three times (other "
                                  "work on this machine slowed the measurements; bench again when it is quiet)")
    known = table_peak(device, precision)
    if known is not None:
        result["hardware"] = known[0]
        result["peak_flops_table"] = known[1]
        result["mfu_table"] = result["achieved_flops"] / known[1]
    return result


def _device_line(device: torch.device) -> str:
    """The device, with the vector instructions PyTorch uses on a CPU (they set its matmul speed)."""
    cpu = f" ({cpu_instructions()})" if device.type == "cpu" else ""
    return describe_device(device) + cpu


# ----------------------------------------------------------------------------------------------
# Commands


def default_setup(cfg: RunConfig, data_dir: Path, device: torch.device) -> Setup:
    """The setup `burnout train` runs this config with."""
    return Setup(loader=loader_mode(data_dir), batching="vectorized", compile=cfg.train.perf.compile,
                 precision=training_precision(cfg.train.precision, device),
                 attention=cfg.model.attention)


def bench(cfg: RunConfig, data_dir: Path, steps: int = 10, warmup: int = 2) -> dict:
    """Training speed of `cfg` as `burnout train` would run it."""
    device = resolve_device(cfg.train.device)
    setup = default_setup(cfg, data_dir, device)
    try:
        result = _add_mfu(measure(cfg, data_dir, setup, steps, warmup, device), device)
    except torch.OutOfMemoryError:
        raise BurnoutError(oom_message(cfg.train, cfg.train.seq_len or cfg.model.context_length)) from None
    return {"device": _device_line(device), "torch": torch.__version__, "model": _model_line(cfg),
            "batch": _batch_line(cfg), **result}


def ablate(cfg: RunConfig, data_dir: Path, steps: int = 10, warmup: int = 2, on_rung=None,
           skip: tuple[str, ...] = ()) -> dict:
    """The ladder: each rung's tokens/s and its speedup over the previous measured rung and over the
    first (the baseline, unless it ran out of memory); `on_rung` is called with each measured rung.
    Rungs named in `skip` (not the baseline) are left out: their change is not applied; so is the bf16 rung's
    on a CPU that emulates bf16 (`emulated_bf16`), listed with the reason in `skipped`. A rung that runs out of
    memory keeps its change but has `skipped` set instead of measurements (None when it ran)."""
    unknown = set(skip) - {key for key, _, _ in RUNGS[1:]}
    if unknown:
        raise BurnoutError(f"--skip: unknown rung '{sorted(unknown)[0]}'; choose from "
                           f"{', '.join(key for key, _, _ in RUNGS[1:])}")
    device = resolve_device(cfg.train.device)
    setup = Setup()
    rungs = []
    for key, label, change in RUNGS:
        if key in skip:
            continue
        if change.get("precision") == "bf16" and (why := emulated_bf16(device)):
            rungs.append({"rung": key, "label": label, "setup": dataclasses.asdict(setup), "skipped": why,
                          "skip_label": "left out: bf16 emulated here"})
            continue
        setup = dataclasses.replace(setup, **change)
        skipped = None
        try:
            r = measure(cfg, data_dir, setup, steps, warmup, device)
        except torch.OutOfMemoryError as exc:
            skipped = f"out of memory at this rung: {first_line(exc, 120)}"
        if skipped is not None:
            rungs.append({"rung": key, "label": label, "setup": dataclasses.asdict(setup), "skipped": skipped,
                          "skip_label": "skipped: out of memory"})
            continue
        if r["note"] is not None and setup.compile:
            setup = dataclasses.replace(setup, compile=False)  # later rungs go on without it
        r = {"rung": key, "label": label, "skipped": None, **r}
        ran = [x for x in rungs if x["skipped"] is None] + [r]
        r["speedup_prev"] = r["tokens_per_s"] / ran[-2]["tokens_per_s"] if len(ran) > 1 else 1.0
        r["speedup_total"] = r["tokens_per_s"] / ran[0]["tokens_per_s"]
        rungs.append(r)
        if on_rung is not None:
            on_rung(r)
    for r in rungs:
        if r["skipped"] is None:
            _add_mfu(r, device)
    return {"device": _device_line(device), "torch": torch.__version__, "model": _model_line(cfg),
            "batch": _batch_line(cfg), "rungs": rungs}


def _model_line(cfg: RunConfig) -> str:
    m = cfg.model
    return f"{m.family} {m.n_layer} layers × {m.d_model} wide, {m.n_head} heads, vocab {m.vocab_size}"


def _batch_line(cfg: RunConfig) -> str:
    tc = cfg.train
    seq_len = tc.seq_len or cfg.model.context_length
    return f"batch {tc.batch_size} × accumulation {tc.grad_accum} × {seq_len} tokens"


def format_bench(r: dict) -> str:
    split = r["split_s"]
    lines = [
        f"{r['model']} ({r['params']:,} params); {r['batch']}; {r['device']}, torch {r['torch']}",
        f"setup: {_setup_line(r['setup'])}" + (f"  [{r['note']}]" if r["note"] else ""),
        f"tokens/s      {r['tokens_per_s']:,.0f}   ({r['step_s'] * 1000:.1f} ms/step, median of {r['steps']} steps; "
        f"first step {r['first_step_s']:.1f} s)",
        "step split    " + "  ".join(f"{p} {split[p] * 1000:.1f} ms ({r['split_fraction'][p]:.1%})" for p in PARTS),
        f"MFU           {r['mfu_measured']:.1%} of a measured {r['peak_flops_measured'] / 1e9:,.0f} GFLOP/s "
        f"{r['setup']['precision']} matmul peak ({r['achieved_flops'] / 1e9:,.1f} GFLOP/s achieved)"
        if "mfu_measured" in r else f"MFU           {r['mfu_left_out']}",
    ]
    if "mfu_table" in r:
        lines.append(f"MFU (table)   {r['mfu_table']:.1%} of the {r['hardware']}'s {r['peak_flops_table'] / 1e12:,.0f} "
                     "TFLOP/s datasheet peak")
    memory = f"peak RSS {r['peak_rss_mb']:,.0f} MB"
    if "peak_memory_mb" in r:
        memory = f"peak GPU memory {r['peak_memory_mb']:,.0f} MB, " + memory
    lines.append(f"memory        {memory}")
    return "\n".join(lines)


def format_ablation(r: dict) -> str:
    lines = [f"{r['model']}; {r['batch']}; {r['device']}, torch {r['torch']}",
             f"{'rung':<68} {'tokens/s':>10} {'ms/step':>9} {'data':>6} {'×prev':>6} {'×base':>6} {'MFU':>6}"]
    for x in r["rungs"]:
        if x["skipped"]:
            label = f"{x['label']} ({x['skip_label']})"
            lines.append(f"{label:<68} {'-':>10} {'-':>9} {'-':>6} {'-':>6} {'-':>6} {'-':>6}")
            continue
        label = x["label"] + (" (unavailable: ran eager)" if x["note"] else "")
        lines.append(f"{label:<68} {x['tokens_per_s']:>10,.0f} {x['step_s'] * 1000:>9.1f} "
                     f"{x['split_fraction']['data']:>6.1%} {x['speedup_prev']:>5.2f}x {x['speedup_total']:>5.2f}x "
                     + (f"{x['mfu_measured']:>6.1%}" if "mfu_measured" in x else f"{'-':>6}"))
    notes = [f"{x['rung']}: {x['skipped'] or x['note']}" for x in r["rungs"] if x["skipped"] or x["note"]]
    notes += [f"{x['rung']}: MFU {x['mfu_left_out']}" for x in r["rungs"] if "mfu_left_out" in x]
    ran = [x["rung"] for x in r["rungs"] if not x["skipped"]]
    if r["rungs"][0]["skipped"] and ran:
        notes.append(f"×base is over {ran[0]}, the first rung that fit; ×prev over the last rung that ran")
    return "\n".join(lines + notes)


def _setup_line(s: dict) -> str:
    return (f"{s['loader']} loader, {s['batching']} batching, {'compiled' if s['compile'] else 'eager'}, "
            f"{s['precision']}, {'SDPA' if s['attention'] == 'sdpa' else 'explicit'} attention")
