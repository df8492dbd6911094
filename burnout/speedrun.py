"""`burnout speedrun --out DIR --minutes N | --dollars X --gpu G`: the whole journey in one command, from text to a
model that chats, ending with a report card (report/card.py) that checks the plan's predictions.

    plan      each stage's share of the budget, said and written to DIR/plan.json before anything is spent; the
              pretraining model and tokens from `burnout plan`'s planner (train/optimal.py), added to plan.json
              once the data it measures a step on are there, before pretraining spends
    data      the offline corpus (as the quickstart's), or --data TEXT|RECIPE → DIR/data; its audit → DIR/audit
    pretrain  DIR/pretrain, a run of the planned steps; sft DIR/sft (--chat-data); rl DIR/rl (--rl-data)
    eval      val and the benchmarks whose files are present, each run's scores in its own RUN/eval
    export    DIR/hf (a Hugging Face folder) and DIR/model.gguf, of the last model trained
    card      DIR/report.md and DIR/report.html, from those folders' files alone (`burnout report DIR` again)

Every stage writes an ordinary folder, so every other command works on it. Killed at any moment, the same command
continues: a finished stage has its marker (DIR/stages/NAME.json, written last), a training stage in progress resumes
from its newest checkpoint (runs.start_or_resume), and the plan is read back from plan.json, never made again. The
training stages run a fixed number of steps (planned from a measured step), so pretraining and SFT resumed end
bitwise equal to an uninterrupted speedrun of the same plan; RL runs on a time budget (its steps placed by the clock),
which is not (docs/USAGE.md).
"""

from __future__ import annotations

import dataclasses
import json
import math
import resource
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from burnout.base.files import COMPARE_MD, RUN_CONFIG_FILE, write_atomic
from burnout.base.folders import check_output_folder, writing_into
from burnout.base.text import format_count, labelled, needs_package, next_steps
from burnout.config import load_run_config
from burnout.core.checkpoint import checkpoint_info, list_checkpoints, resolve_checkpoint
from burnout.core.gguf_export import export_gguf
from burnout.core.model_files import export_hf
from burnout.data.mix import load_prepare_sections
from burnout.data.prepare import prepare_data
from burnout.data.shards import read_meta
from burnout.errors import BurnoutError
from burnout.eval.compare import compare_checkpoints
from burnout.eval.evaluate import evaluate
from burnout.eval.tasks import BENCHMARKS, DEFAULT_FILES, default_data_root
from burnout.finetune.commands import fine_tune_config
from burnout.finetune.rl import NothingToLearn
from burnout.generate.prompts import suggested_prompt
from burnout.report.card import (
    AUDIT_DIR,
    AUDIT_MAX_TOKENS,
    GGUF_FILE,
    HF_DIR,
    PLAN_FILE,
    STAGES,
    STAGES_DIR,
    finished_stage,
    read_plan,
    write_card,
)
from burnout.runs import start_or_resume
from burnout.train.hardware import hardware_price
from burnout.train.optimal import budget_plan, prediction_source, prediction_words
from burnout.train.schedule import budget_steps

# Each stage's share of the budget; pretraining takes what the others leave. RL runs only where its share is at least
# RL_MIN_MINUTES: GRPO samples group_size answers a question before its first update, which a smaller share cannot.
SHARES = {"data": 0.08, "sft": 0.20, "rl": 0.20, "eval": 0.07, "export": 0.03}
RL_MIN_MINUTES = 2.0
# The eval stage scores the first EVAL_ITEMS_PER_MINUTE × the budget's minutes items of each task (val: windows),
# at least MIN_EVAL_ITEMS: a larger budget buys tighter scores.
EVAL_ITEMS_PER_MINUTE, MIN_EVAL_ITEMS = 20, 20
SAMPLE_TOKENS = 48  # the samples of the card: `burnout compare`'s prompts at each model's last checkpoint
FORMAT = "speedrun-1"


