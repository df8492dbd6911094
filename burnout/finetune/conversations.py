"""Conversations and preference pairs as people store them: the readers of every layout `burnout sft` and
`burnout dpo` take, from local json / jsonl / parquet files or a Hugging Face dataset streamed by name.

    layouts    messages ({"messages": [{"role", "content"}]}), sharegpt ({"conversations": [{"from", "value"}]}),
               alpaca (instruction / input / output), qa (question / answer, prompt / completion or response),
               oasst (OpenAssistant's message trees: one thread per root, the best-ranked reply at each level),
               pairs (prompt / chosen / rejected, or chosen / rejected as whole conversations or Human:/Assistant:
               transcripts)

A layout is detected from the first record's fields unless given. Every record is checked as it is read: a
bad one is one line naming its file and record number. The conversations come out as lists of
{"role", "content"} messages; burnout/core/chat_template.py renders and tokenizes them.
"""

from __future__ import annotations

import glob
import itertools
import json
import os
import re
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tokenizers import Tokenizer

from burnout.base.text import first_line, install_extra
from burnout.base.values import kind_of
from burnout.core.chat_template import (
    Conversation,
    check_messages,
    encode_conversations,
    message_text,
    normalize_messages,
)
from burnout.errors import BurnoutError


@dataclass
class PreferencePair:
    prompt: list[dict]  # ends before an assistant turn
    chosen: list[dict]  # the continuations: start with an assistant turn
    rejected: list[dict]
    where: str = ""



def encode_pair(tokenizer: Tokenizer, pair: PreferencePair) -> tuple[list[int], tuple, tuple]:
    """(prompt_ids, (chosen_ids, chosen_mask), (rejected_ids, rejected_mask)) of a preference pair.

    prompt_ids end with the generation prompt "<|im_start|>assistant\\n" (encode_prompt's ids for the
    prompt); each side holds the rest of its conversation, masked on its assistant tokens.
    """
    where = pair.where or "pair"
    sides = []
    for side in (pair.chosen, pair.rejected):
        conversation = Conversation(pair.prompt + side, where)
        ids, mask, starts = encode_conversations(tokenizer, [conversation])[0]
        sides.append((ids, mask, starts[len(pair.prompt)]))
    (chosen, chosen_mask, cut), (rejected, rejected_mask, _) = sides
    if chosen[:cut] != rejected[:cut]:
        raise BurnoutError(f"{where}: the prompt encodes differently before the chosen and the rejected answer")
    return chosen[:cut], (chosen[cut:], chosen_mask[cut:]), (rejected[cut:], rejected_mask[cut:])




# ----------------------------------------------------------------------------------------------
# Records: local json / jsonl / parquet files, or a Hugging Face dataset streamed by name

HF_PREFIX = "hf:"
_FILE_SUFFIXES = (".json", ".jsonl", ".parquet")


def iter_records(source: str | Path, split: str = "train", subset: str | None = None,
                 data_files: str | None = None) -> Iterator[tuple[str, dict]]:
    """(where, record) for each record of `source`: a file, a folder (its json/jsonl/parquet files), a glob,
    or "hf:NAME" (a Hugging Face dataset, streamed: `split`, `subset`, `data_files`)."""
    text = str(source)
    if text.startswith(HF_PREFIX):
        yield from _hf_records(text[len(HF_PREFIX):], split, subset, data_files)
        return
    for path in _local_files(os.path.expanduser(text)):
        records = _parquet_records(path) if path.suffix == ".parquet" else _json_records(path)
        for number, record in enumerate(records, start=1):
            where = f"'{path}' record {number}"
            if not isinstance(record, dict):
                raise BurnoutError(f"{where} is {kind_of(record)}, expected a JSON object")
            yield where, record


def _local_files(raw: str) -> list[Path]:
    if set("*?[") & set(raw):
        files = sorted(Path(p) for p in glob.glob(raw, recursive=True) if Path(p).is_file())
    elif Path(raw).is_dir():
        files = sorted(p for p in Path(raw).rglob("*") if p.is_file() and p.suffix in _FILE_SUFFIXES)
    elif Path(raw).is_file():
        files = [Path(raw)]
    else:
        raise BurnoutError(f"SFT data '{raw}' does not exist; give a .json/.jsonl/.parquet file, a folder, "
                           f"a glob, or {HF_PREFIX}DATASET")
    if not files:
        raise BurnoutError(f"SFT data '{raw}' holds no .json, .jsonl or .parquet files")
    for path in files:
        if path.suffix not in _FILE_SUFFIXES:
            raise BurnoutError(f"SFT data file '{path}': unsupported type; use .json, .jsonl or .parquet")
    return files


