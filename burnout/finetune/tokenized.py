"""Tokenized conversations and preference pairs on disk (`prepare_sft`, `prepare_pairs`), and the batches SFT and
DPO train on (`SFTBatches`, `PairBatches`, and packed: `PackedSFTBatches`, `PackedPairBatches`).

Encoded once into flat arrays written atomically, meta.json last (a folder without it is unfinished), and read
memory-mapped with np.load(allow_pickle=False): a fine-tune of any size starts without re-encoding and loads no
pickle. Every batch is a pure function of (seed, batch number), so a resumed run sees the batches it would have.
"""

from __future__ import annotations

import bisect
import hashlib
import io
import json
import math
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from burnout.base.files import EOT_TOKEN, TOKENIZER_FILE, write_atomic
from burnout.core.chat_template import IM_END, IM_START, TRAIN_ON, Conversation, chat_token_ids, encode_conversations
from burnout.data.shards import token_dtype
from burnout.data.tokenizer import tokenizer_sha256
from burnout.errors import BurnoutError
from burnout.finetune.conversations import PreferencePair, encode_pair

SFT_FORMAT = "burnout-sft-v1"
PAIRS_FORMAT = "burnout-pairs-v1"
META_FILE = "meta.json"
SPLITS = ("train", "val")
OVERFLOW = ("truncate", "drop")
# Conversations handed to the tokenizer's thread pool at once.
_ENCODE_CHUNK = 512
# With pad_to_longest, batch widths are rounded up to this, so a compiled model sees few shapes.
_WIDTH_MULTIPLE = 64
# Distinct seed sequences for the held-out split and the epochs' orders.
_SPLIT_STREAM, _EPOCH_STREAM, _PACKING_STREAM = 0, 1, 2


# ----------------------------------------------------------------------------------------------
# Preparing


def prepare_sft(conversations: Iterable[Conversation | list[dict]], tokenizer: Tokenizer, out_dir: str | Path, *,
                seq_len: int, val_fraction: float = 0.05, seed: int = 0, train_on: str = "assistant",
                overflow: str = "truncate", source: dict | None = None) -> dict:
    """Tokenize `conversations` (conversations.read_conversations, or plain message lists) into `out_dir`; the meta.

    `tokenizer` must hold the chat tokens (chat_template.ensure_chat_tokens). `source` is recorded in meta.json, and
    so are the records a ConversationReader skipped. The folder:

        tokenizer.json                          the tokenizer (with <|im_start|>/<|im_end|>) that encoded it
        {split}_ids.npy       uint16 | uint32   every example's ids back to back (uint32 past 65,536 tokens)
        {split}_mask.npy      uint8             1 where the token is a training target (encode_conversation)
        {split}_offsets.npy   int64             example i is ids[offsets[i] : offsets[i + 1]]
        {split}_index.npy     int64             example i's position in the conversations as read (which
                                                ones were held out, e.g. to evaluate on their prompts)
        meta.json                               format, counts, token-length report, truncation; written last

    An example fits when it has at most seq_len + 1 tokens (a row's seq_len inputs plus the last target).
    overflow="truncate" (default) keeps its first seq_len + 1 tokens (an answer cut short loses its <|im_end|>,
    but the prompt and most of the answer still teach); "drop" leaves it out. Either way an example with no
    training target left inside the window is dropped. The report counts both.
    """
    _check_settings(seq_len, val_fraction, train_on, overflow)
    out_dir = _start(out_dir)
    examples = []
    for chunk in _chunks(conversations):
        examples += [(np.asarray(ids, dtype=np.uint32), np.asarray(mask, dtype=np.uint8))
                     for ids, mask, _ in encode_conversations(tokenizer, chunk, train_on)]
    if not examples:
        raise BurnoutError("SFT data: no conversations to prepare")
    held_out = held_out_split(len(examples), val_fraction, seed)
    meta = _base_meta(SFT_FORMAT, tokenizer, seq_len, val_fraction, seed, overflow, source)
    meta.update(train_on=train_on, examples_read=len(examples), skipped=dict(getattr(conversations, "skipped", {})),
                lengths=_length_report([len(i) for i, _ in examples]))
    dropped = {"too_long": 0, "no_target": 0}
    truncated = 0
    for split in SPLITS:
        kept, indices = [], []
        for index in np.flatnonzero(held_out == (split == "val")):
            ids, mask = examples[index]
            truncated += len(ids) > seq_len + 1
            fitted = _fit(0, ids, mask, seq_len, overflow)
            if isinstance(fitted, str):
                dropped[fitted] += 1
            else:
                kept.append(fitted)
                indices.append(index)
        files = _write_group(out_dir, split, kept, meta["dtype"], indices=indices)
        meta["splits"][split] = {"examples": len(kept), "tokens": sum(len(ids) for ids, _ in kept),
                                 "trained_tokens": int(sum(np.count_nonzero(mask) for _, mask in kept)),
                                 "files": files}
    meta.update(truncated=truncated, dropped=dropped)
    _finish(out_dir, tokenizer, meta)
    return meta


