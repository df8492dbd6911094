"""`burnout data trace`: where in a prepared data folder a string, or a run's generated text, comes from.

A fine-tuned model that keeps writing "PersonX" learned it from somewhere; this finds every place the prepared
token shards hold it, and which document of which source each one is in (`trace_text`), or every rare n-gram of
a run's samples and their longest verbatim spans (`trace_samples`). A scan of the shards (`scan`), not an index:
the question is asked rarely, after something went wrong, and needs nothing prepare did not already write.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from burnout.base.files import COMPARE_JSON, METRICS_FILE, TOKENIZER_FILE, read_jsonl, write_atomic
from burnout.base.text import first_line, plural
from burnout.data.documents import SplitDocuments
from burnout.data.shards import SPLITS, read_meta
from burnout.errors import BurnoutError

# Tokens per read: 4M uint16 tokens are 8 MB, a buffer that stays in the last-level cache's reach.
SCAN_CHUNK_TOKENS = 1 << 22
# Up to this many distinct anchor tokens are found by one comparison each; more through a lookup table,
# looked up _LUT_STEP tokens at a time so that the gather's int64 index copy stays in the L2 cache.
_FEW_ANCHORS = 8
_LUT_STEP = 1 << 15
# The sample of a split whose token counts choose each pattern's anchor.
_SAMPLE_WINDOWS, _SAMPLE_WIDTH = 64, 1 << 16
TRACE_FILE = "trace.json"


# ----------------------------------------------------------------------------------------------
# The scan


def _read_buffers(docs: SplitDocuments, chunk_tokens: int, carry: int):
    """(stream position of buf[0], buf, carried) for consecutive chunks of the split's stream.

    Each buffer starts with the previous one's last `carry` tokens (`carried` of them; 0 for the
    first), so a match of up to carry + 1 tokens is whole in some buffer. The buffer is reused: it is
    valid until the next one is asked for.
    """
    itemsize = docs.dtype.itemsize
    buf = np.empty(carry + chunk_tokens, dtype=docs.dtype)
    raw = buf.view(np.uint8)
    base, kept, filled = 0, 0, 0  # filled: bytes of buf holding data
    for name, expected in zip(docs.shard_names, docs.shard_tokens):
        path = docs.data_dir / name
        got = 0
        try:
            with open(path, "rb", buffering=0) as f:
                while n := f.readinto(raw[filled:]):
                    filled += n
                    got += n
                    if filled == raw.size:
                        yield base, buf, kept
                        keep = min(carry, len(buf))
                        if keep:
                            buf[:keep] = buf[len(buf) - keep :].copy()
                        base += len(buf) - keep
                        kept, filled = keep, keep * itemsize
        except OSError as exc:
            raise BurnoutError(f"cannot read shard '{path}' ({exc.strerror or exc}); "
                               f"re-run burnout data prepare") from None
        if got != expected * itemsize:
            raise BurnoutError(f"shard '{path}' holds {got:,} bytes, not the {expected * itemsize:,} meta.json "
                               f"expects; it changed since prepare, re-run burnout data prepare")
    if filled > kept * itemsize:
        yield base, buf[: filled // itemsize], kept


def token_counts(docs: SplitDocuments, vocab_size: int) -> np.ndarray:
    """Estimated token frequencies of a split: counts in 64 evenly spaced windows of 64K tokens."""
    if docs.total <= _SAMPLE_WINDOWS * _SAMPLE_WIDTH:
        starts = np.arange(0, docs.total, _SAMPLE_WIDTH)
    else:
        starts = np.linspace(0, docs.total - _SAMPLE_WIDTH, _SAMPLE_WINDOWS).astype(np.int64)
    counts = np.zeros(vocab_size, dtype=np.int64)
    for start in starts:  # window by window: bincount widens its input to int64
        window = docs.read(start, start + _SAMPLE_WIDTH)
        counts += np.bincount(window, minlength=vocab_size)[:vocab_size]
    return counts


def _matches(buf: np.ndarray, carried: int, ids: np.ndarray, anchor: int, cand: np.ndarray) -> np.ndarray:
    """Starts in buf of `ids`, given the positions `cand` of its token `anchor`; only matches that
    reach past the carried tokens (those wholly inside them were found in the previous buffer)."""
    starts = cand - anchor
    length = len(ids)
    starts = starts[(starts >= 0) & (starts + length <= len(buf)) & (starts + length > carried)]
    for j in range(length):
        if j == anchor or not len(starts):
            continue
        starts = starts[buf[starts + j] == ids[j]]
    return starts


def scan(docs: SplitDocuments, patterns: list[np.ndarray], counts: np.ndarray | None = None,
         groups: list[int] | None = None, first_only: bool = False,
         chunk_tokens: int = SCAN_CHUNK_TOKENS) -> list[np.ndarray]:
    """Every start position, in the split's stream, of each pattern (a non-empty array of token ids).

    `counts` (token frequencies) picks each pattern's rarest token as its anchor. first_only: only
    whether a pattern occurs matters; once one pattern of a group (`groups[i]`, default: each pattern
    its own) is found, the group's patterns are no longer looked for, and a found pattern gets its
    first position only.

    The split's shards are read as one stream, in fixed chunks into one reused buffer (memory stays at a few
    chunks whatever the corpus), each chunk carrying the previous one's last tokens so that a match across a
    chunk or shard boundary is found once. In each chunk `np.flatnonzero(chunk == anchor)` finds the pattern's
    rarest token (its frequency estimated from a 4M-token sample of the split), and only those candidates are
    checked against the pattern's other tokens, vectorised: the scan runs at the speed of numpy's comparison
    (docs/FORENSICS.md has the rate). Many patterns are found in one pass: a lookup table marks every pattern's
    anchor token. An index built at prepare time (a suffix array or n-gram table) would answer faster but cost
    4-8 bytes per token on disk and a long build; the scan needs nothing but the shards and the document index
    (data/documents.py, 10 bytes per document) that says which source each document came from.
    """
    if not patterns:
        return []
    patterns = [np.asarray(p, dtype=np.int64) for p in patterns]
    groups = list(range(len(patterns))) if groups is None else groups
    anchors = [int(np.argmin(counts[p])) if counts is not None else 0 for p in patterns]
    by_anchor: dict[int, list[int]] = {}
    for i, (p, a) in enumerate(zip(patterns, anchors)):
        by_anchor.setdefault(int(p[a]), []).append(i)
    found: list[list[np.ndarray]] = [[] for _ in patterns]
    done: set[int] = set()
    carry = max(len(p) for p in patterns) - 1
    lut = mask = None
    for base, buf, carried in _read_buffers(docs, chunk_tokens, carry):
        live = [t for t, members in by_anchor.items() if any(groups[i] not in done for i in members)]
        if not live:
            break
        if len(live) <= _FEW_ANCHORS:
            candidates = {t: np.flatnonzero(buf == t) for t in live}
        else:
            if lut is None:  # uint16 ids index it directly; uint32 ids past its end land on its last, False, entry
                size = 1 << 16 if docs.dtype.itemsize == 2 else max(len(counts) if counts is not None else 0,
                                                                    max(by_anchor) + 1) + 1
                lut = np.zeros(size, dtype=bool)
                mask = np.empty(carry + chunk_tokens, dtype=bool)
            lut[:] = False
            lut[live] = True
            hit = mask[: len(buf)]
            for i in range(0, len(buf), _LUT_STEP):
                np.take(lut, buf[i : i + _LUT_STEP], out=hit[i : i + _LUT_STEP], mode="clip")
            where = np.flatnonzero(hit)
            tokens = buf[where]
            order = np.argsort(tokens, kind="stable")
            where, tokens = where[order], tokens[order]
            candidates = {}
            for t in live:
                lo, hi = np.searchsorted(tokens, t, "left"), np.searchsorted(tokens, t, "right")
                candidates[t] = where[lo:hi]
        for t, cand in candidates.items():
            if not len(cand):
                continue
            for i in by_anchor[t]:
                if groups[i] in done:
                    continue
                starts = _matches(buf, carried, patterns[i], anchors[i], cand)
                if len(starts):
                    if first_only:
                        found[i].append(starts[:1] + base)
                        done.add(groups[i])
                    else:
                        found[i].append(starts + base)
    return [np.sort(np.concatenate(f)) if f else np.zeros(0, dtype=np.int64) for f in found]


# ----------------------------------------------------------------------------------------------
# Queries


@dataclass
class Variant:
    text: str
    ids: list[int]
    hits: dict[str, np.ndarray] = field(default_factory=dict)  # split -> start positions


def load_folder(data_dir: str | Path):
    """(meta, tokenizer) of a prepared data folder, each problem one line."""
    data_dir = Path(data_dir)
    meta = read_meta(data_dir)
    if not (data_dir / TOKENIZER_FILE).is_file():
        raise BurnoutError(f"'{data_dir}' has no {TOKENIZER_FILE}, so its token ids cannot be matched to text; "
                           f"re-run burnout data prepare")
    from burnout.data.tokenizer import load_tokenizer

    return meta, load_tokenizer(data_dir / TOKENIZER_FILE)


def _encode(tok, text: str) -> list[int] | None:
    """The ids of `text`, or None when they do not decode back to it (characters the tokenizer lacks)."""
    try:
        ids = tok.encode(text, add_special_tokens=False).ids
    except Exception:  # a char-level tokenizer has no <unk>: the Rust side refuses unknown characters
        return None
    return ids if ids and tok.decode(ids, skip_special_tokens=False) == text else None


def variants_of(tok, text: str, what: str = "TEXT") -> list[Variant]:
    """TEXT as given and with a leading space, each encoded; a variant whose tokens contain another's
    is left out (every occurrence of it holds one of the other).

    Byte-level BPE encodes a string differently depending on what precedes it ("PersonX" at a line start,
    " PersonX" after a space), so both are searched, in the capitalisation given (case is not folded). Each
    variant decodes back to its text and every hit is decoded again from the shards: no false positives. What a
    token search cannot see: an occurrence whose first character the tokenizer merged with the character before
    it (letters glued to the string, as in "xPersonX", or another pre-token split such as a contraction) or whose
    last character it merged with what follows ("PersonXs"); those are tokenized differently and not counted."""
    if not text or not text.strip():
        raise BurnoutError(f"{what} is empty; give the string to look for, e.g. burnout data trace PersonX DATA")
    ids = _encode(tok, text)
    if ids is None:
        from burnout.data.tokenizer import name_characters

        missing = [c for c in dict.fromkeys(text) if _encode(tok, c) is None]
        detail = f" (it lacks {name_characters(missing)})" if missing else ""
        raise BurnoutError(f"{what} {text!r} cannot be encoded by this folder's tokenizer{detail}, so the data "
                           f"cannot hold it; check the string")
    found = [Variant(text, ids)]
    if not text[0].isspace():
        spaced = _encode(tok, " " + text)
        if spaced is not None:
            found.append(Variant(" " + text, spaced))
    kept: list[Variant] = []
    for v in sorted(found, key=lambda v: len(v.ids)):
        if not any(_contains(v.ids, k.ids) for k in kept):
            kept.append(v)
    return sorted(kept, key=lambda v: found.index(v))


def _contains(seq: list[int], sub: list[int]) -> bool:
    return any(seq[i : i + len(sub)] == sub for i in range(len(seq) - len(sub) + 1))


def _splits(split: str | None, meta: dict) -> list[str]:
    if split in (None, "all"):
        return [s for s in SPLITS if s in meta["splits"]]
    if split not in meta["splits"]:
        raise BurnoutError(f"--split: the folder has no split '{split}'; it has {', '.join(meta['splits'])}")
    return [split]


def _sources_note(docs_by_split: dict[str, SplitDocuments], data_dir: Path) -> str | None:
    if all(d.sources_known for d in docs_by_split.values()):
        return None
    return (f"sources unknown: '{data_dir}' was prepared before the document index existed; "
            f"re-run burnout data prepare to attribute hits to sources")


def trace_text(data_dir: str | Path, text: str, limit: int = 20, context: int = 16,
               split: str | None = None) -> dict:
    """Every occurrence of `text` in the folder's token shards: counts (total, per variant, split and
    source) and the first `limit` hits with their document, source, shard, offset and a snippet. A count is the
    number of token positions of the split streams where one variant's exact token sequence begins."""
    started = time.perf_counter()
    data_dir = Path(data_dir)
    meta, tok = load_folder(data_dir)
    variants = variants_of(tok, text)  # each decodes back to its text, so an exact id match is a hit
    docs_by_split = {s: SplitDocuments(data_dir, s, meta) for s in _splits(split, meta)}
    names = next(iter(docs_by_split.values())).source_names
    per_source = dict.fromkeys(names, 0)
    per_split, listed, documents, scanned = {}, [], 0, 0
    for s, docs in docs_by_split.items():
        counts = token_counts(docs, meta["vocab_size"])
        for v, starts in zip(variants, scan(docs, [np.array(v.ids) for v in variants], counts)):
            v.hits[s] = starts
        scanned += docs.total
        positions = np.concatenate([v.hits[s] for v in variants])
        which = np.concatenate([np.full(len(v.hits[s]), k) for k, v in enumerate(variants)])
        order = np.argsort(positions, kind="stable")
        positions, which = positions[order], which[order]
        per_split[s] = len(positions)
        doc_numbers = docs.locate(positions)
        documents += len(np.unique(doc_numbers))
        for sid, n in enumerate(np.bincount(docs.source_ids[doc_numbers], minlength=len(names))):
            per_source[names[sid]] += int(n)
        listed += [_describe_hit(docs, tok, int(p), variants[int(k)], context)
                   for p, k in zip(positions[: limit - len(listed)], which[: limit - len(listed)])]
    return {
        "query": text,
        "data_dir": str(data_dir),
        "total": sum(per_split.values()),
        "documents": documents,
        "variants": [{"text": v.text, "ids": v.ids, "count": sum(len(h) for h in v.hits.values())}
                     for v in variants],
        "per_split": per_split,
        "per_source": per_source,
        "sources_known": all(d.sources_known for d in docs_by_split.values()),
        "note": _sources_note(docs_by_split, data_dir),
        "hits": listed,
        "limit": limit,
        "tokens_scanned": scanned,
        "seconds": round(time.perf_counter() - started, 3),
    }


