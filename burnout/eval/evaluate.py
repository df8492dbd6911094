"""`burnout eval`: validation loss, zero-shot benchmarks and in-context-learning suites for one checkpoint or
every checkpoint of a run.

Tasks: val, the built-in hellaswag / arc_easy / lambada (lm-eval's templates), `icl:FILE.yaml` (every task of
an llm-foundry icl_tasks list, e.g. DCLM's; burnout/eval/icl.py), and one-off task files (`--task`).

Results land in the run folder (a checkpoint outside a run folder keeps them in its own folder):

    RUN/eval/step_0000500.json   one checkpoint: {"checkpoint", "step", "tokens", "tasks": {task: metrics},
                                 "core": DCLM's CORE over the icl tasks scored, when any is a CORE task}
    RUN/eval/summary.md          step → scores table over every evaluated checkpoint (also printed)
    RUN/eval/summary.json        the same rows, machine-readable
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer
from tqdm import tqdm

from burnout.base.files import write_atomic
from burnout.base.text import first_line
from burnout.core.checkpoint import list_checkpoints, resolve_checkpoint, run_dir_of
from burnout.core.device import autocast, configure_backends, resolve_device, resolve_precision
from burnout.core.model_files import load_model
from burnout.data.loader import TokenLoader
from burnout.data.shards import read_meta
from burnout.data.tokenizer import closed_char_vocabulary, tokenizer_sha256, unencodable, unencodable_error
from burnout.errors import BurnoutError
from burnout.eval.icl import Suite, load_suite, result_keys, score_task, suite_core
from burnout.eval.references import REFERENCES_FILE, reference_table
from burnout.eval.tasks import (
    BENCHMARKS,
    BUILTIN_TASKS,
    IclTask,
    build_items,
    builtin_task,
    check_fewshot,
    describe_template,
    needs_prefix_space,
    read_records,
    task_file,
)
from burnout.models import Transformer

TASKS = ("val", *BENCHMARKS)
EVAL_DIR = "eval"
ICL_PREFIX = "icl:"


def parse_tasks(spec: str | list[str]) -> list[str]:
    """'val,hellaswag' → ['val', 'hellaswag'], each checked against TASKS ('all' means every task) or of the
    form icl:FILE.yaml (an icl_tasks list)."""
    names = [t.strip() for t in (spec.split(",") if isinstance(spec, str) else spec) if t.strip()]
    if names == ["all"]:
        return list(TASKS)
    if not names:
        raise BurnoutError(f"--tasks is empty; choose from {','.join(TASKS)} or icl:FILE.yaml")
    for name in names:
        if name not in TASKS and not (name.startswith(ICL_PREFIX) and len(name) > len(ICL_PREFIX)):
            raise BurnoutError(f"unknown task '{name}'; choose from {','.join(TASKS)} (comma-separated), all, "
                               "or icl:FILE.yaml (an llm-foundry icl_tasks list)")
    return list(dict.fromkeys(names))


@dataclass
class Plan:
    """What one `burnout eval` scores, resolved before any model loads."""

    val: bool
    tasks: list[IclTask]  # built-in, icl-list and one-off tasks, in order
    suites: list[Suite]
    lines: list[str]  # said once: missing files, templates applied to a user's file
    records: list[list[dict]] = field(default_factory=list)  # each task's records, read and checked


def plan_tasks(tasks: list[str] | str, data_root: str | Path | None = None, task_files: dict[str, str] | None = None,
               icl_tasks: list[IclTask] | None = None) -> Plan:
    """Resolve every task's file (a missing built-in file or a bad icl list fails here; a missing icl task
    file is listed) and check that no two results would share a name."""
    names = parse_tasks(tasks) if tasks else []
    plan = Plan(val="val" in names, tasks=[], suites=[], lines=[])
    task_files = task_files or {}
    for name in task_files:
        if name not in BUILTIN_TASKS:
            raise BurnoutError(f"--task-file '{name}' is not a built-in task ({', '.join(BENCHMARKS)}); to score a "
                               f"file of your own, use --task {name}=PATH (with --type and --shots)")
    for name in names:
        if name in BUILTIN_TASKS:
            task = builtin_task(name, task_file(name, data_root, task_files))
            if name in task_files:  # the built-in template applies to the user's file: say so
                plan.lines.append(f"{name}: {task.path} is read with {name}'s template ({describe_template(task)}); "
                                  f"to score a file as written use --task NAME={task.path}")
            plan.tasks.append(task)
        elif name.startswith(ICL_PREFIX):
            suite = load_suite(name[len(ICL_PREFIX):], data_root)
            plan.suites.append(suite)
            plan.tasks += suite.tasks
            plan.lines += suite.notes
            if suite.missing:
                plan.lines.append(f"{suite.source}: {len(suite.missing)} of {len(suite.missing) + len(suite.tasks)} "
                                  "tasks have no data file and are not scored: "
                                  + ", ".join(f"{label} ({uri})" for label, uri in suite.missing))
            if suite.not_scored:
                plan.lines.append(f"{suite.source}: generation tasks are not scored: "
                                  + ", ".join(f"{label} ({t})" for label, t in suite.not_scored))
    for task in icl_tasks or []:
        if task.label in BUILTIN_TASKS or task.label == "val":
            raise BurnoutError(f"--task {task.label}: '{task.label}' is a built-in task; give your task another name "
                               f"(or --task-file {task.label}=PATH to read another file with the built-in template)")
        plan.tasks.append(task)
    seen: dict[str, str] = {}
    for task in plan.tasks:
        for _, key in result_keys(task):
            if key in seen:
                raise BurnoutError(f"two tasks would both be reported as '{key}' ({seen[key]} and {task.path}); "
                                   "score them in separate commands or rename one")
            seen[key] = str(task.path)
    if not plan.val and not plan.tasks:
        raise BurnoutError("no task to score: every task of the icl list lacks its data file; pass --data-root DIR "
                           "(the folder holding the files)")
    for task in plan.tasks:  # bad records or too many shots fail here, before any model loads
        plan.records.append(read_records(task))
        check_fewshot(task, plan.records[-1])
    return plan


def check_plan_encodes(tokenizer: Tokenizer, plan: Plan, limit: int | None, where: str = "") -> None:
    """Refuse, before anything is scored, a plan whose items (the first `limit` of each task, as score_plan builds
    them) hold characters a char model's tokenizer lacks (the tasks' quotes, digits, capitals), naming the task after
    `where` ("train.eval_tasks: "). Found at its turn, it ended an eval after the other tasks' scores, or a training
    run at its first evaluation. A byte-level BPE encodes any character: its items are not built twice for this (a
    lone surrogate in a task file is still one line, when its item is scored)."""
    if not closed_char_vocabulary(tokenizer):
        return
    prefix_space = needs_prefix_space(tokenizer)
    for task, records in zip(plan.tasks, plan.records):
        for shots, key in result_keys(task):
            items = build_items(task, records, shots, prefix_space, limit)
            text = "".join(dict.fromkeys(part for item in items for request in item.requests for part in request))
            if unencodable(tokenizer, text):
                raise unencodable_error(tokenizer, text, f"{where}task '{key}'", f"leave '{task.label}' out"
                                        f"{' of ' + where.rstrip(': ') if where else ''} (val scores any model), or "
                                        "score a byte-level BPE model")


def score_plan(model: Transformer, tokenizer: Tokenizer, plan: Plan, limit: int | None = None, batch_size: int = 16,
               data_root: str | Path | None = None, progress: bool | None = None) -> tuple[dict, dict | None]:
    """({result key: metrics} for each of the plan's benchmark tasks, CORE or None); what `burnout eval` and
    training's train.eval_tasks both score. A progress bar per task (items, items/s, ETA) on stderr when
    `progress`, by default when stderr is a terminal."""
    results: dict[str, dict] = {}
    for task, records in zip(plan.tasks, plan.records):
        with tqdm(desc=task.label, unit="item", disable=None if progress is None else not progress,
                  leave=False) as bar:
            results.update(score_task(model, tokenizer, task, limit, batch_size, records, bar))
    core = suite_core(plan.suites, results, data_root) if plan.suites else None
    return results, core


def token_byte_lengths(tokenizer: Tokenizer) -> torch.Tensor:
    """UTF-8 bytes of text that each token id stands for; 0 for special tokens such as <|endoftext|>.

    Byte-level BPE writes each byte as one character of its 256-symbol alphabet, so a token's byte
    count is its string length; other tokenizers' tokens are plain text.
    """
    from tokenizers import pre_tokenizers

    byte_level = isinstance(tokenizer.pre_tokenizer, pre_tokenizers.ByteLevel)
    special = {t.content for t in tokenizer.get_added_tokens_decoder().values() if t.special}
    lengths = torch.zeros(tokenizer.get_vocab_size(), dtype=torch.long)
    for token, i in tokenizer.get_vocab().items():
        if token not in special:
            lengths[i] = len(token) if byte_level else len(token.encode("utf-8"))
    return lengths


@torch.no_grad()
def evaluate_val(model: Transformer, tokenizer: Tokenizer, data_dir: str | Path, seq_len: int, batch_size: int = 8,
                 limit: int | None = None) -> dict[str, float]:
    """Loss, perplexity and bits per byte over the val split's non-overlapping windows (the first `limit`).

    loss and perplexity average over every token, as training's val_loss does. bits_per_byte is
    tokenizer-independent: the summed loss of tokens that stand for text (not <|endoftext|>), in bits,
    over the UTF-8 bytes they stand for.
    """
    meta = read_meta(data_dir)
    if meta.get("tokenizer_sha256") and meta["tokenizer_sha256"] != tokenizer_sha256(tokenizer):
        raise BurnoutError(
            f"val data '{data_dir}' was tokenized with another tokenizer than this checkpoint's; "
            "pass --data with a folder prepared with the checkpoint's tokenizer.json"
        )
    loader = TokenLoader(data_dir, "val", batch_size=batch_size, seq_len=seq_len, seed=0)
    windows = (loader.num_tokens - 1) // seq_len
    windows = min(windows, limit) if limit else windows
    byte_lengths = token_byte_lengths(tokenizer)
    device = model.tok_emb.weight.device
    # On a GPU, bf16 (fp16 before Ampere) with TF32 for what stays fp32, as training computes its val loss:
    # plain fp32 there gets neither tensor cores nor flash attention. On CPU it is fp32, as before.
    precision = resolve_precision("auto", device)
    configure_backends(device)
    total_nats, count, text_nats, text_bytes = 0.0, 0, 0.0, 0
    batches = math.ceil(windows / batch_size)
    for x, y in tqdm(loader.iter_eval_batches(batches), desc="val", unit="batch", total=batches, disable=None,
                     leave=False):
        left = windows - count // seq_len
        x, y = x[:left], y[:left]
        with autocast(device, precision):
            logits = model(x.to(device))
        logits = logits.float()
        nats = F.cross_entropy(logits.view(-1, logits.size(-1)), y.to(device).view(-1), reduction="none").cpu().double()
        total_nats += float(nats.sum())
        count += y.numel()
        nbytes = byte_lengths[y.view(-1)]
        text_nats += float(nats[nbytes > 0].sum())
        text_bytes += int(nbytes.sum())
    loss = total_nats / count
    return {
        "loss": loss,
        "perplexity": math.exp(loss),
        "bits_per_byte": text_nats / math.log(2) / text_bytes if text_bytes else math.nan,
        "tokens": count,
    }


def evaluate_checkpoint(
    path: str | Path,
    tasks: list[str] | str | Plan,
    limit: int | None = None,
    data_root: str | Path | None = None,
    task_files: dict[str, str] | None = None,
    data_dir: str | Path | None = None,
    batch_size: int = 16,
    device: str = "auto",
    say: Callable[[str], None] = print,
    icl_tasks: list[IclTask] | None = None,
) -> dict:
    """Score one checkpoint on `tasks` (or a `plan_tasks` plan) and write RUN/eval/step_N.json; returns that
    record."""
    # Resolve every data file first: a missing one fails before any model is loaded.
    plan = tasks if isinstance(tasks, Plan) else plan_tasks(tasks, data_root, task_files, icl_tasks)
    if not isinstance(tasks, Plan):
        for line in plan.lines:
            say(line)
    dev = resolve_device(device, "--device")
    model, tokenizer, ckpt = load_model(path, dev)
    check_plan_encodes(tokenizer, plan, limit)
    record: dict = {"checkpoint": str(ckpt.path), "step": ckpt.info.get("step"), "tokens": ckpt.info.get("tokens"),
                    "limit": limit, "tasks": {}}

    def report(task: str, result: dict) -> None:
        shown = {k: v for k, v in result.items() if isinstance(v, (int, float)) and k not in ("num_fewshot", "chance")}
        chance = f" (chance {_fmt(result['chance'])})" if "chance" in result else ""
        say(f"step {record['step']}: {task} " + ", ".join(f"{k} {_fmt(v)}" + chance * (k == "acc")
                                                          for k, v in shown.items()))

    if plan.val:
        val_dir = data_dir or ckpt.config.data.prepared_dir
        if not val_dir:
            raise BurnoutError(f"checkpoint {ckpt.path} names no prepared data; pass --data DIR for the val task")
        if data_dir is None and ckpt.config.fine_tune is not None:  # its prepared_dir holds examples, not text
            raise BurnoutError(f"checkpoint {ckpt.path} is a fine-tune of {ckpt.config.fine_tune.base}: the val task "
                               "is the loss on a prepared corpus's val split, and this run's data are its examples "
                               "(their val loss is in its metrics: burnout report); give a corpus prepared with its "
                               "tokenizer with --data DIR")
        if data_dir is None and not Path(val_dir).exists():  # the run's data, moved or deleted since it trained
            raise BurnoutError(f"checkpoint {ckpt.path}: the data it trained on, {val_dir} (data.prepared_dir), are "
                               "gone; give the folder that holds them now: --data DIR")
        seq_len = ckpt.config.train.seq_len or model.cfg.context_length
        record["tasks"]["val"] = evaluate_val(model, tokenizer, val_dir, seq_len, limit=limit)
        report("val", record["tasks"]["val"])
    results, core = score_plan(model, tokenizer, plan, limit, batch_size, data_root)
    for key, result in results.items():
        record["tasks"][key] = result
        report(key, result)
    if core is not None:
        record["core"] = core
        say(f"step {record['step']}: CORE {_fmt(core['score'])} (DCLM's centered accuracy over {core['tasks']} of "
            f"its {core['of']} core tasks" + (f"; missing: {', '.join(core['missing'])}" if core["missing"] else "")
            + ")")
    out = run_dir_of(ckpt.path) / EVAL_DIR / f"{ckpt.path.name}.json"
    _write_json(out, record)
    return record


def checkpoints_to_evaluate(target: str | Path, all_checkpoints: bool) -> list[Path]:
    """The checkpoint `target` names (a run folder: its latest), or with all_checkpoints every one of the run."""
    if not all_checkpoints:
        return [resolve_checkpoint(target)]
    paths = list_checkpoints(Path(target))
    if not paths:
        raise BurnoutError(f"'{target}' holds no checkpoints/step_* folders; --all-checkpoints needs a run folder")
    return paths


def evaluate(
    target: str | Path,
    tasks: list[str] | str | None,
    all_checkpoints: bool = False,
    say: Callable[[str], None] = print,
    data_root: str | Path | None = None,
    task_files: dict[str, str] | None = None,
    icl_tasks: list[IclTask] | None = None,
    **kwargs,
) -> list[dict]:
    """Evaluate a checkpoint, a run's latest checkpoint, or (all_checkpoints) every checkpoint of a run;
    then rewrite RUN/eval/summary.{md,json} from every result in RUN/eval and print the table."""
    plan = plan_tasks(tasks, data_root, task_files, icl_tasks)
    paths = checkpoints_to_evaluate(target, all_checkpoints)
    for line in plan.lines:
        say(line)
    records = [evaluate_checkpoint(p, plan, say=say, data_root=data_root, **kwargs) for p in paths]
    run_dir = run_dir_of(paths[0])
    table = write_summary(run_dir)
    say(table)
    return records


SUMMARY_COLUMNS = [
    ("val", "loss", "val loss"), ("val", "perplexity", "val ppl"), ("val", "bits_per_byte", "val bpb"),
    ("hellaswag", "acc", "hellaswag acc"), ("hellaswag", "acc_norm", "hellaswag acc_norm"),
    ("arc_easy", "acc", "arc_easy acc"), ("arc_easy", "acc_norm", "arc_easy acc_norm"),
    ("lambada", "acc", "lambada acc"), ("lambada", "perplexity", "lambada ppl"),
]


def write_summary(run_dir: Path) -> str:
    """The step → scores Markdown table over RUN/eval/step_*.json, written to summary.md and summary.json:
    the built-in tasks' columns, then each other task's accuracy, then CORE."""
    eval_dir = Path(run_dir) / EVAL_DIR
    found, left_out = eval_records(run_dir)
    left_out += [f"{path} is left out (it holds no tasks)" for path, record in found
                 if not isinstance(record.get("tasks"), dict)]
    records = sorted((r for _, r in found if isinstance(r.get("tasks"), dict)), key=lambda r: r.get("step") or 0)
    present = [c for c in SUMMARY_COLUMNS if any(c[1] in r["tasks"].get(c[0], {}) for r in records)]
    builtin = {c[0] for c in SUMMARY_COLUMNS}
    others = dict.fromkeys(t for r in records for t, m in r["tasks"].items() if t not in builtin and "acc" in m)
    present += [(t, "acc", f"{t} acc") for t in others]
    has_core = any("core" in r for r in records)
    lines = ["| step | tokens | " + " | ".join([c[2] for c in present] + ["CORE"] * has_core) + " |",
             "|---:|---:|" + "---:|" * (len(present) + has_core)]
    for r in records:
        cells = [_fmt(r["tasks"].get(task, {}).get(key)) for task, key, _ in present]
        cells += [_fmt(r.get("core", {}).get("score"))] * has_core
        lines.append(f"| {r.get('step')} | {r.get('tokens') or ''} | " + " | ".join(cells) + " |")
    table = "\n".join(lines) + "\n"
    latest = records[-1]["tasks"] if records else {}
    settings = [f"{task}: {m['num_fewshot']}-shot, {m['examples']} items" for task, m in latest.items()
                if "num_fewshot" in m and "examples" in m]
    if settings:
        table += "\nSettings (latest row): " + "; ".join(settings) + "\n"
    chances = [f"{task} {_fmt(m['chance'])}" for task, m in latest.items() if "chance" in m]
    if chances:
        table += "Chance level, the acc of a uniform guess among each item's choices: " + ", ".join(chances) + "\n"
    published = reference_table(t for r in records for t in r["tasks"])
    if published:
        table += (f"\nPublished scores at comparable sizes ({REFERENCES_FILE.name}, each with its source):\n\n"
                  f"{published}")
    table += "".join(f"\n{line}\n" for line in left_out)
    write_atomic(eval_dir / "summary.md", table)
    _write_json(eval_dir / "summary.json", {"rows": records})
    return table


def eval_records(run_dir: Path, pattern: str = "step_*.json") -> tuple[list[tuple[Path, dict]], list[str]]:
    """(file, record) of each RUN/eval file matching `pattern` (default: burnout eval's, one per checkpoint) that
    reads as a JSON object, and a line for each one left out (cut short, edited): one damaged file does not fail what
    reads them all."""
    found, left_out = [], []
    for path in sorted((Path(run_dir) / EVAL_DIR).glob(pattern)):
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
            problem = None if isinstance(record, dict) else "not a JSON object"
        except (OSError, ValueError) as exc:
            problem = f"unreadable: {first_line(exc)}"
        if problem is None:
            found.append((path, record))
        else:
            left_out.append(f"{path} is left out ({problem}); run the burnout eval that wrote it again")
    return found, left_out


def _fmt(value) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.4f}"
    return str(value)


def _write_json(path: Path, data) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(data, indent=2) + "\n")
