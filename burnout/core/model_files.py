"""A model in and out of files: `load_model`, the one way every command turns a checkpoint (or a run
folder) into a model and its tokenizer; `copy_weights`, a checkpoint's weights as a new run's step 0;
`import_hf` and `export_hf` between checkpoints and Hugging Face model folders; `grow_run`, a checkpoint grown
into a larger model of the same outputs (models/growth.py); `writing_run`, the run folder a command writes,
checked and locked."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager, suppress
from pathlib import Path

import torch
from tokenizers import Tokenizer

from burnout.base.files import EOT_TOKEN, RUN_CONFIG_FILE, TOKENIZER_FILE, sha256_file, write_atomic
from burnout.base.folders import check_output_folder, folder_owner, writing_into
from burnout.base.text import format_bytes
from burnout.config import ModelConfig, apply_override, load_run_config, saved_config_text
from burnout.core.chat_template import CHAT_TEMPLATE, CHAT_TOKENS, chat_token_ids, is_chat_model
from burnout.core.checkpoint import (
    CHECKPOINT_DIR,
    MANIFEST_FILE,
    Checkpoint,
    holds_run,
    launch_log,
    list_checkpoints,
    load_checkpoint,
    resolve_checkpoint,
    save_checkpoint,
    step_log,
)
from burnout.data.prepare import data_folder_owner
from burnout.data.tokenizer import load_tokenizer
from burnout.errors import BurnoutError
from burnout.models import Transformer
from burnout.models.growth import GROWN_KEYS, grow_state_dict, grown_model_config
from burnout.models.hf import load_hf, save_hf
from burnout.models.lora import lora_layers, merge_lora
from burnout.models.size import (
    FP32,
    check_weights_fit,
    describe,
    free_disk,
    machine_memory,
    parameter_count,
    refuse_unless_fits,
)
from burnout.models.transformer import unwrapped


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


def copy_weights(model: torch.nn.Module, source: torch.nn.Module, label: str) -> None:
    """`source`'s weights into `model` (a run's model at step 0, built from its own config), every one of them:
    LoRA adapters that `model` adds keep their own initialisation. Refused in one line (`label` names the source)
    where the two do not fit."""
    missing, unexpected = unwrapped(model).load_state_dict(source.state_dict(), strict=False)
    missing = [k for k in missing if not k.endswith((".lora_A", ".lora_B"))]
    if missing or unexpected:
        raise BurnoutError(f"{label}: its weights do not fit this run's model (missing "
                           f"{missing[:3]}, unexpected {unexpected[:3]}); start a new run from it")


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
    written) by its checkpoints or a run's logs in burnout's format (a file of your own that bears a log's name
    does not make a folder a run's); prepared data by its manifest or meta."""
    if list_checkpoints(folder) or step_log(folder) or launch_log(folder):
        return {"kind": "run", "source": None}
    return data_folder_owner(folder)


def export_hf(checkpoint: str | Path, out_dir: str | Path, overwrite: bool = False) -> Path:
    """Write a checkpoint as a Hugging Face folder that AutoModelForCausalLM / AutoTokenizer load offline.

    A chat model's folder also carries the ChatML template in tokenizer_config.json and stops
    transformers' `generate` at <|im_end|>; LoRA adapters are folded into the exported weights.
    `out_dir` is new, empty or an export of this checkpoint (of another: with `overwrite`), never anything else.
    """
    path = resolve_checkpoint(checkpoint)
    source = export_source(path)
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


def export_source(checkpoint: Path) -> str:
    """What an export records of the checkpoint it was written from, to tell a rewrite of its own export from another
    checkpoint's: the run's folder name, the checkpoint's and its weights' sha256 (as sha256.json recorded it, else
    read). No path: an export is made to be published, and a path names the user's machine."""
    recorded = {}
    with suppress(OSError, ValueError):
        recorded = json.loads((checkpoint / MANIFEST_FILE).read_text())
    weights = checkpoint / "model.safetensors"
    digest = recorded.get("model.safetensors") if isinstance(recorded, dict) else None
    run = f"{checkpoint.parent.parent.name}/" if checkpoint.parent.name == CHECKPOINT_DIR else ""
    return f"{run}{checkpoint.name} (weights sha256 {(digest or sha256_file(weights))[:16]})"


