"""`burnout data audit`: data forensics, finding what should not be in a corpus without being told what it is.

What is audited, and how it is read:

- a data mix (name, YAML path, or a run config), or your own text as `burnout data prepare` takes it (a file, a
  folder, a glob; one source, its documents split as prepare splits them): each source through data/corpus.py's
  readers in its natural (file) order, up to a character budget per source (by default the source's weight share
  of data.max_chars, the tokenizer sample: for your own text, all of it up to prepare's sample size;
  `chars_per_source=0` reads it all); the text as the source holds it, before cleaning; documents are numbered by
  their place in the source;
- a prepared data folder: its decoded documents (data/documents.py), each under the source it came from,
  numbered by their index in the split;
- fine-tuning data (`sft`): each role's messages (system, user, assistant) as a source of its own.

Two passes. The first counts each source (source_audit.py, in tables bounded by bounded_counting.py) and
every document's duplicates across sources (duplicates.py); the report ranks each source's suspicious
strings (suspicious_strings.py); the second pass reads each source again only until every string in its
report has its examples (snippets.py: the first ones in read order), so it usually stops early.
The report is audit.json; audit_page.py renders it as audit.html, audit_summary.py for the terminal.
"""

from __future__ import annotations

import functools
import json
import math
import re
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict
from pathlib import Path

import numpy as np

from burnout.base.files import AUDIT_DIR, AUDIT_JSON
from burnout.base.folders import check_output_folder
from burnout.base.text import plural
from burnout.errors import BurnoutError
from burnout.forensics.audit_settings import AuditSettings
from burnout.forensics.bounded_counting import CountTable
from burnout.forensics.duplicates import Duplicates
from burnout.forensics.snippets import ExampleFinder
from burnout.forensics.source_audit import TERM, SourceAudit, outlier_report
from burnout.forensics.suspicious_strings import Cohesion, Spelling, code_share, rank_strings

FORMAT = "burnout-audit-v1"
AUDIT_HTML = "audit.html"


def _repeated(audits: list[SourceAudit], index: int, which: str, settings: AuditSettings,
              cohesion: Cohesion) -> list[dict]:
    """The lines (which="lines") or paragraphs repeated in a source's documents, the most foreign first: by log2(1 +
    documents) x (1 + 9 x foreign) x (1 - 0.9 x cohesion). foreign is the mean share of its words' documents that are
    its own, weighted by their rarity (1: a word found nowhere else in the source, `FATAL`, `newsletter`; 0 for the
    source's everyday words): a line of words the source uses elsewhere (`Changed in version 3.3.`) is its format, one
    that brings words of its own came from somewhere else. cohesion (suspicious_strings.Cohesion) is how far its
    documents share rare words besides its own: a signature repeated in the pages of three audio modules is theirs, a
    log line in four pages of nothing in common was put there."""
    me = audits[index]
    table: CountTable = getattr(me, which)
    rows = []
    for key, entry in table.items.items():
        if entry[0] >= settings.min_docs:
            foreign = _foreign_words(me, key, entry[0])
            together = 1.0 - 0.9 * cohesion(set(TERM.findall(key)), entry[3])
            rows.append((math.log2(1 + entry[0]) * (1 + 9 * foreign) * together, entry[0], foreign, together, key))
    rows.sort(key=lambda r: (-r[0], -r[1], r[4]))
    out = []
    for _, df, foreign, together, key in rows[: settings.top]:
        per_source = {o.name: getattr(o, which).items[key][0] for o in audits if key in getattr(o, which).items}
        out.append({"text": key, "documents": df, "share": round(df / max(me.documents, 1), 4),
                    "foreign_words": round(foreign, 3), "cohesion": round(together, 3),
                    "documents_per_source": per_source})
    return out


def _foreign_words(me: SourceAudit, text: str, documents: int) -> float:
    """The mean, over the words of `text` (3 characters or more), of documents / the word's documents in the source
    (1 for a word its table no longer holds), each weighted by ln(N / the word's documents), at least ln 2: a line's
    rare word says more than its everyday ones. 0 for a text of no words."""
    total = weights = 0.0
    for word in TERM.findall(text):
        if len(word) >= 3:
            entry = me.terms.items.get(word)
            found = entry[0] if entry else documents
            weight = math.log(max(2.0, me.documents / found))
            total += weight * min(1.0, documents / found)
            weights += weight
    return total / weights if weights else 0.0


