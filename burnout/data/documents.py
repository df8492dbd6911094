"""Which document, of which source, each token of a prepared data folder belongs to.

`burnout data prepare` writes beside each split's shards a document index, SPLIT_docs.npy: one packed
record per document in stream order, its first token's offset in the split's token stream (the
shards back to back; uint64) and the number of its source in meta.json's `document_index.sources`
(uint16): 10 bytes per document (a corpus of 1M documents: 10 MB, about 0.5% of its 1B uint16 tokens).
A document runs from its start to the next one's, and its last token is the <|endoftext|> that
prepare appended; with `data.split: contiguous` a document's train part and val part are one
document of each split, of the same source. np.load(path, mmap_mode="r") reads the file as is.

A folder prepared before the index existed (no `document_index` in meta.json) is still read: its
documents are found at the <|endoftext|> tokens and their source is "?" (UNKNOWN_SOURCE); re-running
`burnout data prepare` gives them their sources. Importable without tokenizers (numpy only).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from burnout.base.text import plural
from burnout.data import shards
from burnout.errors import BurnoutError

UNKNOWN_SOURCE = "?"
# Tokens read at a time when a folder without an index is scanned for <|endoftext|>.
_EOT_SCAN_TOKENS = 1 << 24


@dataclass(frozen=True)
class DocumentSpan:
    split: str  # "train" | "val"
    index: int  # document number within the split
    source: str  # the source's name in data.sources ("?" when the folder predates the index)
    shard: str  # shard file name
    offset: int  # token offset of the document's first token within that shard
    length: int  # tokens, without the <|endoftext|>


class SplitDocuments:
    """One split of a prepared folder: its shards read as one token stream, and its documents.

    `starts` (uint64) and `source_ids` (uint16) have one entry per document; `source_names[id]` is a
    source's name. Token reads are views of the shards' memory maps (a copy for a range that crosses
    from one shard into the next).
    """

    def __init__(self, data_dir: str | Path, split: str = "train", meta: dict | None = None) -> None:
        self.data_dir = Path(data_dir)
        meta = meta if meta is not None else shards.read_meta(self.data_dir)
        if split not in meta["splits"]:
            raise BurnoutError(f"'{self.data_dir}' has no split '{split}'; it has {', '.join(meta['splits'])}")
        self.split = split
        self.dtype = np.dtype(meta["dtype"]).newbyteorder("<")
        self.eot = int(meta["eot_id"])
        info = meta["splits"][split]
        self.shard_names = [s["file"] for s in info["shards"]]
        self.shard_tokens = np.array([s["tokens"] for s in info["shards"]], dtype=np.int64)
        self.shard_starts = np.concatenate([[0], np.cumsum(self.shard_tokens)]).astype(np.int64)
        self.total = int(self.shard_starts[-1])
        self._maps: dict[int, np.ndarray] = {}
        index = meta.get("document_index")
        self.sources_known = index is not None
        if index is None:
            self.source_names = [UNKNOWN_SOURCE]
            self.starts = self._starts_from_eot()
            self.source_ids = np.zeros(len(self.starts), dtype=np.uint16)
        else:
            self.source_names = list(index["sources"])
            self.starts, self.source_ids = self._load_index(self.data_dir / index["files"][split],
                                                            info.get("documents"))

    def __len__(self) -> int:
        return len(self.starts)

    # -- the index ---------------------------------------------------------------------------

    def _load_index(self, path: Path, expected: int | None) -> tuple[np.ndarray, np.ndarray]:
        fix = "re-run burnout data prepare (with --overwrite) to write it again"
        if not path.is_file():
            raise BurnoutError(f"'{path}' (the document index of the {self.split} split) is missing; {fix}")
        try:
            records = np.load(path, mmap_mode="r")
        except (OSError, ValueError) as exc:
            raise BurnoutError(f"cannot read the document index '{path}' ({exc}); {fix}") from None
        if records.dtype != shards.DOCS_DTYPE or records.ndim != 1:
            raise BurnoutError(f"'{path}' holds {records.dtype} records, not a document index; {fix}")
        starts = np.asarray(records["start"], dtype=np.int64)
        sources = np.array(records["source"], dtype=np.uint16)
        if expected is not None and len(starts) != expected:
            raise BurnoutError(f"'{path}' lists {plural(len(starts), 'document')} but meta.json counts "
                               f"{expected:,} in the {self.split} split; {fix}")
        if len(starts) and (starts[0] != 0 or starts[-1] >= self.total or np.any(np.diff(starts) < 1)
                            or int(sources.max()) >= len(self.source_names)):
            raise BurnoutError(f"'{path}' does not fit the {self.split} shards (its offsets or source numbers are "
                               f"out of range); {fix}")
        return starts, sources

    def _starts_from_eot(self) -> np.ndarray:
        """Document starts of a folder without an index: 0 and every position after an <|endoftext|>."""
        found = [np.zeros(1, dtype=np.int64)]
        for start in range(0, self.total, _EOT_SCAN_TOKENS):
            chunk = self.read(start, min(start + _EOT_SCAN_TOKENS, self.total))
            found.append(np.flatnonzero(chunk == self.eot).astype(np.int64) + start + 1)
        starts = np.concatenate(found)
        return starts[starts < self.total]

    # -- tokens ------------------------------------------------------------------------------

    def shard_map(self, i: int) -> np.ndarray:
        """Shard i's tokens, memory-mapped (read-only)."""
        if i not in self._maps:
            path = self.data_dir / self.shard_names[i]
            try:
                self._maps[i] = np.memmap(path, dtype=self.dtype, mode="r", shape=(int(self.shard_tokens[i]),))
            except (OSError, ValueError) as exc:
                reason = getattr(exc, "strerror", None) or exc
                raise BurnoutError(f"cannot read shard '{path}' ({reason}); re-run burnout data prepare") from None
        return self._maps[i]

    def tokens(self, start: int, stop: int) -> np.ndarray:
        """Tokens [start, stop) of the split's stream: a view, or a copy when they cross shards."""
        start, stop = max(int(start), 0), min(int(stop), self.total)
        if stop <= start:
            return np.zeros(0, dtype=self.dtype)
        first = int(np.searchsorted(self.shard_starts, start, side="right")) - 1
        last = int(np.searchsorted(self.shard_starts, stop - 1, side="right")) - 1
        base = int(self.shard_starts[first])
        if first == last:
            return self.shard_map(first)[start - base : stop - base]
        parts = [self.shard_map(i)[max(start - int(self.shard_starts[i]), 0): stop - int(self.shard_starts[i])]
                 for i in range(first, last + 1)]
        return np.concatenate(parts)

    def read(self, start: int, stop: int) -> np.ndarray:
        """Tokens [start, stop) as a new array read from the files (no memory map: a scattered
        sample does not pull whole shards into this process's resident memory)."""
        start, stop = max(int(start), 0), min(int(stop), self.total)
        parts = []
        while start < stop:
            i = int(np.searchsorted(self.shard_starts, start, side="right")) - 1
            end = min(stop, int(self.shard_starts[i + 1]))
            path = self.data_dir / self.shard_names[i]
            try:
                part = np.fromfile(path, dtype=self.dtype, count=end - start,
                                   offset=(start - int(self.shard_starts[i])) * self.dtype.itemsize)
            except (OSError, ValueError) as exc:
                reason = getattr(exc, "strerror", None) or exc
                raise BurnoutError(f"cannot read shard '{path}' ({reason}); re-run burnout data prepare") from None
            if len(part) != end - start:
                raise BurnoutError(f"shard '{path}' is shorter than meta.json says; re-run burnout data prepare")
            parts.append(part)
            start = end
        return np.concatenate(parts) if parts else np.zeros(0, dtype=self.dtype)

    # -- documents ---------------------------------------------------------------------------

    def locate(self, positions) -> np.ndarray:
        """The number of the document holding each token position (vectorised)."""
        return np.searchsorted(self.starts, np.asarray(positions, dtype=np.int64), side="right") - 1

    def bounds(self, index: int) -> tuple[int, int]:
        """[start, end) of document `index` in the stream, its <|endoftext|> included."""
        end = int(self.starts[index + 1]) if index + 1 < len(self.starts) else self.total
        return int(self.starts[index]), end

    def span(self, index: int) -> DocumentSpan:
        start, end = self.bounds(index)
        shard = int(np.searchsorted(self.shard_starts, start, side="right")) - 1
        # A document cut short by the end of a folder without an index may lack its <|endoftext|>.
        ends_with_eot = self.sources_known or int(self.tokens(end - 1, end)[0]) == self.eot
        return DocumentSpan(self.split, int(index), self.source_names[int(self.source_ids[index])],
                            self.shard_names[shard], start - int(self.shard_starts[shard]),
                            end - start - (1 if ends_with_eot else 0))

    def shard_of(self, position: int) -> tuple[str, int]:
        """(shard file, offset within it) of a token position of the stream."""
        shard = int(np.searchsorted(self.shard_starts, position, side="right")) - 1
        return self.shard_names[shard], int(position) - int(self.shard_starts[shard])

    def __iter__(self) -> Iterator[tuple[DocumentSpan, np.ndarray]]:
        for index in range(len(self.starts)):
            span = self.span(index)
            start = int(self.starts[index])
            yield span, self.tokens(start, start + span.length)


