"""`burnout data inspect DIR`: what a prepared data directory holds, and a decoded sample of it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from burnout.base.files import EOT_TOKEN, TOKENIZER_FILE
from burnout.base.text import plural
from burnout.data.shards import read_meta, read_tokens, verify_checksums
from burnout.data.tokenizer import load_tokenizer


def inspect_data(
    data_dir: str | Path,
    sample_tokens: int = 200,
    split: str = "train",
    seed: int = 0,
    verify: bool = False,
    out: Callable[[str], None] = print,
) -> dict:
    """Print the stats of a prepared directory and decode `sample_tokens` tokens of `split`.

    Returns {"meta": meta, "sample_ids": [...], "sample_text": str}. verify=True also re-hashes
    every shard against its sha256 (reads all the data).
    """
    data_dir = Path(data_dir)
    meta = read_meta(data_dir)
    if verify:
        verify_checksums(data_dir)
    out(f"{data_dir}: {meta['format']}, {meta['dtype']} tokens, vocab {meta['vocab_size']:,} "
        f"({meta.get('tokenizer_kind', '?')}), {EOT_TOKEN} = {meta['eot_id']}")
    for name, info in meta["splits"].items():
        shards = info["shards"]
        out(f"  {name:5s} {plural(info['tokens'], 'token'):>21}  {plural(info['documents'], 'document'):>20}  "
            f"{plural(len(shards), 'shard')}{'  ' + shards[0]['file'] + ' …' if shards else ''}")
    sources = meta.get("sources", {}).get("per_source", {})
    for name, src in sources.items():
        target = src.get("target_share")
        target_text = f", target {target:.1%}" if target is not None else ""
        tokens = src.get("tokens", src.get("train_tokens", 0) + src.get("val_tokens", 0))
        out(f"  source {name}: {plural(tokens, 'token')}, {plural(src['documents'], 'document')}, "
            f"share {src['share']:.1%}{target_text}"
            + (f", short by {plural(src['shortfall_tokens'], 'token')}" if src.get("shortfall_tokens", 0) > 0 else ""))
    cleaning = meta.get("cleaning")
    if cleaning and cleaning.get("documents_in"):
        dropped = {k: cleaning[k]["dropped_documents"] for k in ("clean", "min_chars", "dedup", "junk")}
        out(f"  cleaning ({cleaning['mode']}): {plural(cleaning['documents_in'], 'document')} in, "
            f"{cleaning['documents_out']:,} kept; "
            f"dropped: " + ", ".join(f"{k} {v:,}" for k, v in dropped.items()))
        verb = "dropped" if cleaning.get("drop_junk") else "matched (kept)"
        by_source = cleaning["junk"].get("by_source", {})
        for pattern, entry in cleaning["junk"]["patterns"].items():
            per = ", ".join(f"{name} {counts['patterns'][pattern]:,}" for name, counts in by_source.items()
                            if counts["patterns"].get(pattern))
            out(f"    junk {pattern!r}: {plural(entry['documents'], 'document')} {verb}" + (f" ({per})" if per else ""))
        for name, counts in cleaning.get("per_source", {}).items():
            dropped = {k: v for k, v in counts["dropped"].items() if v}
            out(f"    source {name}: {plural(counts['documents_in'], 'document')} in, {counts['documents_out']:,} kept"
                + ("; dropped: " + ", ".join(f"{k} {v:,}" for k, v in dropped.items()) if dropped else ""))
    tokens = read_tokens(data_dir, split)
    ids: list[int] = []
    text = ""
    if len(tokens):
        count = min(sample_tokens, len(tokens))
        start = int(np.random.default_rng(seed).integers(0, len(tokens) - count + 1))
        ids = tokens[start : start + count].astype(np.int64).tolist()
        tok = load_tokenizer(data_dir / TOKENIZER_FILE)
        text = tok.decode(ids, skip_special_tokens=False)
        out(f"  sample of {split} (tokens {start:,}..{start + count:,}):")
        out("    " + text.replace("\n", "\n    "))
    return {"meta": meta, "sample_ids": ids, "sample_text": text}
