"""Suspicious strings: each source's terms (`suspicious_terms`) and word pairs (`suspicious_phrases`), ranked by
how much they look like something that should not be there: foreign to the source's text, and spread over
documents that have nothing else in common, rather than the words of one topic.

A term is a word or identifier-like string (letters, digits and `_`, dotted parts joined: `os.path`, `PersonX`),
at least 3 characters, pure numbers left out, in at least `min_docs` documents and at most `max_doc_share` of the
source's. Its score is burst × evidence × spread × shape × elsewhere × cohesion, each factor defined in
docs/FORENSICS.md ("The score, factor by factor").
"""

from __future__ import annotations

import bisect
import functools
import heapq
import itertools
import math
import re
from collections import Counter
from collections.abc import Iterable

from burnout.base.text import install_extra
from burnout.errors import BurnoutError
from burnout.forensics.audit_settings import AuditSettings
from burnout.forensics.bounded_counting import CountTable
from burnout.forensics.source_audit import SourceAudit

_DIGIT = re.compile(r"\d")
_REPEAT_UNIT = re.compile(r"(.{1,3})\1{2,}")
_HEX_LETTERS = re.compile(r"[0-9a-f]{8,}")
_HEX_MIXED = re.compile(r"(?=.*\d)(?=.*[a-f])[0-9a-f]{6,}")
_INNER_CAPITAL = re.compile(r"[a-z][A-Z]|[A-Z]{2}[a-z]")
_IDENTIFIER_PART = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|\d+")
_ORDINAL = re.compile(r"\d+(?:st|nd|rd|th|s|m|km|kg|cm|mm|px|pt|am|pm)")
# Shapes and their factors (docs/FORENSICS.md, "The score, factor by factor"); the "code" shapes are those
# scaled by register.
SHAPES = {"markup": 3.0, "repeat": 3.0, "hex": 3.0, "camel": 3.0, "identifier": 3.0, "alnum": 2.0, "upper": 1.5,
          "lower": 1.0, "title": 0.5}
_CODE_SHAPES = ("camel", "identifier", "alnum", "hex")
# A source where this share of the tokens looks like code is code (its identifiers get no shape bonus, and
# its words found in a prose source are "foreign" there); under PROSE_REGISTER, shape bonuses count in full.
CODE_REGISTER, PROSE_REGISTER = 0.05, 0.005
# An identifier written as the source writes its own (_ForeignSpelling.own_identifier) keeps this share of its shape
# bonus; a style is the source's own from OWN_STYLE of its identifiers on.
OWN_IDENTIFIER_BONUS, OWN_STYLE = 0.5, 0.1
MAX_SPELLED = 32  # longer "words" (a run of CJK characters, a hash) teach nothing about spelling
# A language's word list is the source's when it holds this share of the source's LEXICON_WORDS most widespread
# lowercase words (WikiText-2 99.4%, Tiny Shakespeare 98.6%, Python's docs 99.2% in English: docs/FORENSICS.md).
LEXICON_COVERAGE, ENGLISH_AT_ONCE, LEXICON_WORDS = 0.9, 0.97, 2000
# The share of a source's lowercase candidate words that no list holds, under which such a word is foreign to it,
# and from which it is not: set after a first measurement, where Python's docs (3.3% of them: its identifiers)
# lost plants to its own identifiers, WikiText-2 (0.7%: a few dinosaur names) and Shakespeare (0%) did not.
OWN_UNKNOWN_WORDS = (0.01, 0.03)
# A compound is two list words run together, each at least this frequent (Zipf 3: once in a million words), as
# identifiers are (lineno, isinstance, startswith); a nonsense word (quazzle, grindlewop) is not.
COMPOUND_PART = 1e-6
# A word its language uses this often (Zipf 3.5) is spelled as the language spells, whatever a source's own trigrams
# say: Python's docs' trigrams gave `mechanism` and `hierarchy` the largest spelling factor; `nbsp` (Zipf 3.1) keeps it.
COMMON_WORD = 10 ** (3.5 - 9)  # Zipf 3.5


