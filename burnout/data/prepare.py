"""Sources → cleaning → tokenizer → token-share mix → fixed-size token shards, plus meta.json.

Layout of a prepared data directory:

    train_000000.bin ...  token ids of the split, documents back to back, each followed by
    val_000000.bin ...    <|endoftext|>; raw little-endian uint16 (uint32 when the vocabulary exceeds
                          65536); every shard holds data.shard_tokens tokens except the last
    tokenizer.json        the HF tokenizer that produced them
    manifest.json         finished shards (file, tokens, sha256) and the fingerprint of the settings
                          that produced them; rewritten after each shard
    meta.json             format, dtype, counts, shares, cleaning report and checksums; written last,
                          so its presence means the directory is complete

Mixing is by TOKEN share: source s contributes weight_s / sum(weights) of the token budget
(data.max_tokens, or, when unset, the token count of the max_chars sample the tokenizer is trained
on). Each source is read in its seeded order, each whole document going to val or to train, so no
document is in both. Documents of the sources are interleaved in a seeded order that
draws each source in proportion to the budget it still has left; each source sends a document to val
when that keeps val's part of the tokens the source has given closest to val_fraction. The document
that crosses a source's budget is cut (and still ends with <|endoftext|>).

Preparation streams: memory holds up to three encode chunks per source and one document per split, not the
corpus. Encoding runs on the tokenizer's Rust thread pool (`workers` > 1, on background threads, so
reading and writing overlap it) or on one thread.

An interrupted run resumes. Each time a shard is finished the manifest also records a resume point
(at the next document boundary): the mixer's random state and counters, each source's position, the
log of chunks read so far and how far each split's partial shard (`.NAME.partial`) is filled. A
resume reads and cleans the logged chunks again (rebuilding dedup exactly) but encodes only documents
not yet written, cuts the partial shards back to the recorded length and goes on. Without a usable
point (killed before the first shard, or a partial shard lost) the stream is replayed from the start;
either way shards already listed in the manifest (same settings, same size) are not written again.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer
from tqdm import tqdm

from burnout.config import DataConfig, TokenizerConfig
from burnout.data.clean import Cleaner
from burnout.data.corpus import MixedCorpus, interleave_rng, iter_source, mix_corpus, source_signature
from burnout.data.tokenizer import build_tokenizer, eot_id, load_tokenizer, tokenizer_kind, tokenizer_sha256
from burnout.errors import BurnoutError

FORMAT = "burnout-tokens-v2"
LEGACY_FORMATS = ("burnout-tokens-v1",)
META_FILE = "meta.json"
MANIFEST_FILE = "manifest.json"
TOKENIZER_FILE = "tokenizer.json"
SPLITS = ("train", "val")
# Documents (or characters) read from one source before they are encoded together. Encoding a chunk
# briefly holds Hugging Face Encoding objects of ~80 bytes per token, which sets prepare's peak memory:
# 1M characters keep it near 140 MB whatever the corpus size (4M measured 200+ MB), at the same speed.
ENCODE_CHUNK_DOCS = 1024
ENCODE_CHUNK_CHARS = 1_000_000
# Chunks read and submitted for encoding before they are needed. With two encodings in flight the
# thread pool always has work: one chunk's last, longest documents no longer leave a core idle.
CHUNKS_AHEAD = 2


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype("<u2") if vocab_size <= 2**16 else np.dtype("<u4")


def shard_name(split: str, index: int) -> str:
    return f"{split}_{index:06d}.bin"


def prepare_data(
    data_cfg: DataConfig,
    tok_cfg: TokenizerConfig,
    out_dir: str | Path,
    tokenizer_path: str | Path | None = None,
    progress: bool = False,
    overwrite: bool = False,
    workers: int | None = None,
) -> dict:
    """Mix, clean, tokenize and write a sharded data directory; returns its meta (also meta.json).

    An unfinished directory (manifest but no meta) prepared with the same settings is resumed.
    `workers`: 1 encodes on one thread; more use the tokenizer's thread pool (None: one per CPU core).
    """
    data_cfg.validate()
    tok_cfg.validate()
    out_dir = Path(out_dir)
    meta_path = out_dir / META_FILE
    if meta_path.exists():
        if not overwrite:
            raise BurnoutError(
                f"'{out_dir}' already holds prepared data ({META_FILE} exists); choose another output folder or overwrite it"
            )
        # Unfinished from here on: if this run dies half way, the old meta must not vouch for new files.
        meta_path.unlink()
        _remove_outputs(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for stale in out_dir.glob(".*.tmp-*"):
        stale.unlink(missing_ok=True)
    if workers is not None and workers < 1:
        raise BurnoutError(f"--workers: {workers} must be at least 1 (1 encodes on one thread, more in parallel)")
    workers = workers or min(os.cpu_count() or 1, 8)

    given = load_tokenizer(tokenizer_path) if tokenizer_path is not None else None
    fingerprint = _fingerprint(data_cfg, tok_cfg, given)
    manifest = _load_manifest(out_dir, fingerprint)

    tok = None
    if manifest["tokenizer_sha256"] and (out_dir / TOKENIZER_FILE).is_file():
        tok = load_tokenizer(out_dir / TOKENIZER_FILE)
        if tokenizer_sha256(tok) != manifest["tokenizer_sha256"]:
            tok = None
    sample = None
    if tok is None:
        if given is not None:
            tok = given
        else:
            if tok_cfg.kind != "gpt2":
                sample = tokenizer_sample(data_cfg)
            tok = train_recipe_tokenizer(data_cfg, tok_cfg, sample)
        _write_atomic(out_dir / TOKENIZER_FILE, tok.to_str(pretty=True).encode("utf-8"))
        manifest = _new_manifest(fingerprint)
        manifest["tokenizer_sha256"] = tokenizer_sha256(tok)
    vocab_size = tok.get_vocab_size()
    dtype = token_dtype(vocab_size)
    eot = eot_id(tok)

    with _Encoder(tok, workers) as encoder:
        if manifest["total_tokens"] is None:
            if data_cfg.max_tokens is not None:
                manifest["total_tokens"] = data_cfg.max_tokens
            else:
                if sample is None:
                    sample = tokenizer_sample(data_cfg)
                docs = sample.train_docs + sample.val_docs
                # A contiguous split cuts each document in two, each part ending with <|endoftext|>.
                per_doc = 2 if data_cfg.split == "contiguous" else 1
                manifest["total_tokens"] = sum(len(ids) + per_doc for chunk in _encode_chunks(docs)
                                               for ids in encoder.encode(chunk))
        _save_manifest(out_dir, manifest)
        meta = _write_splits(data_cfg, manifest, out_dir, encoder, eot, dtype, progress)

    meta = {
        "format": FORMAT,
        "dtype": dtype.name,
        "vocab_size": vocab_size,
        "eot_id": eot,
        "tokenizer_sha256": tokenizer_sha256(tok),
        "tokenizer_kind": tokenizer_kind(tok),
        "shard_tokens": data_cfg.shard_tokens,
        **meta,
        "data_config": asdict(data_cfg),
        "tokenizer_config": asdict(tok_cfg),
    }
    _write_atomic(meta_path, (json.dumps(meta, indent=2) + "\n").encode("utf-8"))
    return meta


def tokenizer_sample(data_cfg: DataConfig) -> MixedCorpus:
    """The cleaned, weighted `max_chars` sample of the sources that a tokenizer is trained on."""
    cleaner = Cleaner(data_cfg)
    return mix_corpus(data_cfg, transform=cleaner if cleaner.active else None)


def train_recipe_tokenizer(data_cfg: DataConfig, tok_cfg: TokenizerConfig, sample: MixedCorpus | None = None) -> Tokenizer:
    """The tokenizer a recipe asks for: GPT-2's read from its files, or one trained on the sample."""
    if tok_cfg.kind == "gpt2":
        return build_tokenizer(tok_cfg)
    sample = sample or tokenizer_sample(data_cfg)
    # The char inventory carries no sequence statistics, so taking it from both splits leaks
    # nothing, and a character seen only in val would otherwise make val impossible to encode.
    texts = sample.train_docs + sample.val_docs if tok_cfg.kind == "char" else sample.train_docs
    return build_tokenizer(tok_cfg, texts)


