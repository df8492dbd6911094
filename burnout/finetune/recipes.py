"""The fine-tuning recipes: supervised fine-tuning (SFT) on conversations and DPO on preference pairs. Each is a
train.recipe.Recipe: the Trainer runs it exactly as it runs pretraining (one TrainStep, checkpoints, exact
resume, metrics) and knows nothing of fine-tuning.

    FineTune   what both share: the base checkpoint's model and tokenizer with the chat tokens (vocabulary grown,
               new rows the mean), the examples tokenized into RUN/data at the run's seq_len, their batches (the
               train ones packed with sft.packing / dpo.packing), the base's weights at step 0 (LoRA adapters keep
               their own init), RUN/adapter/ at each session's end; a preparation that fails, is refused
               (check_prepared) or interrupted takes its half-made RUN/data away
    SFT        loss on the assistant tokens; a LoRA run also trains the embedding rows of the tokens it added
    DPO        the policy wrapped in dpo.DPOObjective (its reference: the starting weights, which a resumed run
               loads again first), the reference's forward in the FLOPs, held-out pairs' metrics, a warning when
               the loss stays at ln 2

What a fine-tune makes is a chat model: its config says tokenizer.chat_template (core/chat_template.py).
"""

from __future__ import annotations

import dataclasses
import math
import shutil
from collections.abc import Callable
from pathlib import Path

import torch
from tokenizers import Tokenizer

from burnout.config import CHATML, DPOConfig, FineTuneSource, RunConfig, TrainConfig
from burnout.core.chat_template import CHAT_TOKENS, ensure_chat_tokens, is_chat_model
from burnout.core.checkpoint import Checkpoint
from burnout.core.device import autocast
from burnout.core.model_files import copy_weights, load_model
from burnout.errors import BurnoutError
from burnout.finetune.adapters import lora_token_rows, save_run_adapter, trainable_line
from burnout.finetune.conversations import read_conversations, read_pairs
from burnout.finetune.dpo import DPOObjective, StalledDPO, evaluate_pairs
from burnout.finetune.tokenized import (
    PAIRS_FORMAT,
    SFT_FORMAT,
    PackedPairBatches,
    PackedSFTBatches,
    PairBatches,
    SFTBatches,
    format_report,
    prepare_pairs,
    prepare_sft,
    read_sft_meta,
)
from burnout.models import Transformer
from burnout.models.lora import LoRAConfig, lora_layers, merge_lora, train_token_rows
from burnout.models.resize import grow_vocab
from burnout.train.recipe import Recipe, Say
from burnout.train.step import build_model


