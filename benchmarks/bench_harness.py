"""lm-eval tasks through burnout's engine (BurnoutLM, `burnout eval --harness`) against lm-eval's own HF backend.

    .venv/bin/python -m benchmarks.bench_harness [--arc-items 100] [--gsm8k-items 8] [--fewshot 8]
                                                    [--max-gen-toks 256] [--window 1024] [--family gpt2]
                                                    [--batch-size 16] [--repeats 3] [--threads N]
                                                    [--data-root ../shared/data]

Builds a GPT-2-tokenized model of a CPU-sized shape (--family gpt2: 6 layers x 384, 50,257-token vocabulary,
--window tokens of context; llama: the same with RoPE, SwiGLU and 6/2 GQA) with random weights, exports it
with save_hf, and runs two lm-eval tasks over local files (custom task YAMLs, no network) both ways, on the
CPU in fp32 with the same batch size, in one process:

    arc_easy  multiple_choice (loglikelihood requests), ARC-Easy test, 0-shot
    gsm8k     generate_until, lm-eval's gsm8k template over shared/data/gsm8k (--fewshot from train.jsonl),
              greedy up to --max-gen-toks new tokens (random weights never say "Question:"). The defaults
              are issue 18's workload: 8-shot, lm-eval's 256 new tokens, GPT-2's 1,024-token window. An
              8-shot prompt is longer than 1,024 - 256 tokens, so every prompt is cut to 768 and all decode
              in one batch (a longer --window leaves prompts of many lengths: both sides decode them in
              left-padded batches); `--fewshot 5 --max-gen-toks 32 --window 512`: short answers, where the
              prompt's prefill weighs most

    lm-eval   simple_evaluate with its "hf" model (HFLM on the exported folder)
    burnout   simple_evaluate with BurnoutLM on our model object

Timed: the model's calls alone (loglikelihood / generate_until, wrapped), not task building, which is
lm-eval's on both sides. Each side runs once untimed (a warm-up whose results are compared: metrics and
every response must be the same), then --repeats timed runs alternating which side goes first; items/s
are from the medians. For generation, the ratio's ceiling too: lm-eval's time over our prefill alone (the
same prompts, cut as in the timed runs, generated to one new token): the ratio if our decoding took no time.
Printed too: the load average before and after each task, and the CPU model.
Exit status 1 if the results differ.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import statistics
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from unittest import mock

# No network; and no progress bars from lm-eval, datasets or transformers between the figures.
for _var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE", "TQDM_DISABLE"):
    os.environ.setdefault(_var, "1")

import torch  # noqa: E402

from benchmarks import results  # noqa: E402
from burnout.config import ModelConfig  # noqa: E402
from burnout.core.device import cpu_model  # noqa: E402
from burnout.data.tokenizer import gpt2_tokenizer  # noqa: E402
from burnout.errors import BurnoutError  # noqa: E402
from burnout.eval.harness import BurnoutLM, require_lm_eval  # noqa: E402
from burnout.models import Transformer  # noqa: E402
from burnout.models.hf import save_hf  # noqa: E402

SHAPES = {
    "gpt2": dict(family="gpt2", n_layer=6, d_model=384, n_head=6),
    "llama": dict(family="llama", n_layer=6, d_model=384, n_head=6, n_kv_head=2),
}
LM_CALLS = ("loglikelihood", "loglikelihood_rolling", "generate_until")




def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "?"


def write_yamls(folder: Path, data: Path, fewshot: int, max_gen_toks: int) -> Path:
    files = {
        "arc_easy.yaml": f"""
            task: bench_arc_easy
            dataset_path: json
            dataset_kwargs:
              data_files:
                test: {data / "arc" / "arc_easy_test.jsonl"}
            output_type: multiple_choice
            test_split: test
            doc_to_text: "{{{{query}}}}\\nAnswer:"
            doc_to_target: gold
            doc_to_choice: choices
            metric_list:
              - metric: acc
              - metric: acc_norm
            """,
        "gsm8k.yaml": f"""
            task: bench_gsm8k
            dataset_path: json
            dataset_kwargs:
              data_files:
                train: {data / "gsm8k" / "train.jsonl"}
                test: {data / "gsm8k" / "test.jsonl"}
            output_type: generate_until
            training_split: train
            fewshot_split: train
            test_split: test
            doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
            doc_to_target: "{{{{answer}}}}"
            metric_list:
              - metric: exact_match
                aggregation: mean
                higher_is_better: true
                ignore_case: true
                ignore_punctuation: false
                regexes_to_ignore: [",", "\\\\$", "(?s).*#### ", "\\\\.$"]
            generation_kwargs:
              until: ["Question:", "</s>", "<|im_end|>"]
              do_sample: false
              temperature: 0.0
              max_gen_toks: {max_gen_toks}
            num_fewshot: {fewshot}
            filter_list:
              - name: "strict-match"
                filter:
                  - function: "regex"
                    regex_pattern: "#### (\\\\-?[0-9\\\\.\\\\,]+)"
                  - function: "take_first"
            """,
    }
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(textwrap.dedent(text).lstrip(), encoding="utf-8")
    return folder


class Timed:
    """Wraps an lm-eval model's request methods, adding up the seconds spent in them (and keeping the
    generate_until requests, which the prefill's timing replays)."""

    def __init__(self, lm):
        self.lm, self.seconds, self.generation_requests = lm, 0.0, []
        for name in LM_CALLS:
            setattr(self, name, self._wrap(getattr(lm, name)))

    def _wrap(self, fn):
        def timed(*args, **kwargs):
            if fn.__name__ == "generate_until":
                self.generation_requests += args[0]
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start
        return timed

    def install(self):
        for name in LM_CALLS:
            setattr(self.lm, name, getattr(self, name))
        return self


