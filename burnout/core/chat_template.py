"""The ChatML template: what makes a model a chat model, how a conversation becomes ids and a loss mask.

A conversation, a list of {"role": "system" | "user" | "assistant", "content": str}, is rendered as

    <|im_start|>{role}\\n{content}<|im_end|>\\n        per turn
    <|im_start|>assistant\\n                           the generation prompt

by this one template in every command that trains or talks to a chat model (sft, dpo, rl, generate --chat, chat,
compare, eval --harness, the playground, the Hugging Face export), so that what training saw is what inference
feeds; the rules of its ids and mask: `encode_conversation`.
"""

from __future__ import annotations

from dataclasses import dataclass

from tokenizers import Tokenizer

from burnout.base.text import first_line
from burnout.base.values import kind_of
from burnout.config import CHATML, RunConfig
from burnout.data.tokenizer import unencodable, unencodable_error
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

# The role names of the conversation layouts (ShareGPT's human/gpt, OpenAssistant's prompter).
_ROLE_ALIASES = {"system": "system", "user": "user", "human": "user", "prompter": "user",
                 "assistant": "assistant", "gpt": "assistant"}


@dataclass
class Conversation:
    messages: list[dict]
    where: str = ""  # "'FILE' record N": for error messages


def is_chat_model(cfg: RunConfig) -> bool:
    """Whether a checkpoint of this run config holds a chat model: its config says `tokenizer.chat_template:
    chatml`, its tokenizer holds <|im_start|> and <|im_end|>, and it was fine-tuned on conversations rendered by
    this template."""
    return cfg.tokenizer.chat_template == CHATML


# ----------------------------------------------------------------------------------------------
# Messages


def check_messages(messages, where: str, need_assistant: bool = True) -> list[dict]:
    """`messages` as clean {"role", "content"} dicts (role aliases resolved, text parts joined).

    One-line BurnoutError naming `where` for: not a list of objects, an unknown role, content that is not
    text, no assistant turn (when `need_assistant`), an assistant turn with empty content.
    """
    clean = normalize_messages(messages, where)
    for number, message in enumerate(clean, start=1):
        if message["role"] == "assistant" and not message["content"].strip():
            raise BurnoutError(f"{where}: assistant message {number} is empty; remove the record or fill it in")
    if need_assistant and not any(m["role"] == "assistant" for m in clean):
        raise BurnoutError(f"{where}: the conversation has no assistant turn, so nothing to learn from; "
                           "every conversation needs at least one")
    return clean


def normalize_messages(messages, where: str) -> list[dict]:
    """`messages` as {"role", "content"} dicts, role aliases resolved and text parts joined; not yet checked
    for an assistant turn (check_messages)."""
    if not isinstance(messages, list) or not messages:
        raise BurnoutError(f"{where}: expected a non-empty list of messages, got {kind_of(messages)}")
    clean = []
    for number, message in enumerate(messages, start=1):
        if not isinstance(message, dict):
            raise BurnoutError(f"{where}: message {number} is {kind_of(message)}, expected an object")
        raw_role = message.get("role", message.get("from"))
        role = _ROLE_ALIASES.get(raw_role.lower()) if isinstance(raw_role, str) else None
        if role is None:
            raise BurnoutError(f"{where}: unknown role {raw_role!r} in message {number}; "
                               f"use {', '.join(ROLES)} (or human/gpt/prompter)")
        clean.append({"role": role, "content": message_text(message.get("content", message.get("value")),
                                                     f"{where}: message {number}")})
    return clean


def message_text(content, where: str) -> str:
    """A message's content as text: a string, or OpenAI's list of text parts joined."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    # OpenAI's list of parts: [{"type": "text", "text": ...}]
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in content):
        return "".join(str(p.get("text", "")) for p in content)
    raise BurnoutError(f"{where}: content is {kind_of(content)}, expected text")


# ----------------------------------------------------------------------------------------------
# Tokenizer


def chat_token_ids(tokenizer: Tokenizer) -> tuple[int, int]:
    """The ids of <|im_start|> and <|im_end|>; a BurnoutError when the tokenizer lacks them as special tokens."""
    specials = {t.content: i for i, t in tokenizer.get_added_tokens_decoder().items() if t.special}
    missing = [t for t in CHAT_TOKENS if t not in specials]
    if missing:
        raise BurnoutError(f"the tokenizer has no {' or '.join(missing)} special token; "
                           "add them with burnout.core.chat_template.ensure_chat_tokens (and grow the model to match)")
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
    """(ids, loss_mask) of a whole conversation, by these rules:

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
    ids, mask, _ = encode_conversations(tokenizer, [Conversation(messages, "conversation")], train_on)[0]
    return ids, mask


def encode_prompt(tokenizer: Tokenizer, messages: list[dict], where: str = "the conversation") -> list[int]:
    """The ids that ask the model for the next assistant turn: `messages` + "<|im_start|>assistant\\n". Text the
    tokenizer cannot encode is a BurnoutError naming `where` and its characters."""
    messages = check_messages(messages, "prompt", need_assistant=False)
    ids, _, _ = _encode(tokenizer, [messages], "assistant", True, where)[0]
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
        return _encode(tokenizer, checked, train_on, False, "a conversation")
    except BurnoutError:
        pass
    for conversation, messages in zip(conversations, checked):  # find the one that failed, to name it
        _encode(tokenizer, [messages], train_on, False, conversation.where or "conversation")
    raise AssertionError("a batch failed to encode but each conversation encodes alone")


def _encode(tokenizer: Tokenizer, conversations: list[list[dict]], train_on: str, generation_prompt: bool,
            where: str) -> list[tuple[list[int], list[bool], list[int]]]:
    start, end = chat_token_ids(tokenizer)
    segments = [f"{m['role']}\n{m['content'].strip()}" for messages in conversations for m in messages]
    *encodings, generation, newline = _encode_texts(tokenizer, [*segments, "assistant\n", "\n"], where)
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


def _encode_texts(tokenizer: Tokenizer, texts: list[str], where: str) -> list:
    """The encodings of `texts`, message text all: a BurnoutError naming `where` and the characters when the tokenizer
    cannot encode one (tokenizer.py's unencodable_error, said while text is still read as text)."""
    # Special-token matching off: text in a message never becomes a control token. The flag lives on the
    # tokenizer object, so another thread encoding with the same object meanwhile would see it too.
    previous = tokenizer.encode_special_tokens
    tokenizer.encode_special_tokens = True
    try:
        return tokenizer.encode_batch(texts, add_special_tokens=False)
    except Exception as exc:  # the Rust side raises a bare Exception (an unseen character), TypeError (a surrogate)
        failing = next((text for text in texts if unencodable(tokenizer, text)), "")
        raise unencodable_error(tokenizer, failing, where, error=exc) from None
    finally:
        tokenizer.encode_special_tokens = previous
