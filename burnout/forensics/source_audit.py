"""Everything counted about one source's documents, fed in read order, and the outliers among them.

- terms (words and identifier-like strings, see suspicious_strings.py) and word pairs: in how many documents,
  how often, in how many runs of nearby documents (less than `run_gap_chars` of text between them), the first
  `hosts` documents holding each term, and in how many it stands as unrendered markup (`{{user_name}}`, `&nbsp;`);
- repetition: lines (at least `min_line_chars`, runs of spaces collapsed) and multi-line paragraphs counted
  in how many documents they occur (boilerplate, navigation, licence headers);
- known junk: the data mix's data.junk_patterns (plus any given) with documents, matches and examples;
- outliers: documents whose length (log), longest line (log) or non-text share (characters neither word
  characters nor whitespace) lie more than `outlier_z` robust standard deviations (1.4826 x MAD) from the
  source's median.

The tables are bounded (bounded_counting.py); what grows with the documents is three float32 statistics
each, for the outliers.
"""

from __future__ import annotations

import collections
import hashlib
import itertools
import math
import re
import time
from array import array
from collections import Counter

import numpy as np

from burnout.forensics.audit_settings import AuditSettings
from burnout.forensics.bounded_counting import CountTable, SeenFilter, TopK
from burnout.forensics.snippets import snippet

# A word or identifier: starts with a letter or "_", dotted parts joined; or digits followed by letters.
TERM = re.compile(r"[^\W\d]\w*(?:\.[^\W\d]\w*)*|\d+[^\W\d_]\w*")
# Markup left unrendered: a term in a template engine's delimiters ({{user_name}}, {{ product.title }},
# [[FIRST_NAME]], %%ID%%, <|im_start|>, <<x>>, <%= user.name %>, <?= $title ?>; not a shell's ${name}, which scripts
# and their docs write on purpose), or an HTML entity's name (&nbsp;, the amp of &amp;quot;).
_MARKUP = re.compile(r"(?:\{\{|\[\[|%%|<\||<<|<%=?|<\?=)\s*\$?([^\W\d]\w*(?:\.[^\W\d]\w*)*)\s*"
                     r"(?:\}\}|\]\]|%%|\|>|>>|%>|\?>)|&([A-Za-z][A-Za-z0-9]+);")
_NON_TEXT = re.compile(r"[^\w\s]")
_SPACE = re.compile(r"\s+")
_SPACES = re.compile(r"[^\S\n]+")  # whitespace other than newlines
_KEY_CHARS = 240  # longer lines and paragraphs are kept as their start and a hash
_HISTOGRAM_BINS = 30


