"""Prompts: the built-in ones, and a prompts file read the same way by every command that takes one."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from tokenizers import Tokenizer

from burnout.data.tokenizer import name_characters, unencodable
from burnout.errors import BurnoutError

# Starts a model trained on the quickstart's corpus (Python's docs and source) can continue.
SAMPLE_PROMPTS = ("The ", "def ", "To create a")
# `burnout compare`'s default: one question, one open sentence, one piece of code.
COMPARE_PROMPTS = ("What is the capital of France?", "The meaning of life is", "def fibonacci(n):")


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
