"""Encoding documents to token ids, in this process, on the tokenizer's own thread pool.

Encoding runs on Hugging Face tokenizers' Rust thread pool (`workers` > 1, on background threads, so
the caller's reading and writing overlap it) or on one thread. Either way the ids are the same.

A document longer than a piece is encoded in pieces (burnout/data/tokenizer.py's `pieces`, which give the ids of
the whole), and pieces are encoded about BATCH_CHARS characters at a time: the memory of encoding does not grow
with a document's length.

A character the tokenizer cannot encode (one a char tokenizer's sample never held, a lone surrogate) is left out of
its document and counted (tokenizer.py's drop_unencodable): a corpus is not refused over a rare character that its
tokenizer's sample happened to miss.
"""

from __future__ import annotations

import os
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
from tokenizers import Tokenizer

from burnout.base.text import first_line
from burnout.data.tokenizer import cuts_exactly, drop_unencodable, pieces
from burnout.errors import BurnoutError

# Chunks read and submitted for encoding before they are needed. With two encodings in flight the
# thread pool always has work: one chunk's last, longest documents no longer leave a core idle.
CHUNKS_AHEAD = 2
# Characters encoded in one call: the call holds Hugging Face Encoding objects, several values per token, until
# their ids are copied out (docs/PERFORMANCE.md).
BATCH_CHARS = 1_000_000


def encode_documents(tok: Tokenizer, docs: list[str], split: str = "data",
                     dropped: list[Counter] | None = None) -> list[np.ndarray]:
    """Token ids (uint32 arrays, no special tokens added) of each document: a long one in pieces when the
    tokenizer gives the pieces the ids of the whole (`cuts_exactly`), BATCH_CHARS characters at a time. Characters
    the tokenizer cannot encode are left out; `dropped`, when given, gets a Counter of them per document."""
    cut = cuts_exactly(tok)
    parts: list[list[np.ndarray]] = [[] for _ in docs]
    left_out = [Counter() for _ in docs]
    batch: list[str] = []
    owners: list[int] = []
    chars = 0
    for owner, doc in enumerate(docs):
        for piece in pieces(doc) if cut else [doc]:
            batch.append(piece)
            owners.append(owner)
            chars += len(piece)
            if chars >= BATCH_CHARS:
                _encode_batch(tok, batch, owners, parts, left_out, split)
                batch, owners, chars = [], [], 0
    if batch:
        _encode_batch(tok, batch, owners, parts, left_out, split)
    if dropped is not None:
        dropped.extend(left_out)
    return [ids[0] if len(ids) == 1 else np.concatenate(ids) for ids in parts]


def _encode_batch(tok: Tokenizer, texts: list[str], owners: list[int], parts: list[list[np.ndarray]],
                  left_out: list[Counter], split: str) -> None:
    """Encode `texts` at once, appending each one's ids to its owner's `parts` and the characters left out of it
    (only looked for when the batch fails: a bare Exception from the Rust side, a TypeError for a surrogate) to its
    owner's `left_out`."""
    try:
        encodings = tok.encode_batch_fast(texts, add_special_tokens=False)
    except Exception:
        kept = [drop_unencodable(tok, text) for text in texts]
        try:
            encodings = tok.encode_batch_fast([text for text, _ in kept], add_special_tokens=False)
        except Exception as exc:  # another refusal than a character's (a tokenizer of words given in a file)
            raise BurnoutError(f"the tokenizer cannot encode a document of the {split} ({first_line(exc)}); "
                               "retrain the tokenizer on this data or use tokenizer.kind: bpe") from None
        for owner, (_, counts) in zip(owners, kept):
            left_out[owner].update(counts)
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
        """A future of [(ids, characters encoded, Counter of the characters left out)] for `docs`."""
        if self._background is not None:
            return self._background.submit(self._encode_with_lengths, docs)
        future: Future = Future()
        try:
            future.set_result(self._encode_with_lengths(docs))
        except Exception as exc:  # raised where the result is used, as the background thread's would be
            future.set_exception(exc)
        return future

    def encode(self, docs: list[str]) -> list[np.ndarray]:
        return [ids for ids, _, _ in self.submit(docs).result()]

    def _encode_with_lengths(self, docs: list[str]) -> list[tuple[np.ndarray, int, Counter]]:
        dropped: list[Counter] = []
        encoded = encode_documents(self.tok, docs, dropped=dropped)
        return [(ids, len(doc) - left_out.total(), left_out) for ids, doc, left_out in zip(encoded, docs, dropped)]
