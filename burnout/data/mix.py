"""Data mixes: burnout/configs/data/NAME.yaml, or any YAML file of the same shape (its sources are mixed by
token share).

    description: one line shown by listings
    data:        a DataConfig: sources (with weights), max_tokens (token budget), max_chars (tokenizer
                 sample), clean / min_chars / dedup / junk_patterns / drop_junk, shard_tokens,
                 val_fraction, seed
    tokenizer:   a TokenizerConfig

Relative paths in a built-in data mix (source path, tokenizer vocab_path/merges_path) are relative to
the repository root; in a data mix file given by path, relative to the current directory.

Your own text needs no data mix: `burnout data prepare` given a text/jsonl/parquet file, a folder or a glob
builds the sections for it (`own_text_sections`; how an argument is told from a data mix: `input_kind`).
`data_run_config` is the run config of `burnout train --data DIR --model PRESET`, which needs no file either.
"""

from __future__ import annotations

import bz2
import codecs
import glob
import gzip
import itertools
import os
import re
from dataclasses import asdict
from pathlib import Path

from burnout.base.files import EOT_TOKEN, TOKENIZER_FILE, not_a_file_or_folder
from burnout.config import (
    CONFIG_DIR,
    DataConfig,
    RunConfig,
    SourceConfig,
    TokenizerConfig,
    apply_override,
    from_dict,
    load_run_config,
    read_yaml,
)
from burnout.data.corpus import _SUFFIXES as FILE_SUFFIXES
from burnout.data.corpus import COMPRESSED_SUFFIXES, source_signature
from burnout.data.shards import META_FILE, read_meta
from burnout.errors import BurnoutError

MIX_DIR = CONFIG_DIR / "data"
_KEYS = {"description", "data", "tokenizer"}


def mix_names() -> list[str]:
    return sorted(p.stem for p in MIX_DIR.glob("*.yaml"))


def is_mix(name_or_path: str | Path) -> bool:
    """A built-in data mix name, or a YAML file holding only data mix sections (not a run config)."""
    if (MIX_DIR / f"{name_or_path}.yaml").is_file():
        return True
    path = Path(name_or_path)
    return path.is_file() and set(read_yaml(path)) <= _KEYS


def load_mix(name_or_path: str | Path, overrides: list[str] = ()) -> tuple[DataConfig, TokenizerConfig]:
    """(data config, tokenizer config) of a built-in data mix name or a data mix YAML path, validated.

    `overrides` are `data.key=value` / `tokenizer.key=value` strings, as on the command line.
    """
    path = Path(name_or_path)
    builtin = MIX_DIR / f"{name_or_path}.yaml"
    if path.is_file():
        base = None
    elif builtin.is_file():
        path, base = builtin, CONFIG_DIR.parent.parent  # the folder holding the burnout package: a checkout's root
    else:
        raise BurnoutError(
            f"data recipe '{name_or_path}' not found; give a YAML path or one of: {', '.join(mix_names())}"
        )
    raw = read_yaml(path)
    for item in overrides:
        apply_override(raw, item)
    unknown = sorted(set(raw) - _KEYS)
    if unknown:
        raise BurnoutError(f"{path}: unknown top-level key '{unknown[0]}'; "
                           f"a data mix has description, data and tokenizer")
    return _sections(raw, base)


def _sections(raw: dict, base: Path | None = None) -> tuple[DataConfig, TokenizerConfig]:
    """The validated data and tokenizer sections of a raw data mix; relative paths made relative to `base`."""
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
    """The data and tokenizer sections of a data mix, or of a run config (which also has them)."""
    if is_mix(name_or_path):
        return load_mix(name_or_path, overrides)
    cfg = load_run_config(name_or_path, overrides)
    return cfg.data, cfg.tokenizer


# ----------------------------------------------------------------------------------------------
# Your own text: `burnout data prepare my.txt | folder/ | '*.jsonl' | file.parquet --out DIR`, no data mix

