"""Benchmark tasks: their files, their records, and the prompts built from them.

A task is an `IclTask`: a file of records in one of llm-foundry's in-context-learning layouts (RECORD_FIELDS), a
task type, and llm-foundry's prompt settings; `build_items` turns its records into `Item`s of (context,
continuation) requests that burnout.eval.scoring scores. The built-in hellaswag, arc_easy and lambada are entries
of the same engine with lm-evaluation-harness's zero-shot templates (BUILTIN_TASKS), their readers taking the
original release formats too. One engine for every task, so that prompts are llm-foundry's and scores lm-eval's.
"""

from __future__ import annotations

import bz2
import io
import json
import os
import random
import re
from dataclasses import dataclass, replace
from pathlib import Path

from burnout.base.text import first_line
from burnout.errors import BurnoutError

# Where each task's file lives under a data root (the layout of shared/data).
DEFAULT_FILES = {
    "hellaswag": "hellaswag/hellaswag_val_full.txt.bz2",
    "arc_easy": "arc/arc_easy_test.jsonl",
    "lambada": "lambada/lambada_openai_test.jsonl",
}
MULTIPLE_CHOICE = ("hellaswag", "arc_easy")
BENCHMARKS = tuple(DEFAULT_FILES)
DATA_ROOT_ENV = "BURNOUT_EVAL_DATA"
TARGET_DELIMITER = " "  # lm-eval's default target_delimiter, put between context and each choice

TASK_TYPES = ("multiple_choice", "schema", "language_modeling")
# The fields each type's records need (has_categories adds "category": one result per category). What each scores
# (llm-foundry's `icl_task_type`s):
#     multiple_choice    a request per choice: query → " {choice}"
#     schema             a request per context option, each followed by the shared continuation (WinoGrande's
#                        partial scoring)
#     language_modeling  one request, scored by greedy exact match
RECORD_FIELDS = {
    "multiple_choice": ("query", "choices", "gold"),
    "schema": ("context_options", "continuation", "gold"),
    "language_modeling": ("context", "continuation"),
}
FEWSHOT_SEED = 1234  # llm-foundry's default fewshot_random_seed


def check_type(task_type: str, label: str) -> None:
    if task_type not in TASK_TYPES:
        raise BurnoutError(f"task '{label}': unknown task type '{task_type}'; the types are {', '.join(TASK_TYPES)}")


@dataclass(frozen=True)
class IclTask:
    """A task: its records' file and type, and llm-foundry's prompt settings (its `icl_tasks` entry keys).

    `target_delimiter` None is llm-foundry's rule for the space before an answer (`_scored_answer`); a
    string is put before every answer as written, as lm-eval's target_delimiter is. `reader` names a
    built-in reader that also takes the original release formats; None reads the ICL layout strictly.
    """

    label: str
    type: str
    path: Path | None = None
    num_fewshot: tuple[int, ...] = (0,)
    continuation_delimiter: str = " "
    example_delimiter: str = "\n"
    prelimiter: str = ""
    prompt_string: str = ""
    has_categories: bool = False
    fewshot_random_seed: int = FEWSHOT_SEED
    strip_dataset: bool = True
    target_delimiter: str | None = None
    reader: str | None = None

    def __post_init__(self):
        check_type(self.type, self.label)


# The built-in tasks: lm-evaluation-harness's zero-shot templates as engine settings, nothing stripped and lm-eval's
# target delimiter " " before every answer:
#     hellaswag  context "{activity_label}: {ctx}", continuations " {ending}" × 4   (lm-eval `hellaswag`)
#     arc_easy   context "Question: {question}\nAnswer:", continuations " {choice}"  (lm-eval `arc_easy`)
#     lambada    context = the passage minus its last word, continuation " {last word}" (`lambada_openai`)
BUILTIN_TASKS = {
    "hellaswag": IclTask("hellaswag", "multiple_choice", continuation_delimiter="", strip_dataset=False,
                         target_delimiter=TARGET_DELIMITER, reader="hellaswag"),
    "arc_easy": IclTask("arc_easy", "multiple_choice", continuation_delimiter="\nAnswer:", strip_dataset=False,
                        target_delimiter=TARGET_DELIMITER, reader="arc_easy"),
    "lambada": IclTask("lambada", "language_modeling", continuation_delimiter="", strip_dataset=False,
                       target_delimiter=TARGET_DELIMITER, reader="lambada"),
}


