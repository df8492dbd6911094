"""What one kind of run supplies to the Trainer: its recipe.

The Trainer (loop.py) runs every kind of run alike (the one TrainStep, checkpoints and exact resume,
metrics, validation, the stop conditions) and asks its recipe for the pieces that differ:

    prepare          a new run: the config as it will be saved, and its prepared data folder
    data_meta        the data's vocabulary and the tokens one epoch holds
    loaders          the train and val batches
    build_model      the model as built before any weights load
    init_weights     the weights at step 0 (pretraining: the seeded init, as built)
    objective        what TrainStep calls: objective(x, y) → the loss (the model itself, or a module around it)
    flops_per_token  what a trained token costs, for MFU
    evaluate         the validation metrics, val_loss among them
    after_step       a line for the person running it, when a step has something to tell
    finish           what a session's end leaves beside the checkpoints

`Pretraining` is the recipe of `burnout train CONFIG`; the fine-tuning recipes are burnout/finetune/'s,
and burnout/runs.py picks the recipe a run config asks for.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable
from pathlib import Path

import torch

from burnout.common import first_line, write_atomic
from burnout.config import RunConfig, TrainConfig
from burnout.data.loader import TokenLoader, loader_mode
from burnout.data.prepare import prepare_data, tokens_per_param_warning, val_share_warning
from burnout.data.shards import META_FILE, read_meta
from burnout.errors import BurnoutError
from burnout.eval.loss import evaluate_loss
from burnout.models.memory import param_counts
from burnout.train.step import build_model

Say = Callable[[str], None]


class Recipe:
    """The recipe interface, with what most kinds of run share as defaults: the model as step.build_model
    builds it, its weights as built, itself as the objective, the validation loss."""

    # What val_loss is measured over, said beside it when the run stops ("" : the val split's tokens).
    val_of = ""

    def prepare(self, cfg: RunConfig, run_dir: Path, data_dir: Path | None, say: Say,
                progress: bool | None) -> tuple[RunConfig, Path]:
        """A new run's config as it will be saved in RUN/config.yaml, and its data folder (`data_dir` when given),
        prepared now if need be."""
        raise NotImplementedError

    def data_meta(self, cfg: RunConfig, data_dir: Path, seq_len: int) -> dict:
        """The data folder's meta: `vocab_size`, and `splits.train.tokens` counting what one epoch trains on."""
        raise NotImplementedError

    def loaders(self, cfg: RunConfig, data_dir: Path, seq_len: int) -> dict:
        """{"train": ..., "val": ...}: objects whose get_batch(i) gives batch i of the stream as (x, y) of
        (B, T) token ids, targets -1 where nothing is learned, and (val) iter_eval_batches(n)."""
        raise NotImplementedError

    def build_model(self, cfg: RunConfig, device: torch.device) -> torch.nn.Module:
        return build_model(cfg, device)

    def init_weights(self, model: torch.nn.Module, cfg: RunConfig, resuming: bool, say: Say) -> None:
        """Called once the model is built, before a resumed run's checkpoint loads into it."""

    def objective(self, model: torch.nn.Module, cfg: RunConfig, resumed: bool) -> torch.nn.Module:
        """The module TrainStep trains, whose parameters are the model's trainable ones; built after
        init_weights and before a resumed run's weights load into `model`."""
        return model

    def flops_per_token(self, flops: dict) -> float:
        """From models.info.flops_per_token's figures for the model."""
        return flops["flops_per_token"]

    def evaluate(self, objective: torch.nn.Module, loader, tc: TrainConfig, device: torch.device,
                 precision: str) -> dict:
        """The validation metrics over tc.eval_batches of `loader`: val_loss, and any val_* beside it."""
        return {"val_loss": evaluate_loss(objective, loader, tc.eval_batches, device, precision)}

    def after_step(self, step: int, loss: float) -> str | None:
        return None

    def finish(self, cfg: RunConfig, run_dir: Path, checkpoint: Path) -> list[str]:
        """Rank 0, at the end of every session: anything written beside the checkpoints, one line each."""
        return []