# ----------------------------------------------------------------------------------------------
# Token-share mixing


class _SourceStream:
    """The cleaned, encoded documents of one source in its seeded order.

    Documents are read and cleaned a chunk at a time, on the calling thread and in the order the mix
    asks for them, so that dedup across sources sees documents in one deterministic order (the same
    for any number of workers). Chunks are read CHUNKS_AHEAD ahead of use and encoded in the
    background when workers > 1, so reading, cleaning and writing overlap encoding. Every chunk read is appended to `fill_log` as [source, texts read,
    source exhausted]: replaying the log rebuilds the cleaner's state without encoding (see resume).
    """

    def __init__(self, index: int, source, seed: int, cleaner: Cleaner, encoder: _Encoder, fill_log: list) -> None:
        self.index, self.name = index, source.name
        self.texts = iter_source(source, seed)
        self.cleaner = cleaner
        self.encoder = encoder
        self.fill_log = fill_log
        self.ready: deque[tuple[np.ndarray, int]] = deque()
        self.chunks: deque[Future] = deque()  # read and cleaned, encoded or being encoded
        self.exhausted = False
        self.taken = 0  # documents handed out by next()
        # Chunks start small and double: a source that needs few documents reads few past its budget.
        self.chunk_docs = 8

    def next(self) -> tuple[np.ndarray, int] | None:
        """(token ids, characters) of the next document, or None when the source has run out."""
        while not self.ready:
            if not self.chunks:
                if self.exhausted:
                    return None
                self.chunks.append(self.encoder.submit(self._read_chunk()))
            self.ready.extend(self.chunks.popleft().result())
            while len(self.chunks) < CHUNKS_AHEAD and not self.exhausted:
                self.chunks.append(self.encoder.submit(self._read_chunk()))
        self.taken += 1
        return self.ready.popleft()

    def _read_chunk(self, count: int | None = None, exhausted: bool = False) -> list[str]:
        """The cleaned documents of the next chunk; `count` replays a logged chunk of that many texts."""
        docs: list[str] = []
        chars = read = 0
        for text in self.texts if count is None else itertools.islice(self.texts, count):
            read += 1
            if self.cleaner.active:
                text = self.cleaner(text)
                if not text:
                    continue
            docs.append(text)
            chars += len(text)
            if count is None and (len(docs) >= self.chunk_docs or chars >= ENCODE_CHUNK_CHARS):
                break
        else:
            if count is not None and read < count:
                raise BurnoutError(
                    f"data source '{self.name}' holds fewer documents than when this interrupted prepare "
                    "started; its files changed, so prepare again with --overwrite"
                )
            self.exhausted = count is None or exhausted
        self.chunk_docs = min(2 * self.chunk_docs, ENCODE_CHUNK_DOCS)
        self.fill_log.append([self.index, read, self.exhausted])
        return docs


