"""Prompts: the built-in ones, and a prompts file read the same way by every command that takes one."""

from __future__ import annotations

from pathlib import Path

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
    prompts = [line.replace("\\n", "\n") for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if not prompts:
        raise BurnoutError(f"prompts file '{path}' has no prompts; write one prompt per line")
    return prompts
