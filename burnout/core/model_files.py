"""A model in and out of files: `load_model`, the one way every command turns a checkpoint (or a run
folder) into a model and its tokenizer; `import_hf` and `export_hf` between checkpoints and Hugging
Face model folders."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
from tokenizers import Tokenizer

from burnout.common import EOT_TOKEN, TOKENIZER_FILE
from burnout.config import load_run_config
from burnout.core.chat_template import CHAT_TEMPLATE, CHAT_TOKENS, chat_token_ids, is_chat_model
from burnout.core.checkpoint import Checkpoint, list_checkpoints, load_checkpoint, save_checkpoint
from burnout.data.tokenizer import load_tokenizer
from burnout.errors import BurnoutError
from burnout.models import Transformer
from burnout.models.hf import load_hf, save_hf
from burnout.models.lora import lora_layers, merge_lora


def load_model(path: str | Path, device: torch.device | str = "cpu") -> tuple[Transformer, Tokenizer, Checkpoint]:
    """(model in eval mode on `device`, its tokenizer, the checkpoint's config/state/info) of a checkpoint
    folder or a run folder's latest checkpoint, after checking that model and tokenizer belong together."""
    ckpt = load_checkpoint(path, device)
    tokenizer = load_tokenizer(ckpt.path / TOKENIZER_FILE)
    if tokenizer.get_vocab_size() > ckpt.model.cfg.vocab_size:
        raise BurnoutError(
            f"checkpoint {ckpt.path}: its tokenizer has {tokenizer.get_vocab_size()} tokens but the model only "
            f"{ckpt.model.cfg.vocab_size}; the {TOKENIZER_FILE} is not the one the model was trained with"
        )
    ckpt.model.eval()
    return ckpt.model, tokenizer, ckpt


def export_hf(checkpoint: str | Path, out_dir: str | Path) -> Path:
    """Write a checkpoint as a Hugging Face folder that AutoModelForCausalLM / AutoTokenizer load offline.

    A chat model's folder also carries the ChatML template in tokenizer_config.json and stops
    transformers' `generate` at <|im_end|>; LoRA adapters are folded into the exported weights.
    """
    model, tokenizer, ckpt = load_model(checkpoint)
    if lora_layers(model):
        merge_lora(model)
    chat = is_chat_model(ckpt.config)
    if chat:
        chat_token_ids(tokenizer)  # one line when the chat model's tokenizer lacks the tokens
    return save_hf(model, Path(out_dir), tokenizer_path=ckpt.path / TOKENIZER_FILE,
                   eos_token_id=tokenizer.token_to_id(EOT_TOKEN), chat_template=CHAT_TEMPLATE if chat else None,
                   chat_tokens=CHAT_TOKENS if chat else None)


def import_hf(hf_dir: str | Path, out_dir: str | Path) -> Path:
    """Turn a Hugging Face GPT-2 / LLaMA folder into a GPUburnout run folder with one checkpoint (step 0):
    OUT/checkpoints/step_0000000/{model.safetensors, state.pt, config.yaml, tokenizer.json, info.json}.

    The folder must hold a tokenizer.json (fast tokenizer): generation and evaluation need it.
    """
    hf_dir, out_dir = Path(hf_dir), Path(out_dir)
    tokenizer_path = hf_dir / TOKENIZER_FILE
    if not tokenizer_path.is_file():
        raise BurnoutError(
            f"'{hf_dir}' has no {TOKENIZER_FILE}; save the HF tokenizer there first "
            "(AutoTokenizer.from_pretrained(...).save_pretrained(folder) writes one for fast tokenizers)"
        )
    if list_checkpoints(out_dir):
        raise BurnoutError(f"'{out_dir}' already holds checkpoints; import into a new folder")
    model = load_hf(hf_dir)
    vocab = load_tokenizer(tokenizer_path).get_vocab_size()
    if vocab > model.cfg.vocab_size:
        raise BurnoutError(
            f"'{hf_dir}': {TOKENIZER_FILE} has {vocab} tokens but the model only {model.cfg.vocab_size}; "
            "the tokenizer belongs to another model"
        )
    cfg = load_run_config({"model": dataclasses.asdict(model.cfg)})
    info = {"step": 0, "tokens": 0, "imported_from": str(hf_dir.resolve())}
    return save_checkpoint(out_dir, cfg, model, {"step": 0, "tokens": 0}, info, tokenizer_path, keep_last=1)