def _restore_streams(streams: list[_SourceStream | None], logged_fills: list, taken: list[int]) -> None:
    """Bring each stream to where it stood when a resume point was saved, encoding only documents not
    yet handed out: the logged chunks are read and cleaned again in their original order (rebuilding
    dedup and the cleaning report exactly), the handed-out documents are dropped unencoded."""
    pending: list[list[list[str]]] = [[] for _ in streams]
    for index, count, exhausted in logged_fills:  # replaying appends them to the streams' own, new log
        pending[index].append(streams[index]._read_chunk(count, exhausted))
    for stream, chunks, skip in zip(streams, pending, taken):
        if stream is None:
            continue
        stream.taken = skip
        for docs in chunks:
            if skip >= len(docs):
                skip -= len(docs)
                continue
            stream.chunks.append(stream.encoder.submit(docs[skip:]))
            skip = 0


def _encode_chunks(docs: list[str]):
    """`docs` in consecutive lists of about ENCODE_CHUNK_CHARS characters: encoding them all at once
    would hold ~80 bytes per token of Encoding objects for the whole sample."""
    chunk, chars = [], 0
    for doc in docs:
        chunk.append(doc)
        chars += len(doc)
        if chars >= ENCODE_CHUNK_CHARS:
            yield chunk
            chunk, chars = [], 0
    if chunk:
        yield chunk


