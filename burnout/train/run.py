"""Starting and resuming runs: find or prepare the data, then hand over to the training loop."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

from burnout.config import RunConfig, load_run_config
from burnout.data.prepare import prepare_data, read_meta
from burnout.errors import BurnoutError
from burnout.train.loop import TrainResult, train

# Changing these mid-run would change which tokens the resumed run sees.
_RESUME_FIXED = ("model.", "data.", "tokenizer.", "train.seed", "train.batch_size", "train.grad_accum", "train.seq_len")


def start_training(cfg: RunConfig, run_dir: Path, data_dir: Path | None = None,
                   on_event: Callable[[str], None] = print, progress: bool | None = None) -> TrainResult:
    """Train a new run. Data: `data_dir`, else `data.prepared_dir`, else prepared into RUN/data."""
    data_dir = data_dir or (Path(cfg.data.prepared_dir) if cfg.data.prepared_dir else None)
    if data_dir is None:
        data_dir = Path(run_dir) / "data"
        if not (data_dir / "meta.json").exists():
            on_event(f"preparing data into {data_dir}")
            prepare_data(cfg.data, cfg.tokenizer, data_dir, progress=progress is not False)
    read_meta(data_dir)
    # Recorded so that `--resume` and the saved config find the same tokens.
    cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, prepared_dir=str(Path(data_dir).resolve())))
    return train(cfg, run_dir, data_dir, resume=False, progress=progress, on_event=on_event)


def resume_training(run_dir: Path, overrides: list[str] = (), on_event: Callable[[str], None] = print,
                    progress: bool | None = None) -> TrainResult:
    config_path = Path(run_dir) / "config.yaml"
    if not config_path.is_file():
        raise BurnoutError(f"--resume {run_dir}: no config.yaml there; is it a run folder made by `burnout train`?")
    for item in overrides:
        if item.startswith(_RESUME_FIXED):
            raise BurnoutError(f"--resume: '{item.split('=')[0]}' cannot change in a running run; start a new run instead")
    cfg = load_run_config(config_path, overrides)
    return train(cfg, run_dir, Path(cfg.data.prepared_dir), resume=True, progress=progress, on_event=on_event)