def _json_records(path: Path) -> Iterator:
    """A .json file holding one JSON array, or JSON lines (in a .jsonl or a .json file)."""
    try:
        with path.open(encoding="utf-8-sig") as f:
            head = f.read(4096).lstrip()
            f.seek(0)
            if head.startswith("["):
                try:
                    yield from json.load(f)
                except json.JSONDecodeError as exc:
                    raise BurnoutError(f"'{path}' is not valid JSON ({exc}); fix the file") from None
                return
            for number, line in enumerate((line for line in f if line.strip()), start=1):
                try:
                    yield json.loads(line)
                except json.JSONDecodeError as exc:
                    raise BurnoutError(f"'{path}' record {number} is not valid JSON ({exc.msg}); "
                                       "fix or remove that line") from None
    except UnicodeDecodeError as exc:
        raise BurnoutError(f"'{path}' is not UTF-8 (invalid byte at offset {exc.start}); convert it") from None
    except OSError as exc:
        raise BurnoutError(f"cannot read '{path}': {exc.strerror}") from None


def _parquet_records(path: Path) -> Iterator[dict]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise BurnoutError(f"parquet files need pyarrow; {install_extra('data')}") from None
    try:
        parquet = pq.ParquetFile(path)
    except Exception as exc:  # pyarrow raises ArrowInvalid for bytes that are not parquet
        raise BurnoutError(f"'{path}' is not a readable parquet file ({first_line(exc)})") from None
    for group in range(parquet.num_row_groups):
        yield from parquet.read_row_group(group).to_pylist()


def _hf_records(name: str, split: str, subset: str | None, data_files: str | None) -> Iterator[tuple[str, dict]]:
    try:
        import datasets
    except ImportError:
        raise BurnoutError(f"{HF_PREFIX}{name} needs the datasets package; {install_extra('data')}") from None
    kwargs = {"data_files": os.path.expanduser(data_files)} if data_files else {}
    try:
        dataset = datasets.load_dataset(name, subset, split=split, streaming=True, **kwargs)
        for number, record in enumerate(dataset, start=1):
            yield f"dataset '{name}' record {number}", dict(record)
    except BurnoutError:
        raise
    except Exception as exc:  # datasets raises many types (FileNotFoundError, ValueError, HTTP errors)
        raise BurnoutError(f"cannot stream dataset '{name}' (split {split}): {first_line(exc)}") from None


# ----------------------------------------------------------------------------------------------
# Layouts

# Checked in this order against the first record's keys.
_LAYOUT_KEYS = (
    ("pairs", ("chosen", "rejected")),
    ("messages", ("messages",)),
    ("sharegpt", ("conversations",)),
    ("oasst", ("message_id", "parent_id")),
    ("alpaca", ("instruction", "output")),
    ("qa", ("question", "answer")),
    ("qa", ("prompt", "completion")),
    ("qa", ("prompt", "response")),
)
LAYOUTS = ("messages", "sharegpt", "alpaca", "qa", "oasst", "pairs")


def detect_layout(record: dict, where: str, pairs: bool = False) -> str:
    """The layout whose fields `record` has; `pairs`: the reader wants preference pairs, which have no layout to
    set (`burnout dpo` has no --layout), so a record without their fields is refused as not a pair."""
    for layout, keys in _LAYOUT_KEYS:
        if all(key in record for key in keys):
            return layout
    fields = ", ".join(map(str, record)) or "none"
    if pairs:
        missing = " and ".join(key for key in ("chosen", "rejected") if key not in record)
        raise BurnoutError(f"{where}: a preference pair needs prompt, chosen and rejected fields, and this record has "
                           f"no {missing} (its fields: {fields}); give every pair both answers")
    raise BurnoutError(f"{where}: unknown layout (fields: {fields}); set the layout to one of {', '.join(LAYOUTS)}")


