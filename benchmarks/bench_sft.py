"""Does fine-tuning teach a small model to talk? The issue's evidence, measured on this machine.

    python -m benchmarks.bench_sft [--root runs/bench-sft] [--tasks gsm8k alpaca dpo] [--lora] [--questions 200]

1. A base model: the quickstart's llama-tiny with a 512-token context, pretrained for --base-steps steps of
   8 × 512 tokens on Python's docs (`burnout train quickstart`), kept in ROOT/base and reused.
2. gsm8k: `burnout sft` on GSM8K train (full, and with --lora also LoRA, same model, batch and steps), then
   greedy answers to the first N GSM8K test questions: the share whose answer ends in a well-formed
   `#### <number>` line, for the base (the question as plain text) and for each fine-tune (a user turn).
3. alpaca: `burnout sft` on Alpaca (../shared/data/sft/alpaca_5000.json, its own held-out split), then the
   share of 100 held-out instructions whose answer ends at `<|im_end|>` instead of running to max tokens.
4. dpo: preference pairs from the GSM8K test questions after the first N (never seen in training): chosen =
   the reference answer, rejected = the same answer with every number replaced by another. `burnout dpo`
   from the full GSM8K fine-tune; its held-out pairs' reward accuracy and margin, first and last evaluation.

5. step-time: full fine-tuning and LoRA on the same model, back to back, --timing-steps steps each at a
   fixed 8 × 512 batch: median ms/step and their ratio.
6. packing: Alpaca padded (pad_to_longest) and packed (sft.packing), back to back: assistant targets per second
   and the share of padding.
7. dpo-packing: DPO on pairs made from Alpaca (chosen its answer, rejected the next record's), padded
   (pad_to_longest) and packed (dpo.packing), back to back from a chat model SFT'd for 2 steps (the weights do not
   change the time): pairs and answer targets per second, and the share of padding.

Each run's trainable parameters, optimizer state, ms/step and tokens/s come from its own output and
metrics.jsonl; fine-tunes use padded rows, sft.pad_to_longest (tokens/s counts the positions computed).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import results

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
                "train.seq_len=512", "train.batch_size=8", "train.ckpt_interval=100000")
    return base


def fine_tune(command: str, base: Path, data: Path, out: Path, steps: int, lr: float, *extra: str) -> dict:
    """`burnout sft|dpo` (once; reused when OUT has checkpoints) and what its log and metrics say."""
    if not (out / "checkpoints").is_dir():
        log = burnout(command, str(base), "--data", str(data), "--out", str(out), f"train.max_steps={steps}",
                      "train.batch_size=8", "train.seq_len=512", f"train.lr={lr}", f"train.min_lr={lr / 10}",
                      "train.warmup_steps=20", "train.eval_interval=100", "train.ckpt_interval=100000",
                      "train.log_interval=20", f"{command}.pad_to_longest=true",
                      *(["sft.packing=false"] if command == "sft" else []), *extra)
        (out / "bench.log").write_text(log)
    log = (out / "bench.log").read_text()
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    timed = [(b["elapsed_s"] - a["elapsed_s"]) / (b["step"] - a["step"]) for a, b in zip(records, records[1:])
             if "tokens_per_s" in b and "val_loss" not in b and b["step"] > a["step"]]
    rates = [r["tokens_per_s"] for r in records if "tokens_per_s" in r]
    trainable = next((line for line in log.splitlines() if line.startswith("trainable")), "")
    return {"ms_per_step": 1000 * median(timed) if timed else None, "tokens_per_s": median(rates) if rates else None,
            "trainable": trainable.strip(), "final_loss": records[-1].get("train_loss"),
            "evals": [{k: v for k, v in r.items() if k.startswith("val_")} for r in records if "val_loss" in r]}


def median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


def answers(run: Path, prompts: list, chat: bool, max_new: int) -> list[tuple[str, bool]]:
    """(text, stopped) per prompt: greedy, stopped at <|im_end|> for a chat model."""
    from burnout.core.chat_template import chat_token_ids, encode_prompt
    from burnout.core.model_files import load_model
    from burnout.generate.sampling import generate_batch

    model, tokenizer, _ = load_model(run)
    stop = chat_token_ids(tokenizer)[1] if chat else None
    context = model.cfg.context_length
    encode = (lambda p: encode_prompt(tokenizer, [{"role": "user", "content": p}])) if chat else \
        (lambda p: tokenizer.encode(p).ids)
    ids = [encode(p)[-context // 2:] for p in prompts]
    out = generate_batch(model, ids, max_new, temperature=0.0, stop_id=stop)
    return [(tokenizer.decode(new), len(new) < min(max_new, context - len(p))) for new, p in zip(out, ids)]


def gsm8k(root: Path, base: Path, args, done: dict) -> dict:
    test = [json.loads(line) for line in (SHARED / "gsm8k" / "test.jsonl").read_text().splitlines()][:args.questions]
    questions = [t["question"] for t in test]
    train_file = SHARED / "gsm8k" / "train.jsonl"
    runs = {"base": (base, None),
            "sft-full": (root / "gsm8k-full", fine_tune("sft", base, train_file, root / "gsm8k-full",
                                                        args.sft_steps, args.lr))}
    if args.lora:
        runs["sft-lora"] = (root / "gsm8k-lora", fine_tune(
            "sft", base, train_file, root / "gsm8k-lora", args.sft_steps, args.lora_lr, "--lora",
            f"sft.lora.r={args.lora_r}", f"sft.lora.alpha={2 * args.lora_r}"))
    result = {}
    for name, (run, train) in runs.items():
        if name in done:  # measured by an earlier invocation (results.json): delete it to measure again
            result[name] = done[name]
            print(f"gsm8k {name}: {done[name]['format_share']:.1%} (from results.json)", flush=True)
            continue
        t0 = time.perf_counter()
        got = answers(run, questions if name != "base" else [f"Question: {q}\nAnswer:" for q in questions],
                      chat=name != "base", max_new=args.max_new)
        share = sum(bool(ANSWER.search(text.strip())) for text, _ in got) / len(got)
        result[name] = {"format_share": share, "train": train, "eval_s": time.perf_counter() - t0,
                        "example": got[0][0][-300:]}
        print(f"gsm8k {name}: {share:.1%} of {len(got)} answers end in '#### <number>'" + (
            f"; {train['trainable']}; {train['ms_per_step']:.0f} ms/step, {train['tokens_per_s']:.0f} tok/s, "
            f"final loss {train['final_loss']:.3f}" if train else ""), flush=True)
    return result


def alpaca(root: Path, base: Path, args, done: dict) -> dict:
    import numpy as np

    run = root / "alpaca-full"
    train = fine_tune("sft", base, SHARED / "sft" / "alpaca_5000.json", run, args.sft_steps, args.lr)
    records = json.loads((SHARED / "sft" / "alpaca_5000.json").read_text())
    held_out = np.load(run / "data" / "val_index.npy")[:100]
    prompts = [("\n\n".join(p for p in (records[i]["instruction"], records[i]["input"]) if p.strip()))
               for i in held_out]
    got = answers(run, prompts, chat=True, max_new=args.max_new)
    share = sum(stopped for _, stopped in got) / len(got)
    print(f"alpaca sft-full: {share:.1%} of {len(got)} held-out answers stop at <|im_end|>; "
          f"final loss {train['final_loss']:.3f}", flush=True)
    return {"stop_share": share, "train": train, "example": got[0][0][-300:]}


NUMBER = re.compile(r"\d+")


def corrupt(answer: str, rng) -> str:
    """Every number replaced by a different one with as many digits."""
    def other(match: re.Match) -> str:
        digits = len(match.group())
        while (new := str(rng.randrange(10 ** (digits - 1) if digits > 1 else 0, 10 ** digits))) == match.group():
            pass
        return new
    return NUMBER.sub(other, answer)


def dpo(root: Path, base: Path, args, done: dict) -> dict:
    import random

    sft_run = root / "gsm8k-full"
    if not (sft_run / "checkpoints").is_dir():
        sys.exit("dpo starts from the GSM8K fine-tune: run --tasks gsm8k first")
    rng = random.Random(0)
    pairs = root / "gsm8k-pairs.jsonl"
    test = [json.loads(line) for line in (SHARED / "gsm8k" / "test.jsonl").read_text().splitlines()][args.questions:]
    pairs.write_text("".join(json.dumps({"prompt": t["question"], "chosen": t["answer"],
                                         "rejected": corrupt(t["answer"], rng)}) + "\n" for t in test))
    train = fine_tune("dpo", sft_run, pairs, root / "dpo", args.dpo_steps, args.dpo_lr, "dpo.val_fraction=0.1",
                      "train.eval_interval=50", "train.eval_batches=20")
    first, last = train["evals"][0], train["evals"][-1]
    print(f"dpo: held-out pairs ({len(test)} pairs, 10% held out) reward accuracy {first['val_accuracy']:.1%} → "
          f"{last['val_accuracy']:.1%}, margin {first['val_margin']:.3f} → {last['val_margin']:.3f}, "
          f"loss {first['val_loss']:.4f} → {last['val_loss']:.4f}", flush=True)
    return {"train": train}


def step_time(root: Path, base: Path, args, done: dict) -> dict:
    """Full fine-tuning and LoRA on the same model and batches, back to back: median ms/step over
    --timing-steps steps at a fixed 8 × 512 batch (no pad_to_longest, so both compute the same positions)."""
    result = {}
    lora = ("--lora", f"sft.lora.r={args.lora_r}", f"sft.lora.alpha={2 * args.lora_r}")
    for name, extra in (("full", ()), ("lora", lora)):
        times = timed_steps("sft", base, SHARED / "gsm8k" / "train.jsonl", root / f"timing-{name}",
                            [*extra, "sft.packing=false"], args.timing_steps)
        result[name] = {"ms_per_step": 1000 * median(times[1:]), "steps": len(times) - 1}
    ratio = result["lora"]["ms_per_step"] / result["full"]["ms_per_step"]
    full, adapters = result["full"], result["lora"]
    print(f"step time, 8 × 512 tokens, median of {full['steps']} steps: full {full['ms_per_step']:.0f} ms, "
          f"LoRA r={args.lora_r} {adapters['ms_per_step']:.0f} ms ({ratio:.2f}×); load {os.getloadavg()}", flush=True)
    return {**result, "lora_over_full": ratio, "load": os.getloadavg()}


def timed_steps(command: str, base: Path, data: Path, run: Path, settings, steps: int) -> list[float]:
    """`burnout COMMAND` from `base` on `data` into a fresh `run`, `steps` steps at 8 × 512 with no evaluation or
    checkpoint between them: each step's seconds from its metrics (the first one carries the start-up)."""
    if run.exists():
        shutil.rmtree(run)
    burnout(command, str(base), "--data", str(data), "--out", str(run), *settings, f"train.max_steps={steps}",
            "train.batch_size=8", "train.seq_len=512", "train.eval_interval=100000", "train.ckpt_interval=100000",
            "train.log_interval=1")
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [b["elapsed_s"] - a["elapsed_s"] for a, b in zip(records, records[1:]) if "val_loss" not in b]