class Pretraining(Recipe):
    """Next-token prediction on token shards (burnout/data/): a freshly initialised model, every token a target."""

    def prepare(self, cfg: RunConfig, run_dir: Path, data_dir: Path | None, say: Say,
                progress: bool | None) -> tuple[RunConfig, Path]:
        """Data: `data_dir`, else data.prepared_dir, else the config's sources prepared into RUN/data (a folder
        already finished there, by an earlier start of the same command, is used as it is). A warning is said
        when the data cannot work for this model: val's share far from val_fraction, or train tokens far too
        few for the model's parameters."""
        data_dir = data_dir or (Path(cfg.data.prepared_dir) if cfg.data.prepared_dir else None)
        rank = int(os.environ.get("RANK", "0"))
        if data_dir is None:
            data_dir = Path(run_dir) / "data"
            if not (data_dir / META_FILE).exists():
                prepare_on_rank_0(cfg, data_dir, say, progress, rank, int(os.environ.get("WORLD_SIZE", "1")))
        meta = read_meta(data_dir)
        if rank == 0:
            params = param_counts(cfg.model).total
            for line in (val_share_warning(meta), tokens_per_param_warning(meta["splits"]["train"]["tokens"], params)):
                if line:
                    say(line)
        # Recorded so that `--resume` and the saved config find the same tokens.
        data = dataclasses.replace(cfg.data, prepared_dir=str(Path(data_dir).resolve()))
        return dataclasses.replace(cfg, data=data), Path(data_dir)

    def data_meta(self, cfg: RunConfig, data_dir: Path, seq_len: int) -> dict:
        return read_meta(data_dir)

    def loaders(self, cfg: RunConfig, data_dir: Path, seq_len: int) -> dict:
        tc, mode = cfg.train, loader_mode(data_dir)
        return {split: TokenLoader(data_dir, split, tc.batch_size, seq_len, tc.seed, mode=mode)
                for split in ("train", "val")}


# Under torchrun, rank 0 writes its error here (in the run folder) when preparing the data fails, so that
# the ranks waiting for the data stop with it.
PREPARE_FAILED_FILE = ".prepare-failed"
WAIT_POLL_S = 1.0


def prepare_on_rank_0(cfg: RunConfig, data_dir: Path, say: Say, progress: bool | None,
                      rank: int, world_size: int) -> None:
    """Prepare the data into RUN/data. Under torchrun rank 0 prepares (two ranks writing the same shards
    collide) and the others wait for its meta.json, written last. They poll the folder rather than wait in
    a collective: no process group exists yet, and a large prepare outlasts any collective's timeout.
    Several nodes must therefore share the run folder (as --resume needs them to)."""
    failed = data_dir.parent / PREPARE_FAILED_FILE
    if rank == 0:
        say(f"preparing data into {data_dir}")
        failed.unlink(missing_ok=True)
        try:
            # Its warnings are Pretraining.prepare's to say, against the model.
            prepare_data(cfg.data, cfg.tokenizer, data_dir, progress=progress is not False, warn=lambda line: None)
        except Exception as exc:
            if world_size > 1:
                failed.parent.mkdir(parents=True, exist_ok=True)
                write_atomic(failed, first_line(exc))
            raise
        return
    # A failure file already there is an earlier launch's; rank 0's is a new file (written atomically). Should
    # rank 0 fail before this line, torchrun still stops this rank when rank 0 exits.
    earlier = _identity(failed)
    while not (data_dir / META_FILE).exists():
        if _identity(failed) not in (None, earlier):
            raise BurnoutError(f"rank {rank}: rank 0 failed to prepare the data into {data_dir}: "
                               f"{failed.read_text()}")
        time.sleep(WAIT_POLL_S)


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        stat = path.stat()
    except FileNotFoundError:
        return None
    return stat.st_ino, stat.st_mtime_ns