def run(lm, task: str, n: int, config_dir: Path, manager_cls, simple_evaluate) -> tuple[float, dict, list]:
    """(seconds in the model's calls, lm-eval's results, the generate_until requests it made)."""
    timer = Timed(lm).install()
    scores = simple_evaluate(model=lm, tasks=[task], limit=n, task_manager=manager_cls(
        include_path=str(config_dir), include_defaults=False))
    for name in LM_CALLS:  # back to the class's methods
        lm.__dict__.pop(name, None)
    return timer.seconds, scores, timer.generation_requests


def prefill_seconds(lm: BurnoutLM, requests: list, repeats: int) -> float:
    """Median time of `requests` generated to one new token: the prompts' prefill. The window seen by lm shrinks
    by the tokens not generated, so each prompt is cut to the length it had in the timed runs."""
    one_token = [dataclasses.replace(r, arguments=(r.args[0], {**r.args[1], "max_gen_toks": 1})) for r in requests]
    window = lm.max_length - lm.generation_settings(requests[0].args[1])[1] + 1
    times = []
    with mock.patch.object(BurnoutLM, "max_length", property(lambda self: window)):
        for _ in range(repeats):
            start = time.perf_counter()
            lm.generate_until(one_token, disable_tqdm=True)
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def compare(ours: dict, theirs: dict, task: str) -> tuple[bool, float]:
    """(same metrics and responses, largest |Δ log-likelihood|)."""
    mine = sorted(ours["samples"][task], key=lambda s: s["doc_id"])
    their = sorted(theirs["samples"][task], key=lambda s: s["doc_id"])
    delta, same = 0.0, len(mine) == len(their)
    for m, t in zip(mine, their):
        for a, b in zip(m["resps"], t["resps"]):
            if isinstance(b[0], str):
                same &= a[0] == b[0]
            else:
                delta = max(delta, abs(a[0][0] - b[0][0]) if isinstance(b[0], (list, tuple)) else abs(a[0] - b[0]))
    metrics = {k: v for k, v in theirs["results"][task].items() if "stderr" not in k and isinstance(v, (int, float))}
    for key, value in metrics.items():
        same &= abs(ours["results"][task][key] - value) <= 1e-9 * max(1.0, abs(value))
    return same and delta <= 1e-4, delta


