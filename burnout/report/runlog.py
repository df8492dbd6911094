"""Everything a report shows, read from a run folder's own files: nothing is recomputed from weights.

    RUN/config.yaml        the resolved config → model summary, FLOPs/token, config hash
    RUN/metrics.jsonl      losses, LR, throughput (and `mfu`, `dollars` when the loop logs them)
    RUN/phases.jsonl       each finished phase's summary: budget, and the next phase's predicted cost
    RUN/checkpoints/*/info.json   the kept checkpoints
    RUN/eval/*.json        evaluation results, one file per evaluation
    RUN/compare.md         the samples-per-checkpoint table from `burnout compare`
    RUN/launches.jsonl     each start and resume: command line, git commit, versions, device; a continued run's
                           lineage (train.init_from), whose parent's metrics.jsonl gives the curve before it
"""

from __future__ import annotations

import hashlib
import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from burnout.base.files import COMPARE_MD, METRICS_FILE, PHASES_FILE, RUN_CONFIG_FILE, numbered_jsonl, read_jsonl
from burnout.base.values import is_finite_number, kind_of
from burnout.config import TrainConfig, load_run_config
from burnout.core.checkpoint import checkpoint_info, list_checkpoints
from burnout.errors import BurnoutError
from burnout.eval.evaluate import eval_records
from burnout.models.info import model_info
from burnout.train.provenance import lineage_of, read_launches

# A logged tokens/s below this share of the run's median is reported as a throughput drop.
THROUGHPUT_DROP = 0.5
# Val loss this many nats above train loss (held-out text given e ≈ 2.7 times less probability per token than the
# training text), with train loss under half of val's, is reported as memorising (docs/USAGE.md, "Your own text").
MEMORISING_GAP = 1.0
# A last val loss this many nats above where the run started (a hundredth of a nat: 1% in perplexity) is reported as
# a run that ended worse than it started; a smaller difference is no change worth a line.
WORSE_THAN_START = 0.01


@dataclass
class RunLog:
    path: Path
    name: str
    config: dict  # config.yaml as written, for display
    config_hash: str
    train: TrainConfig  # its train section as read (either layout: config.regroup_train)
    model: dict  # models.info.model_info of the run's model at its training sequence length
    records: list[dict]
    checkpoints: list[dict]  # info.json of each kept checkpoint, plus its folder name
    evals: list[tuple[str, dict]] = field(default_factory=list)  # (file stem, parsed JSON)
    compare_md: str | None = None
    phases: list[dict] = field(default_factory=list)  # RUN/phases.jsonl: a summary at each phase's end
    launches: list[dict] = field(default_factory=list)  # RUN/launches.jsonl: each start and resume
    left_out: list[str] = field(default_factory=list)  # a line for each record or file the report cannot use
    lineage: dict | None = None  # a continued run's: what its step 0 was (train/provenance.py: lineage_of)
    parent_records: list[dict] = field(default_factory=list)  # the parent's logged steps up to that checkpoint

    def series(self, key: str) -> tuple[list[int], list[int], list[float]]:
        """(steps, tokens, values) of the records that logged a finite `key`."""
        rows = [r for r in self.records if is_finite_number(r.get(key))]
        return [r["step"] for r in rows], [r["tokens"] for r in rows], [r[key] for r in rows]

    @property
    def last(self) -> dict:
        return self.records[-1]

    def last_value(self, key: str) -> float | None:
        values = self.series(key)[2]
        return values[-1] if values else None


