"""Starting and resuming a run of any recipe: a new run's folder is checked and its recipe prepares its config
and data before the Trainer starts; a resume checks that only what may change has changed, and the Trainer
carries on from the newest good checkpoint. burnout/runs.py says which recipe a config runs (`recipe_for`).

One process writes a run folder: rank 0 holds its lock (core/model_files.py: writing_run) from before the data
are prepared until the run stops; a second start or resume of the same folder is refused in one line naming
the first. Other torchrun ranks take no lock: they wait until rank 0 has taken the folder, then (pretraining) for
its data as before (train/recipe.py)."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

from burnout.common import RUN_CONFIG_FILE
from burnout.config import RunConfig, load_run_config
from burnout.core.checkpoint import holds_run
from burnout.core.device import resolve_device
from burnout.core.model_files import is_run_folder, writing_run
from burnout.errors import BurnoutError
from burnout.train.loop import TrainResult, refuse_existing_run, train
from burnout.train.plan import check_memory_floor
from burnout.train.recipe import Recipe

# Changing these mid-run would change which tokens the resumed run sees (or, for the optimizer, which
# state the checkpoint must hold): every section but train (the model, the data, the recipe's own), and these.
_RESUME_FIXED = (*(f.name for f in dataclasses.fields(RunConfig) if f.name != "train"), "train.seed",
                 "train.batch_size", "train.grad_accum", "train.seq_len", "train.optimizer",
                 "train.init_from", "train.init_optimizer")

# The recipe a run config runs (burnout/runs.py: recipe_for).
RecipeFor = Callable[[RunConfig], Recipe]
# How often a torchrun rank other than 0 looks whether rank 0 has taken the run folder.
RANK_0_POLL_S = 0.2


def start_run(cfg: RunConfig, run_dir: Path, recipe: Recipe, data_dir: Path | None = None,
              on_event: Callable[[str], None] = print, progress: bool | None = None,
              auto_batch: bool = False) -> TrainResult:
    """Train a new run in `run_dir`: its recipe prepares the config and data (`data_dir`, when given), then
    the Trainer trains it."""
    run_dir = Path(run_dir)
    if cfg.fine_tune is None and not cfg.train.init_from:
        # A pretraining run's model is its config's: what cannot fit is refused before its data are prepared.
        check_memory_floor(cfg, resolve_device(cfg.train.device), int(os.environ.get("WORLD_SIZE", "1")),
                           micro_batch=1 if auto_batch else None)
    with _writing(run_dir, "--out"):
        refuse_existing_run(run_dir)  # before preparing data into a folder that holds another run
        cfg, data_dir = recipe.prepare(cfg, run_dir, data_dir, on_event, progress)
        return train(cfg, run_dir, data_dir, recipe, resume=False, progress=progress, on_event=on_event,
                     auto_batch=auto_batch)


def resume_run(run_dir: Path, recipe_for: RecipeFor, overrides: list[str] = (),
               on_event: Callable[[str], None] = print, progress: bool | None = None) -> TrainResult:
    """Continue the run in `run_dir` from its newest good checkpoint, with the recipe `recipe_for` gives its
    config and these overrides of the settings that may change."""
    config_path = Path(run_dir) / RUN_CONFIG_FILE
    if not config_path.is_file():
        raise BurnoutError(_not_resumable(Path(run_dir)))
    with _writing(Path(run_dir), "--resume"):
        return _resume(run_dir, config_path, recipe_for, overrides, on_event, progress)


def _resume(run_dir: Path, config_path: Path, recipe_for: RecipeFor, overrides: list[str],
            on_event: Callable[[str], None], progress: bool | None) -> TrainResult:
    saved = load_run_config(config_path)
    cfg = load_run_config(config_path, overrides)
    # Compare values rather than override keys: `--train.batch_size=8` or `train={...}` change them too.
    for key in _RESUME_FIXED:
        if _field(cfg, key) != _field(saved, key):
            raise BurnoutError(f"--resume: '{key}' cannot change in a running run; start a new run instead")
    before = _flat(saved.to_dict())
    changed = {k: v for k, v in _flat(cfg.to_dict()).items() if before.get(k) != v}
    # The safe overrides (LR, phases, logging), recorded in resumes.jsonl once the run has accepted them.
    resumed_with = {"time": time.strftime("%Y-%m-%dT%H:%M:%S"), "overrides": list(overrides),
                    "changed": changed} if changed else None
    return train(cfg, run_dir, Path(cfg.data.prepared_dir), recipe_for(cfg), resume=True, progress=progress,
                 on_event=on_event, resumed_with=resumed_with)


def start_or_resume(cfg: RunConfig, run_dir: Path, recipe_for: RecipeFor, overrides: list[str] = (),
                    data_dir: Path | None = None, on_event: Callable[[str], None] = print,
                    progress: bool | None = None, auto_batch: bool = False) -> TrainResult:
    """`burnout train CONFIG --out RUN --resume-if-exists`: resume RUN as `--resume RUN` would (its own
    config.yaml, these overrides) when training has started there, else start it. One command that is right
    on every boot of a machine that can vanish."""
    if not holds_run(run_dir):
        return start_run(cfg, run_dir, recipe_for(cfg), data_dir, on_event, progress, auto_batch)
    if os.environ.get("RANK", "0") == "0":
        on_event(f"{run_dir} already holds a run: resuming it (its config.yaml and the overrides given; "
                 "CONFIG, --data and --auto-batch apply to a new run only)")
    return resume_run(run_dir, recipe_for, overrides, on_event, progress)


def _not_resumable(run_dir: Path) -> str:
    """Why `--resume run_dir` finds no run config there, and what to give instead."""
    if run_dir.is_file():
        folder = run_dir.parent if (run_dir.parent / RUN_CONFIG_FILE).is_file() else "RUN"
        return f"--resume {run_dir}: that is a file; give the run folder: burnout train --resume {folder}"
    if not run_dir.is_dir():
        return f"--resume {run_dir}: no such folder; give the --out of the `burnout train` that started the run"
    if (run_dir / "data").is_dir() and not holds_run(run_dir):
        return (f"--resume {run_dir}: no training started there yet: it was stopped while preparing its data into "
                f"{run_dir / 'data'}; run the command that started it again (burnout train CONFIG --out {run_dir}), "
                "which goes on with the preparation where it stopped")
    return f"--resume {run_dir}: no config.yaml there; is it a run folder made by `burnout train`?"


def _writing(run_dir: Path, label: str) -> AbstractContextManager:
    """The run folder checked and locked while this process writes it: rank 0's alone under torchrun. The other
    ranks wait until rank 0 has taken the folder, since some write into it too (a fine-tune prepares its data on
    every rank) and rank 0 would find their files there and refuse it; should rank 0 refuse it, torchrun ends
    them."""
    if int(os.environ.get("RANK", "0")) != 0:
        while not is_run_folder(run_dir):
            time.sleep(RANK_0_POLL_S)
        return contextlib.nullcontext()
    return writing_run(run_dir, label)


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
