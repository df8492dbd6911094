"""The loop's checkpointer: when a checkpoint is due, what goes into it, and how a resume puts it back.

The folder format, atomic writes and pruning are burnout/core/checkpoint.py's; this module decides
what training state a checkpoint carries (optimizer, grad scaler, step, loader position, RNG states)
and gathers it from the shards under FSDP.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from torch.utils.serialization import config as serialization_config

from burnout.common import TOKENIZER_FILE
from burnout.config import RunConfig
from burnout.core.checkpoint import Checkpoint, CheckpointMirror, list_checkpoints, load_checkpoint, save_checkpoint
from burnout.core.rng import restore_rng_state, rng_state
from burnout.errors import BurnoutError
from burnout.models import Transformer
from burnout.train.distributed import DistContext, barrier, full_state, gather_to_main, load_optimizer_state
from burnout.train.step import TrainStep


def load_for_resume(run_dir: Path, cfg: RunConfig, tokenizer_path: Path, dist: DistContext) -> Checkpoint:
    """The run's latest checkpoint (on the CPU), after checking it was trained with this model and tokenizer.

    Under FSDP only rank 0 reads state.pt's optimizer state (it sends each rank its shards); the other
    ranks map the file, so of its gigabytes they read only the step and their RNG states."""
    mmap = dist.enabled and not dist.is_main and cfg.train.distributed == "fsdp"
    with serialization_config.patch("load.mmap", mmap):
        ckpt = load_checkpoint(list_checkpoints(run_dir)[-1], "cpu")
    if ckpt.config.model != cfg.model:
        raise BurnoutError(f"--resume: the model in {ckpt.path} differs from this config's model section")
    if (ckpt.path / TOKENIZER_FILE).read_bytes() != tokenizer_path.read_bytes():
        raise BurnoutError(f"--resume: {tokenizer_path} is not the tokenizer {ckpt.path} was trained with; "
                           "point data.prepared_dir at the run's original data")
    return ckpt


class Checkpointer:
    """Saves at every train.ckpt_interval, at milestones and phase ends, and at the last step of a session;
    keeps the last train.keep_last plus milestones and phase ends; mirrors to train.mirror_dir."""

    def __init__(self, run_dir: Path, cfg: RunConfig, model: Transformer, train_step: TrainStep, dist: DistContext,
                 tokenizer_path: Path, tokens_per_step: int, emit: Callable[[str], None]):
        self.run_dir, self.cfg, self.model, self.train_step = run_dir, cfg, model, train_step
        self.dist, self.tokenizer_path, self.tokens_per_step, self.emit = dist, tokenizer_path, tokens_per_step, emit
        tc = cfg.train
        self.keep_steps = set(tc.milestones) | {p.steps for p in tc.phases}
        self.mirror = CheckpointMirror(Path(tc.mirror_dir), emit) if tc.mirror_dir and dist.is_main else None

    def due(self, step: int, final: bool) -> bool:
        return step % self.cfg.train.ckpt_interval == 0 or final or step in self.keep_steps

    def restore(self, ckpt: Checkpoint) -> None:
        """Optimizer, grad scaler and RNG states from `ckpt` (its weights are already in the model)."""
        ts = self.train_step
        load_optimizer_state(ts.model, ts.optimizer, ckpt.state["optimizer"], self.cfg.train.distributed, self.dist)
        if ts.scaler is not None and "scaler" in ckpt.state:
            ts.scaler.load_state_dict(ckpt.state["scaler"])
        # Each rank draws its own dropout masks, so each takes back its own generators; a rank the
        # checkpoint has none for (more ranks than it was saved with) keeps its fresh per-rank seed.
        states = ckpt.state.get("rng_by_rank", [ckpt.state])
        if self.dist.rank < len(states):
            restore_rng_state(states[self.dist.rank], ts.device)

    def save(self, step: int, elapsed: float, skipped: int, train_loss: float, val_loss: float) -> Path:
        """Write step_N (rank 0); under FSDP every rank takes part in gathering the weights."""
        ts, tc = self.train_step, self.cfg.train
        model_state, optim_state = full_state(ts.model, ts.optimizer, tc.distributed, self.dist)
        rngs = gather_to_main(rng_state(ts.device), self.dist)
        path = self.run_dir / "checkpoints" / f"step_{step:07d}"
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
            weights = self.model if model_state is None else module_from_state(self.cfg, model_state)
            info = {"step": step, "tokens": tokens, "train_loss": train_loss, "val_loss": val_loss,
                    "elapsed_s": elapsed}
            path = save_checkpoint(self.run_dir, self.cfg, weights, state, info, self.tokenizer_path, tc.keep_last,
                                   self.keep_steps)
            if self.mirror is not None:
                self.mirror.submit(path, list_checkpoints(self.run_dir))
            self.emit(f"step {step}: saved {path}")
        barrier(self.dist)
        return path

    def close(self) -> None:
        if self.mirror is not None:
            self.mirror.close()


def module_from_state(cfg: RunConfig, state: dict) -> Transformer:
    """A Transformer whose parameters are the tensors of `state` (FSDP's gathered weights), made without
    allocating or initializing weights of its own (the 1B's would cost 4 GB and seconds of random init).
    Its RoPE tables stay on the meta device: they are not persistent, so not saved, and a loaded
    checkpoint computes them from the config."""
    with torch.device("meta"):
        module = Transformer(cfg.model)
    # A tied matrix is gathered once per name, as two equal tensors: one tensor for all its names keeps
    # the tie, and safetensors then stores it once.
    first_name: dict[int, str] = {}
    for name, param in module.named_parameters(remove_duplicate=False):
        state[name] = state[first_name.setdefault(id(param), name)]
    module.load_state_dict(state, assign=True)
    return module
