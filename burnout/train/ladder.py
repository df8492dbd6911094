"""`burnout ladder DATA --out LADDER`: small models of one family trained on the user's prepared data, and the scaling
law fitted to their final losses (train/scaling.py), for `burnout plan --ladder` to predict from.

The family is a depth dial (`dial_shape`): depth k is k layers of 64·k wide with 64-wide heads, a LLaMA (RoPE,
RMSNorm, SwiGLU), tied embeddings; `burnout plan` chooses its larger shapes from the same dial (and the presets).

The design is isoFLOP (Hoffmann et al.'s second approach, whose points serve the third's fit): four sizes (a depth
set), each trained at LEVELS compute levels C0·2^l, D = C / the shape's FLOPs per token. Each rung is a separate run
with its own LR decay to its own end (the training settings of `burnout train --model`, the quickstart's), so its
final loss is a finished run's. The depth set is the largest of DEPTH_SETS whose top level gives its second-largest
size at least CHINCHILLA_TOKENS_PER_PARAM tokens per parameter (so the isoFLOP curves reach the compute-optimal
size), judged at the FLOP rate of the first set, whose step times are measured as the quickstart measures them
(train/probe.py); C0 is then what makes the rungs' measured steps fill the budget. Rungs under MIN_RUNG_STEPS steps
are left out. WSD decay branches would give several token counts from one run per size for less compute; a branch
started from a checkpoint as a new run re-reads its data from the start, so they are not used (docs/USAGE.md, "What
can I train").

Each rung is an ordinary run folder (LADDER/rungs/NAME: report, eval, resume work on it), started as `burnout train`
starts a pretraining run (train/run.py). LADDER/ladder.json holds the design from before the first rung, each finished
rung, then the fit: its law, BOOTSTRAP_SAMPLES laws refitted on resampled rungs, the residuals, and the held-out error
(the top compute level predicted by a fit of the others). Killed at any moment, the same command continues: finished
rungs are kept, a rung mid-way resumes from its newest checkpoint (its own resume), and the design is read back.
"""

from __future__ import annotations

import dataclasses
import functools
import io
import json
import math
from collections.abc import Callable
from pathlib import Path

from burnout.base.files import write_atomic
from burnout.base.folders import check_output_folder, writing_into
from burnout.base.text import format_count, format_duration
from burnout.config import ModelConfig, RunConfig, load_run_config
from burnout.core.checkpoint import holds_run
from burnout.data.mix import data_run_config, preset_train_section
from burnout.data.prepare import CHINCHILLA_TOKENS_PER_PARAM
from burnout.data.shards import data_fingerprint, read_meta
from burnout.errors import BurnoutError
from burnout.models.info import model_info
from burnout.train import scaling
from burnout.train.hardware import hardware_price
from burnout.train.probe import measure_step_seconds
from burnout.train.recipe import Pretraining
from burnout.train.run import resume_run, start_run

LADDER_FILE, PLOT_FILE = "ladder.json", "ladder.png"
DIAL_WIDTH = 64  # d_model per layer, and each head's width
DEPTH_SETS = ((1, 2, 3, 4), (2, 3, 4, 6), (3, 4, 6, 8), (4, 6, 8, 12), (6, 8, 12, 16), (8, 12, 16, 24))
LEVELS = 4  # compute levels, each twice the one below; the top one is held out for the fit's own error
MIN_RUNG_STEPS = 20
SEQ_LEN, SEQS_PER_STEP = 256, 8  # the quickstart's batch: 8 × 256 tokens a step (--seq-len changes the 256)
MAX_EVAL_BATCHES = 64  # the final val loss: the val split's first windows, up to this many batches of them
# Of the budget, the share the rungs' steps plan to fill: the rest is the step probes, each rung's start-up, its final
# evaluation and checkpoints.
STEP_SHARE = 0.8


def dial_shape(depth: int, vocab_size: int, context_length: int) -> ModelConfig:
    """The depth dial's model at `depth`: depth layers × 64·depth wide, 64-wide heads (as many as layers), a LLaMA
    with tied embeddings and its MLP rounded to 64."""
    return ModelConfig(family="llama", vocab_size=vocab_size, n_layer=depth, d_model=DIAL_WIDTH * depth,
                       n_head=depth, n_kv_head=depth, ffn_multiple_of=DIAL_WIDTH, context_length=context_length,
                       tie_embeddings=True).resolved()


SHAPE_KEYS = ("family", "vocab_size", "n_layer", "d_model", "n_head", "n_kv_head", "ffn_hidden", "ffn_multiple_of",
              "context_length", "rope_theta", "tie_embeddings")


