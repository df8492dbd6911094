"""Scan speed of `burnout data trace`: tokens per second on one core.

    python -m benchmarks.bench_trace [--tokens 1000000000] [--plants 1000] [--repeats 3]

Writes a synthetic prepared folder (uint16 shards of --shard-tokens, a document index, meta.json) of
--tokens tokens into a temporary folder it removes at the end; its free space is checked first and
the size scaled down, with a note, when it is short. Tokens are uniform over 50,000 ids, documents
999 tokens long, each ending with <|endoftext|>. A 4-token pattern is planted --plants times (some
across shard boundaries), beside as many decoys that differ from it in the last token only.

The scan runs in a child process with one thread (OMP/MKL/OpenBLAS threads = 1; numpy's comparisons
are single-threaded anyway), so its peak RSS (VmHWM) is the scan's own: it prints wall and CPU seconds,
tokens/s per core (on wall time and on the process's CPU time: on a busy machine the wall time also
holds the time other processes had the core, which the involuntary context switches count), the hit
count against the planted count, the load average before and after and the CPU model. A second
line times the multi-pattern path (100 patterns, a lookup table) for scale.
The first repeat may read from disk; the others read the page cache.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import json  # noqa: E402
import resource  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from benchmarks import results  # noqa: E402
from burnout.core.device import cpu_model  # noqa: E402

VOCAB, EOT, DOC_TOKENS = 50257, 50256, 999  # 999: document ends fall off the shard boundaries
PATTERN = [1234, 50100, 4321, 50101]  # 50100 and 50101 are outside the random ids: only plants have them
DECOY = [1234, 50100, 4321, 999]
GEN_CHUNK = 1 << 24


def fit_to_disk(folder: Path, tokens: int) -> int:
    """`tokens`, or fewer when the disk holding `folder` lacks room for them (2 bytes each, plus 1 GB)."""
    free = shutil.disk_usage(folder).free
    need = tokens * 2 + (1 << 30)
    if need <= free:
        return tokens
    fitted = max((free - (1 << 30)) // 2 // 10**6 * 10**6, 10**6)
    print(f"note: {free / 1e9:.1f} GB free at {folder}, {need / 1e9:.1f} GB needed for {tokens:,} tokens: "
          f"scaled down to {fitted:,} tokens")
    return fitted


def write_folder(out: Path, tokens: int, shard_tokens: int, plants: int, seed: int = 0) -> dict:
    """A prepared-data folder (train split of `tokens`, a tiny val) with PATTERN planted `plants` times."""
    rng = np.random.default_rng(seed)
    # Plant positions: spread evenly, two of them straddling each of the first shard boundaries.
    boundaries = list(range(shard_tokens, tokens, shard_tokens))[: plants // 4]
    spots = sorted({*(b - 2 for b in boundaries), *np.linspace(100, tokens - 100, plants).astype(np.int64)})
    spots = [s for s in spots if s % DOC_TOKENS < DOC_TOKENS - 14][:plants]  # pattern and decoy in one document
    decoys = [s + 8 for s in spots]
    shards = []
    for index, start in enumerate(range(0, tokens, shard_tokens)):
        stop = min(start + shard_tokens, tokens)
        name = f"train_{index:06d}.bin"
        with open(out / name, "wb") as f:
            for lo in range(start, stop, GEN_CHUNK):
                hi = min(lo + GEN_CHUNK, stop)
                chunk = rng.integers(0, 50_000, hi - lo, dtype=np.uint16)
                chunk[(DOC_TOKENS - 1 - lo % DOC_TOKENS) % DOC_TOKENS :: DOC_TOKENS] = EOT
                for where, pattern in ((spots, PATTERN), (decoys, DECOY)):
                    for s in where:
                        for k, t in enumerate(pattern):
                            if lo <= s + k < hi:
                                chunk[s + k - lo] = t
                f.write(chunk.tobytes())
        shards.append({"file": name, "tokens": stop - start, "sha256": ""})
    val = np.full(DOC_TOKENS, 7, dtype=np.uint16)
    val[-1] = EOT
    (out / "val_000000.bin").write_bytes(val.tobytes())
    docs = np.zeros(-(-tokens // DOC_TOKENS), dtype=[("start", "<u8"), ("source", "<u2")])
    docs["start"] = np.arange(len(docs)) * DOC_TOKENS
    docs["source"] = np.arange(len(docs)) % 2
    np.save(out / "train_docs.npy", docs)
    np.save(out / "val_docs.npy", np.zeros(1, dtype=docs.dtype))
    meta = {"format": "burnout-tokens-v2", "dtype": "uint16", "vocab_size": VOCAB, "eot_id": EOT,
            "splits": {"train": {"tokens": tokens, "documents": len(docs), "shards": shards},
                       "val": {"tokens": DOC_TOKENS, "documents": 1,
                               "shards": [{"file": "val_000000.bin", "tokens": DOC_TOKENS, "sha256": ""}]}},
            "document_index": {"format": "burnout-docs-v1", "files": {"train": "train_docs.npy",
                                                                     "val": "val_docs.npy"},
                               "sources": ["even", "odd"], "bytes_per_document": 10}}
    (out / "meta.json").write_text(json.dumps(meta))
    return {"planted": len(spots), "decoys": len(decoys)}


def scan_only(folder: Path, repeats: int) -> dict:
    """Runs in the child: the timed scans."""
    from burnout.data.documents import SplitDocuments
    from burnout.forensics.trace import scan, token_counts

    docs = SplitDocuments(folder, "train")
    counts = token_counts(docs, VOCAB)
    runs = []
    hits = None
    for _ in range(repeats):
        switches = resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw
        wall, cpu = time.perf_counter(), time.process_time()
        (hits,) = scan(docs, [np.array(PATTERN)], counts)
        runs.append((time.perf_counter() - wall, time.process_time() - cpu,
                     resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw - switches))
    per_source = np.bincount(docs.source_ids[docs.locate(hits)], minlength=2).tolist()
    rng = np.random.default_rng(1)
    many = [np.array([*rng.integers(0, 50_000, 3), 50_100 + i]) for i in range(99)] + [np.array(PATTERN)]
    wall, cpu = time.perf_counter(), time.process_time()
    found = scan(docs, many, counts)
    multi = (time.perf_counter() - wall, time.process_time() - cpu)
    return {"tokens": docs.total, "runs": runs, "hits": len(hits), "per_source": per_source,
            "multi": multi, "multi_hits": len(found[-1]),
            "peak_rss_mb": peak_rss_mb()}


def peak_rss_mb() -> float:
    """This process's peak resident memory: VmHWM (ru_maxrss would include the parent's, from the fork)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=1_000_000_000)
    parser.add_argument("--shard-tokens", type=int, default=100_000_000)
    parser.add_argument("--plants", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dir", default=None, help="where to make the temporary folder (default: the system's)")
    parser.add_argument("--scan-only", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.scan_only:
        print(json.dumps(scan_only(Path(args.scan_only), args.repeats)))
        return

    root = Path(tempfile.mkdtemp(prefix="bench_trace_", dir=args.dir))
    try:
        tokens = fit_to_disk(root, args.tokens)
        started = time.perf_counter()
        planted = write_folder(root, tokens, min(args.shard_tokens, tokens), args.plants)
        print(f"wrote {tokens:,} uint16 tokens in {-(-tokens // args.shard_tokens)} shard(s) to {root} "
              f"in {time.perf_counter() - started:.1f}s; pattern planted {planted['planted']:,} times, "
              f"{planted['decoys']:,} decoys")
        load_before = os.getloadavg()
        child = subprocess.run([sys.executable, "-m", "benchmarks.bench_trace", "--scan-only", str(root),
                                "--repeats", str(args.repeats)], capture_output=True, text=True,
                               cwd=Path(__file__).resolve().parent.parent)
        if child.returncode:
            sys.exit(child.stderr)
        result = json.loads(child.stdout)
        load_after = os.getloadavg()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"CPU: {cpu_model()}, {os.cpu_count()} cores; load average before {load_before[0]:.2f}, "
          f"after {load_after[0]:.2f} (1 min)")
    for i, (wall, cpu, switches) in enumerate(result["runs"]):
        print(f"  scan {i + 1}: {wall:.3f}s wall, {cpu:.3f}s CPU -> {result['tokens'] / wall / 1e6:,.0f}M tokens/s "
              f"per core (wall), {result['tokens'] / max(cpu, 1e-9) / 1e6:,.0f}M (CPU); preempted {switches:,} times")
    best = min(w for w, _, _ in result["runs"])
    print(f"best: {result['tokens'] / best / 1e6:,.0f}M tokens/s on one thread; hits {result['hits']:,} "
          f"(planted {planted['planted']:,}: {'match' if result['hits'] == planted['planted'] else 'MISMATCH'}), "
          f"per source {result['per_source']}")
    wall, cpu = result["multi"]
    print(f"100 patterns in one pass (lookup table): {wall:.3f}s wall, {cpu:.3f}s CPU -> "
          f"{result['tokens'] / wall / 1e6:,.0f}M tokens/s (wall), "
          f"{result['tokens'] / max(cpu, 1e-9) / 1e6:,.0f}M (CPU); "
          f"the planted one found {result['multi_hits']:,} times")
    print(f"peak RSS of the scanning process: {result['peak_rss_mb']:.0f} MB")
    if result["hits"] != planted["planted"] or result["multi_hits"] != planted["planted"]:
        sys.exit("hit count does not match the planted count")
    if tokens == 1_000_000_000:
        results.record("data.trace_tokens_per_s", result["tokens"] / best / 1e6, load_before=load_before[0],
                       load_after=load_after[0], note=f"best of {args.repeats}, wall")


if __name__ == "__main__":
    main()