def load_run(path: str | Path) -> RunLog:
    path = Path(path)
    config_path = path / RUN_CONFIG_FILE
    if config_path.is_file() and list_checkpoints(path) and not (path / METRICS_FILE).exists():
        raise BurnoutError(f"'{path}' holds a start point that nothing has trained yet (no {METRICS_FILE}: a model "
                           f"from `burnout grow`); train it (burnout train --init-from {path} --out NEW_RUN) and "
                           "report that run")
    if not config_path.is_file() or not (path / METRICS_FILE).is_file():
        raise BurnoutError(f"'{path}' is not a run folder (no config.yaml and metrics.jsonl); give the --out of "
                           "`burnout train` or `burnout quickstart`")
    records, left_out = step_records(path / METRICS_FILE)
    if not records:
        if left_out:
            raise BurnoutError(f"{left_out[0]}, and no record of {path / METRICS_FILE} can be read; it was not "
                               "written by `burnout train`, or was edited: restore it from train.mirror_dir")
        raise BurnoutError(f"{path / METRICS_FILE} is empty: the run logged no step yet; train longer, then report")
    left_out += _impossible_mfu(records, path / METRICS_FILE)
    raw_config = yaml.safe_load(config_path.read_text())
    cfg = load_run_config(config_path)
    model = model_info(cfg.model, batch_size=cfg.train.batch_size, seq_len=cfg.train.seq_len,
                       precision="fp32" if cfg.train.precision == "fp32" else "bf16")
    # Hash of the parsed config, so that formatting and key order do not change it.
    config_hash = hashlib.sha256(json.dumps(raw_config, sort_keys=True).encode()).hexdigest()[:12]
    checkpoints, evals = _checkpoints_and_evals(path, left_out)
    compare = path / COMPARE_MD
    phases = read_jsonl(path / PHASES_FILE)
    lineage = lineage_of(path)
    return RunLog(path=path, name=path.resolve().name, config=raw_config, config_hash=config_hash, train=cfg.train,
                  model=model, records=records, checkpoints=checkpoints, evals=evals,
                  compare_md=compare.read_text() if compare.is_file() else None, phases=phases,
                  launches=read_launches(path), left_out=left_out, lineage=lineage,
                  parent_records=parent_records(lineage))


def parent_records(lineage: dict | None) -> list[dict]:
    """A continued run's parent's logged steps up to the checkpoint it started from; [] for a run that started
    afresh, or where the parent's metrics.jsonl is not there (moved, or a start point `burnout grow` wrote)."""
    if lineage is None or not (Path(lineage["parent_run"]) / METRICS_FILE).is_file():
        return []
    records, _ = step_records(Path(lineage["parent_run"]) / METRICS_FILE)
    return [record for record in records if record["step"] <= lineage["parent_step"]]


def _checkpoints_and_evals(path: Path, left_out: list[str]) -> tuple[list[dict], list[tuple[str, dict]]]:
    """The info.json of each kept checkpoint (with its folder's name) and each eval/*.json, as read; a file cut short
    or not burnout's is left out of the report, said in `left_out`, rather than failing it."""
    checkpoints = []
    for checkpoint in list_checkpoints(path):
        try:
            checkpoints.append({"name": checkpoint.name, **checkpoint_info(checkpoint)})
        except BurnoutError as exc:
            left_out.append(f"{exc}; the report leaves it out")
    found, unreadable = eval_records(path, "*.json")  # burnout eval's, lm-eval's (harness_*), the summary
    left_out += unreadable
    return checkpoints, [(file.stem, record) for file, record in found]


def step_records(path: Path) -> tuple[list[dict], list[str]]:
    """The step records of a metrics.jsonl, and a line naming each record left out (its file, line and what is
    wrong): one without a whole-number step and numeric tokens and elapsed_s, which every step the loop logs has
    (a hand edit, another program's line). Torn lines are skipped, as every reader of the log skips them."""
    records, left_out = [], []
    for number, record in numbered_jsonl(path):
        problem = _step_record_problem(record)
        if problem is None:
            records.append(record)
        else:
            left_out.append(f"{path} line {number} is left out: {problem}")
    return records, left_out


def _impossible_mfu(records: list[dict], path: Path) -> list[str]:
    """Drop each logged MFU above 1 (burnout logged them before it kept a CPU's best peak, over a peak measured while
    the machine was busy): a line saying how many, or none."""
    impossible = [record for record in records if is_finite_number(record.get("mfu")) and record["mfu"] > 1]
    for record in impossible:
        del record["mfu"]
    return [f"{path}: the MFU of {len(impossible)} records is left out: above 100%, it was logged over a CPU peak "
            "measured while the machine was busy"] if impossible else []


def _step_record_problem(record) -> str | None:
    if not isinstance(record, dict):
        return f"it is {kind_of(record)}, not a record"
    step = record.get("step")
    if not isinstance(step, int) or isinstance(step, bool):
        return f'its "step" is {step!r}, not a whole number'
    for key in ("tokens", "elapsed_s"):
        if not is_finite_number(record.get(key)):
            return f'its "{key}" is {record.get(key)!r}, not a number'
    return None


