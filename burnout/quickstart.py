"""`burnout quickstart`: the whole pipeline, offline, in a few minutes on a laptop CPU.

corpus (the Python stdlib's docs and source) → BPE tokenizer → token files → a small LLaMA trained
for a measured number of steps → validation loss → samples → where everything is.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from pathlib import Path

from burnout.base.files import COMPARE_JSON
from burnout.base.text import format_duration, labelled, next_steps, plural
from burnout.config import load_run_config
from burnout.data.prepare import prepare_data
from burnout.data.shards import read_meta
from burnout.data.split import older_split_rule
from burnout.errors import BurnoutError
from burnout.eval.compare import compare_checkpoints
from burnout.generate.prompts import sample_prompts
from burnout.generate.sampling import shown
from burnout.models.info import model_info
from burnout.report.render import write_report
from burnout.runs import trained_run_steps
from burnout.train.probe import measure_step_seconds
from burnout.train.recipe import Pretraining
from burnout.train.run import start_run
from burnout.train.schedule import budget_steps
from burnout.train.trackers import check_tracker

# Share of the budget the training takes; the rest is for validation, samples and checkpoints.
_TRAINING_SHARE = 0.85


def quickstart(out_dir: Path, minutes: float = 3.0, overrides: list[str] = (), say=print) -> Path:
    if minutes <= 0:
        raise BurnoutError(f"--minutes {minutes}: the training budget must be positive")
    started = time.perf_counter()
    out_dir = Path(out_dir)
    cfg = load_run_config("quickstart", overrides)
    check_tracker(cfg.train.log.tracker)  # before the data are prepared

    data_dir = out_dir / "data"
    meta = read_meta(data_dir) if (data_dir / "meta.json").exists() else None
    if meta is not None and not older_split_rule(meta):
        say(f"[1/4] data: reusing {data_dir}")
    else:  # none yet, or parted into train and val by an older rule: its own folder, prepared again
        say(f"[1/4] data: mixing the embedded corpus (Python's docs and stdlib source), training a "
            f"{cfg.tokenizer.vocab_size}-token BPE, writing token files to {data_dir}")
        meta = prepare_data(cfg.data, cfg.tokenizer, data_dir, progress=True, overwrite=meta is not None)
    for name, src in meta["sources"]["per_source"].items():
        say(f"      source {name}: {plural(src['documents'], 'document')}, {src['chars']:,} characters "
            f"({src['share']:.0%} of the mix, weight {src['weight']:g})")
    say(f"      {meta['splits']['train']['tokens']:,} train / {meta['splits']['val']['tokens']:,} val tokens")

    cfg.model = dataclasses.replace(cfg.model, vocab_size=meta["vocab_size"]).resolved()
    info = model_info(cfg.model, seq_len=cfg.train.seq_len)
    step_s = measure_step_seconds(cfg, data_dir)
    training_minutes = minutes * _TRAINING_SHARE
    steps = budget_steps(training_minutes, step_s)
    tokens_per_step = cfg.train.batch_size * cfg.train.grad_accum * (cfg.train.seq_len or cfg.model.context_length)
    # The plan is the steps that fit at the fastest step measured; the time budget (max_minutes) places slower steps
    # on the LR schedule by the clock (other work on a laptop, thermal throttling), so the run trains for its
    # minutes and its last step has the final LR. step_seconds is the measurement, which the run then plans with.
    tc = cfg.train
    cfg.train = dataclasses.replace(
        tc, max_steps=steps, checkpoint=dataclasses.replace(tc.checkpoint, ckpt_interval=-(-steps // 3)),
        eval=dataclasses.replace(tc.eval, eval_interval=max(tc.log.log_interval, steps // 6)),
        budget=dataclasses.replace(tc.budget, max_minutes=training_minutes, step_seconds=step_s))
    say(f"[2/4] model: {cfg.model.family} {cfg.model.n_layer} layers × {cfg.model.d_model} wide, "
        f"{info['params_total']:,} parameters")
    say(f"      measured {step_s:.3f} s/step for {tokens_per_step:,} tokens/step → up to {steps} steps "
        f"in {format_duration(training_minutes * 60)} of training, the rest of {minutes:g} minutes for samples")

    run_dir = _fresh_run_dir(out_dir)
    say(f"[3/4] training into {run_dir} (loss, tokens/s and samples as it goes)")
    result = start_run(cfg, run_dir, Pretraining(), data_dir=data_dir)

    say(f"[4/4] done in {(time.perf_counter() - started) / 60:.1f} min: {result.step} steps, "
        f"{result.tokens:,} tokens at {result.tokens_per_s:,.0f} tokens/s; "
        f"val loss {result.val_loss:.3f} (a uniform guess scores {math.log(meta['vocab_size']):.3f})")
    # Learning a person can see: the run's own sample prompts (words of its val split; without any, compare's
    # built-in ones) at each kept checkpoint, sampled as the blog sampled them (greedy decoding of a small model
    # loops on "the the the", which hides the progress). Also compare.md, which the report shows.
    compare_checkpoints(run_dir, prompts=sample_prompts(run_dir) or None, max_new_tokens=40, say=lambda line: None,
                        temperature=0.8, top_k=50, seed=0)
    compared = json.loads((run_dir / COMPARE_JSON).read_text(encoding="utf-8"))
    say("same prompt, different checkpoint (temperature 0.8, top-k 50, seed 0; burnout compare writes more):")
    for i, prompt in enumerate(compared["prompts"]):
        say(f"--- {prompt!r} ---")
        for row in compared["rows"]:
            continuation = row["continuations"][i]
            say(f"  step {row['step']:>5}: {prompt + continuation!r}"[:110] + ("" if continuation else f" {shown('')}"))
    say("")
    _, written = write_report([run_dir])
    steps = trained_run_steps(run_dir, chat=False, stop_reason=result.stop_reason, export_to=out_dir / "hf",
                              report=written[-1])
    for line in [*labelled([("run folder", f"{run_dir}   (config.yaml, metrics.jsonl, checkpoints/)"),
                            ("checkpoint", str(result.checkpoint))]), *next_steps(steps)]:
        say(line)
    return run_dir


def _fresh_run_dir(out_dir: Path) -> Path:
    """out/run, or out/run-2, out/run-3 … so an earlier quickstart's run is never overwritten."""
    candidate, n = out_dir / "run", 1
    while candidate.exists():
        n += 1
        candidate = out_dir / f"run-{n}"
    return candidate