def _budgets(cfg: DataConfig, total_tokens: int) -> dict[str, int]:
    total_weight = sum(s.weight for s in cfg.sources)
    return {s.name: int(total_tokens * s.weight / total_weight) for s in cfg.sources}


def _write_splits(
    cfg: DataConfig, manifest: dict, out_dir: Path, encoder: _Encoder, eot: int, dtype: np.dtype, progress: bool
) -> dict:
    budgets = _budgets(cfg, manifest["total_tokens"])
    cleaner = Cleaner(cfg)
    fill_log: list = []
    streams = [_SourceStream(i, s, cfg.seed, cleaner, encoder, fill_log) if s.weight > 0 else None
               for i, s in enumerate(cfg.sources)]
    names = [s.name for s in cfg.sources]
    rng = interleave_rng(cfg.seed, "mix")
    point = _usable_resume_point(manifest, out_dir, dtype)
    if point is None:
        for stale in out_dir.glob(".*.partial"):
            stale.unlink()
        stats = {split: {name: {"tokens": 0, "documents": 0, "chars": 0} for name in names} for split in SPLITS}
        remaining = np.array([budgets[n] if streams[i] else 0 for i, n in enumerate(names)], dtype=np.int64)
        taken = np.zeros(len(names), dtype=np.int64)
        taken_val = np.zeros(len(names), dtype=np.int64)
        positions = {split: (0, 0) for split in SPLITS}
    else:  # continue from the last resume point instead of replaying (and encoding) from the start
        _restore_streams(streams, point["fills"], point["taken_docs"])
        stats, positions = point["stats"], point["writers"]
        remaining, taken, taken_val = (np.array(point[key], dtype=np.int64) for key in ("remaining", "taken", "taken_val"))
        rng.bit_generator.state = point["rng"]
    writers = {split: _ShardWriter(out_dir, split, cfg.shard_tokens, dtype, manifest, *positions[split]) for split in SPLITS}

    def save_resume_point() -> None:
        # NOTE: taken at a document boundary (never mid-document), after the partial shards are flushed.
        for writer in writers.values():
            writer.flush()
            writer.finished_any = False
        manifest["resume"] = {
            "fills": fill_log, "taken_docs": [stream.taken if stream else 0 for stream in streams],
            "rng": rng.bit_generator.state, "remaining": remaining.tolist(), "taken": taken.tolist(),
            "taken_val": taken_val.tolist(), "stats": stats,
            "writers": {split: [writer.index, writer.filled] for split, writer in writers.items()},
        }
        _save_manifest(out_dir, manifest)

    with tqdm(total=int(remaining.sum()), desc="tokenizing", unit="tok", unit_scale=True, disable=not progress) as bar:
        while remaining.sum() > 0:
            if any(writer.finished_any for writer in writers.values()):
                save_resume_point()
            active = np.flatnonzero(remaining > 0)
            cumulative = np.cumsum(remaining[active])
            i = int(active[np.searchsorted(cumulative, rng.random() * cumulative[-1], side="right")])
            item = streams[i].next()
            if item is None:  # the source ran out: its shortfall is reported
                remaining[i] = 0
                continue
            ids, chars = item
            if cfg.split == "contiguous":
                _add_contiguous(ids, chars, cfg.val_fraction, int(remaining[i]), eot, dtype, writers,
                                stats, names[i], bar)
                remaining[i] -= min(len(ids) + 2, int(remaining[i]))
                continue
            doc = np.empty(min(len(ids) + 1, int(remaining[i])), dtype=dtype)
            doc[:-1] = ids[: len(doc) - 1]
            doc[-1] = eot
            # A whole document goes to val when that brings the source's val share closer to
            # val_fraction than sending it to train would, so the share holds even when it runs short.
            # A source's second document goes to val if none has yet, so every source is in val.
            to_val = taken_val[i] + len(doc) / 2 < cfg.val_fraction * (taken[i] + len(doc))
            split = "val" if to_val or (taken_val[i] == 0 and taken[i] > 0) else "train"
            writers[split].add(doc)
            entry = stats[split][names[i]]
            entry["tokens"] += len(doc)
            entry["documents"] += 1
            entry["chars"] += chars if len(doc) == len(ids) + 1 else round(chars * len(doc) / (len(ids) + 1))
            taken[i] += len(doc)
            taken_val[i] += len(doc) if split == "val" else 0
            remaining[i] -= len(doc)
            bar.update(len(doc))
    splits = {}
    for split in SPLITS:
        shards = writers[split].finish()
        tokens = sum(s["tokens"] for s in shards)
        if tokens == 0:
            raise BurnoutError(
                f"the {split} split came out empty; raise data.max_tokens (or data.max_chars) or add text to the sources"
            )
        documents = sum(e["documents"] for e in stats[split].values())
        splits[split] = {"tokens": tokens, "documents": documents, "shards": shards}
    manifest.pop("resume", None)  # every shard is listed: nothing is left to resume
    _save_manifest(out_dir, manifest)

    total = sum(splits[s]["tokens"] for s in SPLITS)
    total_weight = sum(s.weight for s in cfg.sources)
    per_source = {}
    for source in cfg.sources:
        train, val = stats["train"][source.name], stats["val"][source.name]
        budget = budgets[source.name]
        tokens = train["tokens"] + val["tokens"]
        per_source[source.name] = {
            "kind": source.kind,
            "weight": source.weight,
            "target_share": source.weight / total_weight,
            "share": tokens / total,
            "budget_tokens": budget,
            "tokens": tokens,
            "shortfall_tokens": budget - tokens,
            "train_tokens": train["tokens"],
            "val_tokens": val["tokens"],
            "documents": train["documents"] + val["documents"],
            "train_documents": train["documents"],
            "val_documents": val["documents"],
            "chars": train["chars"] + val["chars"],
        }
    sources = {
        "per_source": per_source,
        "total": {
            "tokens": total,
            "budget_tokens": manifest["total_tokens"],
            "train_tokens": splits["train"]["tokens"],
            "val_tokens": splits["val"]["tokens"],
            "documents": splits["train"]["documents"] + splits["val"]["documents"],
            "train_documents": splits["train"]["documents"],
            "val_documents": splits["val"]["documents"],
            "chars": sum(e["chars"] for e in per_source.values()),
        },
    }
    return {"splits": splits, "sources": sources, "cleaning": cleaner.report()}