# Up to this many characters (estimated from file sizes) the whole corpus is the tokenizer's sample and
# the token budget is exactly its tokens; a larger corpus trains the tokenizer on a seeded sample of this
# size and is prepared in full (the budget is an upper bound that the source runs short of).
OWN_SAMPLE_CHARS = 20_000_000
OWN_CLEAN = "lenient"
OWN_VAL_FRACTION = 0.05
# bpe without a size: (up to this many characters, vocabulary), else the last size.
_AUTO_BPE_VOCAB = ((1_000_000, 4096), (100_000_000, 8192), (1_000_000_000, 16384))
_LARGEST_AUTO_VOCAB = 32768
# Compressed files and parquet hold more characters than bytes: their sizes count this many times over.
_PACKED_FACTOR = 10
_SNIFF_BYTES = 64 * 1024
# Files whose start is checked for text before anything is written.
_SNIFF_FILES = 256
_YAML_SUFFIXES = (".yaml", ".yml")
_GLOB_CHARS = frozenset("*?[")
_SECTION_LINE = re.compile(r"(?:description|data|tokenizer|model|train|sft|dpo)\s*:")
TOKENIZER_SPECS = ("bpe, bpe:VOCAB (e.g. bpe:8192), char, gpt2, gpt2:FOLDER (holding vocab.json and merges.txt), or "
                   "an existing tokenizer.json (or a data or checkpoint folder holding one)")


def load_prepare_sections(arg: str, overrides: list[str] = (), *, tokenizer: str | None = None,
                          text_field: str | None = None, split_by: str | None = None, separator: str | None = None,
                          drop: list[str] = ()) -> tuple[DataConfig, TokenizerConfig]:
    """The data and tokenizer sections `burnout data prepare ARG` prepares: a data mix's or run config's, or
    ones built for your own text when ARG is a text/jsonl/parquet file, folder or glob (see `input_kind`).

    `drop`: regular expressions; documents matching any of them are dropped (data.junk_patterns with
    data.drop_junk, counted per pattern and per source in meta.json's cleaning report).
    """
    for pattern in drop:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise BurnoutError(f"--drop {pattern!r} is not a valid regular expression ({exc}); "
                               "quote it for the shell, e.g. --drop '(?i)lorem ipsum'") from None
    kind = input_kind(arg)
    if kind is not None:
        return own_text_sections(arg, kind, overrides, tokenizer=tokenizer, text_field=text_field,
                                 split_by=split_by, separator=separator, drop=drop)
    for flag, value in (("--tokenizer", tokenizer), ("--text-field", text_field), ("--split-by", split_by),
                        ("--separator", separator)):
        if value is not None:
            raise BurnoutError(f"{flag} applies to your own text (a file, folder or glob); '{arg}' is a data mix or "
                               "run config, which sets it in its own sections (e.g. tokenizer.kind=char)")
    data, tok = load_data_sections(arg, overrides)
    if drop:
        counted = [p for p in data.junk_patterns if p not in drop]
        if counted and not data.drop_junk:
            raise BurnoutError(f"--drop: '{arg}' counts junk_patterns without dropping them ({counted[0]!r}), and "
                               "dropping applies to every pattern; add data.drop_junk=true to drop those too, "
                               "or data.junk_patterns=[] to drop only what --drop names")
        data.junk_patterns = [*data.junk_patterns, *(p for p in drop if p not in data.junk_patterns)]
        data.drop_junk = True
        data.validate()
    return data, tok


