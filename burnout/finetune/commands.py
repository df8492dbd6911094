"""`burnout sft`, `burnout dpo` and `burnout rl` as functions whose arguments are the commands' options: each
builds the run config (a --config file's sections, its fine-tuning section filled in from the arguments, then
KEY=VALUE overrides) and starts a new run with its recipe. A fine-tune resumes like any run (burnout/runs.py)."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path

from burnout.config import RunConfig, load_run_config, read_yaml, resolve_config_path, with_budget
from burnout.finetune.recipes import DPO, SFT
from burnout.finetune.rl import RL
from burnout.train.loop import TrainResult
from burnout.train.run import start_run


def sft(base: str | Path, data: str, out: str | Path, config: str | Path | None = None, lora: bool = False,
        layout: str | None = None, overrides: Sequence[str] = (), on_event: Callable[[str], None] = print,
        progress: bool | None = None, minutes: float | None = None, dollars: float | None = None) -> TrainResult:
    """Fine-tune `base` (a run folder or checkpoint) on the conversations in `data` into the new run `out`:
    full fine-tuning, or LoRA adapters with `lora` (sft.lora.r=… etc. shape them); `minutes` or `dollars`: the
    budget (train.max_minutes, train.max_dollars)."""
    cfg = fine_tune_config("sft", base, data, config, lora, with_budget(list(overrides), minutes, dollars),
                           layout=layout)
    return start_run(cfg, Path(out), SFT(), on_event=on_event, progress=progress)


def dpo(base: str | Path, data: str, out: str | Path, config: str | Path | None = None, lora: bool = False,
        beta: float | None = None, overrides: Sequence[str] = (), on_event: Callable[[str], None] = print,
        progress: bool | None = None, minutes: float | None = None, dollars: float | None = None) -> TrainResult:
    """Tune the chat model `base` with DPO on the preference pairs in `data` into the new run `out`; the starting
    model is the reference (with `lora`, the same model with its adapters off); `minutes` or `dollars`: the budget
    (train.max_minutes, train.max_dollars)."""
    cfg = fine_tune_config("dpo", base, data, config, lora, with_budget(list(overrides), minutes, dollars), beta=beta)
    return start_run(cfg, Path(out), DPO(cfg.dpo), on_event=on_event, progress=progress)


def rl(base: str | Path, data: str, out: str | Path, config: str | Path | None = None, lora: bool = False,
       reward: str | None = None, overrides: Sequence[str] = (), on_event: Callable[[str], None] = print,
       progress: bool | None = None, minutes: float | None = None, dollars: float | None = None) -> TrainResult:
    """Tune the chat model `base` with GRPO on the questions and answers in `data` into the new run `out`, each
    sampled answer scored by `reward` (rl.reward: gsm8k, exact, regex:PATTERN or module:function); with `lora`,
    LoRA adapters; `minutes` or `dollars`: the budget (train.max_minutes, train.max_dollars)."""
    cfg = fine_tune_config("rl", base, data, config, lora, with_budget(list(overrides), minutes, dollars),
                           reward=reward)
    return start_run(cfg, Path(out), RL(cfg.rl), on_event=on_event, progress=progress)


def fine_tune_config(section: str, base: str | Path, data: str, config: str | Path | None, lora: bool,
                     overrides: Sequence[str], **fields) -> RunConfig:
    """The run config: `config`'s (else an empty one) with `section` given base, source and `fields` (None
    leaves a field to the config), LoRA adapters when `lora` and the config shapes none, then `overrides`. A key of
    `config` in the layout before train's sections is said on stdout (rank 0 says it)."""
    raw = read_yaml(resolve_config_path(config)) if config else {}
    raw[section] = {**(raw.get(section) or {}), "base": str(base), "source": str(data),
                    **{key: value for key, value in fields.items() if value is not None}}
    if lora and raw[section].get("lora") is None:
        raw[section]["lora"] = {}
    return load_run_config(raw, list(overrides), on_note=print if os.environ.get("RANK", "0") == "0" else None)