class ConversationReader:
    """The conversations of `source` (see iter_records for `options`: split, subset, data_files), validated,
    in file order; `skipped` counts the records left out, by reason, once iterated.

    layout "auto" detects it from the first record's fields. A record whose assistant message is empty
    is skipped ("empty answer": real data has them, e.g. 2 of Alpaca's 5,000), while a conversation
    with no assistant turn at all is an error (it means the roles or the layout are misread).
    OpenAssistant message trees give one thread per root: the best-ranked reply at each level, deleted
    messages left out; a root nobody answered is skipped ("no assistant reply").
    """

    def __init__(self, source: str | Path, layout: str = "auto", **options) -> None:
        self.source, self.layout, self.options = source, layout, options
        self.skipped: Counter[str] = Counter()

    def __iter__(self) -> Iterator[Conversation]:
        self.skipped.clear()
        layout, records = _open(self.source, self.layout, self.options)
        if layout == "pairs":
            raise BurnoutError(f"'{self.source}' holds preference pairs (chosen/rejected); read it with read_pairs")
        if layout == "oasst":
            records = _oasst_threads(records, self.skipped)
        convert = _CONVERTERS[layout]
        for where, record in records:
            messages = normalize_messages(convert(record, where), where)
            if any(m["role"] == "assistant" and not m["content"].strip() for m in messages):
                self.skipped["empty answer"] += 1
                continue
            yield Conversation(check_messages(messages, where), where)


def read_conversations(source: str | Path, layout: str = "auto", **options) -> ConversationReader:
    """The conversations of `source`: see ConversationReader."""
    return ConversationReader(source, layout, **options)


def read_pairs(source: str | Path, layout: str = "auto", **options) -> Iterator[PreferencePair]:
    """The preference pairs of `source`: prompt/chosen/rejected (strings or message lists), or chosen/rejected
    as whole conversations or "\\n\\nHuman: …\\n\\nAssistant: …" transcripts, the shared turns being the prompt."""
    layout, records = _open(source, layout, options, pairs=True)
    if layout != "pairs":
        raise BurnoutError(f"'{source}' has the {layout} layout, not preference pairs (chosen/rejected)")
    for where, record in records:
        yield _pair(record, where)


def _open(source, layout: str, options: dict, pairs: bool = False) -> tuple[str, Iterator[tuple[str, dict]]]:
    if layout != "auto" and layout not in LAYOUTS:
        raise BurnoutError(f"layout '{layout}' is not one of auto, {', '.join(LAYOUTS)}")
    records = iter_records(source, **options)
    first = next(records, None)
    if first is None:
        raise BurnoutError(f"SFT data '{source}' holds no records")
    return (detect_layout(first[1], first[0], pairs) if layout == "auto" else layout), itertools.chain([first], records)


def _field(record: dict, key: str, where: str):
    if key not in record:
        raise BurnoutError(f"{where} has no field '{key}' (it has {', '.join(map(str, record))}); "
                           "check the layout")
    return record[key]


def _from_messages(record: dict, where: str) -> list:
    return _field(record, "messages", where)


def _from_sharegpt(record: dict, where: str) -> list:
    return _field(record, "conversations", where)


def _from_alpaca(record: dict, where: str) -> list[dict]:
    instruction = message_text(_field(record, "instruction", where), f"{where}: instruction")
    extra = message_text(record.get("input"), f"{where}: input").strip()
    prompt = f"{instruction.strip()}\n\n{extra}" if extra else instruction
    return [{"role": "user", "content": prompt},
            {"role": "assistant", "content": message_text(_field(record, "output", where), f"{where}: output")}]


def _from_qa(record: dict, where: str) -> list[dict]:
    for question, answer in (("question", "answer"), ("prompt", "completion"), ("prompt", "response")):
        if question in record and answer in record:
            return [{"role": "user", "content": message_text(record[question], f"{where}: {question}")},
                    {"role": "assistant", "content": message_text(record[answer], f"{where}: {answer}")}]
    raise BurnoutError(f"{where}: the qa layout needs question/answer, prompt/completion or prompt/response "
                       f"fields (it has {', '.join(map(str, record))})")


_CONVERTERS = {"messages": _from_messages, "sharegpt": _from_sharegpt, "alpaca": _from_alpaca, "qa": _from_qa,
               "oasst": _from_messages}


@dataclass
class _TreeNode:
    where: str
    role: str
    text: str
    rank: float
    children: list[_TreeNode] = field(default_factory=list)