def term_shape(term: str) -> str:
    """The shape class of a term: repeat, hex, camel, identifier, alnum, upper, title or lower."""
    low = term.lower()
    if len(term) >= 6 and _REPEAT_UNIT.fullmatch(low):
        return "repeat"
    if _HEX_LETTERS.fullmatch(low) or _HEX_MIXED.fullmatch(low):
        return "hex"
    if "_" in term.strip("_") or ("." in term and max(map(len, term.split("."))) >= 3):
        return "identifier"  # snake_case, a.b.c (not an abbreviation such as U.S or Ph.D)
    if _INNER_CAPITAL.search(term):
        return "camel"
    if _DIGIT.search(term):
        return "lower" if _ORDINAL.fullmatch(low) else "alnum"
    if term.isupper():
        return "upper"
    if term[0].isupper():
        return "title"
    return "lower"


def identifier_style(term: str) -> str | None:
    """How an identifier is written: dotted, snake (snake_case), SCREAMING (SCREAMING_SNAKE), lowerCamel or
    CapWords; None for a word."""
    if "." in term:
        return "dotted"
    if "_" in term.strip("_"):
        return "SCREAMING" if term.isupper() else "snake"
    if _INNER_CAPITAL.search(term):
        return "lowerCamel" if term[0].islower() else "CapWords"
    return None


def code_share(audit: SourceAudit) -> float:
    """The share of a source's words that look like code (identifier, camel, mixed digits, hex), over the
    words its finished table kept; computed once."""
    if audit.code_share is None:
        code = sum(e[1] for k, e in audit.terms.items.items() if term_shape(k) in _CODE_SHAPES)
        audit.code_share = code / max(1, audit.tokens)
    return audit.code_share


def _shape_factor(shape: str, code_share: float) -> float:
    base = SHAPES[shape]
    if base <= 1.0 or shape == "markup":  # an unfilled template is foreign to code too
        return base
    return 1.0 + (base - 1.0) * _code_foreignness(code_share)


def _code_foreignness(code_share: float) -> float:
    """How foreign code-like strings are to a source: 1 under PROSE_REGISTER, 0 from CODE_REGISTER on."""
    return 1.0 - min(1.0, max(0.0, (code_share - PROSE_REGISTER) / (CODE_REGISTER - PROSE_REGISTER)))


def expected_runs(df: int, n: int, gap: float) -> float:
    """The runs (gaps of at most `gap` documents) that `df` of `n` documents picked at random form: each
    of the df - 1 gaps between neighbours exceeds `gap` with probability about (1 - gap / n) ** df."""
    return 1 + (df - 1) * (1 - gap / n) ** df


class Spelling:
    """How a source spells its words: character trigrams over its word types (each type once, lowercased,
    digits as 0, between start and end marks), interpolated down to single characters (Witten-Bell).
    Built from the counting table as the source ends, before the words in fewer than min_docs documents
    are dropped: most of a source's word types are those."""

    def __init__(self, words: Iterable[str]) -> None:
        trigrams: Counter = Counter()
        for word in words:
            if len(word) <= MAX_SPELLED:
                trigrams.update(_trigrams(word))
        self.counts, self.contexts = _marginals(trigrams)
        self.kinds = Counter(gram[:-1] for gram in self.counts)
        self.alphabet = sum(1 for gram in self.counts if len(gram) == 1) + 1

    def bits(self, word: str) -> float:
        """Mean surprisal per character (end mark included) of `word`'s spelling, with its own trigrams
        left out: a word is judged by the source's other words."""
        counts, contexts = _marginals(Counter(_trigrams(word)))
        padded = _padded(word)
        total = 0.0
        for i in range(2, len(padded)):
            p = 1.0 / self.alphabet
            for ctx in ("", padded[i - 1], padded[i - 2 : i]):
                seen, kinds = self.contexts.get(ctx, 0) - contexts.get(ctx, 0), self.kinds.get(ctx, 0)
                if seen > 0 and kinds:
                    gram = ctx + padded[i]
                    p = (max(0, self.counts.get(gram, 0) - counts.get(gram, 0)) + kinds * p) / (seen + kinds)
            total -= math.log2(p)
        return total / (len(padded) - 2)