def input_kind(arg: str) -> str | None:
    """How `burnout data prepare` reads ARG: None for a data mix or run config, else the source kind of your own
    text ('text', 'jsonl' or 'parquet'). By existence, then extension, then content:

    1. an existing folder: your text, of the kind of the data files under it (.txt; .jsonl/.json; .parquet;
       each also .gz/.bz2/.zst); a folder holding several kinds is ambiguous (name one with a glob).
    2. an existing file: .yaml/.yml is a data mix or run config; .jsonl/.json and .parquet are data; any other
       file is YAML when its first line that is not blank or a comment opens a section (`data:`,
       `tokenizer:`, `model:`, `train:`, `description:`, `sft:`, `dpo:`), and text otherwise. A text file
       named like a built-in data mix or config is ambiguous (write ./NAME).
    3. a glob (* ? [): your text, of the kind of the files it matches (several kinds: ambiguous).
    4. a built-in data mix or config name: that data mix or config.
    5. anything else is not found (a missing data file when it ends in a data extension).
    """
    path = Path(os.path.expanduser(arg))
    if path.is_dir():
        return _folder_kind(path)
    if path.is_file():
        kind = _file_kind(path)
        if kind == "text" and is_builtin(arg):
            raise BurnoutError(f"'{arg}' is both a file here and a built-in data mix or config; write ./{arg} for "
                               "the file, or rename it")
        return kind
    if (kind := not_a_file_or_folder(path)) is not None:
        raise BurnoutError(f"'{arg}' is {kind}, not a file or folder: preparing reads its text more than once, "
                           "which a stream cannot give; save the text to a file and give that")
    if _GLOB_CHARS & set(arg):
        return _glob_kind(arg)
    if is_builtin(arg):
        return None
    if _kind_of_name(path.name) is not None or path.suffix.lower() in (".raw", ".tokens", ".md"):
        raise BurnoutError(f"data file '{arg}' does not exist; check the path")
    raise BurnoutError(f"'{arg}' not found: no such file or folder, and no built-in data mix "
                       f"({', '.join(mix_names())}) or config of that name; give your text (a .txt/.jsonl/.parquet "
                       "file, a folder or a quoted glob) or a data mix")


def is_builtin(name: str) -> bool:
    """A built-in data mix (burnout/configs/data/NAME.yaml) or run config (burnout/configs/NAME.yaml) name."""
    return "/" not in name and ((MIX_DIR / f"{name}.yaml").is_file() or (CONFIG_DIR / f"{name}.yaml").is_file())


def _kind_of_name(name: str) -> str | None:
    """The source kind a data file's name says (compression suffix aside), or None."""
    name = name.lower()
    for suffix in COMPRESSED_SUFFIXES:
        name = name.removesuffix(suffix)
    for kind, suffixes in FILE_SUFFIXES.items():
        if name.endswith(suffixes):
            return kind
    return None


def _file_kind(path: Path) -> str | None:
    if path.suffix.lower() in _YAML_SUFFIXES:
        return None
    kind = _kind_of_name(path.name)
    if kind is not None:
        return kind
    return None if _opens_a_section(path) else "text"


def _opens_a_section(path: Path) -> bool:
    """Whether the first line of `path` that is not blank, a comment or `---` opens a config section."""
    try:
        with path.open("rb") as f:
            head = f.read(_SNIFF_BYTES).decode("utf-8", errors="replace")
    except OSError as exc:
        raise BurnoutError(f"cannot read '{path}': {exc.strerror}; check that it exists and is readable") from None
    for line in head.splitlines():
        stripped = line.strip()
        if stripped and not stripped.startswith("#") and stripped != "---":
            return bool(_SECTION_LINE.match(line))
    return False


def _one_kind(kinds: set[str], where: str, narrow: str) -> str:
    if len(kinds) > 1:
        raise BurnoutError(f"{where} holds files of several kinds ({', '.join(sorted(kinds))}); "
                           f"prepare one kind at a time, e.g. '{narrow}'")
    return kinds.pop()


def _folder_kind(folder: Path) -> str:
    if (folder / META_FILE).is_file():
        raise BurnoutError(f"'{folder}' is a prepared data folder already; train on it with "
                           f"`burnout train --data {folder} --model PRESET --out RUN`")
    files = [p for p in folder.rglob("*") if p.is_file()]
    kinds = {kind for p in files if (kind := _kind_of_name(p.name)) is not None}
    if not kinds:
        raise BurnoutError(f"folder '{folder}' holds no .txt, .jsonl/.json or .parquet files; "
                           "point at a folder of text files or at one file")
    return _one_kind(kinds, f"folder '{folder}'", f"{folder}/**/*.jsonl")


