"""Prompts: the built-in ones, a prompts file read the same way by every command that takes one, and a run's own
sample prompts (`sample_prompts`), which every command that shows or suggests a run's samples reads."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from burnout.base.files import RUN_CONFIG_FILE, SAMPLE_PROMPTS_FILE, write_atomic
from burnout.config import RunConfig, load_saved_config
from burnout.core.checkpoint import run_dir_of
from burnout.data.documents import SplitDocuments
from burnout.data.shards import read_meta
from burnout.data.tokenizer import name_characters, unencodable
from burnout.errors import BurnoutError

# `burnout compare`'s default for a run that recorded no sample prompts: one question, one open sentence, one piece
# of code.
COMPARE_PROMPTS = ("What is the capital of France?", "The meaning of life is", "def fibonacci(n):")
# A run's sample prompts when train.sample_prompt gives none (`data_prompts`): the first PROMPT_WORDS words of a line
# of its val split that goes on past them, RUN_PROMPTS distinct ones, looked for at PLACES_TRIED seeded places, each
# in the first WINDOW_TOKENS tokens read there. Words of its own kind of text that the text goes on after, which the
# model continues: on WikiText-2, whose every line ends with a lone space token, "The " (a space last) ended every
# sample at once.
PROMPT_WORDS, RUN_PROMPTS, PLACES_TRIED, WINDOW_TOKENS = 6, 3, 64, 512


def read_prompts(path: str | Path) -> list[str]:
    """One prompt per non-empty line; a literal \\n inside a line stands for a newline."""
    path = Path(path)
    if not path.is_file():
        raise BurnoutError(f"prompts file '{path}' does not exist; give a text file with one prompt per line")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise BurnoutError(f"prompts file '{path}' is not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset "
                           f"{exc.start}); save it as UTF-8") from None
    prompts = [line.replace("\\n", "\n") for line in text.splitlines() if line.strip()]
    if not prompts:
        raise BurnoutError(f"prompts file '{path}' has no prompts; write one prompt per line")
    return prompts


def builtin_prompts_for(tokenizer: Tokenizer, prompts: Sequence[str], say: Callable[[str], None],
                        option: str = "--prompts FILE") -> list[str]:
    """The built-in `prompts` that `tokenizer` can encode, each one left out said in a line: a char model knows only
    the characters of its text (Shakespeare has no parentheses for "def fibonacci(n):"). None left is a BurnoutError
    that says to give prompts of one's own (`option`)."""
    kept = []
    for prompt in prompts:
        if missing := unencodable(tokenizer, prompt):
            say(f"left out the built-in prompt {prompt!r}: the tokenizer has no token for {name_characters(missing)} "
                f"(give your own prompts with {option})")
        else:
            kept.append(prompt)
    if not kept:
        raise BurnoutError(f"none of the built-in prompts can be encoded by this tokenizer (it lacks characters of "
                           f"each: a char model knows only those of its text); give prompts of its text with {option}")
    return kept


def data_prompts(data_dir: str | Path, seed: int, tokenizer: Tokenizer, context_length: int,
                 count: int = RUN_PROMPTS) -> list[str]:
    """Up to `count` distinct prompts from the val split of the prepared folder `data_dir`: at token positions drawn
    with `seed` (a place in a long document is as likely as its length), the first line there with more than
    PROMPT_WORDS words, cut to those words. A document whose val part may start mid-line (its source has documents
    cut between train and val) gives a line that starts after a newline past the position; any other gives its own
    first such line. Never across a document's start; only prompts `tokenizer` encodes in fewer than
    `context_length` tokens. The same folder and seed give the same prompts."""
    meta = read_meta(data_dir)
    docs = SplitDocuments(data_dir, "val", meta)
    per_source = meta.get("sources", {}).get("per_source", {})
    cut_sources = {name for name, source in per_source.items() if source.get("cut_documents")}
    prompts: list[str] = []
    if docs.total == 0:
        return prompts
    for position in np.random.default_rng(seed).integers(0, docs.total, size=PLACES_TRIED):
        span = docs.span(int(docs.locate(position)))
        start = int(docs.starts[span.index])
        cut = span.source in cut_sources
        begin = int(position) if cut else start
        ids = docs.read(begin, min(start + span.length, begin + WINDOW_TOKENS))
        lines = tokenizer.decode(ids.tolist()).splitlines()
        words = next((line.split() for line in lines[1 if cut else 0:] if len(line.split()) > PROMPT_WORDS), None)
        prompt = " ".join(words[:PROMPT_WORDS]) if words else None
        if (prompt is not None and prompt not in prompts and not unencodable(tokenizer, prompt)
                and len(tokenizer.encode(prompt).ids) < context_length):
            prompts.append(prompt)
            if len(prompts) == count:
                break
    return prompts


def choose_sample_prompts(cfg: RunConfig, run_dir: Path, draw: Callable[[], list[str]]) -> tuple[list[str], str]:
    """A training run's sample prompts and where they came from: train.sample_prompt when given; else those the run
    drew from its data before (RUN/sample_prompts.json: fixed across a resume), else `draw()`'s (its recipe's)."""
    if cfg.train.eval.sample_prompt:
        return [cfg.train.eval.sample_prompt], "train.sample_prompt"
    recorded = _read_record(run_dir / SAMPLE_PROMPTS_FILE)
    if recorded is not None and recorded["from"] != "train.sample_prompt":
        return recorded["prompts"], recorded["from"]
    return draw(), "the val split's documents"


def write_sample_prompts(run_dir: Path, prompts: list[str], source: str) -> None:
    """Record a run's sample prompts in RUN/sample_prompts.json, which `sample_prompts` reads."""
    record = {"prompts": prompts, "from": source}
    if _read_record(run_dir / SAMPLE_PROMPTS_FILE) != record:
        write_atomic(run_dir / SAMPLE_PROMPTS_FILE, json.dumps(record, indent=2, ensure_ascii=False) + "\n")


def sample_prompts(path: str | Path) -> list[str]:
    """The sample prompts of a run folder or of one of its checkpoints: those its training recorded (the first is
    sampled at each evaluation); for a run that predates the record, or a checkpoint away from its run, its config's
    train.sample_prompt; none when it has neither."""
    path = Path(path)
    recorded = _read_record(run_dir_of(path) / SAMPLE_PROMPTS_FILE)
    if recorded is not None:
        return recorded["prompts"]
    if (path / RUN_CONFIG_FILE).is_file():
        prompt = load_saved_config(path / RUN_CONFIG_FILE).train.eval.sample_prompt
        return [prompt] if prompt else []
    return []


def suggested_prompt(path: str | Path) -> str:
    """The prompt a next step suggests continuing with a run's (or checkpoint's) model: its first sample prompt,
    "The " for one with none (an imported model, a run with samples off and no line to draw from)."""
    return (sample_prompts(path) or ["The "])[0]


def _read_record(path: Path) -> dict | None:
    """RUN/sample_prompts.json as written, or None when there is none."""
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise BurnoutError(f"cannot read the run's sample prompts {path} ({exc}); delete it and train again with "
                           "--resume, which draws them again") from None
    if not (isinstance(record, dict) and isinstance(record.get("from"), str) and isinstance(record.get("prompts"), list)
            and all(isinstance(p, str) and p for p in record["prompts"])):
        raise BurnoutError(f"{path} does not hold a run's sample prompts ({{\"prompts\": [...], \"from\": ...}}); "
                           "delete it and train again with --resume, which draws them again")
    return record