def _add_contiguous(ids: np.ndarray, chars: int, val_fraction: float, budget: int, eot: int, dtype: np.dtype,
                    writers: dict, stats: dict, name: str, bar) -> None:
    """data.split=contiguous: the document's first 1 - val_fraction of tokens (+ <|endoftext|>) to train,
    the rest (+ <|endoftext|>) to val, as nanoGPT splits data[:int(n * 0.9)] / data[int(n * 0.9):]."""
    ids = ids[: max(budget - 2, 0)]
    cut = int(len(ids) * (1 - val_fraction))
    for split, part in (("train", ids[:cut]), ("val", ids[cut:])):
        doc = np.empty(len(part) + 1, dtype=dtype)
        doc[:-1] = part
        doc[-1] = eot
        writers[split].add(doc)
        entry = stats[split][name]
        entry["tokens"] += len(doc)
        entry["documents"] += 1
        entry["chars"] += round(chars * len(part) / max(len(ids), 1))
        bar.update(len(doc))


# ----------------------------------------------------------------------------------------------
# Shards and manifest


class _ShardWriter:
    """Writes a split's token stream into fixed-size shards, one document at a time.

    The shard being filled is the hidden file `.NAME.partial`; it is finished when renamed to NAME and
    listed in the manifest (which is saved right away). A writer starts at shard `index` holding
    `filled` tokens (a resume point); shards the manifest already lists, with a file of the right size,
    are not written again.
    """

    def __init__(self, out_dir: Path, split: str, shard_tokens: int, dtype: np.dtype, manifest: dict,
                 index: int = 0, filled: int = 0) -> None:
        self.out_dir, self.split, self.shard_tokens, self.dtype = out_dir, split, shard_tokens, dtype
        self.manifest = manifest
        self.done = manifest["shards"].setdefault(split, [])
        self.index = index
        self.filled = 0
        self.finished_any = False  # a shard was finished since the caller last cleared this
        self._file = None
        self._digest = None
        self._skip = False
        self._open(filled)

    def _open(self, filled: int = 0) -> None:
        self.filled = filled
        name = shard_name(self.split, self.index)
        if self.index < len(self.done):
            entry = self.done[self.index]
            path = self.out_dir / name
            if entry["file"] == name and path.is_file() and path.stat().st_size == entry["tokens"] * self.dtype.itemsize:
                self._skip = True
                return
            del self.done[self.index :]  # a listed shard is damaged: it and everything after are redone
        self._skip = False
        self._file = open(partial_path(self.out_dir, name), "r+b" if filled else "wb")
        self._digest = hashlib.sha256()
        if filled:  # resume: keep the first `filled` tokens, drop anything written after the resume point
            self._file.truncate(filled * self.dtype.itemsize)
            while chunk := self._file.read(1 << 24):
                self._digest.update(chunk)

    def add(self, tokens: np.ndarray) -> None:
        while len(tokens):
            room = self.shard_tokens - self.filled
            head, tokens = tokens[:room], tokens[room:]
            if not self._skip:
                data = head.astype(self.dtype, copy=False).tobytes()
                self._file.write(data)
                self._digest.update(data)
            self.filled += len(head)
            if self.filled == self.shard_tokens:
                self._close()
                self.finished_any = True
                self.index += 1
                self._open()

    def flush(self) -> None:
        """Push written tokens to the file, so a resume point saved now finds them there."""
        if self._file is not None:
            self._file.flush()

    def _close(self) -> None:
        if self._skip:
            return
        self._file.close()
        self._file = None
        name = shard_name(self.split, self.index)
        if self.filled == 0:
            partial_path(self.out_dir, name).unlink(missing_ok=True)
            return
        os.replace(partial_path(self.out_dir, name), self.out_dir / name)
        self.done.append({"file": name, "tokens": self.filled, "sha256": self._digest.hexdigest()})
        _save_manifest(self.out_dir, self.manifest)

    def finish(self) -> list[dict]:
        if self._skip and self.filled < self.done[self.index]["tokens"]:
            # Replay produced less than the listed shard held: it cannot be from these settings.
            raise BurnoutError(f"'{self.out_dir}': shard {shard_name(self.split, self.index)} does not match a replay; prepare with overwrite")
        self._close()
        end = self.index + (1 if self.filled else 0)
        for extra in self.done[end:]:
            (self.out_dir / extra["file"]).unlink(missing_ok=True)
        del self.done[end:]
        _save_manifest(self.out_dir, self.manifest)
        return list(self.done)