def prepare_pairs(pairs: Iterable[PreferencePair], tokenizer: Tokenizer, out_dir: str | Path, *, seq_len: int,
                  val_fraction: float = 0.05, seed: int = 0, overflow: str = "truncate",
                  source: dict | None = None) -> dict:
    """Tokenize preference pairs (conversations.read_pairs) into `out_dir` for DPO; the meta.

    A pair is truncated (or dropped) when its prompt plus the longer answer exceeds seq_len + 1 tokens:
    each answer is cut to what fits after the whole prompt, and a pair whose prompt leaves no room for
    a target on both sides is dropped. The length report is over prompt + longer answer.

    The folder holds {split}_prompt_{ids,offsets,index}.npy and {split}_chosen_* / {split}_rejected_*
    ({ids,mask,offsets}): per pair the prompt, ending with "<|im_start|>assistant\\n", and each answer with its
    mask; tokenizer.json and meta.json as prepare_sft's.
    """
    _check_settings(seq_len, val_fraction, "assistant", overflow)
    out_dir = _start(out_dir)
    encoded = []
    for pair in pairs:
        prompt, *sides = encode_pair(tokenizer, pair)
        encoded.append((np.asarray(prompt, dtype=np.uint32),
                        *((np.asarray(ids, dtype=np.uint32), np.asarray(mask, dtype=np.uint8)) for ids, mask in sides)))
    if not encoded:
        raise BurnoutError("preference data: no pairs to prepare")
    held_out = held_out_split(len(encoded), val_fraction, seed)
    meta = _base_meta(PAIRS_FORMAT, tokenizer, seq_len, val_fraction, seed, overflow, source)
    meta.update(examples_read=len(encoded),
                lengths=_length_report([len(p) + max(len(c[0]), len(r[0])) for p, c, r in encoded]))
    dropped = {"too_long": 0, "no_target": 0}
    truncated = 0
    for split in SPLITS:
        kept: dict[str, list] = {"prompt": [], "chosen": [], "rejected": []}
        indices = []
        for index in np.flatnonzero(held_out == (split == "val")):
            prompt, chosen, rejected = encoded[index]
            truncated += len(prompt) + max(len(chosen[0]), len(rejected[0])) > seq_len + 1
            sides = [_fit(len(prompt), ids, mask, seq_len, overflow) for ids, mask in (chosen, rejected)]
            reason = next((side for side in sides if isinstance(side, str)), None)
            if reason is not None:
                dropped[reason] += 1
                continue
            kept["prompt"].append((prompt, None))
            indices.append(index)
            kept["chosen"].append(sides[0])
            kept["rejected"].append(sides[1])
        meta["splits"][split] = {"pairs": len(kept["prompt"]), "files": {}}
        for part, rows in kept.items():
            prompts = part == "prompt"
            files = _write_group(out_dir, f"{split}_{part}", rows, meta["dtype"], masked=not prompts,
                                 indices=indices if prompts else None)
            meta["splits"][split]["files"].update(files)
    meta.update(truncated=truncated, dropped=dropped)
    _finish(out_dir, tokenizer, meta)
    return meta


def format_report(meta: dict) -> str:
    """The counts, token lengths and truncation of a prepared folder, in a few lines."""
    lengths = meta["lengths"]
    unit = "pairs" if meta["format"] == PAIRS_FORMAT else "examples"
    counts = ", ".join(f"{split} {info.get(unit, 0):,}" for split, info in meta["splits"].items())
    skipped = ", ".join(f"{count:,} {reason}" for reason, count in meta.get("skipped", {}).items())
    return "\n".join([
        f"{meta['examples_read']:,} {unit} read: {counts}" + (f" (skipped: {skipped})" if skipped else ""),
        f"tokens per {unit[:-1]}: min {lengths['min']}, median {lengths['median']:g}, p95 {lengths['p95']:g}, "
        f"max {lengths['max']}",
        f"{meta['truncated']:,} longer than seq_len {meta['seq_len']} + 1 ({meta['overflow']}); dropped: "
        f"{meta['dropped']['too_long']:,} too long, {meta['dropped']['no_target']:,} with no target left",
    ])