def _describe_hit(docs: SplitDocuments, tok, position: int, v: Variant, context: int) -> dict:
    length = len(v.ids)
    index = int(docs.locate(position))
    span = docs.span(index)
    doc_start, doc_end = docs.bounds(index)
    doc_end = doc_start + span.length  # without the <|endoftext|>
    matched = docs.tokens(position, position + length)
    decoded = tok.decode(matched.tolist(), skip_special_tokens=False)
    if decoded != v.text:  # cannot happen for an exact id match: a broken invariant, not a user error
        raise AssertionError(f"hit at {docs.split}:{position} decodes to {decoded!r}, not {v.text!r}")
    before = tok.decode(docs.tokens(max(doc_start, position - context), position).tolist(), skip_special_tokens=False)
    after = tok.decode(docs.tokens(position + length, min(doc_end, position + length + context)).tolist(),
                       skip_special_tokens=False)
    shard, offset = docs.shard_of(position)
    return {"split": docs.split, "document": index, "source": span.source, "shard": shard, "offset": offset,
            "position": position, "document_offset": position - doc_start, "variant": v.text,
            "before": before, "match": decoded, "after": after}


def _show(text: str) -> str:
    return text.replace("\r", "\\r").replace("\n", "\\n").replace("\t", "\\t")


def format_trace(result: dict) -> list[str]:
    """The terminal lines of a trace_text result."""
    splits = ", ".join(f"{s} {n:,}" for s, n in result["per_split"].items())
    lines = [f"{result['query']!r} in {result['data_dir']}: {result['total']:,} occurrences in "
             f"{plural(result['documents'], 'document')} ({splits}; {result['tokens_scanned']:,} tokens scanned "
             f"in {result['seconds']:.2f}s)"]
    lines.append("  variants: " + ", ".join(f"{v['text']!r} {v['count']:,} (ids {v['ids']})"
                                            for v in result["variants"]))
    if result["note"]:
        lines.append("  " + result["note"])
    else:
        lines.append("  per source: " + ", ".join(f"{name} {n:,}" for name, n in result["per_source"].items()))
    if result["hits"]:
        shard_width = max(len(h["shard"]) for h in result["hits"])
        source_width = max(6, *(len(h["source"]) for h in result["hits"]))
        lines.append(f"  {'split':<5} {'doc':>7}  {'source':<{source_width}}  {'shard':<{shard_width}}  "
                     f"{'offset':>10}  snippet")
        for h in result["hits"]:
            lines.append(f"  {h['split']:<5} {h['document']:>7}  {h['source']:<{source_width}}  "
                         f"{h['shard']:<{shard_width}}  {h['offset']:>10}  "
                         f"…{_show(h['before'])}⟦{_show(h['match'])}⟧{_show(h['after'])}…")
    if result["total"] > len(result["hits"]):
        lines.append(f"  … {result['total'] - len(result['hits']):,} more (--limit {result['limit']})")
    return lines


