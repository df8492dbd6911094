"""`burnout plan --dollars X | --hours H --gpu G | --minutes N`: what a budget buys. The compute-optimal shape and
token count, the loss they are predicted to reach with its interval, and the run config that trains them.

The budget is FLOPs: hours × the GPU's peak × the assumed MFU × devices (the planner's throughput model,
train/plan.py, hardware.yaml), or on this machine (`--minutes`) a step of the dial's depth-2 model measured as the
quickstart measures it (train/probe.py), its FLOP rate taken for every shape. Among the depth dial's shapes and the
LLaMA presets (a preset named when it is the one chosen), the plan takes the one whose predicted loss at the tokens
the budget buys it (FLOPs / its own FLOPs per token, models/info.py) is least: Hoffmann et al.'s compute-optimal
choice, with the real FLOPs per token in place of 6·N. The prediction is a ladder's fit (`--ladder`, with its
bootstrap interval) or, with none, the published fits (train/scaling.py; their spread as the interval, and the
warning that their loss is not yours). On this machine the chosen shape's step is measured again and its steps are
the ones that fit the minutes (schedule.budget_steps), the tokens the prediction is for. Hours, dollars and memory
are then `burnout plan CONFIG`'s for the written config (plan_run).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import yaml

from burnout.base.files import write_atomic
from burnout.base.text import format_count
from burnout.config import (
    ModelConfig,
    PredictionConfig,
    RunConfig,
    load_model_preset,
    load_run_config,
    model_preset_names,
)
from burnout.data.prepare import CHINCHILLA_TOKENS_PER_PARAM
from burnout.data.shards import read_meta
from burnout.errors import BurnoutError
from burnout.models.info import model_info
from burnout.train import ladder as ladders
from burnout.train import scaling
from burnout.train.hardware import get_hardware, hardware_price
from burnout.train.plan import auto_precision, format_plan, memory_plan, plan_run, planned_mfu
from burnout.train.probe import measure_step_seconds
from burnout.train.schedule import budget_steps

MIN_STEPS = 100  # a run shorter than this is mostly warmup: a budget that buys no shape this many steps is refused
TARGET_STEPS = 2000  # the batch doubles while the run keeps at least this many steps, up to MAX_TOKENS_PER_STEP
MAX_TOKENS_PER_STEP = 2**19
SEQ_LEN = {"gpu": 1024, "cpu": ladders.SEQ_LEN}  # without a ladder
DEFAULT_VOCAB = 32000  # without data: the shapes' vocabulary
PASSES_WARNING = 4  # Muennighoff et al. 2023: past about four passes a repeat is worth much less than a fresh token
PROBE_DEPTH = 2
PUBLISHED_CENTRAL = "besiroglu2024"


def prediction_source(ladder_path: str | Path | None, data: str | Path | None) -> dict:
    """Where predictions come from: a ladder's fit (its law, bootstrap, residuals, data, sequence and batch), or the
    published fits; and the data the plan reads (`data`, else the ladder's)."""
    if ladder_path is None:
        source = {"kind": "published", "law": scaling.PUBLISHED[PUBLISHED_CENTRAL], "seqs": ladders.SEQS_PER_STEP,
                  "seq_len": None, "data": None, "ladder": None}
    else:
        found = ladders.read_ladder(ladder_path)
        fit, design = found["fit"], found["design"]
        source = {"kind": "ladder", "law": scaling.ScalingLaw.from_dict(fit["law"]),
                  "samples": [scaling.ScalingLaw.from_dict(s) for s in fit["bootstrap"]],
                  "residuals": fit["residuals"], "held_out": fit["held_out"]["mean_abs_error"],
                  "seqs": design["seqs_per_step"], "seq_len": design["seq_len"], "data": found["data"],
                  "ladder": str(Path(ladder_path).absolute()), "record": found}
    if data is not None:
        source["data"] = str(Path(data).absolute())
    if source["data"] is not None:
        meta = read_meta(source["data"])  # refused in one line when not prepared data
        source.update(vocab=meta["vocab_size"], train_tokens=meta["splits"]["train"]["tokens"])
        if source["kind"] == "ladder" and meta["vocab_size"] != source["record"]["design"]["vocab_size"]:
            raise BurnoutError(f"--data {data}: its vocabulary ({meta['vocab_size']:,}) is not the ladder's "
                               f"({source['record']['design']['vocab_size']:,}); a ladder predicts for its own data")
    else:
        source.update(vocab=DEFAULT_VOCAB, train_tokens=None)
    return source


def predict_loss(source: dict, params: int, tokens: int) -> dict:
    """The predicted final val loss of `params` trained on `tokens`, with its interval (PredictionConfig's fields)."""
    if source["kind"] == "ladder":
        found = scaling.predict(source["law"], source["samples"], source["residuals"], params, tokens,
                                source["train_tokens"])
        return {**found, "source": "ladder", "ladder": source["ladder"], "params": params, "tokens": tokens}
    unique = source["train_tokens"]
    outside = scaling.outside_published_range(params, float(scaling.fresh_tokens(tokens, unique)))
    if outside:  # no figure at all: another data set's law, extrapolated past what it was measured on
        return {"val_loss": None, "low": None, "high": None, "level": 0.0, "source": source["law"].label,
                "ladder": None, "params": params, "tokens": tokens, "outside": outside}
    values = [float(law.loss(params, tokens, unique)) for law in scaling.PUBLISHED.values()]
    return {"val_loss": float(source["law"].loss(params, tokens, unique)), "low": min(values), "high": max(values),
            "level": 0.0, "source": source["law"].label, "ladder": None, "params": params, "tokens": tokens}


def candidates(vocab: int, seq_len: int) -> list[tuple[str | None, ModelConfig]]:
    """The shapes a plan chooses from: the depth dial's, and each LLaMA preset whose context holds `seq_len` (by
    name), all with the data's vocabulary."""
    shapes = [(None, ladders.dial_shape(d, vocab, seq_len)) for d in ladders.FRONTIER_DEPTHS]
    for name in model_preset_names():
        preset = load_model_preset(name, {"vocab_size": vocab})
        if preset.family == "llama" and preset.context_length >= seq_len:
            shapes.append((name, preset))
    return shapes


def choose_shape(law: scaling.ScalingLaw, flops: float, vocab: int, seq_len: int, tokens_per_step: int,
                 budget_words: str, unique: float | None = None) -> dict:
    """The candidate of least predicted loss at the tokens `flops` buy it (at least MIN_STEPS steps of
    `tokens_per_step`), read from `unique` distinct tokens when known (so scarce data favours a larger model); refused
    in one line when none has that many."""
    best, smallest = None, None
    for name, model in candidates(vocab, seq_len):
        info = model_info(model, seq_len=seq_len)
        tokens = flops / info["flops_per_token"]
        if smallest is None or info["flops_per_token"] < smallest[1]:
            smallest = (info["params_total"], info["flops_per_token"])
        if tokens < MIN_STEPS * tokens_per_step:
            continue
        loss = float(law.loss(info["params_total"], tokens, unique))
        if best is None or loss < best["loss"]:
            best = {"preset": name, "model": model, "params": info["params_total"], "tokens": tokens, "loss": loss,
                    "flops_per_token": info["flops_per_token"]}
    if best is None:
        need = MIN_STEPS * tokens_per_step * smallest[1]
        raise BurnoutError(f"{budget_words} buys {flops:.3g} FLOPs, too few for the smallest model "
                           f"({format_count(smallest[0])} parameters) to train {MIN_STEPS} steps of "
                           f"{tokens_per_step:,} tokens ({need:.3g} FLOPs); give a budget {math.ceil(need / flops):,}× "
                           "larger or more")
    return best


def batch_for(tokens: float, seqs: int, seq_len: int) -> tuple[int, int]:
    """(sequences per step, steps) for `tokens`: `seqs` doubled while the run keeps TARGET_STEPS steps and a step at
    most MAX_TOKENS_PER_STEP tokens."""
    while tokens / (2 * seqs * seq_len) >= TARGET_STEPS and 2 * seqs * seq_len <= MAX_TOKENS_PER_STEP:
        seqs *= 2
    return seqs, max(1, round(tokens / (seqs * seq_len)))


def budget_plan(source: dict, hardware: str | None, hours: float | None = None, dollars: float | None = None,
                minutes: float | None = None, devices: int = 1, mfu: float | None = None, price: float | None = None,
                say: Callable[[str], None] = print) -> dict:
    """The plan for one budget: `dollars` or `hours` on `devices` × `hardware`, or `minutes` of this machine."""
    if minutes is not None:
        return _machine_plan(source, minutes, say)
    if devices < 1:
        raise BurnoutError(f"--devices {devices}: must be at least 1")
    if mfu is not None and not 0 < mfu <= 1:
        raise BurnoutError(f"--mfu {mfu}: must lie in (0, 1]")
    if dollars is not None:  # before a CPU's peak is measured
        per_hour, what = hardware_price(hardware, price, None)
        if not per_hour:
            raise BurnoutError(f"--dollars: no price per hour is known for {what}; give --price (dollars per "
                               "device-hour) or --hours")
        hours = dollars / (per_hour * devices)
    hw = get_hardware(hardware, auto_precision(hardware), price)
    words = (f"${dollars:g}" if dollars is not None else f"{hours:g} h") + f" on {devices} × {hw.name}"
    flops = hours * 3600 * hw.peak_flops * planned_mfu(mfu, hw)[0] * devices
    seq_len = source["seq_len"] or SEQ_LEN["cpu" if hardware == "cpu" else "gpu"]
    chosen = choose_shape(source["law"], flops, source["vocab"], seq_len, source["seqs"] * seq_len, words,
                          source["train_tokens"])
    seqs, steps = batch_for(chosen["tokens"], source["seqs"], seq_len)
    cfg = ladders.shape_run_config(_data(source), _model(chosen, source), steps, seqs, seq_len)
    planned = plan_run(cfg, hardware, mfu=mfu, price_per_hour=price, devices=devices)
    largest = planned["memory"]["largest_micro_batch"]
    if planned["memory"]["fits"] is False and largest:  # the same tokens per step in micro-batches that fit
        cfg = ladders.shape_run_config(_data(source), _model(chosen, source), steps, seqs, seq_len,
                                       micro_batch=largest)
        planned = plan_run(cfg, hardware, mfu=mfu, price_per_hour=price, devices=devices)
    tokens = steps * seqs * seq_len
    return {"budget": words, "flops": flops, "chosen": chosen, "cfg": cfg, "steps": steps, "tokens": tokens,
            "prediction": predict_loss(source, chosen["params"], tokens), "planned": planned, "source": source}


def _data(source: dict) -> Path | None:
    return Path(source["data"]) if source["data"] is not None else None


def _model(chosen: dict, source: dict) -> ModelConfig | str:
    """What the config names: the preset on data (which gives it the data's vocabulary), else the whole shape."""
    return chosen["preset"] if chosen["preset"] and source["data"] is not None else chosen["model"]


def _machine_plan(source: dict, minutes: float, say: Callable[[str], None]) -> dict:
    """`--minutes N` on this machine: the FLOP rate of a measured step of the dial's depth-2 model buys the shape;
    the chosen shape's own measured step then sets its steps (budget_steps), as the quickstart sizes its run."""
    if source["data"] is None:
        raise BurnoutError("--minutes measures a step on your data: give --data DIR (prepared by `burnout data "
                           "prepare`) or --ladder LADDER (its data)")
    data_dir, seq_len, seqs = Path(source["data"]), source["seq_len"] or SEQ_LEN["cpu"], source["seqs"]
    probe = ladders.dial_shape(PROBE_DEPTH, source["vocab"], seq_len)
    step_s = measure_step_seconds(ladders.shape_run_config(data_dir, probe, 10, seqs, seq_len), data_dir)
    rate = model_info(probe, seq_len=seq_len)["flops_per_token"] * seqs * seq_len / step_s
    say(f"measured a step of the depth-{PROBE_DEPTH} model on this machine: {step_s:.3g} s, {rate:.3g} FLOP/s")
    words = f"{minutes:g} minutes of this machine"
    chosen = choose_shape(source["law"], rate * minutes * 60, source["vocab"], seq_len, seqs * seq_len, words,
                          source["train_tokens"])
    model = _model(chosen, source)
    step_s = measure_step_seconds(ladders.shape_run_config(data_dir, model, 10, seqs, seq_len), data_dir)
    steps = budget_steps(minutes, step_s)
    if steps < MIN_STEPS:
        raise BurnoutError(f"{words}: the chosen model measured {step_s:.3g} s a step, {steps} steps in the budget, "
                           f"fewer than {MIN_STEPS}; give about {math.ceil(MIN_STEPS * step_s / 60)} minutes or more")
    say(f"measured a step of the chosen model: {step_s:.3g} s → {steps:,} steps in {minutes:g} min")
    cfg = ladders.shape_run_config(data_dir, model, steps, seqs, seq_len)
    tokens = steps * seqs * seq_len
    memory = memory_plan(cfg, "cpu", "fp32", 1)
    return {"budget": words, "flops": rate * minutes * 60, "chosen": chosen, "cfg": cfg, "steps": steps,
            "tokens": tokens, "step_seconds": step_s, "prediction": predict_loss(source, chosen["params"], tokens),
            "planned": None, "memory": memory, "source": source}


def prediction_words(p: dict) -> str:
    """'2.314 (90% interval 2.250–2.381, from the ladder L)' or the published fits' line with the warning."""
    if p["val_loss"] is None:
        return f"none: {p['outside']}; `burnout ladder` fits your data's own law at any size"
    if p["source"] == "ladder":
        return (f"{p['val_loss']:.3f} ({p['level']:.0%} interval {p['low']:.3f}–{p['high']:.3f}, from the ladder "
                f"{p['ladder']})")
    return (f"{p['val_loss']:.3f} (from the published fit of {p['source']}; {p['low']:.3f}–{p['high']:.3f} between "
            f"the two published fits). Warning: {scaling.TRANSFER_WARNING}")


def format_budget_plan(plan: dict) -> str:
    """The plan as a person reads it: the budget, the shape and tokens, the prediction, time, dollars, memory, data."""
    chosen, m, source = plan["chosen"], plan["cfg"].model, plan["source"]
    shape = (f"{m.family} {m.n_layer} layers × {m.d_model} wide, {m.n_head} heads ({m.n_kv_head} key/value)"
             + (f", the preset {chosen['preset']}" if chosen["preset"] else ", the depth dial's (no preset matches)"))
    tc = plan["cfg"].train
    lines = [f"budget: {plan['budget']}, {plan['flops']:.3g} FLOPs",
             f"compute-optimal: {shape}; {format_count(chosen['params'])} parameters, {format_count(plan['tokens'])} "
             f"tokens ({plan['tokens'] / chosen['params']:.1f} per parameter), {plan['steps']:,} steps of "
             f"{tc.batch_size} × {tc.grad_accum} × {tc.seq_len} tokens",
             f"predicted val loss: {prediction_words(plan['prediction'])}"]
    if source["kind"] == "ladder":
        lines.append(f"the ladder's own error, its top level predicted from the others: {source['held_out']:.2%} "
                     "mean |error|")
    if plan["planned"] is not None:
        lines += ["", format_plan(plan["planned"])]
    else:
        lines.append(f"time: {plan['steps']:,} steps × {plan['step_seconds']:.3g} s measured = "
                     f"{plan['steps'] * plan['step_seconds'] / 60:.1f} min of steps, plus start-up and the final "
                     "evaluation; peak memory "
                     f"{plan['memory']['variants'][plan['memory']['configured']]['total'] / 2**30:.2f} GiB")
    lines.append(data_line(source, plan["tokens"]))
    return "\n".join(lines)


def data_line(source: dict, tokens: int) -> str:
    """'data: you have 1.2M tokens in DIR; this plan reads 20M: 17 passes' and, past PASSES_WARNING, what that costs."""
    if source["train_tokens"] is None:
        return (f"data: none named (--data DIR); this plan reads {format_count(tokens)} tokens, and a vocabulary of "
                f"{source['vocab']:,} is assumed")
    passes = tokens / source["train_tokens"]
    line = (f"data: you have {format_count(source['train_tokens'])} train tokens in {source['data']}; this plan "
            f"reads {format_count(tokens)}: {passes:.1f} passes")
    if passes > 1:
        fresh = scaling.fresh_tokens(tokens, source["train_tokens"])
        line += f", worth {format_count(fresh)} fresh ones (Muennighoff et al. 2023), which the prediction is for"
    if passes > PASSES_WARNING:
        line += (f"; past about {PASSES_WARNING} passes a repeat is worth much less than a fresh token, and a small "
                 "data set can be learnt by heart (val loss rising), which no fit predicts: prepare more data")
    return line


def check_config_path(path: str | Path, source: dict) -> None:
    """Refuse `--write-config FILE`, before anything is measured, where FILE exists (it is the user's) or no data are
    named (the config trains on prepared data)."""
    if Path(path).exists():
        raise BurnoutError(f"--write-config {path}: a file or folder is there already; give a new file name")
    if source["data"] is None:
        raise BurnoutError("--write-config: the run config trains on prepared data; give --data DIR (prepared by "
                           "`burnout data prepare`) or --ladder LADDER (its data)")


def write_config(plan: dict, path: str | Path) -> None:
    """The plan's run config with its prediction (the prediction section, PredictionConfig) when it has one, ready for
    `burnout train FILE --out RUN`; checked by loading it back before it is written."""
    raw = plan["cfg"].to_dict()
    fields = PredictionConfig.__dataclass_fields__
    if plan["prediction"]["val_loss"] is not None:  # a run trained from it sets its loss beside the prediction
        raw["prediction"] = {key: value for key, value in plan["prediction"].items() if key in fields}
    load_run_config(raw)
    write_atomic(path, yaml.safe_dump(raw, sort_keys=False))


def named_model_lines(cfg: RunConfig, planned: dict, source: dict) -> list[str]:
    """For a model the user names (`burnout plan CONFIG --ladder L`, or the published fits): its predicted loss, what
    twice the tokens and the compute-optimal shape for the same FLOPs would buy, each at its cost."""
    n, fpt = planned["params"], planned["flops_per_token"]
    d = sum(p["tokens"] for p in planned["phases"])
    dollars = sum(p["dollars"] or 0 for p in planned["phases"]) if planned["price_per_hour"] is not None else None
    hours = sum(p["hours"] for p in planned["phases"])

    def cost(k: int) -> str:
        return f"{k * hours:.3g} h" + (f", ${k * dollars:,.2f}" if dollars is not None else "")

    said = prediction_words(predict_loss(source, n, d))
    lines = [f"predicted val loss of {format_count(n)} parameters × {format_count(d)} tokens ({d / n:.1f} per "
             f"parameter; about {CHINCHILLA_TOKENS_PER_PARAM} is compute-optimal): {said}",
             f"  twice the tokens ({format_count(2 * d)}, {cost(2)}): "
             f"{_loss(predict_loss(source, n, 2 * d))}"]
    seq_len, tokens_per_step = planned["seq_len"], planned["tokens_per_step"]
    try:
        best = choose_shape(source["law"], d * fpt, cfg.model.vocab_size, seq_len, tokens_per_step, "the same FLOPs",
                            source["train_tokens"])
    except BurnoutError:  # too few FLOPs for MIN_STEPS of any shape: nothing to compare with
        return lines
    lines.append(f"  the compute-optimal shape for the same FLOPs ({cost(1)}): {best['model'].n_layer} layers × "
                 f"{best['model'].d_model} wide{' (' + best['preset'] + ')' if best['preset'] else ''}, "
                 f"{format_count(best['params'])} parameters × {format_count(best['tokens'])} tokens: "
                 f"{_loss(predict_loss(source, best['params'], round(best['tokens'])))}")
    if source["kind"] == "ladder" and cfg.model.vocab_size != source["vocab"]:
        lines.append(f"  warning: the ladder's vocabulary ({source['vocab']:,}) is not this model's "
                     f"({cfg.model.vocab_size:,}): {scaling.TRANSFER_WARNING}")
    return lines


def _loss(p: dict) -> str:
    """A prediction's central figure, or 'none' where the published fits do not reach."""
    return "none (outside the published fits' range)" if p["val_loss"] is None else f"{p['val_loss']:.3f}"
