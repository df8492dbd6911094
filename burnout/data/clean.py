"""Document cleaning: normalization, cleaning modes, minimum length, exact dedup and a junk scan.

A Cleaner is called once per document, in stream order, with the name of the source the document came
from, and returns the cleaned text or None when the document is dropped. Every filter counts what it changed
or removed, in total and per source (`per_source`: documents in, kept and dropped by each filter;
`junk.by_source`: each source's junk matches per pattern and its dropped documents); `report()` is stored in
meta.json.

Modes (data.clean):
    none          text as is
    lenient       Unicode NFC, CRLF -> LF, control characters other than tab/newline removed
    balanced      lenient, plus trailing spaces stripped, runs of 3+ newlines cut to 2, zero-width
                  characters removed, and documents under half letters/digits/whitespace dropped
    strict_ascii  balanced, then accents folded (NFKD), common typographic punctuation mapped to
                  ASCII, and any other non-ASCII character removed
"""

from __future__ import annotations

import hashlib
import re
import unicodedata

from burnout.config import DataConfig

EXAMPLES_PER_PATTERN = 3
EXAMPLE_CHARS = 160
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")
_ZERO_WIDTH = re.compile(r"[\u200b-\u200d\u2060\ufeff]")
_TRAILING_SPACE = re.compile(r"[ \t]+\n")
_MANY_NEWLINES = re.compile(r"\n{3,}")
_NON_ASCII = re.compile(r"[^\x00-\x7f]")
_ASCII_PUNCT = str.maketrans({
    "\u2018": "'", "\u2019": "'", "\u201a": "'", "\u201b": "'", "\u201c": '"', "\u201d": '"', "\u201e": '"',
    "\u2013": "-", "\u2014": "-", "\u2015": "-", "\u2212": "-", "\u2026": "...", "\u00a0": " ", "\u00ab": '"',
    "\u00bb": '"', "\u2022": "*",
})
# balanced drops documents where fewer than this fraction of characters are letters, digits or whitespace.
MIN_TEXT_FRACTION = 0.5
# The filters that drop documents, as named in the report.
_FILTERS = ("clean", "min_chars", "dedup", "junk")