class FineTune(Recipe):
    """What SFT and DPO share; `section` is the run config's section that says how it fine-tunes. A subclass
    names what its data holds (`what`), how it reads them (`read`), the prepared folder's format and its
    batches."""

    what: str
    read: Callable
    data_format: str
    batches: type
    packed_batches: type | None = None  # the train batches of the section's `packing`, where it has one
    _packed_key: tuple | None = None  # what _packed_batches were packed for
    _packed_batches = None

    def section(self, cfg: RunConfig) -> FineTuneSource:
        raise NotImplementedError

    def run_config(self, cfg: RunConfig, base: Transformer, base_ckpt: Checkpoint, added: list[str],
                   data_dir: Path) -> RunConfig:
        """The run's config as saved: the base's model (grown) and tokenizer, the data in `data_dir`."""
        raise NotImplementedError

    def prepare_examples(self, cfg: RunConfig, examples, tokenizer: Tokenizer, data_dir: Path, **options) -> dict:
        raise NotImplementedError

    def prepare(self, cfg: RunConfig, run_dir: Path, data_dir: Path | None, say: Say,
                progress: bool | None) -> tuple[RunConfig, Path]:
        if data_dir is not None:
            raise BurnoutError("--data: a fine-tune prepares its source into RUN/data itself; drop --data")
        base, tokenizer, added, base_ckpt = load_base(self.section(cfg).base)
        data_dir = Path(run_dir) / "data"
        cfg = self.run_config(cfg, base, base_ckpt, added, data_dir)
        if added:
            say(f"added {', '.join(added)} to the tokenizer: vocabulary {tokenizer.get_vocab_size() - len(added):,}"
                f" → {tokenizer.get_vocab_size():,} tokens, model {cfg.model.vocab_size:,} rows (recorded as "
                "sft.added_tokens in config.yaml)")
        del base, base_ckpt
        try:
            self._prepare_data(cfg, tokenizer, data_dir, say)
            self.check_prepared(cfg, data_dir, say)
        except BaseException:
            # Bad examples, a refusal, Ctrl-C: the half-made data/ goes (a fine-tune prepares its data from the start
            # every time), and with it a run folder this command made (writing_run).
            shutil.rmtree(data_dir, ignore_errors=True)
            raise
        return cfg, data_dir

    def _prepare_data(self, cfg: RunConfig, tokenizer: Tokenizer, data_dir: Path, say: Say) -> dict:
        """The section's source tokenized into `data_dir` at the run's seq_len; the report printed."""
        section = self.section(cfg)
        say(f"preparing {self.what} from {section.source} into {data_dir}")
        source = {"source": section.source, "layout": section.layout, "split": section.split,
                  "subset": section.subset, "data_files": section.data_files, "max_examples": section.max_examples}
        options = {"seq_len": cfg.train.seq_len or cfg.model.context_length, "val_fraction": section.val_fraction,
                   "seed": cfg.data.seed, "overflow": section.overflow, "source": source}
        reader = self.read(section.source, section.layout, split=section.split, subset=section.subset,
                      data_files=section.data_files)
        meta = self.prepare_examples(cfg, _Limited(reader, section.max_examples), tokenizer, data_dir, **options)
        for line in format_report(meta).splitlines():
            say(line)
        return meta

    def check_prepared(self, cfg: RunConfig, data_dir: Path, say: Say) -> None:
        """Before anything trains, with the data prepared: a refusal (BurnoutError) of a run that cannot work takes
        the prepared data away with it."""

    def data_meta(self, cfg: RunConfig, data_dir: Path, seq_len: int) -> dict:
        """The folder's meta with `splits.train.tokens` counting rows (pairs) of seq_len, so that
        train.max_epochs (epochs × tokens / tokens per step) counts passes over its conversations (pairs)."""
        meta = read_sft_meta(data_dir, self.data_format)
        if meta["seq_len"] < seq_len:
            raise BurnoutError(f"{data_dir} was prepared for seq_len {meta['seq_len']}, shorter than this run's "
                               f"{seq_len}; prepare it again or lower train.seq_len")
        train = meta["splits"]["train"]
        examples = train.get("examples", train.get("pairs", 0))
        train["tokens"] = self.train_rows(cfg, data_dir, seq_len, examples) * seq_len
        return meta

    def loaders(self, cfg: RunConfig, data_dir: Path, seq_len: int) -> dict:
        """With the section's packing, the train batches packed; the held-out ones stay padded (their metrics, a
        mean per assistant token or per pair, are the same either way, and padded rows need no mask)."""
        pad = self.section(cfg).pad_to_longest
        loaders = {split: self.batches(data_dir, split, cfg.train.batch_size, seq_len, cfg.train.seed,
                                       pad_to_longest=pad) for split in ("train", "val")}
        if self.packs(cfg):
            loaders["train"] = self._packed(cfg, data_dir, seq_len)
        return loaders

    def train_rows(self, cfg: RunConfig, data_dir: Path, seq_len: int, examples: int) -> int:
        """Rows (of what a padded row holds) one pass over the train examples takes."""
        return len(self._packed(cfg, data_dir, seq_len).rows) if self.packs(cfg) else examples

    def packs(self, cfg: RunConfig) -> bool:
        return self.packed_batches is not None and self.section(cfg).packing

    def _packed(self, cfg: RunConfig, data_dir: Path, seq_len: int):
        """The packed train batches, packed once per run (data_meta counts their rows, loaders hands them out)."""
        key = (Path(data_dir), seq_len, cfg.train.batch_size, cfg.train.seed)
        if self._packed_key != key:
            self._packed_key = key
            self._packed_batches = self.packed_batches(data_dir, "train", cfg.train.batch_size, seq_len,
                                                       cfg.train.seed)
        return self._packed_batches

    def init_weights(self, model: torch.nn.Module, cfg: RunConfig, resuming: bool, say: Say) -> None:
        if not resuming:
            init_from_base(model, cfg)
        say(trainable_line(model))

    def finish(self, cfg: RunConfig, run_dir: Path, checkpoint: Path) -> list[str]:
        if cfg.adapters is None:
            return []
        return [f"adapters of {checkpoint.name}: {save_run_adapter(run_dir, checkpoint)}"]