def shape_run_config(data_dir: Path | None, model: ModelConfig | str, steps: int, seqs: int, seq_len: int,
                     micro_batch: int | None = None) -> RunConfig:
    """The run config that trains `model` (a shape, or a preset's name) for `steps` steps of `seqs` sequences of
    `seq_len` tokens, with `burnout train --model`'s training settings, on `data_dir` (data_run_config: its vocabulary,
    data and tokenizer sections; None: no data named, the shape's own vocabulary); evaluated at its end on the val
    split's first windows (up to MAX_EVAL_BATCHES batches), no samples."""
    micro = micro_batch or seqs
    sets = [f"train.seq_len={seq_len}", f"train.batch_size={micro}", f"train.grad_accum={seqs // micro}",
            f"train.max_steps={steps}", f"train.eval_interval={steps}", f"train.ckpt_interval={max(1, steps // 4)}",
            "train.keep_last=1", f"train.log_interval={min(10, steps)}", "train.sample_tokens=0",
            f"train.warmup_steps={max(1, min(10, steps // 10))}"]
    shape = [] if isinstance(model, str) else [f"model.{key}={getattr(model, key)}" for key in SHAPE_KEYS]
    if data_dir is None:
        return load_run_config({"model": {"preset": model} if isinstance(model, str) else {},
                                "train": preset_train_section()}, [*shape, *sets])
    val_tokens = read_meta(data_dir)["splits"]["val"]["tokens"]
    sets.append(f"train.eval_batches={max(1, min(MAX_EVAL_BATCHES, val_tokens // (seqs * seq_len)))}")
    if isinstance(model, str):
        return data_run_config(data_dir, model, sets)
    return data_run_config(data_dir, "llama-tiny", [*shape[:1], *shape[2:], *sets])  # the data's vocabulary


@dataclasses.dataclass(frozen=True)
class LadderBudget:
    """What the ladder may spend: `minutes` of this machine (`--dollars` at a GPU's price, converted), in words; and
    its rungs' sequence length (shorter sequences: more steps in a small budget)."""
    minutes: float
    words: str
    seq_len: int = SEQ_LEN


def ladder_budget(minutes: float | None, dollars: float | None, gpu: str | None, price: float | None,
                  seq_len: int = SEQ_LEN) -> LadderBudget:
    """`--minutes M`, or `--dollars X` at `gpu`'s price per hour (hardware.yaml) or `price`: checked in one line."""
    if (minutes is None) == (dollars is None):
        raise BurnoutError("ladder needs one budget: --minutes M (of this machine) or --dollars X with --gpu G")
    if minutes is not None:
        if gpu or price is not None:
            raise BurnoutError("--gpu and --price convert --dollars into time; with --minutes drop them")
        return LadderBudget(minutes, f"{minutes:g} minutes", seq_len)
    if price is None:
        if gpu is None:
            raise BurnoutError("--dollars needs --gpu G (whose price per hour buys the time) or --price P")
        price, what = hardware_price(gpu, None, None)
        if price is None:
            raise BurnoutError(f"--dollars: no price per hour is known for {what}; give --price P")
    minutes = float(f"{dollars / price * 60:.6g}")
    return LadderBudget(minutes, f"${dollars:g} at ${price:.2f}/h ({minutes:g} minutes)", seq_len)


