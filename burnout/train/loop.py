"""The training loop: AdamW (or Muon for the blocks' matrices beside it, burnout/train/optim.py), a
warmup + decay schedule, gradient accumulation and clipping, mixed precision, periodic validation and
samples, atomic checkpoints, phases with budgets, stop conditions (steps, tokens, epochs, wall clock,
SIGTERM/SIGINT), skipped non-finite steps, and torchrun (DDP or FSDP2). Every logged step is appended
to metrics.jsonl with throughput, MFU, ETA and dollars.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import random
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import yaml
from tqdm import tqdm

from burnout.config import PhaseConfig, RunConfig, TrainConfig
from burnout.data.loader import TokenLoader, check_compatible
from burnout.data.prepare import read_meta
from burnout.data.tokenizer import load_tokenizer
from burnout.errors import BurnoutError
from burnout.eval.loss import evaluate_loss
from burnout.generate.sampling import generate_text
from burnout.models import Transformer
from burnout.models.info import flops_per_token, matmul_parameters
from burnout.train.checkpoint import CheckpointMirror, list_checkpoints, load_checkpoint, save_checkpoint
from burnout.train.device import autocast, configure_backends, resolve_device, resolve_precision
from burnout.train.distributed import (DistContext, any_rank, barrier, full_state, grad_sync, init_distributed,
                                       load_optimizer_state, mean_across_ranks, shutdown, wrap_model)
from burnout.train.forecast import forecast_loss
from burnout.train.hardware import get_hardware
from burnout.train.metrics import METRICS_FILE, ExternalLoggers, MetricsLog, read_metrics, write_atomic
from burnout.train.optim import make_optimizer
from burnout.train.provenance import record_launch
from burnout.train.schedule import lr_at, total_steps

PHASES_FILE = "phases.jsonl"


@dataclass
class TrainResult:
    run_dir: Path
    checkpoint: Path
    step: int
    tokens: int
    train_loss: float
    val_loss: float
    elapsed_s: float
    tokens_per_s: float
    # done (the run's last step), phase (a phase ended; --resume continues), time (train.max_minutes),
    # signal (SIGTERM / SIGINT: checkpoint saved, --resume continues)
    stop_reason: str = "done"
    phase: str | None = None
    skipped_steps: int = 0


# Token files up to this size (and a quarter of the RAM) are read into memory once; larger ones are
# memory-mapped. Both give identical batches; preload saves the page-cache walk on every batch.
PRELOAD_MAX_BYTES = 4 * 2**30


def loader_mode(data_dir: Path) -> str:
    """'preload' when the train and val token files fit comfortably in RAM, else 'mmap'."""
    meta = read_meta(data_dir)
    size = sum(s["tokens"] for info in meta["splits"].values() for s in info["shards"]) * np.dtype(meta["dtype"]).itemsize
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        ram = 0
    return "preload" if size <= min(PRELOAD_MAX_BYTES, ram // 4) else "mmap"


def refuse_existing_run(run_dir: Path) -> None:
    if list_checkpoints(run_dir) or (Path(run_dir) / METRICS_FILE).exists():
        raise BurnoutError(f"run folder {run_dir} already holds a run; resume it with --resume or choose a new --out")


def apply_activation_checkpointing(model: Transformer) -> None:
    """Recompute each block's activations during backward instead of keeping them."""
    from torch.utils.checkpoint import checkpoint

    for block in model.blocks:
        # An instance attribute: the module tree, and so the checkpoint's tensor names, stay unchanged.
        block.forward = functools.partial(checkpoint, block.forward, use_reentrant=False)


def accumulate_gradients(model, loader: TokenLoader, step: int, grad_accum: int, device: torch.device,
                         precision: str, rank: int = 0, world_size: int = 1, scaler=None) -> torch.Tensor:
    """Forward and backward over one optimizer step's micro-batches; returns this rank's mean loss.

    Micro-batch m of rank r at step s is batch (s·W + r)·A + m of the stream: a pure function of the
    step, so a resumed run sees the same data, and the same for every split of a global batch into
    ranks × accumulation, so W ranks accumulating A equal one process accumulating W·A.
    """
    loss_sum = torch.zeros((), device=device)
    for micro in range(grad_accum):
        x, y = loader.get_batch((step * world_size + rank) * grad_accum + micro)
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        with grad_sync(model, micro == grad_accum - 1):
            with autocast(device, precision):
                loss = model(x, y) / grad_accum
            (scaler.scale(loss) if scaler is not None else loss).backward()
        loss_sum += loss.detach()
    return loss_sum


