"""Data stage throughput.

    python -m benchmarks.bench_data [--mb 8] [--workers 1 2] [--batches 200]

1. Tokenization MB/s of prepare_data (clean none, an 8,192-token BPE trained here) at each --workers.
2. Peak RSS of prepare_data on a corpus of --mb MB and on one 10x larger (each in a fresh process):
   streaming preparation should need about the same memory for both.
3. TokenLoader.get_batch batches/s, mmap vs preload, on the larger prepared directory.

The corpus is the embedded stdlib text (code and docs), sampled into a jsonl file under a temp folder.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import results
from burnout.config import DataConfig, SourceConfig, TokenizerConfig
from burnout.data.corpus import iter_documents

DOC_CHARS = 100_000


def make_corpus(folder: Path, megabytes: float) -> Path:
    """jsonl files totalling `megabytes` of stdlib documents drawn at random (seeded, with replacement).

    Every corpus draws from the same pool, so a small and a large corpus hold documents of the same
    sizes (each cut to DOC_CHARS, about the largest web document a real mix holds): what differs is
    only how many there are. Each copy is tagged so dedup would keep it."""
    folder.mkdir(parents=True, exist_ok=True)
    pool = [doc[:DOC_CHARS] for kind in ("stdlib_code", "stdlib_docs")
            for doc in iter_documents(SourceConfig(name=kind, kind=kind))]
    rng = random.Random(0)
    target = int(megabytes * 1e6)
    written = 0
    with open(folder / "corpus.jsonl", "w", encoding="utf-8") as f:
        for copy in itertools.count():
            line = json.dumps({"text": f"# copy {copy}\n{rng.choice(pool)}"}) + "\n"
            f.write(line)
            written += len(line)
            if written >= target:
                break
    return folder


def _cfg(corpus: Path, shard_tokens: int) -> DataConfig:
    # max_tokens large: every document is taken; max_chars: the tokenizer trains on a 2 MB sample.
    return DataConfig(sources=[SourceConfig(name="c", kind="jsonl", path=str(corpus))], max_chars=2_000_000,
                      max_tokens=10**12, shard_tokens=shard_tokens)


def run_prepare(corpus: str, out: str, workers: int, tokenizer: str | None) -> dict:
    from burnout.data.prepare import prepare_data

    tok_cfg = TokenizerConfig(kind="bpe", vocab_size=8192)
    start = time.perf_counter()
    meta = prepare_data(_cfg(Path(corpus), 10_000_000), tok_cfg, out, tokenizer_path=tokenizer, workers=workers)
    seconds = time.perf_counter() - start
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"seconds": seconds, "tokens": meta["sources"]["total"]["tokens"], "peak_rss_mb": rss_mb}


def in_subprocess(corpus: Path, out: Path, workers: int, tokenizer: Path | None) -> dict:
    code = ("import json,sys; from benchmarks.bench_data import run_prepare; "
            "print(json.dumps(run_prepare(*sys.argv[1:3], int(sys.argv[3]), sys.argv[4] or None)))")
    result = subprocess.run([sys.executable, "-c", code, str(corpus), str(out), str(workers), str(tokenizer or "")],
                            check=True, capture_output=True, text=True)
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=float, default=8.0, help="size of the small corpus (the large one is 10x)")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--batches", type=int, default=200)
    args = parser.parse_args()
    load_before = results.load()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        small = make_corpus(tmp / "small", args.mb)
        large = make_corpus(tmp / "large", 10 * args.mb)
        # Train the tokenizer once, so the timings below are of encoding + writing only.
        first = in_subprocess(small, tmp / "tok", 1, None)
        tokenizer = tmp / "tok" / "tokenizer.json"
        print(f"corpus: small {args.mb:g} MB, large {10 * args.mb:g} MB (jsonl of stdlib documents drawn at random)")
        print(f"(tokenizer training + first prepare: {first['seconds']:.1f}s)")
        rates = {}
        for workers in args.workers:
            r = in_subprocess(small, tmp / f"w{workers}", workers, tokenizer)
            rates[workers] = args.mb / r["seconds"]
            print(f"prepare small, workers={workers}: {r['seconds']:.2f}s, {rates[workers]:.2f} MB/s, "
                  f"{r['tokens'] / r['seconds'] / 1e6:.2f} Mtok/s ({rates[workers] / rates[args.workers[0]]:.2f}x "
                  f"workers={args.workers[0]})")
        peaks = {}
        for name, corpus in (("small", small), ("large", large)):
            r = in_subprocess(corpus, tmp / f"rss_{name}", max(args.workers), tokenizer)
            peaks[name] = r["peak_rss_mb"]
            print(f"prepare {name}: {r['tokens']:,} tokens in {r['seconds']:.1f}s, peak RSS {r['peak_rss_mb']:.0f} MB")
        print(f"peak RSS, 10x the corpus: {peaks['large'] / peaks['small']:.2f}x")
        if args.workers[:2] == [1, 2]:
            results.record("data.workers_speedup", rates[2] / rates[1], load_before=load_before)
        results.record("data.peak_rss_growth", peaks["large"] / peaks["small"], load_before=load_before)

        from burnout.data.loader import TokenLoader

        out = tmp / "rss_large"
        for mode in ("mmap", "preload"):
            loader = TokenLoader(out, "train", args.batch_size, args.seq_len, seed=0, mode=mode)
            loader.get_batch(0)
            start = time.perf_counter()
            for step in range(args.batches):
                loader.get_batch(step)
            seconds = time.perf_counter() - start
            shards = len(loader.meta["splits"]["train"]["shards"])
            print(f"get_batch[{mode}] ({shards} shards, B={args.batch_size}, T={args.seq_len}): "
                  f"{args.batches / seconds:.0f} batches/s "
                  f"({args.batches * args.batch_size * args.seq_len / seconds / 1e6:.1f} Mtok/s)")


if __name__ == "__main__":
    main()