def design(data_dir: Path, budget: LadderBudget, say: Callable[[str], None]) -> dict:
    """The rungs for `budget` (the module's docstring says how), each {name, depth, level, steps, N, D, flops}."""
    meta = read_meta(data_dir)
    vocab, seq_len = meta["vocab_size"], budget.seq_len
    tokens_per_step = SEQS_PER_STEP * seq_len
    seconds = budget.minutes * 60 * STEP_SHARE
    step_s = _measure(data_dir, DEPTH_SETS[0], vocab, seq_len, say)
    rate = max(_info(d, vocab, seq_len)["flops_per_token"] * tokens_per_step / s for d, s in step_s.items())
    chosen = DEPTH_SETS[0]
    for depths in DEPTH_SETS[1:]:
        c0 = _base_compute(depths, {d: _info(d, vocab, seq_len)["flops_per_token"] * tokens_per_step / rate
                                    for d in depths}, vocab, seq_len, seconds)
        top = depths[-2]
        if c0 * 2 ** (LEVELS - 1) / _info(top, vocab, seq_len)["flops_per_token"] < \
                CHINCHILLA_TOKENS_PER_PARAM * _info(top, vocab, seq_len)["params_total"]:
            break
        chosen = depths
    if chosen != DEPTH_SETS[0]:
        step_s = _measure(data_dir, chosen, vocab, seq_len, say)
    c0 = _base_compute(chosen, step_s, vocab, seq_len, seconds)
    rungs, below = [], []
    for level in range(LEVELS):
        for depth in chosen:
            info = _info(depth, vocab, seq_len)
            steps = c0 * 2**level / info["flops_per_token"] / tokens_per_step
            below += [steps] if level < LEVELS - 1 else []
            if steps >= MIN_RUNG_STEPS:
                rungs.append({"name": f"d{depth}-c{level}", "depth": depth, "level": level, "steps": int(steps),
                              "N": info["params_total"], "D": int(steps) * tokens_per_step,
                              "flops": int(steps) * tokens_per_step * info["flops_per_token"],
                              "step_seconds": step_s[depth]})
    held_out = sum(r["level"] == LEVELS - 1 for r in rungs)
    if held_out == 0 or len(rungs) - held_out < 6:
        # Steps grow with the budget: the sixth-longest rung below the top level must reach MIN_RUNG_STEPS.
        least = budget.minutes * MIN_RUNG_STEPS / sorted(below, reverse=True)[5]
        raise BurnoutError(f"{budget.words} is too small for a ladder on {data_dir}: {len(rungs)} rungs reach "
                           f"{MIN_RUNG_STEPS} steps, and the fit needs six below the top level and one at it; give "
                           f"about {math.ceil(least)} minutes or more")
    return {"family": "depth dial (burnout/train/ladder.py: dial_shape)", "depths": list(chosen), "levels": LEVELS,
            "seq_len": seq_len, "seqs_per_step": SEQS_PER_STEP, "vocab_size": vocab, "base_flops": c0,
            "train_tokens": meta["splits"]["train"]["tokens"], "rungs": rungs}


@functools.lru_cache(maxsize=512)
def _info(depth: int, vocab: int, seq_len: int) -> dict:
    """model_info of the dial's shape at `depth` (built on the meta device: no memory, little time)."""
    return model_info(dial_shape(depth, vocab, seq_len), seq_len=seq_len)


def _measure(data_dir: Path, depths: tuple[int, ...], vocab: int, seq_len: int,
             say: Callable[[str], None]) -> dict[int, float]:
    """Each depth's seconds per step, measured as the quickstart measures it (train/probe.py)."""
    found = {}
    for depth in depths:
        cfg = shape_run_config(data_dir, dial_shape(depth, vocab, seq_len), 10, SEQS_PER_STEP, seq_len)
        found[depth] = measure_step_seconds(cfg, data_dir)
        say(f"measured depth {depth} ({format_count(_info(depth, vocab, seq_len)['params_total'])} parameters): "
            f"{found[depth]:.3g} s/step")
    return found


def _base_compute(depths, step_s: dict[int, float], vocab: int, seq_len: int, seconds: float) -> float:
    """C0, the lowest level's FLOPs, such that every rung's steps at `step_s` fill `seconds`."""
    tokens_per_step = SEQS_PER_STEP * seq_len
    per_c0 = sum(2**level * step_s[d] / (_info(d, vocab, seq_len)["flops_per_token"] * tokens_per_step)
                 for level in range(LEVELS) for d in depths)
    return seconds / per_c0


def run_ladder(data_dir: str | Path, out: str | Path, budget: LadderBudget, say: Callable[[str], None] = print,
               samples: int = scaling.BOOTSTRAP_SAMPLES) -> dict:
    """Train the ladder's rungs into `out` (continuing one that was stopped), fit the law, write ladder.json; the
    ladder's record. `out` is new, empty, or this command's for the same data and budget."""
    data_dir, out = Path(data_dir).absolute(), Path(out)
    read_meta(data_dir)  # a folder that is not prepared data is refused before anything is written
    check_output_folder(out, "--out", "ladder", str(data_dir), reads=[data_dir])
    with writing_into(out, "ladder", str(data_dir), lock=True):
        ladder = _read_or_design(out, data_dir, budget, say)
        for rung in ladder["design"]["rungs"]:
            if rung["name"] not in ladder["done"]:
                ladder["done"][rung["name"]] = _train_rung(out, data_dir, ladder["design"], rung, say)
                write_atomic(out / LADDER_FILE, json.dumps(ladder, indent=1) + "\n")
        ladder["fit"] = fit_ladder(ladder, samples)
        write_atomic(out / LADDER_FILE, json.dumps(ladder, indent=1) + "\n")
        write_atomic(out / PLOT_FILE, ladder_figure(ladder))
    return ladder


