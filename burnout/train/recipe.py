"""What one kind of run supplies to the Trainer: its recipe (`Recipe`), and pretraining's (`Pretraining`).

The Trainer (loop.py) runs every kind of run alike (the one TrainStep, checkpoints and exact resume, metrics,
validation, the stop conditions) and asks its recipe only for the pieces that differ, so that a new kind of run
is one class and every guarantee holds for it. The fine-tuning recipes are burnout/finetune/'s, and
burnout/runs.py picks the recipe a run config asks for.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable
from pathlib import Path

import torch

from burnout.base.files import RUN_CONFIG_FILE, TOKENIZER_FILE, sha256_file, write_atomic
from burnout.base.text import first_line
from burnout.config import ModelConfig, RunConfig, TrainConfig, load_run_config
from burnout.core.checkpoint import CHECKPOINT_DIR, checkpoint_problem, list_checkpoints, run_dir_of
from burnout.core.model_files import copy_weights, load_model
from burnout.data.loader import TokenLoader, loader_mode
from burnout.data.prepare import prepare_data, tokens_per_param_warning
from burnout.data.shards import META_FILE, read_meta
from burnout.data.split import split_warnings
from burnout.data.tokenizer import load_tokenizer, tokenizer_sha256
from burnout.errors import BurnoutError
from burnout.eval.loss import evaluate_loss
from burnout.generate.prompts import PROMPT_WORDS, data_prompts
from burnout.models.memory import param_counts
from burnout.train.checkpointing import newest_good_checkpoint
from burnout.train.distributed import DistContext, load_optimizer_state
from burnout.train.step import TrainStep, build_model

Say = Callable[[str], None]


class Recipe:
    """The recipe interface, with what most kinds of run share as defaults: the model as step.build_model
    builds it, its weights as built, itself as the objective, the validation loss.

        prepare          a new run: the config as it will be saved, and its prepared data folder
        data_meta        the data's vocabulary and the tokens one epoch holds
        loaders          the train and val batches
        build_model      the model as built before any weights load
        init_weights     the weights at step 0 (pretraining: the seeded init, as built, or train.init_from's)
        init_optimizer   the optimizer state at step 0 (fresh, or with train.init_optimizer=carry the parent's)
        objective        what TrainStep calls: objective(x, y) → the loss (the model itself, or a module around it)
        flops_per_token  what a trained token costs, for MFU
        evaluate         the validation metrics, val_loss among them
        after_step       a line for the person running it, when a step has something to tell
        finish           what a session's end leaves beside the checkpoints
        sample_prompts   the prompts sampled at each evaluation when train.sample_prompt gives none (default none)
    """

    # What val_loss is measured over, said beside it when the run stops ("" : the val split's tokens).
    val_of = ""
    # What a new run started from, recorded in its launch (provenance.record_launch); None: nothing but its config.
    lineage: dict | None = None

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

    def init_optimizer(self, train_step: TrainStep, cfg: RunConfig, dist: DistContext, say: Say) -> None:
        """Called once the optimizer is built, on a run starting at step 0 only (a resume restores its own)."""

    def objective(self, model: torch.nn.Module, cfg: RunConfig, resumed: bool) -> torch.nn.Module:
        """The module TrainStep trains, whose parameters are the model's trainable ones; built after
        init_weights and before a resumed run's weights load into `model`."""
        return model

    def flops_per_token(self, flops: dict) -> float:
        """From models.info.flops_per_token's figures for the model."""
        return flops["flops_per_token"]

    def evaluate(self, objective: torch.nn.Module, loader, tc: TrainConfig, device: torch.device,
                 precision: str) -> dict:
        """The validation metrics over tc.eval.eval_batches of `loader`: val_loss, and any val_* beside it."""
        return {"val_loss": evaluate_loss(objective, loader, tc.eval.eval_batches, device, precision)}

    def after_step(self, step: int, loss: float) -> str | None:
        return None

    def finish(self, cfg: RunConfig, run_dir: Path, checkpoint: Path) -> list[str]:
        """Rank 0, at the end of every session: anything written beside the checkpoints, one line each."""
        return []

    def sample_prompts(self, cfg: RunConfig, data_dir: Path, say: Say) -> list[str]:
        """Prompts from the run's own data for its samples when the user gave none (train.sample_prompt): none here."""
        return []


class Pretraining(Recipe):
    """Next-token prediction on token shards (burnout/data/): a freshly initialised model, or train.init_from's
    weights; every token a target: the recipe of `burnout train CONFIG`.

    Continued pretraining (train.init_from, `--init-from RUN[/checkpoints/step_N]`) is pretraining whose step 0 is
    another run's checkpoint: the parent's model section and tokenizer (a config asking for another shape is
    refused: `burnout grow` changes shapes), data sources not yet prepared tokenized with the parent's tokenizer,
    and the new run's own schedule, seed and step count from 0. Its optimizer state is fresh unless
    train.init_optimizer=carry. The lineage (parent, its step and data, the loaded weights' sha256) goes into
    launches.jsonl."""

    def __init__(self) -> None:
        self.parent_state: dict = {}  # the parent checkpoint's training state (its optimizer's), for init_optimizer

    def prepare(self, cfg: RunConfig, run_dir: Path, data_dir: Path | None, say: Say,
                progress: bool | None) -> tuple[RunConfig, Path]:
        """Data: `data_dir`, else data.prepared_dir, else the config's sources prepared into RUN/data (a folder
        already finished there, by an earlier start of the same command, is used as it is). A warning is said
        when the data cannot work for this model: a val split that is not a fair sample of the text, or train
        tokens far too few for the model's parameters. With train.init_from: the parent's model and tokenizer
        (with_parent)."""
        rank, parent = int(os.environ.get("RANK", "0")), None
        if cfg.train.init_from:
            parent = parent_checkpoint(cfg.train.init_from, say)
            cfg = with_parent(cfg, parent, say if rank == 0 else lambda line: None)
        data_dir = data_dir or (Path(cfg.data.prepared_dir) if cfg.data.prepared_dir else None)
        if data_dir is None:
            data_dir = Path(run_dir) / "data"
            if not (data_dir / META_FILE).exists():
                if parent is not None and rank == 0:
                    say(f"the sources are tokenized with the parent's tokenizer ({parent / TOKENIZER_FILE})")
                prepare_on_rank_0(cfg, data_dir, say, progress, rank, int(os.environ.get("WORLD_SIZE", "1")),
                                  tokenizer_path=parent / TOKENIZER_FILE if parent is not None else None)
        meta = read_meta(data_dir)
        if parent is not None:
            check_parent_tokenizer(parent, Path(data_dir))
        if rank == 0:
            params = param_counts(cfg.model).total
            for line in (*split_warnings(meta), tokens_per_param_warning(meta["splits"]["train"]["tokens"], params)):
                if line:
                    say(line)
        # Recorded so that `--resume` and the saved config find the same tokens.
        data = dataclasses.replace(cfg.data, prepared_dir=str(Path(data_dir).resolve()))
        return dataclasses.replace(cfg, data=data), Path(data_dir)

    def init_weights(self, model: torch.nn.Module, cfg: RunConfig, resuming: bool, say: Say) -> None:
        """A continued run's step 0: its parent checkpoint's weights, its lineage noted for launches.jsonl."""
        if not cfg.train.init_from or resuming:
            return
        parent, _, ckpt = load_model(cfg.train.init_from)
        copy_weights(model, parent, f"train.init_from {ckpt.path}")
        # Kept for init_optimizer only where carried: the moments are twice the weights' size.
        self.parent_state = ckpt.state if cfg.train.init_optimizer == "carry" else {}
        step = ckpt.info.get("step", 0)
        self.lineage = {"init_from": str(ckpt.path), "parent_run": str(run_dir_of(ckpt.path)), "parent_step": step,
                        "parent_tokens": ckpt.info.get("tokens", 0),
                        "parent_data": ckpt.config.data.prepared_dir, "data": cfg.data.prepared_dir,
                        "weights_sha256": sha256_file(ckpt.path / "model.safetensors")}
        say(f"weights: {ckpt.path}'s (step {step:,}); this run counts its own steps from 0")

    def init_optimizer(self, train_step: TrainStep, cfg: RunConfig, dist: DistContext, say: Say) -> None:
        """train.init_optimizer=carry: the parent checkpoint's optimizer moments, under the new run's own
        hyperparameters (its LR schedule, betas, weight decay); fresh (the default) leaves the new optimizer."""
        if not cfg.train.init_from or cfg.train.init_optimizer != "carry":
            return
        where = f"train.init_optimizer=carry: {cfg.train.init_from}"
        if "optimizer" not in self.parent_state:
            raise BurnoutError(f"{where} holds no optimizer state (a start point written by `burnout grow` holds "
                               "none); use train.init_optimizer=fresh")
        optimizer = train_step.optimizer
        own = [{key: value for key, value in group.items() if key != "params"} for group in optimizer.param_groups]
        try:
            load_optimizer_state(train_step.model, optimizer, self.parent_state["optimizer"],
                                 cfg.train.perf.distributed, dist)
        except (ValueError, KeyError, RuntimeError) as exc:
            raise BurnoutError(f"{where}: its optimizer state does not fit this run's optimizer ({first_line(exc)});"
                               " use train.init_optimizer=fresh") from None
        for group, settings in zip(optimizer.param_groups, own):
            group.update(settings)
        self.parent_state = {}
        say("optimizer: the parent's moments carried (train.init_optimizer=carry)")

    def data_meta(self, cfg: RunConfig, data_dir: Path, seq_len: int) -> dict:
        return read_meta(data_dir)

    def loaders(self, cfg: RunConfig, data_dir: Path, seq_len: int) -> dict:
        tc, mode = cfg.train, loader_mode(data_dir)
        return {split: TokenLoader(data_dir, split, tc.batch_size, seq_len, tc.seed, mode=mode)
                for split in ("train", "val")}

    def sample_prompts(self, cfg: RunConfig, data_dir: Path, say: Say) -> list[str]:
        """The opening words of lines of the val split, at places the run's seed picks (generate/prompts.py); none
        found is said, with what to do."""
        prompts = data_prompts(data_dir, cfg.train.seed, load_tokenizer(data_dir / TOKENIZER_FILE),
                               cfg.model.context_length)
        if not prompts:
            say(f"no sample during training: none of the val split's lines looked at goes on past "
                f"{PROMPT_WORDS} words to draw a prompt from; set train.sample_prompt to sample one")
        return prompts


def parent_checkpoint(init_from: str, say: Say) -> Path:
    """The checkpoint train.init_from names: a checkpoints/step_N folder as it is, a run folder's newest good one."""
    path = Path(init_from)
    if not path.exists():
        raise BurnoutError(f"train.init_from {path}: no such folder; give a run folder (the --out of `burnout train` "
                           "or `burnout grow`) or one of its checkpoints/step_N folders")
    if (path / "model.safetensors").is_file():
        if (problem := checkpoint_problem(path)) is not None:
            raise BurnoutError(f"train.init_from {path}: the checkpoint is unreadable: {problem}; give another "
                               "checkpoint of the run")
        return path
    if not list_checkpoints(path):
        raise BurnoutError(f"train.init_from {path}: not a checkpoint (no model.safetensors) nor a run folder holding "
                           f"{CHECKPOINT_DIR}/step_N; give the --out of `burnout train` or `burnout grow`")
    return newest_good_checkpoint(path, say, label="train.init_from")


def with_parent(cfg: RunConfig, parent: Path, say: Say) -> RunConfig:
    """`cfg` continuing from the checkpoint `parent`: its model section and tokenizer section the parent's, and
    train.init_from the checkpoint itself (so that the saved config names what step 0 was). A config that asks
    for another model than the default (no model section) and the parent's is refused: growth is `burnout grow`'s."""
    parent_cfg = load_run_config(parent / RUN_CONFIG_FILE)
    if parent_cfg.adapters is not None:
        raise BurnoutError(f"train.init_from {parent}: a LoRA fine-tune ({parent_cfg.adapters[0]}); merge its "
                           "adapters first (burnout lora merge) and continue from the merged run")
    # What the config asks for: the model fields it sets away from the defaults.
    default = ModelConfig().resolved()
    asked = [f.name for f in dataclasses.fields(ModelConfig) if getattr(cfg.model, f.name) != getattr(default, f.name)]
    if conflicts := [key for key in asked if getattr(cfg.model, key) != getattr(parent_cfg.model, key)]:
        key = conflicts[0]
        how = ("train that model from scratch (no --init-from)" if key in ("family", "vocab_size") else
               f"grow it first: burnout grow {run_dir_of(parent)} --out NEW model.{key}=..., then --init-from NEW")
        raise BurnoutError(f"train.init_from {parent}: this config asks for model.{key}={getattr(cfg.model, key)!r}, "
                           f"the parent's is {getattr(parent_cfg.model, key)!r}; a continued run keeps its parent's "
                           f"model (drop the model section or override), or {how}")
    train = dataclasses.replace(cfg.train, init_from=str(parent.resolve()))
    continued = dataclasses.replace(cfg, model=parent_cfg.model, tokenizer=parent_cfg.tokenizer, train=train)
    continued.validate()
    model = parent_cfg.model
    say(f"model: the parent's ({model.family}, {model.n_layer} layers, d_model {model.d_model}, vocabulary "
        f"{model.vocab_size:,}; from {parent / RUN_CONFIG_FILE})")
    return continued


def check_parent_tokenizer(parent: Path, data_dir: Path) -> None:
    """Refuse data tokenized otherwise than the parent checkpoint's model was trained: its ids mean other text."""
    data_tok, parent_tok = load_tokenizer(data_dir / TOKENIZER_FILE), load_tokenizer(parent / TOKENIZER_FILE)
    if tokenizer_sha256(data_tok) != tokenizer_sha256(parent_tok):
        raise BurnoutError(f"train.init_from {parent}: the data in {data_dir} were tokenized with another tokenizer "
                           f"({data_tok.get_vocab_size():,} tokens; the parent's has {parent_tok.get_vocab_size():,}"
                           f" or other merges); prepare them with the parent's: burnout data prepare SOURCES --out "
                           f"NEW_DATA --tokenizer {parent / TOKENIZER_FILE}, or give no --data (the config's sources "
                           "are then prepared with it into RUN/data)")


# Under torchrun, rank 0 writes its error here (in the run folder) when preparing the data fails, so that
# the ranks waiting for the data stop with it.
PREPARE_FAILED_FILE = ".prepare-failed"
WAIT_POLL_S = 1.0


def prepare_on_rank_0(cfg: RunConfig, data_dir: Path, say: Say, progress: bool | None,
                      rank: int, world_size: int, tokenizer_path: Path | None = None) -> None:
    """Prepare the data into RUN/data. Under torchrun rank 0 prepares (two ranks writing the same shards
    collide) and the others wait for its meta.json, written last. They poll the folder rather than wait in
    a collective: no process group exists yet, and a large prepare outlasts any collective's timeout.
    Several nodes must therefore share the run folder (as --resume needs them to). `tokenizer_path`: a tokenizer
    to encode with instead of the one the config would train."""
    failed = data_dir.parent / PREPARE_FAILED_FILE
    if rank == 0:
        say(f"preparing data into {data_dir}")
        failed.unlink(missing_ok=True)
        try:
            # Its warnings are Pretraining.prepare's to say, against the model.
            prepare_data(cfg.data, cfg.tokenizer, data_dir, tokenizer_path=tokenizer_path,
                         progress=progress is not False, warn=lambda line: None)
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
