"""Does `burnout rl` (GRPO) raise held-out pass@1 over the SFT model it starts from? The issue's evidence.

    python -m benchmarks.bench_rl [--task addition|gsm8k|gsm8k-cpu] [--root DIR] [--rl-steps N] [--questions 16]
                                  [--seed 0]

1. The task. addition (on a CPU, the default), generated with a fixed seed: two-digit addition worked digit by
   digit, "What is 23 plus 58?" → "3+8=11 carry 1, 2+5+1=8, so 81\\n#### 81" (each step a one-digit sum or a copy:
   what a small model learns in minutes), the pairs (a, b) split into four disjoint sets: pretraining text, SFT
   conversations, RL questions, held out. gsm8k (on a CUDA GPU: bf16, compiled): GSM8K's train split cut into
   SFT conversations and RL questions, all of it the pretraining text, and the first questions of its test split
   held out (--gsm8k DIR: the folder of train.jsonl and test.jsonl); gsm8k-cpu the same on a CPU-sized model.
2. A base model pretrained on the pretraining text (`burnout train`: a small llama with a character tokenizer for
   addition, a larger one with a BPE tokenizer trained on the text for gsm8k), then `burnout sft` on the SFT
   conversations: the chat model that knows the answer format.
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
from dataclasses import dataclass
from pathlib import Path

from benchmarks import results

REPO = Path(__file__).resolve().parent.parent
DEFAULT_GSM8K = REPO.parent / "shared" / "data" / "gsm8k"


@dataclass(frozen=True)
class Setting:
    """What each task runs: its pretraining source's name (part of the data's seed: renaming it changes the base
    model), model, tokenizer, device and the budget of each stage."""
    source: str
    model: dict
    tokenizer: dict
    device: str
    precision: list[str]  # train.* for the device: precision, compile
    base: dict  # train.* of the pretraining
    sft: dict
    rl_steps: int
    max_new_tokens: int
    lr: float  # RL's


SETTINGS = {
    "addition": Setting(
        source="sums",
        model={"family": "llama", "n_layer": 4, "d_model": 128, "n_head": 4, "n_kv_head": 2, "context_length": 128,
               "ffn_multiple_of": 32, "vocab_size": 128},
        tokenizer={"kind": "char", "vocab_size": 128},
        device="cpu", precision=["train.precision=fp32"],
        base={"batch_size": 32, "seq_len": 64, "max_steps": 600, "lr": 3e-3, "min_lr": 3e-4, "warmup_steps": 50},
        sft={"batch_size": 16, "seq_len": 128, "max_steps": 100, "lr": 1e-3, "min_lr": 1e-4, "warmup_steps": 20},
        rl_steps=150, max_new_tokens=48, lr=4e-4),
    "gsm8k": Setting(
        source="gsm8k",
        model={"family": "llama", "n_layer": 8, "d_model": 512, "n_head": 8, "n_kv_head": 4, "context_length": 512,
               "vocab_size": 4096},
        tokenizer={"kind": "bpe", "vocab_size": 4096},
        device="cuda", precision=["train.precision=bf16", "train.compile=true"],
        base={"batch_size": 32, "seq_len": 512, "max_steps": 1200, "lr": 1e-3, "min_lr": 1e-4, "warmup_steps": 100},
        sft={"batch_size": 32, "seq_len": 512, "max_steps": 300, "lr": 3e-4, "min_lr": 3e-5, "warmup_steps": 20},
        rl_steps=30, max_new_tokens=256, lr=1e-5),
    "gsm8k-cpu": Setting(  # what a CPU-sized model reaches on GSM8K in minutes
        source="gsm8k",
        model={"family": "llama", "n_layer": 4, "d_model": 256, "n_head": 4, "n_kv_head": 2, "context_length": 512,
               "vocab_size": 2048},
        tokenizer={"kind": "bpe", "vocab_size": 2048},
        device="cpu", precision=[],
        base={"batch_size": 16, "seq_len": 256, "max_steps": 600, "lr": 2e-3, "min_lr": 2e-4, "warmup_steps": 50},
        sft={"batch_size": 8, "seq_len": 512, "max_steps": 200, "lr": 5e-4, "min_lr": 5e-5, "warmup_steps": 20},
        rl_steps=10, max_new_tokens=192, lr=1e-5),
}


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


def gsm8k_tasks(folder: Path, held_out: int) -> dict[str, list[dict]]:
    """GSM8K's train split: pretraining text (all of it), SFT conversations (the first 6,000), RL questions (the
    rest); the first `held_out` questions of its test split held out."""
    def read(name: str) -> list[dict]:
        return [json.loads(line) for line in (folder / name).read_text().splitlines() if line.strip()]

    train = read("train.jsonl")
    return {"pretrain": train, "sft": train[:6000], "rl": train[6000:], "held_out": read("test.jsonl")[:held_out]}


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
    seconds = time.perf_counter() - t0
    print(f"{run.name}: {seconds:.0f} s", flush=True)  # as it comes: a session's timeout keeps what finished
    return seconds


def train_all(root: Path, paths: dict[str, Path], setting: Setting, args) -> dict[str, float]:
    common = [f"train.device={setting.device}", *setting.precision, "train.log_interval=10",
              "train.ckpt_interval=100000"]
    config = root / "base.yaml"
    config.write_text(json.dumps({
        "model": setting.model, "tokenizer": setting.tokenizer,
        "data": {"sources": [{"name": setting.source, "kind": "text", "path": str(root / "pretrain.txt"),
                              "split_by": "paragraph"}]},
        "train": {**setting.base, "max_steps": args.base_steps or setting.base["max_steps"], "eval_interval": 500,
                  "seed": args.seed}}))
    seconds = {"base": timed(root / "base", "train", str(config), "--out", str(root / "base"), *common)}
    sft = {**setting.sft, "max_steps": args.sft_steps or setting.sft["max_steps"]}
    seconds["sft"] = timed(root / "sft", "sft", str(root / "base"), "--data", str(paths["sft"]), "--out",
                           str(root / "sft"), *common, *(f"train.{key}={value}" for key, value in sft.items()),
                           "train.eval_interval=100", "sft.val_fraction=0.05", f"train.seed={args.seed}")
    lr = args.rl_lr or setting.lr
    seconds["rl"] = timed(root / "rl", "rl", str(root / "sft"), "--data", str(paths["rl"]), "--out",
                          str(root / "rl"), *common, "--reward", "gsm8k", f"rl.group_size={args.group}",
                          f"rl.max_new_tokens={setting.max_new_tokens}", f"rl.temperature={args.temperature}",
                          "rl.val_fraction=0.05", f"train.max_steps={args.rl_steps or setting.rl_steps}",
                          f"train.batch_size={args.questions}", f"train.lr={lr}", f"train.min_lr={lr / 10}",
                          "train.warmup_steps=5", "train.eval_interval=20", "train.eval_batches=2",
                          "train.log_interval=1", f"train.seed={args.seed}")
    return seconds


def held_out_rates(run: Path, held_out: Path, setting: Setting, args) -> dict[str, float]:
    """pass@1 and pass@k sampled as the RL run samples (same seeds for every model), and greedy accuracy."""
    from burnout.config import RLConfig
    from burnout.core.model_files import load_model
    from burnout.finetune.rl import gsm8k_reward, pass_rates, read_tasks

    model, tokenizer, _ = load_model(run, setting.device)
    tasks = read_tasks(held_out)
    sampled = RLConfig(group_size=args.group, max_new_tokens=setting.max_new_tokens, temperature=args.temperature)
    rates = pass_rates(model, tokenizer, tasks, gsm8k_reward, sampled, args.seed, 50)
    greedy = RLConfig(group_size=1, max_new_tokens=setting.max_new_tokens, temperature=0.0)
    rates["greedy"] = pass_rates(model, tokenizer, tasks, gsm8k_reward, greedy, args.seed, 50)["pass@1"]
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", choices=list(SETTINGS), default="addition")
    parser.add_argument("--gsm8k", type=Path, default=DEFAULT_GSM8K, help="GSM8K's train.jsonl and test.jsonl")
    parser.add_argument("--held-out", type=int, default=200, help="held-out questions (gsm8k)")
    parser.add_argument("--root", type=Path, help="default: runs/bench-rl (addition), runs/bench-rl-gsm8k")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--base-steps", type=int, help="default: the task's (SETTINGS)")
    parser.add_argument("--sft-steps", type=int)
    parser.add_argument("--rl-steps", type=int)
    parser.add_argument("--questions", type=int, default=16, help="RL questions per step")
    parser.add_argument("--group", type=int, default=8, help="rl.group_size")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--rl-lr", type=float)
    args = parser.parse_args()
    setting = SETTINGS[args.task]
    args.root = args.root or REPO / "runs" / ("bench-rl" if args.task == "addition" else f"bench-rl-{args.task}")
    tasks = addition_tasks(args.seed) if args.task == "addition" else gsm8k_tasks(args.gsm8k, args.held_out)
    paths = write_data(args.root, tasks)
    load_before = results.load()
    seconds = train_all(args.root, paths, setting, args)
    result = {"settings": {key: str(v) if isinstance(v, Path) else v for key, v in vars(args).items()},
              "seconds": seconds}
    for name in ("sft", "rl"):
        result[name] = held_out_rates(args.root / name, paths["held_out"], setting, args)
        print(f"{name}: held-out pass@1 {result[name]['pass@1']:.1%}, pass@{args.group} {result[name]['pass@k']:.1%}, "
              f"greedy {result[name]['greedy']:.1%}", flush=True)
    records = [json.loads(line) for line in (args.root / "rl" / "metrics.jsonl").read_text().splitlines()]
    result["rl_curve"] = [{key: r.get(key) for key in ("step", "reward", "signal", "answer_length", "val_pass@1")}
                          for r in records]
    gain = result["rl"]["pass@1"] - result["sft"]["pass@1"]
    print(f"RL gain: {100 * gain:+.1f} points of held-out pass@1 in {args.rl_steps or setting.rl_steps} steps "
          f"({args.questions} questions × {args.group} answers a step); stages took "
          + ", ".join(f"{k} {v:.0f} s" for k, v in seconds.items()), flush=True)
    (args.root / "results.json").write_text(json.dumps(result | {"gain_points": 100 * gain}, indent=2))
    defaults = {"seed": 0, "base_steps": None, "sft_steps": None, "rl_steps": None, "questions": 16, "group": 8,
                "temperature": 1.0, "rl_lr": None}
    if args.task == "addition" and all(getattr(args, key) == value for key, value in defaults.items()):
        for claim, name in (("finetune.rl_pass1_before", "sft"), ("finetune.rl_pass1_after", "rl")):
            results.record(claim, 100 * result[name]["pass@1"], load_before=load_before)


if __name__ == "__main__":
    main()