def measure_step_seconds(cfg: RunConfig, data_dir: Path, steps: int = 3) -> float:
    """Median wall time of a training step for this config, after one warm-up step (weights discarded)."""
    tc = cfg.train
    device = resolve_device(tc.device)
    precision = resolve_precision(tc.precision, device)
    loader = TokenLoader(data_dir, "train", tc.batch_size, tc.seq_len or cfg.model.context_length, tc.seed)
    model = Transformer(cfg.model).to(device)
    optimizer = make_optimizer(model, tc, device)
    times = []
    for step in range(steps + 1):
        t0 = time.perf_counter()
        accumulate_gradients(model, loader, step, tc.grad_accum, device, precision).item()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
    return sorted(times[1:])[len(times[1:]) // 2]


# ----------------------------------------------------------------------------------------------
# Memory


def oom_message(tc: TrainConfig, seq_len: int) -> str:
    if tc.batch_size > 1:
        half = tc.batch_size // 2
        fix = (f"try train.batch_size={half} train.grad_accum={tc.grad_accum * tc.batch_size // half}"
               " (about the same tokens per step), or --auto-batch")
    else:
        fix = "try train.activation_checkpointing=true, a shorter train.seq_len or a smaller model"
    return f"out of GPU memory at micro-batch train.batch_size={tc.batch_size} × {seq_len} tokens; {fix}"


def largest_micro_batch(seqs_per_step: int, fits: Callable[[int], bool]) -> int:
    """The largest divisor of `seqs_per_step` (sequences per step per rank) for which `fits` holds."""
    for b in sorted((d for d in range(1, seqs_per_step + 1) if seqs_per_step % d == 0), reverse=True):
        if fits(b):
            return b
    raise BurnoutError("--auto-batch: not even a micro-batch of one sequence fits in memory; try "
                       "train.activation_checkpointing=true, a shorter train.seq_len or a smaller model")


def memory_probe(cfg: RunConfig, device: torch.device, precision: str, seq_len: int) -> Callable[[int], bool]:
    """fits(b): whether a full training step (forward, backward, optimizer) at micro-batch b fits on `device`."""
    model = Transformer(cfg.model).to(device)
    if cfg.train.activation_checkpointing:
        apply_activation_checkpointing(model)
    optimizer = make_optimizer(model, cfg.train, device)

    def fits(b: int) -> bool:
        ok = True
        try:
            x = torch.randint(0, cfg.model.vocab_size, (b, seq_len), device=device)
            with autocast(device, precision):
                loss = model(x, x)
            loss.backward()
            optimizer.step()  # the moments are allocated on the first step and kept for the next tries
        except torch.OutOfMemoryError:
            ok = False
        # Outside the except block, so the traceback no longer pins the failed step's tensors.
        optimizer.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.empty_cache()
        return ok

    return fits


# ----------------------------------------------------------------------------------------------
# Signals


class _StopSignals:
    """SIGTERM (spot pre-emption, `kill`) and SIGINT (Ctrl-C) ask the loop to checkpoint and stop after
    the current step; a second Ctrl-C interrupts at once. Only the main thread can install handlers."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self):
        self.received: int | None = None
        self._previous: dict = {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame):
        if self.received == signal.SIGINT and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.received = signum

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


# ----------------------------------------------------------------------------------------------
# The loop


def train(
    cfg: RunConfig,
    run_dir: Path,
    data_dir: Path,
    resume: bool = False,
    progress: bool | None = None,
    on_event: Callable[[str], None] | None = None,
    auto_batch: bool = False,
) -> TrainResult:
    """Train `cfg.model` on the prepared tokens in `data_dir`, writing everything to `run_dir`.

    Stops at the end of the current phase (or the run), at train.max_minutes, or on SIGTERM/SIGINT,
    always with a checkpoint. `on_event` receives human-readable lines as they happen (rank 0 only).
    `auto_batch` replaces train.batch_size by the largest micro-batch that fits and keeps the tokens
    per step through train.grad_accum.
    """
    ctx, device = init_distributed(resolve_device(cfg.train.device))
    try:
        return _train(cfg, Path(run_dir), Path(data_dir), resume, progress, on_event, auto_batch, ctx, device)
    finally:
        shutdown(ctx)


def _train(cfg: RunConfig, run_dir: Path, data_dir: Path, resume: bool, progress: bool | None,
           on_event: Callable[[str], None] | None, auto_batch: bool, ctx: DistContext,
           device: torch.device) -> TrainResult:
    tc = cfg.train
    if not resume:
        refuse_existing_run(run_dir)
    # A run killed before its first checkpoint has nothing to load: resuming it starts it again from step 0.
    from_scratch = resume and not list_checkpoints(run_dir)
    emit = (on_event or (lambda line: None)) if ctx.is_main else (lambda line: None)
    if from_scratch:
        emit(f"{run_dir} holds no checkpoint yet: starting it again from step 0")
    precision = resolve_precision(tc.precision, device)
    configure_backends(device)
    seq_len = tc.seq_len or cfg.model.context_length
    meta = read_meta(data_dir)
    check_compatible(meta, cfg.model.vocab_size)
    tokenizer_path = data_dir / "tokenizer.json"

    if auto_batch and not resume:
        seqs = tc.batch_size * tc.grad_accum
        b = largest_micro_batch(seqs, memory_probe(cfg, device, precision, seq_len))
        if b != tc.batch_size:
            emit(f"auto-batch: micro-batch {b} × accumulation {seqs // b} (was {tc.batch_size} × {tc.grad_accum})")
        cfg = dataclasses.replace(cfg, train=dataclasses.replace(tc, batch_size=b, grad_accum=seqs // b))
        tc = cfg.train
    # Rank 0's stream, indexed per rank by accumulate_gradients; validation is rank 0's alone.
    mode = loader_mode(data_dir)
    loaders = {split: TokenLoader(data_dir, split, tc.batch_size, seq_len, tc.seed, mode=mode) for split in ("train", "val")}
    tokens_per_step = tc.batch_size * tc.grad_accum * seq_len * ctx.world_size
    end_of_run = total_steps(tc, tokens_per_step, meta["splits"]["train"]["tokens"])

    random.seed(tc.seed)
    np.random.seed(tc.seed)
    torch.manual_seed(tc.seed)
    model = Transformer(cfg.model).to(device)
    fpt = flops_per_token(cfg.model, seq_len, matmul_parameters(model))["flops_per_token"]
    if tc.activation_checkpointing:
        apply_activation_checkpointing(model)
    step, elapsed_before, skipped, ckpt = 0, 0.0, 0, None
    if resume and not from_scratch:
        ckpt = load_checkpoint(list_checkpoints(run_dir)[-1], "cpu")
        if ckpt.config.model != cfg.model:
            raise BurnoutError(f"--resume: the model in {ckpt.path} differs from this config's model section")
        if (ckpt.path / "tokenizer.json").read_bytes() != tokenizer_path.read_bytes():
            raise BurnoutError(f"--resume: {tokenizer_path} is not the tokenizer {ckpt.path} was trained with; "
                               "point data.prepared_dir at the run's original data")
        model.load_state_dict(ckpt.model.state_dict())
        step, elapsed_before = ckpt.state["step"], ckpt.state["elapsed_s"]
        skipped = ckpt.state.get("skipped_steps", 0)
    wrapped = wrap_model(model, ctx, tc.distributed, device)
    optimizer = make_optimizer(wrapped, tc, device)
    scaler = torch.amp.GradScaler(device.type) if precision == "fp16" else None
    if ckpt is not None:
        load_optimizer_state(wrapped, optimizer, ckpt.state["optimizer"], tc.distributed, ctx)
        if scaler is not None and "scaler" in ckpt.state:
            scaler.load_state_dict(ckpt.state["scaler"])
        random.setstate(ckpt.state["python_rng"])
        _set_numpy_rng_state(ckpt.state["numpy_rng"])
        torch.set_rng_state(ckpt.state["torch_rng"])
        if device.type == "cuda" and "cuda_rng" in ckpt.state:
            torch.cuda.set_rng_state(ckpt.state["cuda_rng"], device)
        emit(f"resumed from {ckpt.path} at step {step}")
    step_model = torch.compile(wrapped) if tc.compile else wrapped
    # FSDP's shards must all take part in a forward; a DDP replica on rank 0 can evaluate alone.
    evaluates = ctx.is_main or (ctx.enabled and tc.distributed == "fsdp")
    eval_model = wrapped if tc.distributed == "fsdp" else model
    tokenizer = load_tokenizer(tokenizer_path) if evaluates else None

    phase = next((p for p in tc.phases if p.steps > step), None)
    stop_at = min(phase.steps, end_of_run) if phase else end_of_run
    keep_steps = set(tc.milestones) | {p.steps for p in tc.phases}
    hw = get_hardware(tc.hardware, precision, tc.price_per_hour, device) if ctx.is_main else None
    price = hw.price_per_hour * ctx.world_size if hw and hw.price_per_hour is not None else None

    metrics = external = mirror = None
    if ctx.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        metrics = MetricsLog(run_dir)
        if resume:
            metrics.truncate_after(step)
        write_atomic(run_dir / "config.yaml", yaml.safe_dump(cfg.to_dict(), sort_keys=False))
        record_launch(run_dir, step, device, ctx.world_size)
        external = ExternalLoggers(run_dir, tc.tensorboard, tc.wandb, cfg.to_dict())
        if tc.mirror_dir:
            mirror = CheckpointMirror(Path(tc.mirror_dir), emit)
    if phase is not None:
        emit(f"phase '{phase.name}': steps {step} → {stop_at}"
             + (f", budget ${phase.budget:,.2f}" if phase.budget is not None else ""))

    show_bar = ctx.is_main and (sys.stderr.isatty() if progress is None else progress)
    bar = tqdm(total=stop_at, initial=step, disable=not show_bar, unit="step", dynamic_ncols=True)
    emit_line = bar.write if show_bar else emit
    elapsed = elapsed_before

    def checkpoint(train_loss: float, val_loss: float) -> Path:
        model_state, optim_state = full_state(wrapped, optimizer, tc.distributed, ctx)  # collective under FSDP
        path = run_dir / "checkpoints" / f"step_{step:07d}"
        if ctx.is_main:
            state = {
                "optimizer": optim_state,
                "step": step,
                "tokens": step * tokens_per_step,
                # Batches are a pure function of the micro-batch index: this is the loader's position.
                "micro_batches_seen": step * tc.grad_accum * ctx.world_size,
                "elapsed_s": elapsed,
                "skipped_steps": skipped,
                "python_rng": random.getstate(),
                "numpy_rng": _numpy_rng_state(),
                "torch_rng": torch.get_rng_state(),
            }
            if device.type == "cuda":
                state["cuda_rng"] = torch.cuda.get_rng_state(device)
            if scaler is not None:
                state["scaler"] = scaler.state_dict()
            to_save = model
            if model_state is not None:  # FSDP: the gathered weights in a plain module
                to_save = Transformer(cfg.model)
                to_save.load_state_dict(model_state)
            info = {"step": step, "tokens": step * tokens_per_step, "train_loss": train_loss,
                    "val_loss": val_loss, "elapsed_s": elapsed}
            path = save_checkpoint(run_dir, cfg, to_save, state, info, tokenizer_path, tc.keep_last, keep_steps)
            if mirror is not None:
                mirror.submit(path, list_checkpoints(run_dir))
            emit_line(f"step {step}: saved {path}")
        barrier(ctx)
        return path

    wrapped.train()
    train_time, train_tokens = 0.0, 0  # since the last log line, for tokens/s
    loss_value = val_loss = float("nan")
    ckpt_path, stop_reason, bad_in_row = None, "done", 0
    session_start = t_start = time.perf_counter()
    try:
        with _StopSignals() as signals:
            while step < stop_at:
                t0 = time.perf_counter()
                lr = lr_at(step, tc, end_of_run)  # train.lr's schedule; Muon's LR follows it in proportion
                optimizer.scale_lr(lr / tc.lr)
                try:
                    loss_sum = accumulate_gradients(step_model, loaders["train"], step, tc.grad_accum, device,
                                                    precision, ctx.rank, ctx.world_size, scaler)
                except torch.OutOfMemoryError:
                    raise BurnoutError(oom_message(tc, seq_len)) from None
                loss_sum = mean_across_ranks(loss_sum, ctx)
                if scaler is not None:
                    optimizer.unscale(scaler)
                grad_norm = torch.nn.utils.clip_grad_norm_(wrapped.parameters(), tc.grad_clip or float("inf"))
                grad_norm = grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm
                # One host sync per step: whether to apply the update depends on it.
                loss_value, norm_value = loss_sum.item(), grad_norm.item()
                # Under fp16 an infinite gradient is the scaler's business (it skips and lowers the scale).
                if math.isfinite(loss_value) and (scaler is not None or math.isfinite(norm_value)):
                    optimizer.step(scaler)
                    bad_in_row = 0
                else:
                    bad_in_row += 1
                    skipped += 1
                    emit_line(f"step {step + 1}: loss {loss_value} / grad norm {norm_value}: not finite, "
                              f"update skipped ({bad_in_row} in a row)")
                    if bad_in_row >= tc.max_bad_steps:
                        last = list_checkpoints(run_dir)
                        raise BurnoutError(
                            f"the loss was not finite for {bad_in_row} steps in a row (up to step {step + 1}); "
                            f"stopped, the last good checkpoint {last[-1] if last else '(none yet)'} is intact; "
                            "resume with a lower train.lr or longer train.warmup_steps")
                if scaler is not None:
                    scaler.update()
                optimizer.zero_grad(set_to_none=True)
                step += 1
                train_time += time.perf_counter() - t0
                train_tokens += tokens_per_step
                elapsed = elapsed_before + time.perf_counter() - t_start
                bar.update(1)

                time_up = tc.max_minutes is not None and time.perf_counter() - session_start > tc.max_minutes * 60
                time_up, interrupted = any_rank([time_up, signals.received is not None], ctx, device)
                final = step >= stop_at or time_up or interrupted
                if final:
                    stop_reason = ("signal" if interrupted else "time" if time_up
                                   else "phase" if step < end_of_run else "done")
                if step % tc.log_interval == 0 or step % tc.eval_interval == 0 or final:
                    rate = train_tokens / train_time
                    record = {"step": step, "tokens": step * tokens_per_step, "train_loss": loss_value, "lr": lr,
                              "grad_norm": norm_value, "tokens_per_s": rate, "elapsed_s": round(elapsed, 3),
                              "skipped_steps": skipped}
                    train_time, train_tokens = 0.0, 0
                    if ctx.is_main:
                        eta = (stop_at - step) * tokens_per_step / rate
                        record["mfu"] = rate * fpt / (hw.peak_flops * ctx.world_size)
                        record["eta_s"] = round(eta, 1)
                        if price is not None:  # from the logged elapsed_s, so the log reproduces it
                            record["dollars"] = record["elapsed_s"] / 3600 * price
                            record["dollars_projected"] = (record["elapsed_s"] + eta) / 3600 * price
                    if step % tc.eval_interval == 0 or final:
                        if evaluates:
                            val_loss = evaluate_loss(eval_model, loaders["val"], tc.eval_batches, device, precision)
                            record["val_loss"] = val_loss
                            if tc.sample_prompt and tc.sample_tokens:
                                sample = generate_text(eval_model, tokenizer, tc.sample_prompt, tc.sample_tokens,
                                                       temperature=0.8, top_k=50, seed=tc.seed)
                                record["sample"] = sample
                                emit_line(f"step {step} sample: {json.dumps(sample)[:300]}")
                        wrapped.train()
                    if ctx.is_main:
                        metrics.write(record)
                        external.write(record)
                        bar.set_postfix(loss=f"{loss_value:.3f}", tok_s=f"{rate:.0f}", mfu=f"{record['mfu']:.1%}")
                        line = (f"step {step}/{stop_at} loss {loss_value:.4f} lr {lr:.2e} {rate:.0f} tok/s "
                                f"mfu {record['mfu']:.1%} eta {_duration(record['eta_s'])}")
                        if price is not None:
                            line += f" ${record['dollars']:.2f}"
                        if "val_loss" in record:
                            line += f" val {val_loss:.4f}"
                        if not show_bar or "val_loss" in record:
                            emit_line(line)
                if step % tc.ckpt_interval == 0 or final or step in keep_steps:
                    ckpt_path = checkpoint(loss_value, val_loss)
                if final:
                    break
    finally:
        bar.close()
        if mirror is not None:
            mirror.close()
        if external is not None:
            external.close()
    if ckpt_path is None:  # resumed at the end: nothing left to do
        ckpt_path = list_checkpoints(run_dir)[-1]
        info = json.loads((ckpt_path / "info.json").read_text())
        loss_value, val_loss = info["train_loss"], info["val_loss"]
    if stop_reason == "signal":
        emit(f"stopped by signal at step {step}; checkpoint {ckpt_path}; continue with: burnout train --resume {run_dir}")
    elif stop_reason == "time":
        emit(f"stopped at train.max_minutes={tc.max_minutes:g} after step {step}; checkpoint {ckpt_path}")
    elif phase is not None and step == phase.steps and ctx.is_main:
        for line in phase_summary(run_dir, tc, phase, tokens_per_step, price):
            emit(line)
    tokens_per_s = (step * tokens_per_step / elapsed) if elapsed else 0.0
    return TrainResult(run_dir, ckpt_path, step, step * tokens_per_step, loss_value, val_loss, elapsed,
                       tokens_per_s, stop_reason, phase.name if phase else None, skipped)


def _numpy_rng_state() -> dict:
    """NumPy's global RNG state as tensors and numbers, which torch.load(weights_only=True) accepts."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    return {"keys": torch.from_numpy(keys.astype(np.int64)), "pos": pos, "has_gauss": has_gauss, "cached": cached}


def _set_numpy_rng_state(state: dict) -> None:
    keys = state["keys"].numpy().astype(np.uint32)
    np.random.set_state(("MT19937", keys, state["pos"], state["has_gauss"], state["cached"]))


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 60}m{seconds % 60:02d}s"


