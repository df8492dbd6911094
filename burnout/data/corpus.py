"""Documents in, mixed train/val document lists out.

A source lists its documents as cheap readers (one callable per document) so that mixing can shuffle
the whole source but read only the documents it keeps: a large folder or jsonl file costs a directory
walk or a line scan, not a full read, when the mix needs a small slice of it.

The default corpus needs no download: English prose from the documentation topics shipped with
Python (`pydoc_data`) and the source code of the standard library itself.
"""

from __future__ import annotations

import ast
import glob
import json
import os
import sysconfig
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import numpy as np

from burnout.config import DataConfig, SourceConfig
from burnout.errors import BurnoutError

# A reader returns one document's text, or None when the document is to be skipped (empty, or a
# stdlib file that does not decode).
DocumentReader = Callable[[], "str | None"]

# Test suites are mostly fixtures and assertions, idlelib/lib2to3 are tools rather than library code;
# site-packages holds third-party code that differs between installations.
_STDLIB_SKIPPED_DIRS = frozenset({"site-packages", "dist-packages", "test", "tests", "idlelib", "lib2to3", "__pycache__"})
_GLOB_CHARS = frozenset("*?[")
# Modules with less docstring text than this are mostly one-liners: little prose to learn from.
_MIN_DOCSTRING_CHARS = 500
# Distinct seed sequences so that the per-source samples and the interleaving are independent streams.
_SOURCE_STREAM, _INTERLEAVE_STREAM = 0, 1


def iter_documents(source: SourceConfig) -> Iterator[str]:
    """Every non-empty document of `source`, in a deterministic order."""
    for read in document_readers(source):
        text = read()
        if text:
            yield text


def document_readers(source: SourceConfig) -> list[DocumentReader]:
    if source.kind == "stdlib_docs":
        return _stdlib_docs_readers()
    if source.kind == "stdlib_code":
        return [partial(_read_stdlib_file, path) for path in stdlib_code_files()]
    if source.kind == "text":
        return [partial(_read_user_file, path) for path in _resolve_files(source, ".txt")]
    if source.kind == "jsonl":
        readers: list[DocumentReader] = []
        for path in _resolve_files(source, ".jsonl"):
            readers.extend(_jsonl_readers(path, source.text_field))
        return readers
    raise BurnoutError(f"data source '{source.name}': unknown kind '{source.kind}'; use stdlib_docs, stdlib_code, text or jsonl")


# ----------------------------------------------------------------------------------------------
# Mixing


@dataclass
class MixedCorpus:
    train_docs: list[str] = field(default_factory=list)
    val_docs: list[str] = field(default_factory=list)
    # Index into cfg.sources of each document, parallel to train_docs / val_docs.
    train_sources: list[int] = field(default_factory=list)
    val_sources: list[int] = field(default_factory=list)
    report: dict = field(default_factory=dict)


def mix_documents(cfg: DataConfig) -> tuple[list[str], list[str], dict]:
    """(train_docs, val_docs, report) of the weighted, seeded mix described by `cfg`."""
    mixed = mix_corpus(cfg)
    return mixed.train_docs, mixed.val_docs, mixed.report


def mix_corpus(cfg: DataConfig) -> MixedCorpus:
    cfg.validate()
    total_weight = sum(s.weight for s in cfg.sources)
    mixed = MixedCorpus()
    per_source: dict[str, dict] = {}
    for index, source in enumerate(cfg.sources):
        if source.weight == 0:
            continue
        budget = int(cfg.max_chars * source.weight / total_weight)
        # Seeding by name keeps a source's sample unchanged when other sources are added or reordered.
        rng = np.random.default_rng([cfg.seed, _SOURCE_STREAM, zlib.crc32(source.name.encode())])
        docs = _take_documents(source, budget, rng)
        num_val = _num_val_docs(len(docs), cfg.val_fraction)
        # docs are already in shuffled order, so the tail is a seeded random val sample.
        train, val = docs[: len(docs) - num_val], docs[len(docs) - num_val :]
        mixed.train_docs += train
        mixed.train_sources += [index] * len(train)
        mixed.val_docs += val
        mixed.val_sources += [index] * len(val)
        chars = sum(map(len, docs))
        per_source[source.name] = {
            "kind": source.kind,
            "weight": source.weight,
            "budget_chars": budget,
            "chars": chars,
            "shortfall_chars": budget - chars,
            "documents": len(docs),
            "train_documents": len(train),
            "val_documents": len(val),
        }

    interleave = np.random.default_rng([cfg.seed, _INTERLEAVE_STREAM]).permutation(len(mixed.train_docs))
    mixed.train_docs = [mixed.train_docs[i] for i in interleave]
    mixed.train_sources = [mixed.train_sources[i] for i in interleave]

    total_chars = sum(entry["chars"] for entry in per_source.values())
    for entry in per_source.values():
        entry["share"] = entry["chars"] / total_chars
    mixed.report = {
        "per_source": per_source,
        "total": {
            "chars": total_chars,
            "documents": len(mixed.train_docs) + len(mixed.val_docs),
            "train_documents": len(mixed.train_docs),
            "val_documents": len(mixed.val_docs),
        },
    }
    return mixed


