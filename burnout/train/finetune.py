"""Supervised fine-tuning (full or LoRA) on the training engine: `burnout sft`, or `burnout train` with a config
whose `sft` section is set. No loop of its own: this module readies the run and the Trainer (loop.py) does the
rest, dispatching on the data folder's meta.json.

    start_sft        the base checkpoint's model and tokenizer → chat tokens added (vocab grown, recorded in
                     sft.added_tokens) → conversations prepared into RUN/data (burnout.data.sft) → Trainer
    init_from_base   the Trainer's step 0 of an SFT run: the base weights (grown) into the built model, whose
                     LoRA adapters (sft.lora, put in by step.build_model) keep their seeded initialisation
    sft_loaders      SFTBatches instead of TokenLoader for an SFT data folder (PairBatches for a pairs folder)
    start_dpo        `burnout dpo`: a chat model's pairs prepared into RUN/data (prepare_pairs), the base's sft
                     section kept (a chat model), dpo.base the starting policy and reference → Trainer, which
                     wraps the policy in dpo.DPOObjective
    lora_token_rows  the ids of the tokens a LoRA SFT run added (sft.added_tokens): their embedding rows train
                     beside the adapters (step.build_model), since a row frozen at the mean embedding is a token
                     the model can never emit (models/lora.py, "Token rows")
    save_run_adapter RUN/adapter/ (adapter.safetensors + adapter_config.json) from a LoRA run's last checkpoint
    merge_run        `burnout lora merge`: the adapters folded into the base, written as a plain checkpoint

Checkpoints of a LoRA run hold the base weights (with the trained token rows in the embedding) and the
adapters (the module tree step.build_model builds, so a resume loads them as they are) and the optimizer
state of the adapters, and of the embedding matrix (and untied head) when token rows train; RUN/adapter/ is
rewritten at the end of every session (a few MB at most), beside the checkpoints rather than in each one.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path

import torch
from tokenizers import Tokenizer

from burnout.common import TOKENIZER_FILE
from burnout.config import RunConfig
from burnout.core.checkpoint import Checkpoint
from burnout.errors import BurnoutError
from burnout.models import Transformer

ADAPTER_DIR = "adapter"


def data_format(data_dir: Path) -> str | None:
    """A prepared folder's format from its meta.json (data.sft's SFT_FORMAT or PAIRS_FORMAT), else None."""
    from burnout.data.sft import META_FILE

    try:
        return json.loads((Path(data_dir) / META_FILE).read_text(encoding="utf-8")).get("format")
    except (OSError, ValueError, AttributeError):
        return None


def is_sft_data(data_dir: Path) -> bool:
    """Whether `data_dir` is a prepare_sft or prepare_pairs folder (its meta.json says so)."""
    from burnout.data.sft import PAIRS_FORMAT, SFT_FORMAT

    return data_format(data_dir) in (SFT_FORMAT, PAIRS_FORMAT)


def sft_loaders(data_dir: Path, cfg: RunConfig, seq_len: int) -> dict:
    """The train and val SFTBatches of an SFT data folder (PairBatches of a pairs folder), shaped as the run
    trains."""
    from burnout.data.sft import PAIRS_FORMAT, PairBatches, SFTBatches

    kind = PairBatches if data_format(data_dir) == PAIRS_FORMAT else SFTBatches
    pad = cfg.fine_tune.pad_to_longest if cfg.fine_tune is not None else False
    return {split: kind(data_dir, split, cfg.train.batch_size, seq_len, cfg.train.seed, pad_to_longest=pad)
            for split in ("train", "val")}


def sft_meta(data_dir: Path, seq_len: int) -> dict:
    """An SFT (or pairs) folder's meta with `splits.train.tokens` counting rows (pairs) of seq_len, so that
    train.max_epochs (epochs × tokens / tokens per step) counts passes over its conversations (pairs)."""
    from burnout.data.sft import read_sft_meta

    meta = read_sft_meta(data_dir, data_format(data_dir))
    if meta["seq_len"] < seq_len:
        raise BurnoutError(f"{data_dir} was prepared for seq_len {meta['seq_len']}, shorter than this run's "
                           f"{seq_len}; prepare it again or lower train.seq_len")
    train = meta["splits"]["train"]
    train["tokens"] = train.get("examples", train.get("pairs", 0)) * seq_len
    return meta


def load_base(base: str | Path) -> tuple[Transformer, Tokenizer, list[str], Checkpoint]:
    """(the base model with room for the chat tokens, its tokenizer with them, the tokens added, the base
    checkpoint). A base that is itself a LoRA fine-tune is merged first. Deterministic: a run
    restarted from step 0 gets the same weights again."""
    from burnout.core.model_files import load_model
    from burnout.data.chat import CHAT_TOKENS, ensure_chat_tokens
    from burnout.models.lora import lora_layers, merge_lora
    from burnout.models.resize import grow_vocab

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
    """Step 0 of an SFT (or DPO) run: the base weights, grown as start_sft grew them, into `model` (built by
    step.build_model from the grown config, LoRA adapters included, which keep their own initialisation)."""
    base, _, _, _ = load_base(cfg.fine_tune.base)
    inner = getattr(model, "_orig_mod", model)
    missing, unexpected = inner.load_state_dict(base.state_dict(), strict=False)
    missing = [k for k in missing if not k.endswith((".lora_A", ".lora_B"))]
    if missing or unexpected:
        raise BurnoutError(f"base {cfg.fine_tune.base}: its weights do not fit this run's model (missing "
                           f"{missing[:3]}, unexpected {unexpected[:3]}); start a new run from it")


def trainable_line(model: torch.nn.Module) -> str:
    """Trainable parameters and the optimizer state they need, against full fine-tuning of the same model."""
    from burnout.common import format_bytes
    from burnout.models.lora import parameter_counts, token_rows

    counts = parameter_counts(model)
    rows = token_rows(model)
    trained = f", the embedding rows of {len(rows)} added tokens among them" if rows else ""
    # AdamW keeps two fp32 tensors (exp_avg, exp_avg_sq) per parameter it updates: for the whole matrix
    # whose token rows train, frozen rows included.
    state = " (the whole embedding matrix's included: AdamW keeps state for every row)" if rows else ""
    return (f"trainable parameters: {counts.trainable:,} of {counts.total:,} ({counts.share:.2%}){trained}; "
            f"optimizer state {format_bytes(8 * counts.optimized)}{state} vs {format_bytes(8 * counts.total)} for "
            f"full fine-tuning ({counts.optimized_share:.2%})")


def lora_token_rows(cfg: RunConfig, tokenizer_path: str | Path | None = None) -> list[int]:
    """The token ids whose embedding rows a LoRA fine-tune trains beside its adapters: those of the tokens this
    very run added to its base (sft.added_tokens), looked up in its tokenizer (`tokenizer_path`, by default
    the one in data.prepared_dir, where start_sft put it). [] for a full fine-tune (every row trains) and for
    DPO: a DPO config keeps its base's sft section, added_tokens included, but that base already has the
    tokens and the SFT that added them trained their rows (beside its LoRA adapters, since merged, or in full)."""
    from burnout.data.tokenizer import load_tokenizer

    if cfg.dpo is not None or cfg.sft is None or cfg.sft.lora is None or not cfg.sft.added_tokens:
        return []
    if tokenizer_path is None:
        if not cfg.data.prepared_dir:
            raise BurnoutError("sft.added_tokens: the run's tokenizer (in data.prepared_dir) gives their ids, and "
                               "data.prepared_dir is not set; point it at the run's data folder")
        tokenizer_path = Path(cfg.data.prepared_dir) / TOKENIZER_FILE
    tokenizer = load_tokenizer(tokenizer_path)
    ids = [tokenizer.token_to_id(token) for token in cfg.sft.added_tokens]
    if None in ids:
        missing = cfg.sft.added_tokens[ids.index(None)]
        raise BurnoutError(f"sft.added_tokens: {tokenizer_path} has no {missing}; it is not this run's tokenizer")
    return ids


def sft_config(cfg: RunConfig, base: Transformer, base_cfg: RunConfig, added: list[str], base_path: Path,
               data_dir: Path) -> RunConfig:
    """The run's config: the base's model (vocab grown) and tokenizer sections, the data in `data_dir`, and
    the base checkpoint and added tokens recorded in the sft section."""
    sft = dataclasses.replace(cfg.sft, base=str(base_path.resolve()), added_tokens=list(added))
    data = dataclasses.replace(cfg.data, prepared_dir=str(data_dir.resolve()))
    run_cfg = dataclasses.replace(cfg, model=dataclasses.replace(base.cfg), tokenizer=base_cfg.tokenizer,
                                  data=data, sft=sft)
    run_cfg.validate()
    if sft.lora is not None:
        from burnout.models.lora import LoRAConfig

        LoRAConfig.from_dict(dataclasses.asdict(sft.lora), "sft.lora").layers(run_cfg.model.family)
    return run_cfg


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


def prepare_run_data(cfg: RunConfig, tokenizer: Tokenizer, data_dir: Path, say: Callable[[str], None]) -> dict:
    """The conversations of sft.source (or the pairs of dpo.source, for a DPO run), tokenized into `data_dir` at
    the run's seq_len; the report printed."""
    from burnout.data.chat import read_conversations, read_pairs
    from burnout.data.sft import format_report, prepare_pairs, prepare_sft

    section, what = (cfg.dpo, "preference pairs") if cfg.dpo is not None else (cfg.sft, "conversations")
    read = read_pairs if cfg.dpo is not None else read_conversations
    reader = read(section.source, section.layout, split=section.split, subset=section.subset,
                  data_files=section.data_files)
    say(f"preparing {what} from {section.source} into {data_dir}")
    source = {"source": section.source, "layout": section.layout, "split": section.split, "subset": section.subset,
              "data_files": section.data_files, "max_examples": section.max_examples}
    options = {"seq_len": cfg.train.seq_len or cfg.model.context_length, "val_fraction": section.val_fraction,
               "seed": cfg.data.seed, "overflow": section.overflow, "source": source}
    examples = _Limited(reader, section.max_examples)
    if cfg.dpo is not None:
        meta = prepare_pairs(examples, tokenizer, data_dir, **options)
    else:
        meta = prepare_sft(examples, tokenizer, data_dir, train_on=section.train_on, **options)
    for line in format_report(meta).splitlines():
        say(line)
    return meta