def speedrun(out: str | Path, minutes: float | None = None, dollars: float | None = None, gpu: str | None = None,
             data: str | None = None, chat_data: str | None = None, rl_data: str | None = None,
             overrides: Sequence[str] = (), say: Callable[[str], None] = print) -> Path:
    """Run (or continue) the speedrun in `out` for `minutes` of this machine or `dollars` on `gpu`; `data` (TEXT or a
    data mix) instead of the offline corpus, with `overrides` (data.* and tokenizer.* KEY=VALUE) for its sections;
    `chat_data` for SFT, `rl_data` for RL. Returns the report card's Markdown path."""
    out = Path(out)
    command = _command(minutes, dollars, gpu, data, chat_data, rl_data, list(overrides))
    source = shlex.join(command["argv"])
    check_output_folder(out, "--out", "speedrun", source, reads=[p for p in (data, chat_data, rl_data) if p])
    with writing_into(out, "speedrun", source, lock=True):
        plan = read_plan(out) if (out / PLAN_FILE).is_file() else _new_plan(out, command, say)
        if plan["command"] != command:  # the folder's owner record said the same command: plan.json was edited
            raise BurnoutError(f"{out / PLAN_FILE} is not this command's plan; give the speedrun's own command, or a "
                               "new --out folder")
        _say_shares(plan, say)
        stages = {"data": _data_stage, "pretrain": _pretrain_stage, "sft": _sft_stage, "rl": _rl_stage,
                  "eval": _eval_stage, "export": _export_stage}
        for number, name in enumerate(STAGES, 1):
            share = plan["stages"][name]
            head = f"[{number}/{len(STAGES)}] {name}"
            if share["skipped"]:
                say(f"{head}: skipped ({share['skipped']})")
            elif finished_stage(out, name) is not None:
                say(f"{head}: done already ({out / STAGES_DIR / (name + '.json')}); continuing after it")
            else:
                say(f"{head}: {share['minutes']:.2f} min planned")
                started = time.perf_counter()
                plan = stages[name](out, plan, say) or plan
                _mark_done(out, name, time.perf_counter() - started)
        written = write_card(out)
        say("")
        for line in _finish_lines(out, plan, written):
            say(line)
    return written[0]


def _command(minutes, dollars, gpu, data, chat_data, rl_data, overrides: list[str]) -> dict:
    """The command's budget and inputs, checked in one line before anything is spent; its `argv` names the folder's
    speedrun (a rerun with other arguments is refused)."""
    if (minutes is None) == (dollars is None):
        raise BurnoutError("speedrun needs one budget: --minutes N (this machine) or --dollars X --gpu G")
    if dollars is not None and not gpu:
        raise BurnoutError(f"--dollars {dollars:g}: give the GPU whose time it buys, --gpu G (a burnout/configs/"
                           "hardware.yaml entry, e.g. h100)")
    if minutes is not None and gpu:
        raise BurnoutError("--minutes plans for this machine; drop --gpu (or give --dollars X for a GPU)")
    for value, flag in ((minutes, "--minutes"), (dollars, "--dollars")):
        if value is not None and not (math.isfinite(value) and value > 0):
            raise BurnoutError(f"{flag} {value}: the budget must be a positive number")
    if rl_data and not chat_data:
        raise BurnoutError(f"--rl-data {rl_data}: RL tunes a chat model, which SFT makes; give --chat-data FILE too")
    for item in overrides:
        if not item.startswith(("data.", "tokenizer.")):
            raise BurnoutError(f"{item}: a speedrun takes data.* and tokenizer.* settings (its data); the plan "
                               "chooses the model and training settings")
    for path, flag in ((chat_data, "--chat-data"), (rl_data, "--rl-data")):
        if path and not path.startswith("hf:") and not Path(path).exists():
            raise BurnoutError(f"{flag} {path}: no such file; give a .json/.jsonl/.parquet file or hf:NAME")
    per_hour = None
    if dollars is not None:
        per_hour = _gpu_price(gpu, dollars, bool(chat_data), bool(rl_data))
    argv = [f"--minutes={minutes:g}"] if minutes is not None else [f"--dollars={dollars:g}", f"--gpu={gpu}"]
    argv += [f"--{flag}={value}" for flag, value in (("data", data), ("chat-data", chat_data), ("rl-data", rl_data))
             if value] + overrides
    return {"argv": argv, "minutes": minutes, "dollars": dollars, "gpu": gpu, "price_per_hour": per_hour,
            "data": data, "chat_data": chat_data, "rl_data": rl_data, "overrides": overrides}