@dataclass(frozen=True)
class Item:
    """One scored item: its requests (one per choice or context option; one for language modeling),
    `choices` the texts acc_norm divides by (the answers without the space put before them), `gold` the
    index of the right request, `index` the record's place in its file (or category), `where` a label
    for messages (task, item, file line)."""

    requests: tuple[tuple[str, str], ...]
    choices: tuple[str, ...]
    gold: int
    index: int = 0
    category: str | None = None
    where: str = ""


@dataclass(frozen=True)
class Example:
    """One item: the continuations are scored after `context`; `choices` are the texts whose lengths
    acc_norm divides by (the continuations without the target delimiter)."""

    context: str
    choices: tuple[str, ...]
    gold: int

    @property
    def continuations(self) -> list[str]:
        return [TARGET_DELIMITER + c for c in self.choices]


def hellaswag_preprocess(text: str) -> str:
    """lm-eval's tasks/hellaswag/utils.py `preprocess`: brackets are WikiHow artifacts."""
    text = text.strip()
    text = text.replace(" [title]", ". ")
    text = re.sub("\\[.*?\\]", "", text)
    text = text.replace("  ", " ")
    return text


def default_data_root() -> Path | None:
    """$BURNOUT_EVAL_DATA, else the first of ./shared/data and ../shared/data that exists."""
    env = os.environ.get(DATA_ROOT_ENV)
    if env:
        return Path(env)
    for candidate in (Path("shared/data"), Path("../shared/data")):
        if candidate.is_dir():
            return candidate
    return None


def task_file(task: str, data_root: str | Path | None = None, files: dict[str, str | Path] | None = None) -> Path:
    """The data file for `task`: an explicit `files[task]`, else DEFAULT_FILES[task] under the data root."""
    if task not in DEFAULT_FILES:
        raise BurnoutError(f"unknown task '{task}'; the benchmark tasks are {', '.join(BENCHMARKS)}")
    if files and task in files:
        path = Path(files[task])
    else:
        root = Path(data_root) if data_root is not None else default_data_root()
        if root is None:
            raise BurnoutError(
                f"task '{task}': no data root found; pass --data-root DIR (the folder holding "
                f"{DEFAULT_FILES[task]}), set ${DATA_ROOT_ENV}, or pass --task-file {task}=PATH"
            )
        path = root / DEFAULT_FILES[task]
    if not path.is_file():
        raise BurnoutError(
            f"task '{task}': data file '{path}' does not exist; pass --data-root DIR (the folder holding "
            f"{DEFAULT_FILES[task]}) or --task-file {task}=PATH"
        )
    return path


def builtin_task(task: str, path: str | Path) -> IclTask:
    """The built-in task `task` reading `path`."""
    if task not in BUILTIN_TASKS:
        raise BurnoutError(f"unknown task '{task}'; the benchmark tasks are {', '.join(BENCHMARKS)}")
    return replace(BUILTIN_TASKS[task], path=Path(path))


def describe_template(task: IclTask) -> str:
    """The prompt a zero-shot item gets, in words: shown when a user's file is read through a built-in task."""
    field = "{context}" if task.type == "language_modeling" else "{query}"
    answer = "{continuation}" if task.type == "language_modeling" else "{choice}"
    return (f"context {json.dumps(field + task.continuation_delimiter)}, "
            f"continuation {json.dumps((task.target_delimiter or ' ') + answer)}")


def load_task(task: str, path: str | Path, limit: int | None = None) -> list[Example]:
    """The first `limit` examples (all when None) of the built-in `task` read from `path`."""
    spec = builtin_task(task, path)
    items = build_items(spec, read_records(spec), 0, prefix_space=True, limit=limit)
    return [Example(it.requests[0][0], it.choices, it.gold) for it in items]


# ---------------------------------------------------------------------------------------------- records


def read_records(task: IclTask) -> list[dict]:
    """Every record of `task`'s file, checked against its type's layout, and with the task's strip_dataset (the
    default) every top-level string field stripped, as llm-foundry does (lists such as choices are not). Each
    record keeps the file line it came from under "_line" (0 when the format has no lines)."""
    path = Path(task.path) if task.path is not None else None
    if path is None or not path.is_file():
        raise BurnoutError(f"task '{task.label}': data file '{path}' does not exist")
    if task.reader is not None:
        readers = {"hellaswag": _read_hellaswag, "arc_easy": _read_arc, "lambada": _read_lambada}
        try:
            records = readers[task.reader](path)
        except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
            raise BurnoutError(
                f"task '{task.label}': '{path}' is not in a format this reader knows ({type(exc).__name__}: "
                f"{exc}); see burnout/eval/tasks.py for the accepted layouts"
            ) from None
    else:
        records = _read_jsonl_records(task.label, path)
    if not records:
        raise BurnoutError(f"task '{task.label}': '{path}' holds no examples")
    for record in records:
        _check_record(task, path, record)
    if task.strip_dataset:
        records = [{k: v.strip() if isinstance(v, str) else v for k, v in r.items()} for r in records]
    return records


