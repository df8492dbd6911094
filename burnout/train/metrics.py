"""metrics.jsonl: one JSON object per logged step, the file every report and plot reads; the loop's
step logger that writes it (and hands each record to the run's tracker, and prints the console line)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from burnout.base.files import METRICS_FILE, append_jsonl, read_jsonl, write_atomic
from burnout.base.text import format_duration
from burnout.config import TrainConfig
from burnout.train.trackers import Tracker

# Keys that measure the machine rather than the training: they differ between a run and its exact replay.
TIMING_KEYS = ("elapsed_s", "tokens_per_s", "mfu", "eta_s", "dollars", "dollars_projected", "first_step_s")
# How often a session measures its peak again for steps that outran it (each CPU measurement takes a second or more).
PEAK_MEASUREMENTS_PER_SESSION = 3


class MetricsLog:
    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / METRICS_FILE

    def truncate_after(self, step: int) -> None:
        """Forget records past `step`: a resumed run logs them again, identically."""
        if not self.path.exists():
            return
        kept = [r for r in read_jsonl(self.path) if r["step"] <= step]
        write_atomic(self.path, "".join(json.dumps(r) + "\n" for r in kept))  # a kill here must not lose the log

    def write(self, record: dict) -> None:
        append_jsonl(self.path, record)


def read_metrics(run_dir: Path) -> list[dict]:
    return read_jsonl(Path(run_dir) / METRICS_FILE)


class StepLogger:
    """Due every train.log_interval steps, at every evaluation and at a session's last step. A record
    holds the loss, LR, gradient norm, tokens/s since the previous record and, on rank 0, MFU, ETA to
    `stop_at` and dollars (from the logged elapsed_s, so the log reproduces them).

    A session's first step is left out of tokens/s, MFU and ETA: it carries torch.compile's tracing and
    compilation and the allocator's warm-up, which no later step repeats. Its seconds are logged once,
    as `first_step_s` in the session's first record, so the cost of starting shows on its own.

    MFU never exceeds 1 (`mfu`): `measure_peak`, where given, measures `peak_flops` again (all devices). `tracker`
    (train.tracker's, on rank 0) receives each record metrics.jsonl receives, and is closed with the logger."""

    def __init__(self, run_dir: Path | None, tc: TrainConfig, tokens_per_step: int, flops_per_token: float,
                 peak_flops: float | None, price: float | None, stop_at: int, bar, emit: Callable[[str], None],
                 measure_peak: Callable[[], float] | None = None, tracker: Tracker | None = None):
        self.tc, self.tokens_per_step, self.flops_per_token = tc, tokens_per_step, flops_per_token
        self.peak_flops, self.price, self.stop_at, self.bar, self.emit = peak_flops, price, stop_at, bar, emit
        self.measure_peak, self.peak_measurements_left = measure_peak, PEAK_MEASUREMENTS_PER_SESSION
        self.said_mfu_left_out = False
        self.main = run_dir is not None  # rank 0 writes; the other ranks only measure
        self.metrics = MetricsLog(run_dir) if self.main else None
        self.tracker = tracker
        self.train_time, self.train_tokens, self.train_steps = 0.0, 0, 0  # since the last record, for tokens/s
        self.first_step_s: float | None = None  # the session's first step, until a record takes it
        self.started = False  # whether this session has counted its first step

    def count(self, seconds: float, positions: int) -> None:
        """One more step of `seconds` of training time that computed `positions` token positions."""
        if not self.started:
            self.started, self.first_step_s = True, seconds
            return
        self.train_time += seconds
        self.train_tokens += positions
        self.train_steps += 1

    def due(self, step: int, final: bool) -> bool:
        tc = self.tc
        return step % tc.log.log_interval == 0 or step % tc.eval.eval_interval == 0 or final

    def record(self, step: int, loss: float, lr: float, grad_norm: float, elapsed: float, skipped: int) -> dict:
        """The record of `step`. Where the window since the last record is the session's first step alone
        (train.log_interval=1, or a record due right after a resume), no rate was measured: tokens_per_s,
        MFU, ETA and dollars_projected are left out rather than computed from a step that includes
        compilation (an ETA from a compile step would read hours); the next record has them."""
        rate = self.train_tokens / self.train_time if self.train_tokens else None
        step_s = self.train_time / self.train_steps if self.train_steps else None
        self.train_time, self.train_tokens, self.train_steps = 0.0, 0, 0
        measured = {"tokens_per_s": rate} if rate else {}
        record = {"step": step, "tokens": step * self.tokens_per_step, "train_loss": loss, "lr": lr,
                  "grad_norm": grad_norm, **measured, "elapsed_s": round(elapsed, 3), "skipped_steps": skipped}
        if self.first_step_s is not None:
            record["first_step_s"] = round(self.first_step_s, 3)
            self.first_step_s = None
        if not self.main:
            return record
        if rate:
            eta = (self.stop_at - step) * step_s
            if self.tc.budget.max_minutes is not None:  # a time budget ends the run at its end, however slow the steps
                eta = min(eta, max(0.0, self.tc.budget.max_minutes * 60 - elapsed))
            mfu = self.mfu(rate * self.flops_per_token, step)
            if mfu is not None:
                record["mfu"] = mfu
            record["eta_s"] = round(eta, 1)
        if self.price is not None:
            record["dollars"] = record["elapsed_s"] / 3600 * self.price
            if rate:
                record["dollars_projected"] = (record["elapsed_s"] + eta) / 3600 * self.price
        return record

    def mfu(self, achieved: float, step: int) -> float | None:
        """`achieved` FLOP/s over the peak, at most 1. A step cannot outrun the peak: where one does, the peak was
        measured while other work slowed the machine, so it is measured again (the higher kept). Where the step
        still outruns it, MFU is left out, said once: a figure over 100% is impossible, and 100% would claim a
        saturated machine that nothing measured."""
        if achieved > self.peak_flops and self.measure_peak is not None and self.peak_measurements_left:
            self.peak_measurements_left -= 1
            self.peak_flops = max(self.peak_flops, self.measure_peak())
        if achieved <= self.peak_flops:
            return achieved / self.peak_flops
        if not self.said_mfu_left_out:
            self.said_mfu_left_out = True
            why = ("measured again: other work on this machine slowed the measurements" if self.measure_peak
                   else f"check train.hardware={self.tc.budget.hardware}")
            self.emit(f"mfu left out from step {step}: the steps ran {achieved / 1e9:,.1f} GFLOP/s, above the "
                      f"{self.peak_flops / 1e9:,.1f} GFLOP/s peak MFU is over ({why})")
        return None

    def write(self, record: dict) -> None:
        if not self.main:
            return
        self.metrics.write(record)
        if self.tracker is not None:
            self.tracker.log(record)
        line = f"step {record['step']}/{self.stop_at} loss {record['train_loss']:.4f} lr {record['lr']:.2e}"
        postfix = {"loss": f"{record['train_loss']:.3f}"}
        if "tokens_per_s" in record:
            postfix["tok_s"] = f"{record['tokens_per_s']:.0f}"
            line += f" {record['tokens_per_s']:.0f} tok/s"
            if "mfu" in record:  # left out where the steps outran the peak
                postfix["mfu"] = f"{record['mfu']:.1%}"
                line += f" mfu {record['mfu']:.1%}"
            line += f" eta {format_duration(record['eta_s'])}"
        if "first_step_s" in record:
            line += f" first step {record['first_step_s']:.1f} s"
        self.bar.set_postfix(postfix)
        if self.price is not None:
            line += f" ${record['dollars']:.2f}"
        if "val_loss" in record:
            line += f" val {record['val_loss']:.4f}"
        if self.bar.disable or "val_loss" in record:
            self.emit(line)

    def close(self) -> None:
        if self.tracker is not None:
            self.tracker.close()