def _oasst_threads(records: Iterable[tuple[str, dict]], skipped: Counter) -> Iterator[tuple[str, dict]]:
    """(where of the root, {"messages": thread}) per message tree."""
    nodes: dict[str, _TreeNode] = {}
    parents: list[tuple[str, str | None]] = []
    for where, record in records:
        if record.get("deleted"):
            continue
        role = _field(record, "role", where)
        if role not in ("prompter", "assistant"):
            raise BurnoutError(f"{where}: unknown role {role!r}; OpenAssistant messages are prompter or assistant")
        rank = record.get("rank")
        node = _TreeNode(where, role, message_text(_field(record, "text", where), f"{where}: text"),
                         float("inf") if rank is None else float(rank))
        nodes[str(_field(record, "message_id", where))] = node
        parent = record.get("parent_id")
        parents.append((str(_field(record, "message_id", where)), None if parent is None else str(parent)))
    roots = []
    for message_id, parent in parents:
        if parent is None:
            roots.append(nodes[message_id])
        elif parent in nodes:  # a reply to a deleted message goes with it
            nodes[parent].children.append(nodes[message_id])
    for root in roots:
        thread, node = [], root
        while node is not None:
            thread.append({"role": node.role, "content": node.text})
            # min keeps the first of equal ranks: the order of the file decides ties.
            node = min(node.children, key=lambda child: child.rank, default=None)
        while thread and thread[-1]["role"] != "assistant":
            thread.pop()
        if thread:
            yield root.where, {"messages": thread}
        else:
            skipped["no assistant reply"] += 1


# ----------------------------------------------------------------------------------------------
# Preference pairs

_HH_TURN = re.compile(r"(?:^|\n\n)(Human|Assistant):")


def _pair(record: dict, where: str) -> PreferencePair:
    chosen, rejected = (_pair_field(record, key, where, "assistant") for key in ("chosen", "rejected"))
    prompt_key = next((k for k in ("prompt", "question", "instruction") if k in record), None)
    if prompt_key is None:  # whole conversations: the turns they share are the prompt
        shared = 0
        while shared < min(len(chosen), len(rejected)) and _same(chosen[shared], rejected[shared]):
            shared += 1
        while shared and chosen[shared - 1]["role"] == "assistant":
            shared -= 1
        prompt = chosen[:shared]
    else:
        prompt = _pair_field(record, prompt_key, where, "user")
        if prompt and prompt[-1]["role"] == "assistant" and not prompt[-1]["content"].strip():
            prompt.pop()  # the "\n\nAssistant:" that ends an HH prompt: the generation header
        if isinstance(record.get("system"), str) and record["system"].strip():
            prompt.insert(0, {"role": "system", "content": record["system"]})
    # A side that repeats the prompt (a whole conversation) keeps only what follows it.
    chosen, rejected = (side[len(prompt):] if all(map(_same, side, prompt)) and len(side) >= len(prompt) else side
                        for side in (chosen, rejected))
    if not prompt:
        raise BurnoutError(f"{where}: the pair has no prompt (chosen and rejected share no turns); "
                           "give a prompt field or conversations that share their first turns")
    for name, side in (("chosen", chosen), ("rejected", rejected)):
        if not side or not any(m["role"] == "assistant" and m["content"].strip() for m in side):
            raise BurnoutError(f"{where}: the {name} side is empty; every pair needs two non-empty answers")
        if side[0]["role"] != "assistant":
            raise BurnoutError(f"{where}: the {name} side starts with a {side[0]['role']} turn, not the answer")
    return PreferencePair(check_messages(prompt, where, need_assistant=False), check_messages(chosen, where),
                          check_messages(rejected, where), where)


def _same(a: dict, b: dict) -> bool:
    return a["role"] == b["role"] and a["content"].strip() == b["content"].strip()


def _pair_field(record: dict, key: str, where: str, plain_role: str) -> list[dict]:
    """A field as messages: a message list, an "\n\nHuman: …\n\nAssistant: …" transcript, or plain text
    (one `plain_role` turn; none when empty)."""
    value = _field(record, key, where)
    if isinstance(value, list):
        return normalize_messages(value, f"{where} ({key})") if value else []
    text = message_text(value, f"{where}: {key}")
    parts = _HH_TURN.split(text)
    if len(parts) > 1 and not parts[0].strip():
        return [{"role": "user" if role == "Human" else "assistant", "content": content.strip()}
                for role, content in zip(parts[1::2], parts[2::2])]
    return [{"role": plain_role, "content": text}] if text.strip() else []