def _gpu_price(gpu: str, dollars: float, chat: bool, rl: bool) -> float:
    """The price per hour of `gpu`, after refusing in one line a budget that buys no model pretraining's minimum
    steps (the planner's, with the published fits' vocabulary: before any data are prepared) and a machine without
    the GPU the plan is for."""
    per_hour, what = hardware_price(gpu, None, None)
    if not per_hour:
        raise BurnoutError(f"--gpu {gpu}: no price per hour is known for {what}; give --minutes N instead")
    share = stage_shares(dollars / per_hour * 60, chat, rl)["pretrain"]["share"]
    budget_plan(prediction_source(None, None), gpu, dollars=dollars * share, say=lambda line: None)
    import torch

    if not torch.cuda.is_available():
        raise BurnoutError(f"--dollars {dollars:g} --gpu {gpu}: this machine has no GPU, and the plan is for "
                           f"{gpu}'s speed; run the speedrun on that GPU, or give --minutes N for this machine")
    return per_hour


def stage_shares(total_minutes: float, chat: bool, rl: bool) -> dict[str, dict]:
    """Each stage's {"share", "minutes", "skipped"}: SHARES, pretraining the rest; SFT without chat data, and RL
    without questions or below RL_MIN_MINUTES, skipped (their share to pretraining) with the reason."""
    skipped = {"sft": None if chat else "no --chat-data given", "rl": None if rl else "no --rl-data given"}
    if rl and SHARES["rl"] * total_minutes < RL_MIN_MINUTES:
        skipped["rl"] = (f"its share, {SHARES['rl'] * total_minutes:.2f} min, is under the {RL_MIN_MINUTES:g} min "
                         f"RL needs; give a budget of {math.ceil(RL_MIN_MINUTES / SHARES['rl'])} minutes or more")
    shares = {name: (0.0 if skipped.get(name) else SHARES.get(name, 0.0)) for name in STAGES}
    shares["pretrain"] = 1.0 - sum(shares.values())
    return {name: {"share": share, "minutes": share * total_minutes, "skipped": skipped.get(name)}
            for name, share in shares.items()}


def _new_plan(out: Path, command: dict, say: Callable[[str], None]) -> dict:
    """The plan of a new speedrun: its budget and each stage's share, written to plan.json before anything is spent.
    The pretraining and SFT steps are added when the data they are measured on are there (_pretrain_stage)."""
    if command["minutes"] is not None:
        total, words = command["minutes"], f"{command['minutes']:g} minutes of this machine"
    else:
        total = command["dollars"] / command["price_per_hour"] * 60
        words = (f"${command['dollars']:g} on {command['gpu']} at ${command['price_per_hour']:.2f}/h: "
                 f"{total:.1f} minutes")
    plan = {"format": FORMAT, "command": command, "budget": {"minutes": total, "words": words},
            "stages": stage_shares(total, bool(command["chat_data"]), bool(command["rl_data"]))}
    _write_plan(out, plan)
    return plan


def _say_shares(plan: dict, say: Callable[[str], None]) -> None:
    price = plan["command"]["price_per_hour"]
    say(f"speedrun plan: {plan['budget']['words']} (written to plan.json before anything is spent)")
    for name in STAGES:
        share = plan["stages"][name]
        cost = f", ${share['minutes'] / 60 * price:.2f}" if price else ""
        say(f"  {name:<9}{share['share']:>4.0%}  {share['minutes']:6.2f} min{cost}"
            + (f"  (skipped: {share['skipped']})" if share["skipped"] else ""))


def _write_plan(out: Path, plan: dict) -> None:
    write_atomic(out / PLAN_FILE, json.dumps(plan, indent=2) + "\n")


