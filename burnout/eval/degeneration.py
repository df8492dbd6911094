"""How degenerate a generated text is: repetition (distinct-n) and hits of strings known to be junk.

The blog's fine-tuned model answered most of its test prompts with garbage ("PersonX", "AndroidRuntime", loops
of the same phrase) and nobody counted it; these numbers count it, for training's samples, `burnout compare`
and the report.

distinct-n is the share of a text's word n-grams that are unique (Li et al., 2016): 1.0 when nothing
repeats, near 0 for a loop. Words are runs of letters/digits/underscores and single punctuation marks, so
"the the the" and "... ... ..." both count as repetition. `repetition` is 1 − distinct-3. A text with fewer
than n words has no n-grams and counts as not repeating (distinct-n = 1).

A text is flagged `degenerate` when its repetition reaches REPETITION_FLAG (half of its 3-grams are
repeats: a loop, not a turn of phrase) or it contains any of the suspicious strings (e.g. those
`burnout data audit` found), matched case-sensitively as substrings.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path

from burnout.errors import BurnoutError

_WORD = re.compile(r"\w+|[^\w\s]")
REPETITION_FLAG = 0.5


def distinct_n(text: str, n: int) -> float:
    """Unique word n-grams / all word n-grams of `text` (1.0 when it has none)."""
    words = _WORD.findall(text)
    grams = [tuple(words[i:i + n]) for i in range(len(words) - n + 1)]
    return len(set(grams)) / len(grams) if grams else 1.0


def degeneration(text: str, suspicious: Sequence[str] = ()) -> dict:
    """distinct_1/2/3, repetition (1 − distinct_3), the suspicious strings found, and the degenerate flag."""
    scores = {f"distinct_{n}": distinct_n(text, n) for n in (1, 2, 3)}
    hits = sorted({s for s in suspicious if s and s in text})
    repetition = 1.0 - scores["distinct_3"]
    return {**scores, "repetition": repetition, "suspicious": hits,
            "degenerate": repetition >= REPETITION_FLAG or bool(hits)}


def summarize(texts: Sequence[str], suspicious: Sequence[str] = ()) -> dict:
    """Over several texts (one checkpoint's answers): how many are degenerate, mean distinct-2/3 and the
    suspicious strings seen."""
    scores = [degeneration(t, suspicious) for t in texts]
    count = len(scores) or 1
    return {"degenerate": sum(s["degenerate"] for s in scores), "texts": len(scores),
            "mean_distinct_2": sum(s["distinct_2"] for s in scores) / count,
            "mean_distinct_3": sum(s["distinct_3"] for s in scores) / count,
            "suspicious": sorted({h for s in scores for h in s["suspicious"]})}


# From an audit.json, each source's best-ranked suspicious terms: further down the ranking are rare words that
# are legitimate (a unit, a name) as often as not.
AUDIT_TOP_TERMS = 10


def read_suspicious(path: str | Path) -> list[str]:
    """Suspicious strings from a text file (one per line) or an audit.json (`burnout data audit`: each
    source's AUDIT_TOP_TERMS best-ranked suspicious terms)."""
    path = Path(path)
    if not path.is_file():
        raise BurnoutError(f"--suspicious: '{path}' does not exist; give a text file with one string per line "
                           "or the audit.json of `burnout data audit`")
    text = path.read_text(encoding="utf-8")
    if path.suffix != ".json":
        return [line for line in text.splitlines() if line.strip()]
    try:
        sources = json.loads(text)["sources"]
        found = [row["string"] for source in sources for row in source["suspicious_terms"][:AUDIT_TOP_TERMS]]
    except (ValueError, KeyError, TypeError):
        raise BurnoutError(f"--suspicious: '{path}' is not the audit.json of `burnout data audit` (no sources "
                           "with suspicious_terms)") from None
    return list(dict.fromkeys(found))