def source_report(audits: list[SourceAudit], index: int, settings: AuditSettings) -> dict:
    me = audits[index]
    outliers, histograms = outlier_report(me, settings)
    cohesion = Cohesion(me.terms, settings, max(me.documents, 1))  # the terms', lines' and paragraphs' alike
    return {
        "name": me.name, "kind": me.kind, "documents": me.documents, "chars": me.chars, "tokens": me.tokens,
        "code_share": round(code_share(me), 4),
        "count_error_bound": {name: getattr(me, name).floor for name in ("terms", "phrases", "lines", "paragraphs")},
        "suspicious_terms": rank_strings(audits, index, "terms", settings, cohesion),
        "suspicious_phrases": rank_strings(audits, index, "phrases", settings, cohesion),
        "repeated_lines": _repeated(audits, index, "lines", settings, cohesion),
        "repeated_paragraphs": _repeated(audits, index, "paragraphs", settings, cohesion),
        "junk": [entry for _, _, entry in me.junk],
        "outliers": outliers, "histograms": histograms,
    }


class Auditor:
    """Feeds documents to per-source audits and one shared duplicate index; `report()` builds audit.json.

    Documents may come one source after another (a data mix: `finish(name)` after each, which drops what
    the report cannot use) or interleaved (a prepared folder).
    """

    def __init__(self, settings: AuditSettings | None = None, junk_patterns: Iterable[str] = (),
                 target: dict | None = None) -> None:
        self.settings = settings or AuditSettings()
        self.settings.validate()
        self.patterns = list(dict.fromkeys(junk_patterns))
        for pattern in self.patterns:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise BurnoutError(f"junk pattern {pattern!r} is not a valid regular expression ({exc})") from None
        self.target = target or {}
        self.audits: dict[str, SourceAudit] = {}
        self.index: dict[str, int] = {}
        self.duplicates = Duplicates(self.settings, [])
        self._start = time.perf_counter()
        self.examples_s = 0.0

    def source(self, name: str, kind: str) -> SourceAudit:
        audit = self.audits.get(name)
        if audit is None:
            audit = self.audits[name] = SourceAudit(name, kind, self.settings, self.patterns)
            self.index[name] = len(self.duplicates.names)
            self.duplicates.names.append(name)
        return audit

    def add(self, name: str, kind: str, text: str, number: int | None = None) -> None:
        """One document of source `name`; `number` is how the report names it (default: its place in the
        source)."""
        if not text:
            return
        audit = self.source(name, kind)
        self.duplicates.add(self.index[name], audit.documents if number is None else number, text)
        audit.add(text, number)

    def finish(self, name: str) -> None:
        audit = self.audits[name]
        audit.flush()
        audit.seen = None  # the pair filter's 32 MB
        if audit.spelling is None:  # from every word counted: a second finish() sees only the words kept
            audit.spelling = Spelling(audit.terms.items)
        for table in ("terms", "phrases", "lines", "paragraphs"):
            getattr(audit, table).keep(lambda key, entry: entry[0] >= self.settings.min_docs)

    def report(self, reread: Callable[[str], Iterable[tuple[int, str]]] | None = None) -> dict:
        """The report; `reread(name)` gives a source's (number, text) again, for the examples of its
        suspicious strings (the second pass, which stops once each has its examples)."""
        for name in self.audits:
            self.finish(name)
        audits, s = list(self.audits.values()), self.settings
        sources = [source_report(audits, i, s) for i in range(len(audits))]
        if reread is not None:
            start = time.perf_counter()
            for src in sources:
                self._examples(src, reread(src["name"]))
            self.examples_s = time.perf_counter() - start
        return {
            "format": FORMAT, "target": self.target, "settings": asdict(s), "junk_patterns": self.patterns,
            "sources": sources,
            "exact_duplicates": self.duplicates.exact_report(s.top),
            "near_duplicates": self.duplicates.near_report(s.top),
            "totals": {"documents": sum(a.documents for a in audits), "chars": sum(a.chars for a in audits),
                       "elapsed_s": round(time.perf_counter() - self._start, 3),
                       "seconds": {"counting": round(sum(a.elapsed_s for a in audits), 3),
                                   "duplicates": round(self.duplicates.elapsed_s, 3),
                                   "examples": round(self.examples_s, 3)}},
        }

    def _examples(self, src: dict, documents: Iterable[tuple[int, str]]) -> None:
        rows = src["suspicious_terms"] + src["suspicious_phrases"]
        finder = ExampleFinder([row["string"] for row in rows], self.settings.max_examples,
                               self.settings.snippet_chars)
        for number, text in documents:
            if finder.done:
                break
            finder.scan(number, text)
        for row in rows:
            row["examples"] = finder.found[row["string"]]


