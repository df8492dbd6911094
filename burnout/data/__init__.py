"""Data stage: corpus mixing, tokenizers, token files and batch loading."""

import importlib
from burnout.data.clean import Cleaner, clean_text
from burnout.data.corpus import iter_documents, iter_source, mix_documents
from burnout.data.inspect import inspect_data
from burnout.data.prepare import prepare_data, read_meta, read_tokens, verify_checksums
from burnout.data.recipe import load_recipe, recipe_names
from burnout.data.tokenizer import (
    build_tokenizer,
    eot_id,
    gpt2_tokenizer,
    load_tokenizer,
    tokenizer_sha256,
    train_tokenizer,
)

__all__ = [
    "Cleaner",
    "build_tokenizer",
    "clean_text",
    "gpt2_tokenizer",
    "inspect_data",
    "iter_source",
    "load_recipe",
    "read_tokens",
    "recipe_names",
    "verify_checksums",
    "TokenLoader",
    "check_compatible",
    "eot_id",
    "iter_documents",
    "load_tokenizer",
    "mix_documents",
    "prepare_data",
    "read_meta",
    "tokenizer_sha256",
    "train_tokenizer",
]

# The loader needs torch; importing it only when asked keeps `burnout data prepare` (and every process
# that only prepares data) free of torch's ~170 MB and 2 s of import.
_LAZY = {"TokenLoader": "burnout.data.loader", "check_compatible": "burnout.data.loader"}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
