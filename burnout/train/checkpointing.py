"""The loop's checkpointer: when a checkpoint is due, what goes into it, which are kept, whether they fit on
the disk, and how a resume puts the newest good one back.

The folder format, atomic writes, sha256 manifests and pruning are burnout/core/checkpoint.py's; this
module decides what training state a checkpoint carries (optimizer, grad scaler, step, loader position,
RNG states) and gathers it from the shards under FSDP.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch.utils.serialization import config as serialization_config

from burnout.base.files import TOKENIZER_FILE
from burnout.base.text import format_bytes
from burnout.base.values import is_finite_number
from burnout.config import RunConfig
from burnout.core.checkpoint import (
    CHECKPOINT_DIR,
    Checkpoint,
    CheckpointMirror,
    checkpoint_bytes,
    checkpoint_info,
    checkpoint_problem,
    folder_bytes,
    list_checkpoints,
    load_checkpoint,
    model_for,
    save_checkpoint,
)
from burnout.core.rng import restore_rng_state, rng_state
from burnout.errors import BurnoutError
from burnout.models import Transformer
from burnout.train.distributed import DistContext, barrier, from_main, full_state, gather_to_main, load_optimizer_state
from burnout.train.step import TrainStep

# The wall clock of train.ckpt_minutes; a module-level name so that tests can run it fast.
clock = time.monotonic


def resume_point(run_dir: Path, dist: DistContext, emit: Callable[[str], None]) -> Path:
    """The checkpoint a resume starts from: the newest whose files match their recorded sha256. Rank 0 alone
    hashes the files and tells the other ranks its choice (or its error), so all of them act alike."""
    chosen, error = None, None
    if dist.is_main:
        try:
            chosen = newest_good_checkpoint(run_dir, emit)
        except BurnoutError as exc:
            error = str(exc)
    chosen, error = from_main((chosen, error), dist)
    if error is not None:
        raise BurnoutError(error)
    return chosen


def load_for_resume(checkpoint: Path, cfg: RunConfig, tokenizer_path: Path, dist: DistContext) -> Checkpoint:
    """`checkpoint` (on the CPU, its files already checked by resume_point), after checking it was trained
    with this model and tokenizer.

    Under FSDP only rank 0 reads state.pt's optimizer state (it sends each rank its shards); the other
    ranks map the file, so of its gigabytes they read only the step and their RNG states."""
    mmap = dist.enabled and not dist.is_main and cfg.train.perf.distributed == "fsdp"
    with serialization_config.patch("load.mmap", mmap):
        ckpt = load_checkpoint(checkpoint, "cpu", verify=False)
    if "optimizer" not in ckpt.state:  # `burnout grow`'s output or an import: weights to start from, no training
        run, what = ckpt.path.parent.parent, "a grown model" if "grown_from" in ckpt.info else "imported weights"
        raise BurnoutError(f"--resume: {run} is a start point ({what}), not a run that trained: its checkpoint holds "
                           f"no optimizer state to continue; train it in a new run: burnout train --init-from {run} "
                           "--out NEW_RUN")
    if ckpt.config.model != cfg.model:
        raise BurnoutError(f"--resume: the model in {ckpt.path} differs from this config's model section")
    if (ckpt.path / TOKENIZER_FILE).read_bytes() != tokenizer_path.read_bytes():
        raise BurnoutError(f"--resume: {tokenizer_path} is not the tokenizer {ckpt.path} was trained with; "
                           "point data.prepared_dir at the run's original data")
    return ckpt


def newest_good_checkpoint(run_dir: Path, emit: Callable[[str], None], label: str = "--resume") -> Path:
    """The newest checkpoint whose files match the sha256 recorded when it was saved; each newer one is
    skipped with one line naming it and its first bad file (`label`: what looks, --resume or train.init_from)."""
    found = list_checkpoints(run_dir)
    first_problem = None
    for path in reversed(found):
        problem = checkpoint_problem(path)
        if problem is None:
            return path
        first_problem = first_problem or f"{path.name}: {problem}"
        emit(f"{label}: skipping checkpoint {path.name}: {problem}; trying the one before it")
    raise BurnoutError(f"{label}: no checkpoint in {Path(run_dir) / CHECKPOINT_DIR} matches its recorded sha256 "
                       f"(the newest, {first_problem}); copy a good one back from train.mirror_dir, "
                       "or move the run folder away and train again")


def read_info(checkpoint: Path) -> dict | None:
    """A checkpoint's info.json, or None where it cannot be read."""
    try:
        return checkpoint_info(checkpoint)
    except BurnoutError:
        return None


