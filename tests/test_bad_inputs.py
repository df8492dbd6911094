"""The bad-input catalogue: every stage of the CLI fed something wrong, through the real `burnout` command.

Each case must give exactly one `burnout: error:` line on stderr that says what is wrong, where, and
how to fix it; exit with code 2 (BurnoutError: a user error) or 74 (the OS refused a path: StorageError
or any OSError); print no traceback; and leave every
file that existed before untouched (checked by content and modification time over the whole tree).
A case creates nothing unless it is marked as allowed to (a data folder it leaves unfinished).

tests/test_cli.py holds the first eleven (unknown preset, typo'd key, wrong type, heads that do not
divide d_model, missing config or checkpoint, an existing run as --out, unknown options); the cases
here are the rest of the issue's list. All commands start at once, so the suite pays for a few
interpreter start-ups' worth of time rather than one per case.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest


@dataclass
class Case:
    name: str
    argv: list[str]  # "{dir}" is the case's own folder, "{data}" a prepared data folder, "{run}" a trained run
    fragments: list[str]  # each must appear in the one error line
    setup: object = None  # setup(case_dir, data, run) -> None: builds the bad input inside case_dir
    creates: bool = False  # may leave new files behind (an unfinished data folder, say)
    code: int = 2  # 2: BurnoutError, a user error; 74: the disk or the OS refused (StorageError, any OSError)


def _recipe(d: Path, sources: list[dict], **data) -> None:
    (d / "recipe.yaml").write_text(json.dumps({"data": {"sources": sources, **data},
                                               "tokenizer": {"kind": "bpe", "vocab_size": 300}}))


def _copy_data(d: Path, data: Path, run: Path) -> None:
    shutil.copytree(data, d / "data")


def _copy_run(d: Path, data: Path, run: Path) -> None:
    shutil.copytree(run, d / "run")


def _ckpt(d: Path) -> Path:
    return sorted((d / "run" / "checkpoints").iterdir())[-1]


def _flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 1
    path.write_bytes(bytes(data))


def _edit_json(path: Path, edit) -> None:
    value = json.loads(path.read_text())
    edit(value)
    path.write_text(json.dumps(value))


def _config(d: Path, text: str) -> None:
    (d / "run.yaml").write_text(text)


TINY = ("model: {family: llama, vocab_size: 512, n_layer: 2, d_model: 64, n_head: 4, n_kv_head: 2, "
        "context_length: 64, ffn_multiple_of: 32}\n"
        "train: {device: cpu, precision: fp32, batch_size: 2, seq_len: 32, max_steps: 2}\n")


CASES = [
    # -- corpus and data preparation
    Case("missing-corpus", ["data", "prepare", "{dir}/recipe.yaml", "--out", "{dir}/out"], ["no-such-corpus"],
         setup=lambda d, *_: _recipe(d, [{"name": "t", "kind": "text", "path": str(d / "no-such-corpus")}])),
    Case("empty-corpus", ["data", "prepare", "{dir}/recipe.yaml", "--out", "{dir}/out"], ["empty"],
         setup=lambda d, *_: ((d / "empty.txt").write_text(""),
                              _recipe(d, [{"name": "t", "kind": "text", "path": str(d / "empty.txt")}])),
         creates=True),
    Case("binary-corpus", ["data", "prepare", "{dir}/recipe.yaml", "--out", "{dir}/out"], ["blob.txt"],
         setup=lambda d, *_: ((d / "blob.txt").write_bytes(bytes(range(256)) * 64),
                              _recipe(d, [{"name": "t", "kind": "text", "path": str(d / "blob.txt")}])),
         creates=True),
    Case("non-utf8-corpus", ["data", "prepare", "{dir}/recipe.yaml", "--out", "{dir}/out"], ["latin1.txt"],
         setup=lambda d, *_: ((d / "latin1.txt").write_bytes("café crème brûlée, à la française. ".encode("latin-1")
                                                             * 200),
                              _recipe(d, [{"name": "t", "kind": "text", "path": str(d / "latin1.txt")}])),
         creates=True),
    Case("jsonl-without-text-field", ["data", "prepare", "{dir}/recipe.yaml", "--out", "{dir}/out"], ["content"],
         setup=lambda d, *_: ((d / "docs.jsonl").write_text('{"body": "hello"}\n' * 50),
                              _recipe(d, [{"name": "j", "kind": "jsonl", "path": str(d / "docs.jsonl"),
                                           "text_field": "content"}])),
         creates=True),
    Case("separator-split-without-its-string", ["data", "prepare", "{dir}/recipe.yaml", "--out", "{dir}/out"],
         ["data.sources[0]", "split_by: separator", "separator: '<|endoftext|>'"],
         setup=lambda d, *_: ((d / "a.txt").write_text("one\n<|endoftext|>\ntwo\n"),
                              _recipe(d, [{"name": "t", "kind": "text", "path": str(d / "a.txt"),
                                           "split_by": "separator"}]))),
    Case("val-fraction-out-of-range", ["data", "prepare", "default", "--out", "{dir}/out", "data.val_fraction=0.7"],
         ["data.val_fraction", "0.7"]),
    Case("prepare-into-prepared-folder", ["data", "prepare", "default", "--out", "{dir}/data"],
         ["already holds prepared data", "overwrite"], setup=_copy_data),
    Case("prepare-zero-workers", ["data", "prepare", "default", "--out", "{dir}/out", "--workers", "-1"],
         ["--workers"]),
    # -- token shards and manifests
    Case("truncated-shard", ["data", "inspect", "{dir}/data"], ["train_000000.bin", "truncated"],
         setup=lambda d, data, run: (_copy_data(d, data, run),
                                     os.truncate(d / "data" / "train_000000.bin", 1000))),
    Case("foreign-shard", ["data", "inspect", "{dir}/data", "--verify"], ["train_000000.bin", "sha256"],
         setup=lambda d, data, run: (_copy_data(d, data, run),
                                     (d / "data" / "train_000000.bin").write_bytes(
                                         bytes(reversed((d / "data" / "train_000000.bin").read_bytes()))))),
    Case("manifest-sha256-mismatch", ["data", "inspect", "{dir}/data", "--verify"], ["val_000000.bin", "sha256"],
         setup=lambda d, data, run: (_copy_data(d, data, run), _edit_json(
             d / "data" / "meta.json", lambda m: m["splits"]["val"]["shards"][0].update(sha256="0" * 64)))),
    Case("unfinished-data-folder", ["train", "{dir}/run.yaml", "--out", "{dir}/new-run", "--data", "{dir}/data"],
         ["no meta.json", "prepare the data again"],
         setup=lambda d, data, run: (_copy_data(d, data, run), (d / "data" / "meta.json").unlink(), _config(d, TINY))),
    Case("vocab-larger-than-dtype", ["data", "inspect", "{dir}/data"], ["70000", "uint16"],
         setup=lambda d, data, run: (_copy_data(d, data, run), _edit_json(
             d / "data" / "meta.json", lambda m: m.update(vocab_size=70000)))),
    Case("model-vocab-smaller-than-data", ["train", "{dir}/run.yaml", "--out", "{dir}/new-run", "--data", "{data}",
                                           "model.vocab_size=256"], ["model.vocab_size", "512"],
         setup=lambda d, *_: _config(d, TINY)),
    # -- run configs
    Case("typo-section-in-yaml", ["train", "{dir}/run.yaml", "--out", "{dir}/new-run"], ["trian", "train"],
         setup=lambda d, *_: _config(d, TINY.replace("train:", "trian:"))),
    Case("wrong-type-in-yaml", ["train", "{dir}/run.yaml", "--out", "{dir}/new-run"],
         ["train.batch_size", "expected int"],
         setup=lambda d, *_: _config(d, TINY.replace("batch_size: 2", "batch_size: big"))),
    Case("config-not-yaml", ["train", "{dir}/run.yaml", "--out", "{dir}/new-run"], ["run.yaml"],
         setup=lambda d, *_: (d / "run.yaml").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00{[: :]")),
    Case("config-is-a-list", ["train", "{dir}/run.yaml", "--out", "{dir}/new-run"], ["run.yaml"],
         setup=lambda d, *_: _config(d, "- model\n- train\n")),
    Case("negative-batch", ["train", "{dir}/run.yaml", "--out", "{dir}/new-run", "train.batch_size=-4"],
         ["train.batch_size", "-4"], setup=lambda d, *_: _config(d, TINY)),
    Case("zero-layers", ["train", "{dir}/run.yaml", "--out", "{dir}/new-run", "model.n_layer=0"],
         ["model.n_layer", "0"], setup=lambda d, *_: _config(d, TINY)),
    Case("kv-heads-do-not-divide", ["train", "{dir}/run.yaml", "--out", "{dir}/new-run", "model.n_kv_head=3"],
         ["model.n_kv_head", "3"], setup=lambda d, *_: _config(d, TINY)),
    Case("infinite-lr", ["train", "{dir}/run.yaml", "--out", "{dir}/new-run", "train.lr=.inf"],
         ["train.lr", "inf", "finite"], setup=lambda d, *_: _config(d, TINY)),
    Case("nan-grad-clip", ["train", "{dir}/run.yaml", "--out", "{dir}/new-run", "train.grad_clip=.nan"],
         ["train.grad_clip", "nan", "finite"], setup=lambda d, *_: _config(d, TINY)),
    Case("negative-ckpt-minutes", ["train", "{dir}/run.yaml", "--out", "{dir}/new-run", "train.ckpt_minutes=-5"],
         ["train.ckpt_minutes", "-5", "negative"], setup=lambda d, *_: _config(d, TINY)),
    Case("cpu-offload-without-fsdp", ["train", "{dir}/run.yaml", "--out", "{dir}/new-run", "train.cpu_offload=true"],
         ["train.cpu_offload", "train.distributed=ddp", "add train.distributed=fsdp"],
         setup=lambda d, *_: _config(d, TINY)),
    Case("adamw8bit-under-fsdp", ["train", "{dir}/run.yaml", "--out", "{dir}/new-run", "train.optimizer=adamw8bit",
                                  "train.distributed=fsdp"],
         ["train.optimizer: adamw8bit", "FSDP's shards", "train.distributed=ddp"],
         setup=lambda d, *_: _config(d, TINY)),
    Case("cpu-offload-in-one-process", ["train", "{dir}/run.yaml", "--out", "{dir}/new-run", "--data", "{data}",
                                        "train.distributed=fsdp", "train.cpu_offload=true"],
         ["train.cpu_offload", "FSDP runs across processes", "torchrun --nproc_per_node 2"],
         setup=lambda d, *_: _config(d, TINY)),
    Case("resume-and-resume-if-exists", ["train", "{dir}/run.yaml", "--out", "{dir}/run", "--resume", "{dir}/run",
                                         "--resume-if-exists"], ["--resume-if-exists", "--resume"]),
    Case("seq-len-beyond-context", ["train", "{dir}/run.yaml", "--out", "{dir}/new-run", "train.seq_len=128"],
         ["train.seq_len", "128", "64"], setup=lambda d, *_: _config(d, TINY)),
    Case("batch-larger-than-data", ["train", "{dir}/run.yaml", "--out", "{dir}/new-run", "--data", "{dir}/data"],
         ["batch larger than the data", "val", "train.seq_len"],
         setup=lambda d, data, run: (_copy_data(d, data, run), _shrink_val(d / "data"), _config(d, TINY))),
    # -- checkpoints
    # Files put together from different checkpoints, each whole (its sha256 recorded): the mismatch is named.
    Case("checkpoint-of-another-model", ["generate", "{dir}/run", "--prompt", "The "], ["does not match its config"],
         setup=lambda d, data, run: (_copy_run(d, data, run),
                                     _retouch_yaml(_ckpt(d) / "config.yaml", "n_layer: 2", "n_layer: 3"),
                                     _record_sha256(_ckpt(d)))),
    Case("checkpoint-of-another-tokenizer", ["generate", "{dir}/run", "--prompt", "The "],
         ["tokenizer has", "not the one the model was trained with"],
         setup=lambda d, data, run: (_copy_run(d, data, run), _bigger_tokenizer(_ckpt(d) / "tokenizer.json"),
                                     _record_sha256(_ckpt(d)))),
    Case("resume-with-another-tokenizer", ["train", "--resume", "{dir}/run", "train.max_steps=30"],
         ["{dir}/data holds other data than the run trained on", "data.prepared_dir=DIR"],
         setup=lambda d, data, run: (_copy_run(d, data, run), _copy_data(d, data, run),
                                     _bigger_tokenizer(d / "data" / "tokenizer.json"),
                                     _retouch_yaml(d / "run" / "config.yaml", str(data.resolve()), str(d / "data")))),
    Case("corrupted-checkpoint", ["generate", "{dir}/run", "--prompt", "The "], ["unreadable", "model.safetensors"],
         setup=lambda d, data, run: (_copy_run(d, data, run), os.truncate(_ckpt(d) / "model.safetensors", 100))),
    # A changed byte in the tensor data still parses: only its recorded sha256 gives it away.
    Case("checkpoint-with-a-changed-byte", ["generate", "{dir}/run", "--prompt", "The "],
         ["unreadable", "model.safetensors does not match the sha256 recorded when it was saved"],
         setup=lambda d, data, run: (_copy_run(d, data, run), _flip_byte(_ckpt(d) / "model.safetensors"))),
    Case("corrupted-state", ["export", "{dir}/run", "--to", "{dir}/hf"], ["unreadable", "state.pt"],
         setup=lambda d, data, run: (_copy_run(d, data, run), (_ckpt(d) / "state.pt").write_bytes(b"not a zip"))),
    Case("resume-a-folder-that-is-no-run", ["train", "--resume", "{dir}"], ["no config.yaml"]),
    # -- continued pretraining: a new run from another run's checkpoint (train.init_from)
    Case("init-from-a-run-not-there", ["train", "{dir}/run.yaml", "--out", "{dir}/new-run", "--data", "{data}",
                                       "--init-from", "{dir}/no-such-run"],
         ["train.init_from {dir}/no-such-run", "no such folder"], setup=lambda d, *_: _config(d, TINY)),
    Case("init-from-a-folder-that-is-no-run", ["train", "{dir}/run.yaml", "--out", "{dir}/new-run", "--data",
                                               "{data}", "--init-from", "{dir}"],
         ["train.init_from {dir}", "not a checkpoint"], setup=lambda d, *_: _config(d, TINY)),
    Case("init-from-a-run-of-another-tokenizer", ["train", "{dir}/run.yaml", "--out", "{dir}/new-run", "--data",
                                                  "{dir}/data", "--init-from", "{run}"],
         ["another tokenizer", "--tokenizer"],
         setup=lambda d, data, run: (_copy_data(d, data, run), _bigger_tokenizer(d / "data" / "tokenizer.json"),
                                     _config(d, TINY))),
    Case("init-from-asking-another-shape", ["train", "{dir}/run.yaml", "--out", "{dir}/new-run", "--data", "{data}",
                                            "--init-from", "{run}", "model.n_layer=4"],
         ["model.n_layer=4", "the parent's is 2", "burnout grow"], setup=lambda d, *_: _config(d, TINY)),
    Case("init-from-asking-another-family", ["train", "{dir}/run.yaml", "--out", "{dir}/new-run", "--data", "{data}",
                                             "--init-from", "{run}", "model.family=gpt2", "model.n_kv_head=4"],
         ["model.family='gpt2'", "the parent's is 'llama'"], setup=lambda d, *_: _config(d, TINY)),
    Case("init-from-with-resume", ["train", "--resume", "{dir}/run", "--init-from", "{run}"],
         ["--init-from starts a new run", "drop --init-from"], setup=_copy_run),
    Case("resume-changing-init-from", ["train", "--resume", "{dir}/run", "train.init_from={dir}/run"],
         ["'train.init_from' cannot change"], setup=_copy_run),
    # -- plans: a run config, a model preset or a run folder, and nothing else
    Case("plan-of-neither-config-preset-nor-run", ["plan", "llama-smal", "--gpu", "rtx-4090"],
         ["'llama-smal' is neither a run config, a model preset nor a run folder", "quickstart,", "llama-small,",
          "or a run folder"]),
    Case("plan-of-a-folder-that-is-no-run", ["plan", "{dir}", "--gpu", "rtx-4090"],
         ["'{dir}' is a folder without a config.yaml", "a model preset (gpt2-10m,"]),
    # -- growth: `burnout grow`, and the start point it writes
    Case("grow-to-a-smaller-shape", ["grow", "{run}", "--out", "{dir}/grown", "model.n_layer=1"],
         ["model: growing needs a larger shape", "n_layer 2 → 1 is smaller"]),
    Case("grow-to-the-same-shape", ["grow", "{run}", "--out", "{dir}/grown", "model.n_layer=2"],
         ["is the same; give larger values, e.g. model.n_layer=4"]),
    Case("grow-to-another-vocabulary", ["grow", "{run}", "--out", "{dir}/grown", "model.n_layer=4",
                                        "model.vocab_size=1024"],
         ["model.vocab_size: 1024 differs from the model's 512", "keeps its vocabulary"]),
    Case("grow-into-another-family", ["grow", "{run}", "--out", "{dir}/grown", "model.family=gpt2"],
         ["model.family: gpt2 differs from the model's llama", "within its family"]),
    Case("grow-width-by-a-non-whole-factor", ["grow", "{run}", "--out", "{dir}/grown", "model.d_model=96"],
         ["model.d_model: 96 is not a whole multiple of 64", "model.d_model=128"]),
    Case("grow-with-a-train-setting", ["grow", "{run}", "--out", "{dir}/grown", "train.lr=1"],
         ["'train.lr=1': grow changes keys of the model section", "--init-from"]),
    Case("grow-a-checkpoint-that-is-not-there", ["grow", "{dir}/run/checkpoints/step_0000099", "--out",
                                                 "{dir}/grown", "model.n_layer=4"],
         ["checkpoint '{dir}/run/checkpoints/step_0000099' does not exist"], setup=_copy_run),
    Case("grow-into-a-folder-of-yours", ["grow", "{run}", "--out", "{dir}/mine", "model.n_layer=4"],
         ["--out {dir}/mine holds files that are not burnout's (config.json)"],
         setup=lambda d, *_: _yours(d / "mine", "config.json")),
    Case("grow-over-another-run", ["grow", "{run}", "--out", "{dir}/run", "model.n_layer=4"],
         ["--out {dir}/run already holds a run"], setup=_copy_run),
    Case("resume-a-grown-model", ["train", "--resume", "{dir}/grown"],
         ["--resume: {dir}/grown is a start point (a grown model)", "burnout train --init-from {dir}/grown --out"],
         setup=lambda d, data, run: _grow(run, d / "grown")),
    Case("report-of-a-grown-model", ["report", "{dir}/grown"],
         ["'{dir}/grown' holds a start point that nothing has trained yet",
          "burnout train --init-from {dir}/grown --out NEW_RUN"], setup=lambda d, data, run: _grow(run, d / "grown")),
    # -- evaluation and generation
    Case("unknown-task", ["eval", "{run}", "--tasks", "val,hellaswagg"], ["hellaswagg"]),
    Case("prompt-longer-than-context", ["generate", "{run}", "--prompt", "word " * 200, "--max-new-tokens", "5"],
         ["context"]),
    Case("nan-temperature", ["generate", "{run}", "--prompt", "The ", "--temperature", "nan"],
         ["temperature", "nan", "finite"]),
    Case("nan-repetition-penalty", ["generate", "{run}", "--prompt", "The ", "--repetition-penalty", "nan"],
         ["--repetition-penalty", "nan", "finite"]),
    Case("negative-max-new-tokens", ["generate", "{run}", "--prompt", "The ", "--max-new-tokens", "-3"],
         ["--max-new-tokens", "-3"]),
    Case("token-ids-not-numbers", ["tokenizer", "decode", "{data}", "12 twelve"], ["twelve"]),
    # -- output folders
    Case("output-is-a-file", ["data", "prepare", "default", "--out", "{dir}/file.txt/out"], ["file.txt", "writable"],
         setup=lambda d, *_: (d / "file.txt").write_text("keep me\n"), code=74),
    Case("unwritable-output", ["export", "{run}", "--to", "/proc/burnout-export"], ["/proc/burnout-export", "writable"],
         code=74),
    Case("import-into-another-run", ["import", "{dir}/hf", "--to", "{dir}/run"], ["already holds checkpoints"],
         setup=lambda d, data, run: (_copy_run(d, data, run), (d / "hf").mkdir(),
                                     shutil.copy(data / "tokenizer.json", d / "hf" / "tokenizer.json"))),
    # -- folders that are not the command's to write: someone's own files, another kind of output, what it reads
    Case("prepare-into-a-hugging-face-folder", ["data", "prepare", "{dir}/notes.txt", "--out", "{dir}/hf"],
         ["data folder {dir}/hf holds files that are not burnout's (config.json, tokenizer.json)"],
         setup=lambda d, *_: (_notes(d), _yours(d / "hf", "config.json", "tokenizer.json"))),
    Case("prepare-into-a-folder-with-your-manifest", ["data", "prepare", "{dir}/notes.txt", "--out", "{dir}/mine"],
         ["data folder {dir}/mine holds files that are not burnout's (manifest.json)"],
         setup=lambda d, *_: (_notes(d), _yours(d / "mine", "manifest.json"))),
    Case("prepare-into-the-folder-of-its-text", ["data", "prepare", "{dir}/notes.txt", "--out", "{dir}"],
         ["data folder {dir} holds {dir}/notes.txt, which this command reads"], setup=lambda d, *_: _notes(d)),
    Case("quickstart-into-a-folder-with-your-data", ["quickstart", "--out", "{dir}"],
         ["data folder {dir}/data holds files that are not burnout's (notes.txt)"],
         setup=lambda d, *_: _yours(d / "data", "notes.txt")),
    Case("train-into-the-folder-of-its-config", ["train", "{dir}/run.yaml", "--out", "{dir}", "--data", "{data}"],
         ["--out {dir} holds files that are not burnout's (run.yaml)"], setup=lambda d, *_: _config(d, TINY)),
    Case("train-into-a-data-folder", ["train", "{dir}/run.yaml", "--out", "{dir}/data", "--data", "{data}"],
         ["--out {dir}/data holds prepared data made by burnout, not a run"],
         setup=lambda d, data, run: (_copy_data(d, data, run), _config(d, TINY))),
    Case("resume-a-folder-of-yours", ["train", "--resume", "{dir}/mine"],
         ["--resume {dir}/mine holds files that are not burnout's (config.yaml)"],
         setup=lambda d, *_: (_yours(d / "mine"), (d / "mine" / "config.yaml").write_text(TINY))),
    Case("mirror-into-a-folder-of-yours", ["train", "{dir}/run.yaml", "--out", "{dir}/new-run", "--data", "{data}",
                                           "train.mirror_dir={dir}/volume"],
         ["train.mirror_dir {dir}/volume holds files that are not burnout's (config.yaml)"],
         setup=lambda d, *_: (_config(d, TINY), _yours(d / "volume", "config.yaml"))),
    Case("export-into-a-folder-of-yours", ["export", "{run}", "--to", "{dir}/mine"],
         ["--to {dir}/mine holds files that are not burnout's (config.json)"],
         setup=lambda d, *_: _yours(d / "mine", "config.json")),
    Case("export-into-its-run", ["export", "{dir}/run", "--to", "{dir}/run"],
         ["--to {dir}/run holds {dir}/run/checkpoints/step_0000024, which this command reads"], setup=_copy_run),
    Case("export-over-another-checkpoints-export", ["export", "{run}", "--to", "{dir}/hf"],
         ["--to {dir}/hf holds a Hugging Face export of ", "step_0000008 (weights sha256 ", "), not of ",
          "step_0000024 (weights sha256 ", "); pass --overwrite"],
         setup=lambda d, data, run: _export(run, d / "hf")),
    # -- GGUF exports (burnout/core/gguf_export.py)
    Case("gguf-unknown-type", ["export", "{run}", "--to", "{dir}/model.gguf", "--gguf-type", "q3_x"],
         ["--gguf-type q3_x: not a type burnout writes", "f16, q8_0, q4_0"]),
    Case("gguf-type-for-a-folder", ["export", "{run}", "--to", "{dir}/hf", "--gguf-type", "q8_0"],
         ["--gguf-type q8_0", "--to {dir}/hf is a folder", "ending in .gguf"]),
    Case("gguf-quantized-rows-not-whole-blocks", ["export", "{dir}/narrow", "--to", "{dir}/model.gguf",
                                                  "--gguf-type", "q8_0"],
         ["--gguf-type q8_0: tensor token_embd.weight has rows of 48 values", "q8_0's blocks of 32",
          "--gguf-type f16"],
         setup=lambda d, data, run: _untrained(d / "narrow", _run_tokenizer(run), d_model=48)),
    Case("gguf-char-tokenizer", ["export", "{dir}/char", "--to", "{dir}/model.gguf"],
         ["a character-level tokenizer has no GGUF form", "(--to FOLDER)"],
         setup=lambda d, *_: _untrained(d / "char", _char_tokenizer())),
    Case("gguf-tokenizer-of-another-kind", ["export", "{dir}/prefixed", "--to", "{dir}/model.gguf"],
         ["its tokenizer has a space put before the text, unlike GPT-2-style byte-level BPE", "(--to FOLDER)"],
         setup=lambda d, data, run: _untrained(d / "prefixed", _prefixing(_run_tokenizer(run)))),
    Case("gguf-over-a-file-of-yours", ["export", "{run}", "--to", "{dir}/model.gguf"],
         ["--to {dir}/model.gguf exists and is not a GGUF export of burnout's; choose a new file name"],
         setup=lambda d, *_: (d / "model.gguf").write_text("my own model\n")),
    Case("gguf-into-its-checkpoint", ["export", "{dir}/run", "--to", "{dir}/run/checkpoints/step_0000024/model.gguf"],
         ["--to {dir}/run/checkpoints/step_0000024/model.gguf is inside the checkpoint", "which this command reads"],
         setup=_copy_run),
    Case("import-into-its-own-folder", ["import", "{dir}/hf", "--to", "{dir}/hf"],
         ["--to {dir}/hf is {dir}/hf, which this command reads"],
         setup=lambda d, data, run: ((d / "hf").mkdir(), shutil.copy(data / "tokenizer.json", d / "hf"))),
    Case("lora-merge-into-its-run", ["lora", "merge", "{dir}/run", "--out", "{dir}/run"],
         ["--out {dir}/run holds {dir}/run/checkpoints/step_0000024, which this command reads"], setup=_copy_run),
    Case("audit-into-a-folder-of-yours", ["data", "audit", "{data}", "--out", "{dir}/mine"],
         ["--out {dir}/mine holds files that are not burnout's (audit.json)"],
         setup=lambda d, *_: _yours(d / "mine", "audit.json")),
    Case("audit-into-its-data-folder", ["data", "audit", "{dir}/data", "--out", "{dir}/data"],
         ["--out {dir}/data is {dir}/data, which this command reads"], setup=_copy_data),
    Case("report-into-a-folder-of-yours", ["report", "{run}", "--out", "{dir}/mine"],
         ["--out {dir}/mine holds files that are not burnout's (report.md)"],
         setup=lambda d, *_: _yours(d / "mine", "report.md")),
    Case("report-into-its-run", ["report", "{dir}/run", "--out", "{dir}/run"],
         ["--out {dir}/run is ", "run, which this command reads"], setup=_copy_run),
    # -- the second catalogue: each of these gave a traceback or a line that named the wrong problem
    # Seeds: refused when the config loads, before any data are prepared (NumPy's range).
    Case("negative-seed", ["train", "{dir}/run.yaml", "--out", "{dir}/new-run", "train.seed=-1"],
         ["train.seed: -1 must be in [0, 4294967295]", "-1 does not mean a random seed"],
         setup=lambda d, *_: _config(d, TINY)),
    Case("seed-of-2-to-the-32", ["train", "{dir}/run.yaml", "--out", "{dir}/new-run", f"train.seed={2**32}"],
         [f"train.seed: {2**32} must be in [0, 4294967295]"], setup=lambda d, *_: _config(d, TINY)),
    Case("seed-of-2-to-the-70", ["train", "{dir}/run.yaml", "--out", "{dir}/new-run", f"train.seed={2**70}"],
         [f"train.seed: {2**70} must be in [0, 4294967295]"], setup=lambda d, *_: _config(d, TINY)),
    Case("generate-seed-of-2-to-the-70", ["generate", "{run}", "--prompt", "The ", "--seed", str(2**70)],
         ["--seed", f"'{2**70}' must be in [0, 4294967295]"]),
    # Corpora.
    Case("drop-every-document", ["data", "prepare", "{dir}/notes.txt", "--out", "{dir}/out", "--drop", "."],
         ["no document is left", "by the --drop / data.junk_patterns pattern '.'"],
         setup=lambda d, *_: (d / "notes.txt").write_text("First note.\n\nSecond note.\n\nThird note.\n"),
         creates=True),
    Case("fifo-in-a-recipe", ["data", "prepare", "{dir}/recipe.yaml", "--out", "{dir}/out"],
         ["'{dir}/pipe' is a named pipe (FIFO), not a file or folder", "save its text to a file"],
         setup=lambda d, *_: (os.mkfifo(d / "pipe"),
                              _recipe(d, [{"name": "t", "kind": "text", "path": str(d / "pipe")}])),
         creates=True),
    Case("fifo-as-your-text", ["data", "prepare", "{dir}/pipe", "--out", "{dir}/out"],
         ["'{dir}/pipe' is a named pipe (FIFO), not a file or folder", "save the text to a file"],
         setup=lambda d, *_: os.mkfifo(d / "pipe")),
    # Runs.
    Case("train-out-is-a-file", ["train", "{dir}/run.yaml", "--out", "{dir}/file.txt"], ["{dir}/file.txt is a file"],
         setup=lambda d, *_: (_config(d, TINY), (d / "file.txt").write_text("keep me\n"))),
    Case("resume-a-config-file", ["train", "--resume", "{dir}/run/config.yaml"],
         ["that is a file", "give the run folder: burnout train --resume {dir}/run"], setup=_copy_run),
    Case("resume-past-a-lowered-max-steps", ["train", "--resume", "{dir}/run", "train.max_steps=3"],
         ["{dir}/run is at step 24", "train.max_steps=3 now ends it", "config.yaml is left as it was"],
         setup=_copy_run),
    Case("resume-past-its-time-budget", ["train", "--resume", "{dir}/run", "--minutes", "0.001"],
         ["{dir}/run has trained", "of its time budget (train.max_minutes=0.001", "a larger budget, e.g. --minutes"],
         setup=_copy_run),
    Case("train-minutes-not-positive", ["train", "--data", "{data}", "--model", "llama-tiny", "--out", "{dir}/run",
                                        "--minutes", "0"], ["--minutes", "0"]),
    Case("train-dollars-without-a-price", ["train", "--data", "{data}", "--model", "llama-tiny", "--out", "{dir}/run",
                                           "--dollars", "1", "train.device=cpu"],
         ["train.max_dollars: no price per hour is known for a CPU", "train.price_per_hour=", "--minutes N"],
         creates=True),  # the run folder, taken before the device is known
    Case("train-minutes-and-dollars", ["train", "--data", "{data}", "--model", "llama-tiny", "--out", "{dir}/run",
                                       "--minutes", "1", "--dollars", "1"], ["--minutes and --dollars", "one budget"]),
    Case("train-step-seconds-not-positive", ["train", "--data", "{data}", "--model", "llama-tiny", "--out",
                                             "{dir}/run", "--minutes", "1", "train.step_seconds=0"],
         ["train.step_seconds: 0", "must be positive"]),
    Case("resume-after-a-kill-during-data-preparation", ["train", "--resume", "{dir}/run"],
         ["no training started there yet", "preparing its data into {dir}/run/data",
          "run the command that started it again (burnout train CONFIG --out {dir}/run)"],
         setup=lambda d, *_: ((d / "run" / "data").mkdir(parents=True),
                              (d / "run" / "data" / "manifest.json").write_text("{}"))),
    # Checkpoints.
    Case("empty-state-of-an-older-checkpoint", ["generate", "{dir}/run", "--prompt", "The "],
         ["unreadable: state.pt is empty"],
         setup=lambda d, data, run: (_copy_run(d, data, run), (_ckpt(d) / "sha256.json").unlink(),
                                     (_ckpt(d) / "state.pt").write_bytes(b""))),
    Case("generate-a-run-config-file", ["generate", "{dir}/run/config.yaml", "--prompt", "The "],
         ["'{dir}/run/config.yaml' is a file; give a run folder"], setup=_copy_run),
    # Generation, evaluation, fine-tuning, forensics.
    Case("prompts-file-not-utf8", ["generate", "{run}", "--prompts-file", "{dir}/prompts.txt"],
         ["'{dir}/prompts.txt' is not UTF-8 text", "save it as UTF-8"],
         setup=lambda d, *_: (d / "prompts.txt").write_bytes("café\n".encode("latin-1"))),
    Case("chat-with-a-base-model", ["generate", "{run}", "--chat", "--prompt", "Hi"],
         ["--chat needs a chat model", "is a base model", "burnout sft"]),
    Case("empty-task-file", ["eval", "{run}", "--task", "mine={dir}/empty.jsonl"], ["'{dir}/empty.jsonl' is empty"],
         setup=lambda d, *_: (d / "empty.jsonl").write_text("")),
    Case("pairs-without-rejected", ["dpo", "{chat}", "--data", "{dir}/pairs.jsonl", "--out", "{dir}/dpo"],
         ["record 1: a preference pair needs prompt, chosen and rejected fields", "no rejected"],
         setup=lambda d, *_: (d / "pairs.jsonl").write_text('{"prompt": "Capital?", "chosen": "Paris."}\n')),
    Case("conversations-of-unknown-layout", ["sft", "{run}", "--data", "{dir}/chats.jsonl", "--out", "{dir}/sft"],
         ["record 1: unknown layout (fields: prompt, chosen)"],
         setup=lambda d, *_: (d / "chats.jsonl").write_text('{"prompt": "Capital?", "chosen": "Paris."}\n')),
    Case("rl-from-a-base-model", ["rl", "{run}", "--data", "{dir}/tasks.jsonl", "--out", "{dir}/rl"],
         ["rl.base", "not a chat model", "burnout sft"], setup=lambda d, *_: _tasks(d, {"answer": "#### 2"})),
    Case("rl-tasks-without-answers", ["rl", "{chat}", "--data", "{dir}/tasks.jsonl", "--out", "{dir}/rl"],
         ["record 1 has no answer", "add one or remove the record"], setup=lambda d, *_: _tasks(d, {})),
    Case("rl-gsm8k-answer-without-final-number", ["rl", "{chat}", "--data", "{dir}/tasks.jsonl", "--out", "{dir}/rl"],
         ["record 1: its answer has no final '#### number'", "--reward exact"],
         setup=lambda d, *_: _tasks(d, {"answer": "two"})),
    Case("rl-group-of-one", ["rl", "{chat}", "--data", "{dir}/tasks.jsonl", "--out", "{dir}/rl", "rl.group_size=1"],
         ["rl.group_size: 1", "use 2 or more"], setup=lambda d, *_: _tasks(d, {"answer": "#### 2"})),
    Case("rl-reward-module-missing", ["rl", "{chat}", "--data", "{dir}/tasks.jsonl", "--out", "{dir}/rl",
                                      "--reward", "my_rewards:score"],
         ["rl.reward my_rewards:score: no module 'my_rewards'"], setup=lambda d, *_: _tasks(d, {"answer": "#### 2"})),
    Case("trace-a-checkpoints-folder", ["data", "trace", "The", "{dir}/run/checkpoints"],
         ["'{dir}/run/checkpoints' is not a data folder", "inside the run folder {dir}/run",
          "whose data folder is {data}"], setup=_copy_run),
    # -- export: a --to that could name a file or a folder (burnout/cli.py)
    Case("export-gguf-name-ending-in-a-slash", ["export", "{run}", "--to", "{dir}/model.gguf/"],
         ["--to {dir}/model.gguf/: ends in .gguf (a GGUF file) and in / (a folder)", "drop the /"]),
    Case("export-to-a-weights-file-name", ["export", "{run}", "--to", "{dir}/model.safetensors"],
         ["--to {dir}/model.safetensors: names a .safetensors file", "give a folder name, or a name ending in .gguf"]),
    # -- fine-tuning: rl (issue 48). {chat} answers every question "Paris.".
    Case("rl-empty-questions", ["rl", "{chat}", "--data", "{dir}/tasks.jsonl", "--out", "{dir}/rl"],
         ["'{dir}/tasks.jsonl' record 1 has an empty question", "write the question in or remove the record"],
         setup=lambda d, *_: (d / "tasks.jsonl").write_text('{"question": "", "answer": "#### 2"}\n' * 3)),
    Case("rl-nothing-to-learn", ["rl", "{chat}", "--data", "{dir}/tasks.jsonl", "--out", "{dir}/rl"],
         ["nothing to learn", "answered 1 train question(s) 8 times each", "all 8 answers got the reward 0",
          "burnout sft", "rl.group_size"], setup=lambda d, *_: _tasks(d, {"answer": "#### 2"})),
    Case("rl-reward-calls-sys-exit", ["rl", "{chat}", "--data", "{dir}/tasks.jsonl", "--out", "{dir}/rl",
                                      "--reward", "quits:reward"],
         ["rl.reward quits:reward called sys.exit(0) for the answer 'Paris.' to 'What is 1 plus 1?'"],
         setup=lambda d, *_: _reward_module(d, "quits", "sys.exit(0)")),
    Case("rl-reward-of-1e308", ["rl", "{chat}", "--data", "{dir}/tasks.jsonl", "--out", "{dir}/rl",
                                "--reward", "huge:reward"],
         ["rl.reward huge:reward returned 1e+308 for the answer 'Paris.' to 'What is 1 plus 1?'", "beyond ±1e+06"],
         setup=lambda d, *_: _reward_module(d, "huge", "return 1e308")),
    # -- runs and their folders (issue 48, item 8): a file of yours under a run log's name does not make a folder a
    # run's or a mirror's, so nothing appends to it
    Case("train-into-a-folder-with-your-launches-log", ["train", "{dir}/run.yaml", "--out", "{dir}/mine", "--data",
                                                        "{data}"],
         ["--out {dir}/mine holds files that are not burnout's (launches.jsonl)"],
         setup=lambda d, *_: (_config(d, TINY), _yours(d / "mine", "launches.jsonl"))),
    Case("train-into-a-folder-with-your-metrics-log", ["train", "--data", "{data}", "--model", "llama-tiny", "--out",
                                                       "{dir}/mine"],
         ["--out {dir}/mine holds files that are not burnout's (metrics.jsonl)"],
         setup=lambda d, *_: _yours(d / "mine", "metrics.jsonl")),
    Case("resume-a-folder-with-your-logs", ["train", "--resume", "{dir}/mine"],
         ["--resume {dir}/mine holds files that are not burnout's (config.yaml, launches.jsonl, metrics.jsonl)"],
         setup=lambda d, *_: (_yours(d / "mine", "launches.jsonl", "metrics.jsonl"),
                              (d / "mine" / "config.yaml").write_text(TINY))),
    Case("mirror-into-a-folder-with-your-launches-log", ["train", "{dir}/run.yaml", "--out", "{dir}/new-run", "--data",
                                                         "{data}", "train.mirror_dir={dir}/volume"],
         ["train.mirror_dir {dir}/volume holds files that are not burnout's (launches.jsonl)"],
         setup=lambda d, *_: (_config(d, TINY), _yours(d / "volume", "launches.jsonl"))),
    # -- issue 48 item 3: inputs that reached the catch-all `internal error` line, now refused where they arise.
    # Text a char-level tokenizer never saw, or that is no text (a lone surrogate: what Python makes of a byte that
    # is not UTF-8 in an argument), names its characters by code point (data/tokenizer.py: encode_text).
    Case("generate-emoji-for-a-char-model", ["generate", "{dir}/char", "--prompt", "To be 😀"],
         ["--prompt holds '😀' (U+1F600), which the tokenizer cannot encode", "the 18 characters of the text it was "
          "trained on; leave them out"], setup=lambda d, *_: _untrained(d / "char", _char_tokenizer())),
    Case("generate-cjk-for-a-char-model", ["generate", "{dir}/char", "--prompt", "To be 中文"],
         ["--prompt holds '中' (U+4E2D), '文' (U+6587), which the tokenizer cannot encode"],
         setup=lambda d, *_: _untrained(d / "char", _char_tokenizer())),
    Case("generate-a-byte-that-is-not-utf8", ["generate", "{run}", "--prompt", "The \udcff"],
         ["--prompt holds '\\udcff' (byte 0xff, not UTF-8), which the tokenizer cannot encode",
          "give the text as UTF-8"]),
    Case("generate-prompts-file-of-unseen-characters", ["generate", "{dir}/char", "--prompts-file",
                                                        "{dir}/prompts.txt"],
         ["prompt 2 holds '(' (U+0028), ')' (U+0029), which the tokenizer cannot encode"],
         setup=lambda d, *_: (_untrained(d / "char", _char_tokenizer()),
                              (d / "prompts.txt").write_text("To be\nnot (to be)\n"))),
    Case("compare-prompts-of-unseen-characters", ["compare", "{dir}/char", "--prompts", "{dir}/prompts.txt"],
         ["prompt 2 holds '😀' (U+1F600), which the tokenizer cannot encode"],
         setup=lambda d, *_: (_untrained(d / "char", _char_tokenizer()),
                              (d / "prompts.txt").write_text("To be\nto be 😀\n"))),
    Case("tokenizer-encode-unseen-characters", ["tokenizer", "encode", "{dir}/tokenizer.json", "question 中文"],
         ["TEXT holds '中' (U+4E2D), '文' (U+6587), which the tokenizer cannot encode"],
         setup=lambda d, *_: _char_tokenizer().save(str(d / "tokenizer.json"))),
    Case("tokenizer-encode-a-lone-surrogate", ["tokenizer", "encode", "{data}", "x\ud800y"],
         ["TEXT holds '\\ud800' (U+D800, a lone surrogate), which the tokenizer cannot encode"]),
    Case("eval-task-text-a-char-model-lacks", ["eval", "{dir}/char", "--task", "mine={dir}/mine.jsonl"],
         ["task 'mine' holds 'Q' (U+0051), which the tokenizer cannot encode",
          "leave 'mine' out (val scores any model), or score a byte-level BPE model"],
         setup=lambda d, *_: (_untrained(d / "char", _char_tokenizer()), (d / "mine.jsonl").write_text(
             json.dumps({"query": "Qo be", "choices": [" or", " not"], "gold": 0}) + "\n"))),
    Case("rl-question-with-a-lone-surrogate", ["rl", "{chat}", "--data", "{dir}/tasks.jsonl", "--out", "{dir}/rl"],
         ["record 1: its question holds '\\ud800' (U+D800, a lone surrogate), which the tokenizer cannot encode"],
         setup=lambda d, *_: (d / "tasks.jsonl").write_text('{"question": "1 plus \\ud800?", "answer": "#### 2"}\n')),
    # The sample prompt is checked before the first step, not at the first evaluation (which lost the training).
    Case("sample-prompt-of-characters-the-corpus-lacks", ["train", "{dir}/run.yaml", "--out", "{dir}/new-run",
                                                          "--data", "{dir}/data",
                                                          'train.sample_prompt="to be (or not)"'],
         ["train.sample_prompt holds '(' (U+0028), ')' (U+0029), which the tokenizer cannot encode",
          "set train.sample_prompt to a few words of the training text, or train.sample_tokens=0"],
         setup=lambda d, *_: (_char_data(d), _config(d, TINY))),
    Case("sample-prompt-longer-than-the-context", ["train", "{dir}/run.yaml", "--out", "{dir}/new-run", "--data",
                                                   "{data}", "train.sample_prompt=" + "words " * 100],
         ["train.sample_prompt is ", "tokens but model.context_length is 64", "shorten it"],
         setup=lambda d, *_: _config(d, TINY)),
    Case("eval-tasks-during-training-a-char-corpus-lacks", ["train", "{dir}/run.yaml", "--out", "{dir}/new-run",
                                                            "--data", "{dir}/data", "train.eval_tasks=[hellaswag]",
                                                            "train.eval_data_root={dir}/root"],
         ["train.eval_tasks: task 'hellaswag' holds 'Q' (U+0051), which the tokenizer cannot encode",
          "leave 'hellaswag' out of train.eval_tasks (val scores any model)"],
         setup=lambda d, *_: (_char_data(d), _config(d, TINY), _hellaswag(d / "root" / "hellaswag"))),
    # YAML keys that are not text; whole numbers written as floats, or beyond int64.
    Case("yaml-key-read-as-a-boolean", ["train", "{dir}/run.yaml", "--out", "{dir}/new-run"],
         ["config.train.true: unknown key", "an unquoted on, yes or true", "quote a key to keep it text",
          "known keys: "], setup=lambda d, *_: _config(d, TINY.replace("max_steps: 2}", "max_steps: 2, on: 1}"))),
    Case("yaml-key-read-as-a-number", ["train", "{dir}/run.yaml", "--out", "{dir}/new-run"],
         ["config.4: unknown key (YAML reads it as a number, not a name", "known keys: data, dpo, model"],
         setup=lambda d, *_: _config(d, TINY + "4: 3\n")),
    Case("yaml-key-read-as-null", ["train", "{dir}/run.yaml", "--out", "{dir}/new-run"],
         ["config.model.null: unknown key", "an unquoted ~ or null"],
         setup=lambda d, *_: _config(d, TINY.replace("model: {", "model: {~: 1, "))),
    Case("batch-size-1e20", ["train", "{dir}/run.yaml", "--out", "{dir}/new-run", "train.batch_size=1e20"],
         ["config.train.batch_size: '1e20' is beyond the largest whole number a setting may hold",
          "9,223,372,036,854,775,807", "give a smaller one"], setup=lambda d, *_: _config(d, TINY)),
    Case("batch-size-1.0e+20", ["train", "{dir}/run.yaml", "--out", "{dir}/new-run", "train.batch_size=1.0e+20"],
         ["config.train.batch_size: 1e+20 is beyond the largest whole number"], setup=lambda d, *_: _config(d, TINY)),
    Case("max-steps-of-a-billion-digits", ["train", "{dir}/run.yaml", "--out", "{dir}/new-run",
                                           "train.max_steps=1e999999999"],
         ["config.train.max_steps: '1e999999999' is beyond the largest whole number"],
         setup=lambda d, *_: _config(d, TINY)),
    Case("yaml-int-of-5000-digits", ["train", "{dir}/run.yaml", "--out", "{dir}/new-run"],
         ["{dir}/run.yaml: YAML cannot read one of its values (a whole number of thousands of digits)"],
         setup=lambda d, *_: _config(d, TINY.replace("max_steps: 2", "max_steps: " + "9" * 5000))),
    # Compressed and JSON files cut short.
    Case("truncated-bz2-task-file", ["eval", "{run}", "--tasks", "hellaswag", "--task-file",
                                     "hellaswag={dir}/hellaswag.txt.bz2"],
         ["task file '{dir}/hellaswag.txt.bz2' is not whole bz2 data", "cut short or damaged; download it again"],
         setup=lambda d, *_: _cut_bz2(d / "hellaswag.txt.bz2")),
    Case("truncated-bz2-icl-task", ["eval", "{run}", "--task", "mine={dir}/mine.jsonl.bz2", "--type",
                                    "multiple_choice"],
         ["task file '{dir}/mine.jsonl.bz2' is not whole bz2 data"],
         setup=lambda d, *_: _cut_bz2(d / "mine.jsonl.bz2")),
    Case("icl-yaml-with-an-impossible-date", ["eval", "{run}", "--tasks", "icl:{dir}/suite.yaml"],
         ["{dir}/suite.yaml cannot be read as YAML (month must be in 1..12); fix it"],
         setup=lambda d, *_: (d / "suite.yaml").write_text("icl_tasks:\n- label: mine\n  added: 2024-13-45\n")),
    Case("playground-of-truncated-info-json", ["playground", "{dir}/run", "--port", "0"],
         ["no checkpoint of {dir}/run can be read"],
         setup=lambda d, data, run: (_copy_run(d, data, run), [os.truncate(c / "info.json", 7)
                                                                for c in (d / "run" / "checkpoints").iterdir()])),
    # -- sizes checked before work (issue 48, item 4): shapes, batches and counts no machine, or not this one, can
    # hold, refused before anything is built; a billion of anything exceeds every machine's memory
    Case("model-info-sequence-past-the-context", ["model", "info", "llama-tiny", "--seq-len", "100000"],
         ["--seq-len 100,000: longer than the model's context_length 256", "give --seq-len 256 or less"]),
    Case("model-info-vocabulary-past-an-address-space", ["model", "info", "llama-tiny", f"model.vocab_size={10**18}"],
         ["model.vocab_size 1,000,000,000,000,000,000: the token embedding", "past the 2^63",
          "give a smaller model.vocab_size"]),
    Case("model-info-context-past-an-address-space", ["model", "info", "llama-tiny", f"model.context_length={10**9}"],
         ["model.context_length 1,000,000,000: a step's attention scores", "give a smaller model.context_length"]),
    Case("model-info-batch-past-an-address-space", ["model", "info", "llama-tiny", "--batch-size", str(10**23)],
         ["--batch-size 100,000,000,000,000,000,000,000: a step's hidden states", "give a smaller --batch-size"]),
    Case("plan-batch-past-an-address-space", ["plan", "llama-tiny", f"train.batch_size={10**18}"],
         ["train.batch_size 1,000,000,000,000,000,000", "give a smaller train.batch_size"]),
    Case("plan-width-past-an-address-space", ["plan", "llama-tiny", f"model.d_model={2**40}", f"model.n_head={2**30}",
                                              f"model.n_kv_head={2**30}"],
         ["model.d_model 1,099,511,627,776: a block's widest matrix", "give a smaller model.d_model"]),
    Case("grow-to-a-billion-layers", ["grow", "{run}", "--out", "{dir}/grown", "model.n_layer=1000000000"],
         ["model.n_layer=1000000000: the grown model", "parameters: n_layer 1,000,000,000, d_model 64",
          "for its fp32 weights and", "grow it less (its parent has"]),
    Case("train-a-billion-layers", ["train", "--data", "{data}", "--model", "llama-tiny", "--out", "{dir}/run",
                                    "model.n_layer=1000000000"],
         ["a training step at micro-batch", "parameters: n_layer 1,000,000,000", "choose a smaller model"]),
    Case("train-a-trillion-sequences", ["train", "--data", "{data}", "--model", "llama-tiny", "--out", "{dir}/run",
                                        f"train.batch_size={10**12}"],
         ["a training step at micro-batch 1,000,000,000,000 × 256 tokens", "activations, at least",
          "lower train.batch_size to"]),
    Case("train-a-billion-layers-before-preparing-its-sources", ["train", "{dir}/run.yaml", "--out", "{dir}/run",
                                                                 "model.n_layer=1000000000"],
         ["a training step at micro-batch 2 × 32 tokens", "choose a smaller model"],
         setup=lambda d, *_: _config(d, TINY.replace("train: {", "data: {max_chars: 50000}\ntrain: {"))),
    Case("bench-a-billion-layers", ["bench", "{dir}/run.yaml", "--data", "{data}", "model.n_layer=1000000000"],
         ["a training step at micro-batch 2 × 32 tokens", "choose a smaller model"],
         setup=lambda d, *_: _config(d, TINY)),
    Case("checkpoint-whose-config-asks-for-a-billion-layers", ["generate", "{dir}/run", "--prompt", "The "],
         ["checkpoint {dir}/run/checkpoints/step_", "parameters: n_layer 1,000,000,000",
          "load it on a machine with more memory"],
         setup=lambda d, data, run: (_copy_run(d, data, run),
                                     _retouch_yaml(_ckpt(d) / "config.yaml", "n_layer: 2", "n_layer: 1000000000"),
                                     _record_sha256(_ckpt(d)))),
    Case("import-a-config-json-past-an-address-space", ["import", "{dir}/hf", "--to", "{dir}/run"],
         ["{dir}/hf/config.json: model.vocab_size 100,000,000,000,000,000,000: the token embedding",
          "give a smaller model.vocab_size"],
         setup=lambda d, data, run: (_export(run, d / "hf"),
                                     _edit_json(d / "hf" / "config.json", lambda c: c.update(vocab_size=10**20)))),
    # -- issue 48, item 9: what data trace and plan need instead
    Case("trace-in-a-text-file", ["data", "trace", "The", "{dir}/notes.txt"],
         ["'{dir}/notes.txt' is a file, not a prepared data folder",
          "burnout data prepare {dir}/notes.txt --out DATA"], setup=lambda d, *_: _notes(d)),
    Case("trace-in-a-folder-of-text", ["data", "trace", "The", "{dir}"],
         ["'{dir}' is not a prepared data folder", "burnout data prepare {dir} --out DATA"],
         setup=lambda d, *_: _notes(d)),
    Case("trace-without-its-data", ["data", "trace", "{dir}/notes.txt"],
         ["data trace needs TEXT and DATA", "'{dir}/notes.txt' alone is one of them"], setup=lambda d, *_: _notes(d)),
    Case("plan-an-empty-yaml", ["plan", "{dir}/run.yaml"], ["{dir}/run.yaml is empty", "write its sections"],
         setup=lambda d, *_: _config(d, "# the sections come later\n")),
    Case("train-an-empty-yaml", ["train", "{dir}/run.yaml", "--out", "{dir}/run"], ["{dir}/run.yaml is empty"],
         setup=lambda d, *_: _config(d, "")),
    # issue 50: ladder and plan by budget
    Case("plan-dollars-on-an-unknown-gpu", ["plan", "--dollars", "100", "--gpu", "h900"],
         ["hardware 'h900' is not in", "choose one of: cpu, t4"]),
    Case("plan-a-negative-budget", ["plan", "--dollars", "-5", "--gpu", "h100"], ["argument --dollars", "-5"]),
    Case("plan-a-budget-too-small-for-any-model", ["plan", "--dollars", "0.0000001", "--gpu", "h100"],
         ["$1e-07 on 1 × NVIDIA H100 80GB SXM buys", "too few for the smallest model", "give a budget"]),
    Case("plan-two-budgets", ["plan", "--dollars", "5", "--hours", "2"], ["one budget", "--dollars and --hours"]),
    Case("plan-a-budget-and-a-config", ["plan", "llama-tiny", "--dollars", "5"], ["--dollars plans a budget"]),
    Case("plan-dollars-without-a-price", ["plan", "--dollars", "5", "--gpu", "cpu"],
         ["--dollars: no price per hour is known for a CPU", "--price"]),
    Case("plan-minutes-without-data", ["plan", "--minutes", "2"], ["--minutes measures a step on your data",
                                                                  "--data DIR"]),
    Case("plan-minutes-on-a-gpu", ["plan", "--minutes", "2", "--gpu", "h100", "--data", "{data}"],
         ["--minutes plans for this machine"]),
    Case("plan-a-ladder-that-is-not-there", ["plan", "--hours", "1", "--ladder", "{dir}/nowhere"],
         ["--ladder {dir}/nowhere: no ladder there", "burnout ladder"]),
    Case("plan-writes-over-a-file", ["plan", "--hours", "1", "--data", "{data}", "--write-config", "{dir}/run.yaml"],
         ["--write-config {dir}/run.yaml: a file or folder is there already"],
         setup=lambda d, *_: _config(d, "mine: true\n")),
    Case("plan-writes-a-config-without-data", ["plan", "--hours", "1", "--write-config", "{dir}/new.yaml"],
         ["--write-config: the run config trains on prepared data"]),
    Case("ladder-without-a-budget", ["ladder", "{data}", "--out", "{dir}/ladder"], ["ladder needs one budget"]),
    Case("ladder-dollars-on-an-unknown-gpu", ["ladder", "{data}", "--out", "{dir}/ladder", "--dollars", "3", "--gpu",
                                              "h900"], ["hardware 'h900' is not in"]),
    Case("ladder-on-a-text-file", ["ladder", "{dir}/notes.txt", "--out", "{dir}/ladder", "--minutes", "5"],
         ["'{dir}/notes.txt' is a file, not a prepared data folder"], setup=lambda d, *_: _notes(d)),
    Case("ladder-into-a-users-folder", ["ladder", "{data}", "--out", "{dir}", "--minutes", "5"],
         ["--out {dir} holds files that are not burnout's (notes.txt)"], setup=lambda d, *_: _notes(d)),
    Case("ladder-too-small-a-budget", ["ladder", "{data}", "--out", "{dir}/ladder", "--minutes", "0.01"],
         ["0.01 minutes is too small for a ladder", "give about"]),
    # issue 50: plan before spending
    Case("train-startup-seconds-negative", ["train", "--data", "{data}", "--model", "llama-tiny", "--out",
                                            "{dir}/run", "--minutes", "1", "train.startup_seconds=-5"],
         ["train.startup_seconds: -5", "is negative", "measured when not given"]),
    Case("plan-mfu-above-one", ["plan", "llama-tiny", "--mfu", "1.5"], ["--mfu", "1.5"]),
    # issue 51: the speedrun and its card
    Case("speedrun-without-a-budget", ["speedrun", "--out", "{dir}/sr"], ["speedrun needs one budget", "--minutes N"]),
    Case("speedrun-two-budgets", ["speedrun", "--out", "{dir}/sr", "--minutes", "3", "--dollars", "2", "--gpu",
                                  "h100"], ["speedrun needs one budget"]),
    Case("speedrun-dollars-without-a-gpu", ["speedrun", "--out", "{dir}/sr", "--dollars", "2"],
         ["--dollars 2: give the GPU whose time it buys, --gpu G"]),
    Case("speedrun-minutes-on-a-gpu", ["speedrun", "--out", "{dir}/sr", "--minutes", "3", "--gpu", "h100"],
         ["--minutes plans for this machine; drop --gpu"]),
    Case("speedrun-dollars-at-no-price", ["speedrun", "--out", "{dir}/sr", "--dollars", "2", "--gpu", "cpu"],
         ["--gpu cpu: no price per hour is known for a CPU", "--minutes N"]),
    Case("speedrun-dollars-on-an-unknown-gpu", ["speedrun", "--out", "{dir}/sr", "--dollars", "2", "--gpu", "h900"],
         ["hardware 'h900' is not in"]),
    Case("speedrun-dollars-too-few", ["speedrun", "--out", "{dir}/sr", "--dollars", "0.00001", "--gpu", "h100"],
         ["too few for the smallest model", "give a budget"]),
    Case("speedrun-rl-without-chat-data", ["speedrun", "--out", "{dir}/sr", "--minutes", "3", "--rl-data",
                                           "{dir}/tasks.jsonl"], ["RL tunes a chat model", "--chat-data FILE"],
         setup=lambda d, *_: _tasks(d, {"answer": "#### 2"})),
    Case("speedrun-a-training-setting", ["speedrun", "--out", "{dir}/sr", "--minutes", "3", "train.lr=1"],
         ["train.lr=1: a speedrun takes data.* and tokenizer.* settings"]),
    Case("speedrun-chat-data-not-there", ["speedrun", "--out", "{dir}/sr", "--minutes", "3", "--chat-data",
                                          "{dir}/nowhere.json"], ["--chat-data {dir}/nowhere.json: no such file"]),
    Case("speedrun-into-a-users-folder", ["speedrun", "--out", "{dir}", "--minutes", "3"],
         ["--out {dir} holds files that are not burnout's (notes.txt)"], setup=lambda d, *_: _notes(d)),
    Case("speedrun-card-elsewhere", ["report", "{dir}/sr", "--out", "{dir}/card"],
         ["a speedrun's card is DIR/report.md and .html", "drop"], setup=lambda d, *_: _speedrun_folder(d / "sr")),
    Case("speedrun-card-of-an-edited-plan", ["report", "{dir}/sr"], ["{dir}/sr/plan.json: cannot be read"],
         setup=lambda d, *_: _speedrun_folder(d / "sr", "{cut sho")),
    # trackers
    Case("train-an-unknown-tracker", ["train", "--data", "{data}", "--model", "llama-tiny", "--out", "{dir}/run",
                                      "--tracker", "mlflow"],
         ["argument --tracker: invalid choice: 'mlflow'", "'tensorboard', 'wandb', 'trackio', 'none'"]),
    Case("train-an-unknown-tracker-key", ["train", "--data", "{data}", "--model", "llama-tiny", "--out", "{dir}/run",
                                          "train.tracker=mlflow"],
         ["train.tracker: 'mlflow' is not one of 'tensorboard', 'wandb', 'trackio'"]),
    Case("resume-with-an-unknown-tracker", ["train", "--resume", "{dir}/run", "train.tracker=mlflow"],
         ["train.tracker: 'mlflow' is not one of"], setup=_copy_run),
    Case("train-both-old-tracker-switches", ["train", "{dir}/run.yaml", "--out", "{dir}/run"],
         ["config.train: tensorboard and wandb are both on", "give train.tracker=tensorboard (or wandb)"],
         setup=lambda d, *_: _config(d, "train:\n  log: {tensorboard: true, wandb: true}\n")),
    # issue 51: a run's sample prompts
    Case("report-with-a-damaged-sample-prompts-record", ["report", "{dir}/run"],
         ["{dir}/run/sample_prompts.json does not hold a run's sample prompts", "delete it"],
         setup=lambda d, data, run: (_copy_run(d, data, run),
                                     (d / "run" / "sample_prompts.json").write_text('{"prompts": "The "}'))),
]


def _speedrun_folder(folder: Path, plan: str = '{"command": {}, "budget": {}, "stages": {}}') -> None:
    """A speedrun's folder as `burnout speedrun` marks it, holding `plan` as its plan.json."""
    folder.mkdir()
    (folder / ".burnout.json").write_text(json.dumps({"kind": "speedrun", "source": "--minutes=3"}))
    (folder / "plan.json").write_text(plan)


