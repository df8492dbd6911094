"""Data stage throughput: preparation (mix + tokenizer training + encoding) and batch loading.

    python -m benchmarks.bench_data [--max-chars 4000000] [--vocab-size 4096]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from burnout.config import DataConfig, TokenizerConfig
from burnout.data.loader import TokenLoader
from burnout.data.prepare import prepare_data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max-chars", type=int, default=4_000_000)
    parser.add_argument("--vocab-size", type=int, default=4096)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--batches", type=int, default=200)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        start = time.perf_counter()
        meta = prepare_data(DataConfig(max_chars=args.max_chars), TokenizerConfig(vocab_size=args.vocab_size), out)
        seconds = time.perf_counter() - start
        chars = meta["sources"]["total"]["chars"]
        tokens = meta["splits"]["train"]["tokens"] + meta["splits"]["val"]["tokens"]
        print(f"prepare: {chars:,} chars -> {tokens:,} tokens in {seconds:.2f}s ({chars / seconds / 1e6:.2f} Mchar/s)")

        seq_len = min(args.seq_len, meta["splits"]["train"]["tokens"] - 1)
        for mode in ("mmap", "preload"):
            loader = TokenLoader(out, "train", args.batch_size, seq_len, seed=0, mode=mode)
            start = time.perf_counter()
            for step in range(args.batches):
                loader.get_batch(step)
            seconds = time.perf_counter() - start
            rate = args.batches * args.batch_size * seq_len / seconds
            print(f"get_batch[{mode}]: {seconds / args.batches * 1e3:.3f} ms/batch ({rate / 1e6:.1f} Mtok/s)")


if __name__ == "__main__":
    main()