def best_checkpoint(infos: list[dict | None]) -> dict | None:
    """Of checkpoints' info.json, the one of lowest val loss among those whose val loss was measured on their
    own weights (val_step is their step), the earliest on a tie; None when there is none."""
    measured = [i for i in infos
                if i and i.get("val_step") == i.get("step") and is_finite_number(i.get("val_loss"))]
    return min(measured, key=lambda i: i["val_loss"]) if measured else None


class Checkpointer:
    """Saves at every train.ckpt_interval, every train.ckpt_minutes, at milestones and phase ends, and at the
    last step of a session; keeps the last train.keep_last plus milestones, phase ends and (train.keep_best)
    the best val loss; mirrors them and the logs to train.mirror_dir. Refuses, before the first step, a run
    whose kept checkpoints would not fit on the disk."""

    def __init__(self, run_dir: Path, cfg: RunConfig, model: Transformer, train_step: TrainStep, dist: DistContext,
                 tokenizer_path: Path, tokens_per_step: int, emit: Callable[[str], None], step: int, end_of_run: int):
        self.run_dir, self.cfg, self.model, self.train_step = run_dir, cfg, model, train_step
        self.dist, self.tokenizer_path, self.tokens_per_step, self.emit = dist, tokenizer_path, tokens_per_step, emit
        ckpt = cfg.train.checkpoint
        self.keep_steps = set(ckpt.milestones) | {p.steps for p in cfg.train.phases}
        self.check_space(step, end_of_run)
        mirrored = ckpt.mirror_dir and dist.is_main
        self.mirror = CheckpointMirror(run_dir, Path(ckpt.mirror_dir), emit) if mirrored else None
        self.last_save = clock()

    def check_space(self, step: int, end_of_run: int) -> None:
        """Compare the bytes the kept checkpoints will need with the free space of the run folder and the
        mirror (rank 0 measures; every rank refuses alike)."""
        error = self._space_shortfall(step, end_of_run) if self.dist.is_main else None
        error = from_main(error, self.dist)
        if error is not None:
            raise BurnoutError(error)

    def _space_shortfall(self, step: int, end_of_run: int) -> str | None:
        ckpt = self.cfg.train.checkpoint
        size = checkpoint_bytes(self.cfg, self.tokenizer_path, self.dist.world_size)
        ahead = len({s for s in self.keep_steps if step < s <= end_of_run})
        # Past the last keep_last, one more exists while the newest is written and before the oldest is pruned.
        count = ckpt.keep_last + 1 + ahead + int(ckpt.keep_best)
        folders = [(self.run_dir, "--out")] + ([(Path(ckpt.mirror_dir), "train.mirror_dir")] if ckpt.mirror_dir else [])
        for folder, setting in folders:
            # The rolling checkpoints already there are replaced, not added to.
            rolling = [p for p in list_checkpoints(folder) if int(p.name.removeprefix("step_")) not in self.keep_steps]
            need = max(0, count * size - min(sum(folder_bytes(p) for p in rolling), ckpt.keep_last * size))
            free = shutil.disk_usage(_nearest_existing(folder)).free
            if need > free:
                return (f"not enough disk space in {folder} ({setting}): the checkpoints this run keeps need "
                        f"{format_bytes(need)} ({count} × {format_bytes(size)}: train.keep_last={ckpt.keep_last}, one "
                        f"being written, {ahead} milestones and phase ends ahead"
                        f"{', the best (train.keep_best)' if ckpt.keep_best else ''}) and {format_bytes(free)} are "
                        f"free; free some space, lower train.keep_last, or choose another {setting}")
        return None

    def time_due(self) -> bool:
        """Whether train.ckpt_minutes have passed since this session's start or its last checkpoint, on this
        rank's clock (the train step's all-reduce agrees it across ranks)."""
        minutes = self.cfg.train.checkpoint.ckpt_minutes
        return bool(minutes) and clock() - self.last_save >= minutes * 60

    def due(self, step: int, final: bool, time_due: bool) -> bool:
        return step % self.cfg.train.checkpoint.ckpt_interval == 0 or final or step in self.keep_steps or time_due

    def restore(self, ckpt: Checkpoint) -> None:
        """Optimizer, grad scaler and RNG states from `ckpt` (its weights are already in the model)."""
        ts = self.train_step
        distributed = self.cfg.train.perf.distributed
        load_optimizer_state(ts.model, ts.optimizer, ckpt.state["optimizer"], distributed, self.dist)
        if ts.scaler is not None and "scaler" in ckpt.state:
            ts.scaler.load_state_dict(ckpt.state["scaler"])
        # Each rank draws its own dropout masks, so each takes back its own generators; a rank the
        # checkpoint has none for (more ranks than it was saved with) keeps its fresh per-rank seed.
        states = ckpt.state.get("rng_by_rank", [ckpt.state])
        if self.dist.rank < len(states):
            restore_rng_state(states[self.dist.rank], ts.device)

    def save(self, step: int, elapsed: float, skipped: int, train_loss: float, val_loss: float,
             val_step: int | None) -> Path:
        """Write step_N (rank 0); under FSDP every rank takes part in gathering the weights. `val_step` is the
        step whose weights `val_loss` was measured on."""
        ts, tc = self.train_step, self.cfg.train
        model_state, optim_state = full_state(ts.model, ts.optimizer, tc.perf.distributed, self.dist)
        rngs = gather_to_main(rng_state(ts.device), self.dist)
        path = self.run_dir / CHECKPOINT_DIR / f"step_{step:07d}"
        if self.dist.is_main:
            tokens = step * self.tokens_per_step
            state = {
                "optimizer": optim_state,
                "step": step,
                "tokens": tokens,
                # Batches are a pure function of the micro-batch index: this is the loader's position.
                "micro_batches_seen": step * tc.grad_accum * self.dist.world_size,
                "elapsed_s": elapsed,
                "skipped_steps": skipped,
                **rngs[0],
            }
            if self.dist.enabled:
                state["rng_by_rank"] = rngs
            if ts.scaler is not None:
                state["scaler"] = ts.scaler.state_dict()
            if model_state is None:
                weights = self.model
            else:  # FSDP's gathered names are the objective's: one wrapping the model prefixes them ("policy.")
                prefix = next((f"{name}." for name, module in ts.model.named_modules() if module is self.model
                               and name), "")
                weights = module_from_state(self.cfg, {k.removeprefix(prefix): v for k, v in model_state.items()})
            info = {"step": step, "tokens": tokens, "train_loss": train_loss, "val_loss": val_loss,
                    "val_step": val_step, "elapsed_s": elapsed}
            best = self._best_step(info) if tc.checkpoint.keep_best else None
            path = save_checkpoint(self.run_dir, self.cfg, weights, state, info, self.tokenizer_path,
                                   tc.checkpoint.keep_last, self.keep_steps | ({best} - {None}))
            if self.mirror is not None:
                self.mirror.submit(path, list_checkpoints(self.run_dir))
            self.emit(f"step {step}: saved {path}" + (f" (the best val loss so far, {val_loss:.4f}: kept by "
                                                      "train.keep_best)" if best == step else ""))
        barrier(self.dist)
        self.last_save = clock()
        return path

    def _best_step(self, info: dict) -> int | None:
        """The step of the best among the kept checkpoints and the one being saved; with train.keep_best the
        best is never pruned, so this is the best of the run."""
        best = best_checkpoint([read_info(p) for p in list_checkpoints(self.run_dir)] + [info])
        return best["step"] if best else None

    def close(self) -> None:
        if self.mirror is not None:
            self.mirror.close()


def _nearest_existing(path: Path) -> Path:
    """`path`, or its nearest ancestor that exists (a run or mirror folder not made yet)."""
    path = Path(path).absolute()
    while not path.exists():
        path = path.parent
    return path


def module_from_state(cfg: RunConfig, state: dict) -> Transformer:
    """A Transformer whose parameters are the tensors of `state` (FSDP's gathered weights), made without
    allocating or initializing weights of its own (the 1B's would cost 4 GB and seconds of random init).
    Its RoPE tables stay on the meta device: they are not persistent, so not saved, and a loaded
    checkpoint computes them from the config."""
    with torch.device("meta"):
        module = model_for(cfg)
    # A tied matrix is gathered once per name, as two equal tensors: one tensor for all its names keeps
    # the tie, and safetensors then stores it once.
    first_name: dict[int, str] = {}
    for name, param in module.named_parameters(remove_duplicate=False):
        state[name] = state[first_name.setdefault(id(param), name)]
    module.load_state_dict(state, assign=True)
    return module
