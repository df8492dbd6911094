"""Zero-shot scoring speed: burnout.eval against lm-evaluation-harness on the same weights, same requests;
and the in-context-learning engine's throughput per task type.

    .venv/bin/python -m benchmarks.bench_eval [--items 200] [--arc-items 200] [--icl-items 40] [--family gpt2]
                                              [--batch-size 16] [--repeats 3] [--chunk 25] [--threads N]
                                              [--data-root ../shared/data]

Builds a GPT-2-tokenized model of realistic shape for a CPU (--family gpt2: 6 layers × 384, 30M parameters,
50,257-token vocabulary, 512-token window; --family llama: the same with RoPE, SwiGLU and 6/2 GQA) with
random weights, exports it with save_hf, and scores the first --items HellaSwag validation items (and
--arc-items ARC-Easy test items; 0 skips) with both, on the CPU in fp32 with the same batch size:

    lm-eval   simple_evaluate with its "hf" model (HFLM) on task configs over the same local files
              (burnout.eval.lm_eval_reference, as tests/eval/test_lm_eval_equality.py runs it)
    burnout   burnout.eval.scoring.score_examples on our model object

Timed (scoring only): lm-eval's HFLM.loglikelihood on the requests its task built (tokenizing, sorting,
batched forwards, log-softmax), and our score_examples on the same items (tokenizing, forwards, and the
per-example metrics). Neither includes loading the model, reading the data or building the requests.
Each side first runs once untimed (lm-eval's full simple_evaluate, which gives its scores; our
score_examples, which gives ours), then --repeats timed runs. A run goes through the items in turns of
--chunk items, alternating which side goes first, so that both see the same machine load; the speed-up is
the ratio of the medians. Printed too: both acc and acc_norm and the largest per-choice |Δ log-likelihood|.
Exit status 1 if the scores differ (acc, acc_norm, or a log-likelihood by more than 1e-4). The load
average is printed with each task: timings are noisy on a shared machine.

ICL throughput (--icl-items N per task; 0 skips): the first N items of DCLM's tasks in shared/data/icl
(icl/dclm_mmlu_and_lowvar.yaml's settings, its few-shot counts) scored by burnout.eval.scoring.score_items on
the same model: arc_challenge (multiple_choice, 10-shot), copa (multiple_choice, 0-shot), winogrande (schema,
0-shot, also 10-shot), bigbench_operators (language_modeling, 10-shot) and lambada_openai (language_modeling,
0-shot). Timed: scoring only (prompts are built before), the median of --repeats runs after a warm-up;
items/s per task and per type, and for the schema task the same items with each option in a row of its own
(no sharing of the options' common prefix) for comparison. --items 0 --arc-items 0 runs only this part.
"""

from __future__ import annotations

import argparse
import functools
import logging
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

# No network; and no progress bars from lm-eval, datasets or transformers between the figures.
for _var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE", "TQDM_DISABLE"):
    os.environ.setdefault(_var, "1")

import torch  # noqa: E402

from benchmarks import results  # noqa: E402
from burnout.config import ModelConfig  # noqa: E402
from burnout.core.device import cpu_model  # noqa: E402
from burnout.data.tokenizer import gpt2_tokenizer  # noqa: E402
from burnout.errors import BurnoutError  # noqa: E402
from burnout.eval.icl import load_suite  # noqa: E402
from burnout.eval.lm_eval_reference import hf_model, run_lm_eval, write_task_configs  # noqa: E402
from burnout.eval.scoring import score_examples, score_items, score_requests  # noqa: E402
from burnout.eval.tasks import (  # noqa: E402
    DEFAULT_FILES,
    build_items,
    default_data_root,
    load_task,
    needs_prefix_space,
    read_records,
    task_file,
)
from burnout.models import Transformer  # noqa: E402
from burnout.models.hf import save_hf  # noqa: E402