def partial_path(out_dir: Path, name: str) -> Path:
    return out_dir / f".{name}.partial"


def _usable_resume_point(manifest: dict, out_dir: Path, dtype: np.dtype) -> dict | None:
    """The manifest's resume point when the files it counts on are there, else None (replay from the start)."""
    point = manifest.get("resume")
    if not point:
        return None
    for split, (index, filled) in point["writers"].items():
        name = shard_name(split, index)
        listed = manifest["shards"].get(split, [])
        if index < len(listed) and (out_dir / name).is_file():
            continue  # finished after the point was saved: the writer skips it
        partial = partial_path(out_dir, name)
        if filled and (not partial.is_file() or partial.stat().st_size < filled * dtype.itemsize):
            return None
    return point


def _fingerprint(data_cfg: DataConfig, tok_cfg: TokenizerConfig, given: Tokenizer | None) -> str:
    """Identifies the settings and source files an unfinished directory was prepared from: a resume
    continues only with the same fingerprint (sources edited in between mean starting over)."""
    settings = {
        "format": FORMAT,
        "data": asdict(data_cfg),
        "sources": [source_signature(source) for source in data_cfg.sources if source.weight > 0],
        "tokenizer": asdict(tok_cfg),
        "given_tokenizer": tokenizer_sha256(given) if given is not None else None,
    }
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()