def audit_streams(streams: Iterable[tuple[str, str, Callable[[], Iterable[str]]]],
                  settings: AuditSettings | None = None, junk_patterns: Iterable[str] = (),
                  target: dict | None = None, progress: Callable[[str], None] | None = None) -> dict:
    """Audit (name, kind, documents) streams one source after another, `documents()` giving a fresh
    iterator of a source's texts each time (twice: the count, then the examples); the report (audit.json's
    content). Documents are numbered by their place among the source's non-empty texts."""
    auditor = Auditor(settings, junk_patterns, target)
    streams = list(streams)
    for name, kind, documents in streams:
        if name in auditor.audits:
            raise BurnoutError(f"source names must be unique; '{name}' comes twice")
        auditor.source(name, kind)
        for text in documents():
            auditor.add(name, kind, text)
        auditor.finish(name)
        if progress:
            audit = auditor.audits[name]
            progress(f"audited {name}: {plural(audit.documents, 'document')}, {plural(audit.chars, 'character')}")
    again = {name: documents for name, _, documents in streams}
    return auditor.report(lambda name: enumerate(text for text in again[name]() if text))


# ----------------------------------------------------------------------------------------------
# What to audit


def _budgeted(source, budget: int) -> Iterator[str]:
    """The non-empty documents of `source` in natural order until `budget` characters are taken (0: all)."""
    from burnout.data.corpus import iter_documents

    taken = 0
    for text in iter_documents(source):
        if not text:
            continue
        yield text
        taken += len(text)
        if budget and taken >= budget:
            return


def source_streams(cfg, chars_per_source: int | None = None) -> list[tuple[str, str, Callable[[], Iterator[str]]]]:
    """(name, kind, documents) of each source of a DataConfig, in natural order, up to its budget:
    documents() reads the source (again) from its start."""
    from burnout.data.corpus import open_source

    total = sum(s.weight for s in cfg.sources)
    streams = []
    for source in cfg.sources:
        budget = int(cfg.max_chars * source.weight / total) if chars_per_source is None else chars_per_source
        if chars_per_source is None and budget <= 0:
            continue
        open_source(source)  # a missing or unreadable source fails here, before any work
        streams.append((source.name, source.kind, functools.partial(_budgeted, source, budget)))
    return streams


def audit_prepared(data_dir: Path, split: str = "train", settings: AuditSettings | None = None,
                   junk_patterns: Iterable[str] = (), progress: Callable[[str], None] | None = None) -> dict:
    """Audit a prepared folder's `split`: its documents decoded with the folder's tokenizer, each under the
    source it came from (data/documents.py), numbered by their index in the split."""
    from burnout.base.files import TOKENIZER_FILE
    from burnout.data.documents import SplitDocuments
    from burnout.data.shards import read_meta
    from burnout.data.tokenizer import load_tokenizer

    meta = read_meta(data_dir)
    docs = SplitDocuments(data_dir, split, meta)
    tokenizer = load_tokenizer(data_dir / TOKENIZER_FILE)
    patterns = [*meta.get("cleaning", {}).get("junk", {}).get("patterns", {}), *junk_patterns]
    auditor = Auditor(settings, patterns, {"kind": "prepared", "path": str(data_dir), "split": split,
                                           "documents": "numbered by their index in the split"})
    batch: list = []

    def decode() -> None:
        texts = tokenizer.decode_batch([np.asarray(ids).tolist() for _, ids in batch], skip_special_tokens=True)
        for (span, _), text in zip(batch, texts):
            auditor.add(span.source, "prepared", text, span.index)
        batch.clear()

    for item in docs:
        batch.append(item)
        if len(batch) >= 256:
            decode()
        if progress and item[0].index and item[0].index % 100_000 == 0:
            progress(f"audited {item[0].index:,} of {plural(len(docs), 'document')}")
    decode()

    def reread(name: str) -> Iterator[tuple[int, str]]:
        for span, ids in SplitDocuments(data_dir, split, meta):
            if span.source == name:
                yield span.index, tokenizer.decode(np.asarray(ids).tolist(), skip_special_tokens=True)

    return auditor.report(reread)


def audit_sft(source: str, layout: str = "auto", settings: AuditSettings | None = None,
              junk_patterns: Iterable[str] = ()) -> dict:
    """Audit conversations: each role's messages (system, user, assistant) as a source of its own, every
    message a document, numbered by its conversation's place in the file."""
    from burnout.finetune.conversations import read_conversations

    auditor = Auditor(settings, junk_patterns, {"kind": "sft", "path": str(source), "layout": layout,
                                               "documents": "messages, numbered by their conversation"})
    reader = read_conversations(source, layout)
    conversations = 0
    for number, conversation in enumerate(reader):
        conversations += 1
        for message in conversation.messages:
            auditor.add(message["role"], "sft", message["content"].strip(), number)
    if not conversations:
        raise BurnoutError(f"'{source}' holds no conversations to audit")

    def reread(role: str) -> Iterator[tuple[int, str]]:
        for number, conversation in enumerate(read_conversations(source, layout)):
            for message in conversation.messages:
                if message["role"] == role and message["content"].strip():
                    yield number, message["content"].strip()

    report = auditor.report(reread)
    report["target"]["conversations"] = conversations
    report["target"]["skipped"] = dict(reader.skipped)
    return report