SHAPES = {
    "gpt2": dict(family="gpt2", n_layer=6, d_model=384, n_head=6),
    "llama": dict(family="llama", n_layer=6, d_model=384, n_head=6, n_kv_head=2),
}
TOLERANCE = 1e-4  # per-choice log-likelihood, as in tests/eval/test_lm_eval_equality.py
# (DCLM label, shots) timed by the ICL part: every task type, zero- and few-shot.
ICL_BENCH = [("arc_challenge", 10), ("copa", 0), ("winogrande", 0), ("winogrande", 10), ("bigbench_operators", 10),
             ("lambada_openai", 0)]


# The claims (benchmarks/claims.py) of a task's speed-up at 200 items with identical scores.
RATIO_CLAIMS = {"hellaswag": "data.hellaswag_ratio", "arc_easy": "data.arc_ratio"}


def load() -> str:
    return f"{os.getloadavg()[0]:.2f}" if hasattr(os, "getloadavg") else "?"




def bench_icl(n: int, model, tokenizer, data_root: Path, batch_size: int, repeats: int) -> None:
    """Items/s of score_items on the first `n` items of each ICL_BENCH task, printed per task and per type."""
    suite = {t.label: t for t in load_suite(data_root / "icl" / "dclm_mmlu_and_lowvar.yaml", data_root).tasks}
    prefix_space = needs_prefix_space(tokenizer)
    print(f"ICL engine: first {n} items per task, DCLM's settings, scoring time only (median of {repeats} after a "
          f"warm-up), batch size {batch_size}; load average (1 min) {load()} before")
    print(f"  {'task':<20} {'type':<18} {'shots':>5} {'items':>5} {'requests':>8} {'tokens/item':>11} "
          f"{'seconds':>8} {'items/s':>8}")
    per_type: dict[str, list[float]] = {}
    for label, shots in ICL_BENCH:
        if label not in suite:
            print(f"  {label:<20} (no data file under {data_root})")
            continue
        task = suite[label]
        items = build_items(task, read_records(task), shots, prefix_space, n)
        requests = sum(len(it.requests) for it in items)
        window = model.cfg.context_length
        tokens = sum(min(len(tokenizer.encode(c + k).ids), window) for it in items for c, k in it.requests[:1])
        run = functools.partial(score_items, model, tokenizer, task.type, items, batch_size)
        run()  # warm-up
        seconds = statistics.median(timed(run) for _ in range(repeats))
        per_type.setdefault(task.type, [0.0, 0.0])
        per_type[task.type][0] += len(items)
        per_type[task.type][1] += seconds
        print(f"  {label:<20} {task.type:<18} {shots:>5} {len(items):>5} {requests:>8} {tokens / len(items):>11.0f} "
              f"{seconds:>8.2f} {len(items) / seconds:>8.1f}")
        if task.type == "schema":  # the options' shared prefix computed once vs each option in its own row
            flat = [r for it in items for r in it.requests]
            owner = [k for k, it in enumerate(items) for _ in it.requests]
            shared = statistics.median(timed(functools.partial(score_requests, model, tokenizer, flat, batch_size,
                                                               items=owner)) for _ in range(repeats))
            alone = statistics.median(timed(functools.partial(score_requests, model, tokenizer, flat, batch_size))
                                      for _ in range(repeats))
            print(f"  {'':<20} schema options sharing a row {len(items) / shared:.1f} items/s, each option its own "
                  f"row {len(items) / alone:.1f} items/s ({alone / shared:.2f}x)")
    for task_type, (count, seconds) in per_type.items():
        print(f"  {task_type}: {count / seconds:.1f} items/s over {int(count)} items")
    print(f"  load average (1 min) {load()} after")


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def bench_task(task: str, n: int, model, tokenizer, lm, config_dir: Path, data_root, batch_size: int,
               repeats: int, chunk: int) -> bool:
    """Score `n` items of `task` both ways, print the comparison; True when the scores agree."""
    examples = load_task(task, task_file(task, data_root), n)
    calls: list = []
    loglikelihood = lm.loglikelihood

    def recording(requests, *args, **kwargs):
        calls.append(requests)
        return loglikelihood(requests, *args, **kwargs)

    lm.loglikelihood = recording
    load_before, load_first = load(), results.load()
    (their_metrics, theirs), = run_lm_eval(lm, [task], config_dir, n).values()
    lm.loglikelihood = loglikelihood
    (requests,) = calls
    metrics, ours = score_examples(model, tokenizer, task, examples, batch_size)

    # Chunks of items, alternating which side goes first, so that both sides see the same load over time:
    # on a shared machine the load drifts within a run.
    chunks = [range(a, min(a + chunk, len(examples))) for a in range(0, len(examples), chunk)]
    their_chunks = [[req for req in requests if req.doc_id in docs] for docs in chunks]
    ours_s, theirs_s = [], []
    for _ in range(repeats):
        spent = [0.0, 0.0]  # ours, theirs
        for k, (docs, their_requests) in enumerate(zip(chunks, their_chunks)):
            turns = [lambda docs=docs: score_examples(model, tokenizer, task, examples[docs.start : docs.stop],
                                                      batch_size),
                     lambda their_requests=their_requests: loglikelihood(their_requests, disable_tqdm=True)]
            for side in ((0, 1) if k % 2 == 0 else (1, 0)):
                spent[side] += timed(turns[side])
        ours_s.append(spent[0])
        theirs_s.append(spent[1])
    load_after = load()

    delta = max(abs(a - float(b[0])) for mine, their in zip(ours, theirs)
                for a, b in zip(mine["loglikelihoods"], their["filtered_resps"]))
    diff_pred = sum(float(m["pred"] == m["gold"]) != t["acc"] for m, t in zip(ours, theirs))
    diff_norm = sum(float(m["pred_norm"] == m["gold"]) != t["acc_norm"] for m, t in zip(ours, theirs))
    same = (len(ours) == len(theirs) and delta <= TOLERANCE and not diff_pred and not diff_norm
            and all(math.isclose(metrics[k], their_metrics[f"{k},none"], rel_tol=1e-9) for k in ("acc", "acc_norm")))
    ours_med, theirs_med = statistics.median(ours_s), statistics.median(theirs_s)

    def secs(values):
        return " ".join(f"{v:.2f}" for v in values)

    print(f"{task}: {len(examples)} items, {len(requests)} requests")
    print(f"  burnout  {ours_med:7.2f} s median  (runs {secs(ours_s)})   "
          f"acc {metrics['acc']:.4f}  acc_norm {metrics['acc_norm']:.4f}")
    print(f"  lm-eval  {theirs_med:7.2f} s median  (runs {secs(theirs_s)})   "
          f"acc {their_metrics['acc,none']:.4f}  acc_norm {their_metrics['acc_norm,none']:.4f}")
    print(f"  speed-up {theirs_med / ours_med:.2f}x (lm-eval / burnout medians; per run "
          + " ".join(f"{t / o:.2f}" for o, t in zip(ours_s, theirs_s)) + ")")
    print(f"  max |Δ loglik| {delta:.2e} over {sum(len(m['choices']) for m in ours)} choices; examples whose "
          f"acc / acc_norm differ: {diff_pred} / {diff_norm}; scores {'IDENTICAL' if same else 'DIFFER'}")
    print(f"  load average (1 min): {load_before} before lm-eval's first run, {load_after} after the last run")
    if same and n == 200 and task in RATIO_CLAIMS:
        results.record(RATIO_CLAIMS[task], theirs_med / ours_med, load_before=load_first,
                       note=f"median of {repeats} interleaved runs: {ours_med:.2f} s against {theirs_med:.2f} s")
    return same


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=200, help="HellaSwag validation items; 0 skips (default 200)")
    parser.add_argument("--arc-items", type=int, default=200, help="ARC-Easy test items; 0 skips (default 200)")
    parser.add_argument("--icl-items", type=int, default=40, help="items per ICL task timed; 0 skips (default 40)")
    parser.add_argument("--family", choices=sorted(SHAPES), default="gpt2")
    parser.add_argument("--batch-size", type=int, default=16, help="requests per forward, both sides (default 16)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--chunk", type=int, default=25, help="items per timed turn; the sides alternate (default 25)")
    parser.add_argument("--threads", type=int, help="torch threads for both sides (default: torch's, one per core)")
    parser.add_argument("--data-root", help="folder holding hellaswag/, arc/ and gpt2_tokenizer/ "
                                            "(default: ../shared/data)")
    args = parser.parse_args()
    try:
        threads = 1 if args.threads is None else args.threads
        for flag, value, least in (("--items", args.items, 0), ("--arc-items", args.arc_items, 0),
                                   ("--icl-items", args.icl_items, 0),
                                   ("--batch-size", args.batch_size, 1), ("--repeats", args.repeats, 1),
                                   ("--chunk", args.chunk, 1), ("--threads", threads, 1)):
            if value < least:
                raise BurnoutError(f"{flag} must be at least {least}, not {value}")
        data_root = Path(args.data_root) if args.data_root else default_data_root()
        if data_root is None:
            raise BurnoutError("no data root found; pass --data-root DIR (the folder holding hellaswag/ and arc/)")
        tasks = [(t, n) for t, n in (("hellaswag", args.items), ("arc_easy", args.arc_items)) if n]
        for task, _ in tasks:  # a missing file fails before anything is built
            if not (data_root / DEFAULT_FILES[task]).is_file():
                raise BurnoutError(f"'{data_root / DEFAULT_FILES[task]}' does not exist; pass --data-root DIR, "
                                   f"the folder holding {DEFAULT_FILES[task]}")
        tok_dir = data_root / "gpt2_tokenizer"
        tokenizer = gpt2_tokenizer(tok_dir / "vocab.json", tok_dir / "merges.txt")
        logging.getLogger("lm_eval").setLevel(logging.ERROR)
        if args.threads is not None:
            torch.set_num_threads(args.threads)
        same = True
        with tempfile.TemporaryDirectory() as tmp:
            tmp = Path(tmp)
            torch.manual_seed(0)
            cfg = ModelConfig(vocab_size=tokenizer.get_vocab_size(), context_length=512, dropout=0.0,
                              **SHAPES[args.family])
            model = Transformer(cfg).eval()
            print(f"{args.family} {cfg.n_layer}x{cfg.d_model} ({sum(p.numel() for p in model.parameters()) / 1e6:.1f}M "
                  f"params, vocab {cfg.vocab_size:,}, window {cfg.context_length}), random weights, CPU fp32, "
                  f"{torch.get_num_threads()} torch threads, batch size {args.batch_size}; torch {torch.__version__}; "
                  f"CPU {cpu_model()}, {os.cpu_count()} cores")
            if tasks:
                tokenizer.save(str(tmp / "tokenizer.json"))
                lm = hf_model(save_hf(model, tmp / "hf", tokenizer_path=tmp / "tokenizer.json"), args.batch_size)
                config_dir = write_task_configs(tmp / "tasks", data_root)
                import lm_eval
                import transformers

                print(f"transformers {transformers.__version__}, lm-eval {lm_eval.__version__}; scoring time only, "
                      f"median of {args.repeats} runs after one warm-up each, each run in turns of {args.chunk} items "
                      "alternating between the sides (burnout: score_examples; lm-eval: HFLM.loglikelihood on its "
                      "task's requests)")
            for task, n in tasks:
                same &= bench_task(task, n, model, tokenizer, lm, config_dir, data_root, args.batch_size,
                                   args.repeats, args.chunk)
            if args.icl_items:
                bench_icl(args.icl_items, model, tokenizer, data_root, args.batch_size, args.repeats)
    except BurnoutError as exc:
        print(f"bench_eval: error: {exc}", file=sys.stderr)
        return 2
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
