"""A speedrun's report card (`burnout speedrun`, `burnout report DIR`): DIR/report.md and DIR/report.html, made from
the speedrun folder's own files alone, so that writing it again gives the same card.

    DIR/plan.json            the budget, each stage's share, the pretraining plan (model, steps, predicted loss,
                             memory) and SFT's steps
    DIR/stages/NAME.json     a finished stage's marker: its seconds, the process's peak memory by its end
    DIR/data/meta.json       the tokens prepared; DIR/audit/audit.json the data audit
    DIR/pretrain, sft, rl    run folders: config.yaml, metrics.jsonl (losses, samples, elapsed_s), eval/, launches
"""

from __future__ import annotations

import json
from pathlib import Path

from burnout.base.files import COMPARE_JSON
from burnout.base.folders import folder_owner
from burnout.base.text import first_line, format_count
from burnout.data.shards import read_meta
from burnout.errors import BurnoutError
from burnout.eval.references import REFERENCES_FILE, reference_table
from burnout.forensics.audit_summary import summary as audit_summary
from burnout.generate.sampling import shown
from burnout.report.render import Block, write_blocks
from burnout.report.runlog import RunLog, load_run
from burnout.train.optimal import prediction_words

PLAN_FILE = "plan.json"
STAGES_DIR = "stages"
STAGES = ("data", "pretrain", "sft", "rl", "eval", "export")
TRAINING = ("pretrain", "sft", "rl")
AUDIT_DIR, HF_DIR, GGUF_FILE = "audit", "hf", "model.gguf"
# The data stage audits a corpus of at most this many train tokens (the audit reads every one; on a 2-core CPU the
# offline corpus's 0.75M took seconds); a larger one's audit is left to `burnout data audit`, as the card says.
AUDIT_MAX_TOKENS = 20_000_000


def is_speedrun(folder: str | Path) -> bool:
    """Whether `folder` is a speedrun's (its owner record says so), for `burnout report DIR`."""
    owner = folder_owner(folder)
    return owner is not None and owner["kind"] == "speedrun"


def read_plan(out: str | Path) -> dict:
    """DIR/plan.json, or one line saying it cannot be read (cut short or edited) and what to do."""
    path = Path(out) / PLAN_FILE
    try:
        plan = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise BurnoutError(f"{path}: cannot be read ({first_line(exc)}); a speedrun's plan is written whole, so it "
                           "was edited or damaged: start the speedrun again in a new --out folder") from None
    if not isinstance(plan, dict) or not {"command", "budget", "stages"} <= plan.keys():
        raise BurnoutError(f"{path}: not a speedrun's plan (no command, budget and stages); give a speedrun's --out")
    return plan


