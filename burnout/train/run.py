"""Starting and resuming a run of any recipe, the last step before the Trainer: a new run's folder is checked and
its recipe prepares its config and data, then `Trainer(...).fit()`; a resume checks that only what may change has
changed, and the Trainer carries on from the newest good checkpoint. burnout/runs.py says which recipe a config
runs (`recipe_for`) and decides between the two (`burnout train`, `--resume-if-exists`).

One process writes a run folder: rank 0 holds its lock (core/model_files.py: writing_run) from before the data
are prepared until the run stops; a second start or resume of the same folder is refused in one line naming
the first. Other torchrun ranks take no lock: they wait until rank 0 has taken the folder, then (pretraining) for
its data as before (train/recipe.py)."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shlex
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

from burnout.base.files import RUN_CONFIG_FILE
from burnout.base.folders import killed_writer
from burnout.config import RunConfig, load_saved_config, setting_name, settings
from burnout.core.checkpoint import holds_run
from burnout.core.device import resolve_device
from burnout.core.model_files import is_run_folder, writing_run
from burnout.data.shards import data_fingerprint
from burnout.errors import BurnoutError
from burnout.train.distributed import process_group
from burnout.train.loop import Trainer, TrainResult, clock, refuse_existing_run
from burnout.train.plan import check_memory_floor
from burnout.train.provenance import trained_data
from burnout.train.recipe import Recipe
from burnout.train.trackers import check_tracker

# Changing these mid-run would change which tokens the resumed run sees (or, for the optimizer, which
# state the checkpoint must hold): every section but train (the model, the data, the recipe's own), and these.
_RESUME_FIXED = (*(f.name for f in dataclasses.fields(RunConfig) if f.name != "train"), "train.seed",
                 "train.batch_size", "train.grad_accum", "train.seq_len", "train.optim.optimizer",
                 "train.init_from", "train.init_optimizer")

# The recipe a run config runs (burnout/runs.py: recipe_for).
RecipeFor = Callable[[RunConfig], Recipe]
# How often a torchrun rank other than 0 looks whether rank 0 has taken the run folder.
RANK_0_POLL_S = 0.2


def start_run(cfg: RunConfig, run_dir: Path, recipe: Recipe, data_dir: Path | None = None,
              on_event: Callable[[str], None] = print, progress: bool | None = None,
              auto_batch: bool = False) -> TrainResult:
    """Train a new run in `run_dir`: its recipe prepares the config and data (`data_dir`, when given), then
    the Trainer trains it. The run's time counts from here: a time budget covers the data's preparation too."""
    started = clock()
    run_dir = Path(run_dir)
    check_tracker(cfg.train.log.tracker, run_dir)  # its library is there, or nothing is written
    if cfg.fine_tune is None and not cfg.train.init_from:
        # A pretraining run's model is its config's: what cannot fit is refused before its data are prepared.
        check_memory_floor(cfg, resolve_device(cfg.train.device), int(os.environ.get("WORLD_SIZE", "1")),
                           micro_batch=1 if auto_batch else None)
    with _writing(run_dir, "--out"):
        refuse_existing_run(run_dir)  # before preparing data into a folder that holds another run
        cfg, data_dir = recipe.prepare(cfg, run_dir, data_dir, on_event, progress)
        with process_group(resolve_device(cfg.train.device)) as (dist, device):
            return Trainer(cfg, run_dir, Path(data_dir), recipe, dist, device, progress=progress, on_event=on_event,
                           auto_batch=auto_batch, started=started).fit()


def resume_run(run_dir: Path, recipe_for: RecipeFor, overrides: list[str] = (),
               on_event: Callable[[str], None] = print, progress: bool | None = None) -> TrainResult:
    """Continue the run in `run_dir` from its newest good checkpoint, with the recipe `recipe_for` gives its
    config and these overrides of the settings that may change. The session's time counts from here."""
    started = clock()
    run_dir = Path(run_dir)
    config_path = run_dir / RUN_CONFIG_FILE
    if not config_path.is_file():
        raise BurnoutError(_not_resumable(run_dir))
    with _writing(run_dir, "--resume"):
        cfg, data_dir, resumed_with = _resumed_config(run_dir, config_path, overrides, on_event)
        check_tracker(cfg.train.log.tracker, run_dir)
        recipe = recipe_for(cfg)
        with process_group(resolve_device(cfg.train.device)) as (dist, device):
            return Trainer(cfg, run_dir, data_dir, recipe, dist, device, resume=True, progress=progress,
                           on_event=on_event, resumed_with=resumed_with, started=started).fit()