def start_sft(cfg: RunConfig, run_dir: Path, on_event: Callable[[str], None] = print, progress: bool | None = None,
              auto_batch: bool = False):
    """A new fine-tune of cfg.sft.base in `run_dir` (see the module docstring); the TrainResult."""
    from burnout.train.loop import refuse_existing_run, train

    if cfg.sft is None:
        raise BurnoutError("start_sft: the config has no sft section")
    run_dir = Path(run_dir)
    refuse_existing_run(run_dir)
    base, tokenizer, added, base_ckpt = load_base(cfg.sft.base)
    data_dir = run_dir / "data"
    cfg = sft_config(cfg, base, base_ckpt.config, added, base_ckpt.path, data_dir)
    if added:
        on_event(f"added {', '.join(added)} to the tokenizer: vocabulary {tokenizer.get_vocab_size() - len(added):,}"
                 f" → {tokenizer.get_vocab_size():,} tokens, model {cfg.model.vocab_size:,} rows (recorded as "
                 "sft.added_tokens in config.yaml)")
    del base, base_ckpt
    prepare_run_data(cfg, tokenizer, data_dir, on_event)
    return train(cfg, run_dir, data_dir, resume=False, progress=progress, on_event=on_event, auto_batch=auto_batch)


def save_run_adapter(run_dir: Path, checkpoint: Path) -> Path:
    """RUN/adapter/ from the LoRA checkpoint `checkpoint`, with the token rows the run trained."""
    from burnout.core.checkpoint import load_checkpoint
    from burnout.models.lora import save_adapter, train_token_rows

    ckpt = load_checkpoint(checkpoint, verify=False)
    rows = lora_token_rows(ckpt.config, ckpt.path / TOKENIZER_FILE)
    if rows:  # the checkpoint's embedding holds them; marking them puts them in the adapter
        train_token_rows(ckpt.model, rows)
    return save_adapter(ckpt.model, Path(run_dir) / ADAPTER_DIR)


