"""Data stage: corpus mixing, tokenizers, token files and batch loading."""

import importlib

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

# Every name is imported from its module only when asked for. Importing a submodule imports this
# package first: eager imports here would give `import burnout.data.shards` (what training and
# evaluation read data with) the tokenizers and tqdm of preparation, and the loader's torch (~170 MB and
# 2 s of import) to every process that only prepares data.
_LAZY = {
    "Cleaner": "burnout.data.clean",
    "clean_text": "burnout.data.clean",
    "iter_documents": "burnout.data.corpus",
    "iter_source": "burnout.data.corpus",
    "mix_documents": "burnout.data.corpus",
    "inspect_data": "burnout.data.inspect",
    "TokenLoader": "burnout.data.loader",
    "check_compatible": "burnout.data.loader",
    "prepare_data": "burnout.data.prepare",
    "load_recipe": "burnout.data.recipe",
    "recipe_names": "burnout.data.recipe",
    "read_meta": "burnout.data.shards",
    "read_tokens": "burnout.data.shards",
    "verify_checksums": "burnout.data.shards",
    "build_tokenizer": "burnout.data.tokenizer",
    "eot_id": "burnout.data.tokenizer",
    "gpt2_tokenizer": "burnout.data.tokenizer",
    "load_tokenizer": "burnout.data.tokenizer",
    "tokenizer_sha256": "burnout.data.tokenizer",
    "train_tokenizer": "burnout.data.tokenizer",
}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