def _glob_kind(pattern: str) -> str:
    files = [p for p in glob.glob(os.path.expanduser(pattern), recursive=True) if os.path.isfile(p)]
    if not files:
        raise BurnoutError(f"the pattern '{pattern}' matches no files; check it (and quote it, so that the shell "
                           "does not expand it)")
    kinds = {_kind_of_name(os.path.basename(p)) or "text" for p in files}
    return _one_kind(kinds, f"the pattern '{pattern}'", "data/*.jsonl")


def own_text_sections(arg: str, kind: str, overrides: list[str] = (), *, tokenizer: str | None = None,
                      text_field: str | None = None, split_by: str | None = None, separator: str | None = None,
                      drop: list[str] = ()) -> tuple[DataConfig, TokenizerConfig]:
    """Data and tokenizer sections for one source of your own text (`input_kind`'s kind): every document of it,
    cleaned `lenient`, 5% to val, the tokenizer from `tokenizer` (`tokenizer_spec`, default bpe sized to
    the corpus). Text is split at lines holding only <|endoftext|> when it has them, else into paragraphs when
    blank lines separate blocks of it, else into lines (`split_by` chooses: file, paragraph or line; `separator`
    splits at each occurrence of that string); jsonl and parquet read `text_field` (default "text").
    `overrides`: data.KEY=VALUE / tokenizer.KEY=VALUE on top."""
    if text_field is not None and kind == "text":
        raise BurnoutError(f"--text-field applies to .jsonl and .parquet files; '{arg}' is text")
    for flag, value in (("--split-by", split_by), ("--separator", separator)):
        if value is not None and kind != "text":
            raise BurnoutError(f"{flag} applies to text files; '{arg}' is {kind}, one document per record")
    if split_by is not None and separator is not None:
        raise BurnoutError(f"--split-by {split_by} and --separator each say where documents end; give one of them")
    source = {"name": _source_name(arg), "kind": kind, "path": os.path.abspath(os.path.expanduser(arg))}
    files = _readable_files(arg, source)
    packed = kind == "parquet"
    chars = sum(size * (_PACKED_FACTOR if packed or p.name.lower().endswith(COMPRESSED_SUFFIXES) else 1)
                for p, size in files)
    if kind == "text":
        if separator is not None:
            source.update(split_by="separator", separator=separator)
        else:
            source.update({"split_by": split_by} if split_by else auto_split([p for p, _ in files]))
    else:
        source["text_field"] = text_field or "text"
    data: dict = {"sources": [source], "clean": OWN_CLEAN, "val_fraction": OWN_VAL_FRACTION}
    if chars <= OWN_SAMPLE_CHARS:
        data["max_chars"] = chars
    else:
        data.update(max_chars=OWN_SAMPLE_CHARS, max_tokens=2 * chars)  # every character and end of document
    if drop:
        data.update(junk_patterns=list(dict.fromkeys(drop)), drop_junk=True)
    raw = {"data": data, "tokenizer": tokenizer_spec(tokenizer or "bpe", chars)}
    for item in overrides:
        apply_override(raw, item)
    unknown = sorted(set(raw) - {"data", "tokenizer"})
    if unknown:
        raise BurnoutError(f"override '{unknown[0]}.…' does not apply to data prepare; "
                           "give data.KEY=VALUE or tokenizer.KEY=VALUE")
    return _sections(raw)


def _source_name(arg: str) -> str:
    """The source's name in meta.json: the file's name without extensions, the folder's or the glob's folder's."""
    parts = Path(os.path.expanduser(arg)).parts
    if _GLOB_CHARS & set(arg):
        parts = tuple(itertools.takewhile(lambda part: not _GLOB_CHARS & set(part), parts))
        return (parts[-1] if parts and parts[-1] not in ("/", ".", "..") else "") or "text"
    path = Path(os.path.abspath(os.path.expanduser(arg)))
    if path.is_dir():
        return path.name or "text"
    name = path.name
    for suffix in COMPRESSED_SUFFIXES:
        name = name.removesuffix(suffix)
    return Path(name).stem or name


