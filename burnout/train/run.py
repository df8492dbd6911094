"""Starting and resuming runs: find or prepare the data, then hand over to the training loop."""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable
from pathlib import Path

from burnout.common import RESUMES_FILE, RUN_CONFIG_FILE, append_jsonl
from burnout.config import RunConfig, load_run_config
from burnout.data.prepare import prepare_data
from burnout.data.shards import read_meta
from burnout.errors import BurnoutError
from burnout.train.loop import TrainResult, refuse_existing_run, train

# Changing these mid-run would change which tokens the resumed run sees (or, for the optimizer, which
# state the checkpoint must hold).
_RESUME_FIXED = ("model", "data", "tokenizer", "train.seed", "train.batch_size", "train.grad_accum", "train.seq_len",
                 "train.optimizer")


def start_training(cfg: RunConfig, run_dir: Path, data_dir: Path | None = None,
                   on_event: Callable[[str], None] = print, progress: bool | None = None,
                   auto_batch: bool = False) -> TrainResult:
    """Train a new run. Data: `data_dir`, else `data.prepared_dir`, else prepared into RUN/data."""
    refuse_existing_run(run_dir)  # before preparing data into a folder that holds another run
    data_dir = data_dir or (Path(cfg.data.prepared_dir) if cfg.data.prepared_dir else None)
    if data_dir is None:
        data_dir = Path(run_dir) / "data"
        if not (data_dir / "meta.json").exists():
            on_event(f"preparing data into {data_dir}")
            prepare_data(cfg.data, cfg.tokenizer, data_dir, progress=progress is not False)
    read_meta(data_dir)
    # Recorded so that `--resume` and the saved config find the same tokens.
    cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, prepared_dir=str(Path(data_dir).resolve())))
    return train(cfg, run_dir, data_dir, resume=False, progress=progress, on_event=on_event, auto_batch=auto_batch)


def resume_training(run_dir: Path, overrides: list[str] = (), on_event: Callable[[str], None] = print,
                    progress: bool | None = None) -> TrainResult:
    config_path = Path(run_dir) / RUN_CONFIG_FILE
    if not config_path.is_file():
        raise BurnoutError(f"--resume {run_dir}: no config.yaml there; is it a run folder made by `burnout train`?")
    saved = load_run_config(config_path)
    cfg = load_run_config(config_path, overrides)
    # Compare values rather than override keys: `--train.batch_size=8` or `train={...}` change them too.
    for key in _RESUME_FIXED:
        if _field(cfg, key) != _field(saved, key):
            raise BurnoutError(f"--resume: '{key}' cannot change in a running run; start a new run instead")
    changed = {k: v for k, v in _flat(cfg.to_dict()).items() if _flat(saved.to_dict()).get(k) != v}
    if changed and os.environ.get("RANK", "0") == "0":  # the safe overrides (LR, phases, logging), recorded
        append_jsonl(Path(run_dir) / RESUMES_FILE, {"time": time.strftime("%Y-%m-%dT%H:%M:%S"),
                                                    "overrides": list(overrides), "changed": changed})
    return train(cfg, run_dir, Path(cfg.data.prepared_dir), resume=True, progress=progress, on_event=on_event)


def _flat(raw: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in raw.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _field(cfg: RunConfig, dotted: str):
    for part in dotted.split("."):
        cfg = getattr(cfg, part)
    return cfg