def _read_or_design(out: Path, data_dir: Path, budget: LadderBudget, say: Callable[[str], None]) -> dict:
    """The ladder `out` holds (refused when of other data or another budget), else a new design, written at once."""
    path, fingerprint = out / LADDER_FILE, data_fingerprint(data_dir)
    if path.is_file():
        ladder = json.loads(path.read_text(encoding="utf-8"))
        if ladder["data_fingerprint"] != fingerprint or ladder["budget"] != dataclasses.asdict(budget):
            raise BurnoutError(f"--out {out} holds a ladder of {ladder['budget']['words']} at --seq-len "
                               f"{ladder['budget']['seq_len']} on data {ladder['data']}; the same command continues "
                               "it, another ladder needs another --out")
        say(f"continuing the ladder in {out}: {len(ladder['done'])} of {len(ladder['design']['rungs'])} rungs done")
        return ladder
    say(f"designing a ladder for {budget.words} on {data_dir}")
    ladder = {"data": str(data_dir), "data_fingerprint": fingerprint, "budget": dataclasses.asdict(budget),
              "design": design(data_dir, budget, say), "done": {}}
    rungs, have = ladder["design"]["rungs"], ladder["design"]["train_tokens"]
    say(f"{len(rungs)} rungs, depths {ladder['design']['depths']} at {LEVELS} compute levels, about "
        f"{format_duration(sum(r['steps'] * r['step_seconds'] for r in rungs))} of steps; the longest reads "
        f"{format_count(max(r['D'] for r in rungs))} tokens, {max(r['D'] for r in rungs) / have:.1f} passes over the "
        f"{format_count(have)} train tokens")
    write_atomic(path, json.dumps(ladder, indent=1) + "\n")
    return ladder


def _train_rung(out: Path, data_dir: Path, design_: dict, rung: dict, say: Callable[[str], None]) -> dict:
    """Train one rung (resumed when its folder holds a run already) and return its record."""
    run_dir = out / "rungs" / rung["name"]
    say(f"rung {rung['name']}: {format_count(rung['N'])} parameters, {format_count(rung['D'])} tokens "
        f"({rung['steps']:,} steps) → {run_dir}")
    if holds_run(run_dir):
        result = resume_run(run_dir, lambda cfg: Pretraining(), on_event=lambda line: None, progress=False)
    else:
        model = dial_shape(rung["depth"], design_["vocab_size"], design_["seq_len"])
        cfg = shape_run_config(data_dir, model, rung["steps"], design_["seqs_per_step"], design_["seq_len"])
        result = start_run(cfg, run_dir, Pretraining(), data_dir, on_event=lambda line: None, progress=False)
    if result.stop_reason != "done":  # stopped by a signal, its checkpoint saved: the same command continues it
        say(f"rung {rung['name']} stopped at step {result.step:,}; run the same command again to continue the ladder")
        raise KeyboardInterrupt
    say(f"rung {rung['name']}: val loss {result.val_loss:.4f} in {format_duration(result.elapsed_s)}")
    # No timings here: the same rungs give the same ladder.json, however often it was stopped (each run keeps its own).
    return {"val_loss": result.val_loss, "run": str(run_dir.relative_to(out))}


def fit_ladder(ladder: dict, samples: int = scaling.BOOTSTRAP_SAMPLES) -> dict:
    """The law fitted to every rung, its bootstrap, its residuals, and the held-out error of the top level."""
    rungs = ladder["design"]["rungs"]
    n, read, flops = ([r[key] for r in rungs] for key in ("N", "D", "flops"))
    d = scaling.fresh_tokens(read, ladder["design"]["train_tokens"])  # a rung that repeats its data learns less
    loss = [ladder["done"][r["name"]]["val_loss"] for r in rungs]
    law = scaling.fit(n, d, loss, label=f"fitted to {len(rungs)} rungs")
    held_out = sum(r["level"] == ladder["design"]["levels"] - 1 for r in rungs)
    return {"law": law.to_dict(), "residuals": scaling.log_residuals(law, n, d, loss).tolist(),
            "bootstrap": [s.to_dict() for s in scaling.bootstrap(n, d, loss, samples=samples, start=law)],
            "held_out": scaling.held_out_error(n, d, loss, flops, held_out)}