def grow_run(source: str | Path, out_dir: str | Path, overrides: Iterable[str],
             on_event: Callable[[str], None] | None = None) -> tuple[Path, dict]:
    """`burnout grow`: the checkpoint `source` (a run folder: its newest) grown by `overrides` (model.KEY=VALUE) into
    a new run folder `out_dir` whose outputs equal its own (burnout/models/growth.py), a start point for `burnout
    train --init-from`: OUT/config.yaml (the parent's config, the new model section) and OUT/checkpoints/step_0000000
    (the grown weights, the parent's tokenizer, no optimizer state; info.json's grown_from records the parent run,
    checkpoint, step and both shapes). (the checkpoint written, that record). The grown model's size is said to
    `on_event` before it is built, and one this machine cannot hold or write is refused then (models/size.py)."""
    path = resolve_checkpoint(source)
    writing = writing_run(out_dir, "--out", reads=[path])
    if holds_run(Path(out_dir)):
        raise BurnoutError(f"--out {out_dir} already holds a run; choose a new folder for the grown model")
    changes = _model_changes(list(overrides))
    ckpt = load_checkpoint(path)
    if ckpt.config.adapters is not None:
        raise BurnoutError(f"{path}: a LoRA fine-tune ({ckpt.config.adapters[0]}); merge its adapters first "
                           "(burnout lora merge) and grow the merged run")
    old = ckpt.config.model
    new = grown_model_config(old, changes)
    line = _check_grown_fits(old, new, list(overrides), Path(out_dir))
    if on_event is not None:
        on_event(line)
    # A start point: where the parent itself started from, and the loss predicted for it, are the parent's records.
    cfg = dataclasses.replace(ckpt.config, model=new, prediction=None,
                              train=dataclasses.replace(ckpt.config.train, init_from=None, init_optimizer="fresh"))
    with torch.device("meta"):  # no random init of weights about to be replaced
        model = Transformer(new)
    model.load_state_dict(grow_state_dict(old, ckpt.model.state_dict(), new, seed=cfg.train.seed), assign=True)
    if new.tie_embeddings:
        model.lm_head.weight = model.tok_emb.weight
    record = {"run": str(path.parent.parent.resolve()) if path.parent.name == CHECKPOINT_DIR else None,
              "checkpoint": str(path.resolve()), "step": ckpt.info.get("step", 0), "tokens": ckpt.info.get("tokens", 0),
              "before": {key: getattr(old, key) for key in GROWN_KEYS},
              "after": {key: getattr(new, key) for key in GROWN_KEYS}}
    with writing:
        written = save_checkpoint(out_dir, cfg, model, {"step": 0, "tokens": 0},
                                  {"step": 0, "tokens": 0, "grown_from": record}, path / TOKENIZER_FILE, keep_last=1)
        write_atomic(Path(out_dir) / RUN_CONFIG_FILE, saved_config_text(cfg, out_dir))
    return written, record


def _check_grown_fits(old: ModelConfig, new: ModelConfig, overrides: list[str], out_dir: Path) -> str:
    """Before a weight of it is made: the grown model in this process's memory, its checkpoint (fp32 weights) on the
    disk of `out_dir`; the line that says how large it is."""
    subject = f"{' '.join(overrides)}: the grown model"
    fix = f"grow it less (its parent has {describe(old)})"
    check_weights_fit(new, subject, fix)
    weights = FP32 * parameter_count(new)
    disk = free_disk(out_dir)
    refuse_unless_fits(f"{subject}'s checkpoint", [("fp32 weights", weights)], disk,
                       f"free some space, choose another --out, or {fix}")
    memory = machine_memory()
    return (f"growing into {describe(new)}: {format_bytes(weights)} in fp32"
            + (f" ({memory[1]}, {disk[1]})" if memory else f" ({disk[1]})"))


def _model_changes(overrides: list[str]) -> dict:
    """`model.KEY=VALUE` strings as {KEY: value}; anything but the model section refused."""
    raw: dict = {}
    for item in overrides:
        apply_override(raw, item)
        if set(raw) - {"model"} or not isinstance(raw.get("model", {}), dict):
            raise BurnoutError(f"'{item}': grow changes keys of the model section (e.g. model.n_layer=8); training "
                               "settings go to the run that trains the grown model (burnout train --init-from)")
    return raw.get("model", {})


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
