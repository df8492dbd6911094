"""Data stage: corpus mixing, tokenizers, token files and batch loading."""

from burnout.data.clean import Cleaner, clean_text
from burnout.data.corpus import iter_documents, iter_source, mix_documents
from burnout.data.inspect import inspect_data
from burnout.data.loader import TokenLoader, check_compatible
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
