"""Documents in: every source kind, in a natural or a seeded order, plus the character-budget mix.

Each source is opened as an index that can list its documents in a seeded random order without
holding their text: a folder or jsonl file costs a directory walk or a line scan (byte offsets in
numpy arrays), not a full read, and only the documents consumed are read. Parquet files are shuffled
two-level (row groups, then rows within a group) so that a row group is read once; Hugging Face
datasets are streamed through a seeded shuffle buffer (HF_SHUFFLE_BUFFER records). Compressed files
(.gz, .bz2, .zst) cannot be seeked into, so each one is decompressed into memory when its source is
opened.

The default corpus needs no download: English prose from the documentation topics shipped with
Python (`pydoc_data`) and the source code of the standard library itself.
"""

from __future__ import annotations

import ast
import bz2
import glob
import gzip
import hashlib
import io
import json
import os
import sys
import sysconfig
import urllib.request
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import numpy as np

from burnout.base.files import not_a_file_or_folder
from burnout.base.text import first_line, install_extra
from burnout.config import DataConfig, SourceConfig
from burnout.data.clean import Cleaner
from burnout.errors import BurnoutError

# A reader returns one document's text, or None when the document is to be skipped (empty, or a
# stdlib file that does not decode).
DocumentReader = Callable[[], "str | None"]

# Test suites are mostly fixtures and assertions, idlelib/lib2to3 are tools rather than library code;
# site-packages holds third-party code that differs between installations.
_STDLIB_SKIPPED_DIRS = frozenset({"site-packages", "dist-packages", "test", "tests", "idlelib", "lib2to3",
                                  "__pycache__"})
_GLOB_CHARS = frozenset("*?[")
# Modules with less docstring text than this are mostly one-liners: little prose to learn from.
_MIN_DOCSTRING_CHARS = 500
# Distinct seed sequences so that the per-source samples and the interleaving are independent streams.
_SOURCE_STREAM, _INTERLEAVE_STREAM = 0, 1
COMPRESSED_SUFFIXES = (".gz", ".bz2", ".zst")
_SUFFIXES = {"text": (".txt",), "jsonl": (".jsonl", ".json"), "parquet": (".parquet",)}
# Records an hf source keeps in its shuffle buffer: its order is random within this window.
HF_SHUFFLE_BUFFER = 10_000


def iter_documents(source: SourceConfig) -> Iterator[str]:
    """Every non-empty document of `source`, in a deterministic (natural) order."""
    for text in open_source(source).natural():
        if text:
            yield text


def iter_source(source: SourceConfig, seed: int) -> Iterator[str]:
    """Every non-empty document of `source` in the seeded order mixing uses (same seed, same order).

    Raises a BurnoutError naming the source when it holds no text at all.
    """
    rng = source_rng(source, seed)
    found = False
    for text in open_source(source).shuffled(rng):
        if text:
            found = True
            yield text
    if not found:
        raise BurnoutError(
            f"data source '{source.name}' ({_describe_location(source)}) contains no text; "
            "point it at non-empty files or remove it from data.sources"
        )


def source_signature(source: SourceConfig) -> list:
    """What tells the current contents of a source apart without reading it: (path, bytes, mtime) of each
    file, the Python version for the stdlib; nothing beyond its config for a Hugging Face dataset."""
    if source.kind in ("stdlib_docs", "stdlib_code"):
        return [sys.version]
    if source.kind == "hf":
        return []
    return [[str(path), path.stat().st_size, path.stat().st_mtime_ns] for path in _resolve_files(source)]


def source_rng(source: SourceConfig, seed: int) -> np.random.Generator:
    # Seeding by name keeps a source's sample unchanged when other sources are added or reordered.
    return np.random.default_rng([seed, _SOURCE_STREAM, zlib.crc32(source.name.encode())])


def interleave_rng(seed: int, split: str) -> np.random.Generator:
    return np.random.default_rng([seed, _INTERLEAVE_STREAM, zlib.crc32(split.encode())])


