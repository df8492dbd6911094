"""A model in and out of files: `load_model`, the one way every command turns a checkpoint (or a run
folder) into a model and its tokenizer; `import_hf` and `export_hf` between checkpoints and Hugging
Face model folders; `writing_run`, the run folder a command writes, checked and locked."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from contextlib import AbstractContextManager
from pathlib import Path

import torch
from tokenizers import Tokenizer

from burnout.common import (
    EOT_TOKEN,
    LAUNCHES_FILE,
    METRICS_FILE,
    TOKENIZER_FILE,
    check_output_folder,
    folder_owner,
    writing_into,
)
from burnout.config import load_run_config
from burnout.core.chat_template import CHAT_TEMPLATE, CHAT_TOKENS, chat_token_ids, is_chat_model
from burnout.core.checkpoint import (
    Checkpoint,
    list_checkpoints,
    load_checkpoint,
    resolve_checkpoint,
    save_checkpoint,
)
from burnout.data.prepare import data_folder_owner
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


def writing_run(run_dir: str | Path, label: str, reads: Iterable[str | Path] = ()) -> AbstractContextManager[Path]:
    """`run_dir` for a command to write a run into: refused in one line (named `label`) unless it is new, empty or
    a run folder of burnout's, and neither is nor holds what the command `reads`; then, while the block writes
    it, marked as a run folder and locked against any other writer."""
    check_output_folder(run_dir, label, "run", reads=reads, recognise=_told_by_content)
    return writing_into(run_dir, "run", lock=True)


def is_run_folder(folder: str | Path) -> bool:
    """Whether `folder` is a run folder of burnout's: marked as one (writing_run), or told by its content."""
    owner = folder_owner(folder) or _told_by_content(Path(folder))
    return owner is not None and owner["kind"] == "run"


def _told_by_content(folder: Path) -> dict | None:
    """A folder of burnout's without an OWNER_FILE, told by what it holds: a run (made before OWNER_FILE was
    written) by its checkpoints or a run's logs; prepared data by its manifest or meta."""
    if list_checkpoints(folder) or any((folder / name).is_file() for name in (METRICS_FILE, LAUNCHES_FILE)):
        return {"kind": "run", "source": None}
    return data_folder_owner(folder)


def export_hf(checkpoint: str | Path, out_dir: str | Path, overwrite: bool = False) -> Path:
    """Write a checkpoint as a Hugging Face folder that AutoModelForCausalLM / AutoTokenizer load offline.

    A chat model's folder also carries the ChatML template in tokenizer_config.json and stops
    transformers' `generate` at <|im_end|>; LoRA adapters are folded into the exported weights.
    `out_dir` is new, empty or an export of this checkpoint (of another: with `overwrite`), never anything else.
    """
    path = resolve_checkpoint(checkpoint)
    source = str(path.resolve())
    check_output_folder(out_dir, "--to", "export", source, reads=[path], overwrite=overwrite,
                        recognise=_told_by_content)
    model, tokenizer, ckpt = load_model(path)
    if lora_layers(model):
        merge_lora(model)
    chat = is_chat_model(ckpt.config)
    if chat:
        chat_token_ids(tokenizer)  # one line when the chat model's tokenizer lacks the tokens
    with writing_into(out_dir, "export", source):
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
    writing = writing_run(out_dir, "--to", reads=[hf_dir])
    model = load_hf(hf_dir)
    vocab = load_tokenizer(tokenizer_path).get_vocab_size()
    if vocab > model.cfg.vocab_size:
        raise BurnoutError(
            f"'{hf_dir}': {TOKENIZER_FILE} has {vocab} tokens but the model only {model.cfg.vocab_size}; "
            "the tokenizer belongs to another model"
        )
    cfg = load_run_config({"model": dataclasses.asdict(model.cfg)})
    info = {"step": 0, "tokens": 0, "imported_from": str(hf_dir.resolve())}
    with writing:
        return save_checkpoint(out_dir, cfg, model, {"step": 0, "tokens": 0}, info, tokenizer_path, keep_last=1)
