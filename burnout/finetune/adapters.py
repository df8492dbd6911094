"""A LoRA fine-tune's adapters at the level of runs (burnout/models/lora.py holds the layers themselves):

    lora_token_rows   the ids of the tokens a LoRA SFT run added (sft.added_tokens): their embedding rows train
                      beside the adapters, since a row frozen at the mean embedding is a token the model can
                      never emit (models/lora.py, "Token rows")
    trainable_line    what trains and the optimizer state it needs, against full fine-tuning
    save_run_adapter  RUN/adapter/ (adapter.safetensors + adapter_config.json) from a LoRA run's checkpoint
    merge_run         `burnout lora merge`: the adapters folded into the base, written as a plain checkpoint

Checkpoints of a LoRA run hold the base weights (with the trained token rows in the embedding) and the
adapters (the module tree core.checkpoint.model_for builds, so a resume loads them as they are) and the
optimizer state of the adapters, and of the embedding matrix (and untied head) when token rows train;
RUN/adapter/ is rewritten at the end of every session (a few MB at most), beside the checkpoints rather than
in each one.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from burnout.base.files import TOKENIZER_FILE
from burnout.base.text import format_bytes
from burnout.config import RunConfig
from burnout.core.checkpoint import holds_run, load_checkpoint, resolve_checkpoint, save_checkpoint
from burnout.core.model_files import writing_run
from burnout.data.tokenizer import load_tokenizer
from burnout.errors import BurnoutError
from burnout.models.lora import lora_layers, merge_lora, save_adapter, token_rows, train_token_rows, trainable_counts

ADAPTER_DIR = "adapter"


def lora_token_rows(cfg: RunConfig, tokenizer_path: str | Path | None = None) -> list[int]:
    """The token ids whose embedding rows a LoRA fine-tune trains beside its adapters: those of the tokens this
    very run added to its base (sft.added_tokens), looked up in its tokenizer (`tokenizer_path`, by default
    the one in data.prepared_dir, where the run's data were prepared). [] for a full fine-tune (every row
    trains) and for DPO, whose base already has the tokens (the SFT that added them trained their rows)."""
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


def trainable_line(model: torch.nn.Module) -> str:
    """Trainable parameters and the optimizer state they need, against full fine-tuning of the same model."""
    counts = trainable_counts(model)
    rows = token_rows(model)
    trained = f", the embedding rows of {len(rows)} added tokens among them" if rows else ""
    # AdamW keeps two fp32 tensors (exp_avg, exp_avg_sq) per parameter it updates: for the whole matrix
    # whose token rows train, frozen rows included.
    state = " (the whole embedding matrix's included: AdamW keeps state for every row)" if rows else ""
    return (f"trainable parameters: {counts.trainable:,} of {counts.total:,} ({counts.share:.2%}){trained}; "
            f"optimizer state {format_bytes(8 * counts.optimized)}{state} vs {format_bytes(8 * counts.total)} for "
            f"full fine-tuning ({counts.optimized_share:.2%})")


def save_run_adapter(run_dir: Path, checkpoint: Path) -> Path:
    """RUN/adapter/ from the LoRA checkpoint `checkpoint`, with the token rows the run trained."""
    ckpt = load_checkpoint(checkpoint, verify=False)
    rows = lora_token_rows(ckpt.config, ckpt.path / TOKENIZER_FILE)
    if rows:  # the checkpoint's embedding holds them; marking them puts them in the adapter
        train_token_rows(ckpt.model, rows)
    return save_adapter(ckpt.model, Path(run_dir) / ADAPTER_DIR)


def merge_run(source: str | Path, out_dir: str | Path) -> Path:
    """`burnout lora merge`: the checkpoint (or run's latest) with its adapters folded into the base weights,
    written as OUT/checkpoints/step_N, a plain checkpoint of a chat model (its lora sections none). OUT is new or
    empty, never the run it reads."""
    out_dir = Path(out_dir)
    writing = writing_run(out_dir, "--out", reads=[resolve_checkpoint(source)])
    if holds_run(out_dir):
        raise BurnoutError(f"--out {out_dir} already holds a run; choose a new folder")
    ckpt = load_checkpoint(source)
    if not lora_layers(ckpt.model):
        raise BurnoutError(f"{ckpt.path} has no LoRA adapters (its config has no sft.lora, dpo.lora or rl.lora); "
                           "nothing to merge")
    model = merge_lora(ckpt.model)
    sections = {"sft": ckpt.config.sft, "dpo": ckpt.config.dpo, "rl": ckpt.config.rl}
    cfg = dataclasses.replace(ckpt.config, **{key: dataclasses.replace(section, lora=None)
                                              for key, section in sections.items() if section is not None})
    step = int(ckpt.info.get("step", 0))
    info = {**ckpt.info, "merged_from": str(ckpt.path.resolve())}
    state = {"step": step, "tokens": int(ckpt.info.get("tokens", 0))}
    with writing:
        return save_checkpoint(out_dir, cfg, model, state, info, ckpt.path / TOKENIZER_FILE, keep_last=1)