def merge_run(source: str | Path, out_dir: str | Path) -> Path:
    """`burnout lora merge`: the checkpoint (or run's latest) with its adapters folded into the base weights,
    written as OUT/checkpoints/step_N, a plain checkpoint of a chat model (sft set, sft.lora none)."""
    from burnout.core.checkpoint import list_checkpoints, load_checkpoint, save_checkpoint
    from burnout.models.lora import lora_layers, merge_lora

    out_dir = Path(out_dir)
    if list_checkpoints(out_dir) or (out_dir / "metrics.jsonl").exists():
        raise BurnoutError(f"--out {out_dir} already holds a run; choose a new folder")
    ckpt = load_checkpoint(source)
    if not lora_layers(ckpt.model):
        raise BurnoutError(f"{ckpt.path} has no LoRA adapters (its config has no sft.lora or dpo.lora); "
                           "nothing to merge")
    model = merge_lora(ckpt.model)
    sft = dataclasses.replace(ckpt.config.sft, lora=None)
    dpo = dataclasses.replace(ckpt.config.dpo, lora=None) if ckpt.config.dpo is not None else None
    cfg = dataclasses.replace(ckpt.config, sft=sft, dpo=dpo)
    step = int(ckpt.info.get("step", 0))
    info = {**ckpt.info, "merged_from": str(ckpt.path.resolve())}
    state = {"step": step, "tokens": int(ckpt.info.get("tokens", 0))}
    return save_checkpoint(out_dir, cfg, model, state, info, ckpt.path / TOKENIZER_FILE, keep_last=1)