def _padded(word: str) -> str:
    return "^^" + _DIGIT.sub("0", word.lower()) + "$"


def _trigrams(word: str) -> list[str]:
    padded = _padded(word)
    return [padded[i - 2 : i + 1] for i in range(2, len(padded))]


def _marginals(trigrams: Counter) -> tuple[Counter, Counter]:
    """The counts of each trigram, bigram and character ending one, and of their contexts."""
    counts: Counter = Counter()
    contexts: Counter = Counter()
    for gram, n in trigrams.items():
        for ctx_chars in (2, 1, 0):
            counts[gram[2 - ctx_chars :]] += n
            contexts[gram[2 - ctx_chars : 2]] += n
    return counts, contexts


class Lexicon:
    """The words of a source's language: wordfreq's list for the language that holds the most of the source's
    frequent lowercase words, if one holds LEXICON_COVERAGE of them; `language` None where none does (code, a
    language wordfreq lacks), and then every word is known. English is tried first and taken at once where it
    holds ENGLISH_AT_ONCE of them (most sources are English; web English also holds many words of other
    languages, so a German source is not taken for English by LEXICON_COVERAGE alone)."""

    def __init__(self, frequent: list[str]) -> None:
        try:
            import wordfreq
        except ImportError:
            raise BurnoutError(f"the audit's word lists need wordfreq; {install_extra('data')}") from None
        self.words: dict[str, float] = {}
        self.language = None
        if not frequent:
            return
        best = 0.0
        for language in sorted(wordfreq.available_languages(), key=lambda code: code != "en"):
            words = _word_list(language)
            coverage = sum(1 for word in frequent if word in words) / len(frequent)
            if coverage > best:
                best, self.language, self.words = coverage, language, words
            if language == "en" and coverage >= ENGLISH_AT_ONCE:
                return
        if best < LEXICON_COVERAGE:
            self.language, self.words = None, {}

    def knows(self, word: str) -> bool:
        return self.language is None or word in self.words

    def common(self, word: str) -> bool:
        return self.words.get(word, 0.0) >= COMMON_WORD

    def compound(self, word: str, own: set[str] | frozenset = frozenset()) -> bool:
        """Whether `word` is two words run together, each a list word of at least COMPOUND_PART or one of `own`
        (a source's own words: `getattr` is `get` + `attr` in Python's docs), of two letters or more; with `own`,
        a part may be one letter (`nbytes`, `dicts`)."""
        def part(text: str) -> bool:
            return self.words.get(text, 0.0) >= COMPOUND_PART or text in own

        shortest = 1 if own else 2
        return any(part(word[:cut]) and part(word[cut:]) for cut in range(shortest, len(word) - shortest + 1))


@functools.lru_cache(maxsize=4)
def _word_list(language: str) -> dict[str, float]:
    """wordfreq's words of `language` (their frequencies), as it stores them: lowercase."""
    import wordfreq

    return wordfreq.get_frequency_dict(language)