def open_source(source: SourceConfig) -> _SourceIndex:
    if source.kind == "stdlib_docs":
        return _ReaderIndex(_stdlib_docs_readers())
    if source.kind == "stdlib_code":
        return _ReaderIndex([partial(_read_stdlib_file, path) for path in stdlib_code_files()])
    if source.kind == "text":
        files = _resolve_files(source)
        if source.split_by == "file":
            return _ReaderIndex([partial(_read_user_file, path) for path in files])
        return _OffsetIndex(files, mode=source.split_by, separator=source.separator)
    if source.kind == "jsonl":
        return _OffsetIndex(_resolve_files(source), mode="jsonl", text_field=source.text_field)
    if source.kind == "parquet":
        return _ParquetIndex(_resolve_files(source), source.text_field)
    if source.kind == "hf":
        return _HFIndex(source)
    raise BurnoutError(
        f"data source '{source.name}': unknown kind '{source.kind}'; "
        f"use stdlib_docs, stdlib_code, text, jsonl, parquet or hf"
    )


# ----------------------------------------------------------------------------------------------
# Mixing by characters (the sample a tokenizer is trained on)


@dataclass
class MixedCorpus:
    train_docs: list[str] = field(default_factory=list)
    val_docs: list[str] = field(default_factory=list)
    # Index into cfg.sources of each document, parallel to train_docs / val_docs.
    train_sources: list[int] = field(default_factory=list)
    val_sources: list[int] = field(default_factory=list)
    report: dict = field(default_factory=dict)


def mix_documents(cfg: DataConfig) -> tuple[list[str], list[str], dict]:
    """(train_docs, val_docs, report) of the weighted, seeded character mix described by `cfg`."""
    mixed = mix_corpus(cfg)
    return mixed.train_docs, mixed.val_docs, mixed.report


def mix_corpus(cfg: DataConfig, cleaner: Cleaner | None = None) -> MixedCorpus:
    """Each source's first weight/sum(weights) * cfg.max_chars characters, in its seeded order.

    `cleaner` maps each document before it is counted; None drops it.
    """
    cfg.validate()
    total_weight = sum(s.weight for s in cfg.sources)
    mixed = MixedCorpus()
    per_source: dict[str, dict] = {}
    for index, source in enumerate(cfg.sources):
        if source.weight == 0:
            continue
        budget = int(cfg.max_chars * source.weight / total_weight)
        docs = _take_documents(source, budget, cfg.seed, cleaner)
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


def _take_documents(source: SourceConfig, budget: int, seed: int, cleaner: Cleaner | None) -> list[str]:
    """Documents of `source` in seeded random order until `budget` characters are taken."""
    docs: list[str] = []
    remaining = budget
    if remaining <= 0:
        return docs
    kept_any = False
    for text in iter_source(source, seed):
        if cleaner is not None:
            text = cleaner(text, source.name)
            if not text:
                continue
        kept_any = True
        docs.append(text[:remaining])
        remaining -= len(docs[-1])
        if remaining <= 0:
            break
    if not kept_any and cleaner is None:  # an empty stream (an hf split, say): files with no text are refused earlier
        raise BurnoutError(f"data source '{source.name}' gave no document; point it at some text")
    if not kept_any:
        raise BurnoutError(f"data source '{source.name}': no document is left: every one was dropped "
                           f"({cleaner.why_dropped(source.name)}); change the setting that dropped them")
    return docs


def _num_val_docs(num_docs: int, val_fraction: float) -> int:
    if num_docs < 2:
        return 0
    return min(max(round(num_docs * val_fraction), 1), num_docs - 1)


# ----------------------------------------------------------------------------------------------
# Source indexes


class _SourceIndex:
    def natural(self) -> Iterator[str | None]:
        raise NotImplementedError

    def shuffled(self, rng: np.random.Generator) -> Iterator[str | None]:
        raise NotImplementedError


class _ReaderIndex(_SourceIndex):
    def __init__(self, readers: list[DocumentReader]) -> None:
        self.readers = readers

    def natural(self) -> Iterator[str | None]:
        for read in self.readers:
            yield read()

    def shuffled(self, rng: np.random.Generator) -> Iterator[str | None]:
        for i in rng.permutation(len(self.readers)):
            yield self.readers[i]()