def audit_target(target: str, *, sft: bool = False, layout: str = "auto", split: str = "train",
                 chars_per_source: int | None = None, overrides: Iterable[str] = (), junk: Iterable[str] = (),
                 settings: AuditSettings | None = None, progress: Callable[[str], None] | None = None) -> dict:
    """The audit of TARGET: conversations (`sft`), a prepared data folder, or what `burnout data prepare` reads,
    told apart as it tells them (data/mix.py: input_kind): a data mix (name or YAML) or run config, or your own
    text (a file, a folder or a glob); see the module docstring."""
    from burnout.data.mix import input_kind, load_data_sections, own_text_sections
    from burnout.data.shards import MANIFEST_FILE, META_FILE

    overrides = list(overrides)
    path = Path(target).expanduser()
    if sft or (path.is_dir() and (path / META_FILE).is_file()):
        if overrides:
            raise BurnoutError(f"overrides ({overrides[0]}) apply to a data mix, a run config or your text, not to "
                               f"{'conversations' if sft else 'a prepared data folder'}; leave them out")
        return audit_sft(target, layout, settings, junk) if sft else audit_prepared(path, split, settings, junk,
                                                                                    progress)
    if path.is_dir() and (path / MANIFEST_FILE).is_file():
        raise BurnoutError(f"'{path}' is an unfinished data folder (manifest.json but no meta.json); "
                           "finish it with burnout data prepare first")
    own = input_kind(target)
    cfg, _ = own_text_sections(target, own, overrides) if own else load_data_sections(target, overrides)
    # A data mix's audit is of kind "recipe": the word audit.json, and the page and summary made of it, always had.
    kind = ("folder" if path.is_dir() else "file" if path.is_file() else "files") if own else "recipe"
    info = {"kind": kind, "path": str(target), "chars_per_source": chars_per_source,
            "documents": "numbered by their place in their source, in file order"}
    return audit_streams(source_streams(cfg, chars_per_source), settings, [*cfg.junk_patterns, *junk], info,
                         progress)


def default_out(target: str, sft: bool = False) -> Path:
    """Where the audit goes by default: DATA/audit for a prepared folder, else ./audit."""
    path = Path(target).expanduser()
    return path / AUDIT_DIR if not sft and path.is_dir() else Path("audit")


def audit_source(target: str, sft: bool = False) -> str:
    """What an audit is of, as its folder records it: the target's absolute path (a data mix's name as given)."""
    path = Path(target).expanduser()
    return ("conversations " if sft else "") + (str(path.resolve()) if path.exists() else str(target))


def audit_out(target: str, out: str | Path | None = None, sft: bool = False, overwrite: bool = False) -> Path:
    """Where the audit of `target` goes (`out`, else default_out), checked before the audit runs: a new or empty
    folder, or one holding an audit of the same target (of another: with `overwrite`); never the target itself,
    a folder holding it, or anything else."""
    folder = Path(out) if out is not None else default_out(target, sft)
    check_output_folder(folder, "--out", "audit", audit_source(target, sft), reads=[Path(target).expanduser()],
                        overwrite=overwrite, recognise=_audit_owner)
    return folder


def _audit_owner(folder: Path) -> dict | None:
    """An audit folder is told by its audit.json (written first), which says what it is an audit of."""
    try:
        report = json.loads((folder / AUDIT_JSON).read_text(encoding="utf-8"))
        target = report["target"]
        if report["format"] == FORMAT:
            return {"kind": "audit", "source": audit_source(target["path"], target["kind"] == "sft")}
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None


def write_audit(report: dict, out: str | Path, overwrite: bool = False) -> list[Path]:
    """audit.json and audit.html (self-contained: images embedded) in `out`, a folder audit_out allows."""
    from burnout.base.files import write_atomic
    from burnout.forensics.audit_page import render_page

    target = report["target"]
    out = audit_out(target["path"], out, target["kind"] == "sft", overwrite)
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / AUDIT_JSON, json.dumps(report, indent=1, ensure_ascii=False) + "\n")
    write_atomic(out / AUDIT_HTML, render_page(report))
    return [out / AUDIT_JSON, out / AUDIT_HTML]