class SFT(FineTune):
    what = "conversations"
    read = staticmethod(read_conversations)
    data_format, batches, packed_batches = SFT_FORMAT, SFTBatches, PackedSFTBatches
    val_of = "assistant tokens"

    def section(self, cfg: RunConfig) -> FineTuneSource:
        return cfg.sft

    def run_config(self, cfg: RunConfig, base: Transformer, base_ckpt: Checkpoint, added: list[str],
                   data_dir: Path) -> RunConfig:
        """The base checkpoint and the tokens added recorded in the sft section."""
        sft = dataclasses.replace(cfg.sft, base=str(base_ckpt.path.resolve()), added_tokens=list(added))
        return with_base(cfg, base.cfg, base_ckpt.config, data_dir, sft=sft)

    def prepare_examples(self, cfg: RunConfig, examples, tokenizer: Tokenizer, data_dir: Path, **options) -> dict:
        return prepare_sft(examples, tokenizer, data_dir, train_on=cfg.sft.train_on, **options)

    def build_model(self, cfg: RunConfig, device: torch.device) -> torch.nn.Module:
        """A LoRA run's model also trains the embedding rows of the tokens it added (adapters.lora_token_rows)."""
        model = build_model(cfg, device)
        if rows := lora_token_rows(cfg):
            if cfg.train.perf.distributed == "fsdp":
                # FSDP2 swaps each Parameter for a sharded one, leaving behind the hook that freezes the other rows.
                raise BurnoutError("train.distributed: a LoRA fine-tune that added tokens (sft.added_tokens) trains "
                                   "their embedding rows under ddp only; use train.distributed=ddp")
            train_token_rows(model, rows)
        return model


class DPO(FineTune):
    what = "preference pairs"
    read = staticmethod(read_pairs)
    data_format, batches, packed_batches = PAIRS_FORMAT, PairBatches, PackedPairBatches
    val_of = "held-out pairs"

    def __init__(self, section: DPOConfig) -> None:
        self.stall = StalledDPO(section.beta, after_steps=section.stall_steps)

    def section(self, cfg: RunConfig) -> FineTuneSource:
        return cfg.dpo

    def run_config(self, cfg: RunConfig, base: Transformer, base_ckpt: Checkpoint, added: list[str],
                   data_dir: Path) -> RunConfig:
        return from_chat_model(cfg, base, base_ckpt, data_dir, "dpo")

    def prepare_examples(self, cfg: RunConfig, examples, tokenizer: Tokenizer, data_dir: Path, **options) -> dict:
        return prepare_pairs(examples, tokenizer, data_dir, **options)

    def init_weights(self, model: torch.nn.Module, cfg: RunConfig, resuming: bool, say: Say) -> None:
        """The base's weights even when resuming: they are the reference, which the objective copies before
        the run's own weights load."""
        super().init_weights(model, cfg, resuming=False, say=say)

    def objective(self, model: torch.nn.Module, cfg: RunConfig, resumed: bool) -> torch.nn.Module:
        return DPOObjective(model, cfg.dpo.beta, cfg.train.grad_accum, resumed=resumed)

    def flops_per_token(self, flops: dict) -> float:
        # The reference's forward runs over every position the policy trains on.
        return flops["flops_per_token"] + flops["forward_flops_per_token"]

    def evaluate(self, objective: torch.nn.Module, loader, tc: TrainConfig, device: torch.device,
                 precision: str) -> dict:
        """The held-out pairs' loss as val_loss, their rewards, margin and accuracy as val_*."""
        with autocast(device, precision):
            metrics = evaluate_pairs(objective, loader.iter_eval_batches(tc.eval.eval_batches), device)
        return {"val_loss": metrics.pop("loss", math.nan),
                **{f"val_{key}": value for key, value in metrics.items() if key != "pairs"}}

    def after_step(self, step: int, loss: float) -> str | None:
        return self.stall.update(step, loss)


