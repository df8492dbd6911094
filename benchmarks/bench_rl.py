"""Does `burnout rl` (GRPO) raise held-out pass@1 over the SFT model it starts from? The issue's evidence, on a CPU.

    python -m benchmarks.bench_rl [--root runs/bench-rl] [--rl-steps 150] [--questions 16] [--seed 0]

1. The task, generated with a fixed seed: two-digit addition worked digit by digit, "What is 23 plus 58?" →
   "3+8=11 carry 1, 2+5+1=8, so 81\\n#### 81" (each step a one-digit sum or a copy: what a small model learns in
   minutes), the pairs (a, b) split into four disjoint sets: pretraining text, SFT conversations, RL questions,
   held out.
2. A base model: a small llama with a character tokenizer pretrained on the pretraining set's lines
   (`burnout train`), then `burnout sft` on the SFT conversations: the chat model that knows the answer format.
3. `burnout rl` from the SFT model on the RL questions (gsm8k reward: the final `#### n` matches).
4. Held-out pass@1 and pass@k (k = rl.group_size answers per question at rl.temperature, seeded alike for both
   models: rl.pass_rates) and greedy accuracy, for the SFT model and the RL model, with the wall time of each stage
   and the reward curve from the RL run's metrics.jsonl. Everything lands in ROOT/results.json.

Each stage reuses ROOT's run when it already has checkpoints: delete a folder to measure it again.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MODEL = {"family": "llama", "n_layer": 4, "d_model": 128, "n_head": 4, "n_kv_head": 2, "context_length": 128,
         "ffn_multiple_of": 32, "vocab_size": 128}


def burnout(*args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "burnout", *args], cwd=REPO, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"burnout {' '.join(args)} failed:\n{done.stderr[-2000:]}")
    return done.stdout + done.stderr


def addition_tasks(seed: int) -> dict[str, list[dict]]:
    """Every (a, b) of two-digit numbers in a seeded order, cut into the four sets."""
    pairs = [(a, b) for a in range(10, 100) for b in range(10, 100)]
    random.Random(seed).shuffle(pairs)
    tasks = [{"question": f"What is {a} plus {b}?", "answer": worked_sum(a, b)} for a, b in pairs]
    return {"pretrain": tasks[:4000], "sft": tasks[4000:5000], "rl": tasks[5000:7000], "held_out": tasks[7000:7200]}


def worked_sum(a: int, b: int) -> str:
    units = a % 10 + b % 10
    carry = units // 10
    return (f"{a % 10}+{b % 10}={units} carry {carry}, {a // 10}+{b // 10}+{carry}={a // 10 + b // 10 + carry}, "
            f"so {a + b}\n#### {a + b}")


def write_data(root: Path, tasks: dict[str, list[dict]]) -> dict[str, Path]:
    root.mkdir(parents=True, exist_ok=True)
    paths = {name: root / f"{name}.jsonl" for name in ("sft", "rl", "held_out")}
    # The role names' letters too: a character tokenizer must be able to spell the chat template.
    text = "user assistant system\n\n" + "\n\n".join(f"{t['question']}\n{t['answer']}" for t in tasks["pretrain"])
    (root / "pretrain.txt").write_text(text + "\n")
    paths["sft"].write_text("".join(json.dumps({"messages": [
        {"role": "user", "content": t["question"]}, {"role": "assistant", "content": t["answer"]}]}) + "\n"
        for t in tasks["sft"]))
    for name in ("rl", "held_out"):
        paths[name].write_text("".join(json.dumps(t) + "\n" for t in tasks[name]))
    return paths


def timed(run: Path, *args: str) -> float:
    """Seconds `burnout ARGS` took (0 when RUN already has checkpoints: reused)."""
    if (run / "checkpoints").is_dir():
        return 0.0
    t0 = time.perf_counter()
    (run.parent / f"{run.name}.log").write_text(burnout(*args))
    return time.perf_counter() - t0


def train_all(root: Path, paths: dict[str, Path], args) -> dict[str, float]:
    common = ["train.device=cpu", "train.precision=fp32", "train.log_interval=10", "train.ckpt_interval=100000"]
    config = root / "base.yaml"
    config.write_text(json.dumps({
        "model": MODEL, "tokenizer": {"kind": "char", "vocab_size": 128},
        "data": {"sources": [{"name": "sums", "kind": "text", "path": str(root / "pretrain.txt"),
                              "split_by": "paragraph"}]},
        "train": {"batch_size": 32, "seq_len": 64, "max_steps": args.base_steps, "lr": 3e-3, "min_lr": 3e-4,
                  "warmup_steps": 50, "eval_interval": 500, "seed": args.seed}}))
    seconds = {"base": timed(root / "base", "train", str(config), "--out", str(root / "base"), *common)}
    seconds["sft"] = timed(root / "sft", "sft", str(root / "base"), "--data", str(paths["sft"]), "--out",
                           str(root / "sft"), *common, f"train.max_steps={args.sft_steps}", "train.batch_size=16",
                           "train.seq_len=128", "train.lr=1e-3", "train.min_lr=1e-4", "train.warmup_steps=20",
                           "train.eval_interval=100", "sft.val_fraction=0.05", f"train.seed={args.seed}")
    seconds["rl"] = timed(root / "rl", "rl", str(root / "sft"), "--data", str(paths["rl"]), "--out",
                          str(root / "rl"), *common, "--reward", "gsm8k", f"rl.group_size={args.group}",
                          "rl.max_new_tokens=48", f"rl.temperature={args.temperature}", "rl.val_fraction=0.05",
                          f"train.max_steps={args.rl_steps}", f"train.batch_size={args.questions}",
                          f"train.lr={args.rl_lr}", f"train.min_lr={args.rl_lr / 10}", "train.warmup_steps=5",
                          "train.eval_interval=20", "train.eval_batches=2", "train.log_interval=1",
                          f"train.seed={args.seed}")
    return seconds


def held_out_rates(run: Path, held_out: Path, args) -> dict[str, float]:
    """pass@1 and pass@k sampled as the RL run samples (same seeds for every model), and greedy accuracy."""
    from burnout.config import RLConfig
    from burnout.core.model_files import load_model
    from burnout.finetune.rl import gsm8k_reward, pass_rates, read_tasks

    model, tokenizer, _ = load_model(run)
    model.eval()
    tasks = read_tasks(held_out)
    sampled = RLConfig(group_size=args.group, max_new_tokens=48, temperature=args.temperature)
    rates = pass_rates(model, tokenizer, tasks, gsm8k_reward, sampled, args.seed, 50)
    greedy = RLConfig(group_size=1, max_new_tokens=48, temperature=0.0)
    rates["greedy"] = pass_rates(model, tokenizer, tasks, gsm8k_reward, greedy, args.seed, 50)["pass@1"]
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, default=REPO / "runs" / "bench-rl")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--base-steps", type=int, default=600)
    parser.add_argument("--sft-steps", type=int, default=100)
    parser.add_argument("--rl-steps", type=int, default=150)
    parser.add_argument("--questions", type=int, default=16, help="RL questions per step")
    parser.add_argument("--group", type=int, default=8, help="rl.group_size")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--rl-lr", type=float, default=4e-4)
    args = parser.parse_args()
    paths = write_data(args.root, addition_tasks(args.seed))
    seconds = train_all(args.root, paths, args)
    result = {"settings": vars(args) | {"root": str(args.root)}, "seconds": seconds}
    for name in ("sft", "rl"):
        result[name] = held_out_rates(args.root / name, paths["held_out"], args)
        print(f"{name}: held-out pass@1 {result[name]['pass@1']:.1%}, pass@{args.group} {result[name]['pass@k']:.1%}, "
              f"greedy {result[name]['greedy']:.1%}", flush=True)
    records = [json.loads(line) for line in (args.root / "rl" / "metrics.jsonl").read_text().splitlines()]
    result["rl_curve"] = [{key: r.get(key) for key in ("step", "reward", "signal", "answer_length", "val_pass@1")}
                          for r in records]
    gain = result["rl"]["pass@1"] - result["sft"]["pass@1"]
    print(f"RL gain: {100 * gain:+.1f} points of held-out pass@1 in {args.rl_steps} steps "
          f"({args.questions} questions × {args.group} answers a step); stages took "
          + ", ".join(f"{k} {v:.0f} s" for k, v in seconds.items()), flush=True)
    (args.root / "results.json").write_text(json.dumps(result | {"gain_points": 100 * gain}, indent=2))


if __name__ == "__main__":
    main()
