"""`burnout chat` and `burnout generate --chat`: talking to a checkpoint.

A chat checkpoint (core.chat_template.is_chat_model: fine-tuned by `burnout sft`) holds a conversation.
Each turn renders the history with the ChatML template (`burnout.core.chat_template.encode_prompt`, the ids
training saw and transformers' `apply_chat_template` gives), streams the answer and stops when the model
emits `<|im_end|>`: its id, so text that merely spells "<|im_end|>" is printed like any other text.
When the conversation would leave less than `reply_room` tokens of the context for the answer, its
oldest turns are dropped (the system prompt stays). `/system TEXT` sets the system prompt, `/reset`
forgets the conversation.

A base checkpoint has no template, so each line typed is a prompt to continue (`chat`). For side by side
with a chat model, `plain_transcript` asks a base model in plain text ("User: …\nAssistant:").
Lines that start with "/" change the sampling settings on the fly in both loops.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Sequence
from typing import TextIO

from burnout.base.files import EOT_TOKEN
from burnout.base.values import SEED_MAX, checked_number
from burnout.core.chat_template import chat_token_ids, encode_prompt
from burnout.errors import BurnoutError
from burnout.generate.sampling import check_sampling, generate_batch, stream_continuation, stream_text

HELP = """commands:
  /temp T     temperature (0 = greedy)      /topk K    top-k (0 = off)
  /topp P     top-p (1 = off)               /rep R     repetition penalty (1 = off)
  /len N      max new tokens                /seed S    seed (none = random)
  /settings   show the settings             /help      this text
  /quit       leave (or Ctrl-D)"""
CHAT_HELP = HELP + """
  /system T   set the system prompt (no text: none)
  /reset      forget the conversation (the system prompt stays)
  Ctrl-C      stop the answer being written"""
TRANSCRIPT_STOP = ("\nUser:",)  # where a base model's turn in a plain transcript ends

# command → (setting name, parser); "none"/"0" switch top-k, top-p and seed off.
_COMMANDS: dict[str, tuple[str, Callable[[str], object]]] = {
    "/temp": ("temperature", float),
    "/topk": ("top_k", lambda v: int(v) or None),
    "/topp": ("top_p", lambda v: None if float(v) >= 1 else float(v)),
    "/rep": ("repetition_penalty", float),
    "/len": ("max_new_tokens", int),
    "/seed": ("seed", lambda v: None if v == "none" else checked_number("/seed", v, integer=True, low=0,
                                                                        high=SEED_MAX)),
}


def apply_command(line: str, settings: dict) -> str:
    """Change `settings` as the /command line says; returns the message to show."""
    name, _, value = line.strip().partition(" ")
    if name in ("/settings", "/help"):
        return HELP if name == "/help" else format_settings(settings)
    if name not in _COMMANDS:
        return f"unknown command {name}; /help lists them"
    key, parse = _COMMANDS[name]
    try:
        new = parse(value.strip())
    except ValueError:
        return f"{name} needs a number, e.g. {name} {settings.get(key) or 1}"
    except BurnoutError as exc:  # out of range: refused here, not by the next message's generation
        return f"{exc}; the setting stays {settings.get(key)}"
    if key == "max_new_tokens" and new < 1:
        return "/len must be at least 1"
    settings[key] = new
    return format_settings(settings)


def format_settings(settings: dict) -> str:
    return "  ".join(f"{k}={v}" for k, v in settings.items())


def read_line(prompt: str) -> str:
    """The next line typed (without its newline), or EOFError at the end of input. A terminal's line is read by
    `input` (line editing); piped input line by line from the bytes, so that a line that is not UTF-8 fails alone
    (UnicodeDecodeError) instead of the decoder's whole buffered chunk of lines after it."""
    buffer = getattr(sys.stdin, "buffer", None)  # none under a text stream put in its place (a test's StringIO)
    if buffer is None or sys.stdin.isatty():
        return input(prompt)
    sys.stdout.write(prompt)
    sys.stdout.flush()
    line = buffer.readline()
    if not line:
        raise EOFError
    return line.decode("utf-8").removesuffix("\n").removesuffix("\r")