def iter_documents(data_dir: str | Path, split: str = "train") -> Iterator[tuple[DocumentSpan, np.ndarray]]:
    """Every document of `split` in stream order, with its token ids (without the <|endoftext|>; a view
    of the shard's memory map, a copy for a document that continues into the next shard)."""
    yield from SplitDocuments(data_dir, split)


def document_at(data_dir: str | Path, split: str, position: int) -> DocumentSpan:
    """The document holding token `position` of `split`'s stream (its shards back to back).

    The split's index is loaded once and kept (a few folders) for the calls that follow, until the
    folder's meta.json changes (a new prepare).
    """
    meta_file = Path(data_dir) / shards.META_FILE
    try:
        stamp = (meta_file.stat().st_mtime_ns, meta_file.stat().st_size)
    except OSError:
        stamp = None  # read_meta says what is wrong
    docs = _cached_split(str(Path(data_dir).resolve()), split, stamp)
    if not 0 <= position < docs.total:
        raise BurnoutError(f"token position {position:,} is outside the {split} split of '{data_dir}' "
                           f"({docs.total:,} tokens)")
    return docs.span(int(docs.locate(position)))


@functools.lru_cache(maxsize=4)
def _cached_split(data_dir: str, split: str, stamp: tuple | None) -> SplitDocuments:
    return SplitDocuments(data_dir, split)
