"""The report's figures as PNG bytes (matplotlib, no display needed)."""

from __future__ import annotations

import io
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless: CI machines and SSH sessions have no display

import matplotlib.pyplot as plt  # noqa: E402  (must follow the backend choice)

from burnout.base.values import is_finite_number
from burnout.report.runlog import RunLog  # noqa: E402


def loss_plot(run: RunLog, x: str, log_scale: bool) -> bytes:
    """Train and val loss against `x` ("step" or "tokens"); a continued run's parent's first (loss_curves)."""
    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    for label, xs, ys, style in loss_curves(run, x):
        ax.plot(xs, ys, style, label=label, markersize=4, **({"color": "grey"} if label.startswith("parent") else {}))
    if run.parent_records:
        ax.axvline(_parent_offset(run, x), linestyle=":", color="black", label=f"continued from "
                   f"{Path(run.lineage['parent_run']).name} step {run.lineage['parent_step']:,}")
    title = f"{run.name}: loss vs {x}" + (" (after its parent's)" if run.parent_records else "")
    _finish(ax, x, "loss", title, log_scale)
    return _png(fig)


def loss_curves(run: RunLog, x: str) -> list[tuple[str, list[float], list[float], str]]:
    """(label, xs, losses, line style) of each loss curve against `x` ("step" or "tokens"). A continued run's
    parent's train and val loss come first, up to the checkpoint the run started from, and the run's own follow,
    offset by the parent's steps (tokens) there."""
    curves, offset = [], _parent_offset(run, x)
    for key, style in (("train_loss", "-"), ("val_loss", "o-")):
        rows = [r for r in run.parent_records if is_finite_number(r.get(key))]
        if rows:
            curves.append((f"parent {key.replace('_', ' ')}", [r["step" if x == "step" else "tokens"] for r in rows],
                           [r[key] for r in rows], style))
    for key, style in (("train_loss", "-"), ("val_loss", "o-")):
        steps, tokens, values = run.series(key)
        if values:
            curves.append((key.replace("_", " "), [offset + v for v in (steps if x == "step" else tokens)], values,
                           style))
    return curves


def _parent_offset(run: RunLog, x: str) -> int:
    """Where a continued run's own curve starts on the x axis: its parent's step (tokens) at the checkpoint it
    loaded; 0 where the parent's log is not shown."""
    if not run.parent_records:
        return 0
    return run.lineage["parent_step" if x == "step" else "parent_tokens"]


def lr_plot(run: RunLog) -> bytes:
    fig, ax = plt.subplots(figsize=(7, 3), dpi=100)
    steps, _, values = run.series("lr")
    ax.plot(steps, values, "-", color="tab:green")
    _finish(ax, "step", "learning rate", f"{run.name}: learning rate", log_scale=False)
    return _png(fig)


def dpo_plot(run: RunLog) -> bytes:
    """A DPO run's reward margin (left) and reward accuracy (right), on training and held-out pairs."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.5), dpi=100)
    for ax, key, label in ((left, "margin", "reward margin (chosen − rejected)"),
                           (right, "accuracy", "reward accuracy")):
        for prefix, style, name in (("", "-", "train"), ("val_", "o-", "held-out")):
            steps, _, values = run.series(prefix + key)
            if values:
                ax.plot(steps, values, style, label=name, markersize=4)
        _finish(ax, "step", label, f"{run.name}: {label}", log_scale=False)
    return _png(fig)


def rl_plot(run: RunLog) -> bytes:
    """An RL run's mean reward and share of groups with signal (left), and held-out pass@1 and pass@k (right)."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.5), dpi=100)
    for ax, keys, label in ((left, (("reward", "mean reward"), ("signal", "groups with signal")), "per step"),
                            (right, (("val_pass@1", "pass@1"), ("val_pass@k", "pass@k")), "held-out questions")):
        for key, name in keys:
            steps, _, values = run.series(key)
            if values:
                ax.plot(steps, values, "o-" if key.startswith("val_") else "-", label=name, markersize=4)
        _finish(ax, "step", label, f"{run.name}: {label}", log_scale=False)
    return _png(fig)


def task_plot(run: RunLog) -> bytes:
    """train.eval_tasks' scores against tokens: each task's acc_norm where it has one (else acc), dotted at its
    chance level where it has choices, and CORE."""
    keys = sorted({k for r in run.records for k in r if k.startswith("eval/")})
    tasks = dict.fromkeys(k.rsplit("/", 1)[0] for k in keys if k != "eval/core")
    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    for task in tasks:
        metric = f"{task}/acc_norm" if f"{task}/acc_norm" in keys else f"{task}/acc"
        _, tokens, values = run.series(metric)
        line, = ax.plot(tokens, values, "o-", label=metric.removeprefix("eval/"), markersize=4)
        chance = run.last_value(f"{task}/chance")
        if chance is not None:
            ax.axhline(chance, linestyle=":", color=line.get_color(), label=f"{task.removeprefix('eval/')} chance")
    if "eval/core" in keys:
        _, tokens, values = run.series("eval/core")
        ax.plot(tokens, values, "s--", color="black", label="CORE (centered)", markersize=4)
    _finish(ax, "tokens", "score", f"{run.name}: benchmarks during training", log_scale=False)
    return _png(fig)


def overlay_plot(runs: list[RunLog], log_scale: bool) -> bytes:
    """Loss against tokens for several runs: the ablation view (same tokens, which run learns faster)."""
    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    for run in runs:
        _, tokens, values = run.series("train_loss")
        line, = ax.plot(tokens, values, "-", label=f"{run.name} train", alpha=0.8)
        _, val_tokens, val_values = run.series("val_loss")
        if val_values:
            ax.plot(val_tokens, val_values, "o--", color=line.get_color(), label=f"{run.name} val", markersize=4)
    _finish(ax, "tokens", "loss", "loss vs tokens", log_scale)
    return _png(fig)


def _finish(ax, x: str, y: str, title: str, log_scale: bool) -> None:
    ax.set_xlabel(x)
    ax.set_ylabel(y)
    ax.set_title(title)
    if log_scale:  # log-log: a power law in tokens becomes a straight line
        ax.set_xscale("log")
        ax.set_yscale("log")
    ax.grid(True, alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend()


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()