def _take_documents(source: SourceConfig, budget: int, rng: np.random.Generator) -> list[str]:
    """Documents of `source` in seeded random order until `budget` characters are taken."""
    readers = document_readers(source)
    docs: list[str] = []
    remaining = budget
    found_text = False
    for i in rng.permutation(len(readers)):
        if remaining <= 0:
            break
        text = readers[i]()
        if not text:
            continue
        found_text = True
        docs.append(text[:remaining])
        remaining -= len(docs[-1])
    if not found_text:
        raise BurnoutError(
            f"data source '{source.name}' ({_describe_location(source)}) contains no text; "
            "point it at non-empty files or remove it from data.sources"
        )
    return docs


def _num_val_docs(num_docs: int, val_fraction: float) -> int:
    if num_docs < 2:
        return 0
    return min(max(round(num_docs * val_fraction), 1), num_docs - 1)


# ----------------------------------------------------------------------------------------------
# Standard-library sources


def _stdlib_docs_readers() -> list[DocumentReader]:
    """The language reference topics, then the docstrings of each stdlib module as one document.

    The topics alone hold under half a million characters; the docstrings add the library reference
    prose that `help()` shows, several times as much.
    """
    from pydoc_data.topics import topics

    readers: list[DocumentReader] = [partial(topics.get, key) for key in sorted(topics)]
    readers.extend(partial(_read_stdlib_docstrings, path) for path in stdlib_code_files())
    return readers


def _read_stdlib_docstrings(path: Path) -> str | None:
    """A module's docstrings (module, classes, functions) joined by blank lines; None when scant."""
    source = _read_stdlib_file(path)
    if source is None:
        return None
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    kinds = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    docs = [doc for node in ast.walk(tree) if isinstance(node, kinds) and (doc := ast.get_docstring(node))]
    text = "\n\n".join(docs)
    return text if len(text) >= _MIN_DOCSTRING_CHARS else None


def stdlib_code_files() -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    files: list[Path] = []
    for folder, subdirs, names in os.walk(root):
        subdirs[:] = [d for d in subdirs if d not in _STDLIB_SKIPPED_DIRS]
        files.extend(Path(folder) / name for name in names if name.endswith(".py"))
    return sorted(files)


def _read_stdlib_file(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        # A handful of stdlib files are deliberately in other encodings; they are not worth failing over.
        return None


# ----------------------------------------------------------------------------------------------
# User files


def _resolve_files(source: SourceConfig, suffix: str) -> list[Path]:
    """The files a text/jsonl source names: one file, every `suffix` file under a folder, or a glob."""
    raw = os.path.expanduser(source.path)
    if _GLOB_CHARS & set(raw):
        files = sorted(Path(p) for p in glob.glob(raw, recursive=True) if Path(p).is_file())
        if not files:
            raise BurnoutError(f"data source '{source.name}': the pattern '{raw}' matches no files; check data.sources path")
        return files
    path = Path(raw)
    if path.is_file():
        return [path]
    if path.is_dir():
        files = sorted(p for p in path.rglob(f"*{suffix}") if p.is_file())
        if not files:
            raise BurnoutError(f"data source '{source.name}': folder '{path}' has no {suffix} files; add some or fix the path")
        return files
    raise BurnoutError(f"data source '{source.name}': path '{path}' does not exist; fix data.sources path")


def _read_user_file(path: Path) -> str:
    return _decode_user_bytes(_read_bytes(path), str(path))


def _read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise BurnoutError(f"cannot read data file '{path}': {exc.strerror}") from None


def _decode_user_bytes(raw: bytes, where: str) -> str:
    if b"\x00" in raw:
        raise BurnoutError(f"data file '{where}' contains NUL bytes, so it looks binary; use UTF-8 text files only")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise BurnoutError(
            f"data file '{where}' is not UTF-8 (invalid byte at offset {exc.start}); convert it to UTF-8"
        ) from None


def _jsonl_readers(path: Path, text_field: str) -> list[DocumentReader]:
    """One reader per non-blank line, remembering only the line's byte offset."""
    readers: list[DocumentReader] = []
    try:
        with path.open("rb") as f:
            offset = 0
            for line_number, line in enumerate(f, start=1):
                if line.strip():
                    readers.append(partial(_read_jsonl_line, path, offset, line_number, text_field))
                offset += len(line)
    except OSError as exc:
        raise BurnoutError(f"cannot read data file '{path}': {exc.strerror}") from None
    return readers


def _read_jsonl_line(path: Path, offset: int, line_number: int, text_field: str) -> str:
    where = f"{path}:{line_number}"
    with path.open("rb") as f:
        f.seek(offset)
        line = _decode_user_bytes(f.readline(), where)
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise BurnoutError(f"data file '{where}' is not valid JSON ({exc.msg}); fix or remove that line") from None
    if not isinstance(record, dict) or text_field not in record:
        raise BurnoutError(f"data file '{where}' has no field '{text_field}'; set the source's text_field to the right key")
    text = record[text_field]
    if not isinstance(text, str):
        raise BurnoutError(f"data file '{where}': field '{text_field}' is {type(text).__name__}, expected a string")
    return text


def _describe_location(source: SourceConfig) -> str:
    if source.kind in ("text", "jsonl"):
        return f"path '{source.path}'"
    return f"kind {source.kind}"
