"""`burnout chat`: a read-eval-print loop that streams a checkpoint's continuation of each line typed.

Our models are base models (no chat template), so each line is a prompt to continue. Lines that start
with "/" change the sampling settings on the fly.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TextIO

from burnout.errors import BurnoutError
from burnout.generate.sampling import stream_text

HELP = """commands:
  /temp T     temperature (0 = greedy)      /topk K    top-k (0 = off)
  /topp P     top-p (1 = off)               /rep R     repetition penalty (1 = off)
  /len N      max new tokens                /seed S    seed (none = random)
  /settings   show the settings             /help      this text
  /quit       leave (or Ctrl-D)"""

# command → (setting name, parser); "none"/"0" switch top-k, top-p and seed off.
_COMMANDS: dict[str, tuple[str, Callable[[str], object]]] = {
    "/temp": ("temperature", float),
    "/topk": ("top_k", lambda v: int(v) or None),
    "/topp": ("top_p", lambda v: None if float(v) >= 1 else float(v)),
    "/rep": ("repetition_penalty", float),
    "/len": ("max_new_tokens", int),
    "/seed": ("seed", lambda v: None if v == "none" else int(v)),
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
    if key == "max_new_tokens" and new < 1:
        return "/len must be at least 1"
    settings[key] = new
    return format_settings(settings)


def format_settings(settings: dict) -> str:
    return "  ".join(f"{k}={v}" for k, v in settings.items())


def chat(model, tokenizer, settings: dict, read: Callable[[str], str] = input, out: TextIO = sys.stdout) -> None:
    """Loop until /quit or end of input: read a line, stream its continuation to `out` (or run a /command)."""
    out.write(f"burnout chat: type text to continue, /help for commands. {format_settings(settings)}\n")
    while True:
        try:
            line = read("> ")
        except EOFError:
            return
        if line.strip() == "/quit":
            return
        if line.startswith("/"):
            out.write(apply_command(line, settings) + "\n")
            continue
        if not line:
            continue
        sampling = {k: v for k, v in settings.items() if k != "max_new_tokens"}
        try:
            pieces = stream_text(model, tokenizer, line, settings["max_new_tokens"], **sampling)
        except BurnoutError as exc:  # a bad line or setting must not end the session
            out.write(f"error: {exc}\n")
            continue
        out.write(line)
        for piece in pieces:
            out.write(piece)
            out.flush()
        out.write("\n")
