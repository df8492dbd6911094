"""The corpus text an audit shows: a snippet around a match, on one line, and the second pass that finds the
first examples of each suspicious string in read order."""

from __future__ import annotations

import re
from collections.abc import Iterable


def snippet(text: str, start: int = 0, end: int | None = None, width: int = 160) -> str:
    """About `width` characters of `text` around text[start:end], on one line (newlines shown as ⏎)."""
    end = start if end is None else end
    left = max(0, start - (width - (end - start)) // 2)
    piece = text[left : left + max(width, end - start)]
    piece = piece.replace("\r", "").replace("\n", " ⏎ ")
    return ("…" if left > 0 else "") + piece + ("…" if left + width < len(text) else "")


class ExampleFinder:
    """The second pass: up to `limit` whole-word occurrences of each wanted string, the first ones in read
    order, as {"document", "text"} (a word pair's words may be separated by anything but word characters)."""

    def __init__(self, strings: Iterable[str], limit: int, width: int) -> None:
        self.found: dict[str, list[dict]] = {key: [] for key in strings}
        self.limit, self.width = limit, width
        self._pending = {key: (key.split(" ")[0], re.compile(
            r"(?<!\w)" + r"\W+".join(map(re.escape, key.split(" "))) + r"(?!\w)")) for key in self.found}

    @property
    def done(self) -> bool:
        return not self._pending

    def scan(self, number: int, text: str) -> None:
        for key, (first, pattern) in list(self._pending.items()):
            if first not in text:
                continue
            match = pattern.search(text)
            if match is None:
                continue
            found = self.found[key]
            found.append({"document": number, "text": snippet(text, match.start(), match.end(), self.width)})
            if len(found) >= self.limit:
                del self._pending[key]