def _resumed_config(run_dir: Path, config_path: Path, overrides: list[str],
                    on_event: Callable[[str], None]) -> tuple[RunConfig, Path, dict | None]:
    """The config a resume runs (the saved one with `overrides`, refused where a fixed setting changed), its data
    folder (checked: check_resume_data), and the changes resumes.jsonl records (None without any)."""
    saved = load_saved_config(config_path)
    cfg = load_saved_config(config_path, overrides)
    if not cfg.data.prepared_dir:  # every run that trained names its data: this folder holds weights imported
        raise BurnoutError(f"--resume {run_dir}: its config.yaml names no data (data.prepared_dir), so nothing trained "
                           f"there; train it in a new run: burnout train --init-from {run_dir} --data DIR "
                           "--out NEW_RUN")
    # The data may move (data.prepared_dir), not change: what the folder holds is checked against the run's record.
    data_dir = Path(cfg.data.prepared_dir).absolute()
    cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, prepared_dir=str(data_dir)))
    moved = dataclasses.replace(saved, data=dataclasses.replace(saved.data, prepared_dir=str(data_dir)))
    # Compare values rather than override keys: `--train.batch_size=8` or `train={...}` change them too.
    for key in _RESUME_FIXED:
        if _field(cfg, key) != _field(moved, key):
            raise BurnoutError(f"--resume: '{setting_name(key)}' cannot change in a running run; start a new run "
                               "instead")
    check_resume_data(Path(run_dir), data_dir, on_event if os.environ.get("RANK", "0") == "0" else lambda line: None)
    before = settings(saved)
    changed = {k: v for k, v in settings(cfg).items() if before.get(k) != v}
    # The safe overrides (LR, phases, logging), recorded in resumes.jsonl once the run has accepted them.
    resumed_with = {"time": time.strftime("%Y-%m-%dT%H:%M:%S"), "overrides": list(overrides),
                    "changed": changed} if changed else None
    return cfg, data_dir, resumed_with


def check_resume_data(run_dir: Path, data_dir: Path, say: Callable[[str], None]) -> None:
    """Refuse, in one line, to resume on a data folder that is gone or holds other data than the run trained on (its
    fingerprint against the one its last launch recorded: provenance.trained_data); else say which folder it uses.
    A run folder's own data are named relative to it (config.saved_config_text), so a copy of it resumes on its own
    copy, and one whose copy was deleted is refused here rather than resumed on its original's."""
    recorded, found = trained_data(run_dir), data_fingerprint(data_dir)
    fix = f"give the folder that holds them now: burnout train --resume {run_dir} data.prepared_dir=DIR"
    if found is None:
        state = "is gone" if not data_dir.exists() else "holds no finished data (no meta.json or tokenizer.json)"
        raise BurnoutError(f"--resume {run_dir}: its data folder {data_dir} (data.prepared_dir) {state}, and the run "
                           f"goes on only on the data it trained on; put them back there, or {fix}")
    if recorded is not None and found != recorded["sha256"]:
        raise BurnoutError(f"--resume {run_dir}: {data_dir} holds other data than the run trained on (its meta.json "
                           f"or tokenizer.json differ from those its last launch recorded, in {recorded['dir']}); "
                           f"{fix}")
    say(f"data: {data_dir}" + (" (the data the run trained on, checked)" if recorded is not None else ""))


def _not_resumable(run_dir: Path) -> str:
    """Why `--resume run_dir` finds no run config there, and what to give instead."""
    if run_dir.is_file():
        folder = run_dir.parent if (run_dir.parent / RUN_CONFIG_FILE).is_file() else "RUN"
        return f"--resume {run_dir}: that is a file; give the run folder: burnout train --resume {folder}"
    if not run_dir.is_dir():
        return (f"--resume {run_dir}: no such folder; give the --out of the command that started the run (burnout "
                "train, sft, dpo or rl)")
    if (run_dir / "data").is_dir() and not holds_run(run_dir):
        # The command a killed process left in its lock file: a fine-tune's (sft, dpo, rl) prepares its data again.
        args = killed_writer(run_dir) or []
        fine_tune = args[:1] in (["sft"], ["dpo"], ["rl"])
        command = shlex.join(["burnout", *args]) if fine_tune or args[:1] == ["train"] else \
            f"burnout train CONFIG --out {run_dir}"
        return (f"--resume {run_dir}: no training started there yet: it was stopped while preparing its data into "
                f"{run_dir / 'data'}; run the command that started it again ({command}), which "
                f"{'prepares them again' if fine_tune else 'goes on with the preparation where it stopped'}")
    return (f"--resume {run_dir}: no config.yaml there; is it a run folder made by `burnout train` (or sft, dpo, "
            "rl)?")


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


def _field(cfg: RunConfig, dotted: str):
    for part in dotted.split("."):
        cfg = getattr(cfg, part)
    return cfg