def _where(label: str, path: Path, line: int) -> str:
    return f"task '{label}': {path} line {line}" if line else f"task '{label}': {path}"


def _read_jsonl_records(label: str, path: Path) -> list[dict]:
    records = []
    with _open_text(path) as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise BurnoutError(f"{_where(label, path, number)} is not JSON ({exc.msg}); an ICL task file "
                                   "holds one JSON object per line") from None
            if not isinstance(record, dict):
                raise BurnoutError(f"{_where(label, path, number)} is a JSON {type(record).__name__}, not an object")
            record["_line"] = number
            records.append(record)
    return records


def _check_record(task: IclTask, path: Path, record: dict) -> None:
    where = _where(task.label, path, record.get("_line", 0))
    fields = RECORD_FIELDS[task.type] + (("category",) if task.has_categories else ())
    for field in fields:
        if field not in record:
            raise BurnoutError(f"{where}: the record has no '{field}'; a {task.type} record needs "
                               + ", ".join(fields))
    options_key = {"multiple_choice": "choices", "schema": "context_options"}.get(task.type)
    for field in fields:
        value = record[field]
        if field == options_key:
            if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
                raise BurnoutError(f"{where}: '{field}' must be a non-empty list of strings")
        elif field == "gold":
            if not isinstance(value, int) or isinstance(value, bool):
                raise BurnoutError(f"{where}: 'gold' must be an integer index, not {json.dumps(value)}")
            if not 0 <= value < len(record[options_key]):
                raise BurnoutError(f"{where}: gold {value} is out of range for its {len(record[options_key])} "
                                   f"{options_key} (0 to {len(record[options_key]) - 1})")
        elif not isinstance(value, str):
            raise BurnoutError(f"{where}: '{field}' must be a string, not {json.dumps(value)[:40]}")


def _open_text(path: Path) -> io.StringIO:
    """A task file's text to read line by line, as a text file reads (newlines translated), decompressed first when it
    ends in .bz2: a file that is cut short, is not bz2 data or not UTF-8 is a BurnoutError naming it, here, rather
    than an error half way through its lines."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise BurnoutError(f"cannot read task file '{path}': {exc.strerror or first_line(exc)}") from None
    if path.suffix == ".bz2":
        try:
            raw = bz2.decompress(raw)
        except (OSError, ValueError) as exc:  # ValueError: cut short; OSError: not bz2 data
            raise BurnoutError(f"task file '{path}' is not whole bz2 data ({first_line(exc)}): it was cut short or "
                               "damaged; download it again") from None
    try:
        return io.StringIO(raw.decode("utf-8"), newline=None)
    except UnicodeDecodeError as exc:
        raise BurnoutError(f"task file '{path}' is not UTF-8 text (byte {raw[exc.start]:#04x} at offset {exc.start}"
                           f"{' of its decompressed text' if path.suffix == '.bz2' else ''}); save it as UTF-8"
                           ) from None


def _jsonl(path: Path):
    with _open_text(path) as f:
        for number, line in enumerate(f, start=1):
            if line.strip():
                yield number, json.loads(line)


def _is_jsonl(path: Path) -> bool:
    with _open_text(path) as f:
        return f.read(1) == "{"


def _read_hellaswag(path: Path) -> list[dict]:
    """HellaSwag's original jsonl (ctx_a, ctx_b, activity_label, endings, label), with lm-eval's `preprocess` and
    ctx_b capitalised; or llama.cpp's 6-line text records (optionally .bz2), whose first line is the joined
    context. That form has lost the ctx_a/ctx_b boundary, so lm-eval's capitalisation of ctx_b cannot be redone:
    its contexts are scored as written."""
    if _is_jsonl(path):
        out = []
        for number, doc in _jsonl(path):
            ctx = doc["ctx_a"] + " " + doc["ctx_b"].capitalize()
            out.append({"query": hellaswag_preprocess(doc["activity_label"] + ": " + ctx),
                        "choices": [hellaswag_preprocess(e) for e in doc["endings"]], "gold": int(doc["label"]),
                        "_line": number})
        return out
    with _open_text(path) as f:
        lines = f.read().split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if len(lines) % 6:
        raise ValueError(f"{len(lines)} lines is not a whole number of 6-line records")
    out = []
    for i in range(0, len(lines), 6):
        context, label, *endings = lines[i : i + 6]
        out.append({"query": hellaswag_preprocess(context), "choices": [hellaswag_preprocess(e) for e in endings],
                    "gold": int(label), "_line": i + 1})
    return out


def _read_arc(path: Path) -> list[dict]:
    """ARC's original jsonl (question.stem, choices[{text,label}], answerKey), the HF datasets row (question,
    choices{text,label}, answerKey), or MosaicML's (query "Question: …", choices, gold)."""
    out = []
    for number, doc in _jsonl(path):
        if "query" in doc:  # MosaicML: the query already carries the "Question: " prefix
            record = {"query": doc["query"], "choices": doc["choices"], "gold": doc["gold"]}
        else:
            question = doc["question"]
            if isinstance(question, dict):  # original release: question.stem, question.choices
                choices_obj = question["choices"]
                texts = [c["text"] for c in choices_obj]
                labels = [c["label"] for c in choices_obj]
                question = question["stem"]
            else:  # HF datasets row
                texts, labels = doc["choices"]["text"], doc["choices"]["label"]
            record = {"query": f"Question: {question}", "choices": texts, "gold": labels.index(doc["answerKey"])}
        out.append({**record, "_line": number})
    return out