def packing(root: Path, base: Path, args, done: dict) -> dict:
    """Alpaca fine-tuned padded (sft.pad_to_longest) and packed (sft.packing), back to back, --timing-steps steps
    each at 8 × 512: median ms/step, and from the runs' own train batches (the loaders they trained with) the
    assistant targets and the share of padding per batch: targets/s packed over padded."""
    from burnout.finetune.tokenized import PackedSFTBatches, SFTBatches

    result = {}
    layouts = {"padded": ("sft.packing=false", "sft.pad_to_longest=true"), "packed": ("sft.packing=true",)}
    for name, settings in layouts.items():
        run = root / f"packing-{name}"
        times = timed_steps("sft", base, SHARED / "sft" / "alpaca_5000.json", run, settings, args.timing_steps)
        loader = (PackedSFTBatches(run / "data", "train", 8, 512, 1337) if name == "packed" else
                  SFTBatches(run / "data", "train", 8, 512, 1337, pad_to_longest=True))
        batches = [loader.get_batch(i) for i in range(args.timing_steps)]
        targets = sum(int((b[1] != -1).sum()) for b in batches) / len(batches)
        real = sum(int((b[0] != loader.meta["pad_id"]).sum()) for b in batches)
        padding = 1 - real / sum(b[0].numel() for b in batches)
        ms = 1000 * median(times[1:])
        result[name] = {"ms_per_step": ms, "targets_per_batch": targets, "targets_per_s": targets / ms * 1000,
                        "padding": padding}
        print(f"{name}: {ms:.0f} ms/step, {targets:.0f} assistant targets per batch, {targets / ms * 1000:.0f} "
              f"targets/s, padding {padding:.1%}", flush=True)
    ratio = result["packed"]["targets_per_s"] / result["padded"]["targets_per_s"]
    print(f"packed / padded targets per second: {ratio:.2f}×; load {os.getloadavg()}", flush=True)
    return {**result, "packed_over_padded": ratio, "load": os.getloadavg()}