def _readable_files(arg: str, source: dict) -> list[tuple[Path, int]]:
    """(path, bytes) of each file the source reads; an unreadable file or no text at all is an error."""
    files = [(Path(p), size) for p, size, _ in source_signature(from_dict(SourceConfig, source, "source"))]
    for path, _ in files:
        if not os.access(path, os.R_OK):
            raise BurnoutError(f"cannot read data file '{path}': permission denied; check its permissions")
    if not sum(size for _, size in files):
        what = f"data file '{arg}' is" if len(files) == 1 else f"every file of '{arg}' is"
        raise BurnoutError(f"{what} empty; give text to train on")
    if source["kind"] != "parquet":
        for path, _ in files[:_SNIFF_FILES]:
            _check_text_head(path)
    return files


def _check_text_head(path: Path) -> None:
    """Refuse a file whose start is binary or not UTF-8 before anything is written (compressed files aside)."""
    if path.name.lower().endswith(COMPRESSED_SUFFIXES):
        return
    try:
        with path.open("rb") as f:
            head = f.read(_SNIFF_BYTES)
    except OSError as exc:
        raise BurnoutError(f"cannot read data file '{path}': {exc.strerror}; check its permissions") from None
    if b"\x00" in head:
        raise BurnoutError(f"data file '{path}' contains NUL bytes, so it looks binary; use UTF-8 text files only")
    try:
        codecs.getincrementaldecoder("utf-8")().decode(head, final=False)  # a character cut at the end is fine
    except UnicodeDecodeError as exc:
        raise BurnoutError(f"data file '{path}' is not UTF-8 (invalid byte at offset {exc.start}); "
                           "convert it to UTF-8") from None


def auto_split(files: list[Path]) -> dict:
    """How the first files (their first 64 KiB) are split into documents, as a text source's split_by (and
    separator): at lines holding only <|endoftext|> when there are some (GPT-2's separator, the one a corpus
    written out of a tokenized one shows), else into paragraphs when blank lines separate blocks of text, else
    into lines."""
    paragraphs = False
    for path in files[:16]:
        opener = {".gz": gzip.open, ".bz2": bz2.open}.get(path.suffix.lower(), open)
        if path.name.lower().endswith(".zst"):
            continue
        try:
            with opener(path, "rb") as f:
                lines = f.read(_SNIFF_BYTES).splitlines()
        except (OSError, EOFError):
            continue
        if any(line.strip() == EOT_TOKEN.encode() for line in lines):
            return {"split_by": "separator", "separator": EOT_TOKEN}
        text = [bool(line.strip()) for line in lines[:-1]]  # the last line may be cut short
        first = text.index(True) if True in text else len(text)
        last = len(text) - 1 - text[::-1].index(True) if True in text else -1
        paragraphs = paragraphs or not all(text[first : last + 1])
    return {"split_by": "paragraph" if paragraphs else "line"}


def given_tokenizer(spec: str | None) -> Path | None:
    """The tokenizer file `--tokenizer SPEC` names when SPEC is an existing tokenizer.json or a folder holding one
    (a data folder, a checkpoint: e.g. the run a continued run starts from), to encode with as it is; None when
    SPEC is a kind to train (tokenizer_spec) or not given."""
    if spec is None:
        return None
    path = Path(os.path.expanduser(spec))
    if path.is_file():
        return path
    if not path.is_dir():
        return None
    if not (path / TOKENIZER_FILE).is_file():
        raise BurnoutError(f"--tokenizer {spec}: the folder holds no {TOKENIZER_FILE}; give a tokenizer.json, a "
                           "prepared data folder or a checkpoint folder (RUN/checkpoints/step_N)")
    return path / TOKENIZER_FILE