def bench_task(task: str, n: int, ours_lm, their_lm, config_dir: Path, repeats: int, claim: str | None) -> bool:
    """Both sides on `task`, printed; the speed-up recorded as `claim` (benchmarks/claims.py) when the results are
    identical. True when they are."""
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    before, load_first = load(), results.load()
    _, ours, generations = run(ours_lm, task, n, config_dir, TaskManager, simple_evaluate)  # warm-ups, compared
    _, theirs, _ = run(their_lm, task, n, config_dir, TaskManager, simple_evaluate)
    same, delta = compare(ours, theirs, task)
    ours_s, theirs_s = [], []
    for r in range(repeats):
        order = [(ours_lm, ours_s), (their_lm, theirs_s)]
        for lm, out in (order if r % 2 == 0 else order[::-1]):
            out.append(run(lm, task, n, config_dir, TaskManager, simple_evaluate)[0])
    after = load()
    o, t = statistics.median(ours_s), statistics.median(theirs_s)
    metrics = ", ".join(f"{k} {v:.4f}" for k, v in theirs["results"][task].items()
                        if isinstance(v, float) and "stderr" not in k)
    print(f"{task}: {n} items ({metrics})")
    def runs(values):
        return " ".join(f"{v:.2f}" for v in values)

    print(f"  burnout (BurnoutLM)  {n / o:8.2f} items/s   median {o:7.2f} s  (runs {runs(ours_s)})")
    print(f"  lm-eval (hf)         {n / t:8.2f} items/s   median {t:7.2f} s  (runs {runs(theirs_s)})")
    print(f"  ratio burnout / hf   {t / o:8.2f}x   per run {runs(b / a for a, b in zip(ours_s, theirs_s))}")
    if generations:
        prefill = prefill_seconds(ours_lm, generations, repeats)
        print(f"  ceiling              {t / prefill:8.2f}x   lm-eval's time over our prefill alone ({prefill:.2f} s: "
              "the same prompts to one new token), the ratio if our decoding took no time")
    print(f"  results {'IDENTICAL' if same else 'DIFFER'} (metrics and responses; max |Δ loglik| {delta:.1e})")
    print(f"  load average (1/5/15 min): {before} before, {after} after")
    if same and claim:
        results.record(claim, t / o, load_before=load_first, note=f"median of {repeats}: {o:.2f} s against {t:.2f} s")
    return same


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arc-items", type=int, default=100, help="ARC-Easy test items; 0 skips (default 100)")
    parser.add_argument("--gsm8k-items", type=int, default=8, help="GSM8K test items; 0 skips (default 8)")
    parser.add_argument("--fewshot", type=int, default=8, help="GSM8K few-shot examples (default 8, issue 18's)")
    parser.add_argument("--max-gen-toks", type=int, default=256,
                        help="GSM8K new tokens at most (default 256, lm-eval's)")
    parser.add_argument("--family", choices=sorted(SHAPES), default="gpt2")
    parser.add_argument("--window", type=int, default=1024, help="the model's context length (default 1024)")
    parser.add_argument("--batch-size", type=int, default=16, help="requests per forward, both sides (default 16)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, help="torch threads for both sides (default: torch's)")
    parser.add_argument("--data-root", default=None, help="folder holding arc/, gsm8k/ and gpt2_tokenizer/ "
                                                          "(default: ../shared/data)")
    args = parser.parse_args()
    try:
        for flag, value, least in (("--arc-items", args.arc_items, 0), ("--gsm8k-items", args.gsm8k_items, 0),
                                   ("--fewshot", args.fewshot, 0), ("--max-gen-toks", args.max_gen_toks, 1),
                                   ("--batch-size", args.batch_size, 1), ("--repeats", args.repeats, 1),
                                   ("--window", args.window, args.max_gen_toks + 1)):
            if value < least:
                raise BurnoutError(f"{flag} must be at least {least}, not {value}")
        data = Path(args.data_root) if args.data_root else Path(__file__).resolve().parent.parent.parent / "shared/data"
        for rel in ("arc/arc_easy_test.jsonl", "gsm8k/train.jsonl", "gsm8k/test.jsonl", "gpt2_tokenizer/vocab.json"):
            if not (data / rel).is_file():
                raise BurnoutError(f"'{data / rel}' does not exist; pass --data-root DIR, the folder holding {rel}")
        lm_eval = require_lm_eval()
        import transformers
        from lm_eval.models.huggingface import HFLM

        logging.getLogger("lm_eval").setLevel(logging.ERROR)
        if args.threads is not None:
            torch.set_num_threads(args.threads)
        tokenizer = gpt2_tokenizer(data / "gpt2_tokenizer" / "vocab.json", data / "gpt2_tokenizer" / "merges.txt")
        torch.manual_seed(0)
        cfg = ModelConfig(vocab_size=tokenizer.get_vocab_size(), context_length=args.window, dropout=0.0,
                          **SHAPES[args.family])
        model = Transformer(cfg).eval()
        same = True
        with tempfile.TemporaryDirectory() as tmp:
            tmp = Path(tmp)
            tokenizer.save(str(tmp / "tokenizer.json"))
            hf_dir = save_hf(model, tmp / "hf", tokenizer_path=tmp / "tokenizer.json")
            their_lm = HFLM(pretrained=str(hf_dir), dtype="float32", add_bos_token=False, batch_size=args.batch_size,
                            device="cpu")
            ours_lm = BurnoutLM(model, tokenizer, batch_size=args.batch_size)
            config_dir = write_yamls(tmp / "tasks", data, args.fewshot, args.max_gen_toks)
            print(f"{args.family} {cfg.n_layer}x{cfg.d_model} ({sum(p.numel() for p in model.parameters()) / 1e6:.1f}M "
                  f"params, vocab {cfg.vocab_size:,}, window {cfg.context_length}), random weights, CPU fp32, "
                  f"{torch.get_num_threads()} torch threads, batch size {args.batch_size}")
            print(f"CPU: {cpu_model()} ({os.cpu_count()} cores); torch {torch.__version__}, transformers "
                  f"{transformers.__version__}, lm-eval {lm_eval.__version__}")
            print(f"model-call time only (lm-eval builds the requests on both sides), median of {args.repeats} "
                  "runs after one warm-up each, the sides alternating")
            # The claims are of the defaults: ARC-Easy's 100 items, and GSM8K 8-shot as lm-eval runs it.
            claims = {"bench_arc_easy": "data.harness_arc_ratio" if args.arc_items == 100 else None,
                      "bench_gsm8k": "data.harness_gsm8k_ratio" if (args.fewshot, args.max_gen_toks, args.window)
                      == (8, 256, 1024) else None}
            if args.family != "gpt2":
                claims = {}
            for task, n in (("bench_arc_easy", args.arc_items), ("bench_gsm8k", args.gsm8k_items)):
                if n:
                    same &= bench_task(task, n, ours_lm, their_lm, config_dir, args.repeats, claims.get(task))
    except BurnoutError as exc:
        print(f"bench_harness: error: {exc}", file=sys.stderr)
        return 2
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