def _read_lambada(path: Path) -> list[dict]:
    """LAMBADA's original jsonl ({"text"}) or MosaicML's (context, continuation)."""
    out = []
    for number, doc in _jsonl(path):
        if "text" in doc:  # original: lm-eval splits off the last space-separated word
            words = doc["text"].split(" ")
            context, word = " ".join(words[:-1]), words[-1]
        else:
            context, word = doc["context"], doc["continuation"]
        out.append({"context": context, "continuation": word, "_line": number})
    return out


# ---------------------------------------------------------------------------------------------- prompts


def needs_prefix_space(tokenizer) -> bool:
    """llm-foundry's `tokenizer_needs_prefix_space`: " a" is one token (GPT-2-style BPE). A char tokenizer without an
    "a" (it raises) needs none either."""
    try:
        return len(tokenizer.encode(" a").ids) == 1
    except Exception:  # the Rust side's bare Exception for a character a char vocabulary lacks
        return False


def fewshot_indices(size: int, num_fewshot: int, item: int, rng: random.Random) -> set[int]:
    """The few-shot examples' indices for item `item` of `size`, drawn from `rng` as llm-foundry draws them
    (llmfoundry/eval/datasets/utils.py `get_fewshot_sample_idxs`): never the item itself. The set's own
    iteration order is the order the examples appear in."""
    k = min(size - 1, num_fewshot)
    chosen = set(rng.sample(range(0, size), k))
    if item not in chosen:
        return chosen
    chosen.remove(item)
    if len(chosen) >= size - 1:
        return chosen
    while True:
        other = rng.choice(range(0, size))
        if other != item and other not in chosen:
            chosen.add(other)
            return chosen


def _answer(task: IclTask, record: dict) -> str:
    """The gold answer as a few-shot example shows it (no space added)."""
    if task.type == "multiple_choice":
        return record["choices"][record["gold"]]
    return record["continuation"]


def _example_text(task: IclTask, record: dict, before: str, add_answer: bool) -> str:
    """llm-foundry's `construct_context` (MC, LM) and the schema dataset's for few-shot examples, appended to the
    text `before` it: [example_delimiter if `before` is not empty] + prelimiter + query + continuation_delimiter
    [+ the gold answer as written, with `add_answer`]; a schema example is prelimiter + [example_delimiter if
    text before] + context_options[gold] + continuation_delimiter + continuation."""
    if task.type == "schema":
        context = record["context_options"][record["gold"]]
        if before:
            context = task.example_delimiter + context
        return f"{task.prelimiter}{context}{task.continuation_delimiter}{record['continuation']}"
    text = task.prelimiter + record["query" if task.type == "multiple_choice" else "context"]
    if before:
        text = task.example_delimiter + text
    text += task.continuation_delimiter
    return text + _answer(task, record) if add_answer else text


def _scored_answer(task: IclTask, text: str, prefix_space: bool) -> str:
    """The answer as scored: after the task's target_delimiter (lm-eval's), else by llm-foundry's rule, with a
    space before it when the tokenizer encodes " a" as one token (GPT-2-style BPE) and it starts with none."""
    if task.target_delimiter is not None:
        return task.target_delimiter + text
    return " " + text if prefix_space and not text.startswith(" ") else text