def phase_rows(run: RunLog) -> list[dict]:
    """One row per finished phase (RUN/phases.jsonl), then one for steps logged after the last of them;
    a run without phases is one row, "all"."""
    ends = list({p["phase"]: p for p in run.phases}.values())  # a phase summarised again after a resume: the last
    rows, prev, forecast = [], RUN_START, None
    if not ends:
        ends.append({"phase": "all", "step": run.last["step"]})
    elif ends[-1]["step"] < run.last["step"]:
        upcoming = (ends[-1].get("next") or {}).get("phase", "next phase")
        ends.append({"phase": upcoming, "step": run.last["step"], "in_progress": True})
    for summary in ends:
        records = [r for r in run.records if prev["step"] < r["step"] <= summary["step"]]
        if not records:
            continue
        last = records[-1]
        row = {"phase": summary["phase"] + (" (in progress)" if summary.get("in_progress") else ""),
               "steps": f"{prev['step']}–{last['step']}", **throughput(records, prev),
               "train_loss": _last_finite(records, "train_loss"), "val_loss": _last_finite(records, "val_loss")}
        if is_finite_number(last.get("dollars")):
            row["dollars"] = last["dollars"] - (prev.get("dollars") or 0.0)
        if is_finite_number(summary.get("budget")):
            row["budget"] = summary["budget"]
        # The previous phase's end predicted this phase's cost at its pace.
        if (forecast and forecast.get("phase") == summary["phase"]
                and is_finite_number(forecast.get("dollars_estimate"))):
            row["dollars_predicted"] = forecast["dollars_estimate"]
        rows.append(row)
        prev, forecast = last, summary.get("next")
    return rows


# Where a run's throughput is counted from: its first step.
RUN_START = {"step": 0, "tokens": 0, "elapsed_s": 0.0}


def throughput(records: list[dict], before: dict = RUN_START) -> dict:
    """The tokens, time and speed of the steps of `records`, which follow the record `before` (or the run's start):
    tokens/s is tokens over their wall time, evaluation, samples and checkpoints included (the rate training's last
    line gives, and the one figure the report shows), and MFU is the mean of the MFU logged over them (each over a
    log window's steps alone, as the log's lines show it)."""
    last = records[-1]
    seconds, tokens = last["elapsed_s"] - before["elapsed_s"], last["tokens"] - before["tokens"]
    speed = {"tokens": tokens, "time_s": seconds, "tokens_per_s": tokens / seconds if seconds > 0 else None}
    mfu = [r["mfu"] for r in records if is_finite_number(r.get("mfu"))]
    return {**speed, "mfu": statistics.fmean(mfu)} if mfu else speed


def anomalies(run: RunLog) -> list[str]:
    """Lines for what went wrong during the run, as its log shows it (and the records of it left out)."""
    found = list(run.left_out)
    for prev, record in zip([None, *run.records], run.records):
        step = record["step"]
        if "train_loss" in record and not is_finite_number(record["train_loss"]):
            found.append(f"step {step}: train loss is not finite")
        for key, value in record.items():
            # The loop counts skipped non-finite steps; any positive counter is worth a line.
            if "nan" in key.lower() and isinstance(value, (int, float)) and value > 0 and not isinstance(value, bool):
                if prev is None or prev.get(key) != value:
                    found.append(f"step {step}: {key} = {value}")
    # The first logged window carries one-time warm-up (allocations, kernel selection): not a drop.
    steps, _, speeds = (values[1:] for values in run.series("tokens_per_s"))
    if len(speeds) >= 3:
        median = statistics.median(speeds)
        found += [f"step {s}: throughput {v:,.0f} tokens/s, under {THROUGHPUT_DROP:.0%} of the median {median:,.0f}"
                  for s, v in zip(steps, speeds) if v < THROUGHPUT_DROP * median]
    return found + _val_loss_anomalies(run) + _ended_worse(run)


def _ended_worse(run: RunLog) -> list[str]:
    """A line for a run whose last val loss is above where it started (started_from): training it undid what it
    started with. A continued run re-warmed to its parent's peak LR with a fresh optimizer did this (docs/USAGE.md,
    "Continued pretraining")."""
    evaluated = [r for r in run.records if is_finite_number(r.get("val_loss"))]
    start = started_from(run)
    if not evaluated or start is None:
        return []
    last, (loss, where) = evaluated[-1], start
    if last["val_loss"] <= loss + WORSE_THAN_START:
        return []
    line = (f"step {last['step']}: val loss {last['val_loss']:.4f} ends above {loss:.4f}, {where}: the run ended "
            "worse than it started")
    if run.lineage is not None:
        line += ("; a continued run that re-warms to a peak LR as high as its parent's, with a fresh optimizer, undoes "
                 "what its parent learned: give it a lower train.lr (docs/USAGE.md, \"Continued pretraining\")")
    return [line]


