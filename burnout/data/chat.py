"""Conversations: the ChatML template, its tokenization and loss mask, and readers for the SFT layouts.

A conversation is a list of {"role": "system" | "user" | "assistant", "content": str}, rendered as

    <|im_start|>{role}\\n{content}<|im_end|>\\n        per turn
    <|im_start|>assistant\\n                           the generation prompt

How the template is tokenized (`encode_conversation`, `encode_prompt`):

- `<|im_start|>` and `<|im_end|>` are special added tokens, one id each, inserted by id: never split,
  and never produced from text. Message text is encoded with the tokenizer's special-token matching
  off, so a message that contains the string "<|im_end|>" gets its bytes, not a turn boundary (no
  injection from data or from a chat user). transformers' `apply_chat_template` parses such strings as
  control tokens; for any text without them the ids are identical (test).
- Each stretch of text between two control tokens ("user\\nHello", "\\n") is encoded in one call, as
  the tokenizer splits the rendered string at its added tokens, so the ids equal `apply_chat_template`'s
  (tested with our byte-level BPE and GPT-2's; a SentencePiece-style pre-tokenizer that marks only the
  string's first piece would differ). A token belongs to the content when it starts after the role
  header's newline (character offsets).
- Content is stripped of leading and trailing whitespace (the Jinja template's `| trim`, the same
  Python `str.strip`). With byte-level BPE the header's "\\n" followed by a non-space character is
  always a pre-token boundary, so no token straddles header and content, and the generation prompt's
  ids are a prefix of the ids of the same conversation with the answer (what training saw is what
  inference feeds). The price: a message's leading indentation or blank lines are dropped.
- The loss mask (train_on="assistant") is true on each assistant turn's content tokens and its closing
  `<|im_end|>` (the model learns to stop), false on system and user turns, the role headers and the
  newline between turns. train_on="all" trains on every token.
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

from burnout.common import first_line
from burnout.errors import BurnoutError

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
CHAT_TOKENS = (IM_START, IM_END)
ROLES = ("system", "user", "assistant")
TRAIN_ON = ("assistant", "all")

# For tokenizer_config.json's "chat_template": the same text, tokenized by transformers, gives exactly
# encode_prompt's ids (add_generation_prompt=True) and encode_conversation's (False).
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] | trim + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

# The role names of the layouts read here (ShareGPT's human/gpt, OpenAssistant's prompter).
_ROLE_ALIASES = {"system": "system", "user": "user", "human": "user", "prompter": "user",
                 "assistant": "assistant", "gpt": "assistant"}


@dataclass
class Conversation:
    messages: list[dict]
    where: str = ""  # "'FILE' record N": for error messages


@dataclass
class PreferencePair:
    prompt: list[dict]  # ends before an assistant turn
    chosen: list[dict]  # the continuations: start with an assistant turn
    rejected: list[dict]
    where: str = ""


# ----------------------------------------------------------------------------------------------
# Messages


def check_messages(messages, where: str, need_assistant: bool = True) -> list[dict]:
    """`messages` as clean {"role", "content"} dicts (role aliases resolved, text parts joined).

    One-line BurnoutError naming `where` for: not a list of objects, an unknown role, content that is not
    text, no assistant turn (when `need_assistant`), an assistant turn with empty content.
    """
    clean = _messages(messages, where)
    for number, message in enumerate(clean, start=1):
        if message["role"] == "assistant" and not message["content"].strip():
            raise BurnoutError(f"{where}: assistant message {number} is empty; remove the record or fill it in")
    if need_assistant and not any(m["role"] == "assistant" for m in clean):
        raise BurnoutError(f"{where}: the conversation has no assistant turn, so nothing to learn from; "
                           "every conversation needs at least one")
    return clean


def _messages(messages, where: str) -> list[dict]:
    if not isinstance(messages, list) or not messages:
        raise BurnoutError(f"{where}: expected a non-empty list of messages, got {_describe(messages)}")
    clean = []
    for number, message in enumerate(messages, start=1):
        if not isinstance(message, dict):
            raise BurnoutError(f"{where}: message {number} is {_describe(message)}, expected an object")
        raw_role = message.get("role", message.get("from"))
        role = _ROLE_ALIASES.get(raw_role.lower()) if isinstance(raw_role, str) else None
        if role is None:
            raise BurnoutError(f"{where}: unknown role {raw_role!r} in message {number}; "
                               f"use {', '.join(ROLES)} (or human/gpt/prompter)")
        clean.append({"role": role, "content": _text(message.get("content", message.get("value")),
                                                     f"{where}: message {number}")})
    return clean


def _text(content, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    # OpenAI's list of parts: [{"type": "text", "text": ...}]
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in content):
        return "".join(str(p.get("text", "")) for p in content)
    raise BurnoutError(f"{where}: content is {_describe(content)}, expected text")


def _describe(value) -> str:
    return "empty" if value in ("", [], {}, None) else type(value).__name__


# ----------------------------------------------------------------------------------------------
# Tokenizer


def chat_token_ids(tokenizer: Tokenizer) -> tuple[int, int]:
    """The ids of <|im_start|> and <|im_end|>; a BurnoutError when the tokenizer lacks them as special tokens."""
    specials = {t.content: i for i, t in tokenizer.get_added_tokens_decoder().items() if t.special}
    missing = [t for t in CHAT_TOKENS if t not in specials]
    if missing:
        raise BurnoutError(f"the tokenizer has no {' or '.join(missing)} special token; "
                           "add them with burnout.data.chat.ensure_chat_tokens (and grow the model to match)")
    return specials[IM_START], specials[IM_END]


def ensure_chat_tokens(tokenizer: Tokenizer) -> tuple[Tokenizer, list[str]]:
    """A copy of `tokenizer` with <|im_start|> and <|im_end|> as special tokens, and the ones it had to add.

    A token the vocabulary held as ordinary text is registered as special under its id; a missing one
    gets the next id. A tokenizer that then cannot encode the template (a char tokenizer without the
    letters of the role names) is a BurnoutError: it cannot be extended for chat.
    """
    tok = Tokenizer.from_str(tokenizer.to_str())  # the caller's tokenizer stays as it was
    specials = {t.content for t in tok.get_added_tokens_decoder().values() if t.special}
    added = [t for t in CHAT_TOKENS if t not in specials]
    if added:
        tok.add_special_tokens(added)
    for token in CHAT_TOKENS:
        if tok.encode(token, add_special_tokens=False).ids != [tok.token_to_id(token)]:
            raise BurnoutError(f"the tokenizer cannot hold {token} as one token; use a byte-level BPE tokenizer")
    headers = [f"{role}\n" for role in ROLES]
    try:
        decoded = [tok.decode(e.ids, skip_special_tokens=False) for e in tok.encode_batch(headers)]
    except Exception as exc:  # WordLevel (char) tokenizers raise on a character they have no id for
        decoded = [first_line(exc)]
    if decoded != headers:
        raise BurnoutError("the tokenizer cannot be extended for chat: it cannot encode the role names "
                           f"{', '.join(ROLES)} (a char tokenizer trained on text without those letters?); "
                           "fine-tune a model with a byte-level BPE tokenizer")
    return tok, added


# ----------------------------------------------------------------------------------------------
# Encoding


def encode_conversation(tokenizer: Tokenizer, messages: list[dict],
                        train_on: str = "assistant") -> tuple[list[int], list[bool]]:
    """(ids, loss_mask) of a whole conversation; see the module docstring for the rules."""
    ids, mask, _ = encode_conversations(tokenizer, [Conversation(messages, "conversation")], train_on)[0]
    return ids, mask


def encode_prompt(tokenizer: Tokenizer, messages: list[dict]) -> list[int]:
    """The ids that ask the model for the next assistant turn: `messages` + "<|im_start|>assistant\\n"."""
    messages = check_messages(messages, "prompt", need_assistant=False)
    ids, _, _ = _encode(tokenizer, [messages], "assistant", generation_prompt=True)[0]
    return ids


def encode_conversations(tokenizer: Tokenizer, conversations: list[Conversation],
                         train_on: str = "assistant") -> list[tuple[list[int], list[bool], list[int]]]:
    """(ids, loss_mask, content_starts) per conversation, encoded in one batch on the tokenizer's threads.

    content_starts[k] is the position of message k's first content token. A conversation the tokenizer
    cannot encode is a BurnoutError naming its `where`.
    """
    if train_on not in TRAIN_ON:
        raise BurnoutError(f"train_on: '{train_on}' is not one of {', '.join(TRAIN_ON)}")
    checked = [check_messages(c.messages, c.where or "conversation", need_assistant=False) for c in conversations]
    try:
        return _encode(tokenizer, checked, train_on, generation_prompt=False)
    except _EncodeError:
        pass
    for conversation, messages in zip(conversations, checked):  # find the one that failed, to name it
        try:
            _encode(tokenizer, [messages], train_on, generation_prompt=False)
        except _EncodeError as exc:
            raise BurnoutError(f"{conversation.where or 'conversation'}: the tokenizer cannot encode it ({exc}); "
                               "fix the text or use a byte-level BPE tokenizer") from None
    raise AssertionError("a batch failed to encode but each conversation encodes alone")


class _EncodeError(Exception):
    pass


def _encode(tokenizer: Tokenizer, conversations: list[list[dict]], train_on: str,
            generation_prompt: bool) -> list[tuple[list[int], list[bool], list[int]]]:
    start, end = chat_token_ids(tokenizer)
    segments = [f"{m['role']}\n{m['content'].strip()}" for messages in conversations for m in messages]
    *encodings, generation, newline = _encode_texts(tokenizer, [*segments, "assistant\n", "\n"])
    encodings = iter(encodings)
    everything = train_on == "all"
    results = []
    for messages in conversations:
        ids: list[int] = []
        mask: list[bool] = []
        starts: list[int] = []
        for message in messages:
            encoding = next(encodings)
            trained = everything or message["role"] == "assistant"
            # A token is content when it starts past the header's newline (offsets are in characters).
            in_content = [offset[0] > len(message["role"]) for offset in encoding.offsets]
            ids.append(start)
            mask.append(everything)
            starts.append(len(ids) + in_content.count(False))
            ids += encoding.ids
            mask += [everything or (trained and c) for c in in_content]
            ids.append(end)
            mask.append(trained)
            ids += newline.ids
            mask += [everything] * len(newline.ids)
        if generation_prompt:
            ids += [start, *generation.ids]
            mask += [everything] * (1 + len(generation.ids))
        results.append((ids, mask, starts))
    return results


def _encode_texts(tokenizer: Tokenizer, texts: list[str]) -> list:
    # Special-token matching off: text in a message never becomes a control token. The flag lives on the
    # tokenizer object, so another thread encoding with the same object meanwhile would see it too.
    previous = tokenizer.encode_special_tokens
    tokenizer.encode_special_tokens = True
    try:
        return tokenizer.encode_batch(texts, add_special_tokens=False)
    except Exception as exc:  # the Rust side raises a bare Exception (e.g. a char tokenizer's unseen character)
        raise _EncodeError(first_line(exc)) from None
    finally:
        tokenizer.encode_special_tokens = previous


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
                raise BurnoutError(f"{where} is {_describe(record)}, expected a JSON object")
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
        raise BurnoutError("parquet files need pyarrow; pip install pyarrow") from None
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
        raise BurnoutError(f"{HF_PREFIX}{name} needs the datasets package; pip install 'gpuburnout[data]'") from None
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


def detect_layout(record: dict, where: str) -> str:
    for layout, keys in _LAYOUT_KEYS:
        if all(key in record for key in keys):
            return layout
    raise BurnoutError(f"{where}: unknown layout (fields: {', '.join(map(str, record)) or 'none'}); "
                       f"set the layout to one of {', '.join(LAYOUTS)}")


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
            messages = _messages(convert(record, where), where)
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
    layout, records = _open(source, layout, options)
    if layout != "pairs":
        raise BurnoutError(f"'{source}' has the {layout} layout, not preference pairs (chosen/rejected)")
    for where, record in records:
        yield _pair(record, where)


def _open(source, layout: str, options: dict) -> tuple[str, Iterator[tuple[str, dict]]]:
    if layout != "auto" and layout not in LAYOUTS:
        raise BurnoutError(f"layout '{layout}' is not one of auto, {', '.join(LAYOUTS)}")
    records = iter_records(source, **options)
    first = next(records, None)
    if first is None:
        raise BurnoutError(f"SFT data '{source}' holds no records")
    return (detect_layout(first[1], first[0]) if layout == "auto" else layout), itertools.chain([first], records)


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
    instruction = _text(_field(record, "instruction", where), f"{where}: instruction")
    extra = _text(record.get("input"), f"{where}: input").strip()
    prompt = f"{instruction.strip()}\n\n{extra}" if extra else instruction
    return [{"role": "user", "content": prompt},
            {"role": "assistant", "content": _text(_field(record, "output", where), f"{where}: output")}]


def _from_qa(record: dict, where: str) -> list[dict]:
    for question, answer in (("question", "answer"), ("prompt", "completion"), ("prompt", "response")):
        if question in record and answer in record:
            return [{"role": "user", "content": _text(record[question], f"{where}: {question}")},
                    {"role": "assistant", "content": _text(record[answer], f"{where}: {answer}")}]
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
        node = _TreeNode(where, role, _text(_field(record, "text", where), f"{where}: text"),
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
        return _messages(value, f"{where} ({key})") if value else []
    text = _text(value, f"{where}: {key}")
    parts = _HH_TURN.split(text)
    if len(parts) > 1 and not parts[0].strip():
        return [{"role": "user" if role == "Human" else "assistant", "content": content.strip()}
                for role, content in zip(parts[1::2], parts[2::2])]
    return [{"role": plain_role, "content": text}] if text.strip() else []