def dpo_packing(root: Path, base: Path, args, done: dict) -> dict:
    """DPO padded (dpo.pad_to_longest) and packed (dpo.packing) on Alpaca pairs, back to back, --timing-steps steps
    each at 8 pairs × 512 tokens a side (packed: 8 rows of 1,024): median ms/step, and from the runs' own train
    batches the pairs, answer targets and padding per batch: pairs/s packed over padded."""
    from burnout.finetune.tokenized import PackedPairBatches, PairBatches

    chat = root / "dpo-packing-chat"
    if not (chat / "checkpoints").is_dir():
        burnout("sft", str(base), "--data", str(SHARED / "sft" / "alpaca_5000.json"), "--out", str(chat),
                "train.max_steps=2", "train.batch_size=8", "train.seq_len=512", "train.eval_interval=100000")
    records = [r for r in json.loads((SHARED / "sft" / "alpaca_5000.json").read_text()) if r["output"].strip()]
    pairs = root / "alpaca-pairs.jsonl"
    pairs.write_text("".join(json.dumps({
        "prompt": "\n\n".join(p for p in (r["instruction"], r["input"]) if p.strip()), "chosen": r["output"],
        "rejected": records[(i + 1) % len(records)]["output"]}) + "\n" for i, r in enumerate(records)))
    result = {}
    layouts = {"padded": ("dpo.packing=false", "dpo.pad_to_longest=true"), "packed": ("dpo.packing=true",)}
    for name, settings in layouts.items():
        run = root / f"dpo-packing-{name}"
        times = timed_steps("dpo", chat, pairs, run, settings, args.timing_steps)
        loader = (PackedPairBatches(run / "data", "train", 8, 512, 1337) if name == "packed" else
                  PairBatches(run / "data", "train", 8, 512, 1337, pad_to_longest=True))
        batches = [loader.get_batch(i) for i in range(args.timing_steps)]
        pairs_per_batch = (sum(len(loader.rows[row]) for i in range(args.timing_steps) for row in loader.examples_of(i))
                           / args.timing_steps if name == "packed" else 8)
        targets = sum(int((b[1] != -1).sum()) for b in batches) / len(batches)
        real = sum(int((b[0] != loader.meta["pad_id"]).sum()) for b in batches)
        padding = 1 - real / sum(b[0].numel() for b in batches)
        ms = 1000 * median(times[1:])
        result[name] = {"ms_per_step": ms, "pairs_per_batch": pairs_per_batch,
                        "pairs_per_s": pairs_per_batch / ms * 1000, "targets_per_batch": targets,
                        "targets_per_s": targets / ms * 1000, "padding": padding}
        print(f"dpo {name}: {ms:.0f} ms/step, {pairs_per_batch:.1f} pairs and {targets:.0f} answer targets per batch, "
              f"{pairs_per_batch / ms * 1000:.1f} pairs/s, padding {padding:.1%}", flush=True)
    ratio = result["packed"]["pairs_per_s"] / result["padded"]["pairs_per_s"]
    print(f"dpo packed / padded pairs per second: {ratio:.2f}×; load {os.getloadavg()}", flush=True)
    return {**result, "packed_over_padded": ratio, "load": os.getloadavg()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=REPO / "runs" / "bench-sft")
    parser.add_argument("--tasks", nargs="+", default=["gsm8k", "alpaca", "dpo"],
                        choices=["gsm8k", "alpaca", "dpo", "step-time", "packing", "dpo-packing"])
    parser.add_argument("--timing-steps", type=int, default=30,
                        help="step-time, packing, dpo-packing: steps per variant")
    parser.add_argument("--lora", action="store_true", help="also LoRA on GSM8K")
    parser.add_argument("--base-steps", type=int, default=400)
    parser.add_argument("--sft-steps", type=int, default=800)
    parser.add_argument("--lr", type=float, default=2e-3, help="full fine-tuning's peak LR")
    parser.add_argument("--lora-lr", type=float, default=5e-3)
    parser.add_argument("--lora-r", type=int, default=16)
    parser.add_argument("--dpo-steps", type=int, default=200)
    parser.add_argument("--dpo-lr", type=float, default=1e-4)
    parser.add_argument("--questions", type=int, default=200)
    parser.add_argument("--max-new", type=int, default=320)
    args = parser.parse_args()
    print(f"load {os.getloadavg()}", flush=True)
    load_before = results.load()
    args.root.mkdir(parents=True, exist_ok=True)
    base = base_run(args.root, args.base_steps)
    tasks = {"gsm8k": gsm8k, "alpaca": alpaca, "dpo": dpo, "step-time": step_time, "packing": packing,
             "dpo-packing": dpo_packing}
    saved = args.root / "results.json"
    measured = json.loads(saved.read_text()) if saved.is_file() else {}
    for task in args.tasks:
        earlier = measured.get(task, {}) if task == "gsm8k" else {}
        measured[task] = tasks[task](args.root, base, args, earlier)
        saved.write_text(json.dumps(measured, indent=1))
        for claim, value in claimed(task, measured[task], earlier):
            results.record(claim, value, load_before=load_before)


def claimed(task: str, result: dict, earlier: dict) -> list[tuple[str, float]]:
    """The claims (benchmarks/claims.py) a task's result measured, as (claim, value); none from an earlier
    invocation's results.json."""
    if task == "gsm8k":
        names = {"base": "finetune.gsm8k_base", "sft-full": "finetune.gsm8k_full", "sft-lora": "finetune.gsm8k_lora"}
        return [(names[name], 100 * r["format_share"]) for name, r in result.items() if name not in earlier]
    if task == "alpaca":
        return [("finetune.alpaca_stops", 100 * result["stop_share"])]
    if task == "dpo":
        return [("finetune.dpo_accuracy", 100 * result["train"]["evals"][-1]["val_accuracy"])]
    ratios = {"step-time": ("finetune.lora_step_ratio", "lora_over_full"),
              "packing": ("finetune.packing_ratio", "packed_over_padded"),
              "dpo-packing": ("finetune.dpo_packing_ratio", "packed_over_padded")}
    claim, key = ratios[task]
    return [(claim, result[key])]


if __name__ == "__main__":
    main()