def _check_settings(seq_len: int, val_fraction: float, train_on: str, overflow: str) -> None:
    if not isinstance(seq_len, int) or seq_len < 1:
        raise BurnoutError(f"seq_len: {seq_len} must be a positive whole number")
    if not 0 <= val_fraction < 1:
        raise BurnoutError(f"val_fraction: {val_fraction} is outside [0, 1)")
    if train_on not in TRAIN_ON:
        raise BurnoutError(f"train_on: '{train_on}' is not one of {', '.join(TRAIN_ON)}")
    if overflow not in OVERFLOW:
        raise BurnoutError(f"overflow: '{overflow}' is not one of {', '.join(OVERFLOW)}")


def _start(out_dir: str | Path) -> Path:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    # Gone first: until the new one is written, the folder reads as unfinished rather than as the old data.
    (out_dir / META_FILE).unlink(missing_ok=True)
    return out_dir


def _chunks(conversations: Iterable[Conversation | list[dict]]) -> Iterator[list[Conversation]]:
    chunk: list[Conversation] = []
    for number, item in enumerate(conversations, start=1):
        chunk.append(item if isinstance(item, Conversation) else Conversation(item, f"conversation {number}"))
        if len(chunk) == _ENCODE_CHUNK:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def held_out_split(count: int, val_fraction: float, seed: int) -> np.ndarray:
    """Boolean per example: in the val split. A seeded permutation of the examples as read picks
    round(n · val_fraction) of them (at least one when val_fraction > 0 and n ≥ 2), before anything is truncated
    or dropped, so the same conversations are held out whatever the context length."""
    num_val = 0 if count < 2 or val_fraction == 0 else min(max(round(count * val_fraction), 1), count - 1)
    held_out = np.zeros(count, dtype=bool)
    held_out[np.random.default_rng([seed, _SPLIT_STREAM]).permutation(count)[:num_val]] = True
    return held_out


def _fit(prefix: int, ids: np.ndarray, mask: np.ndarray, seq_len: int, overflow: str):
    """(ids, mask) cut to the window left after `prefix` tokens, or why the example is dropped."""
    room = seq_len + 1 - prefix
    if len(ids) > room and (overflow == "drop" or room <= 0):
        return "too_long"
    ids, mask = ids[:room], mask[:room]
    # Position 0 of a row is never a target: nothing precedes it.
    if not mask[1 if prefix == 0 else 0 :].any():
        return "no_target"
    return ids, mask


def _length_report(lengths: list[int]) -> dict:
    values = np.asarray(lengths)
    return {"min": int(values.min()), "median": float(np.median(values)),
            "p95": float(np.percentile(values, 95)), "max": int(values.max()), "mean": float(values.mean())}


def _base_meta(fmt: str, tokenizer: Tokenizer, seq_len: int, val_fraction: float, seed: int, overflow: str,
               source: dict | None) -> dict:
    start, end = chat_token_ids(tokenizer)
    vocab_size = tokenizer.get_vocab_size()
    eot = tokenizer.token_to_id(EOT_TOKEN)
    return {"format": fmt, "vocab_size": vocab_size, "dtype": token_dtype(vocab_size).str,
            "im_start_id": start, "im_end_id": end, "pad_id": end if eot is None else eot,
            "seq_len": seq_len, "val_fraction": val_fraction, "seed": seed, "overflow": overflow,
            "tokenizer_sha256": tokenizer_sha256(tokenizer), "source": source or {}, "splits": {}}


