"""Text for a person: an error's first line, counts, sizes and durations, next-step lines, install hints.

One way to write each, so every command's output reads alike and an error stays one line.
"""

from __future__ import annotations

import math
from collections.abc import Iterable


def first_line(error: BaseException | str, limit: int = 200) -> str:
    """The first non-empty line of an error's message (at most `limit` characters), or the
    exception's type name when the message is empty: error text fit for a one-line message."""
    text = str(error).strip()
    if not text:
        return type(error).__name__ if isinstance(error, BaseException) else ""
    return text.splitlines()[0][:limit]


def install_extra(extra: str) -> str:
    """The command that installs burnout's optional dependencies `extra` (pyproject.toml's
    optional-dependencies), as installed from PyPI and from a clone, for the line of an error that needs it."""
    return f"pip install 'gpuburnout[{extra}]' (from a clone: pip install -e '.[{extra}]')"


def format_bytes(count: int) -> str:
    """'512 B', '3.4 MB', '12.0 GB' (powers of 1000, as `df -H` prints them)."""
    units = ("B", "kB", "MB", "GB", "TB", "PB", "EB")
    power = min(int(math.log10(max(count, 1)) // 3), len(units) - 1)
    return f"{count / 1000 ** power:.1f} {units[power]}" if power else f"{count} B"


def format_count(count: float) -> str:
    """'950', '3.0M', '29.4M', '11.8B': parameters, tokens or FLOPs as a person reads them."""
    for divisor, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if round(abs(count) / divisor, 1) >= 1:  # 999,960 is 1.0M, not 1000.0K
            return f"{count / divisor:.1f}{unit}"
    return f"{count:,.0f}"


def plural(count: int, noun: str, nouns: str | None = None) -> str:
    """'1 document', '2,048 documents' (with `nouns`: '1 match', '3 matches'): a count and its noun as a person
    writes them."""
    return f"{count:,} {noun if count == 1 else nouns or noun + 's'}"


def format_duration(seconds: float) -> str:
    """'1h05m' from an hour up, else '4m07s'."""
    seconds = int(seconds)
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 60}m{seconds % 60:02d}s"


def labelled(rows: Iterable[tuple[str, str]], indent: str = "") -> list[str]:
    """'label:' in a column, then its text: how quickstart, and each command's `next_steps`, list what it made."""
    return [f"{indent}{label + ':':<14}{text}" for label, text in rows]


def next_steps(rows: Iterable[tuple[str, str]]) -> list[str]:
    """The block a command ends with: what can be done next with what it made, one (label, command) a line."""
    rows = list(rows)
    return ["next:", *labelled(rows, "  ")] if rows else []


def needs_package(command: str, module: str, extra: str, note: str = "") -> str:
    """`command` and its `note`, or, where `module` (what the command needs of the optional dependencies `extra`) is
    not installed, how to install them first."""
    import importlib.util

    if importlib.util.find_spec(module) is None:
        return f"{command}   (first: {install_extra(extra)})"
    return f"{command}   ({note})" if note else command
