"""In-context-learning suites: llm-foundry `icl_tasks` lists, one-off task files, and DCLM's CORE aggregate.

    burnout eval RUN --tasks icl:dclm_mmlu_and_lowvar.yaml       every task of an icl_tasks list
    burnout eval RUN --task mine=my.jsonl --type multiple_choice --shots 5   one file, no YAML

The lists llm-foundry and DCLM publish run as they are (`load_suite`), on the engine of burnout/eval/tasks.py,
and CORE is computed as DCLM computes it (`core_score`), so a small model's figures compare with theirs.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from burnout.base.text import first_line
from burnout.errors import BurnoutError
from burnout.eval.scoring import chance_accuracy, item_metrics, score_items
from burnout.eval.tasks import (
    FEWSHOT_SEED,
    TASK_TYPES,
    IclTask,
    build_items,
    check_type,
    default_data_root,
    needs_prefix_space,
    read_records,
)

# llm-foundry dataset files that shared/data keeps under other names (arc_easy and lambada_openai are the very
# llm-foundry files; hellaswag is the same 10,042 validation items in llama.cpp's text form, lm-eval's
# preprocessing, read by the built-in hellaswag reader).
SHARED_ALIASES = {
    "arc_easy.jsonl": ("arc/arc_easy_test.jsonl", None),
    "lambada_openai.jsonl": ("lambada/lambada_openai_test.jsonl", None),
    "hellaswag.jsonl": ("hellaswag/hellaswag_val_full.txt.bz2", "hellaswag"),
}
NOT_SCORED_TYPES = ("generation_task_with_answers", "code_evaluation")
CORE_GROUP = "low_variance_datasets"
CORE_METRIC = {"multiple_choice": "acc_per_token", "schema": "acc", "language_modeling": "acc"}
META_CSV = "dclm_eval_meta_data.csv"
AGGREGATION_JSON = "dclm_additional_aggregation.json"
_TASK_KEYS = {"label", "dataset_uri", "num_fewshot", "icl_task_type", "continuation_delimiter", "example_delimiter",
              "question_prelimiter", "prelimiter", "prompt_string", "has_categories", "fewshot_random_seed",
              "strip_dataset"}


@dataclass
class Suite:
    """An icl_tasks list resolved against the data: what can be scored and what cannot."""

    source: str
    tasks: list[IclTask] = field(default_factory=list)
    missing: list[tuple[str, str]] = field(default_factory=list)  # (label, dataset_uri) without a file
    not_scored: list[tuple[str, str]] = field(default_factory=list)  # (label, icl_task_type)
    notes: list[str] = field(default_factory=list)
    folder: Path | None = None  # the YAML's folder, where CORE's metadata files are looked for too


def unescape(text: str) -> str:
    """A delimiter typed on the command line: \\n, \\t and \\\\ become newline, tab and backslash."""
    out, i = [], 0
    while i < len(text):
        if text[i] == "\\" and i + 1 < len(text) and text[i + 1] in "nt\\":
            out.append({"n": "\n", "t": "\t", "\\": "\\"}[text[i + 1]])
            i += 2
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def parse_shots(value, label: str) -> tuple[int, ...]:
    """num_fewshot: an int, a list of ints, or "0,5" → a tuple of distinct counts ≥ 0."""
    values = value if isinstance(value, list) else str(value).split(",") if isinstance(value, str) else [value]
    shots = []
    for v in values:
        try:
            n = int(str(v).strip())
        except ValueError:
            raise BurnoutError(f"task '{label}': num_fewshot {value!r} is not a whole number or a list of them"
                               ) from None
        if n < 0:
            raise BurnoutError(f"task '{label}': num_fewshot {n} is negative")
        shots.append(n)
    if not shots:
        raise BurnoutError(f"task '{label}': num_fewshot is empty")
    return tuple(dict.fromkeys(shots))


def infer_type(path: Path, label: str) -> str:
    """The ICL type whose fields the file's first record has."""
    from burnout.eval.tasks import RECORD_FIELDS, _open_text

    try:
        with _open_text(path) as f:
            first = next((line for line in f if line.strip()), None)
        record = None if first is None else json.loads(first)
    except (OSError, ValueError):
        first, record = "", None
    if first is None:
        raise BurnoutError(f"task '{label}': '{path}' is empty; write one JSON record per line, e.g. "
                           '{"query": ..., "choices": [...], "gold": 0} for multiple_choice')
    if isinstance(record, dict):
        for task_type, fields in RECORD_FIELDS.items():
            if all(k in record for k in fields):
                return task_type
    raise BurnoutError(f"task '{label}': cannot tell the task type of '{path}' from its first record; pass --type "
                       f"({', '.join(TASK_TYPES)})")