def _reward_module(d: Path, name: str, body: str) -> None:
    """An RL task file and the reward module NAME.py whose reward() runs `body`, compiled now (so that importing
    it writes no __pycache__ into the case's folder)."""
    import py_compile

    _tasks(d, {"answer": "#### 2"})
    (d / f"{name}.py").write_text(f"import sys\n\ndef reward(prompt, answer, reference):\n    {body}\n")
    py_compile.compile(str(d / f"{name}.py"), doraise=True)


def _char_data(d: Path) -> None:
    """d/data: a prepared folder of a char tokenizer over lowercase words, commas and full stops (no parentheses)."""
    from burnout.config import DataConfig, SourceConfig, TokenizerConfig
    from burnout.data.prepare import prepare_data

    (d / "play.txt").write_text("".join(f"to be, or not to be, that is the question {i % 7}.\n\n" for i in range(400)))
    prepare_data(DataConfig(sources=[SourceConfig(name="play", kind="text", path=str(d / "play.txt"),
                                                  split_by="paragraph")]),
                 TokenizerConfig(kind="char"), d / "data", warn=lambda line: None)


def _hellaswag(folder: Path) -> None:
    """folder/hellaswag_val_full.txt.bz2: HellaSwag's 6-line records of the words of _char_data's text, and a Q."""
    import bz2

    folder.mkdir(parents=True)
    records = "".join(f"Question {i} to be\n{i % 4}\nto be\nor not\nto be\nthat is\n" for i in range(7))
    (folder / "hellaswag_val_full.txt.bz2").write_bytes(bz2.compress(records.encode()))


