"""The on-disk format of a prepared data directory: writing shards, keeping the manifest, reading it back.

Layout of a prepared data directory:

    train_000000.bin ...  token ids of the split, documents back to back, each followed by
    val_000000.bin ...    <|endoftext|>; raw little-endian uint16 (uint32 when the vocabulary exceeds
                          65536); every shard holds data.shard_tokens tokens except the last
    train_docs.npy        the document index of each split (see documents.py): one packed record per
    val_docs.npy          document, its first token's offset in the split's token stream (uint64) and
                          its source's number in meta.json's document_index.sources (uint16), 10 bytes
    tokenizer.json        the HF tokenizer that produced them
    manifest.json         finished shards (file, tokens, sha256) and the fingerprint of the settings
                          that produced them; rewritten after each shard
    meta.json             format, dtype, counts, shares, cleaning report and checksums; written last,
                          so its presence means the directory is complete

The shard being filled is the hidden file `.NAME.partial` until it is finished; so is the document
index of a split (`.SPLIT_docs.npy.partial`, raw records, turned into the .npy when prepare ends).
Readers (training, evaluation, benchmarks) import only this module: numpy and the standard library,
no tokenizer.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np

from burnout.base.files import RUN_CONFIG_FILE, TOKENIZER_FILE, sha256_file, write_atomic
from burnout.base.folders import folder_owner
from burnout.config import read_saved_config
from burnout.errors import BurnoutError

FORMAT = "burnout-tokens-v2"
LEGACY_FORMATS = ("burnout-tokens-v1",)
META_FILE = "meta.json"
MANIFEST_FILE = "manifest.json"
SPLITS = ("train", "val")
# One record per document of a split: where its first token sits in the split's token stream (the
# shards back to back) and the number of its source. Packed: 10 bytes per document.
DOCS_FORMAT = "burnout-docs-v1"
DOCS_DTYPE = np.dtype([("start", "<u8"), ("source", "<u2")])


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype("<u2") if vocab_size <= 2**16 else np.dtype("<u4")


def shard_name(split: str, index: int) -> str:
    return f"{split}_{index:06d}.bin"


def partial_path(out_dir: Path, name: str) -> Path:
    return out_dir / f".{name}.partial"


def docs_name(split: str) -> str:
    return f"{split}_docs.npy"


# ----------------------------------------------------------------------------------------------
# Writing: shards and manifest


class ShardWriter:
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
            if (entry["file"] == name and path.is_file()
                    and path.stat().st_size == entry["tokens"] * self.dtype.itemsize):
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

    @property
    def position(self) -> int:
        """Tokens of the split written so far (every shard before the current one is full)."""
        return self.index * self.shard_tokens + self.filled

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
        save_manifest(self.out_dir, self.manifest)

    def finish(self) -> list[dict]:
        if self._skip and self.filled < self.done[self.index]["tokens"]:
            # Replay produced less than the listed shard held: it cannot be from these settings.
            raise BurnoutError(f"'{self.out_dir}': shard {shard_name(self.split, self.index)} does not match a replay; "
                               f"prepare with overwrite")
        self._close()
        end = self.index + (1 if self.filled else 0)
        for extra in self.done[end:]:
            (self.out_dir / extra["file"]).unlink(missing_ok=True)
        del self.done[end:]
        save_manifest(self.out_dir, self.manifest)
        return list(self.done)


class DocumentIndexWriter:
    """Writes a split's document index: one DOCS_DTYPE record per document, in stream order.

    Records go to the hidden `.SPLIT_docs.npy.partial` as they come; a writer resumed with `count`
    keeps the first `count` records (those before the resume point) and drops the rest. finish()
    turns the records into SPLIT_docs.npy (a .npy file: np.load(..., mmap_mode="r") reads it).
    """

    def __init__(self, out_dir: Path, split: str, count: int = 0) -> None:
        self.out_dir, self.split, self.count = out_dir, split, count
        self.partial = partial_path(out_dir, docs_name(split))
        self._file = open(self.partial, "r+b" if count else "wb")
        if count:
            self._file.truncate(count * DOCS_DTYPE.itemsize)
            self._file.seek(0, os.SEEK_END)
        self._record = np.zeros(1, dtype=DOCS_DTYPE)

    def add(self, start: int, source: int) -> None:
        self._record[0] = (start, source)
        self._file.write(self._record.tobytes())
        self.count += 1

    def flush(self) -> None:
        self._file.flush()

    def finish(self) -> dict:
        """Write SPLIT_docs.npy (through a temporary name) and remove the partial file."""
        self._file.close()
        name = docs_name(self.split)
        tmp = self.out_dir / f".{name}.tmp-docs"
        records = (np.memmap(self.partial, dtype=DOCS_DTYPE, mode="r", shape=(self.count,)) if self.count
                   else np.zeros(0, DOCS_DTYPE))
        with open(tmp, "wb") as out:
            np.lib.format.write_array_header_1_0(
                out, {"descr": np.lib.format.dtype_to_descr(DOCS_DTYPE), "fortran_order": False,
                      "shape": (self.count,)})
            step = 1 << 20
            for begin in range(0, self.count, step):  # bounded memory whatever the document count
                out.write(records[begin : begin + step].tobytes())
        del records
        os.replace(tmp, self.out_dir / name)
        self.partial.unlink(missing_ok=True)
        return {"file": name, "documents": self.count}


def new_manifest(fingerprint: str) -> dict:
    return {"format": FORMAT, "fingerprint": fingerprint, "tokenizer_sha256": None, "total_tokens": None, "shards": {}}


def load_manifest(out_dir: Path, fingerprint: str) -> dict:
    """The manifest of an unfinished directory prepared with `fingerprint`; otherwise the directory's
    token files are removed and a new, empty manifest is returned."""
    path = out_dir / MANIFEST_FILE
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
        if manifest.get("fingerprint") == fingerprint:
            return manifest
    except (OSError, ValueError, AttributeError):
        pass
    remove_outputs(out_dir)  # from other settings, or unreadable: nothing in it can be trusted
    return new_manifest(fingerprint)


def save_manifest(out_dir: Path, manifest: dict) -> None:
    write_atomic(out_dir / MANIFEST_FILE, json.dumps(manifest, indent=1) + "\n")


def remove_outputs(out_dir: Path) -> None:
    """Remove the shards (finished and partial, any format version) and the manifest of `out_dir`."""
    for split in SPLITS:
        for path in out_dir.glob(f"{split}_{'[0-9]' * 6}.bin"):
            path.unlink()
        (out_dir / f"{split}.bin").unlink(missing_ok=True)
        (out_dir / docs_name(split)).unlink(missing_ok=True)
    for path in out_dir.glob(".*.partial"):
        path.unlink()
    (out_dir / MANIFEST_FILE).unlink(missing_ok=True)


# ----------------------------------------------------------------------------------------------
# Reading


def read_meta(data_dir: str | Path) -> dict:
    """The meta of a finished data directory, after checking that its token files are whole.

    Every split gets a "shards" list ({file, tokens, sha256}); directories in the older single-file
    format (train.bin / val.bin) are read as one shard per split.
    """
    data_dir = Path(data_dir)
    prepare = f"burnout data prepare {data_dir} --out DATA"
    if data_dir.is_file():  # your text, most likely: what it needs is preparing
        raise BurnoutError(f"'{data_dir}' is a file, not a prepared data folder; prepare it into one first ({prepare}) "
                           "and give DATA")
    if not data_dir.is_dir():
        raise BurnoutError(f"data directory '{data_dir}' does not exist; prepare the data into it first")
    meta_path = data_dir / META_FILE
    if not meta_path.is_file():
        run = _run_around(data_dir)
        if run is not None:
            what, run_data = run
            raise BurnoutError(f"'{data_dir}' is not a data folder (no {META_FILE}): it is {what}, whose data folder "
                               f"is {run_data}; give that")
        if not (data_dir / MANIFEST_FILE).exists() and (folder_owner(data_dir) or {}).get("kind") != "data":
            raise BurnoutError(f"'{data_dir}' is not a prepared data folder (no {META_FILE}, and no preparation "
                               f"was started there); give the --out folder of burnout data prepare, or prepare "
                               f"your text into one first ({prepare})")
        raise BurnoutError(
            f"'{data_dir}' has no {META_FILE}, so its data preparation never finished; prepare the data again"
        )
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BurnoutError(f"'{meta_path}' is not valid JSON ({exc}); prepare the data again") from None
    if not isinstance(meta, dict) or meta.get("format") not in (FORMAT, *LEGACY_FORMATS):
        found = meta.get("format") if isinstance(meta, dict) else None
        raise BurnoutError(f"'{meta_path}' has format {found!r}, expected '{FORMAT}'; "
                           f"prepare the data again with this version")
    try:
        for info in meta["splits"].values():
            if "shards" not in info:  # v1: one file per split
                info["shards"] = [{"file": info["file"], "tokens": info["tokens"], "sha256": info["sha256"]}]
        _check_token_files(data_dir, meta)
    except (KeyError, TypeError, ValueError) as exc:
        raise BurnoutError(f"'{meta_path}' is malformed ({type(exc).__name__}: {exc}); "
                           f"prepare the data again") from None
    return meta


def data_fingerprint(data_dir: str | Path) -> str | None:
    """What tells the data of one prepared folder (pretraining's or a fine-tune's) from any other's: the sha256 of
    its meta.json, as JSON with its keys sorted (it records each token file's sha256, or a fine-tune's counts), and
    of its tokenizer.json. Cheap (no token file is read), so a run records it at each launch and checks it on resume.
    None where either file is missing or unreadable."""
    data_dir = Path(data_dir)
    try:
        meta = json.loads((data_dir / META_FILE).read_text(encoding="utf-8"))
        tokenizer = (data_dir / TOKENIZER_FILE).read_bytes()
    except (OSError, ValueError):
        return None
    digest = hashlib.sha256(json.dumps(meta, sort_keys=True).encode())
    digest.update(hashlib.sha256(tokenizer).digest())
    return digest.hexdigest()


def _run_around(folder: Path) -> tuple[str, Path] | None:
    """For `folder` that holds no data folder's files but is a run folder, a checkpoint or a run's checkpoints
    folder: (what it is, the run's data folder: data.prepared_dir of the config.yaml there, else RUN/data).
    None for anything else."""
    if (folder / MANIFEST_FILE).exists():
        return None  # a data folder whose preparation has not finished
    for run in (folder, folder.parent, folder.parent.parent):
        if not (run / RUN_CONFIG_FILE).is_file():
            continue
        try:
            config = read_saved_config(run / RUN_CONFIG_FILE)
        except BurnoutError:  # not YAML, or not a mapping
            continue
        data = config.get("data") if isinstance(config, dict) else None
        prepared = data.get("prepared_dir") if isinstance(data, dict) else None
        found = Path(prepared) if isinstance(prepared, str) else run / "data"
        if found.resolve() == folder.resolve():
            return None
        if (run / "model.safetensors").is_file():
            return "a checkpoint", found
        return ("a run folder" if run == folder else f"inside the run folder {run}"), found
    return None


def _check_token_files(data_dir: Path, meta: dict) -> None:
    itemsize = np.dtype(meta["dtype"]).itemsize
    if meta["vocab_size"] > 2 ** (8 * itemsize):
        raise BurnoutError(f"'{data_dir / META_FILE}': a vocabulary of {meta['vocab_size']} tokens does not fit "
                           f"{meta['dtype']} token ids; the folder is damaged or mixed up, prepare the data again")
    for split, info in meta["splits"].items():
        if sum(s["tokens"] for s in info["shards"]) != info["tokens"]:
            raise BurnoutError(f"'{data_dir / META_FILE}': the {split} shards do not add up to "
                               f"{info['tokens']} tokens; prepare the data again")
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
            if sha256_file(data_dir / shard["file"]) != shard["sha256"]:
                raise BurnoutError(f"'{data_dir / shard['file']}' does not match its sha256 in {META_FILE}; "
                                   f"prepare the data again")


def read_tokens(data_dir: str | Path, split: str) -> np.ndarray:
    """All tokens of `split` (its shards concatenated) as one in-memory array."""
    data_dir = Path(data_dir)
    meta = read_meta(data_dir)
    if split not in meta["splits"]:
        raise BurnoutError(f"'{data_dir}' has no split '{split}'; it has {', '.join(meta['splits'])}")
    dtype = np.dtype(meta["dtype"]).newbyteorder("<")
    parts = [np.fromfile(data_dir / shard["file"], dtype=dtype) for shard in meta["splits"][split]["shards"]]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)
