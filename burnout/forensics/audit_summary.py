"""The terminal summary of an audit report (audit.json's content): per source the top suspicious strings, repeated
lines, junk and outliers; duplicates over all sources."""

from __future__ import annotations

from pathlib import Path

from burnout.base.text import plural


def summary(report: dict, written: list[Path] = (), rows: int = 10) -> str:
    """The terminal summary: per source the top suspicious strings, repeated lines, junk and outliers;
    duplicates over all sources."""
    totals = report["totals"]
    target = report["target"]
    lines = [f"audit of {target.get('kind', '?')} {target.get('path', '')}: "
             f"{plural(len(report['sources']), 'source')}, {plural(totals['documents'], 'document')}, "
             f"{plural(totals['chars'], 'character')}, {totals['elapsed_s']:.1f} s"]
    for src in report["sources"]:
        lines += _source_summary(src, rows)
    exact, near = report["exact_duplicates"], report["near_duplicates"]
    lines.append(f"exact duplicates: {plural(exact['groups'], 'text')} in {plural(exact['documents'], 'document')}, "
                 f"{exact['redundant_documents']:,} of them redundant" + _per_source(exact["documents_per_source"]))
    lines.append(f"near duplicates (Jaccard >= {near['threshold']}): {plural(near['clusters'], 'cluster')}, "
                 f"{plural(near['documents'], 'document')}" + _per_source(near["documents_per_source"]))
    for cluster in near["top"][:3]:
        lines.append(f"  {plural(cluster['size'], 'document')} {_per_source(cluster['documents']).strip()}: "
                     f"{cluster['example'][:90]}")
    if target.get("kind") == "prepared":
        lines.append(f"every occurrence of a string: burnout data trace STRING {target['path']}")
    if written:
        lines.append("wrote " + ", ".join(str(p) for p in written))
    return "\n".join(lines)


def _source_summary(src: dict, rows: int) -> list[str]:
    lines = [f"source {src['name']} ({src['kind']}): {plural(src['documents'], 'document')}, "
             f"{plural(src['chars'], 'character')}"]
    if src["suspicious_terms"]:
        lines.append("  suspicious strings (score = burst x evidence x spread x shape x elsewhere x cohesion):")
        for row in src["suspicious_terms"][:rows]:
            example = _around(row["examples"][0]["text"], row["string"], 64) if row["examples"] else ""
            lines.append(f"    {row['score']:7.2f}  {row['string'][:32]:32s} {plural(row['documents'], 'doc'):>11} "
                         f"{plural(row['occurrences'], 'time'):>13}  {example}")
    repeated = src["repeated_lines"]
    if repeated:
        lines.append(f"  repeated lines: {len(repeated)} listed, the first in "
                     f"{plural(repeated[0]['documents'], 'document')}: {repeated[0]['text'][:80]!r}")
    for entry in src["junk"]:
        lines.append(f"  junk {entry['pattern']!r}: {plural(entry['documents'], 'document')}, "
                     f"{plural(entry['matches'], 'match', 'matches')}")
    outliers = src["outliers"]
    if outliers:
        names = {"chars": "length", "longest_line": "longest line", "non_text_share": "non-text share"}
        lines.append("  outlier documents: " + ", ".join(f"{names.get(name, name)} {entry['outliers']:,}"
                                                         for name, entry in outliers.items()))
    return lines


def _around(text: str, string: str, width: int) -> str:
    """About `width` characters of an example, around its first `string`."""
    at = max(0, text.find(string))
    left = max(0, at - (width - len(string)) // 2)
    return ("…" if left else "") + text[left : left + width].strip() + ("…" if left + width < len(text) else "")


def _per_source(counts: dict) -> str:
    return " (" + ", ".join(f"{k} {v:,}" for k, v in counts.items()) + ")" if counts else ""