def _mark_done(out: Path, name: str, seconds: float) -> None:
    """The stage's marker, written last: its seconds in this session and the process's peak memory by its end."""
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if sys.platform == "darwin" else 1024)
    record = {"stage": name, "seconds": seconds, "peak_rss_gib": peak_rss / 2**30, "cuda_peak_gib": _cuda_peak()}
    (out / STAGES_DIR).mkdir(exist_ok=True)
    write_atomic(out / STAGES_DIR / f"{name}.json", json.dumps(record) + "\n")


def _cuda_peak() -> float | None:
    import torch

    return torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None


def _data_stage(out: Path, plan: dict, say: Callable[[str], None]) -> None:
    """The offline corpus (the quickstart's mix) or --data's text or mix, prepared into DIR/data (an interrupted
    prepare resumes); then its audit into DIR/audit where the audit's package is installed."""
    command = plan["command"]
    data_cfg, tok_cfg = load_prepare_sections(command["data"] or "quickstart", command["overrides"])
    # Finished by a session killed before the stage's marker: this speedrun's own, from the same command.
    finished = (out / "data" / "meta.json").is_file()
    say(f"      reusing {out / 'data'}" if finished else
        f"      {'the offline corpus (Python docs and stdlib source)' if not command['data'] else command['data']}"
        f" → a {tok_cfg.kind} tokenizer → token files in {out / 'data'}")
    meta = read_meta(out / "data") if finished else prepare_data(data_cfg, tok_cfg, out / "data", progress=True)
    say(f"      {meta['splits']['train']['tokens']:,} train / {meta['splits']['val']['tokens']:,} val tokens, "
        f"vocabulary {meta['vocab_size']:,}")
    import importlib.util

    if importlib.util.find_spec("datasketch") is None:
        say("      audit: " + needs_package("burnout data audit DIR/data", "datasketch", "data").split("   ")[-1])
        return
    if meta["splits"]["train"]["tokens"] > AUDIT_MAX_TOKENS:
        say(f"      audit: left to `burnout data audit {out / 'data'}` (more than {format_count(AUDIT_MAX_TOKENS)} "
            "train tokens: it reads them all)")
        return
    from burnout.forensics.audit import audit_prepared, write_audit

    # DIR/audit is this speedrun's: an audit a killed session left there is replaced.
    write_audit(audit_prepared((out / "data").absolute()), out / AUDIT_DIR, overwrite=True)
    say(f"      audit: {out / AUDIT_DIR / 'audit.html'}")


def _pretrain_stage(out: Path, plan: dict, say: Callable[[str], None]) -> dict:
    """The planner's compute-optimal model for pretraining's share (planned once, kept in plan.json), trained for
    its steps into DIR/pretrain, or resumed there."""
    if "pretrain" not in plan:
        plan = _plan_pretraining(out, plan, say)
    cfg = load_run_config(_with_data(plan["pretrain"]["config"], out))
    start_or_resume(cfg, out / "pretrain", data_dir=out / "data")
    return plan


