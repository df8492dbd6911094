"""`burnout data audit` throughput and memory.

    python -m benchmarks.bench_audit [--mb 150] [--small-mb 15] [--keep DIR]

The corpus is a jsonl file of documents built from the shared data (../shared/data): each document is 1
to 12 paragraphs drawn at random (seeded, with replacement) from one of Tiny Shakespeare, WikiText-2
(raw and tokenized), TinyStories, GSM8K, MATH, LAMBADA, ARC, HellaSwag and Alpaca, joined by blank
lines; a third of the documents carry a random reference id (a hex run, as web pages do) so the
vocabulary keeps growing. The audit reads the whole file (one jsonl source, chars_per_source=0), in a
fresh process per corpus so that its peak RSS (resource.getrusage) is its own: once on --small-mb and
once on --mb, to show how memory grows with the corpus (the counting tables are bounded by --capacity;
the duplicate indexes grow with the documents). Wall and CPU seconds are both given, with
the load average before and after and the CPU model, since other work on the machine slows the wall clock.
"""

from __future__ import annotations

import argparse
import bz2
import json
import os
import platform
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import results
from burnout.core.device import cpu_model

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"


def _pools() -> dict[str, list[str]]:
    """Paragraphs of each shared text, by name."""
    def blocks(text: str, sep: str) -> list[str]:
        return [b.strip() for b in text.split(sep) if len(b.strip()) > 40]

    def jsonl(path: Path, *keys: str) -> list[str]:
        rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        return ["\n".join(str(row[k]) for k in keys if k in row) for row in rows]

    read = lambda *parts: (SHARED.joinpath(*parts)).read_text(encoding="utf-8")  # noqa: E731
    alpaca = json.loads(read("sft", "alpaca_5000.json"))
    return {
        "shakespeare": blocks(read("tinyshakespeare", "input.txt"), "\n\n"),
        "wikitext_raw": blocks(read("wikitext2", "wiki.test.raw").replace("\r", ""), "\n"),
        "wikitext_tokens": blocks(read("wikitext2", "wiki.valid.tokens"), "\n \n"),
        "tinystories": blocks(read("tinystories", "tinystories_sample.txt"), "<|endoftext|>"),
        "gsm8k": jsonl(SHARED / "gsm8k" / "train.jsonl", "question", "answer"),
        "math": jsonl(SHARED / "math" / "math_test.jsonl", "context", "chain_of_thought"),
        "lambada": jsonl(SHARED / "lambada" / "lambada_openai_test.jsonl", "context", "continuation"),
        "arc": jsonl(SHARED / "arc" / "arc_easy_test.jsonl", "query"),
        "hellaswag": blocks(bz2.decompress((SHARED / "hellaswag" / "hellaswag_val_full.txt.bz2").read_bytes())
                            .decode("utf-8"), "\n"),
        "alpaca": [r["instruction"] + "\n" + r["output"] for r in alpaca],
    }


def make_corpus(path: Path, megabytes: float, seed: int = 0) -> dict:
    pools = _pools()
    names = sorted(pools)
    rng = random.Random(seed)
    target = int(megabytes * 1e6)
    written = documents = 0
    with path.open("w", encoding="utf-8") as f:
        while written < target:
            pool = pools[rng.choice(names)]
            parts = [rng.choice(pool) for _ in range(rng.randint(1, 12))]
            if rng.random() < 1 / 3:
                parts.insert(0, f"ref: {rng.getrandbits(48):012x}")
            line = json.dumps({"text": "\n\n".join(parts)}, ensure_ascii=False) + "\n"
            f.write(line)
            written += len(line.encode("utf-8"))
            documents += 1
    return {"bytes": written, "documents": documents, "pools": {k: len(v) for k, v in pools.items()}}


def run_audit(corpus: str, capacity: int) -> dict:
    """Audit `corpus` (this process: call it in a fresh one) and measure."""
    from burnout.config import DataConfig, SourceConfig
    from burnout.forensics.audit import audit_streams, source_streams
    from burnout.forensics.audit_settings import AuditSettings

    cfg = DataConfig(sources=[SourceConfig(name="corpus", kind="jsonl", path=corpus)])
    wall, cpu = time.perf_counter(), time.process_time()
    report = audit_streams(source_streams(cfg, chars_per_source=0), AuditSettings(capacity=capacity))
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    src = report["sources"][0]
    return {"seconds": wall, "cpu_seconds": cpu, "documents": src["documents"], "chars": src["chars"],
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "count_error_bound": src["count_error_bound"], "split": report["totals"]["seconds"],
            "exact_groups": report["exact_duplicates"]["groups"],
            "near_clusters": report["near_duplicates"]["clusters"],
            "top_terms": [r["string"] for r in src["suspicious_terms"][:5]]}


def in_subprocess(corpus: Path, capacity: int) -> dict:
    code = ("import json,sys; from benchmarks.bench_audit import run_audit; "
            "print(json.dumps(run_audit(sys.argv[1], int(sys.argv[2]))))")
    result = subprocess.run([sys.executable, "-c", code, str(corpus), str(capacity)], check=True,
                            capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1])
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=float, default=150.0, help="size of the large corpus in MB (default 150)")
    parser.add_argument("--small-mb", type=float, default=15.0, help="size of the small corpus (default 15)")
    parser.add_argument("--capacity", type=int, default=300_000, help="keys per counting table (default 300,000)")
    parser.add_argument("--keep", type=Path, help="build (or reuse) the corpora in this folder instead of a temp one")
    args = parser.parse_args()
    if not SHARED.is_dir():
        sys.exit(f"the shared data folder {SHARED} is missing")
    print(f"CPU: {cpu_model()} ({os.cpu_count()} logical cores); Python {platform.python_version()}")
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        for name, mb in (("small", args.small_mb), ("large", args.mb)):
            path = folder / f"{name}_{mb:g}mb.jsonl"
            if not path.is_file():
                made = make_corpus(path, mb)
                print(f"built {path.name}: {made['bytes'] / 1e6:.1f} MB, {made['documents']:,} documents")
            load = os.getloadavg()
            r = in_subprocess(path, args.capacity)
            after = os.getloadavg()
            mb_read = path.stat().st_size / 1e6
            print(f"{name}: {mb_read:.1f} MB, {r['documents']:,} documents ({r['chars']:,} characters) in "
                  f"{r['seconds']:.1f} s wall / {r['cpu_seconds']:.1f} s CPU: "
                  f"{r['documents'] / r['seconds']:,.0f} documents/s, {mb_read / r['seconds']:.2f} MB/s wall "
                  f"({mb_read / r['cpu_seconds']:.2f} MB/s per CPU second); peak RSS {r['peak_rss_mb']:.0f} MB")
            print(f"  counting {r['split']['counting']:.1f} s, duplicates {r['split']['duplicates']:.1f} s; "
                  f"count error bound {r['count_error_bound']}; {r['exact_groups']:,} exact duplicate texts, "
                  f"{r['near_clusters']:,} near-duplicate clusters; top strings {r['top_terms']}")
            print(f"  load average before {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, "
                  f"after {after[0]:.2f} {after[1]:.2f} {after[2]:.2f}")
            if name == "large" and args.mb == 100:
                results.record("forensics.audit_mb_per_cpu_s", mb_read / r["cpu_seconds"], load_before=load[0],
                               load_after=after[0], note=f"{r['seconds']:.0f} s wall")
                results.record("forensics.audit_peak_rss_mb", r["peak_rss_mb"], load_before=load[0],
                               load_after=after[0])


if __name__ == "__main__":
    main()
