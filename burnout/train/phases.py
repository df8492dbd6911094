"""Phases: a run split at chosen steps, each with an optional budget. A session stops at the end of the
current phase; the summary it prints (and appends to RUN/phases.jsonl) tells the person deciding whether
to go on what the phase cost and what the next one should bring."""

from __future__ import annotations

from pathlib import Path

from burnout.base.files import PHASES_FILE, append_jsonl
from burnout.base.text import format_duration
from burnout.config import PhaseConfig, TrainConfig
from burnout.train.forecast import forecast_loss
from burnout.train.metrics import read_metrics


def current_phase(tc: TrainConfig, step: int) -> PhaseConfig | None:
    """The phase the update after `step` belongs to (None: no phases, or past the last one)."""
    return next((p for p in tc.phases if p.steps > step), None)


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
             + f", {format_duration(phase_s)}"
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
    append_jsonl(Path(run_dir) / PHASES_FILE, summary)
    return lines