def read_ladder(path: str | Path, label: str = "--ladder") -> dict:
    """A finished ladder (LADDER or LADDER/ladder.json), refused in one line (naming it as `label`) when absent,
    unreadable or not yet fitted."""
    path = Path(path)
    path = path / LADDER_FILE if path.is_dir() else path
    try:
        ladder = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        why = getattr(exc, "strerror", None) or "not JSON"
        raise BurnoutError(f"{label} {path}: no ladder there ({why}); give the --out of `burnout ladder`") from None
    if not isinstance(ladder, dict) or not isinstance(ladder.get("fit"), dict):
        raise BurnoutError(f"{label} {path}: not a finished ladder (no fit in it); run its `burnout ladder` command "
                           "again to continue it")
    return ladder


def format_ladder(ladder: dict) -> str:
    """Every rung, the law, the held-out error: what `burnout ladder` prints at its end."""
    design_, fit = ladder["design"], ladder["fit"]
    lines = [f"{'rung':<8}{'params':>9}{'tokens':>9}{'FLOPs':>10}{'val loss':>10}{'fit':>9}"]
    law = scaling.ScalingLaw.from_dict(fit["law"])
    for r in design_["rungs"]:
        loss = ladder["done"][r["name"]]["val_loss"]
        lines.append(f"{r['name']:<8}{format_count(r['N']):>9}{format_count(r['D']):>9}{r['flops']:>10.2e}"
                     f"{loss:>10.4f}{float(law.loss(r['N'], r['D'], design_['train_tokens'])):>9.4f}")
    held = fit["held_out"]
    lines += [f"law: L(N, D) = {law.E:.3f} + {law.A:.4g}/N^{law.alpha:.3f} + {law.B:.4g}/D^{law.beta:.3f} "
              f"(N parameters, D tokens; {len(fit['bootstrap'])} bootstrap refits)",
              f"held out: the top compute level predicted by a fit of the others: mean |error| "
              f"{held['mean_abs_error']:.2%} ("
              + ", ".join(f"{design_['rungs'][r['index']]['name']} {r['error']:+.2%}" for r in held["held_out"]) + ")"]
    return "\n".join(lines)


FRONTIER_DEPTHS = range(1, 97)  # the dial's shapes the frontier is the least of


def frontier(ladder: dict, flops) -> list[float]:
    """The fitted law's least loss at each compute in `flops` over the dial's shapes (FRONTIER_DEPTHS), each shape at
    the tokens its own FLOPs per token buy: the compute-optimal frontier `burnout plan` chooses from."""
    design_, law = ladder["design"], scaling.ScalingLaw.from_dict(ladder["fit"]["law"])
    infos = [_info(d, design_["vocab_size"], design_["seq_len"]) for d in FRONTIER_DEPTHS]
    return [min(float(law.loss(i["params_total"], c / i["flops_per_token"], design_["train_tokens"])) for i in infos)
            for c in flops]


def ladder_figure(ladder: dict, point: dict | None = None) -> bytes:
    """PNG: each rung's final val loss against its compute, the law along each size, the fitted frontier; with
    `point` ({flops, val_loss, predicted, low, high, label}), a run's prediction with its interval and its result."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    design_, law = ladder["design"], scaling.ScalingLaw.from_dict(ladder["fit"]["law"])
    rungs = design_["rungs"]
    most = max([r["flops"] for r in rungs] + ([point["flops"]] if point else []))
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=100)
    for depth in design_["depths"]:
        mine = [r for r in rungs if r["depth"] == depth]
        info = _info(depth, design_["vocab_size"], design_["seq_len"])
        dots, = ax.plot([r["flops"] for r in mine], [ladder["done"][r["name"]]["val_loss"] for r in mine], "o",
                        label=f"depth {depth}, {format_count(info['params_total'])} params")
        along = np.geomspace(min(r["flops"] for r in mine) / 2, most * 2, 60)
        ax.plot(along, law.loss(info["params_total"], along / info["flops_per_token"], design_["train_tokens"]), "-",
                alpha=0.35, color=dots.get_color())
    span = np.geomspace(min(r["flops"] for r in rungs) / 2, most * 2, 80)
    ax.plot(span, frontier(ladder, span), "k--", label="fitted frontier (compute-optimal size)")
    if point:
        ax.errorbar([point["flops"]], [point["predicted"]], yerr=[[point["predicted"] - point["low"]],
                                                                   [point["high"] - point["predicted"]]],
                    fmt="s", color="red", capsize=4, label=f"{point['label']}: predicted, with its interval")
        if point.get("val_loss") is not None:
            ax.plot([point["flops"]], [point["val_loss"]], "*", color="red", markersize=14,
                    label=f"{point['label']}: final val loss")
    ax.set_xscale("log")
    ax.set_xlabel("training FLOPs")
    ax.set_ylabel("final val loss")
    ax.set_title("scaling ladder: loss against compute")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()