class _OffsetIndex(_SourceIndex):
    """Documents as (file, byte offset, byte length): one per line, per blank-line block, per piece between
    separators, or jsonl record."""

    def __init__(self, files: list[Path], mode: str, text_field: str = "text", separator: str | None = None) -> None:
        self.files = files
        self.mode = mode
        self.text_field = text_field
        self._memory: dict[int, bytes] = {}  # decompressed contents of compressed files
        file_ids, offsets, lengths, lines = [], [], [], []
        for file_id, path in enumerate(files):
            if _is_compressed(path):
                self._memory[file_id] = _decompress(path)
                stream: io.BufferedIOBase = io.BytesIO(self._memory[file_id])
            else:
                try:
                    stream = path.open("rb")
                except OSError as exc:
                    raise BurnoutError(f"cannot read data file '{path}': {exc.strerror}") from None
            with stream:
                scanned = _scan(stream, mode) if mode != "separator" else _scan_separated(stream, separator.encode())
                for offset, length, line in scanned:
                    file_ids.append(file_id)
                    offsets.append(offset)
                    lengths.append(length)
                    lines.append(line)
        self.file_ids = np.asarray(file_ids, dtype=np.int32)
        self.offsets = np.asarray(offsets, dtype=np.int64)
        self.lengths = np.asarray(lengths, dtype=np.int64)
        self.lines = np.asarray(lines, dtype=np.int64)
        self._handles: dict[int, io.BufferedReader] = {}

    def __len__(self) -> int:
        return len(self.offsets)

    def natural(self) -> Iterator[str | None]:
        try:
            for i in range(len(self)):
                yield self.read(i)
        finally:
            self._close()

    def shuffled(self, rng: np.random.Generator) -> Iterator[str | None]:
        try:
            for i in rng.permutation(len(self)):
                yield self.read(int(i))
        finally:
            self._close()

    def read(self, i: int) -> str | None:
        file_id, offset, length = int(self.file_ids[i]), int(self.offsets[i]), int(self.lengths[i])
        if file_id in self._memory:
            raw = self._memory[file_id][offset : offset + length]
        else:
            handle = self._handles.get(file_id)
            if handle is None:
                if len(self._handles) >= 64:
                    self._close()
                handle = self._handles[file_id] = self.files[file_id].open("rb")
            handle.seek(offset)
            raw = handle.read(length)
        where = f"{self.files[file_id]}:{int(self.lines[i])}"
        text = _decode_user_bytes(raw, where)
        if self.mode == "jsonl":
            return _parse_jsonl_record(text, where, self.text_field)
        return text

    def _close(self) -> None:
        for handle in self._handles.values():
            handle.close()
        self._handles.clear()


def _scan(stream: io.BufferedIOBase, mode: str) -> Iterator[tuple[int, int, int]]:
    """(byte offset, byte length, first line number) of each document in `stream`.

    line/jsonl: each non-blank line, without its line break. paragraph: each run of non-blank lines,
    without the final line break.
    """
    offset = 0
    start = None  # offset of the current paragraph
    start_line = end = 0
    for line_number, line in enumerate(stream, start=1):
        blank = not line.strip()
        if mode == "paragraph":
            if blank:
                if start is not None:
                    yield start, end - start, start_line
                    start = None
            else:
                if start is None:
                    start, start_line = offset, line_number
                end = offset + len(line.rstrip(b"\r\n"))
        elif not blank:
            yield offset, len(line.rstrip(b"\r\n")), line_number
        offset += len(line)
    if mode == "paragraph" and start is not None:
        yield start, end - start, start_line


def _scan_separated(stream: io.BufferedIOBase, separator: bytes) -> Iterator[tuple[int, int, int]]:
    """_scan's (byte offset, byte length, first line number) of each piece of `stream` between occurrences of
    `separator` (which holds no line break), without the whitespace around it; a blank piece is no document."""
    offset = 0
    start = None  # offset of the current piece's first non-blank byte
    start_line = end = 0
    for line_number, line in enumerate(stream, start=1):
        at = 0
        while True:
            found = line.find(separator, at)
            piece = line[at : found if found >= 0 else len(line)]
            if piece.strip():
                if start is None:
                    start, start_line = offset + at + len(piece) - len(piece.lstrip()), line_number
                end = offset + at + len(piece.rstrip())
            if found < 0:
                break
            if start is not None:
                yield start, end - start, start_line
                start = None
            at = found + len(separator)
        offset += len(line)
    if start is not None:
        yield start, end - start, start_line