def _cut_bz2(path: Path) -> None:
    """A bz2 file cut at half its length, as a download cut short: HellaSwag's 6-line records, or ICL records."""
    import bz2

    if path.name.startswith("hellaswag"):
        text = "".join(f"context {i}\n{i % 4}\nend a\nend b\nend c\nend d\n" for i in range(400))
    else:
        text = "".join(json.dumps({"query": f"q{i}", "choices": ["a", "b"], "gold": 0}) + "\n" for i in range(400))
    blob = bz2.compress(text.encode())
    path.write_bytes(blob[: len(blob) // 2])


def _tasks(d: Path, answer: dict) -> None:
    """An RL task file of one question, its answer field as given."""
    (d / "tasks.jsonl").write_text(json.dumps({"question": "What is 1 plus 1?", **answer}) + "\n")


def _shrink_val(data: Path) -> None:
    """A data folder whose val split is 20 tokens: too short for one 32-token window."""
    meta = json.loads((data / "meta.json").read_text())
    shard = meta["splits"]["val"]["shards"][0]
    blob = (data / shard["file"]).read_bytes()[:40]
    (data / shard["file"]).write_bytes(blob)
    shard.update(tokens=20, sha256=hashlib.sha256(blob).hexdigest())
    for extra in meta["splits"]["val"]["shards"][1:]:
        (data / extra["file"]).unlink()
    meta["splits"]["val"].update(tokens=20, shards=[shard])
    docs = np.load(data / "val_docs.npy")  # the document index keeps the documents that start in those 20 tokens
    kept = docs[docs["start"] < 20]
    np.save(data / "val_docs.npy", kept)
    if "documents" in meta["splits"]["val"]:
        meta["splits"]["val"]["documents"] = len(kept)
    (data / "meta.json").write_text(json.dumps(meta))


def _notes(d: Path) -> None:
    (d / "notes.txt").write_text("\n\n".join(f"note {i}: " + "words " * (i % 30) for i in range(300)))


def _yours(folder: Path, *names: str) -> None:
    """A folder of the user's own, holding files under names burnout writes too."""
    folder.mkdir(parents=True)
    for name in names:
        (folder / name).write_text('{"mine": true}\n')


def _export(run: Path, hf: Path) -> None:
    from burnout.core.checkpoint import list_checkpoints
    from burnout.core.model_files import export_hf

    export_hf(list_checkpoints(run)[0], hf)


def _run_tokenizer(run: Path):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(sorted((run / "checkpoints").iterdir())[-1] / "tokenizer.json"))


def _prefixing(tokenizer):
    """`tokenizer` with a space put before every text: a BPE that llama.cpp's gpt2 tokenizer model cannot hold."""
    from tokenizers import pre_tokenizers

    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    return tokenizer


def _char_tokenizer():
    from burnout.config import TokenizerConfig
    from burnout.data.tokenizer import train_tokenizer

    return train_tokenizer(["To be, or not to be: that is the question.\n"], TokenizerConfig(kind="char"))


def _untrained(run: Path, tokenizer, **model) -> None:
    """A run folder with one checkpoint: an untrained one-layer llama of `tokenizer`, its shape changed by `model`."""
    import torch

    from burnout.config import load_run_config
    from burnout.core.checkpoint import save_checkpoint
    from burnout.models import Transformer

    cfg = load_run_config({"model": {"family": "llama", "vocab_size": tokenizer.get_vocab_size(), "n_layer": 1,
                                     "d_model": 64, "n_head": 4, "context_length": 64, "ffn_multiple_of": 32, **model}})
    torch.manual_seed(0)
    tokenizer.save(str(run.parent / "tokenizer.json"))
    save_checkpoint(run, cfg, Transformer(cfg.model), {"step": 1, "tokens": 64}, {"step": 1, "tokens": 64},
                    run.parent / "tokenizer.json", keep_last=1)


def _grow(run: Path, out: Path) -> None:
    from burnout.core.model_files import grow_run

    grow_run(run, out, ["model.n_layer=3"])


def _retouch_yaml(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, (path, old)
    path.write_text(text.replace(old, new))


def _record_sha256(checkpoint: Path) -> None:
    """Record the sha256 of the checkpoint's files as they are now, as saving it would have."""
    manifest = checkpoint / "sha256.json"
    manifest.write_text(json.dumps({name: hashlib.sha256((checkpoint / name).read_bytes()).hexdigest()
                                    for name in json.loads(manifest.read_text())}))


def _bigger_tokenizer(path: Path) -> None:
    """Another tokenizer: the same one with 600 more tokens than the model has embeddings for."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(path))
    tok.add_tokens([f"<extra_{i}>" for i in range(600)])
    tok.save(str(path))


# `python -m burnout ARGS` for many cases at a fraction of the cost: one interpreter imports torch and
# the CLI once, then forks a child per case that runs burnout/__main__.py exactly as `-m` would (an
# escaping exception prints its traceback and exits 1, as the interpreter does), with its own argv,
# working folder, stdout and stderr. Two children run at a time.
_RUNNER = r"""
import json, os, runpy, sys, traceback
import torch, burnout.cli, burnout.runs, burnout.eval.evaluate, burnout.data.prepare  # imported once
jobs, logs = json.loads(sys.argv[1]), sys.argv[2]
running, codes = {}, {}

def start(job):
    pid = os.fork()
    if pid:
        running[pid] = job["name"]
        return
    try:
        os.chdir(job["cwd"])
        for fd, kind in ((1, "out"), (2, "err")):
            f = os.open(os.path.join(logs, job["name"] + "." + kind), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(f, fd)
        sys.argv = ["burnout", *job["argv"]]
        code = 0
        try:
            runpy.run_module("burnout", run_name="__main__", alter_sys=True)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException:
            traceback.print_exc()
            code = 1
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(locals().get("code", 1))

queue = list(jobs)
while queue or running:
    while queue and len(running) < 2:
        start(queue.pop(0))
    pid, status = os.wait()
    codes[running.pop(pid)] = os.waitstatus_to_exitcode(status)
print(json.dumps(codes))
"""


def run_cli_cases(jobs: list[dict], logs: Path) -> dict[str, tuple[int, str, str]]:
    logs.mkdir(exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run([sys.executable, "-c", _RUNNER, json.dumps(jobs), str(logs)], capture_output=True,
                          text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    codes = json.loads(proc.stdout.splitlines()[-1])
    return {name: (code, (logs / f"{name}.out").read_text(), (logs / f"{name}.err").read_text())
            for name, code in codes.items()}


def _snapshot(root: Path) -> dict[str, tuple[str, int]]:
    return {str(p.relative_to(root)): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def catalogue(tmp_path_factory, tiny_bpe_data, sampled_runs, chat_checkpoint):
    root = tmp_path_factory.mktemp("bad_inputs")
    run = sampled_runs[0]
    for case in CASES:
        d = root / case.name
        d.mkdir()
        if case.setup is not None:
            case.setup(d, tiny_bpe_data, run)
    before = _snapshot(root)
    shared_before = {p: _snapshot(p) for p in (tiny_bpe_data, run, chat_checkpoint.run_dir)}
    subs = {"{data}": str(tiny_bpe_data), "{run}": str(run), "{chat}": str(chat_checkpoint.run_dir)}
    jobs = []
    for case in CASES:
        argv = [a.replace("{dir}", str(root / case.name)) for a in case.argv]
        jobs.append({"name": case.name, "argv": [subs.get(a, a) for a in argv], "cwd": str(root / case.name)})
    results = run_cli_cases(jobs, root / ".logs")
    return root, before, _snapshot(root), shared_before, results


def test_catalogue_has_at_least_25_cases():
    assert len(CASES) >= 25 and len({c.name for c in CASES}) == len(CASES)


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_input_gives_one_clear_line(catalogue, case, tiny_bpe_data):
    root, before, after, _, results = catalogue
    code, out, err = results[case.name]
    assert "Traceback" not in err and "Traceback" not in out, err[-3000:]
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("burnout: error: "), err[-3000:]
    for fragment in case.fragments:  # "{dir}": the case's folder; "{data}": the data folder the runs trained on
        fragment = fragment.replace("{dir}", str(root / case.name)).replace("{data}", str(tiny_bpe_data.resolve()))
        assert fragment in lines[0], lines[0]
    assert code == case.code, (code, lines[0])
    # Nothing that existed was changed; nothing new appeared unless the case may leave an unfinished folder.
    prefix = case.name + os.sep
    for path, stamp in before.items():
        if path.startswith(prefix):
            assert after.get(path) == stamp, f"{path} was changed or removed"
    if not case.creates:
        new = [p for p in after if p.startswith(prefix) and p not in before]
        assert not new, f"created {new}"


@pytest.mark.slow  # the catalogue runs every case as a command
def test_shared_inputs_untouched(catalogue, tiny_bpe_data, sampled_runs):
    *_, shared_before, _ = catalogue
    for path, snap in shared_before.items():
        assert _snapshot(path) == snap, path