def one_off_task(name: str, path: str | Path, task_type: str | None = None, shots: str | int | None = None,
                 continuation_delimiter: str | None = None, example_delimiter: str | None = None,
                 prelimiter: str | None = None) -> IclTask:
    """`--task NAME=PATH`: the file's records scored as written, with llm-foundry's default delimiters unless
    given (continuation " ", example "\\n", no prelimiter)."""
    path = Path(path)
    if not path.is_file():
        raise BurnoutError(f"task '{name}': data file '{path}' does not exist")
    if task_type is None:
        task_type = infer_type(path, name)
    check_type(task_type, name)
    return IclTask(
        label=name, type=task_type, path=path, num_fewshot=parse_shots(0 if shots is None else shots, name),
        continuation_delimiter=" " if continuation_delimiter is None else unescape(continuation_delimiter),
        example_delimiter="\n" if example_delimiter is None else unescape(example_delimiter),
        prelimiter="" if prelimiter is None else unescape(prelimiter),
    )


def resolve_dataset(uri: str, data_root: Path | None, yaml_dir: Path | None) -> tuple[Path | None, str | None]:
    """(the file for dataset_uri, the built-in reader it needs or None); (None, None) when not found.

    Looked for as written (absolute, or relative to the YAML's folder), then under the data root, then by its file
    name in the data root's icl/ folder and the YAML's folder, then (three files that shared/data keeps elsewhere)
    as SHARED_ALIASES says."""
    if "://" in uri:
        return None, None
    candidates = [Path(uri)] if Path(uri).is_absolute() else []
    if not Path(uri).is_absolute():
        candidates += [d / uri for d in (yaml_dir, data_root) if d is not None]
        name = Path(uri).name
        candidates += [d / name for d in ((data_root / "icl") if data_root else None, yaml_dir) if d is not None]
    for path in candidates:
        if path.is_file():
            return path, None
    alias = SHARED_ALIASES.get(Path(uri).name)
    if alias and data_root is not None and (data_root / alias[0]).is_file():
        return data_root / alias[0], alias[1]
    return None, None


def load_suite(path: str | Path, data_root: str | Path | None = None) -> Suite:
    """The icl_tasks list in `path`, each task's file resolved (resolve_dataset).

    An icl_tasks YAML is llm-foundry's (and DCLM's eval/*.yaml): a mapping whose `icl_tasks` is a list (or the
    path of a YAML holding one), or the list itself. Each entry has label, dataset_uri, num_fewshot (a list:
    one result per value), icl_task_type (multiple_choice, schema, language_modeling) and optionally
    continuation_delimiter, example_delimiter, question_prelimiter (or prelimiter), prompt_string,
    has_categories, fewshot_random_seed, strip_dataset; other keys (metric_names, batch_size, …) are llm-foundry
    run settings and are ignored. A task whose file is not found is listed as missing and the others are scored;
    generation tasks (generation_task_with_answers, code_evaluation) are listed as not scored."""
    path = Path(path)
    if not path.is_file():
        raise BurnoutError(f"icl task list '{path}' does not exist; --tasks icl:FILE.yaml takes an llm-foundry "
                           "icl_tasks YAML such as shared/data/icl/dclm_mmlu_and_lowvar.yaml")
    entries = _read_yaml_list(path)
    root = Path(data_root) if data_root is not None else default_data_root()
    suite = Suite(source=str(path), folder=path.parent)
    labels: set[str] = set()
    for n, entry in enumerate(entries, start=1):
        if not isinstance(entry, dict):
            raise BurnoutError(f"{path}: icl_tasks entry {n} is not a mapping of settings")
        for key in ("label", "dataset_uri", "icl_task_type", "num_fewshot"):
            if entry.get(key) is None:
                raise BurnoutError(f"{path}: icl_tasks entry {n} has no '{key}'; each entry needs label, "
                                   "dataset_uri, icl_task_type and num_fewshot")
        label, task_type = str(entry["label"]), str(entry["icl_task_type"])
        if label in labels:
            raise BurnoutError(f"{path}: label '{label}' appears twice in icl_tasks")
        labels.add(label)
        if task_type in NOT_SCORED_TYPES:
            suite.not_scored.append((label, task_type))
            continue
        check_type(task_type, label)
        if "question_prelimiter" in entry and "prelimiter" in entry:
            raise BurnoutError(f"{path}: task '{label}' sets both question_prelimiter and prelimiter; they are the "
                               "same setting, keep one")
        file, reader = resolve_dataset(str(entry["dataset_uri"]), root, path.parent)
        if file is None:
            suite.missing.append((label, str(entry["dataset_uri"])))
            continue
        if reader is not None:
            suite.notes.append(f"{label}: {Path(entry['dataset_uri']).name} is not in the data root; scored from "
                               f"{file}, HellaSwag's validation items in lm-eval's preprocessing")

        def text(key, default, entry=entry):
            value = entry.get(key, default)
            return default if value is None else str(value)

        suite.tasks.append(IclTask(
            label=label, type=task_type, path=file, num_fewshot=parse_shots(entry["num_fewshot"], label),
            continuation_delimiter=text("continuation_delimiter", " "),
            example_delimiter=text("example_delimiter", "\n"),
            prelimiter=text("prelimiter", text("question_prelimiter", "")),
            prompt_string=text("prompt_string", ""),
            has_categories=bool(entry.get("has_categories", False)),
            fewshot_random_seed=int(entry.get("fewshot_random_seed", FEWSHOT_SEED)),
            strip_dataset=bool(entry.get("strip_dataset", True)),
            reader=reader,
        ))
    return suite