def unreadable_line(exc: UnicodeDecodeError) -> str:
    """What a session says of a line whose bytes are not UTF-8, and goes on."""
    return (f"error: the line could not be read: byte {exc.object[exc.start]:#04x} is not UTF-8 text; type it again "
            "(a terminal set to UTF-8 sends any character)")


def chat(model, tokenizer, settings: dict, read: Callable[[str], str] = read_line, out: TextIO | None = None) -> None:
    """Loop until /quit or end of input: read a line, stream its continuation to `out` (default: stdout),
    or run a /command."""
    out = out or sys.stdout
    out.write(f"burnout chat: type text to continue, /help for commands. {format_settings(settings)}\n")
    while True:
        try:
            line = read("> ")
        except EOFError:
            return
        except UnicodeDecodeError as exc:  # a terminal that is not UTF-8, a pasted byte: the session goes on
            out.write(unreadable_line(exc) + "\n")
            continue
        if line.strip() == "/quit":
            return
        if line.startswith("/"):
            out.write(apply_command(line, settings) + "\n")
            continue
        if not line:
            continue
        sampling = {k: v for k, v in settings.items() if k != "max_new_tokens"}
        try:
            pieces = stream_text(model, tokenizer, line, settings["max_new_tokens"], where="the line", **sampling)
        except BurnoutError as exc:  # a bad line or setting must not end the session
            out.write(f"error: {exc}\n")
            continue
        out.write(line)
        for piece in pieces:
            out.write(piece)
            out.flush()
        out.write("\n")


# ----------------------------------------------------------------------------------------------
# Chat checkpoints