class _ParquetIndex(_SourceIndex):
    def __init__(self, files: list[Path], text_field: str) -> None:
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise BurnoutError(f"parquet sources need pyarrow; {install_extra('data')}") from None
        self.text_field = text_field
        self.files: list[Path] = []
        self.groups: list[tuple[int, int]] = []  # (file index, row group)
        self._pq = pq
        for path in files:
            try:
                meta = pq.ParquetFile(path).metadata
            except OSError as exc:
                raise BurnoutError(f"data file '{path}' is not a readable parquet file ({first_line(exc)})") from None
            except Exception as exc:  # pyarrow raises ArrowInvalid for non-parquet bytes
                raise BurnoutError(f"data file '{path}' is not a parquet file ({first_line(exc)})") from None
            if text_field not in meta.schema.names:
                raise BurnoutError(
                    f"data file '{path}' has no column '{text_field}' (it has {', '.join(meta.schema.names)}); "
                    "set the source's text_field"
                )
            self.files.append(path)
            self.groups += [(len(self.files) - 1, g) for g in range(meta.num_row_groups)]

    def _rows(self, group: tuple[int, int]) -> list:
        path = self.files[group[0]]
        table = self._pq.ParquetFile(path).read_row_group(group[1], columns=[self.text_field])
        rows = table.column(0).to_pylist()
        for row in rows:
            if row is not None and not isinstance(row, str):
                raise BurnoutError(f"data file '{path}': column '{self.text_field}' holds {type(row).__name__}, "
                                   f"expected strings")
        return rows

    def natural(self) -> Iterator[str | None]:
        for group in self.groups:
            yield from self._rows(group)

    def shuffled(self, rng: np.random.Generator) -> Iterator[str | None]:
        for g in rng.permutation(len(self.groups)):
            rows = self._rows(self.groups[g])
            for i in rng.permutation(len(rows)):
                yield rows[i]


class _HFIndex(_SourceIndex):
    """A Hugging Face dataset, streamed (nothing is downloaded up front)."""

    def __init__(self, source: SourceConfig) -> None:
        self.source = source

    def _load(self):
        source = self.source
        try:
            import datasets
        except ImportError:
            raise BurnoutError(
                f"data source '{source.name}': kind hf needs the datasets package; {install_extra('data')}"
            ) from None
        kwargs = {}
        if source.data_files:
            kwargs["data_files"] = os.path.expanduser(source.data_files)
        try:
            return datasets.load_dataset(source.dataset, source.subset, split=source.split, streaming=True, **kwargs)
        except Exception as exc:  # datasets raises many types (FileNotFoundError, ValueError, HTTP errors)
            raise BurnoutError(
                f"data source '{source.name}': cannot stream dataset '{source.dataset}'"
                f"{f' ({source.data_files})' if source.data_files else ''}: {first_line(exc)}"
            ) from None

    def _texts(self, dataset) -> Iterator[str | None]:
        field_name = self.source.text_field
        try:
            for number, record in enumerate(dataset, start=1):
                if field_name not in record:
                    raise BurnoutError(
                        f"data source '{self.source.name}': record {number} of '{self.source.dataset}' has no field "
                        f"'{field_name}' (it has {', '.join(record)}); set the source's text_field"
                    )
                text = record[field_name]
                if text is not None and not isinstance(text, str):
                    raise BurnoutError(
                        f"data source '{self.source.name}': field '{field_name}' is {type(text).__name__}, "
                        f"expected a string"
                    )
                yield text
        except BurnoutError:
            raise
        except Exception as exc:
            raise BurnoutError(f"data source '{self.source.name}': reading '{self.source.dataset}' failed: "
                               f"{first_line(exc)}") from None

    def natural(self) -> Iterator[str | None]:
        yield from self._texts(self._load())

    def shuffled(self, rng: np.random.Generator) -> Iterator[str | None]:
        # A seeded shuffle buffer of our own (not IterableDataset.shuffle): the order depends only on
        # the seed and the record order, and it costs nothing up front.
        buffer: list[str | None] = []
        for text in self._texts(self._load()):
            if len(buffer) < HF_SHUFFLE_BUFFER:
                buffer.append(text)
                continue
            i = int(rng.integers(len(buffer)))
            yield buffer[i]
            buffer[i] = text
        for i in rng.permutation(len(buffer)):
            yield buffer[i]


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