def _write_group(out_dir: Path, name: str, rows: list[tuple], dtype: str, masked: bool = True,
                 indices: list[int] | None = None) -> dict:
    """{name}_ids / _offsets / _mask (when `masked`) / _index (when given) .npy of (ids, mask) rows, each
    written atomically; their sha256s."""
    arrays = {"ids": np.concatenate([np.zeros(0, dtype)] + [ids for ids, _ in rows]).astype(dtype),
              "offsets": np.concatenate([[0], np.cumsum([len(ids) for ids, _ in rows], dtype=np.int64)])}
    if masked:
        arrays["mask"] = np.concatenate([np.zeros(0, np.uint8)] + [mask for _, mask in rows])
    if indices is not None:
        arrays["index"] = np.asarray(indices, dtype=np.int64)
    files = {}
    for kind, array in arrays.items():
        buffer = io.BytesIO()
        np.save(buffer, array, allow_pickle=False)
        data = buffer.getvalue()
        write_atomic(out_dir / f"{name}_{kind}.npy", data)
        files[f"{name}_{kind}.npy"] = hashlib.sha256(data).hexdigest()
    return files


def _finish(out_dir: Path, tokenizer: Tokenizer, meta: dict) -> None:
    write_atomic(out_dir / TOKENIZER_FILE, tokenizer.to_str())
    write_atomic(out_dir / META_FILE, json.dumps(meta, indent=1) + "\n")


# ----------------------------------------------------------------------------------------------
# Reading


def read_sft_meta(data_dir: str | Path, fmt: str = SFT_FORMAT) -> dict:
    """The meta of a finished SFT (or, with fmt=PAIRS_FORMAT, pairs) folder."""
    data_dir = Path(data_dir)
    path = data_dir / META_FILE
    if not path.is_file():
        raise BurnoutError(f"'{data_dir}' has no {META_FILE}, so its preparation never finished; prepare it again")
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise BurnoutError(f"'{path}' is not valid JSON ({exc}); prepare the data again") from None
    if not isinstance(meta, dict) or meta.get("format") != fmt:
        found = meta.get("format") if isinstance(meta, dict) else None
        raise BurnoutError(f"'{path}' has format {found!r}, expected '{fmt}'; prepare the data with this version")
    return meta


def held_out_questions(data_dir: str | Path, count: int) -> list[str]:
    """The first user message of each of the first `count` held-out (val) examples of an SFT or pairs folder, among
    its first 10 × `count`: questions of the kind its run learnt to answer, never seen answered."""
    data_dir = Path(data_dir)
    group = {SFT_FORMAT: "val", PAIRS_FORMAT: "val_prompt"}.get(
        json.loads((data_dir / META_FILE).read_text(encoding="utf-8")).get("format"))
    if group is None:
        return []
    rows = _Ragged(data_dir, group, with_mask=False)
    tokenizer = Tokenizer.from_file(str(data_dir / TOKENIZER_FILE))
    header, questions = f"{IM_START}user\n", []
    for i in range(min(len(rows), 10 * count)):
        text = tokenizer.decode(rows.row(i)[0].tolist(), skip_special_tokens=False)
        start = text.find(header)
        end = text.find(IM_END, start + len(header))
        question = text[start + len(header) : end].strip() if start >= 0 and end >= 0 else ""
        if question:
            questions.append(question)
        if len(questions) == count:
            break
    return questions


class _Ragged:
    """Variable-length rows stored as {name}_ids/_mask/_offsets.npy: row i is ids[offsets[i]:offsets[i + 1]]."""

    def __init__(self, data_dir: Path, name: str, with_mask: bool = True) -> None:
        def load(kind: str) -> np.ndarray:
            path = data_dir / f"{name}_{kind}.npy"
            try:
                return np.load(path, mmap_mode="r", allow_pickle=False)
            except (OSError, ValueError) as exc:
                raise BurnoutError(f"'{path}' is missing or damaged ({exc}); prepare the data again") from None

        self.ids, self.offsets = load("ids"), load("offsets")
        self.mask = load("mask") if with_mask else None
        ends_ok = len(self.offsets) >= 1 and self.offsets[0] == 0 and self.offsets[-1] == len(self.ids)
        if not ends_ok or (self.mask is not None and len(self.mask) != len(self.ids)):
            raise BurnoutError(f"'{data_dir}': the {name} files do not match each other; prepare the data again")

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def row(self, i: int) -> tuple[np.ndarray, np.ndarray | None]:
        start, end = int(self.offsets[i]), int(self.offsets[i + 1])
        return self.ids[start:end], None if self.mask is None else self.mask[start:end]