def reply_room(context: int, max_new_tokens: int) -> int:
    """Tokens of the context kept free for the answer: max_new_tokens, at most half the context."""
    return max(1, min(max_new_tokens, context // 2))


def fit_messages(messages: list[dict], encode: Callable[[list[dict]], list[int]], context: int,
                 reserve: int) -> tuple[list[int], int]:
    """(ids of the prompt, how many of the oldest messages it leaves out).

    `messages` end with the user's new message; a leading system message is always kept. Whole exchanges
    (a user message and the answers after it) are dropped, oldest first, until the prompt leaves `reserve`
    tokens of the context free, or only the new message is left. A prompt that fills the context even then
    is a BurnoutError.
    """
    system = messages[:1] if messages and messages[0]["role"] == "system" else []
    rest = messages[len(system):]
    dropped = 0
    while True:
        ids = encode(system + rest[dropped:])
        if len(ids) + reserve <= context or dropped >= len(rest) - 1:
            break
        dropped += 1
        while dropped < len(rest) - 1 and rest[dropped]["role"] != "user":
            dropped += 1
    if len(ids) >= context:
        what = "the system prompt and the message need" if system else "the message needs"
        raise BurnoutError(f"{what} {len(ids)} tokens with the template but the model's context is {context}; "
                           "shorten it")
    return ids, dropped


def chat_prompt(tokenizer, messages: list[dict], context: int, max_new_tokens: int) -> tuple[list[int], int]:
    """The template's ids asking for the answer to `messages` (see fit_messages), and the messages dropped."""
    chat_token_ids(tokenizer)  # a tokenizer without the chat tokens: one line, before anything else
    return fit_messages(messages, lambda kept: encode_prompt(tokenizer, kept), context,
                        reply_room(context, max_new_tokens))


def stream_reply(model, tokenizer, prompt_ids: list[int], max_new_tokens: int, **sampling) -> Iterator[str]:
    """The answer to a templated prompt as printable pieces, up to <|im_end|> (or <|endoftext|>), neither
    printed. Bad settings raise here, before anything streams."""
    _, end = chat_token_ids(tokenizer)
    check_sampling(model, prompt_ids, sampling.get("temperature", 1.0), sampling.get("top_k"), sampling.get("top_p"),
                   sampling.get("repetition_penalty", 1.0))
    return stream_continuation(model, tokenizer, prompt_ids, max_new_tokens,
                               stop_ids=[end, tokenizer.token_to_id(EOT_TOKEN)], **sampling)


def chat_replies(model, tokenizer, prompts: Sequence[str], max_new_tokens: int, system: str | None = None,
                 **sampling) -> list[str]:
    """The answer to each prompt as one user message (after `system`), decoded in batches."""
    _, end = chat_token_ids(tokenizer)
    context = model.cfg.context_length
    head = [{"role": "system", "content": system}] if system else []
    ids = []
    for number, prompt in enumerate(prompts, start=1):
        try:
            ids.append(chat_prompt(tokenizer, [*head, {"role": "user", "content": prompt}], context,
                                   max_new_tokens)[0])
        except BurnoutError as exc:
            raise BurnoutError(f"prompt {number}: {exc}") from None
    new = generate_batch(model, ids, max_new_tokens, stop_id=[end, tokenizer.token_to_id(EOT_TOKEN)], **sampling)
    return [tokenizer.decode(n) for n in new]


def plain_transcript(messages: list[dict]) -> str:
    """A conversation as plain text for a base model: "System: …", "User: …", "Assistant: …" lines, ending
    with "Assistant:" for the model to continue (stop it at TRANSCRIPT_STOP)."""
    lines = [f"{m['role'].capitalize()}: {m['content'].strip()}" for m in messages]
    return "\n".join([*lines, "Assistant:"])


def chat_loop(model, tokenizer, settings: dict, system: str | None = None, read: Callable[[str], str] = read_line,
              out: TextIO | None = None) -> None:
    """Hold a conversation until /quit or end of input: each line is the user's message, the answer streams
    to `out` (default: stdout); /system, /reset and the sampling /commands as CHAT_HELP lists them."""
    out = out or sys.stdout
    chat_token_ids(tokenizer)
    history: list[dict] = []
    out.write(f"burnout chat: a chat model; type a message, /help for commands. {format_settings(settings)}\n")
    while True:
        try:
            line = read("you> ")
        except EOFError:
            return
        except UnicodeDecodeError as exc:
            out.write(unreadable_line(exc) + "\n")
            continue
        name, _, value = line.strip().partition(" ")
        if name == "/quit":
            return
        if name in ("/system", "/reset", "/help"):
            if name == "/system":
                system = value.strip() or None
            elif name == "/reset":
                history.clear()
            out.write({"/system": f"system prompt: {system or '(none)'}", "/help": CHAT_HELP,
                       "/reset": "conversation cleared"}[name] + "\n")
            continue
        if line.startswith("/"):
            out.write(apply_command(line, settings) + "\n")
            continue
        if not line.strip():
            continue
        user = {"role": "user", "content": line}
        messages = [{"role": "system", "content": system}] if system else []
        try:
            ids, dropped = chat_prompt(tokenizer, [*messages, *history, user], model.cfg.context_length,
                                       settings["max_new_tokens"])
            pieces = stream_reply(model, tokenizer, ids, settings["max_new_tokens"],
                                  **{k: v for k, v in settings.items() if k != "max_new_tokens"})
        except BurnoutError as exc:  # a bad line or setting must not end the session
            out.write(f"error: {exc}\n")
            continue
        if dropped:
            del history[:dropped]
            out.write(f"(the oldest {dropped} message(s) no longer fit the context: left out from now on)\n")
        reply = _write_stream(pieces, out)
        if reply.strip():  # an empty answer cannot be a turn of the template: the exchange is not kept
            history += [user, {"role": "assistant", "content": reply}]


def _write_stream(pieces: Iterator[str], out: TextIO) -> str:
    """Write the pieces as they come; Ctrl-C stops the answer, not the session. Returns the text written."""
    text = ""
    out.write("bot> ")
    try:
        for piece in pieces:
            out.write(piece)
            out.flush()
            text += piece
    except KeyboardInterrupt:
        out.write(" [stopped]")
    out.write("\n")
    return text