# ----------------------------------------------------------------------------------------------
# A run's samples


def read_samples(run_dir: str | Path) -> list[dict]:
    """The generated texts of a run: metrics.jsonl's "sample" values, less the prompt each continued (its
    "sample_prompt": words of the run's own data, which the model did not write), and compare.json's
    continuations, each {"label", "text"}."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise BurnoutError(f"--from-samples: run folder '{run_dir}' does not exist")
    samples = []
    if (run_dir / METRICS_FILE).is_file():
        for record in read_jsonl(run_dir / METRICS_FILE):
            if not (isinstance(record, dict) and isinstance(record.get("sample"), str)):
                continue
            text, prompt = record["sample"], record.get("sample_prompt")
            if isinstance(prompt, str) and text.startswith(prompt):
                text = text[len(prompt):]
            if text.strip():
                samples.append({"label": f"step {record.get('step')}", "text": text})
    compare = run_dir / COMPARE_JSON
    if compare.is_file():
        try:
            rows = json.loads(compare.read_text(encoding="utf-8")).get("rows", [])
            for row in rows:
                for i, text in enumerate(row.get("continuations") or []):
                    if isinstance(text, str) and text.strip():
                        samples.append({"label": f"{row.get('checkpoint')} #{i + 1}", "text": text})
        except (ValueError, AttributeError, TypeError) as exc:
            raise BurnoutError(f"'{compare}' is not a compare.json ({first_line(exc)}); "
                               f"run burnout compare again") from None
    if not samples:
        raise BurnoutError(f"'{run_dir}' has no generated samples: no 'sample' in {METRICS_FILE} that continues "
                           f"its prompt (train with train.sample_tokens above 0) and no {COMPARE_JSON} (run burnout "
                           f"compare {run_dir})")
    return samples


def word_ngrams(text: str, n: int) -> list[str]:
    words = text.split()
    return [" ".join(words[i : i + n]) for i in range(len(words) - n + 1)]


def trace_samples(run_dir: str | Path, data_dir: str | Path, n: int = 3, rare: int = 5,
                  split: str | None = None, write: bool = True) -> dict:
    """Rare word n-grams of a run's samples traced to their sources, and each sample's longest span
    found verbatim in the train split; written to RUN/trace.json.

    Every word n-gram of the samples (metrics.jsonl records with "sample", compare.json continuations) is counted
    as trace_text counts, per source; those found at most `rare` times are listed (0: the model made it up, or it
    crosses a document boundary)."""
    if n < 1:
        raise BurnoutError(f"--n: {n} must be at least 1 (words per n-gram)")
    if rare < 0:
        raise BurnoutError(f"--rare: {rare} must be 0 or more (occurrences)")
    started = time.perf_counter()
    run_dir, data_dir = Path(run_dir), Path(data_dir)
    samples = read_samples(run_dir)
    meta, tok = load_folder(data_dir)
    docs_by_split = {s: SplitDocuments(data_dir, s, meta) for s in _splits(split, meta)}
    counts = {s: token_counts(d, meta["vocab_size"]) for s, d in docs_by_split.items()}
    names = next(iter(docs_by_split.values())).source_names

    # Rare n-grams: all variants of all n-grams in one pass per split.
    grams: dict[str, list[str]] = {}
    for sample in samples:
        for gram in word_ngrams(sample["text"], n):
            labels = grams.setdefault(gram, [])
            if sample["label"] not in labels:
                labels.append(sample["label"])
    gram_variants = {}
    for gram in grams:
        try:
            gram_variants[gram] = variants_of(tok, gram, "n-gram")
        except BurnoutError:
            continue  # not encodable: it cannot be in the data (reported with count None)
    patterns = [(gram, v) for gram, vs in gram_variants.items() for v in vs]
    for s, docs in docs_by_split.items():
        for (_, v), starts in zip(patterns, scan(docs, [np.array(v.ids) for _, v in patterns], counts[s])):
            v.hits[s] = starts
    ngrams = []
    for gram, labels in grams.items():
        if gram not in gram_variants:
            ngrams.append({"ngram": gram, "count": None, "per_source": {}, "samples": labels, "first": None})
            continue
        per_source = dict.fromkeys(names, 0)
        first = None
        total = 0
        for v in gram_variants[gram]:
            for s, starts in v.hits.items():
                docs = docs_by_split[s]
                total += len(starts)
                doc_numbers = docs.locate(starts)
                for sid, k in enumerate(np.bincount(docs.source_ids[doc_numbers], minlength=len(names))):
                    per_source[names[sid]] += int(k)
                if len(starts) and first is None:
                    span = docs.span(int(doc_numbers[0]))
                    first = {"split": s, "document": span.index, "source": span.source, "shard": span.shard}
        if total <= rare:
            ngrams.append({"ngram": gram, "count": total, "per_source": {k: c for k, c in per_source.items() if c},
                           "samples": labels, "first": first})
    ngrams.sort(key=lambda g: (-1 if g["count"] is None else g["count"], g["ngram"]))

    train = docs_by_split["train"] if "train" in docs_by_split else SplitDocuments(data_dir, "train", meta)
    memorised = _longest_spans(samples, tok, train, counts.get("train"), meta)
    result = {
        "run_dir": str(run_dir),
        "data_dir": str(data_dir),
        "n": n,
        "rare": rare,
        "splits": list(docs_by_split),
        "samples": len(samples),
        "ngrams_total": len(grams),
        "ngrams_rare": sum(1 for g in ngrams if g["count"] is not None),
        "ngrams_unseen": sum(1 for g in ngrams if g["count"] == 0),
        "rare_ngrams": ngrams,
        "memorisation": memorised,
        "sources_known": all(d.sources_known for d in docs_by_split.values()),
        "note": _sources_note(docs_by_split, data_dir),
        "seconds": round(time.perf_counter() - started, 3),
    }
    if write:
        write_atomic(run_dir / TRACE_FILE, json.dumps(result, indent=2, ensure_ascii=False) + "\n")
    return result


def _longest_spans(samples: list[dict], tok, docs: SplitDocuments, counts: np.ndarray | None, meta: dict) -> list[dict]:
    """Per sample, the longest run of its tokens found verbatim in `docs` (the train split): a binary
    search on the length, every sample's candidate spans of the current length in one pass."""
    if counts is None:
        counts = token_counts(docs, meta["vocab_size"])
    ids = []
    for sample in samples:
        try:
            ids.append(np.array(tok.encode(sample["text"], add_special_tokens=False).ids, dtype=np.int64))
        except Exception:
            ids.append(np.zeros(0, dtype=np.int64))
    lo = [0] * len(samples)  # longest length known to occur
    hi = [len(x) + 1 for x in ids]  # shortest length known not to
    where: list[tuple[int, int] | None] = [None] * len(samples)  # (stream position, offset in the sample)
    while True:
        searching = [i for i in range(len(samples)) if hi[i] - lo[i] > 1]
        if not searching:
            break
        patterns, owners, spans = [], [], {}
        for i in searching:
            mid = (lo[i] + hi[i]) // 2
            for j in range(len(ids[i]) - mid + 1):
                key = ids[i][j : j + mid].tobytes()
                if (i, key) in spans:
                    continue
                spans[(i, key)] = len(patterns)
                patterns.append(ids[i][j : j + mid])
                owners.append((i, j))
        found = scan(docs, patterns, counts, groups=[i for i, _ in owners], first_only=True)
        hit = {}
        for (i, j), starts in zip(owners, found):
            if len(starts) and i not in hit:
                hit[i] = (int(starts[0]), j)
        for i in searching:
            mid = (lo[i] + hi[i]) // 2
            if i in hit:
                lo[i], where[i] = mid, hit[i]
            else:
                hi[i] = mid
    out = []
    for sample, x, length, place in zip(samples, ids, lo, where):
        entry = {"sample": sample["label"], "tokens": len(x), "longest_tokens": length, "text": "", "found_in": None}
        if place is not None:
            position, offset = place
            entry["text"] = tok.decode(x[offset : offset + length].tolist(), skip_special_tokens=False)
            span = docs.span(int(docs.locate(position)))
            entry["found_in"] = {"split": docs.split, "document": span.index, "source": span.source,
                                 "shard": span.shard, "offset": docs.shard_of(position)[1]}
        out.append(entry)
    return out