def _new_manifest(fingerprint: str) -> dict:
    return {"format": FORMAT, "fingerprint": fingerprint, "tokenizer_sha256": None, "total_tokens": None, "shards": {}}


def _load_manifest(out_dir: Path, fingerprint: str) -> dict:
    path = out_dir / MANIFEST_FILE
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
        if manifest.get("fingerprint") == fingerprint:
            return manifest
    except (OSError, ValueError, AttributeError):
        pass
    _remove_outputs(out_dir)  # from other settings, or unreadable: nothing in it can be trusted
    return _new_manifest(fingerprint)


def _save_manifest(out_dir: Path, manifest: dict) -> None:
    _write_atomic(out_dir / MANIFEST_FILE, (json.dumps(manifest, indent=1) + "\n").encode("utf-8"))


def _remove_outputs(out_dir: Path) -> None:
    for split in SPLITS:
        for path in out_dir.glob(f"{split}_{'[0-9]' * 6}.bin"):
            path.unlink()
        (out_dir / f"{split}.bin").unlink(missing_ok=True)
    for path in out_dir.glob(".*.partial"):
        path.unlink()
    (out_dir / MANIFEST_FILE).unlink(missing_ok=True)


# ----------------------------------------------------------------------------------------------
# Encoding


def encode_documents(tok: Tokenizer, docs: list[str], split: str = "data") -> list[np.ndarray]:
    """Token ids (uint32 arrays, no special tokens added) of each document."""
    try:
        encodings = tok.encode_batch_fast(docs, add_special_tokens=False)
    except Exception:  # the Rust side raises a bare Exception, e.g. for a character a char vocab lacks
        vocab = tok.get_vocab()
        unknown = sorted({c for doc in docs for c in doc} - vocab.keys())
        if not unknown:
            raise
        shown = ", ".join(repr(c) for c in unknown[:5])
        raise BurnoutError(
            f"the tokenizer has no token for {len(unknown)} character(s) of the {split} ({shown}); "
            "retrain the tokenizer on this data or use tokenizer.kind: bpe"
        ) from None
    return [np.asarray(enc.ids, dtype=np.uint32) for enc in encodings]


class _Encoder:
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

    def __enter__(self) -> _Encoder:
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


# ----------------------------------------------------------------------------------------------
# Reading


def _write_atomic(path: Path, data: bytes) -> None:
    tmp_path = _tmp_name(path)
    try:
        tmp_path.write_bytes(data)
        os.replace(tmp_path, path)
    finally:
        tmp_path.unlink(missing_ok=True)