# ----------------------------------------------------------------------------------------------
# Phase ends


def phase_summary(run_dir: Path, tc: TrainConfig, phase: PhaseConfig, tokens_per_step: int,
                  price: float | None) -> list[str]:
    """Lines for the person deciding whether to go on; the same facts go to RUN/phases.jsonl."""
    records = read_metrics(run_dir)
    start = max((p.steps for p in tc.phases if p.steps < phase.steps), default=0)
    at_start = [r for r in records if r["step"] <= start]
    last = records[-1]
    phase_s = last["elapsed_s"] - (at_start[-1]["elapsed_s"] if at_start else 0.0)
    dollars = phase_s / 3600 * price if price is not None else None
    summary = {"phase": phase.name, "step": last["step"], "tokens": last["tokens"], "train_loss": last["train_loss"],
               "val_loss": last.get("val_loss"), "phase_seconds": round(phase_s, 3), "dollars": dollars,
               "budget": phase.budget, "next": None}
    lines = [f"phase '{phase.name}' done at step {last['step']:,}: {last['tokens']:,} tokens, "
             f"train loss {last['train_loss']:.4f}"
             + (f", val loss {last['val_loss']:.4f}" if last.get("val_loss") is not None else "")
             + f", {_duration(phase_s)}"
             + (f", ${dollars:,.2f}" if dollars is not None else "")
             + (f" of a ${phase.budget:,.2f} budget" if phase.budget is not None and dollars is not None else "")]
    later = [p for p in tc.phases if p.steps > phase.steps]
    if later:
        nxt = later[0]
        tokens_next = nxt.steps * tokens_per_step
        losses = [(r["tokens"], r["train_loss"]) for r in records if r.get("train_loss") is not None]
        forecast = forecast_loss([t for t, _ in losses], [loss for _, loss in losses], tokens_next)
        # Priced at this phase's measured cost per step.
        cost_next = dollars / max(1, phase.steps - start) * (nxt.steps - phase.steps) if dollars is not None else None
        summary["next"] = {"phase": nxt.name, "steps": nxt.steps, "tokens": tokens_next, "forecast": forecast,
                           "dollars_estimate": cost_next}
        line = f"next phase '{nxt.name}' (to step {nxt.steps:,}, {tokens_next:,} tokens)"
        if forecast is not None:
            line += (f": power-law forecast train loss {forecast['loss']:.3f} "
                     f"(10–90%: {forecast['low']:.3f}–{forecast['high']:.3f})")
        if cost_next is not None:
            line += f", about ${cost_next:,.2f} at this phase's pace"
            gain = last["train_loss"] - forecast["loss"] if forecast is not None else 0.0
            if gain > 0:
                summary["next"]["dollars_per_0.1_loss"] = cost_next / (gain / 0.1)
                line += f", ${summary['next']['dollars_per_0.1_loss']:,.2f} per 0.1 of loss"
        lines.append(line)
        lines.append(f"continue with: burnout train --resume {run_dir}")
    with (Path(run_dir) / PHASES_FILE).open("a") as f:
        f.write(json.dumps(summary) + "\n")
    return lines
