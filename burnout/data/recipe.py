"""Data recipes: burnout/configs/data/NAME.yaml, or any YAML file of the same shape.

    description: one line shown by listings
    data:        a DataConfig: sources (with weights), max_tokens (token budget), max_chars (tokenizer
                 sample), clean / min_chars / dedup / junk_patterns / drop_junk, shard_tokens,
                 val_fraction, seed
    tokenizer:   a TokenizerConfig

Relative paths in a built-in recipe (source path, tokenizer vocab_path/merges_path) are relative to
the repository root; in a recipe file given by path, relative to the current directory.
"""

from __future__ import annotations

import os
from pathlib import Path

from burnout.config import CONFIG_DIR, DataConfig, TokenizerConfig, apply_override, from_dict, read_yaml
from burnout.errors import BurnoutError

RECIPE_DIR = CONFIG_DIR / "data"
_KEYS = {"description", "data", "tokenizer"}


def recipe_names() -> list[str]:
    return sorted(p.stem for p in RECIPE_DIR.glob("*.yaml"))


def is_recipe(name_or_path: str | Path) -> bool:
    """A built-in recipe name, or a YAML file holding only recipe sections (not a run config)."""
    if (RECIPE_DIR / f"{name_or_path}.yaml").is_file():
        return True
    path = Path(name_or_path)
    return path.is_file() and set(read_yaml(path)) <= _KEYS


def load_recipe(name_or_path: str | Path, overrides: list[str] = ()) -> tuple[DataConfig, TokenizerConfig]:
    """(data config, tokenizer config) of a built-in recipe name or a recipe YAML path, validated.

    `overrides` are `data.key=value` / `tokenizer.key=value` strings, as on the command line.
    """
    path = Path(name_or_path)
    builtin = RECIPE_DIR / f"{name_or_path}.yaml"
    if path.is_file():
        base = None
    elif builtin.is_file():
        path, base = builtin, CONFIG_DIR.parent.parent  # the folder holding the burnout package: a checkout's root
    else:
        raise BurnoutError(
            f"data recipe '{name_or_path}' not found; give a YAML path or one of: {', '.join(recipe_names())}"
        )
    raw = read_yaml(path)
    for item in overrides:
        apply_override(raw, item)
    unknown = sorted(set(raw) - _KEYS)
    if unknown:
        raise BurnoutError(f"{path}: unknown top-level key '{unknown[0]}'; "
                           f"a recipe has description, data and tokenizer")
    data = from_dict(DataConfig, raw.get("data") or {}, "data")
    tok = from_dict(TokenizerConfig, raw.get("tokenizer") or {}, "tokenizer")
    if base is not None:
        for source in data.sources:
            if source.path and not os.path.isabs(os.path.expanduser(source.path)):
                source.path = str(base / source.path)
        for key in ("vocab_path", "merges_path"):
            value = getattr(tok, key)
            if value and not os.path.isabs(os.path.expanduser(value)):
                setattr(tok, key, str(base / value))
    data.validate()
    tok.validate()
    return data, tok


def load_data_sections(name_or_path: str | Path, overrides: list[str] = ()) -> tuple[DataConfig, TokenizerConfig]:
    """The data and tokenizer sections of a recipe, or of a run config (which also has them)."""
    if is_recipe(name_or_path):
        return load_recipe(name_or_path, overrides)
    from burnout.config import load_run_config

    cfg = load_run_config(name_or_path, overrides)
    return cfg.data, cfg.tokenizer