def _read_yaml_list(path: Path, depth: int = 0) -> list:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise BurnoutError(f"{path} is not valid YAML ({str(exc).splitlines()[0]})") from None
    except ValueError as exc:  # not UTF-8, or a value YAML recognises but cannot build (2024-13-45)
        raise BurnoutError(f"{path} cannot be read as YAML ({first_line(exc)}); fix it") from None
    except RecursionError:
        raise BurnoutError(f"{path}: its values are nested too deeply for YAML to read") from None
    if isinstance(data, dict):
        data = data.get("icl_tasks")
        if isinstance(data, str) and depth == 0:  # llm-foundry: icl_tasks may name another YAML
            nested = Path(data) if Path(data).is_absolute() else path.parent / data
            if not nested.is_file():
                raise BurnoutError(f"{path}: icl_tasks names '{data}', which does not exist")
            return _read_yaml_list(nested, depth + 1)
    if not isinstance(data, list) or not data:
        raise BurnoutError(f"{path} holds no icl_tasks list; an icl task YAML is a mapping with an icl_tasks list "
                           "(llm-foundry's layout) or the list itself")
    return data


def result_keys(task: IclTask) -> list[tuple[int, str]]:
    """(shots, the key its results are stored under) for each of the task's shot counts: its label, or
    label/N-shot when num_fewshot lists several counts."""
    if len(task.num_fewshot) == 1:
        return [(task.num_fewshot[0], task.label)]
    return [(n, f"{task.label}/{n}-shot") for n in task.num_fewshot]


def score_task(model, tokenizer, task: IclTask, limit: int | None = None, batch_size: int = 16,
               records: list[dict] | None = None, bar=None) -> dict[str, dict]:
    """{result key: metrics} for each of `task`'s shot counts over the first `limit` items (of each category);
    `records` are the task's (`read_records`), read here when not given. `bar` (a tqdm) is reset to each
    shot count's items and advanced as they are scored. With has_categories a result's metrics are the unweighted
    mean over the task's categories, as DCLM reports them, each category's kept under "categories"."""
    records = read_records(task) if records is None else records
    prefix_space = needs_prefix_space(tokenizer)
    out = {}
    for shots, key in result_keys(task):
        items = build_items(task, records, shots, prefix_space, limit)
        if bar is not None:
            bar.reset(total=len(items))
            bar.set_description(key)
        _, samples = score_items(model, tokenizer, task.type, items, batch_size, bar.update if bar else None)
        metrics = _task_metrics(task.type, samples)
        if task.has_categories:
            by_category: dict[str, list[dict]] = {}
            for s in samples:
                by_category.setdefault(s["category"], []).append(s)
            categories = {c: _task_metrics(task.type, group) for c, group in by_category.items()}
            for name in metrics:  # DCLM: the label's score is the mean of its categories'
                if name not in ("examples", "truncated"):
                    metrics[name] = sum(c[name] for c in categories.values()) / len(categories)
            metrics["categories"] = categories
        metrics.update({"type": task.type, "num_fewshot": shots, "file": str(task.path),
                        "first_prompt": {"context": items[0].requests[0][0], "continuation": items[0].requests[0][1]}})
        out[key] = metrics
    return out


def _task_metrics(task_type: str, samples: list[dict]) -> dict:
    """item_metrics, with the chance accuracy beside acc where the items have choices to guess among."""
    metrics = item_metrics(task_type, samples)
    if task_type != "language_modeling":
        metrics["chance"] = chance_accuracy(samples)
    return metrics