def from_chat_model(cfg: RunConfig, base: Transformer, base_ckpt: Checkpoint, data_dir: Path, name: str) -> RunConfig:
    """The config of a run that starts from a chat model (DPO, RL): its section `name`'s base the checkpoint, which
    must be a chat model."""
    if not is_chat_model(base_ckpt.config):
        raise BurnoutError(f"{name}.base {base_ckpt.path}: not a chat model (its config has no "
                           "tokenizer.chat_template); fine-tune it with `burnout sft` first")
    section = dataclasses.replace(getattr(cfg, name), base=str(base_ckpt.path.resolve()))
    return with_base(cfg, base.cfg, base_ckpt.config, data_dir, **{name: section})


def with_base(cfg: RunConfig, model, base_cfg: RunConfig, data_dir: Path, **sections) -> RunConfig:
    """`cfg` with the base's model and tokenizer (a chat model's: tokenizer.chat_template), the data in
    `data_dir`, and `sections` (the fine-tune's own, filled in); validated, LoRA targets included."""
    data = dataclasses.replace(cfg.data, prepared_dir=str(data_dir.resolve()))
    tokenizer = dataclasses.replace(base_cfg.tokenizer, chat_template=CHATML)
    run_cfg = dataclasses.replace(cfg, model=dataclasses.replace(model), tokenizer=tokenizer, data=data, **sections)
    run_cfg.validate()
    if run_cfg.adapters is not None:
        key, adapters = run_cfg.adapters
        LoRAConfig.from_dict(dataclasses.asdict(adapters), key).layers(run_cfg.model.family)
    return run_cfg


def load_base(base: str | Path) -> tuple[Transformer, Tokenizer, list[str], Checkpoint]:
    """(the base model with room for the chat tokens, its tokenizer with them, the tokens added, the base
    checkpoint). A base that is itself a LoRA fine-tune is merged first. Deterministic: a run
    restarted from step 0 gets the same weights again."""
    model, tokenizer, ckpt = load_model(base)
    if lora_layers(model):
        model = merge_lora(model)
    try:
        tokenizer, added = ensure_chat_tokens(tokenizer)
    except BurnoutError as exc:
        raise BurnoutError(f"sft.base {ckpt.path}: {exc}") from None
    old = model.cfg.vocab_size
    new_ids = [tokenizer.token_to_id(t) for t in CHAT_TOKENS if t in added]
    if added:
        # An added token may take an id inside the model's padded vocabulary: that row was never trained.
        grow_vocab(model, max(old, tokenizer.get_vocab_size()), reinit=[i for i in new_ids if i < old])
    model.train()
    return model, tokenizer, added, ckpt


def init_from_base(model: torch.nn.Module, cfg: RunConfig) -> None:
    """Step 0 of a fine-tune: its base's weights, grown as load_base grows them, into `model` (built from the
    run's config, which has the grown shape; LoRA adapters keep their own initialisation)."""
    base = cfg.fine_tune.base
    weights, _, _, _ = load_base(base)
    copy_weights(model, weights, f"base {base}")


class _Limited:
    """The first `limit` conversations of a reader, keeping its `skipped` counts for the report."""

    def __init__(self, reader, limit: int | None) -> None:
        self.reader, self.limit = reader, limit

    @property
    def skipped(self):
        return self.reader.skipped

    def __iter__(self):
        for number, conversation in enumerate(self.reader):
            if self.limit is not None and number >= self.limit:
                return
            yield conversation