def _tmp_name(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


def read_meta(data_dir: str | Path) -> dict:
    """The meta of a finished data directory, after checking that its token files are whole.

    Every split gets a "shards" list ({file, tokens, sha256}); directories in the older single-file
    format (train.bin / val.bin) are read as one shard per split.
    """
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise BurnoutError(f"data directory '{data_dir}' does not exist; prepare the data into it first")
    meta_path = data_dir / META_FILE
    if not meta_path.is_file():
        raise BurnoutError(
            f"'{data_dir}' has no {META_FILE}, so its data preparation never finished; prepare the data again"
        )
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BurnoutError(f"'{meta_path}' is not valid JSON ({exc}); prepare the data again") from None
    if not isinstance(meta, dict) or meta.get("format") not in (FORMAT, *LEGACY_FORMATS):
        found = meta.get("format") if isinstance(meta, dict) else None
        raise BurnoutError(f"'{meta_path}' has format {found!r}, expected '{FORMAT}'; prepare the data again with this version")
    try:
        for info in meta["splits"].values():
            if "shards" not in info:  # v1: one file per split
                info["shards"] = [{"file": info["file"], "tokens": info["tokens"], "sha256": info["sha256"]}]
        _check_token_files(data_dir, meta)
    except (KeyError, TypeError, ValueError) as exc:
        raise BurnoutError(f"'{meta_path}' is malformed ({type(exc).__name__}: {exc}); prepare the data again") from None
    return meta


def _check_token_files(data_dir: Path, meta: dict) -> None:
    itemsize = np.dtype(meta["dtype"]).itemsize
    if meta["vocab_size"] > 2 ** (8 * itemsize):
        raise BurnoutError(f"'{data_dir / META_FILE}': a vocabulary of {meta['vocab_size']} tokens does not fit "
                           f"{meta['dtype']} token ids; the folder is damaged or mixed up, prepare the data again")
    for split, info in meta["splits"].items():
        if sum(s["tokens"] for s in info["shards"]) != info["tokens"]:
            raise BurnoutError(f"'{data_dir / META_FILE}': the {split} shards do not add up to {info['tokens']} tokens; prepare the data again")
        for shard in info["shards"]:
            path = data_dir / shard["file"]
            expected = shard["tokens"] * itemsize
            actual = path.stat().st_size if path.is_file() else None
            if actual != expected:
                state = "is missing" if actual is None else f"is {actual} bytes"
                raise BurnoutError(
                    f"'{path}' {state} but {META_FILE} expects {expected} ({shard['tokens']} {meta['dtype']} tokens); "
                    "the file is truncated or from another run, prepare the data again"
                )


def verify_checksums(data_dir: str | Path) -> None:
    """Re-hash every shard against meta.json (slow: reads all the data); raises on a mismatch."""
    data_dir = Path(data_dir)
    meta = read_meta(data_dir)
    for info in meta["splits"].values():
        for shard in info["shards"]:
            digest = hashlib.sha256()
            with open(data_dir / shard["file"], "rb") as f:
                while chunk := f.read(1 << 24):
                    digest.update(chunk)
            if digest.hexdigest() != shard["sha256"]:
                raise BurnoutError(f"'{data_dir / shard['file']}' does not match its sha256 in {META_FILE}; prepare the data again")


def read_tokens(data_dir: str | Path, split: str) -> np.ndarray:
    """All tokens of `split` (its shards concatenated) as one in-memory array."""
    data_dir = Path(data_dir)
    meta = read_meta(data_dir)
    if split not in meta["splits"]:
        raise BurnoutError(f"'{data_dir}' has no split '{split}'; it has {', '.join(meta['splits'])}")
    dtype = np.dtype(meta["dtype"]).newbyteorder("<")
    parts = [np.fromfile(data_dir / shard["file"], dtype=dtype) for shard in meta["splits"][split]["shards"]]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)