def tokenizer_spec(spec: str, corpus_chars: int = 0) -> dict:
    """The tokenizer section `--tokenizer SPEC` names: bpe (its vocabulary sized to `corpus_chars`), bpe:VOCAB,
    char, gpt2 (GPT-2's files from shared/data/gpt2_tokenizer, looked for in ./shared/data, ../shared/data and
    next to the checkout) or gpt2:FOLDER."""
    kind, sep, value = spec.strip().partition(":")
    kind = kind.lower()
    if kind == "bpe":
        if not sep:
            vocab = next((v for limit, v in _AUTO_BPE_VOCAB if corpus_chars <= limit), _LARGEST_AUTO_VOCAB)
            return {"kind": "bpe", "vocab_size": vocab}
        try:
            vocab = int(value.replace("_", "").replace(",", ""))
        except ValueError:
            vocab = 0
        if vocab < 257:
            raise BurnoutError(f"--tokenizer '{spec}': the vocabulary must be a whole number of at least 257 "
                               "(256 bytes + <|endoftext|>), e.g. bpe:8192")
        return {"kind": "bpe", "vocab_size": vocab}
    if kind == "char" and not sep:
        return {"kind": "char"}
    if kind == "gpt2":
        folder = Path(os.path.expanduser(value)) if sep else _gpt2_folder()
        missing = [name for name in ("vocab.json", "merges.txt") if not (folder / name).is_file()]
        if missing:
            raise BurnoutError(f"--tokenizer '{spec}': '{folder}' has no {missing[0]}; give gpt2:FOLDER, the folder "
                               "holding GPT-2's vocab.json and merges.txt")
        folder = folder.resolve()
        return {"kind": "gpt2", "vocab_path": str(folder / "vocab.json"), "merges_path": str(folder / "merges.txt")}
    raise BurnoutError(f"--tokenizer '{spec}' is not a tokenizer; use {TOKENIZER_SPECS}")


def _gpt2_folder() -> Path:
    candidates = [Path("shared/data/gpt2_tokenizer"), Path("../shared/data/gpt2_tokenizer"),
                  CONFIG_DIR.parent.parent.parent / "shared" / "data" / "gpt2_tokenizer"]
    for folder in candidates:
        if (folder / "vocab.json").is_file() and (folder / "merges.txt").is_file():
            return folder
    return candidates[0]


# ----------------------------------------------------------------------------------------------
# Training a prepared folder without a config: `burnout train --data DIR --model PRESET --out RUN`


def preset_train_section() -> dict:
    """The train section a model preset trains with when no config gives one: the quickstart's, its seq_len left to
    the model's context."""
    train = dict(read_yaml(CONFIG_DIR / "quickstart.yaml").get("train") or {})
    train.pop("seq_len", None)
    return train


def data_run_config(data_dir: str | Path, preset: str, overrides: list[str] = ()) -> RunConfig:
    """The run config that trains model preset `preset` on the prepared folder `data_dir`: the preset with the
    data's vocabulary size, the data's own data and tokenizer sections (prepared_dir set), and the
    quickstart's train section with seq_len left to the model's context; then `overrides`. A model
    vocabulary smaller than the data's is refused."""
    data_dir = Path(data_dir)
    meta = read_meta(data_dir)
    raw = {"model": {"preset": preset, "vocab_size": meta["vocab_size"]}, "train": preset_train_section(),
           "data": {"prepared_dir": str(data_dir.resolve())}}
    try:  # the sections the data was prepared from, when this version reads them
        data = {**asdict(from_dict(DataConfig, meta.get("data_config") or {}, "data")),
                "prepared_dir": str(data_dir.resolve())}
        raw.update(data=data, tokenizer=asdict(from_dict(TokenizerConfig, meta.get("tokenizer_config") or {},
                                                          "tokenizer")))
    except BurnoutError:
        pass
    cfg = load_run_config(raw, overrides)
    if cfg.model.vocab_size < meta["vocab_size"]:
        raise BurnoutError(f"model.vocab_size: {cfg.model.vocab_size:,} is smaller than the {meta['vocab_size']:,} "
                           f"tokens of {data_dir}'s tokenizer; drop the override (the model takes the data's "
                           "vocabulary)")
    return cfg