class RowBatches:
    """Batch i is a pure function of (seed, i): epoch e = positions [e·n, (e+1)·n) of the stream visits
    every usable example once, in the order of a permutation seeded by (seed, e); resume needs no state."""

    def __init__(self, batch_size: int, seq_len: int, seed: int, usable: np.ndarray, pad_to_longest: bool,
                 where: str) -> None:
        if batch_size < 1 or seq_len < 1:
            raise BurnoutError(f"batch_size {batch_size} and seq_len {seq_len} must be positive")
        if not len(usable):
            raise BurnoutError(f"{where}: no example has a training target within seq_len={seq_len} tokens; "
                               "raise seq_len or check the data")
        self.batch_size, self.seq_len, self.seed = batch_size, seq_len, seed
        self.usable = usable  # example ids that have a target inside the window
        self.pad_to_longest = pad_to_longest
        self._permutation: tuple[int, np.ndarray] | None = None

    @property
    def epoch_batches(self) -> int:
        """Batches per pass over the usable examples."""
        return math.ceil(len(self.usable) / self.batch_size)

    def examples_of(self, index: int) -> np.ndarray:
        """The example ids batch `index` holds, in row order."""
        n = len(self.usable)
        positions = np.arange(index * self.batch_size, (index + 1) * self.batch_size, dtype=np.int64)
        out = np.empty(self.batch_size, dtype=np.int64)
        for epoch in np.unique(positions // n):
            chosen = positions // n == epoch
            out[chosen] = self._epoch_order(int(epoch))[positions[chosen] % n]
        return out

    def _epoch_order(self, epoch: int) -> np.ndarray:
        cached = self._permutation
        if cached is None or cached[0] != epoch:
            cached = self._permutation = (epoch, self.usable[np.random.default_rng([self.seed, _EPOCH_STREAM, epoch])
                                                             .permutation(len(self.usable))])
        return cached[1]

    def _width(self, lengths: Iterable[int]) -> int:
        if not self.pad_to_longest:
            return self.seq_len
        longest = max(lengths) - 1
        return min(self.seq_len, -(-longest // _WIDTH_MULTIPLE) * _WIDTH_MULTIPLE)

    def _xy(self, rows: list[tuple[np.ndarray, np.ndarray]], pad_id: int):
        """int64 (x, y) (len(rows), width): x the row's first tokens then pad_id, y the next token where the
        mask marks it a target, else -1."""
        import torch

        width = self._width(len(ids) for ids, _ in rows)
        x = np.full((len(rows), width), pad_id, dtype=np.int64)
        y = np.full((len(rows), width), -1, dtype=np.int64)
        for r, (ids, mask) in enumerate(rows):
            inputs, targets = _inputs_and_targets(ids, mask, width)
            x[r, : len(inputs)], y[r, : len(inputs)] = inputs, targets
        return torch.from_numpy(x), torch.from_numpy(y)


def _inputs_and_targets(ids: np.ndarray, mask: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
    """An example's first min(len, width + 1) tokens as a row's inputs and their targets: the next token where the
    mask marks it a target, else -1."""
    length = min(len(ids), width + 1)
    ids = ids[:length].astype(np.int64)  # unsigned ids would turn the -1 below into 65535
    return ids[:-1], np.where(mask[1:length].astype(bool), ids[1:], -1)


def pack_rows(examples: np.ndarray, lengths: np.ndarray, capacity: int, seed: int) -> list[np.ndarray]:
    """`examples` (their `lengths` in positions) packed into rows of at most `capacity` positions, best fit
    decreasing: longest first (equal lengths in a seeded order), each into the open row whose space left is the
    least that holds it, else a new row. A function of its arguments alone, so every epoch and resume packs alike."""
    order = np.random.default_rng([seed, _PACKING_STREAM]).permutation(len(examples))
    order = order[np.argsort(-lengths[order], kind="stable")]
    rows: list[list[int]] = []
    spaces: list[tuple[int, int]] = []  # (space left, row), sorted: the open rows
    for i in order:
        need = int(lengths[i])
        at = bisect.bisect_left(spaces, (need, -1))
        if at < len(spaces):
            space, row = spaces.pop(at)
        else:
            space, row = capacity, len(rows)
            rows.append([])
        rows[row].append(int(examples[i]))
        if space - need > 0:
            bisect.insort(spaces, (space - need, row))
    return [np.array(row, dtype=np.int64) for row in rows]


def _first_targets(ragged: _Ragged, prefix_lengths: np.ndarray | None = None) -> np.ndarray:
    """Per row, the position in its sequence (after its prefix) of its first target after position 0."""
    positions = np.flatnonzero(ragged.mask)
    row_of = np.searchsorted(ragged.offsets, positions, side="right") - 1
    within = positions - ragged.offsets[row_of] + (0 if prefix_lengths is None else prefix_lengths[row_of])
    first = np.full(len(ragged), np.iinfo(np.int64).max, dtype=np.int64)
    valid = within >= 1
    np.minimum.at(first, row_of[valid], within[valid])
    return first


class SFTBatches(RowBatches):
    """(x, y) batches of one split of a prepare_sft folder: one conversation per row, right-padded. Padding sits
    after the last real token, so under the causal mask no real position attends to it, and its targets are -1.

    get_batch(i) is a pure function of (seed, i), so a resumed run sees the batches it would have seen;
    examples without a target in the first seq_len + 1 tokens are never drawn. With pad_to_longest, a
    batch is as wide as its longest row (rounded up to 64 tokens) instead of seq_len.
    """

    def __init__(self, data_dir: str | Path, split: str, batch_size: int, seq_len: int, seed: int,
                 pad_to_longest: bool = False) -> None:
        self.meta = read_sft_meta(data_dir)
        if split not in self.meta["splits"]:
            raise BurnoutError(f"'{data_dir}' has no split '{split}'; it has {', '.join(self.meta['splits'])}")
        self.data = _Ragged(Path(data_dir), split)
        usable = np.flatnonzero(_first_targets(self.data) <= seq_len)
        super().__init__(batch_size, seq_len, seed, usable, pad_to_longest, f"'{data_dir}' split {split}")

    def get_batch(self, index: int):
        return self._xy([self.data.row(e) for e in self.examples_of(index)], self.meta["pad_id"])

    def iter_eval_batches(self, num_batches: int):
        """Up to `num_batches` batches walking the usable examples in order (the last may be smaller)."""
        for start in range(0, min(len(self.usable), num_batches * self.batch_size), self.batch_size):
            yield self._xy([self.data.row(e) for e in self.usable[start : start + self.batch_size]],
                           self.meta["pad_id"])


class PackedSFTBatches(RowBatches):
    """(x, y, positions) batches of one split of a prepare_sft folder, conversations packed into full rows
    (pack_rows): each keeps its own positions from 0, which Transformer.forward turns into a block-diagonal causal
    mask (models/transformer.py: packed_mask), so that each attends only to itself and sees the positions it would
    alone; one example's last target is never the next one's first token, and the padding left at a row's end
    has targets -1. Batch i is a pure function of (seed, i), a pass over the
    rows being a pass over the conversations."""

    def __init__(self, data_dir: str | Path, split: str, batch_size: int, seq_len: int, seed: int) -> None:
        self.meta = read_sft_meta(data_dir)
        if split not in self.meta["splits"]:
            raise BurnoutError(f"'{data_dir}' has no split '{split}'; it has {', '.join(self.meta['splits'])}")
        self.data = _Ragged(Path(data_dir), split)
        examples = np.flatnonzero(_first_targets(self.data) <= seq_len)
        positions = np.minimum(np.diff(self.data.offsets)[examples], seq_len + 1) - 1  # a row's inputs per example
        self.rows = pack_rows(examples, positions, seq_len, seed)
        super().__init__(batch_size, seq_len, seed, np.arange(len(self.rows)), False, f"'{data_dir}' split {split}")

    def get_batch(self, index: int):
        return _packed_xy([[self.data.row(example) for example in self.rows[row]] for row in self.examples_of(index)],
                          self.seq_len, self.seq_len, self.meta["pad_id"])


def _packed_xy(rows: list[list[tuple[np.ndarray, np.ndarray]]], width: int, seq_len: int, pad_id: int):
    """int64 (x, y, positions) (len(rows), width) of packed rows, each a list of (ids, mask) sequences placed end to
    end: each cut to seq_len + 1 tokens (_inputs_and_targets) with its positions from 0, then pad_id to the row's
    end (targets -1, each pad a sequence of its own at position 0)."""
    import torch

    x = np.full((len(rows), width), pad_id, dtype=np.int64)
    y = np.full((len(rows), width), -1, dtype=np.int64)
    positions = np.zeros((len(rows), width), dtype=np.int64)
    for r, sequences in enumerate(rows):
        at = 0
        for ids, mask in sequences:
            inputs, targets = _inputs_and_targets(ids, mask, seq_len)
            end = at + len(inputs)
            x[r, at:end], y[r, at:end], positions[r, at:end] = inputs, targets, np.arange(len(inputs))
            at = end
    return torch.from_numpy(x), torch.from_numpy(y), torch.from_numpy(positions)


class PairBatches(RowBatches):
    """DPO batches of one split of a prepare_pairs folder: (x, y) of 2·batch_size rows, the chosen
    answers (prompt + chosen) first, then the rejected ones of the same pairs in the same order; y is -1
    except on each answer's assistant tokens, so a row's summed log-probabilities over y ≠ -1 are
    log π(answer | prompt). Batch i is a pure function of (seed, i)."""

    def __init__(self, data_dir: str | Path, split: str, batch_size: int, seq_len: int, seed: int,
                 pad_to_longest: bool = False) -> None:
        self.meta = read_sft_meta(data_dir, PAIRS_FORMAT)
        if split not in self.meta["splits"]:
            raise BurnoutError(f"'{data_dir}' has no split '{split}'; it has {', '.join(self.meta['splits'])}")
        data_dir = Path(data_dir)
        self.prompts = _Ragged(data_dir, f"{split}_prompt", with_mask=False)
        self.chosen = _Ragged(data_dir, f"{split}_chosen")
        self.rejected = _Ragged(data_dir, f"{split}_rejected")
        if not len(self.prompts) == len(self.chosen) == len(self.rejected):
            raise BurnoutError(f"'{data_dir}': the {split} prompt and answer files disagree; prepare the data again")
        prompt_lengths = np.diff(self.prompts.offsets)
        usable = np.flatnonzero((_first_targets(self.chosen, prompt_lengths) <= seq_len)
                                & (_first_targets(self.rejected, prompt_lengths) <= seq_len))
        super().__init__(batch_size, seq_len, seed, usable, pad_to_longest, f"'{data_dir}' split {split}")

    def sides(self, pair: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """The pair's chosen and rejected sequences as (ids, mask): the prompt (mask 0), then the answer."""
        prompt, _ = self.prompts.row(pair)
        return [(np.concatenate([prompt, ids]), np.concatenate([np.zeros(len(prompt), np.uint8), mask]))
                for ids, mask in (self.chosen.row(pair), self.rejected.row(pair))]

    def _pair_rows(self, pairs: Iterable[int]):
        sides = [self.sides(pair) for pair in pairs]
        return self._xy([chosen for chosen, _ in sides] + [rejected for _, rejected in sides], self.meta["pad_id"])

    def get_batch(self, index: int):
        return self._pair_rows(self.examples_of(index))

    def iter_eval_batches(self, num_batches: int):
        """Up to `num_batches` batches of pairs in order (the last may be smaller)."""
        for start in range(0, min(len(self.usable), num_batches * self.batch_size), self.batch_size):
            yield self._pair_rows(self.usable[start : start + self.batch_size])


class PackedPairBatches(RowBatches):
    """DPO's train batches of one split of a prepare_pairs folder, packed (dpo.packing): (x, y, positions) of
    batch_size rows of 2·seq_len positions, as many as PairBatches' 2·batch_size rows of seq_len. Pairs are packed
    into them best fit (pack_rows), each pair whole in one row: its chosen sequence, then its rejected one, each
    from position 0 so that it attends only to itself; objective.sequence_logprobs sums each sequence's targets, and the
    chosen and rejected ones alternate. Batch i is a pure function of (seed, i), a pass over the rows a pass over
    the pairs."""

    def __init__(self, data_dir: str | Path, split: str, batch_size: int, seq_len: int, seed: int) -> None:
        self.pairs = PairBatches(data_dir, split, batch_size, seq_len, seed)
        self.meta, usable = self.pairs.meta, self.pairs.usable
        prompts = np.diff(self.pairs.prompts.offsets)[usable]
        inputs = [np.minimum(prompts + np.diff(side.offsets)[usable], seq_len + 1) - 1  # a row's inputs per side
                  for side in (self.pairs.chosen, self.pairs.rejected)]
        self.rows = pack_rows(usable, inputs[0] + inputs[1], 2 * seq_len, seed)
        super().__init__(batch_size, 2 * seq_len, seed, np.arange(len(self.rows)), False, f"'{data_dir}' split {split}")

    def get_batch(self, index: int):
        rows = [[side for pair in self.rows[row] for side in self.pairs.sides(pair)] for row in self.examples_of(index)]
        return _packed_xy(rows, self.seq_len, self.pairs.seq_len, self.meta["pad_id"])
