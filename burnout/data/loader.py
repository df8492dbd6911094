"""Batches of token windows from a prepared data directory.

Training batches are random crops whose offsets depend only on (seed, step, rank): resuming at step s
replays exactly the batches an uninterrupted run would have seen, with no loader state to checkpoint.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Literal

import numpy as np
import torch

from burnout.data.shards import read_meta
from burnout.errors import BurnoutError

# Token files up to this size (and a quarter of the RAM) are read into memory once; larger ones are
# memory-mapped. Both give identical batches; preload saves the page-cache walk on every batch.
PRELOAD_MAX_BYTES = 4 * 2**30


def loader_mode(data_dir: Path) -> str:
    """'preload' when the train and val token files fit comfortably in RAM, else 'mmap'."""
    meta = read_meta(data_dir)
    size = (sum(s["tokens"] for info in meta["splits"].values() for s in info["shards"])
            * np.dtype(meta["dtype"]).itemsize)
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        ram = 0
    return "preload" if size <= min(PRELOAD_MAX_BYTES, ram // 4) else "mmap"


class TokenLoader:
    def __init__(
        self,
        data_dir: str | Path,
        split: str,
        batch_size: int,
        seq_len: int,
        seed: int,
        rank: int = 0,
        world_size: int = 1,
        mode: Literal["mmap", "preload"] = "mmap",
    ) -> None:
        if not 0 <= rank < world_size:
            raise BurnoutError(f"loader: rank {rank} is outside [0, world_size={world_size})")
        self.meta = read_meta(data_dir)
        if split not in self.meta["splits"]:
            raise BurnoutError(f"loader: '{data_dir}' has no split '{split}'; it has {', '.join(self.meta['splits'])}")
        check_split_length(self.meta, split, seq_len)
        self.batch_size = batch_size
        self.seq_len = seq_len
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        dtype = np.dtype(self.meta["dtype"]).newbyteorder("<")
        shards = self.meta["splits"][split]["shards"]
        paths = [Path(data_dir) / shard["file"] for shard in shards]
        if mode == "mmap":
            parts = [np.memmap(path, dtype=dtype, mode="r") for path in paths]
        elif mode == "preload":
            parts = [np.fromfile(path, dtype=dtype) for path in paths]
            # One array: batches gather from it directly, with no shard lookup.
            parts = [np.concatenate(parts)] if len(parts) > 1 else parts
        else:
            raise BurnoutError(f"loader: mode '{mode}' is not one of 'mmap', 'preload'")
        self.data = _ShardedTokens(parts)
        self.num_tokens = len(self.data)

    def get_batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Training batch `step` for this rank: int64 (x, y), both (batch_size, seq_len), y = x shifted by one."""
        rng = np.random.default_rng([self.seed, step, self.rank])
        # Highest offset N - T - 1 still leaves room for the T + 1 tokens x and y are cut from.
        offsets = rng.integers(0, self.num_tokens - self.seq_len, size=self.batch_size)
        return self._to_xy(offsets)

    def iter_eval_batches(self, num_batches: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Up to `num_batches` batches walking the split from its start in non-overlapping windows.

        Ranks take interleaved windows and all get the same number of batches; the last batch is
        smaller when the split runs out before `num_batches` full batches.
        """
        total_windows = (self.num_tokens - 1) // self.seq_len
        windows_per_rank = min(total_windows // self.world_size, num_batches * self.batch_size)
        window_ids = self.rank + self.world_size * np.arange(windows_per_rank)
        for start in range(0, windows_per_rank, self.batch_size):
            yield self._to_xy(window_ids[start : start + self.batch_size] * self.seq_len)

    def _to_xy(self, offsets: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = torch.from_numpy(self.data.windows(offsets, self.seq_len + 1))  # (B, T+1) int64
        return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


class Prefetcher:
    """Training batches read ahead on a background thread, in the order the train step asks for them.

    `indices` yields the batch numbers this rank reads, in order. With `pin` (training on CUDA) each
    batch lands in page-locked memory, so the step's `.to(device, non_blocking=True)` copies while the
    GPU computes instead of blocking on a pageable copy; the reads (random mmap pages of a corpus far
    larger than RAM) happen while the main thread waits for the GPU. Batches are the loader's own,
    so training sees exactly what it would without read-ahead.
    """

    def __init__(self, loader: TokenLoader, indices: Iterator[int], pin: bool = False, depth: int = 2):
        self.loader, self.indices, self.pin = loader, indices, pin
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="batch-prefetch")
        self._ahead: deque[tuple[int, Future]] = deque()
        for _ in range(depth):
            self._read_ahead()

    def get_batch(self, index: int) -> tuple[torch.Tensor, ...]:
        expected, batch = self._ahead.popleft()
        if expected != index:
            raise RuntimeError(f"prefetcher: batch {index} asked for, {expected} read ahead; "
                               "batches must be asked for in the order of `indices`")
        self._read_ahead()
        return batch.result()

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    def _read_ahead(self) -> None:
        index = next(self.indices)
        self._ahead.append((index, self._pool.submit(self._read, index)))

    def _read(self, index: int) -> tuple[torch.Tensor, ...]:
        batch = self.loader.get_batch(index)  # (x, y), or (x, y, positions) packed
        return tuple(t.pin_memory() for t in batch) if self.pin else batch


class _ShardedTokens:
    """The shards of a split read as one token sequence: window i is tokens[offsets[i] : offsets[i] + n].

    Offsets are positions in the concatenation, so batches do not depend on how the split is sharded
    (nor on mmap vs preload); a window that crosses a shard boundary is stitched from both sides.
    """

    def __init__(self, parts: list[np.ndarray]) -> None:
        self.parts = parts
        self.starts = np.concatenate([[0], np.cumsum([len(p) for p in parts])]).astype(np.int64)

    def __len__(self) -> int:
        return int(self.starts[-1])

    def windows(self, offsets: np.ndarray, length: int) -> np.ndarray:
        if len(self.parts) == 1:
            return self.parts[0][offsets[:, None] + np.arange(length)].astype(np.int64)
        out = np.empty((len(offsets), length), dtype=np.int64)
        for row, offset in enumerate(offsets.tolist()):
            filled = 0
            shard = int(np.searchsorted(self.starts, offset, side="right")) - 1
            while filled < length:
                begin = offset + filled - int(self.starts[shard])
                piece = self.parts[shard][begin : begin + length - filled]
                out[row, filled : filled + len(piece)] = piece
                filled += len(piece)
                shard += 1
        return out


def check_compatible(meta: dict, vocab_size: int, seq_len: int | None = None) -> None:
    """Refuse data a model with `vocab_size` embeddings (and context `seq_len`) cannot train on."""
    if meta["vocab_size"] > vocab_size:
        raise BurnoutError(
            f"model.vocab_size: the data's tokenizer has {meta['vocab_size']} tokens but the model only "
            f"{vocab_size}; set model.vocab_size to at least {meta['vocab_size']}"
        )
    if seq_len is not None:
        for split in meta["splits"]:
            check_split_length(meta, split, seq_len)


def check_split_length(meta: dict, split: str, seq_len: int) -> None:
    tokens = meta["splits"][split]["tokens"]
    if tokens < seq_len + 1:
        raise BurnoutError(
            f"batch larger than the data: the {split} split has {tokens} tokens but seq_len={seq_len} needs at "
            f"least {seq_len + 1}; lower train.seq_len or prepare more data (raise data.max_chars)"
        )
