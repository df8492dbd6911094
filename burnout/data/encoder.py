"""Encoding documents to token ids, in this process, on the tokenizer's own thread pool.

Encoding runs on Hugging Face tokenizers' Rust thread pool (`workers` > 1, on background threads, so
the caller's reading and writing overlap it) or on one thread. Either way the ids are the same.

A document longer than a piece is encoded in pieces (burnout/data/tokenizer.py's `pieces`, which give the ids of
the whole), and pieces are encoded about BATCH_CHARS characters at a time: the memory of encoding does not grow
with a document's length.
"""

from __future__ import annotations

import os
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
from tokenizers import Tokenizer

from burnout.data.tokenizer import cuts_exactly, pieces
from burnout.errors import BurnoutError

# Chunks read and submitted for encoding before they are needed. With two encodings in flight the
# thread pool always has work: one chunk's last, longest documents no longer leave a core idle.
CHUNKS_AHEAD = 2
# Characters encoded in one call: the call holds Hugging Face Encoding objects, several values per token, until
# their ids are copied out (docs/PERFORMANCE.md).
BATCH_CHARS = 1_000_000


def encode_documents(tok: Tokenizer, docs: list[str], split: str = "data") -> list[np.ndarray]:
    """Token ids (uint32 arrays, no special tokens added) of each document: a long one in pieces when the
    tokenizer gives the pieces the ids of the whole (`cuts_exactly`), BATCH_CHARS characters at a time."""
    cut = cuts_exactly(tok)
    parts: list[list[np.ndarray]] = [[] for _ in docs]
    batch: list[str] = []
    owners: list[int] = []
    chars = 0
    for owner, doc in enumerate(docs):
        for piece in pieces(doc) if cut else [doc]:
            batch.append(piece)
            owners.append(owner)
            chars += len(piece)
            if chars >= BATCH_CHARS:
                _encode_batch(tok, batch, owners, parts, split)
                batch, owners, chars = [], [], 0
    if batch:
        _encode_batch(tok, batch, owners, parts, split)
    return [ids[0] if len(ids) == 1 else np.concatenate(ids) for ids in parts]


def _encode_batch(tok: Tokenizer, texts: list[str], owners: list[int], parts: list[list[np.ndarray]],
                  split: str) -> None:
    """Encode `texts` at once, appending each one's ids to its owner's `parts`."""
    try:
        encodings = tok.encode_batch_fast(texts, add_special_tokens=False)
    except Exception:  # the Rust side raises a bare Exception, e.g. for a character a char vocab lacks
        vocab = tok.get_vocab()
        unknown = sorted({c for text in texts for c in text} - vocab.keys())
        if not unknown:
            raise
        shown = ", ".join(repr(c) for c in unknown[:5])
        raise BurnoutError(
            f"the tokenizer has no token for {len(unknown)} character(s) of the {split} ({shown}); "
            "retrain the tokenizer on this data or use tokenizer.kind: bpe"
        ) from None
    for owner, encoding in zip(owners, encodings):
        parts[owner].append(np.asarray(encoding.ids, dtype=np.uint32))


class Encoder:
    """Encodes chunks of documents in this process with Hugging Face tokenizers' encode_batch, which
    runs on its own Rust thread pool, without the GIL, when workers > 1 (one thread per core) and on
    one thread when workers == 1.

    With workers > 1, submitted chunks are encoded on background threads (CHUNKS_AHEAD at a time) while
    the caller reads, cleans and writes; with workers == 1 everything runs in turn on the calling
    thread. Either way the ids are the same. A process pool was measured slower than one worker here:
    every document was pickled to a worker and its ids pickled back.
    """

    def __init__(self, tok: Tokenizer, workers: int) -> None:
        self.tok = tok
        self.workers = workers
        self._background = ThreadPoolExecutor(CHUNKS_AHEAD, thread_name_prefix="encode") if workers > 1 else None
        self._previous_parallelism = None

    def __enter__(self) -> Encoder:
        # Read by the Rust side on every call: it switches the thread pool on or off.
        self._previous_parallelism = os.environ.get("TOKENIZERS_PARALLELISM")
        os.environ["TOKENIZERS_PARALLELISM"] = "true" if self.workers > 1 else "false"
        return self

    def __exit__(self, *exc) -> None:
        if self._background is not None:
            self._background.shutdown(wait=True, cancel_futures=True)
        if self._previous_parallelism is None:
            os.environ.pop("TOKENIZERS_PARALLELISM", None)
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = self._previous_parallelism

    def submit(self, docs: list[str]) -> Future:
        """A future of [(ids, characters)] for `docs`."""
        if self._background is not None:
            return self._background.submit(self._encode_with_lengths, docs)
        future: Future = Future()
        try:
            future.set_result(self._encode_with_lengths(docs))
        except Exception as exc:  # raised where the result is used, as the background thread's would be
            future.set_exception(exc)
        return future

    def encode(self, docs: list[str]) -> list[np.ndarray]:
        return [ids for ids, _ in self.submit(docs).result()]

    def _encode_with_lengths(self, docs: list[str]) -> list[tuple[np.ndarray, int]]:
        return list(zip(encode_documents(self.tok, docs), map(len, docs)))
