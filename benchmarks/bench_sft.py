"""Does supervised fine-tuning teach a small model to talk? The issue's evidence, measured on this machine.

    python -m benchmarks.bench_sft [--root runs/bench-sft] [--tasks gsm8k alpaca] [--lora] [--questions 200]

1. A base model: the quickstart's llama-tiny with a 512-token context, pretrained on Python's docs
   (`burnout train quickstart`), kept in ROOT/base and reused.
2. gsm8k: `burnout sft` on GSM8K train (full, and with --lora also LoRA), then greedy answers to the first
   N GSM8K test questions: the share whose answer ends in a well-formed `#### <number>` line, for the base
   (the question as plain text) and for each fine-tune (the question as a user turn).
3. alpaca: `burnout sft` on Alpaca (../shared/data/sft/alpaca_5000.json, its own held-out split), then the
   share of 100 held-out instructions whose answer ends at `<|im_end|>` instead of running to max tokens.

Each run's trainable parameters and tokens/s come from its own output and metrics.jsonl.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared" / "data"
ANSWER = re.compile(r"####\s*-?[\d,]*\.?\d+\s*$")


def burnout(*args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "burnout", *args], cwd=REPO, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"burnout {' '.join(args)} failed:\n{done.stderr[-2000:]}")
    return done.stdout + done.stderr


def base_run(root: Path, steps: int) -> Path:
    base = root / "base"
    if not (base / "checkpoints").is_dir():
        burnout("train", "quickstart", "--out", str(base), f"train.max_steps={steps}", "model.context_length=512",
                "train.seq_len=512", "train.batch_size=4", "train.ckpt_interval=100000")
    return base


def fine_tune(base: Path, data: Path, out: Path, steps: int, lora: bool, lr: float) -> dict:
    if not (out / "checkpoints").is_dir():
        log = burnout("sft", str(base), "--data", str(data), "--out", str(out), *(["--lora"] if lora else []),
                      f"train.max_steps={steps}", "train.batch_size=8", "train.seq_len=512", f"train.lr={lr}",
                      f"train.min_lr={lr / 10}", "train.warmup_steps=20", "train.eval_interval=100",
                      "train.ckpt_interval=100000", "train.log_interval=20")
        (out / "bench.log").write_text(log)
    log = (out / "bench.log").read_text()
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rates = [r["tokens_per_s"] for r in records if "tokens_per_s" in r]
    trainable = next((line for line in log.splitlines() if "trainable" in line), "")
    return {"tokens_per_s": sorted(rates)[len(rates) // 2] if rates else None, "trainable": trainable.strip(),
            "final_loss": records[-1].get("train_loss")}


def answers(run: Path, prompts: list, chat: bool, max_new: int) -> list[tuple[str, bool]]:
    """(text, stopped) per prompt: greedy, stopped at <|im_end|> for a chat model."""
    from burnout.core.model_files import load_model
    from burnout.data.chat import chat_token_ids, encode_prompt
    from burnout.generate.sampling import generate_batch

    model, tokenizer, _ = load_model(run)
    stop = chat_token_ids(tokenizer)[1] if chat else None
    context = model.cfg.context_length
    encode = (lambda p: encode_prompt(tokenizer, [{"role": "user", "content": p}])) if chat else \
        (lambda p: tokenizer.encode(p).ids)
    ids = [encode(p)[-context // 2:] for p in prompts]
    out = generate_batch(model, ids, max_new, temperature=0.0, stop_id=stop)
    return [(tokenizer.decode(new), len(new) < min(max_new, context - len(p))) for new, p in zip(out, ids)]


def gsm8k(root: Path, base: Path, args) -> dict:
    test = [json.loads(line) for line in (SHARED / "gsm8k" / "test.jsonl").read_text().splitlines()][:args.questions]
    questions = [t["question"] for t in test]
    result = {}
    runs = {"base": (base, None)}
    runs["sft-full"] = (root / "gsm8k-full", fine_tune(base, SHARED / "gsm8k" / "train.jsonl", root / "gsm8k-full",
                                                       args.sft_steps, False, 1e-3))
    if args.lora:
        runs["sft-lora"] = (root / "gsm8k-lora", fine_tune(base, SHARED / "gsm8k" / "train.jsonl", root / "gsm8k-lora",
                                                           args.sft_steps, True, 3e-3))
    for name, (run, train) in runs.items():
        t0 = time.perf_counter()
        got = answers(run, questions if name != "base" else [f"Question: {q}\nAnswer:" for q in questions],
                      chat=name != "base", max_new=args.max_new)
        share = sum(bool(ANSWER.search(text.strip())) for text, _ in got) / len(got)
        result[name] = {"format_share": share, "train": train, "eval_s": time.perf_counter() - t0,
                        "example": got[0][0][-200:]}
        print(f"gsm8k {name}: {share:.1%} of {len(got)} answers end in '#### <number>'"
              + (f"; {train}" if train else ""), flush=True)
    return result


def alpaca(root: Path, base: Path, args) -> dict:
    import numpy as np

    run = root / "alpaca-full"
    train = fine_tune(base, SHARED / "sft" / "alpaca_5000.json", run, args.sft_steps, False, 1e-3)
    records = json.loads((SHARED / "sft" / "alpaca_5000.json").read_text())
    held_out = np.load(run / "data" / "val_index.npy")[:100]
    prompts = [("\n\n".join(p for p in (records[i]["instruction"], records[i]["input"]) if p.strip()))
               for i in held_out]
    got = answers(run, prompts, chat=True, max_new=args.max_new)
    share = sum(stopped for _, stopped in got) / len(got)
    print(f"alpaca sft-full: {share:.1%} of {len(got)} held-out answers stop at <|im_end|>; {train}", flush=True)
    return {"stop_share": share, "train": train, "example": got[0][0][-200:]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=REPO / "runs" / "bench-sft")
    parser.add_argument("--tasks", nargs="+", default=["gsm8k", "alpaca"], choices=["gsm8k", "alpaca"])
    parser.add_argument("--lora", action="store_true", help="also LoRA on GSM8K")
    parser.add_argument("--base-steps", type=int, default=300)
    parser.add_argument("--sft-steps", type=int, default=300)
    parser.add_argument("--questions", type=int, default=200)
    parser.add_argument("--max-new", type=int, default=192)
    args = parser.parse_args()
    print(f"load {os.getloadavg()}", flush=True)
    args.root.mkdir(parents=True, exist_ok=True)
    base = base_run(args.root, args.base_steps)
    results = {task: (gsm8k if task == "gsm8k" else alpaca)(args.root, base, args) for task in args.tasks}
    (args.root / "results.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