# ----------------------------------------------------------------------------------------------
# DPO


def dpo_config(cfg: RunConfig, base_cfg: RunConfig, base_path: Path, data_dir: Path) -> RunConfig:
    """The DPO run's config: the base's model, tokenizer and sft sections (a chat model; its sft.lora dropped,
    load_base having merged it), the pairs in `data_dir`, dpo.base the base checkpoint."""
    if base_cfg.sft is None:
        raise BurnoutError(f"dpo.base {base_path}: not a chat model (its config has no sft section); "
                           "fine-tune it with `burnout sft` first")
    dpo = dataclasses.replace(cfg.dpo, base=str(base_path.resolve()))
    data = dataclasses.replace(cfg.data, prepared_dir=str(data_dir.resolve()))
    run_cfg = dataclasses.replace(cfg, model=dataclasses.replace(base_cfg.model), tokenizer=base_cfg.tokenizer,
                                  data=data, sft=dataclasses.replace(base_cfg.sft, lora=None), dpo=dpo)
    run_cfg.validate()
    if dpo.lora is not None:
        from burnout.models.lora import LoRAConfig

        LoRAConfig.from_dict(dataclasses.asdict(dpo.lora), "dpo.lora").layers(run_cfg.model.family)
    return run_cfg


def start_dpo(cfg: RunConfig, run_dir: Path, on_event: Callable[[str], None] = print, progress: bool | None = None,
              auto_batch: bool = False):
    """A new DPO run from cfg.dpo.base in `run_dir`: pairs prepared into RUN/data, then the Trainer."""
    from burnout.train.loop import refuse_existing_run, train

    run_dir = Path(run_dir)
    refuse_existing_run(run_dir)
    base, tokenizer, _, base_ckpt = load_base(cfg.dpo.base)
    data_dir = run_dir / "data"
    cfg = dpo_config(cfg, base_ckpt.config, base_ckpt.path, data_dir)
    del base, base_ckpt
    prepare_run_data(cfg, tokenizer, data_dir, on_event)
    return train(cfg, run_dir, data_dir, resume=False, progress=progress, on_event=on_event, auto_batch=auto_batch)


def dpo_objective(policy: torch.nn.Module, cfg: RunConfig, resumed: bool) -> torch.nn.Module:
    """The policy wrapped in DPOObjective for a DPO run (its reference: the policy as it is now, or with
    LoRA the same model with adapters off), else the policy itself."""
    if cfg.dpo is None:
        return policy
    from burnout.train.dpo import DPOObjective

    return DPOObjective(policy, cfg.dpo.beta, cfg.train.grad_accum, resumed=resumed)
