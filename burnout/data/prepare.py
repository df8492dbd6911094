"""Corpus → tokenizer → flat token files, plus the meta.json that describes them.

Layout of a prepared data directory:

    train.bin, val.bin   every document's token ids followed by <|endoftext|>, back to back,
                         raw little-endian uint16 (uint32 when the vocabulary exceeds 65536)
    tokenizer.json       the HF tokenizer that produced them
    meta.json            format, dtype, counts and checksums; written last, so its presence
                         means the directory is complete
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer
from tqdm import tqdm

from burnout.config import DataConfig, TokenizerConfig
from burnout.data.corpus import mix_corpus
from burnout.data.tokenizer import eot_id, load_tokenizer, tokenizer_kind, tokenizer_sha256, train_tokenizer
from burnout.errors import BurnoutError

FORMAT = "burnout-tokens-v1"
META_FILE = "meta.json"
TOKENIZER_FILE = "tokenizer.json"
SPLITS = ("train", "val")
# Documents per encode_batch call: large enough to keep the Rust thread pool busy, small enough
# that the ids of one chunk stay a modest amount of Python memory.
ENCODE_CHUNK_DOCS = 256


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype("<u2") if vocab_size <= 2**16 else np.dtype("<u4")


def prepare_data(
    data_cfg: DataConfig,
    tok_cfg: TokenizerConfig,
    out_dir: str | Path,
    tokenizer_path: str | Path | None = None,
    progress: bool = False,
    overwrite: bool = False,
) -> dict:
    """Mix, tokenize and write a data directory; returns its meta (also saved as meta.json)."""
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
    out_dir.mkdir(parents=True, exist_ok=True)

    mixed = mix_corpus(data_cfg)
    if tokenizer_path is not None:
        tok = load_tokenizer(tokenizer_path)
    elif tok_cfg.kind == "char":
        # The character inventory carries no sequence statistics, so taking it from both splits leaks
        # nothing, and a character seen only in val would otherwise make val impossible to encode.
        tok = train_tokenizer(mixed.train_docs + mixed.val_docs, tok_cfg)
    else:
        tok = train_tokenizer(mixed.train_docs, tok_cfg)
    vocab_size = tok.get_vocab_size()
    dtype = token_dtype(vocab_size)
    eot = eot_id(tok)

    splits = {}
    tokens_per_source = np.zeros((len(SPLITS), len(data_cfg.sources)), dtype=np.int64)
    for split_index, (split, docs, sources) in enumerate(
        [("train", mixed.train_docs, mixed.train_sources), ("val", mixed.val_docs, mixed.val_sources)]
    ):
        file_name = f"{split}.bin"
        doc_tokens, sha256 = _write_tokens(tok, docs, eot, dtype, out_dir / file_name, split, progress)
        np.add.at(tokens_per_source[split_index], sources, doc_tokens)
        splits[split] = {"tokens": int(doc_tokens.sum()), "documents": len(docs), "file": file_name, "sha256": sha256}

    _write_atomic(out_dir / TOKENIZER_FILE, tok.to_str(pretty=True).encode("utf-8"))

    sources_report = mixed.report
    for index, source in enumerate(data_cfg.sources):
        entry = sources_report["per_source"].get(source.name)
        if entry is not None:
            entry["train_tokens"] = int(tokens_per_source[0, index])
            entry["val_tokens"] = int(tokens_per_source[1, index])
    sources_report["total"]["train_tokens"] = splits["train"]["tokens"]
    sources_report["total"]["val_tokens"] = splits["val"]["tokens"]

    meta = {
        "format": FORMAT,
        "dtype": dtype.name,
        "vocab_size": vocab_size,
        "eot_id": eot,
        "tokenizer_sha256": tokenizer_sha256(tok),
        "tokenizer_kind": tokenizer_kind(tok),
        "splits": splits,
        "sources": sources_report,
        "data_config": asdict(data_cfg),
        "tokenizer_config": asdict(tok_cfg),
    }
    _write_atomic(meta_path, (json.dumps(meta, indent=2) + "\n").encode("utf-8"))
    return meta


def _write_tokens(
    tok: Tokenizer, docs: list[str], eot: int, dtype: np.dtype, path: Path, split: str, progress: bool
) -> tuple[np.ndarray, str]:
    """Encode `docs` into `path`, each followed by `eot`; returns (tokens per document, sha256 of the file)."""
    doc_tokens = np.zeros(len(docs), dtype=np.int64)
    digest = hashlib.sha256()
    tmp_path = _tmp_name(path)
    try:
        with open(tmp_path, "wb") as f, tqdm(
            total=len(docs), desc=f"tokenizing {split}", unit="doc", disable=not progress
        ) as bar:
            for start in range(0, len(docs), ENCODE_CHUNK_DOCS):
                chunk = docs[start : start + ENCODE_CHUNK_DOCS]
                encodings = _encode_chunk(tok, chunk, split)
                flat_ids: list[int] = []
                for i, enc in enumerate(encodings, start=start):
                    flat_ids += enc.ids
                    flat_ids.append(eot)
                    doc_tokens[i] = len(enc.ids) + 1
                data = np.asarray(flat_ids, dtype=dtype).tobytes()
                digest.update(data)
                f.write(data)
                bar.update(len(chunk))
        os.replace(tmp_path, path)
    finally:
        tmp_path.unlink(missing_ok=True)
    return doc_tokens, digest.hexdigest()


def _encode_chunk(tok: Tokenizer, docs: list[str], split: str) -> list:
    try:
        return tok.encode_batch(docs, add_special_tokens=False)
    except Exception:  # the Rust side raises a bare Exception, e.g. for a character a char vocab lacks
        vocab = tok.get_vocab()
        unknown = sorted({c for doc in docs for c in doc} - vocab.keys())
        if not unknown:
            raise
        shown = ", ".join(repr(c) for c in unknown[:5])
        raise BurnoutError(
            f"the tokenizer has no token for {len(unknown)} character(s) of the {split} split ({shown}); "
            "retrain the tokenizer on this data or use tokenizer.kind: bpe"
        ) from None


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
    """The meta of a finished data directory, after checking that its token files are whole."""
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
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        found = meta.get("format") if isinstance(meta, dict) else None
        raise BurnoutError(f"'{meta_path}' has format {found!r}, expected '{FORMAT}'; prepare the data again with this version")
    try:
        _check_token_files(data_dir, meta)
    except (KeyError, TypeError, ValueError) as exc:
        raise BurnoutError(f"'{meta_path}' is malformed ({type(exc).__name__}: {exc}); prepare the data again") from None
    return meta


def _check_token_files(data_dir: Path, meta: dict) -> None:
    itemsize = np.dtype(meta["dtype"]).itemsize
    for info in meta["splits"].values():
        path = data_dir / info["file"]
        expected = info["tokens"] * itemsize
        actual = path.stat().st_size if path.is_file() else None
        if actual != expected:
            state = "is missing" if actual is None else f"is {actual} bytes"
            raise BurnoutError(
                f"'{path}' {state} but {META_FILE} expects {expected} ({info['tokens']} {meta['dtype']} tokens); "
                "the file is truncated or from another run, prepare the data again"
            )
