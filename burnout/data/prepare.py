"""Sources → cleaning → tokenizer → token-share mix → fixed-size token shards, plus meta.json (`prepare_data`).

Streamed, so that memory holds a few chunks per source rather than the corpus, and resumable, so that an
interrupted preparation goes on to byte-identical shards (`_SplitWriter`); a folder whose data cannot work is
said so (`data_warnings`). The folder it writes, and how it is read back, are in shards.py; encoding in encoder.py.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import sys
from collections import Counter, deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import asdict
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer
from tqdm import tqdm

from burnout.base.files import TOKENIZER_FILE, write_atomic
from burnout.base.folders import FolderLock, check_output_folder
from burnout.base.text import format_count, plural
from burnout.config import DataConfig, TokenizerConfig
from burnout.data import shards
from burnout.data.clean import Cleaner
from burnout.data.corpus import MixedCorpus, interleave_rng, iter_source, mix_corpus, source_signature
from burnout.data.encoder import CHUNKS_AHEAD, Encoder
from burnout.data.split import SPLIT_RULE, ValSplit, is_cut, length_class, split_warnings
from burnout.data.tokenizer import (
    build_tokenizer,
    eot_id,
    load_tokenizer,
    name_characters,
    tokenizer_kind,
    tokenizer_sha256,
)
from burnout.errors import BurnoutError, StorageError

# Shard-format functions are called through `shards.` (not imported by name), so that one change to
# them (or a test's patch) reaches every caller, the shard writer's own calls included.

# About this many train tokens per parameter make the most of a model's size (Hoffmann et al. 2022, "Chinchilla").
CHINCHILLA_TOKENS_PER_PARAM = 20
# Under this many train tokens per parameter a model memorises its text instead of learning from it (what sets
# it: docs/USAGE.md, "Your own text").
FAR_TOO_FEW_TOKENS_PER_PARAM = 0.01
# The parameters of the smallest model preset (shakespeare-char, `burnout model list`): data far too small for it
# is far too small for every preset. tests/data/test_prepare.py keeps it equal to the presets' smallest.
SMALLEST_PRESET_PARAMS = 421_504
# Documents (or characters) read from one source before they are encoded together. Encoding a chunk
# briefly holds Hugging Face Encoding objects, several values per token, which set prepare's peak memory:
# 1M characters keep it flat whatever the corpus size; larger chunks take more memory for no more speed
# (docs/PERFORMANCE.md).
ENCODE_CHUNK_DOCS = 1024
ENCODE_CHUNK_CHARS = 1_000_000


def _print_to_stderr(line: str) -> None:
    print(line, file=sys.stderr)


def prepare_data(
    data_cfg: DataConfig,
    tok_cfg: TokenizerConfig,
    out_dir: str | Path,
    tokenizer_path: str | Path | None = None,
    progress: bool = False,
    overwrite: bool = False,
    workers: int | None = None,
    warn: Callable[[str], None] = _print_to_stderr,
) -> dict:
    """Mix, clean, tokenize and write a sharded data directory; returns its meta (also meta.json).

    An unfinished directory (manifest but no meta) prepared with the same settings is resumed.
    `workers`: 1 encodes on one thread; more use the tokenizer's thread pool (None: one per CPU core).
    `out_dir` is new, empty or a data folder of burnout's, never one holding the sources or anything else;
    one process at a time prepares it (a second is refused in one line naming the first).
    `warn` is given each line of `data_warnings` about the data it made: a val split that is not a fair sample
    (split.py), or train tokens too few for any model preset to learn from (train says it again against the model
    it trains).
    """
    data_cfg.validate()
    tok_cfg.validate()
    out_dir = Path(out_dir)
    check_output_folder(out_dir, "data folder", "data", reads=_source_paths(data_cfg), recognise=data_folder_owner)
    with FolderLock(out_dir):
        try:
            meta = _prepare(data_cfg, tok_cfg, out_dir, tokenizer_path, progress, overwrite, workers)
        except OSError as exc:
            if exc.filename is not None:  # the error names its path already
                raise
            # A write to an open file (a shard) fails without a file name: a full disk (ENOSPC, EFBIG) says nothing
            # of where.
            raise StorageError(f"writing the prepared data into '{out_dir}' failed ({exc.strerror or exc}); free "
                               "space on its disk, then run the same command again: it goes on where it stopped"
                               ) from None
    for line in data_warnings(meta):
        warn(line)
    return meta


def data_warnings(meta: dict) -> list[str]:
    """A line for each thing that makes the prepared data of `meta` unfit to train on, or less than its sources: a
    val split that is not a fair sample of the text (`split_warnings`); train tokens far too few for any model
    preset to learn from; characters the tokenizer could not encode, left out."""
    train = meta["splits"]["train"]["tokens"]
    lines = [*split_warnings(meta), dropped_warning(meta)]
    if train < FAR_TOO_FEW_TOKENS_PER_PARAM * SMALLEST_PRESET_PARAMS:
        lines.append(f"warning: {plural(train, 'train token')}, far too few to learn from for any model preset: "
                     f"~{CHINCHILLA_TOKENS_PER_PARAM} per parameter is usual (Chinchilla), so they suit "
                     f"~{format_count(train / CHINCHILLA_TOKENS_PER_PARAM)} parameters; the smallest preset "
                     f"({SMALLEST_PRESET_PARAMS:,} parameters) would get {train / SMALLEST_PRESET_PARAMS:.2g} per "
                     f"parameter, under the {FAR_TOO_FEW_TOKENS_PER_PARAM:g} where a model memorises its text; "
                     "add text")
    return [line for line in lines if line]


# The characters meta.json names of those left out, most frequent first.
DROPPED_SHOWN = 20
# A tokenizer may leave out at most this share of the characters: a char vocabulary taken from a sample of the same
# text misses only rare ones (a name in another script), far fewer; more means the tokenizer was made for another
# text. Checked once this many characters are read (a few rare ones early on say little), and at the end.
MAX_DROPPED_SHARE = 0.01
DROPPED_CHECK_CHARS = 100_000


def dropped_report(dropped: Counter, documents: int) -> dict:
    """meta.json's record of the characters left out because the tokenizer could not encode them: how many, from how
    many documents, and the most frequent (character, code point, count), ties in code point order."""
    ranked = sorted(dropped.items(), key=lambda item: (-item[1], item[0]))  # ties by code point: whatever the order
    return {"characters": dropped.total(), "distinct": len(dropped), "documents": documents,
            "most_common": [[char, f"U+{ord(char):04X}", count] for char, count in ranked[:DROPPED_SHOWN]]}


def dropped_warning(meta: dict) -> str | None:
    """A line when characters were left out of the documents because the tokenizer could not encode them.

    They are left out rather than the preparation refused: a char tokenizer has tokens for the characters of its
    sample (data.max_chars) only, and a character past the sample is rare by that very fact (a CJK name in an
    English corpus); refusing would throw the preparation away over it, while an <unk> id would need a token the
    tokenizer was not trained with. More than MAX_DROPPED_SHARE of the text is refused instead (_SplitWriter's
    _check_dropped). A lone surrogate (a JSON \\ud800 escape without its pair) is no character."""
    report = meta.get("dropped_characters") or {}
    if not report.get("characters"):
        return None
    chars = [char for char, _, _ in report["most_common"]]
    surrogates = [c for c in chars if 0xD800 <= ord(c) <= 0xDFFF]
    fixes = (["to keep them, raise data.max_chars so that the tokenizer's sample holds them, or use "
              "tokenizer.kind: bpe, which encodes any character"] if len(surrogates) < len(chars) else [])
    fixes += ["a lone surrogate (a JSON \\ud800 escape without its pair) is no character"] if surrogates else []
    return (f"warning: left out {plural(report['characters'], 'character')} that the tokenizer cannot encode, from "
            f"{plural(report['documents'], 'document')}: {name_characters(chars, report['distinct'])}; "
            + "; ".join(fixes))



def tokens_per_param_warning(train_tokens: int, params: int) -> str | None:
    """A line when `train_tokens` are far too few for a model of `params` parameters to learn from, else None."""
    ratio = train_tokens / params
    if ratio >= FAR_TOO_FEW_TOKENS_PER_PARAM:
        return None
    return (f"warning: {plural(train_tokens, 'train token')} for {plural(params, 'parameter')}: {ratio:.2g} tokens "
            f"per parameter, far too few to learn from (under {FAR_TOO_FEW_TOKENS_PER_PARAM:g} a model memorises "
            f"its text; about {CHINCHILLA_TOKENS_PER_PARAM} is usual, Chinchilla): add text, or train a smaller model")


def _prepare(data_cfg: DataConfig, tok_cfg: TokenizerConfig, out_dir: Path, tokenizer_path: str | Path | None,
             progress: bool, overwrite: bool, workers: int | None) -> dict:
    """prepare_data's work, in a folder this process holds."""
    meta_path = out_dir / shards.META_FILE
    if meta_path.exists():
        if not overwrite:
            raise BurnoutError(
                f"'{out_dir}' already holds prepared data ({shards.META_FILE} exists); "
                f"choose another output folder or overwrite it"
            )
        # Unfinished from here on: if this run dies half way, the old meta must not vouch for new files.
        meta_path.unlink()
        shards.remove_outputs(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for stale in out_dir.glob(".*.tmp-*"):
        stale.unlink(missing_ok=True)
    if workers is not None and workers < 1:
        raise BurnoutError(f"--workers: {workers} must be at least 1 (1 encodes on one thread, more in parallel)")
    workers = workers or min(os.cpu_count() or 1, 8)

    given = load_tokenizer(tokenizer_path) if tokenizer_path is not None else None
    fingerprint = _fingerprint(data_cfg, tok_cfg, given)
    manifest = shards.load_manifest(out_dir, fingerprint)
    shards.save_manifest(out_dir, manifest)  # now: the folder is told as burnout's data whatever else it holds

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
            tok = train_mix_tokenizer(data_cfg, tok_cfg, sample)
        write_atomic(out_dir / TOKENIZER_FILE, tok.to_str(pretty=True))
        manifest = shards.new_manifest(fingerprint)
        manifest["tokenizer_sha256"] = tokenizer_sha256(tok)
    vocab_size = tok.get_vocab_size()
    dtype = shards.token_dtype(vocab_size)
    eot = eot_id(tok)

    with Encoder(tok, workers) as encoder:
        if manifest["total_tokens"] is None:
            if data_cfg.max_tokens is not None:
                manifest["total_tokens"] = data_cfg.max_tokens
            else:
                if sample is None:
                    sample = tokenizer_sample(data_cfg)
                lengths = [len(ids) + 1 for chunk in _encode_chunks(sample.train_docs + sample.val_docs)
                           for ids in encoder.encode(chunk)]
                manifest["total_tokens"] = _sample_budget(lengths, sample.train_sources + sample.val_sources, data_cfg)
        shards.save_manifest(out_dir, manifest)
        meta = _SplitWriter(data_cfg, manifest, out_dir, encoder, eot, dtype).run(progress)

    meta = {
        "format": shards.FORMAT,
        "split_rule": SPLIT_RULE,
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
    write_atomic(meta_path, json.dumps(meta, indent=2) + "\n")
    return meta


def _source_paths(cfg: DataConfig) -> list[Path]:
    """What the sources read: each file source's file or folder (a glob's: the folder it starts from)."""
    paths = []
    for source in cfg.sources:
        if source.path:
            parts = Path(os.path.expanduser(source.path)).parts
            fixed = list(itertools.takewhile(lambda part: not set("*?[") & set(part), parts))
            paths.append(Path(*fixed) if fixed else Path("."))
    return paths


def data_folder_owner(folder: Path) -> dict | None:
    """A data folder is told by its manifest (written before anything else) or meta, in burnout's format."""
    for name in (shards.MANIFEST_FILE, shards.META_FILE):
        try:
            found = json.loads((folder / name).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(found, dict) and found.get("format") in (shards.FORMAT, *shards.LEGACY_FORMATS):
            return {"kind": "data", "source": None}
    return None


def tokenizer_sample(data_cfg: DataConfig) -> MixedCorpus:
    """The cleaned, weighted `max_chars` sample of the sources that a tokenizer is trained on."""
    cleaner = Cleaner(data_cfg)
    return mix_corpus(data_cfg, cleaner if cleaner.active else None)


def train_mix_tokenizer(data_cfg: DataConfig, tok_cfg: TokenizerConfig,
                        sample: MixedCorpus | None = None) -> Tokenizer:
    """The tokenizer a data mix asks for: GPT-2's read from its files, or one trained on the sample."""
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
    background when workers > 1, so reading, cleaning and writing overlap encoding: memory holds up to three
    encode chunks per source and one document per split, not the corpus. Every chunk read
    is appended to `fill_log` as [source, texts read, source exhausted]: replaying the log rebuilds the
    cleaner's state without encoding (see resume).
    """

    def __init__(self, index: int, source, seed: int, cleaner: Cleaner, encoder: Encoder, fill_log: list) -> None:
        self.index, self.name = index, source.name
        self.texts = iter_source(source, seed)
        self.cleaner = cleaner
        self.encoder = encoder
        self.fill_log = fill_log
        self.ready: deque[tuple[np.ndarray, int, Counter]] = deque()
        self.chunks: deque[Future] = deque()  # read and cleaned, encoded or being encoded
        self.exhausted = False
        self.taken = 0  # documents handed out by next()
        # Chunks start small and double: a source that needs few documents reads few past its budget.
        self.chunk_docs = 8

    def next(self) -> tuple[np.ndarray, int, Counter] | None:
        """(token ids, characters, the characters the tokenizer could not encode, left out) of the next document, or
        None when the source has run out."""
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
                text = self.cleaner(text, self.name)  # counted per source in meta.json
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
    would hold the Encoding objects of the whole sample at once."""
    chunk, chars = [], 0
    for doc in docs:
        chunk.append(doc)
        chars += len(doc)
        if chars >= ENCODE_CHUNK_CHARS:
            yield chunk
            chunk, chars = [], 0
    if chunk:
        yield chunk


def _sample_budget(lengths: list[int], sources: list[int], cfg: DataConfig) -> int:
    """The token budget that prepares every document of the sample: their `lengths` (with <|endoftext|>; `sources`,
    each one's source index), and the <|endoftext|> each document cut between train and val adds (every one in a
    contiguous split; those `is_cut` names otherwise: a larger budget only raises its threshold)."""
    total = sum(lengths)
    if cfg.split == "contiguous":
        return total + len(lengths)
    budgets = _budgets(cfg, total)
    return total + sum(is_cut(length, budgets[cfg.sources[i].name], cfg.val_fraction)
                       for length, i in zip(lengths, sources))


def _budgets(cfg: DataConfig, total_tokens: int) -> dict[str, int]:
    total_weight = sum(s.weight for s in cfg.sources)
    return {s.name: int(total_tokens * s.weight / total_weight) for s in cfg.sources}


class _SplitWriter:
    """Mixes the sources' documents into the train and val splits and writes each split's shards.

    Mixing is by TOKEN share: source s contributes weight_s / sum(weights) of the token budget (data.max_tokens,
    or, when unset, the token count of the max_chars sample the tokenizer is trained on). Each source is read in
    its seeded order; documents of the sources are interleaved in a seeded order that draws each source in
    proportion to the budget it still has left. Which of each document's tokens go to val is split.py's
    `ValSplit`: a fair sample of the text by tokens, whole documents sampled within their length class, a document
    larger than a tenth of its source's val share cut (its end to val). The document that crosses a source's
    budget is cut (and still ends with <|endoftext|>).

    It holds the whole state of the mix: the interleaving rng, each source's remaining budget and the
    tokens it has given (all, and to val), the per-split counts, the shard writers and the document
    index writers (each document's start in its split's stream and its source: a contiguous split's
    train and val parts are a document of each split, of the same source). Built on a
    manifest with a usable resume point it continues from that point; otherwise it starts afresh
    (shards the manifest already lists are still not written again).

    Each time a shard is finished the manifest also records a resume point (at the next document boundary): the
    mixer's random state and counters, each source's position, the log of chunks read so far and how far each
    split's partial shard (`.NAME.partial`) is filled. A resume reads and cleans the logged chunks again
    (rebuilding dedup exactly) but encodes only documents not yet written, cuts the partial shards back to the
    recorded length and goes on. Without a usable point (killed before the first shard, or a partial shard lost)
    the stream is replayed from the start.
    """

    def __init__(self, cfg: DataConfig, manifest: dict, out_dir: Path, encoder: Encoder, eot: int,
                 dtype: np.dtype) -> None:
        self.cfg, self.manifest, self.out_dir, self.eot, self.dtype = cfg, manifest, out_dir, eot, dtype
        self.budgets = _budgets(cfg, manifest["total_tokens"])
        self.cleaner = Cleaner(cfg)
        self.fill_log: list = []
        self.streams = [_SourceStream(i, s, cfg.seed, self.cleaner, encoder, self.fill_log) if s.weight > 0 else None
                        for i, s in enumerate(cfg.sources)]
        self.names = [s.name for s in cfg.sources]
        self.rng = interleave_rng(cfg.seed, "mix")
        self.split = ValSplit(cfg.val_fraction, cfg.seed, self.names, self.budgets)
        point = _usable_resume_point(manifest, out_dir, dtype)
        positions = self._start() if point is None else self._restore(point)
        self.writers = {split: shards.ShardWriter(out_dir, split, cfg.shard_tokens, dtype, manifest, *positions[split])
                        for split in shards.SPLITS}
        # Each document's start in its split's stream and its source (documents.py reads them back).
        counts = point["documents"] if point is not None else {}
        self.doc_writers = {split: shards.DocumentIndexWriter(out_dir, split, counts.get(split, 0))
                            for split in shards.SPLITS}

    def _start(self) -> dict:
        """Start the mix from the first document; returns where each split's writer starts."""
        for stale in self.out_dir.glob(".*.partial"):
            stale.unlink()
        # Per split and source: tokens, documents (parts of one cut in two count in each split), characters,
        # tokens by length class; "cut": the documents cut between the splits (counted in val).
        self.stats = {split: {name: {"tokens": 0, "documents": 0, "chars": 0, "lengths": {}, "cut": 0}
                              for name in self.names} for split in shards.SPLITS}
        self.remaining = np.array([self.budgets[n] if self.streams[i] else 0 for i, n in enumerate(self.names)],
                                  dtype=np.int64)
        self.taken = np.zeros(len(self.names), dtype=np.int64)
        self.taken_val = np.zeros(len(self.names), dtype=np.int64)
        self.dropped, self.dropped_documents, self.seen_chars = Counter(), 0, 0
        return {split: (0, 0) for split in shards.SPLITS}

    def _restore(self, point: dict) -> dict:
        """Continue from the last resume point instead of replaying (and encoding) from the start;
        returns where each split's writer starts: [shard index, tokens filled]."""
        _restore_streams(self.streams, point["fills"], point["taken_docs"])
        self.stats = point["stats"]
        self.remaining, self.taken, self.taken_val = (np.array(point[key], dtype=np.int64)
                                                      for key in ("remaining", "taken", "taken_val"))
        self.rng.bit_generator.state = point["rng"]
        self.split.restore(point["val_split"])
        self.dropped, self.dropped_documents = Counter(point.get("dropped", {})), point.get("dropped_documents", 0)
        self.seen_chars = point.get("seen_chars", 0)
        return point["writers"]

    def _save_resume_point(self) -> None:
        # NOTE: taken at a document boundary (never mid-document), after the partial shards are flushed.
        for writer in self.writers.values():
            writer.flush()
            writer.finished_any = False
        for doc_writer in self.doc_writers.values():
            doc_writer.flush()
        self.manifest["resume"] = {
            "fills": self.fill_log, "taken_docs": [stream.taken if stream else 0 for stream in self.streams],
            "rng": self.rng.bit_generator.state, "remaining": self.remaining.tolist(), "taken": self.taken.tolist(),
            "taken_val": self.taken_val.tolist(), "val_split": self.split.state(),
            "stats": json.loads(json.dumps(self.stats)),  # a copy: it goes on counting
            "writers": {split: [writer.index, writer.filled] for split, writer in self.writers.items()},
            "documents": {split: doc_writer.count for split, doc_writer in self.doc_writers.items()},
            "dropped": dict(self.dropped), "dropped_documents": self.dropped_documents, "seen_chars": self.seen_chars,
        }
        shards.save_manifest(self.out_dir, self.manifest)

    def run(self, progress: bool) -> dict:
        """Write both splits to the end of the budget; returns their part of the meta."""
        remaining = self.remaining
        with tqdm(total=int(remaining.sum()), desc="tokenizing", unit="tok", unit_scale=True,
                  disable=not progress) as bar:
            while remaining.sum() > 0:
                if any(writer.finished_any for writer in self.writers.values()):
                    self._save_resume_point()
                active = np.flatnonzero(remaining > 0)
                cumulative = np.cumsum(remaining[active])
                i = int(active[np.searchsorted(cumulative, self.rng.random() * cumulative[-1], side="right")])
                item = self.streams[i].next()
                if item is None:  # the source ran out: its shortfall is reported
                    remaining[i] = 0
                    continue
                ids, chars, left_out = item
                self.seen_chars += chars + left_out.total()
                if left_out:
                    self.dropped.update(left_out)
                    self.dropped_documents += 1
                    self._check_dropped(final=False)
                if self.cfg.split == "contiguous":
                    self._add_contiguous(i, ids, chars, bar)
                else:
                    self._add_document(i, ids, chars, bar)
        self._check_dropped(final=True)
        splits = self._finish()
        return {"splits": splits, "sources": self._source_report(splits), "cleaning": self.cleaner.report(),
                "dropped_characters": dropped_report(self.dropped, self.dropped_documents),
                "document_index": self._document_index}

    def _check_dropped(self, final: bool) -> None:
        """Refuse a tokenizer that cannot encode more than MAX_DROPPED_SHARE of the characters read (from
        DROPPED_CHECK_CHARS of them on, or at the end): it was not made for this text, and leaving the characters out
        would leave little of it."""
        dropped, seen = self.dropped.total(), self.seen_chars
        if dropped <= MAX_DROPPED_SHARE * seen or not (final or seen >= DROPPED_CHECK_CHARS):
            return
        named = name_characters([c for c, _, _ in dropped_report(self.dropped, 0)["most_common"]], len(self.dropped))
        raise BurnoutError(f"the tokenizer has no token for {dropped:,} of the first {seen:,} characters of the data "
                           f"({dropped / seen:.1%}, more than the {MAX_DROPPED_SHARE:.0%} it may leave out): {named}; "
                           "it was not made for this text: prepare with a tokenizer trained on it (a char one on a "
                           "sample of it), or tokenizer.kind: bpe, which encodes any character")

    def _add_document(self, i: int, ids: np.ndarray, chars: int, bar) -> None:
        """Source i's next document, cut at its budget, whole to val or to train, or cut in two (`ValSplit`): its
        end to val, the rest to train, each part ending with <|endoftext|>."""
        length = min(len(ids) + 1, int(self.remaining[i]))
        val_tokens = self.split.val_tokens(i, length, first_due=self.taken_val[i] == 0 and self.taken[i] > 0)
        group = length_class(length)
        if val_tokens in (0, length):
            part_chars = chars if length == len(ids) + 1 else round(chars * length / (len(ids) + 1))
            self._add_part("val" if val_tokens else "train", i, ids[: length - 1], part_chars, bar, group)
            return
        # Both parts' <|endoftext|> within the budget: a document that meets it exactly gives up its last token.
        body = ids[: min(len(ids), int(self.remaining[i]) - 2)]
        cut = len(body) - val_tokens + 1
        for split, part in (("train", body[:cut]), ("val", body[cut:])):
            self._add_part(split, i, part, round(chars * len(part) / len(ids)), bar, group)
        self.stats["val"][self.names[i]]["cut"] += 1

    def _add_part(self, split: str, i: int, ids: np.ndarray, chars: int, bar, group: int) -> None:
        """A document of source i, or a part of one, with <|endoftext|> after it, to `split`, counted (under the
        length class `group` of the whole document)."""
        doc = np.empty(len(ids) + 1, dtype=self.dtype)
        doc[:-1] = ids
        doc[-1] = self.eot
        self._write(split, i, doc, chars, bar, group)
        self.taken[i] += len(doc)
        self.taken_val[i] += len(doc) if split == "val" else 0
        self.remaining[i] -= len(doc)

    def _add_contiguous(self, i: int, ids: np.ndarray, chars: int, bar) -> None:
        """data.split=contiguous: the document's first 1 - val_fraction of tokens (+ <|endoftext|>) to train,
        the rest (+ <|endoftext|>) to val, as nanoGPT splits data[:int(n * 0.9)] / data[int(n * 0.9):]."""
        budget = int(self.remaining[i])
        whole = len(ids)
        ids = ids[: max(budget - 2, 0)]
        cut = int(len(ids) * (1 - self.cfg.val_fraction))
        for split, part in (("train", ids[:cut]), ("val", ids[cut:])):
            doc = np.empty(len(part) + 1, dtype=self.dtype)
            doc[:-1] = part
            doc[-1] = self.eot
            self._write(split, i, doc, round(chars * len(part) / max(len(ids), 1)), bar, length_class(whole + 1))
        self.stats["val"][self.names[i]]["cut"] += 1
        self.remaining[i] -= min(whole + 2, budget)

    def _write(self, split: str, i: int, doc: np.ndarray, chars: int, bar, group: int) -> None:
        """Append `doc` (a document of source i, or part of one, holding `chars` characters, of a whole document in
        the length class `group`) to `split`."""
        self.doc_writers[split].add(self.writers[split].position, i)
        self.writers[split].add(doc)
        entry = self.stats[split][self.names[i]]
        entry["tokens"] += len(doc)
        entry["documents"] += 1
        entry["chars"] += chars
        entry["lengths"][str(group)] = entry["lengths"].get(str(group), 0) + len(doc)
        bar.update(len(doc))

    def _finish(self) -> dict:
        """Finish both splits' last shards and list them; the manifest drops its resume point."""
        splits = {}
        for split in shards.SPLITS:
            done = self.writers[split].finish()
            tokens = sum(s["tokens"] for s in done)
            if tokens == 0:
                raise BurnoutError(
                    f"the {split} split came out empty; "
                    f"raise data.max_tokens (or data.max_chars) or add text to the sources"
                )
            documents = sum(e["documents"] for e in self.stats[split].values())
            splits[split] = {"tokens": tokens, "documents": documents, "shards": done}
        files = {split: self.doc_writers[split].finish()["file"] for split in shards.SPLITS}
        self._document_index = {"format": shards.DOCS_FORMAT, "files": files, "sources": self.names,
                                "bytes_per_document": shards.DOCS_DTYPE.itemsize}
        self.manifest.pop("resume", None)  # every shard is listed: nothing is left to resume
        shards.save_manifest(self.out_dir, self.manifest)
        return splits

    def _source_report(self, splits: dict) -> dict:
        """Each source's tokens, documents and share against its target, and the totals."""
        total = sum(splits[s]["tokens"] for s in shards.SPLITS)
        total_weight = sum(s.weight for s in self.cfg.sources)
        per_source = {}
        for source in self.cfg.sources:
            train, val = self.stats["train"][source.name], self.stats["val"][source.name]
            budget = self.budgets[source.name]
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
                # The source's documents: one cut between train and val counts once.
                "documents": train["documents"] + val["documents"] - val["cut"],
                "train_documents": train["documents"],
                "val_documents": val["documents"],
                "cut_documents": val["cut"],
                "chars": train["chars"] + val["chars"],
                # Tokens by the length class of their whole document (split.length_class): val's fairness.
                "lengths": {"train": train["lengths"], "val": val["lengths"]},
            }
        totals = {
            "tokens": total,
            "budget_tokens": self.manifest["total_tokens"],
            "train_tokens": splits["train"]["tokens"],
            "val_tokens": splits["val"]["tokens"],
            "documents": sum(e["documents"] for e in per_source.values()),
            "train_documents": splits["train"]["documents"],
            "val_documents": splits["val"]["documents"],
            "cut_documents": sum(e["cut_documents"] for e in per_source.values()),
            "chars": sum(e["chars"] for e in per_source.values()),
        }
        return {"per_source": per_source, "total": totals}


# ----------------------------------------------------------------------------------------------
# Resume


def _usable_resume_point(manifest: dict, out_dir: Path, dtype: np.dtype) -> dict | None:
    """The manifest's resume point when the files it counts on are there, else None (replay from the start)."""
    point = manifest.get("resume")
    if not point or "documents" not in point:  # a point without the document index counts: replay
        return None
    for split, count in point["documents"].items():
        docs = shards.partial_path(out_dir, shards.docs_name(split))
        if count and (not docs.is_file() or docs.stat().st_size < count * shards.DOCS_DTYPE.itemsize):
            return None
    for split, (index, filled) in point["writers"].items():
        name = shards.shard_name(split, index)
        listed = manifest["shards"].get(split, [])
        if index < len(listed) and (out_dir / name).is_file():
            continue  # finished after the point was saved: the writer skips it
        partial = shards.partial_path(out_dir, name)
        if filled and (not partial.is_file() or partial.stat().st_size < filled * dtype.itemsize):
            return None
    return point


def _fingerprint(data_cfg: DataConfig, tok_cfg: TokenizerConfig, given: Tokenizer | None) -> str:
    """Identifies the settings and source files an unfinished directory was prepared from: a resume
    continues only with the same fingerprint (sources edited in between mean starting over)."""
    settings = {
        "format": shards.FORMAT,
        "split_rule": SPLIT_RULE,
        "data": asdict(data_cfg),
        "sources": [source_signature(source) for source in data_cfg.sources if source.weight > 0],
        "tokenizer": asdict(tok_cfg),
        "given_tokenizer": tokenizer_sha256(given) if given is not None else None,
    }
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()