class SourceAudit:
    """Everything counted about one source's documents (fed in read order)."""

    def __init__(self, name: str, kind: str, settings: AuditSettings, patterns: list[str]) -> None:
        self.name, self.kind, self.settings = name, kind, settings
        cap = settings.capacity
        self.terms, self.phrases = CountTable(cap), CountTable(cap)
        self.markup: Counter = Counter()  # term -> documents where it stands as unrendered markup (_MARKUP)
        self.seen = SeenFilter(settings.filter_bits)
        # The documents read within run_gap_chars characters before the next one, and how many of them hold each term.
        self._window: collections.deque = collections.deque()
        self._window_chars = 0
        self._in_window: Counter = Counter()
        # Lines and paragraphs are long keys, and only repeated ones are admitted: a quarter of the room.
        self.lines, self.paragraphs = CountTable(max(1000, cap // 4)), CountTable(max(1000, cap // 4))
        self.documents = self.chars = self.tokens = 0
        self.code_share: float | None = None
        self.spelling = None  # how its words are spelled (suspicious_strings.Spelling), built as it ends
        self.stats = {"chars": array("f"), "longest_line": array("f"), "non_text_share": array("f")}
        self.extremes = {"long": TopK(10), "short": TopK(10), "longest_line": TopK(10), "non_text_share": TopK(10)}
        self.junk = [(p, re.compile(p), {"pattern": p, "documents": 0, "matches": 0, "examples": []})
                     for p in patterns]
        self._block: list[str] = []
        self._block_numbers: list[int] = []
        self.elapsed_s = 0.0

    def add(self, text: str, number: int | None = None) -> None:
        """Count one document; `number` is how examples name it (default: its place in this source)."""
        ordinal = self.documents if number is None else number
        self.documents += 1
        self.chars += len(text)
        lines = text.split("\n")
        longest = max(map(len, lines))
        non_text = len(_NON_TEXT.findall(text)) / max(1, len(text))
        self.stats["chars"].append(len(text))
        self.stats["longest_line"].append(longest)
        self.stats["non_text_share"].append(non_text)
        self._extremes(text, ordinal, lines, longest, non_text)
        for _, regex, entry in self.junk:
            self._junk(text, ordinal, regex, entry)
        self._block.append(text)
        self._block_numbers.append(ordinal)
        if len(self._block) >= self.settings.block_docs:
            self.flush()

    def _extremes(self, text: str, ordinal: int, lines: list[str], longest: int, non_text: float) -> None:
        width = self.settings.snippet_chars
        self.extremes["long"].offer(len(text), lambda: {"document": ordinal, "text": snippet(text, 0, 0, width)})
        self.extremes["short"].offer(-len(text), lambda: {"document": ordinal, "text": snippet(text, 0, 0, width)})

        def longest_line() -> dict:
            line = max(lines, key=len)
            return {"document": ordinal, "text": snippet(line, 0, 0, width)}

        self.extremes["longest_line"].offer(longest, longest_line)
        self.extremes["non_text_share"].offer(non_text,
                                              lambda: {"document": ordinal, "text": snippet(text, 0, 0, width)})

    def _junk(self, text: str, ordinal: int, regex: re.Pattern, entry: dict) -> None:
        first = None
        matches = 0
        for match in regex.finditer(text):
            if first is None:
                first = match
            matches += 1
            if matches >= 10_000:
                break
        if first is None:
            return
        entry["documents"] += 1
        entry["matches"] += matches
        if len(entry["examples"]) < self.settings.max_examples:
            entry["examples"].append({"document": ordinal, "text": snippet(text, first.start(), first.end(),
                                                                           self.settings.snippet_chars)})

    def flush(self) -> None:
        """Count the pending block of documents into the tables."""
        if not self._block:
            return
        start = time.perf_counter()
        docs, numbers = self._block, self._block_numbers
        s = self.settings
        term_cf, term_df, term_runs, pair_cf, pair_df, line_df, para_df = (Counter() for _ in range(7))
        hosts: dict[str, list[int]] = {}
        line_hosts: dict[str, list[int]] = {}
        para_hosts: dict[str, list[int]] = {}
        full, in_window = self.terms.full, self._in_window
        for text, number in zip(docs, numbers):
            words = TERM.findall(text)
            self.tokens += len(words)
            term_cf.update(words)
            distinct = set(words)
            term_df.update(distinct)
            # A run starts where a term was in none of the documents of the last run_gap_chars characters.
            started = {key for key in distinct if not in_window[key]}
            term_runs.update(started)
            if len(self.markup) < self.settings.capacity:
                self.markup.update({template or entity for template, entity in _MARKUP.findall(text)})
            for key in started - full:
                found = hosts.get(key)
                if found is None:
                    hosts[key] = [number]
                else:
                    found.append(number)
            self._slide_window(distinct, len(text))
            pairs = list(map(" ".join, zip(words, words[1:])))
            pair_cf.update(pairs)
            pair_df.update(set(pairs))
            lines = {line if len(line) <= _KEY_CHARS else _long_key(line)
                     for line in map(str.strip, _SPACES.sub(" ", text).split("\n")) if len(line) >= s.min_line_chars}
            paragraphs = _paragraph_keys(text, s.min_line_chars) if "\n\n" in text else set()
            for keys, counts, found_in in ((lines, line_df, line_hosts), (paragraphs, para_df, para_hosts)):
                counts.update(keys)
                for key in keys:
                    found_in.setdefault(key, []).append(number)
        self.terms.add(term_df, term_cf, term_runs, hosts=hosts, max_hosts=s.hosts)
        pair_df, seen = self._admit(self.phrases, pair_df, "")
        self.phrases.add(pair_df, pair_cf, seen_before=seen)
        for table, counts, found_in, tag in ((self.lines, line_df, line_hosts, "\x01"),
                                             (self.paragraphs, para_df, para_hosts, "\x02")):
            counts, seen = self._admit(table, counts, tag)
            table.add(counts, seen_before=seen, hosts=found_in, max_hosts=s.hosts)
        self._block, self._block_numbers = [], []
        self.elapsed_s += time.perf_counter() - start

    def _slide_window(self, distinct: set[str], chars: int) -> None:
        """The window after a document of `chars` characters holding `distinct`: it keeps the documents with
        fewer than run_gap_chars characters read after them, the last one always."""
        window, in_window = self._window, self._in_window
        window.append((chars, distinct))
        in_window.update(distinct)
        self._window_chars += chars
        while len(window) > 1 and self._window_chars - window[0][0] >= self.settings.run_gap_chars:
            gone_chars, gone = window.popleft()
            self._window_chars -= gone_chars
            in_window.subtract(gone)
            for key in gone:
                if not in_window[key]:
                    del in_window[key]

    def _admit(self, table: CountTable, counts: Counter, tag: str) -> tuple[Counter, set]:
        """The keys of `counts` that enter `table`: those already in it or in two documents by now. A key
        in one document only marks the seen filter (under `tag`, a kind of key), and enters when met
        again (`seen`: keys entering with one earlier document uncounted, also when met again in several)."""
        items = table.items
        fresh = [key for key in counts if key not in items]
        found = self.seen.check_and_add([tag + key for key in fresh] if tag else fresh)
        seen = set(itertools.compress(fresh, found))
        wanted = Counter({key: d for key, d in counts.items() if d > 1 or key in items or key in seen})
        return wanted, seen


def _paragraph_keys(text: str, min_chars: int) -> set[str]:
    """Multi-line paragraphs of a document that has several, whitespace collapsed; long ones are cut to
    _KEY_CHARS characters plus a hash of the whole, so the key shows the text and still tells them apart."""
    keys = set()
    for para in text.replace("\r\n", "\n").split("\n\n"):
        if para.count("\n") < 1 or len(para) < 2 * min_chars:
            continue
        norm = _SPACE.sub(" ", para).strip()
        keys.add(norm if len(norm) <= _KEY_CHARS else _long_key(norm))
    return keys


def _long_key(text: str) -> str:
    """A key for a long line or paragraph: its first _KEY_CHARS characters and a hash of all of it."""
    digest = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=6).hexdigest()
    return f"{text[:_KEY_CHARS]}… #{digest}"


def outlier_report(audit: SourceAudit, settings: AuditSettings) -> tuple[dict, dict]:
    """Per metric: median, robust spread, thresholds, how many documents lie beyond, the most extreme ones;
    and histograms (log10 of lengths) for the page."""
    result, histograms = {}, {}
    specs = (("chars", True, "both", 0.05), ("longest_line", True, "high", 0.05),
             ("non_text_share", False, "high", 0.01))
    for metric, log, side, min_sigma in specs:
        values = np.frombuffer(audit.stats[metric], dtype=np.float32).astype(np.float64)
        if len(values) == 0:
            continue
        x = np.log10(np.maximum(values, 1.0)) if log else values
        median = float(np.median(x))
        sigma = max(1.4826 * float(np.median(np.abs(x - median))), min_sigma)
        high = median + settings.outlier_z * sigma
        low = median - settings.outlier_z * sigma if side == "both" else None
        beyond = int(np.sum(x > high)) + (int(np.sum(x < low)) if low is not None else 0)
        conv = (lambda v: 10**v) if log else (lambda v: v)
        entry = {"median": round(conv(median), 4), "high": round(conv(high), 4),
                 "low": round(conv(low), 4) if low is not None else None, "outliers": beyond, "examples": []}
        heaps = {"chars": (("long", 1), ("short", -1)), "longest_line": (("longest_line", 1),),
                 "non_text_share": (("non_text_share", 1),)}[metric]
        for heap, sign in heaps:
            for value, payload in audit.extremes[heap].items():
                v = sign * value
                xv = math.log10(max(v, 1.0)) if log else v
                if xv > high or (low is not None and xv < low):
                    entry["examples"].append({"value": round(v, 4), **payload})
        result[metric] = entry
        counts, edges = np.histogram(x, bins=_HISTOGRAM_BINS)
        histograms[metric] = {"log10": log, "edges": [round(float(e), 4) for e in edges], "counts": counts.tolist(),
                              "median": median, "high": high, "low": low}
    return result, histograms