class _ForeignSpelling:
    """The shape factor of a lowercase word: 2 ** ((bits - median) / (4 MAD)) within [1, SHAPES["camel"]],
    the median and MAD over the source's lowercase candidates of the same length (8 and more together;
    all lengths where fewer than 20), from at most 4,000 of them. A word of letters alone that the source's
    Lexicon lacks gets SHAPES["camel"], its bonus scaled by the code register (`code_foreignness`, as the code
    shapes') and by how rare such words are among the source's lowercase candidates: in full where under
    OWN_UNKNOWN_WORDS[0] of them are, not at all from OWN_UNKNOWN_WORDS[1] on (a source with many words of no list,
    its identifiers or jargon, has a vocabulary of its own, which is not foreign to it). A source where compounds of
    no list make OWN_UNKNOWN_WORDS[0] of those words writes identifiers: there its compounds are its own vocabulary,
    neither counted nor lifted, and a word of no list that is no compound is still foreign. Elsewhere a compound
    is as foreign as any word of no list (`lorem` is `lo` + `rem`). In a source that writes identifiers, a
    compound's parts may also be the source's `own` words, of one letter too (`getattr` is `get` + `attr`, `nbytes`
    `n` + `bytes`). A word its language uses often (COMMON_WORD) gets 1: its spelling is the language's. A
    Capitalized or ALLCAPS word of no list gets the same lift from its class's factor (`cased`)."""

    def __init__(self, spelling: Spelling, candidates: list[str], lexicon: Lexicon, code_foreignness: float,
                 own: set[str] | frozenset = frozenset()) -> None:
        self.spelling, self.lexicon = spelling, lexicon
        lower = sorted(key for key in candidates if term_shape(key) == "lower")
        words = [key for key in lower if key.isalpha()]
        unknown = [key for key in words if not lexicon.knows(key)]
        compounds = sum(1 for key in unknown if lexicon.compound(key))
        low, high = OWN_UNKNOWN_WORDS
        self.compounds_are_own = compounds >= low * len(words) > 0
        self.own = own
        styles = Counter(style for style in map(identifier_style, candidates) if style)
        self.styles = {style: n / sum(styles.values()) for style, n in styles.items()}
        if self.compounds_are_own:
            unknown = [key for key in unknown if not lexicon.compound(key, self.own)]
        share = len(unknown) / max(1, len(words))
        # The share of the largest shape's lift that a word of no list gets (1: all of it; 0 in code, or where such
        # words are the source's own vocabulary), whatever its case.
        self.lift = code_foreignness * (1.0 - min(1.0, max(0.0, (share - low) / (high - low))))
        self.unknown = 1.0 + (SHAPES["camel"] - 1.0) * self.lift
        lower = lower[:: max(1, len(lower) // 4000)]
        by_length: dict[int, list[float]] = {}
        for key in lower:
            by_length.setdefault(min(len(key), 8), []).append(spelling.bits(key))
        pooled = _median_mad([b for bits in by_length.values() for b in bits])
        self.scale = {length: _median_mad(bits) if len(bits) >= 20 else pooled for length, bits in by_length.items()}
        self.pooled = pooled

    def own_identifier(self, key: str) -> bool:
        """Whether `key`, an identifier, is written as a source that writes identifiers writes its own: in a style
        of OWN_STYLE of its identifiers or more (Python's docs: snake_case, CapWords, dotted; not lowerCamel) and each
        of its parts (`OSError`: os, error; single letters and digits aside) a lowercase word of the source's."""
        if not self.compounds_are_own or self.styles.get(identifier_style(key), 0.0) < OWN_STYLE:
            return False
        parts = [part.lower() for part in _IDENTIFIER_PART.findall(key) if len(part) >= 2 and not part.isdigit()]
        return bool(parts) and all(part in self.own for part in parts)

    def foreign(self, key: str) -> bool:
        """Whether `key`, of letters alone and of any case, is no word of the source's language (`Zorblax` is not
        `zorblax` capitalised, any more than a name of no list is) and, where compounds are the source's own, no
        compound of its words."""
        low = key.lower()
        return key.isalpha() and not self.lexicon.knows(low) and not (
            self.compounds_are_own and self.lexicon.compound(low, self.own))

    def cased(self, key: str, shape: str) -> float:
        """The shape factor of a Capitalized or ALLCAPS word: its class's, lifted towards SHAPES["camel"] by `lift`
        where it is `foreign`: a name of a list is the text's (0.5), a capitalised word of none may be garbage."""
        base = SHAPES[shape]
        return base + (SHAPES["camel"] - base) * self.lift if self.foreign(key) else base

    def __call__(self, key: str) -> float:
        if self.lexicon.common(key):
            return 1.0
        median, mad = self.scale.get(min(len(key), 8), self.pooled)
        excess = (self.spelling.bits(key) - median) / (4 * mad)
        spelled = min(SHAPES["camel"], 2.0 ** max(0.0, excess))
        return max(spelled, self.unknown) if self.foreign(key) else spelled


def _median_mad(values: list[float]) -> tuple[float, float]:
    if not values:
        return 0.0, 1.0
    values = sorted(values)
    median = values[len(values) // 2]
    deviations = sorted(abs(v - median) for v in values)
    return median, max(deviations[len(deviations) // 2], 0.05)


class Cohesion:
    """How far a term's documents are one topic's: c = (q - p0) / (1 - p0), q being the share of pairs of
    its kept documents that have a rare plain word in common, p0 the chance of that for two of the
    source's N documents, 1 - exp(-sum over those words of h (h - 1) / (N (N - 1))), h its kept documents.
    A rare plain word: lowercase or Capitalized, a candidate in at most 2 x hosts documents, whose every
    run's first document is kept (a word whose documents are not all known could not say which it shares).
    A companion in 90% or more of the term's documents is part of it (a log line's other words), not a
    topic's."""

    def __init__(self, table: CountTable, settings: AuditSettings, documents: int) -> None:
        most = max(settings.min_docs, int(settings.max_doc_share * documents))
        self.by_doc: dict[int, set[str]] = {}
        pairs = 0.0
        for key, entry in table.items.items():
            if (settings.min_docs <= entry[0] <= min(most, 2 * settings.hosts) and entry[3] is not None
                    and len(entry[3]) == entry[2] and len(key) >= 3 and SHAPES[term_shape(key)] <= 1.0):
                for doc in entry[3]:
                    self.by_doc.setdefault(doc, set()).add(key)
                pairs += len(entry[3]) * (len(entry[3]) - 1)
        self.chance = 1.0 - math.exp(-pairs / max(1, documents * (documents - 1)))

    def __call__(self, own: set[str], hosts) -> float:
        """The cohesion of the documents `hosts` of a string whose own words are `own`."""
        if hosts is None or len(hosts) < 2:
            return 0.0
        words = [self.by_doc.get(doc, set()) - own for doc in hosts]
        if len(hosts) >= 3:
            seen = Counter(itertools.chain.from_iterable(words))
            everywhere = {word for word, n in seen.items() if n >= 0.9 * len(hosts)}
            words = [w - everywhere for w in words]
        pairs = list(itertools.combinations(words, 2))
        shared = sum(1 for a, b in pairs if not a.isdisjoint(b)) / len(pairs)
        return max(0.0, (shared - self.chance) / (1.0 - self.chance)) if self.chance < 1.0 else 0.0


def rank_strings(audits: list[SourceAudit], index: int, which: str, settings: AuditSettings,
                 cohesion: Cohesion) -> list[dict]:
    """The suspicious terms (which="terms") or bigrams ("phrases") of audits[index], best first; `cohesion` is the
    source's, which judges terms only.

    burst x evidence x spread is computed for every candidate; the rest (shape and elsewhere at most 6 in
    all, cohesion at most 1) best first, until no candidate left can enter the top rows."""
    me = audits[index]
    table: CountTable = getattr(me, which)
    n = max(me.documents, 1)
    most = max(settings.min_docs, int(settings.max_doc_share * n))
    log_n = math.log(max(n, 3))
    gap = 1 + settings.run_gap_chars * n / max(1, me.chars)  # a run's reach in documents of the source's mean length
    terms = which == "terms"
    local = []
    for key, (df, cf, runs, _) in table.items.items():
        if settings.min_docs <= df <= most and len(key) >= 3:
            burst = 1.0 + math.log2(cf / df) / 4
            evidence = math.log2(1 + df) * max(0.05, 1 - math.log(df) / log_n)
            spread = min(1.0, (runs + 1) / (expected_runs(df, n, gap) + 1)) if n >= 8 * gap and not (
                terms and _markup(me, key, df)) else 1.0
            local.append((burst * evidence * spread, key, (burst, evidence, spread)))
    local.sort(key=lambda c: (-c[0], c[1]))
    mine = code_share(me)
    spelling = _ForeignSpelling(me.spelling, [key for _, key, _ in local], _lexicon(table), _code_foreignness(mine),
                                own={key for key in table.items if key.isalpha() and key.islower()}) if terms else None
    code_elsewhere = any(code_share(a) >= CODE_REGISTER for j, a in enumerate(audits) if j != index)
    bound = (SHAPES["camel"] if terms else _shape_factor("camel", mine)) * (
        2.0 if code_elsewhere and mine < CODE_REGISTER else 1.0)
    rows: dict[tuple, dict] = {}  # one row per artifact: terms with the same documents are one, its best term shown
    scores: list[float] = []  # the rows' scores, ascending
    for base, key, parts in local:
        if len(scores) >= settings.top and base * bound < scores[-settings.top]:
            break
        row = _candidate(audits, index, which, settings, key, parts, spelling)
        hosts = table.items[key][3]
        if terms and row["shape"] != "markup":
            together = 1.0 - 0.9 * cohesion({key}, hosts)
            row["factors"]["cohesion"] = round(together, 3)
            row["score"] = round(row["score"] * together, 3)
        same = (row["documents"], tuple(hosts)) if hosts is not None and len(hosts) >= settings.min_docs else key
        found = rows.get(same)
        if found is None:
            rows[same] = row
        elif row["score"] > found["score"]:
            row["together_with"] = [found["string"], *found["together_with"]]
            rows[same] = row
            scores.remove(found["score"])
        else:
            found["together_with"].append(key)
            continue
        bisect.insort(scores, row["score"])
    return sorted(rows.values(), key=lambda row: (-row["score"], row["string"]))[: settings.top]


def _markup(me: SourceAudit, key: str, df: int) -> bool:
    """Whether a term stands as unrendered markup (a template's placeholder, an HTML entity) in half its documents
    or more: its form alone marks it, so neither its read order nor its documents' topics excuse it."""
    return 2 * me.markup.get(key, 0) >= df


def _lexicon(table: CountTable) -> Lexicon:
    """The Lexicon of a source, judged by its LEXICON_WORDS most widespread lowercase words."""
    frequent = heapq.nlargest(LEXICON_WORDS, ((entry[0], key) for key, entry in table.items.items()
                                              if key.isalpha() and key.islower() and len(key) >= 3))
    return Lexicon([key for _, key in frequent])


def _candidate(audits: list[SourceAudit], index: int, which: str, settings: AuditSettings, key: str,
               parts: tuple[float, float, float], spelling: _ForeignSpelling | None) -> dict:
    """A candidate's row, scored by every factor but cohesion (docs/FORENSICS.md, "The score, factor by factor");
    a lowercase term's shape by its `spelling`."""
    me = audits[index]
    df, cf, runs, _ = getattr(me, which).items[key]
    n = max(me.documents, 1)
    mine = code_share(me)
    if which == "terms":
        shape = "markup" if _markup(me, key, df) else term_shape(key)
    else:
        shape = max((term_shape(w) if len(w) >= 3 else "lower" for w in key.split(" ")), key=SHAPES.get)
    burst, evidence, spread = parts
    known, belongs_to, elsewhere = 1.0, None, {}
    for j, other in enumerate(audits):
        found = getattr(other, which).items.get(key) if j != index else None
        if found is None or found[0] < settings.min_docs:
            continue
        elsewhere[other.name] = found[0]
        if found[0] / max(other.documents, 1) >= 10 * df / n and code_share(other) >= CODE_REGISTER > mine:
            known, belongs_to = 2.0, other.name  # a code source's word, leaking into prose
        elif belongs_to is None:
            known = 0.5  # in ordinary use elsewhere too: vocabulary, not this source's artifact
    if spelling is not None and shape == "lower":
        shape_factor = spelling(key)
    elif spelling is not None and shape in ("title", "upper"):
        shape_factor = spelling.cased(key, shape)
    elif spelling is not None and shape in _CODE_SHAPES and spelling.own_identifier(key):
        shape_factor = 1.0 + (_shape_factor(shape, mine) - 1.0) * OWN_IDENTIFIER_BONUS
    else:
        shape_factor = _shape_factor(shape, mine)
    score = burst * evidence * spread * shape_factor * known
    return {"string": key, "score": round(score, 3), "documents": df, "occurrences": cf,
            "per_document": round(cf / df, 2), "runs": runs, "shape": shape,
            "factors": {"burst": round(burst, 3), "evidence": round(evidence, 3), "spread": round(spread, 3),
                        "shape": round(shape_factor, 3), "elsewhere": known, "cohesion": 1.0},
            "belongs_to": belongs_to, "other_sources": elsewhere, "together_with": [], "examples": []}
