"""Zero-shot benchmark tasks, built exactly as lm-evaluation-harness (0.4.x) builds its requests.

Each task turns a data file into examples of (context, continuations, gold):

    hellaswag  context "{activity_label}: {ctx}", continuations " {ending}" × 4   (lm-eval `hellaswag`)
    arc_easy   context "Question: {question}\\nAnswer:", continuations " {choice}"  (lm-eval `arc_easy`)
    lambada    context = the passage minus its last word, continuation " {last word}" (`lambada_openai`)

Readers accept the original release formats and the local copies in shared/data:

    hellaswag  original jsonl (ctx_a, ctx_b, activity_label, endings, label), with lm-eval's `preprocess`
               and ctx_b capitalised; or llama.cpp's 6-line text records (optionally .bz2), whose first
               line is the already-joined context. That form has lost the ctx_a/ctx_b boundary, so lm-eval's
               capitalisation of ctx_b cannot be redone: its contexts are scored as written.
    arc_easy   original jsonl (question.stem / choices[{text,label}] / answerKey), the HF datasets row
               (question / choices{text,label} / answerKey), or MosaicML's (query "Question: …", choices, gold)
    lambada    original jsonl ({"text"}) or MosaicML's (context, continuation)
"""

from __future__ import annotations

import bz2
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

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


def load_task(task: str, path: str | Path, limit: int | None = None) -> list[Example]:
    """The first `limit` examples (all when None) of `task` read from `path`."""
    path = Path(path)
    readers = {"hellaswag": _read_hellaswag, "arc_easy": _read_arc, "lambada": _read_lambada}
    if task not in readers:
        raise BurnoutError(f"unknown task '{task}'; the benchmark tasks are {', '.join(BENCHMARKS)}")
    try:
        examples = readers[task](path, limit)
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise BurnoutError(
            f"task '{task}': '{path}' is not in a format this reader knows ({type(exc).__name__}: {exc}); "
            "see burnout/eval/tasks.py for the accepted layouts"
        ) from None
    if not examples:
        raise BurnoutError(f"task '{task}': '{path}' holds no examples")
    return examples


def _open_text(path: Path):
    return bz2.open(path, "rt", encoding="utf-8") if path.suffix == ".bz2" else open(path, encoding="utf-8")


def _jsonl(path: Path, limit: int | None):
    with _open_text(path) as f:
        for line in f:
            if limit is not None and limit <= 0:
                return
            if line.strip():
                yield json.loads(line)
                if limit is not None:
                    limit -= 1


def _is_jsonl(path: Path) -> bool:
    with _open_text(path) as f:
        return f.read(1) == "{"


def _read_hellaswag(path: Path, limit: int | None) -> list[Example]:
    if _is_jsonl(path):
        out = []
        for doc in _jsonl(path, limit):
            ctx = doc["ctx_a"] + " " + doc["ctx_b"].capitalize()
            out.append(Example(
                hellaswag_preprocess(doc["activity_label"] + ": " + ctx),
                tuple(hellaswag_preprocess(e) for e in doc["endings"]),
                int(doc["label"]),
            ))
        return out
    with _open_text(path) as f:
        lines = f.read().split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if len(lines) % 6:
        raise ValueError(f"{len(lines)} lines is not a whole number of 6-line records")
    out = []
    for i in range(0, len(lines), 6):
        if limit is not None and len(out) >= limit:
            break
        context, label, *endings = lines[i : i + 6]
        out.append(Example(hellaswag_preprocess(context), tuple(hellaswag_preprocess(e) for e in endings), int(label)))
    return out


def _read_arc(path: Path, limit: int | None) -> list[Example]:
    out = []
    for doc in _jsonl(path, limit):
        if "query" in doc:  # MosaicML: the query already carries the "Question: " prefix
            context = doc["query"] + "\nAnswer:"
            choices, gold = doc["choices"], int(doc["gold"])
        else:
            question = doc["question"]
            if isinstance(question, dict):  # original release: question.stem, question.choices
                choices_obj = question["choices"]
                texts = [c["text"] for c in choices_obj]
                labels = [c["label"] for c in choices_obj]
                question = question["stem"]
            else:  # HF datasets row
                texts, labels = doc["choices"]["text"], doc["choices"]["label"]
            context = f"Question: {question}\nAnswer:"
            choices, gold = texts, labels.index(doc["answerKey"])
        out.append(Example(context, tuple(choices), gold))
    return out


def _read_lambada(path: Path, limit: int | None) -> list[Example]:
    out = []
    for doc in _jsonl(path, limit):
        if "text" in doc:  # original: lm-eval splits off the last space-separated word
            words = doc["text"].split(" ")
            context, word = " ".join(words[:-1]), words[-1]
        else:
            context, word = doc["context"], doc["continuation"]
        out.append(Example(context, (word,), 0))
    return out
