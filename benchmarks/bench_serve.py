"""`burnout serve` under concurrent clients: requests/s, completion tokens/s and latency at 1, 4 and 16 clients.

    python -m benchmarks.bench_serve RUN [--clients 1,4,16] [--requests 32] [--max-tokens 32] [--concurrency 1]

Starts `burnout serve RUN` as its own process (with a queue long enough that nothing is refused), then each
client, a thread with its own official `openai` client, sends completions ("The ", temperature 0.8, a seed per
request) one after another until the clients have sent --requests in all. Prints one row per client count.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import threading
import time

import openai

from benchmarks import results


def start_server(run: str, concurrency: int, queue: int) -> tuple[subprocess.Popen, str, str]:
    proc = subprocess.Popen([sys.executable, "-m", "burnout", "serve", run, "--port", "0", "--concurrency",
                             str(concurrency), "--queue-size", str(queue)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    line = proc.stdout.readline()
    found = re.search(r"serving '([^']+)' .* at (http://\S+/v1);", line)
    if not found:
        proc.kill()
        sys.exit(f"the server did not start: {line}{proc.communicate()[0]}")
    return proc, found[1], found[2]


def load(url: str, name: str, clients: int, requests: int, max_tokens: int) -> dict:
    latencies: list[float] = []
    tokens: list[int] = []
    numbers = iter(range(requests))
    lock = threading.Lock()

    def client() -> None:
        c = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=600)
        while True:
            with lock:
                number = next(numbers, None)
            if number is None:
                return
            start = time.perf_counter()
            answer = c.completions.create(model=name, prompt="The ", max_tokens=max_tokens, temperature=0.8,
                                          seed=number)
            with lock:
                latencies.append(time.perf_counter() - start)
                tokens.append(answer.usage.completion_tokens)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    return {"clients": clients, "requests_per_s": len(latencies) / wall, "tokens_per_s": sum(tokens) / wall,
            "p50_s": statistics.median(latencies), "max_s": max(latencies)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run")
    parser.add_argument("--clients", default="1,4,16")
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--concurrency", type=int, default=1)
    args = parser.parse_args()
    counts = [int(c) for c in args.clients.split(",")]
    proc, name, url = start_server(args.run, args.concurrency, max(counts))
    try:
        load(url, name, 1, 2, args.max_tokens)  # warm-up
        print(f"{name}, {args.requests} requests of up to {args.max_tokens} tokens, --concurrency {args.concurrency}; "
              f"load {os.getloadavg()[0]:.1f}")
        print("| clients | requests/s | completion tokens/s | median latency | slowest |")
        print("|---|---|---|---|---|")
        for count in counts:
            load_before = results.load()
            row = load(url, name, count, args.requests, args.max_tokens)
            print(f"| {row['clients']} | {row['requests_per_s']:.2f} | {row['tokens_per_s']:.0f} | "
                  f"{row['p50_s']:.2f} s | {row['max_s']:.2f} s |")
            if (args.requests, args.max_tokens, args.concurrency) == (32, 32, 1) and count in (1, 4, 16):
                results.record(f"runs.serve_rps.{count}", row["requests_per_s"], load_before=load_before,
                               note=f"model {name}")
    finally:
        proc.terminate()
        proc.wait(timeout=30)


if __name__ == "__main__":
    main()