def format_samples(result: dict, limit: int = 20) -> list[str]:
    """The terminal lines of a trace_samples result."""
    lines = [f"{result['samples']} samples of {result['run_dir']}: {result['ngrams_total']:,} distinct word "
             f"{result['n']}-grams, {result['ngrams_rare']:,} rare (at most {result['rare']} occurrences in "
             f"{'+'.join(result['splits'])} of {result['data_dir']}), {result['ngrams_unseen']:,} never seen"]
    if result["note"]:
        lines.append("  " + result["note"])
    rows = result["rare_ngrams"][:limit]
    if rows:
        width = min(40, max(len(repr(g["ngram"])) for g in rows))
        lines.append(f"  {'rare n-gram':<{width}}  {'count':>5}  per source")
        for g in rows:
            count = "-" if g["count"] is None else f"{g['count']:,}"
            per = ", ".join(f"{k} {v:,}" for k, v in g["per_source"].items()) or "-"
            lines.append(f"  {repr(g['ngram'])[:width]:<{width}}  {count:>5}  {per}")
        if len(result["rare_ngrams"]) > len(rows):
            lines.append(f"  … {len(result['rare_ngrams']) - len(rows):,} more in {TRACE_FILE}")
    lines.append("  longest span of each sample found verbatim in the train split:")
    width = max(6, *(len(m["sample"]) for m in result["memorisation"]))
    lines.append(f"  {'sample':<{width}}  {'tokens':>6}  {'longest':>7}  {'source':<12}  text")
    for m in result["memorisation"][:limit]:
        source = m["found_in"]["source"] if m["found_in"] else "-"
        text = _show(m["text"])
        lines.append(f"  {m['sample']:<{width}}  {m['tokens']:>6}  {m['longest_tokens']:>7}  {source:<12}  "
                     f"{text[:60]!r}{'…' if len(text) > 60 else ''}")
    if len(result["memorisation"]) > limit:
        lines.append(f"  … {len(result['memorisation']) - limit:,} more in {TRACE_FILE}")
    return lines