def item_requests(task: IclTask, record: dict, fewshot_text: str, prefix_space: bool) -> tuple[tuple[str, str], ...]:
    """The item's (context, continuation) requests after `fewshot_text` (prompt_string + few-shot examples): its
    own part rstripped (strip_dataset) and appended to the few-shot text. A schema item gives one context per
    option: after few-shot text, prelimiter + example_delimiter + option + continuation_delimiter.rstrip(); with no
    text before it, prelimiter + option alone."""
    if task.type == "schema":
        continuation = _scored_answer(task, record["continuation"], prefix_space)
        if fewshot_text:
            delimiter = task.continuation_delimiter.rstrip() if task.strip_dataset else task.continuation_delimiter
            contexts = [f"{task.prelimiter}{task.example_delimiter}{c}{delimiter}" for c in record["context_options"]]
        else:
            contexts = [f"{task.prelimiter}{c}" for c in record["context_options"]]
        return tuple((fewshot_text + c, continuation) for c in contexts)
    own = _example_text(task, record, fewshot_text, add_answer=False)
    if task.strip_dataset:  # llm-foundry: "a prompt ending in a space results in degenerate output"
        own = own.rstrip()
    context = fewshot_text + own
    if task.type == "multiple_choice":
        return tuple((context, _scored_answer(task, c, prefix_space)) for c in record["choices"])
    return ((context, _scored_answer(task, record["continuation"], prefix_space)),)


def fewshot_text(task: IclTask, records: list[dict], num_fewshot: int, item: int, rng: random.Random) -> str:
    """prompt_string and the few-shot examples for item `item` (llm-foundry's `_generate_few_shot_prompt`)."""
    text = task.prompt_string
    if num_fewshot > 0:
        for j in fewshot_indices(len(records), num_fewshot, item, rng):
            text += _example_text(task, records[j], text, add_answer=True)
    return text


def partitions(task: IclTask, records: list[dict]) -> list[tuple[str | None, list[dict]]]:
    """(category, its records in file order) in sorted category order; (None, all) without categories."""
    if not task.has_categories:
        return [(None, records)]
    by_category: dict[str, list[dict]] = {}
    for record in records:
        by_category.setdefault(str(record["category"]), []).append(record)
    return sorted(by_category.items())


def check_fewshot(task: IclTask, records: list[dict], shots: tuple[int, ...] | None = None) -> None:
    """Each shot count (default: the task's) has enough records besides the item in every category: llm-foundry
    would quietly use fewer examples; here it is an error."""
    most = max(task.num_fewshot if shots is None else shots)
    for category, group in partitions(task, records):
        if most > len(group) - 1:
            where = f"category '{category}' of " if category is not None else ""
            raise BurnoutError(
                f"task '{task.label}': {most}-shot needs more examples than {where}'{task.path}' "
                f"has ({len(group)} records: at most {len(group) - 1} besides the item itself); lower num_fewshot"
            )


def build_items(task: IclTask, records: list[dict], num_fewshot: int, prefix_space: bool,
                limit: int | None = None) -> list[Item]:
    """The first `limit` items (all when None) of each category of `task` with `num_fewshot` examples each, built
    as llm-foundry's InContextLearningDataset and its subclasses build them (in_context_learning_evaluation.py).

    Few-shot examples come from all of the category's records (the limit only cuts which items are
    scored), drawn from a fresh random.Random(task.fewshot_random_seed) per category in record order, so an
    item's prompt does not depend on the limit.

    llm-foundry tokenizes the few-shot text, the item's context and the answer apart and joins the ids; scoring
    encodes as lm-eval does (context, then context + continuation), so that scores equal lm-eval's on the same
    strings. Where the two could differ (a BPE merge across a boundary), the rstrip and the leading space keep the
    parts apart. A prompt too long for the window loses tokens on the left in both (lm-eval's cut keeps one
    prompt token more than llm-foundry's `trim_context`; the last token's prediction is not used).
    """
    check_fewshot(task, records, (num_fewshot,))
    items = []
    for category, group in partitions(task, records):
        rng = random.Random(task.fewshot_random_seed)
        count = len(group) if limit is None else min(limit, len(group))
        for i in range(count):
            record = group[i]
            text = fewshot_text(task, group, num_fewshot, i, rng)
            requests = item_requests(task, record, text, prefix_space)
            if task.type == "multiple_choice":
                choices = tuple(record["choices"])
            elif task.type == "schema":
                choices = tuple(record["context_options"])
            else:
                choices = (record["continuation"],)
            line = record.get("_line", 0)
            where = f"task '{task.label}' item {i}" + (f" of category '{category}'" if category is not None else "")
            where += f" ({Path(task.path).name} line {line})" if line and task.path is not None else ""
            items.append(Item(requests, choices, int(record.get("gold", 0)), i, category, where))
    return items
