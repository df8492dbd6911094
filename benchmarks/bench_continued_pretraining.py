"""Continued pretraining on a new domain: a small LLaMA trained on Python's docs (the quickstart's embedded corpus),
then continued on Tiny Shakespeare with `burnout train ... --init-from`, against the same Shakespeare steps from
scratch. Val loss on both domains before and after, as a table.

    .venv/bin/python -m benchmarks.bench_continued_pretraining [--parent-steps 300] [--steps 150] [--keep DIR]

Every run is the real `burnout` command in a fresh process: the docs are prepared with `burnout data prepare`,
the parent trained on them, and each child started with --init-from the parent, its Shakespeare sources prepared
into the child's RUN/data with the parent's tokenizer (the from-scratch run trains on that same folder). Rows:
the parent (before), the child with a fresh optimizer (the default) and with train.init_optimizer=carry, and
Shakespeare from scratch. Each val loss is over the first --val-batches batches of that domain's val split
(the same windows for every row). Prints the CPU model, its threads and the load around the runs (timings on a
shared machine are noisy; losses are what this measures).
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

SHAKESPEARE = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "tinyshakespeare" / "input.txt"
# llama-tiny cut to 2 layers × 64 wide (about 0.2M parameters at a 2,048-token vocabulary): minutes on two cores.
MODEL = {"preset": "llama-tiny", "n_layer": 2, "d_model": 64, "n_head": 4, "n_kv_head": 2, "context_length": 64}
TRAIN = {"device": "cpu", "batch_size": 8, "seq_len": 64, "lr": 3e-3, "min_lr": 3e-4, "warmup_steps": 20,
         "schedule": "cosine", "log_interval": 25, "eval_interval": 100, "eval_batches": 8, "keep_last": 1}








def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parent-steps", type=int, default=300, help="the docs run's steps")
    parser.add_argument("--steps", type=int, default=150, help="each Shakespeare run's steps")
    parser.add_argument("--docs-chars", type=int, default=1_000_000, help="characters of Python's docs prepared")
    parser.add_argument("--val-batches", type=int, default=16)
    parser.add_argument("--keep", help="a folder to keep the runs in (default: a temporary one)")
    args = parser.parse_args()
    loss = partial(val_loss, batch_size=TRAIN["batch_size"], seq_len=TRAIN["seq_len"], batches=args.val_batches)
    load_before = results.load()
    print(f"{cpu_model()}, {torch.get_num_threads()} threads; load before {load_before:.2f}")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.keep or tmp)
        root.mkdir(parents=True, exist_ok=True)
        docs_data, parent = root / "docs-data", root / "parent-docs"
        recipe = root / "docs.yaml"
        recipe.write_text(yaml.safe_dump({
            "data": {"sources": [{"name": "docs", "kind": "stdlib_docs"}], "max_chars": args.docs_chars},
            "tokenizer": {"kind": "bpe", "vocab_size": 2048}}))
        seconds = {"prepare docs": burnout("data", "prepare", str(recipe), "--out", str(docs_data))}
        parent_cfg = root / "parent.yaml"
        parent_cfg.write_text(yaml.safe_dump({"model": {**MODEL, "vocab_size": 2048},
                                              "train": {**TRAIN, "max_steps": args.parent_steps}}))
        seconds["parent (docs)"] = burnout("train", str(parent_cfg), "--out", str(parent), "--data", str(docs_data))
        # The child's config: Shakespeare's sources, its own schedule, no model section (the parent's is taken).
        child_cfg = root / "shakespeare.yaml"
        child_cfg.write_text(yaml.safe_dump({
            "data": {"sources": [{"name": "shakespeare", "kind": "text", "path": str(SHAKESPEARE)}],
                     "max_chars": 1_200_000},
            "train": {**TRAIN, "max_steps": args.steps}}))
        runs = {"parent: docs only (before)": parent}
        for name, extra in (("continued, fresh optimizer", []),
                            ("continued, carried optimizer", ["train.init_optimizer=carry"])):
            out = root / name.replace(", ", "-").replace(" ", "-")
            seconds[name] = burnout("train", str(child_cfg), "--out", str(out), "--init-from", str(parent), *extra)
            runs[name] = out
        shakespeare_data = runs["continued, fresh optimizer"] / "data"
        scratch_cfg = root / "scratch.yaml"
        scratch_cfg.write_text(yaml.safe_dump({"model": {**MODEL, "vocab_size": 2048},
                                               "train": {**TRAIN, "max_steps": args.steps}}))
        runs["Shakespeare from scratch"] = root / "scratch"
        seconds["Shakespeare from scratch"] = burnout("train", str(scratch_cfg), "--out", str(root / "scratch"),
                                                      "--data", str(shakespeare_data))
        print(f"load after {os.getloadavg()[0]:.2f}")
        print("\n| run | steps | docs val loss | Shakespeare val loss |\n|---|---|---|---|")
        shakespeare = {name: loss(run, shakespeare_data) for name, run in runs.items()}
        for name, run in runs.items():
            steps = args.parent_steps if run == parent else args.steps
            print(f"| {name} | {steps} | {loss(run, docs_data):.3f} | {shakespeare[name]:.3f} |")
        if (args.parent_steps, args.steps, args.docs_chars, args.val_batches) == (300, 150, 1_000_000, 16):
            for claim, name in (("runs.continued_fresh", "continued, fresh optimizer"),
                                ("runs.continued_carry", "continued, carried optimizer"),
                                ("runs.continued_scratch", "Shakespeare from scratch")):
                results.record(claim, shakespeare[name], load_before=load_before)
        print("\n" + ", ".join(f"{name} {s:.0f} s" for name, s in seconds.items()))


if __name__ == "__main__":
    main()