def read_baselines(path: str | Path) -> dict[str, float]:
    """{task: random baseline as a fraction} from DCLM's eval_meta_data CSV (its "Random baseline" column is
    in percent)."""
    path = Path(path)
    try:
        with open(path, newline="", encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
    except OSError as exc:
        raise BurnoutError(f"cannot read the CORE baselines '{path}': {exc.strerror}") from None
    if not rows or "Eval Task" not in rows[0] or "Random baseline" not in rows[0]:
        raise BurnoutError(f"'{path}' is not DCLM's eval_meta_data CSV (it needs 'Eval Task' and 'Random baseline' "
                           "columns)")
    out = {}
    for row in rows:
        try:
            value = float(row["Random baseline"]) / 100.0
        except (TypeError, ValueError):
            raise BurnoutError(f"'{path}': task {row['Eval Task']} has random baseline {row['Random baseline']!r}, "
                               "not a number (percent)") from None
        if not 0.0 <= value < 1.0:
            raise BurnoutError(f"'{path}': task {row['Eval Task']} has random baseline {row['Random baseline']}%; "
                               "a baseline is a percentage below 100")
        out[row["Eval Task"]] = value
    return out


def read_core_tasks(path: str | Path) -> list[str]:
    """DCLM's CORE task list: the low_variance_datasets group of additional_aggregation.json."""
    try:
        groups = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise BurnoutError(f"cannot read the CORE task list '{path}': {exc}") from None
    if not isinstance(groups, dict) or not isinstance(groups.get(CORE_GROUP), list):
        raise BurnoutError(f"'{path}' has no '{CORE_GROUP}' list (DCLM's additional_aggregation.json has)")
    return [str(t) for t in groups[CORE_GROUP]]


def core_score(accuracies: dict[str, float], baselines: dict[str, float], core_tasks: list[str]) -> dict:
    """CORE over the core tasks present in `accuracies`: the mean of (acc − baseline) / (1 − baseline);
    "missing" lists the core tasks without a score (or without a baseline).

    As DCLM computes it (mlfoundations/dclm eval/aggregated_metrics.py): each task's accuracy centered on its random
    baseline (the "Random baseline" column of DCLM's eval_meta_data CSV, in percent), the mean over the tasks of the
    "low_variance_datasets" group of DCLM's additional_aggregation.json that were scored (DCLM's Core needs all 22;
    here the missing ones are listed and the mean is over those present). The accuracy is DCLM's, i.e. llm-foundry's
    metric for the type (CORE_METRIC): for multiple_choice the lowest per-token perplexity (acc_per_token), for
    schema and language_modeling acc. The shared copy of the CSV (shared/data/icl/dclm_eval_meta_data.csv) is DCLM's
    eval_meta_data_v1.csv: the baselines of the DCLM paper ("Core_v1"); DCLM's current eval_meta_data.csv
    ("Core_v2") changed eleven multiple-choice baselines (commonsense_qa 20 → 40.3 among the shared tasks)."""
    centered = {t: (accuracies[t] - baselines[t]) / (1.0 - baselines[t])
                for t in core_tasks if t in accuracies and t in baselines}
    return {
        "score": sum(centered.values()) / len(centered) if centered else None,
        "centered": centered,
        "tasks": len(centered),
        "of": len(core_tasks),
        "missing": [t for t in core_tasks if t not in centered],
    }


def find_core_files(folders: list[Path | None]) -> tuple[Path, Path] | None:
    """(the baselines CSV, the aggregation JSON) from the first folder holding both, or None."""
    for folder in folders:
        if folder is not None and (folder / META_CSV).is_file() and (folder / AGGREGATION_JSON).is_file():
            return folder / META_CSV, folder / AGGREGATION_JSON
    return None


def suite_core(suites: list[Suite], results: dict[str, dict], data_root: str | Path | None) -> dict | None:
    """CORE over the suites' results, or None when no suite task is a CORE task or the metadata is missing."""
    root = Path(data_root) if data_root is not None else default_data_root()
    files = find_core_files([s.folder for s in suites] + [root / "icl" if root else None])
    if files is None:
        return None
    baselines, core_tasks = read_baselines(files[0]), read_core_tasks(files[1])
    accuracies, metric = {}, {}
    for suite in suites:
        for task in suite.tasks:
            if task.label not in core_tasks:
                continue
            keys = dict(result_keys(task))
            # The result at the shot count DCLM's table lists for the task, else the first.
            key = next(iter(keys.values()))
            for shots, k in keys.items():
                if _dclm_shots(files[0], task.label) == shots:
                    key = k
            if key in results:
                metric[task.label] = CORE_METRIC[task.type]
                accuracies[task.label] = results[key][metric[task.label]]
    if not accuracies:
        return None
    return {**core_score(accuracies, baselines, core_tasks), "metric": metric, "baselines": str(files[0]),
            "task_list": str(files[1])}


def _dclm_shots(csv_path: Path, label: str) -> int | None:
    with open(csv_path, newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            if row.get("Eval Task") == label:
                try:
                    return int(row.get("#shots", ""))
                except ValueError:
                    return None
    return None