def finished_stage(out: str | Path, name: str) -> dict | None:
    """A stage's marker (its seconds, memory), or None where the stage has not finished."""
    try:
        return json.loads((Path(out) / STAGES_DIR / f"{name}.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def write_card(out: str | Path) -> list[Path]:
    """DIR/report.md (first) and DIR/report.html from the speedrun folder's files."""
    out = Path(out)
    plan = read_plan(out)
    runs = {name: _run(out, name) for name in TRAINING}
    blocks = [Block("p", f"Speedrun folder `{out}`. Every number below comes from its plan.json, stages/ and the "
                         "files of its folders (data/, audit/, and the runs' config.yaml, metrics.jsonl and eval/); "
                         f"`burnout report {out}` writes this card again."),
              Block("h2", "Stages"), stage_table(out, plan, runs),
              *score_blocks(runs),
              Block("h2", "Predicted against achieved"), prediction_table(out, plan, runs),
              *sample_blocks(out, plan), *audit_blocks(out), *machine_blocks(runs)]
    return write_blocks(out, f"Speedrun: {plan['budget']['words']}", blocks)


def _run(out: Path, name: str) -> RunLog | str | None:
    """The stage's run as the report reads it; a line where it cannot be read yet; None where it has not started."""
    if not (out / name / "metrics.jsonl").is_file():
        return None
    try:
        return load_run(out / name)
    except BurnoutError as exc:
        return str(exc)


def _minutes(out: Path, name: str, run) -> float | None:
    """A training stage's minutes from its run's elapsed_s (every session); another stage's from its marker."""
    if isinstance(run, RunLog):
        return run.last["elapsed_s"] / 60
    marker = finished_stage(out, name)
    return marker["seconds"] / 60 if marker else None


def stage_table(out: Path, plan: dict, runs: dict) -> Block:
    """A row per stage: whether it finished, its planned and spent minutes (and dollars), its tokens and loss."""
    price = plan["command"]["price_per_hour"]
    columns = ["stage", "status", "planned min", "minutes", *(["planned $", "$"] if price else []), "tokens", "loss"]
    rows = []
    for name in STAGES:
        share, run = plan["stages"][name], runs.get(name)
        status = ("skipped: " + share["skipped"] if share["skipped"] else
                  "done" if finished_stage(out, name) else "unfinished" + (f" ({run})" if isinstance(run, str) else ""))
        minutes = None if share["skipped"] else _minutes(out, name, run)
        row = [name, status, share["minutes"], minutes]
        if price:
            row += [share["minutes"] / 60 * price, None if minutes is None else minutes / 60 * price]
        rows.append([*row, _tokens(out, name, run), _loss(name, run)])
    return Block("table", columns=columns, rows=rows)


def _tokens(out: Path, name: str, run) -> int | None:
    if name == "data" and (out / "data" / "meta.json").is_file():
        return read_meta(out / "data")["splits"]["train"]["tokens"]
    return run.last["tokens"] if isinstance(run, RunLog) else None


def _loss(name: str, run) -> str | None:
    """Pretraining's and SFT's final val loss (SFT's over assistant tokens); RL's held-out pass@1, first to last."""
    if not isinstance(run, RunLog):
        return None
    if name == "rl":
        rates = run.series("val_pass@1")[2]
        return f"held-out pass@1 {rates[0]:.4f} → {rates[-1]:.4f}" if rates else None
    value = run.last_value("val_loss")
    return None if value is None else f"val {value:.4f}" + (" (assistant tokens)" if name == "sft" else "")


def score_blocks(runs: dict) -> list[Block]:
    """The pretrained model's latest eval (val bits per byte, each benchmark's accuracy beside its chance level),
    RL's held-out pass@1 (chance: 0), and the published scores of public models on the same tasks."""
    rows, tasks = [], []
    pretrain = runs.get("pretrain")
    if isinstance(pretrain, RunLog) and pretrain.evals:
        latest = max((r for _, r in pretrain.evals if isinstance(r.get("tasks"), dict)),
                     key=lambda r: r.get("step") or 0, default=None)
        for task, metrics in (latest or {}).get("tasks", {}).items():
            tasks.append(task)
            for metric in ("bits_per_byte", "loss", "acc", "acc_norm", "perplexity"):
                if metric in metrics:
                    chance = metrics.get("chance") if metric in ("acc", "acc_norm") else None
                    items = metrics.get("examples", metrics.get("tokens"))
                    rows.append(["pretrain", task, metric, metrics[metric], chance, items])
    rl = runs.get("rl")
    if isinstance(rl, RunLog) and rl.series("val_pass@1")[2]:
        rows.append(["rl", f"held-out questions ({rl.config['rl']['reward']} reward)", "pass@1",
                     rl.series("val_pass@1")[2][-1], 0.0, None])
    if not rows:
        return [Block("h2", "Scores"), Block("p", "No evaluation yet: the eval stage has not finished.")]
    blocks = [Block("h2", "Scores"),
              Block("table", columns=["model", "task", "metric", "score", "chance", "items (val: tokens)"], rows=rows)]
    published = reference_table(tasks)
    if published:
        blocks += [Block("p", f"Published scores at comparable sizes ({REFERENCES_FILE.name}, each with its source):"),
                   Block("markdown", published)]
    return blocks


def prediction_table(out: Path, plan: dict, runs: dict) -> Block:
    """The plan's predictions beside what happened: pretraining's val loss, its minutes, the whole budget's minutes
    (and dollars), and the memory planned against the process's peak."""
    rows = []
    pretrain, planned = runs.get("pretrain"), plan.get("pretrain")
    if planned:
        final = pretrain.last_value("val_loss") if isinstance(pretrain, RunLog) else None
        rows.append(["pretraining val loss", prediction_words(planned["prediction"]), final])
        rows.append(["pretraining minutes", f"{planned['minutes']:.2f} ({planned['steps']:,} steps × "
                                            f"{planned['step_seconds']:.3g} s)",
                     _round(_minutes(out, "pretrain", pretrain))])
        marker = finished_stage(out, "pretrain")
        peak = marker and (marker["cuda_peak_gib"] or marker["peak_rss_gib"])
        what = "GPU memory allocated" if marker and marker["cuda_peak_gib"] else "the process's resident memory"
        rows.append(["pretraining memory, GiB", f"{planned['memory_gib']:.3f} (weights, gradients, optimizer, "
                                                "activations)", f"{peak:.3f} ({what}, the session's peak)"
                     if peak else None])
    spent = [_minutes(out, name, runs.get(name)) for name in STAGES if not plan["stages"][name]["skipped"]]
    total = sum(m for m in spent if m is not None)
    rows.append(["all stages, minutes", f"{plan['budget']['minutes']:.2f}", round(total, 2)])
    price = plan["command"]["price_per_hour"]
    if price:
        rows.append(["all stages, dollars", f"{plan['command']['dollars']:g}", round(total / 60 * price, 4)])
    return Block("table", columns=["", "predicted", "achieved"], rows=rows)


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def sample_blocks(out: Path, plan: dict) -> list[Block]:
    """The samples of the eval stage: each run's compare.json (`burnout compare`'s prompts at its last checkpoint,
    and a fine-tune's base), or why there are none."""
    rows = []
    for name in TRAINING:
        path = out / name / COMPARE_JSON
        if plan["stages"][name]["skipped"] or not path.is_file():
            continue
        found = json.loads(path.read_text(encoding="utf-8"))
        rows += [[name, f"{row['checkpoint']}{' (chat)' if row['chat'] else ''}", prompt, shown(answer)]
                 for row in found["rows"] for prompt, answer in zip(found["prompts"], row["continuations"])
                 if not (name == "sft" and row["checkpoint"] == "base")]  # the pretrained model's rows say these
    if not rows:
        return [Block("h2", "Samples"), Block("p", "No samples yet: the eval stage has not finished.")]
    return [Block("h2", "Samples"),
            Block("p", "Each model's answers to `burnout compare`'s prompts (temperature 0.8, top-k 50, seed 0); an "
                       "empty answer is said as such. A chat model answers the prompt as a user message."),
            Block("table", columns=["stage", "model", "prompt", "answer"], rows=rows)]


def audit_blocks(out: Path) -> list[Block]:
    """The data audit's summary (audit.json), or why there is none."""
    path = out / AUDIT_DIR / "audit.json"
    if not path.is_file():
        why = (f"No audit: the data stage audits a corpus of at most {format_count(AUDIT_MAX_TOKENS)} train tokens, "
               "where its package (datasketch, the `data` extra) is installed; "
               f"`burnout data audit {out / 'data'}` makes one.")
        return [Block("h2", "The data"), Block("p", why)]
    report = json.loads(path.read_text(encoding="utf-8"))
    return [Block("h2", "The data"), Block("p", f"From `{path}` (the whole page: audit.html beside it)."),
            Block("list", items=audit_summary(report).splitlines())]


def machine_blocks(runs: dict) -> list[Block]:
    """The device, versions and commit of each training stage's last launch."""
    rows = [[name, launch["device"], launch["versions"].get("torch"), launch["versions"].get("python"),
             launch["versions"].get("burnout"), launch.get("git_commit") or "not a git checkout"]
            for name, run in runs.items() if isinstance(run, RunLog) and run.launches for launch in run.launches[-1:]]
    if not rows:
        return []
    return [Block("h2", "Machine and versions"),
            Block("table", columns=["stage", "device", "torch", "python", "burnout", "git commit"], rows=rows)]