def _resolve_files(source: SourceConfig) -> list[Path]:
    """The files a file source names: one file, every matching file under a folder, or a glob.

    A path that does not exist is downloaded from source.url when one is given.
    """
    suffixes = _SUFFIXES[source.kind]
    raw = os.path.expanduser(source.path)
    if _GLOB_CHARS & set(raw):
        files = sorted(Path(p) for p in glob.glob(raw, recursive=True) if Path(p).is_file())
        if not files:
            raise BurnoutError(f"data source '{source.name}': the pattern '{raw}' matches no files; "
                               f"check data.sources path")
        return files
    path = Path(raw)
    if not path.exists() and source.url:
        path = fetch_url(source.url, source.sha256, where=f"data source '{source.name}'")
    if path.is_file():
        return [path]
    if path.is_dir():
        wanted = tuple(s + c for s in suffixes for c in ("", *COMPRESSED_SUFFIXES))
        files = sorted(p for p in path.rglob("*") if p.is_file() and p.name.endswith(wanted))
        if not files:
            raise BurnoutError(
                f"data source '{source.name}': folder '{path}' has no {'/'.join(suffixes)} files; "
                f"add some or fix the path"
            )
        return files
    if (kind := not_a_file_or_folder(path)) is not None:
        raise BurnoutError(f"data source '{source.name}': '{path}' is {kind}, not a file or folder: preparing reads "
                           "a source more than once, which a stream cannot give; save its text to a file and give that")
    raise BurnoutError(f"data source '{source.name}': path '{path}' does not exist; fix data.sources path")


def cache_dir() -> Path:
    return Path(os.environ.get("BURNOUT_CACHE") or Path.home() / ".cache" / "gpuburnout")


def fetch_url(url: str, sha256: str | None, where: str = "download") -> Path:
    """The local copy of `url` in the download cache, fetched once and checked against `sha256`."""
    name = url.rstrip("/").rsplit("/", 1)[-1] or "download"
    key = sha256 or hashlib.sha256(url.encode()).hexdigest()
    path = cache_dir() / "downloads" / key[:16] / name
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{name}.tmp-{os.getpid()}")
    digest = hashlib.sha256()
    try:
        with urllib.request.urlopen(url, timeout=60) as response, open(tmp, "wb") as f:
            while chunk := response.read(1 << 20):
                digest.update(chunk)
                f.write(chunk)
        if sha256 and digest.hexdigest() != sha256:
            raise BurnoutError(f"{where}: '{url}' has sha256 {digest.hexdigest()}, expected {sha256}; not using it")
        os.replace(tmp, path)
    except OSError as exc:
        raise BurnoutError(f"{where}: cannot download '{url}' ({getattr(exc, 'reason', None) or exc})") from None
    finally:
        tmp.unlink(missing_ok=True)
    return path


def _is_compressed(path: Path) -> bool:
    return path.name.endswith(COMPRESSED_SUFFIXES)


def _decompress(path: Path) -> bytes:
    raw = _read_bytes(path)
    try:
        if path.name.endswith(".gz"):
            return gzip.decompress(raw)
        if path.name.endswith(".bz2"):
            return bz2.decompress(raw)
        try:
            import zstandard
        except ImportError:
            raise BurnoutError(f"data file '{path}' is zstd-compressed, which needs zstandard; {install_extra('data')}"
                              ) from None
        with zstandard.ZstdDecompressor().stream_reader(io.BytesIO(raw)) as reader:
            return reader.read()
    except BurnoutError:
        raise
    except Exception as exc:  # gzip.BadGzipFile, OSError, EOFError, zstd.ZstdError ...
        raise BurnoutError(f"data file '{path}' is not valid {path.suffix[1:]} data ({exc}); "
                           f"re-download or recompress it") from None


def _read_user_file(path: Path) -> str:
    raw = _decompress(path) if _is_compressed(path) else _read_bytes(path)
    return _decode_user_bytes(raw, str(path))


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


def _parse_jsonl_record(line: str, where: str, text_field: str) -> str:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise BurnoutError(f"data file '{where}' is not valid JSON ({exc.msg}); fix or remove that line") from None
    if not isinstance(record, dict) or text_field not in record:
        raise BurnoutError(f"data file '{where}' has no field '{text_field}'; "
                           f"set the source's text_field to the right key")
    text = record[text_field]
    if not isinstance(text, str):
        raise BurnoutError(f"data file '{where}': field '{text_field}' is {type(text).__name__}, expected a string")
    return text


def _describe_location(source: SourceConfig) -> str:
    if source.kind in ("text", "jsonl", "parquet"):
        return f"path '{source.path}'"
    if source.kind == "hf":
        return f"dataset '{source.dataset}'"
    return f"kind {source.kind}"