def started_from(run: RunLog) -> tuple[float, str] | None:
    """Where a run's val loss started, and what that figure is: for a continued run on its parent's data, the val loss
    of the model it started from (parent_val_loss); else its own first evaluation, when it logged a later one."""
    lineage = run.lineage
    if lineage is not None and _same_folder(lineage.get("parent_data"), lineage.get("data")):
        parent = parent_val_loss(lineage)
        if parent is not None:
            return parent
    evaluated = [r for r in run.records if is_finite_number(r.get("val_loss"))]
    if len(evaluated) < 2:
        return None
    return evaluated[0]["val_loss"], f"its first, at step {evaluated[0]['step']}"


def parent_val_loss(lineage: dict) -> tuple[float, str] | None:
    """The val loss of the checkpoint a continued run started from, measured on that checkpoint's own weights (its
    info.json, else its run's log at its step), and what it is; for a start point `burnout grow` wrote, which holds
    none, that of the checkpoint it was grown from, whose outputs it has. None where neither is found."""
    checkpoint, run_dir, step = Path(lineage["init_from"]), Path(lineage["parent_run"]), lineage["parent_step"]
    what = f"that of {checkpoint}, the model it started from"
    for _ in range(2):
        info = _json_file(checkpoint / "info.json")
        if is_finite_number(info.get("val_loss")) and info.get("val_step") == step:
            return info["val_loss"], what
        logged = [r for r in step_records(run_dir / METRICS_FILE)[0] if r["step"] == step
                  and is_finite_number(r.get("val_loss"))] if (run_dir / METRICS_FILE).is_file() else []
        if logged:
            return logged[-1]["val_loss"], what
        grown = info.get("grown_from")
        if not isinstance(grown, dict) or not isinstance(grown.get("checkpoint"), str):
            return None
        what = f"that of {grown['checkpoint']}, which the model it started from was grown from (the same outputs)"
        checkpoint, step = Path(grown["checkpoint"]), grown.get("step")
        run_dir = Path(grown["run"]) if isinstance(grown.get("run"), str) else checkpoint
    return None


def _json_file(path: Path) -> dict:
    """A JSON object from a file, or {} where it is missing or not one."""
    try:
        found = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def _same_folder(a, b) -> bool:
    return isinstance(a, str) and isinstance(b, str) and Path(a).resolve() == Path(b).resolve()


def _val_loss_anomalies(run: RunLog) -> list[str]:
    """Lines for a val loss that says the model cannot predict text it has not seen: above a uniform guess over
    its vocabulary (ln vocab_size), at its last evaluation or at every one, and far above the train loss at its
    last evaluation (memorising). None for DPO, whose val_loss is its preference loss, not a next-token loss."""
    evaluated = [r for r in run.records if is_finite_number(r.get("val_loss"))]
    if not evaluated or run.config.get("dpo"):
        return []
    last, best = evaluated[-1], min(evaluated, key=lambda r: r["val_loss"])
    vocab = run.model["config"]["vocab_size"]
    uniform = math.log(vocab)
    found = []
    guess = f"a uniform guess (ln {vocab:,} = {uniform:.4f})"
    worse = ": the model predicts text it has not seen worse than knowing nothing of it"
    if best["val_loss"] > uniform:
        found.append(f"val loss never went below {guess}, its best {best['val_loss']:.4f} at step {best['step']}"
                     + worse)
    elif last["val_loss"] > uniform:
        found.append(f"step {last['step']}: val loss {last['val_loss']:.4f}, up from {best['val_loss']:.4f} at step "
                     f"{best['step']}, is above {guess}" + worse)
    train = last.get("train_loss")
    if is_finite_number(train) and last["val_loss"] - train > MEMORISING_GAP and train < last["val_loss"] / 2:
        found.append(f"step {last['step']}: val loss {last['val_loss']:.4f} against train loss {train:.4f}: the "
                     "model memorises its training text instead of learning from it; give it more text, or train a "
                     "smaller model")
    return found


def eval_rows(run: RunLog) -> tuple[list[str], list[dict]]:
    """Evaluation files flattened to numeric columns: (columns, rows), one row per file."""
    rows = [{"file": stem, **_flatten(data)} for stem, data in run.evals]
    columns = ["file"] + sorted({k for row in rows for k in row if k != "file"})
    return columns, rows


def _flatten(data, prefix: str = "") -> dict:
    if isinstance(data, dict):
        out = {}
        for key, value in data.items():
            out.update(_flatten(value, f"{prefix}{key}."))
        return out
    if isinstance(data, (int, float)) and not isinstance(data, bool):
        return {prefix.rstrip("."): data}
    return {}


def _last_finite(records: list[dict], key: str) -> float | None:
    values = [r[key] for r in records if is_finite_number(r.get(key))]
    return values[-1] if values else None