class Cleaner:
    def __init__(self, cfg: DataConfig) -> None:
        self.mode = cfg.clean
        self.min_chars = cfg.min_chars
        self.dedup = cfg.dedup
        self.drop_junk = cfg.drop_junk
        self.patterns = [(p, re.compile(p)) for p in cfg.junk_patterns]
        self._seen: set[bytes] = set()
        self.stats = {
            "documents_in": 0, "documents_out": 0, "chars_in": 0, "chars_out": 0,
            "clean": {"changed_documents": 0, "removed_chars": 0, "dropped_documents": 0},
            "min_chars": {"dropped_documents": 0, "dropped_chars": 0},
            "dedup": {"dropped_documents": 0, "dropped_chars": 0},
            "junk": {"dropped_documents": 0,
                     "patterns": {p: {"documents": 0, "examples": []} for p in cfg.junk_patterns},
                     "by_source": {s.name: {"dropped_documents": 0, "patterns": dict.fromkeys(cfg.junk_patterns, 0)}
                                   for s in cfg.sources}},
            "per_source": {s.name: {"documents_in": 0, "documents_out": 0, "dropped": dict.fromkeys(_FILTERS, 0)}
                           for s in cfg.sources},
        }

    @property
    def active(self) -> bool:
        return self.mode != "none" or self.min_chars > 0 or self.dedup or bool(self.patterns)

    def __call__(self, text: str, source: str | None = None) -> str | None:
        """`text` cleaned, or None when a filter drops it; `source` (a data.sources name) is what the per-source
        counts are kept under (None: counted in the totals only, as for the tokenizer's sample)."""
        stats = self.stats
        mine = stats["per_source"].get(source) if source is not None else None
        stats["documents_in"] += 1
        stats["chars_in"] += len(text)
        if mine is not None:
            mine["documents_in"] += 1
        cleaned = self._filter(text, source)
        if cleaned is None:
            return None
        stats["documents_out"] += 1
        stats["chars_out"] += len(cleaned)
        if mine is not None:
            mine["documents_out"] += 1
        return cleaned

    def why_dropped(self, source: str) -> str:
        """What dropped `source`'s documents, each filter as the setting behind it, e.g. "2 by the --drop /
        data.junk_patterns pattern '.'": for the line that says none is left."""
        dropped = self.stats["per_source"][source]["dropped"]
        matched = [p for p, count in self.stats["junk"]["by_source"][source]["patterns"].items() if count]
        patterns = f"pattern{'s' * (len(matched) > 1)} {', '.join(map(repr, matched))}"
        settings = {
            "clean": f"data.clean={self.mode} (mostly not text)",
            "min_chars": f"data.min_chars={self.min_chars}" if self.min_chars else f"data.clean={self.mode} (emptied)",
            "junk": f"the --drop / data.junk_patterns {patterns}",
            "dedup": "data.dedup (duplicates)",
        }
        return ", ".join(f"{count} by {settings[name]}" for name, count in dropped.items() if count)

    def _drop(self, name: str, source: str | None, chars: int | None = None) -> None:
        self.stats[name]["dropped_documents"] += 1
        if chars is not None:
            self.stats[name]["dropped_chars"] += chars
        if source in self.stats["per_source"]:
            self.stats["per_source"][source]["dropped"][name] += 1

    def _filter(self, text: str, source: str | None) -> str | None:
        stats = self.stats
        cleaned = clean_text(text, self.mode)
        if cleaned is None:
            self._drop("clean", source)
            return None
        if cleaned != text:
            stats["clean"]["changed_documents"] += 1
            stats["clean"]["removed_chars"] += len(text) - len(cleaned)
        if len(cleaned) < self.min_chars or not cleaned:
            self._drop("min_chars", source, len(cleaned))
            return None
        if self._is_junk(cleaned, source) and self.drop_junk:
            self._drop("junk", source)
            if source in stats["junk"]["by_source"]:
                stats["junk"]["by_source"][source]["dropped_documents"] += 1
            return None
        if self.dedup:
            # surrogatepass: a lone surrogate (a JSON "\ud800") is hashed too; encoding leaves it out later.
            key = hashlib.blake2b(cleaned.encode("utf-8", "surrogatepass"), digest_size=16).digest()
            if key in self._seen:
                self._drop("dedup", source, len(cleaned))
                return None
            self._seen.add(key)
        return cleaned

    def _is_junk(self, cleaned: str, source: str | None) -> bool:
        """Whether any junk pattern matches; each match is counted (with an example) in total and per source."""
        junk = False
        by_source = self.stats["junk"]["by_source"].get(source) if source is not None else None
        for pattern, regex in self.patterns:
            match = regex.search(cleaned)
            if match:
                junk = True
                entry = self.stats["junk"]["patterns"][pattern]
                entry["documents"] += 1
                if by_source is not None:
                    by_source["patterns"][pattern] += 1
                if len(entry["examples"]) < EXAMPLES_PER_PATTERN:
                    start = max(0, match.start() - EXAMPLE_CHARS // 2)
                    entry["examples"].append(cleaned[start : start + EXAMPLE_CHARS])
        return junk

    def report(self) -> dict:
        return {
            "mode": self.mode, "min_chars": self.min_chars, "dedup": self.dedup, "drop_junk": self.drop_junk,
            **self.stats,
        }


def clean_text(text: str, mode: str) -> str | None:
    """`text` cleaned in `mode` (see the module docstring); None when balanced/strict drops it."""
    if mode == "none":
        return text
    text = unicodedata.normalize("NFC", text).replace("\r\n", "\n").replace("\r", "\n")
    text = _CONTROL.sub("", text)
    if mode == "lenient":
        return text
    text = _ZERO_WIDTH.sub("", text)
    text = _MANY_NEWLINES.sub("\n\n", _TRAILING_SPACE.sub("\n", text)).rstrip(" \t")
    if text and sum(c.isalnum() or c.isspace() for c in text) < MIN_TEXT_FRACTION * len(text):
        return None
    if mode == "balanced":
        return text
    text = unicodedata.normalize("NFKD", text.translate(_ASCII_PUNCT))
    return _NON_ASCII.sub("", text)