def _plan_pretraining(out: Path, plan: dict, say: Callable[[str], None]) -> dict:
    """The pretraining plan for its share (the model, steps, tokens and predicted loss of `burnout plan`), and SFT's
    steps at pretraining's step time (the same model and batch), added to plan.json before pretraining spends."""
    command, minutes = plan["command"], plan["stages"]["pretrain"]["minutes"]
    source = prediction_source(None, out / "data")
    if command["dollars"] is not None:
        found = budget_plan(source, command["gpu"], dollars=command["dollars"] * plan["stages"]["pretrain"]["share"],
                            say=say)
        phases = found["planned"]["phases"]
        step_s = sum(p["hours"] for p in phases) * 3600 / found["steps"]
        memory = found["planned"]["memory"]
    else:
        found = budget_plan(source, None, minutes=minutes, say=say)
        step_s, memory = found["step_seconds"], found["memory"]
    cfg, steps = found["cfg"], found["steps"]
    tc = cfg.train
    cfg.train = dataclasses.replace(
        tc, eval=dataclasses.replace(tc.eval, eval_interval=max(1, steps // 4), sample_tokens=32),
        checkpoint=dataclasses.replace(tc.checkpoint, ckpt_interval=max(1, steps // 4), keep_last=2))
    m = cfg.model
    plan["pretrain"] = {
        "config": _with_data(cfg.to_dict(), None), "steps": steps, "tokens": found["tokens"],
        "params": found["chosen"]["params"], "step_seconds": step_s, "minutes": steps * step_s / 60,
        "shape": f"{m.family} {m.n_layer} layers × {m.d_model} wide, {format_count(found['chosen']['params'])} "
                 "parameters", "prediction": found["prediction"],
        "memory_gib": memory["variants"][memory["configured"]]["total"] / 2**30}
    if not plan["stages"]["sft"]["skipped"]:
        plan["sft"] = {"steps": budget_steps(plan["stages"]["sft"]["minutes"], step_s), "step_seconds": step_s}
    _write_plan(out, plan)
    say(f"      {plan['pretrain']['shape']}, {steps:,} steps, {format_count(found['tokens'])} tokens; predicted val "
        f"loss {prediction_words(found['prediction'])}")
    return plan


def _with_data(raw: dict, out: Path | None) -> dict:
    """A config's data.prepared_dir as DIR/data (`out`), or left out for plan.json (a speedrun's folder may move)."""
    data = {key: value for key, value in raw.get("data", {}).items() if key != "prepared_dir"}
    if out is not None:
        data["prepared_dir"] = str((out / "data").absolute())
    return {**raw, "data": data}


def _sft_stage(out: Path, plan: dict, say: Callable[[str], None]) -> None:
    """SFT of the pretrained model on --chat-data into DIR/sft: the planned steps, pretraining's batch shape."""
    pretrain = load_run_config(_with_data(plan["pretrain"]["config"], out)).train
    steps = plan["sft"]["steps"]
    sets = [f"train.max_steps={steps}", f"train.batch_size={pretrain.batch_size}",
            f"train.grad_accum={pretrain.grad_accum}", f"train.seq_len={pretrain.seq_len}",
            f"train.eval_interval={max(1, steps // 2)}", f"train.ckpt_interval={max(1, steps // 4)}",
            "train.keep_last=2", f"train.log_interval={min(10, steps)}"]
    cfg = fine_tune_config("sft", out / "pretrain", plan["command"]["chat_data"], None, False, sets)
    start_or_resume(cfg, out / "sft", sets)


def _rl_stage(out: Path, plan: dict, say: Callable[[str], None]) -> dict | None:
    """GRPO of the chat model on --rl-data's checkable questions into DIR/rl, on RL's share as a time budget. Skipped,
    the reason in plan.json, where the chat model gets one reward for every answer it is probed with (NothingToLearn:
    every step's loss would be 0); ended at its newest checkpoint where it was stopped with its budget spent."""
    run = out / "rl"
    spent = _spent_budget(run)
    if spent is not None:
        say(f"      {spent}")
        return None
    sets = [f"train.max_minutes={plan['stages']['rl']['minutes']:.4g}"]
    cfg = fine_tune_config("rl", out / "sft", plan["command"]["rl_data"], None, False, sets)
    try:
        start_or_resume(cfg, run, sets)
    except NothingToLearn as exc:
        plan["stages"]["rl"]["skipped"] = str(exc)
        _write_plan(out, plan)
        say(f"      skipped: {exc}")
        return plan
    return None


def _spent_budget(run: Path) -> str | None:
    """Where the RL stage was stopped with its time budget spent (its newest checkpoint's elapsed_s and a step reach
    it): that checkpoint is the stage's model, as a line says, since a resume could only repeat the final LR (which
    `burnout train` refuses). None otherwise."""
    checkpoints = list_checkpoints(run)
    if not checkpoints:
        return None
    budget = load_run_config(run / RUN_CONFIG_FILE).train.budget
    info = checkpoint_info(checkpoints[-1])
    if budget.step_seconds is None or info["elapsed_s"] + budget.step_seconds < budget.max_minutes * 60:
        return None
    return (f"its time budget was spent when it was stopped: its newest checkpoint, step {info['step']:,}, is the "
            "stage's model")


def _eval_stage(out: Path, plan: dict, say: Callable[[str], None]) -> None:
    """The pretrained model on val and on each benchmark whose file is present (the first items, as many as the
    budget buys); the chat models' held-out scores are their runs' own. Samples: `burnout compare`'s prompts
    answered by the pretrained and the last model (a fine-tune's base beside it), in their compare.json."""
    root = default_data_root()
    present = [task for task in BENCHMARKS if root is not None and (root / DEFAULT_FILES[task]).is_file()]
    absent = [task for task in BENCHMARKS if task not in present]
    if absent:
        say(f"      not scored, no file: {', '.join(absent)} (--data-root of `burnout eval`, or $BURNOUT_EVAL_DATA)")
    limit = max(MIN_EVAL_ITEMS, round(EVAL_ITEMS_PER_MINUTE * plan["budget"]["minutes"]))
    evaluate(out / "pretrain", ",".join(["val", *present]), limit=limit, say=lambda line: None, data_root=root)
    say(f"      the first {limit:,} items of each task: {out / 'pretrain' / 'eval' / 'summary.md'}")
    for run in dict.fromkeys([out / "pretrain", _final_run(out, plan)]):  # a fine-tune's table has its base's too
        last = list_checkpoints(run)[-1].name
        compare_checkpoints(run, [last], max_new_tokens=SAMPLE_TOKENS, say=lambda line: None, temperature=0.8,
                            top_k=50, seed=0)
        say(f"      samples: {run / COMPARE_MD}")


def _final_run(out: Path, plan: dict) -> Path:
    """The last model trained: RL's, else SFT's, else pretraining's."""
    return next(out / name for name in ("rl", "sft", "pretrain") if not plan["stages"][name]["skipped"])


def _export_stage(out: Path, plan: dict, say: Callable[[str], None]) -> None:
    """The last model as a Hugging Face folder (DIR/hf) and a GGUF file (DIR/model.gguf), each with its card."""
    from burnout.report.model_card import CARD_FILE, gguf_metadata, write_model_card

    run = _final_run(out, plan)
    checkpoint = resolve_checkpoint(run)
    export_hf(checkpoint, out / HF_DIR, overwrite=True)
    write_model_card(checkpoint, out / HF_DIR / CARD_FILE, HF_DIR)
    gguf = out / GGUF_FILE
    export_gguf(checkpoint, gguf, "f16", overwrite=True, about=gguf_metadata(checkpoint, gguf.stem))
    write_model_card(checkpoint, gguf.with_suffix(".md"), gguf.stem, gguf_file=gguf.name)
    say(f"      {out / HF_DIR} and {gguf}, of {checkpoint}")


def _finish_lines(out: Path, plan: dict, written: list[Path]) -> list[str]:
    """Where everything is, and how to talk to the model, serve it and run its GGUF file."""
    final = _final_run(out, plan)
    run = shlex.quote(str(final))
    chat = plan["stages"]["sft"]["skipped"] is None
    talk = f"burnout chat {run}" if chat else f"burnout generate {run} --prompt {shlex.quote(suggested_prompt(final))}"
    rows = [("report card", f"{written[1]}   (and {written[0].name}; burnout report {shlex.quote(str(out))} "
                            "rebuilds it)"),
            ("chat" if chat else "generate", talk),
            ("serve", f"burnout serve {run}   (an OpenAI API at http://127.0.0.1:8000/v1)"),
            ("llama.cpp", f"llama-cli -m {shlex.quote(str(out / GGUF_FILE))}"),
            ("playground", needs_package(f"burnout playground {run}", "gradio", "playground"))]
    return [*labelled([("speedrun", f"{out}   (plan.json, data/, pretrain/, ..., hf/, {GGUF_FILE})")]),
            *next_steps(rows)]
