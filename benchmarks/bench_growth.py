"""Does growth pay? A small LLaMA (4 layers) trained for a budget, grown to 8 layers with `burnout grow` and trained
further, against (a) the small one trained on for the same extra FLOPs and (b) the 8-layer shape from scratch for the
total FLOPs. Val loss of each at equal FLOPs, as a table.

    .venv/bin/python -m benchmarks.bench_growth [--small-steps 400] [--grown-steps 200] [--threads 1] [--keep DIR]

Every run is the real `burnout` command in a fresh process, on Python's docs (the quickstart's embedded corpus)
prepared once with `burnout data prepare`. The grown run and (a) both continue with `burnout train --init-from`
under the same schedule (a fresh optimizer, its own warmup and cosine); (b) is one run of one schedule. Steps are
set from models/info's FLOPs per token so that each row ends at the same total FLOPs (the small run's budget plus
the grown run's). Each val loss is over the first --val-batches batches of the val split (the same windows for
every row). Each process computes on --threads threads (OMP_NUM_THREADS): on a machine busy with other work, two
threads of one process wait on each other far longer than they compute (docs/PERFORMANCE.md). Prints the CPU model,
the threads and the load around the runs (timings on a shared machine are noisy; losses are what this measures).
"""

from __future__ import annotations

import argparse
import os
import tempfile
from functools import partial
from pathlib import Path

import torch
import yaml

from benchmarks import results
from benchmarks.timed_runs import burnout, val_loss
from burnout.core.device import cpu_model

VOCAB = 2048
SMALL = {"family": "llama", "vocab_size": VOCAB, "n_layer": 4, "d_model": 128, "n_head": 4, "n_kv_head": 2,
         "context_length": 128, "ffn_multiple_of": 64}
TRAIN = {"device": "cpu", "precision": "fp32", "batch_size": 8, "seq_len": 128, "lr": 3e-3, "min_lr": 3e-4,
         "warmup_steps": 30, "schedule": "cosine", "log_interval": 50, "eval_interval": 100, "eval_batches": 8,
         "keep_last": 1}




def flops_per_token(n_layer: int) -> float:
    """Training FLOPs per token of the benchmark's model at `n_layer` layers (models/info, as the loop counts MFU)."""
    from burnout.config import ModelConfig
    from burnout.models.info import model_info

    info = model_info(ModelConfig(**{**SMALL, "n_layer": n_layer}), seq_len=TRAIN["seq_len"])
    return info["flops_per_token"]






def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small-steps", type=int, default=400, help="the 4-layer run's steps before growing")
    parser.add_argument("--grown-steps", type=int, default=200, help="the grown 8-layer run's steps")
    parser.add_argument("--threads", type=int, default=1, help="torch's threads in each process")
    parser.add_argument("--docs-chars", type=int, default=2_000_000, help="characters of Python's docs prepared")
    parser.add_argument("--val-batches", type=int, default=16)
    parser.add_argument("--keep", help="a folder to keep the runs in (default: a temporary one)")
    args = parser.parse_args()
    loss = partial(val_loss, batch_size=TRAIN["batch_size"], seq_len=TRAIN["seq_len"], batches=args.val_batches)
    torch.set_num_threads(args.threads)
    load_before = results.load()
    print(f"{cpu_model()}, {torch.get_num_threads()} threads; load before {load_before:.2f}")
    small_f, large_f = flops_per_token(SMALL["n_layer"]), flops_per_token(2 * SMALL["n_layer"])
    tokens_per_step = TRAIN["batch_size"] * TRAIN["seq_len"]
    extra = args.grown_steps * large_f  # per token of a step: what the grown run spends after the small one
    steps = {"small (4 layers), before growing": args.small_steps,
             "grown to 8 layers, trained on": args.grown_steps,
             "(a) small, trained on": round(extra / small_f),
             "(b) 8 layers from scratch": round((args.small_steps * small_f + extra) / large_f)}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.keep or tmp)
        root.mkdir(parents=True, exist_ok=True)
        data, recipe = root / "docs-data", root / "docs.yaml"
        recipe.write_text(yaml.safe_dump({
            "data": {"sources": [{"name": "docs", "kind": "stdlib_docs"}], "max_chars": args.docs_chars},
            "tokenizer": {"kind": "bpe", "vocab_size": VOCAB}}))
        seconds = {"prepare": burnout("data", "prepare", str(recipe), "--out", str(data))}
        runs = {name: root / f"run{i}" for i, name in enumerate(steps)}
        small, grown, small_on, scratch = runs.values()

        def config(name: str, model: dict | None) -> Path:
            path = root / f"{runs[name].name}.yaml"
            path.write_text(yaml.safe_dump({**({"model": model} if model else {}),
                                            "train": {**TRAIN, "max_steps": steps[name]}}))
            return path

        names = list(steps)
        seconds[names[0]] = burnout("train", str(config(names[0], SMALL)), "--out", str(small), "--data", str(data))
        seconds["grow"] = burnout("grow", str(small), "--out", str(root / "grown-start"),
                                  f"model.n_layer={2 * SMALL['n_layer']}")
        for name, start in ((names[1], root / "grown-start"), (names[2], small)):
            seconds[name] = burnout("train", str(config(name, None)), "--out", str(runs[name]), "--data", str(data),
                                    "--init-from", str(start))
        seconds[names[3]] = burnout("train", str(config(names[3], {**SMALL, "n_layer": 2 * SMALL["n_layer"]})),
                                    "--out", str(scratch), "--data", str(data))
        print(f"load after {os.getloadavg()[0]:.2f}")
        start_loss = loss(root / "grown-start", data)
        print(f"\nthe grown model at its step 0: val loss {start_loss:.4f} (the small run's: "
              f"{loss(small, data):.4f})")
        spent = {names[0]: args.small_steps * small_f, names[1]: args.small_steps * small_f + extra,
                 names[2]: args.small_steps * small_f + extra, names[3]: steps[names[3]] * large_f}
        print("\n| run | its steps | total TFLOPs | val loss | wall s |\n|---|---:|---:|---:|---:|")
        losses = {name: loss(run, data) for name, run in runs.items()}
        for name in runs:
            print(f"| {name} | {steps[name]} | {spent[name] * tokens_per_step / 1e12:.2f} | "
                  f"{losses[name]:.4f} | {seconds[name]:.0f} |")
        print(f"\nprepare {seconds['prepare']:.0f} s, grow {seconds['grow']:.0f} s")
    if (args.small_steps, args.grown_steps, args.docs_chars, args.val_batches) == (400, 200, 2_000_000, 16):
        for claim, name in (("runs.growth_small_on", names[2]), ("runs.growth_grown", names[1]),
                            ("runs.growth_scratch", names[3])):
            results.record(claim, losses[name], load_before=load_before)


if __name__ == "__main__":
    main()
