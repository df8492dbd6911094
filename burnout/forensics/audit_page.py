"""audit.html: `burnout data audit`'s report as one self-contained page (tables, histograms as embedded PNG).

Everything on the page comes from the report dict (audit.json's content), so the page can be rebuilt
from a saved audit.json. Text from the corpus is HTML-escaped, never interpreted.
"""

from __future__ import annotations

import base64
import html
import io
import re

from burnout.base.text import plural

_CSS = """body{font-family:system-ui,sans-serif;max-width:96rem;margin:2rem auto;padding:0 1rem;color:#222}
table{border-collapse:collapse;margin:.8rem 0;font-size:.9rem}td,th{border:1px solid #ccc;padding:.25rem .5rem;
vertical-align:top;text-align:left}th{background:#f3f3f3}td.text{white-space:pre-wrap;font-family:ui-monospace,monospace;
font-size:.82rem;max-width:44rem;overflow-wrap:anywhere}td.wide{min-width:26rem}td.small{font-size:.75rem;
color:#444;min-width:11rem}
mark{background:#ffe066}td.num{text-align:right}img{max-width:100%;display:block;
margin:.8rem 0}code{background:#f3f3f3;padding:0 .2rem}section{border-top:2px solid #ddd;margin-top:2rem}
.note{color:#555;font-size:.9rem}"""
_METRICS = {"chars": "document length (characters)", "longest_line": "longest line (characters)",
            "non_text_share": "non-text share (neither word characters nor whitespace)"}


def render_page(report: dict) -> str:
    """The whole page for `report`."""
    target = report.get("target", {})
    title = f"Data audit: {target.get('kind', '')} {target.get('path', '')}".strip()
    totals = report["totals"]
    body = [f"<h1>{_e(title)}</h1>",
            f"<p>{plural(totals['documents'], 'document')}, {plural(totals['chars'], 'character')} in "
            f"{plural(len(report['sources']), 'source')}; audited in {totals['elapsed_s']:.1f} s. "
            f"Documents are {_e(target.get('documents', 'numbered by their place in their source'))}.</p>",
            _HOW_TO_READ, _overview(report)]
    for i, src in enumerate(report["sources"]):
        body.append(_source_section(i, src))
    body.append(_duplicates_section(report))
    settings = report.get("settings", {})
    body.append("<section id=\"settings\"><h2>Settings</h2>"
                + _table(["setting", "value"], [[k, v] for k, v in settings.items()], "settings-table") + "</section>")
    return (f'<!doctype html>\n<html><head><meta charset="utf-8"><title>{_e(title)}</title>'
            f"<style>{_CSS}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")


_HOW_TO_READ = """<p class="note">Suspicious strings are found without being told what to look for: terms in at
least a few documents of a source but rare in it, ranked by <b>score = burst × evidence × spread × shape ×
elsewhere × cohesion</b>. <i>burst</i>: log2(occurrences per document) + 0.25, dense where it occurs;
<i>evidence</i>: log2(1 + documents) × (1 − ln documents / ln N); <i>spread</i>: runs of nearby documents
holding it against the runs the same number of documents scattered at random would form (a topic's words
sit in nearby documents, an artifact is scattered); <i>shape</i>: 3 for unrendered markup, a word in a template's
delimiters (<code>{{user_name}}</code>) or an HTML entity (<code>&amp;nbsp;</code>), 3 for code/log shapes (inner
capitals, snake_case, hex runs, repeated units) scaled to the source's register and halved for an identifier
written in a code source's own style and words, 0.5 for Capitalized words (names); <i>elsewhere</i>: 2 when a code
source uses it and this prose source should not, 0.5 when another source uses it as ordinary vocabulary;
<i>cohesion</i>: low when its documents share other rare words (one topic). Terms found in the same documents are
one row (a log line's words), shown "with" the others. Repeated lines come most foreign first: a line whose words
the source uses nowhere else above one written in its everyday words, and one in documents of nothing in common
above one in documents of a topic (cohesion, as above). Compare scores within a source: ordinary words of clean
prose score about 1 to 2, a string planted 2 to 3 times in each of 20 scattered documents about 3, and one shaped
like code or unrendered markup about 10. To drop the documents holding a string, add a regular expression such as
<code>\\bPersonX\\b</code> to <code>data.junk_patterns</code> with <code>data.drop_junk: true</code>
(or <code>burnout data prepare … --drop REGEX</code>).</p>"""


def _overview(report: dict) -> str:
    rows = []
    for src in report["sources"]:
        outliers = sum(entry["outliers"] for entry in src["outliers"].values())
        junk = sum(entry["documents"] for entry in src["junk"])
        rows.append([src["name"], src["kind"], src["documents"], src["chars"], src["tokens"],
                     f"{src['code_share']:.2%}", len(src["suspicious_terms"]), len(src["repeated_lines"]), junk,
                     outliers, max(src["count_error_bound"].values())])
    exact = report["exact_duplicates"]["documents_per_source"]
    near = report["near_duplicates"]["documents_per_source"]
    for row in rows:
        row[9:9] = [exact.get(row[0], 0), near.get(row[0], 0)]
    columns = ["source", "kind", "documents", "characters", "words", "code-like words", "suspicious strings",
               "repeated lines", "junk documents", "outliers", "in exact duplicates", "in near duplicates",
               "count error bound"]
    return "<h2>Overview</h2>" + _table(columns, rows, "overview")


def _source_section(i: int, src: dict) -> str:
    parts = [f'<section id="source-{i}"><h2>Source {_e(src["name"])} ({_e(src["kind"])})</h2>',
             f"<p>{plural(src['documents'], 'document')}, {plural(src['chars'], 'character')}, "
             f"{plural(src['tokens'], 'word')}; "
             f"{src['code_share']:.2%} of its words look like code. Counts are short by at most "
             f"{max(src['count_error_bound'].values())} (0: exact).</p>"]
    parts.append(f"<h3>Suspicious strings</h3>{_strings_table(src['suspicious_terms'], f'terms-{i}')}")
    parts.append(f"<h3>Suspicious word pairs</h3>{_strings_table(src['suspicious_phrases'], f'phrases-{i}')}")
    for key, label in (("repeated_lines", "Lines repeated across documents"),
                       ("repeated_paragraphs", "Paragraphs repeated across documents")):
        rows = [[r["documents"], f"{r['share']:.2%}", f"{r['foreign_words']:.2f}", f"{r['cohesion']:.2f}",
                 _counts(r["documents_per_source"]), r["text"]] for r in src[key]]
        parts.append(f"<h3>{label}</h3>" + (
            _table(["documents", "share", "foreign words", "cohesion", "per source", "text"], rows, f"{key}-{i}",
                   text_columns={5}) if rows else "<p>none</p>"))
    if src["junk"]:
        rows = [[r["pattern"], r["documents"], r["matches"], _examples(r["examples"])] for r in src["junk"]]
        parts.append("<h3>Known junk (data.junk_patterns)</h3>"
                     + _table(["pattern", "documents", "matches", "examples"], rows, f"junk-{i}", text_columns={3}))
    parts.append(_outliers(i, src))
    parts.append("</section>")
    return "\n".join(parts)


def _strings_table(rows: list[dict], table_id: str) -> str:
    if not rows:
        return "<p>none</p>"
    body = []
    for rank, r in enumerate(rows, start=1):
        factors = ", ".join(f"{k} {v:g}" for k, v in r["factors"].items())
        where = _counts(r["other_sources"]) + (f" (belongs to {r['belongs_to']})" if r["belongs_to"] else "")
        string = r["string"] + (f" (with {', '.join(r['together_with'])})" if r["together_with"] else "")
        body.append([rank, string, f"{r['score']:.2f}", r["documents"], r["occurrences"], r["per_document"],
                     r["shape"], _Small(factors), where, _drop_pattern(r["string"]),
                     _marked(_examples(r["examples"]), r["string"])])
    columns = ["#", "string", "score", "documents", "occurrences", "per document", "shape", "factors",
               "other sources (documents)", "drop with", "examples"]
    return _table(columns, body, table_id, text_columns={1, 9, 10})


def _outliers(i: int, src: dict) -> str:
    rows = []
    for name, entry in src["outliers"].items():
        low = "" if entry["low"] is None else f"< {entry['low']:g} or "
        rows.append([_METRICS.get(name, name), f"{entry['median']:g}", f"{low}> {entry['high']:g}", entry["outliers"],
                     _examples(entry["examples"], value=True)])
    table = _table(["metric", "median", "outlier when", "documents", "most extreme"], rows, f"outliers-{i}",
                   text_columns={4})
    png = _histograms(src)
    image = (f'<img alt="histograms of {_e(src["name"])}" src="data:image/png;base64,{png}">' if png else "")
    return "<h3>Length and character-class outliers</h3>" + table + image


def _duplicates_section(report: dict) -> str:
    exact, near = report["exact_duplicates"], report["near_duplicates"]
    parts = ['<section id="duplicates"><h2>Duplicates (all sources)</h2>',
             f"<p>Exact duplicates: {plural(exact['groups'], 'text')} held by "
             f"{plural(exact['documents'], 'document')}, "
             f"{exact['redundant_documents']:,} of them redundant.</p>"]
    rows = [[g["copies"], _counts(g["documents"]), f"{g['first'][0]} #{g['first'][1]}", g["example"]]
            for g in exact["top"]]
    parts.append(_table(["copies", "per source", "first", "text"], rows, "exact-duplicates", text_columns={3})
                 if rows else "<p>none</p>")
    parts.append(f"<p>Near duplicates (MinHash LSH over {near['shingle_words']}-word shingles, {near['num_perm']} "
                 f"permutations, estimated Jaccard ≥ {near['threshold']}): {plural(near['clusters'], 'cluster')} "
                 "holding "
                 f"{near['documents']:,} of {plural(near['indexed_documents'], 'distinct document')} indexed "
                 f"({near['too_short_documents']:,} too short to compare).</p>")
    rows = [[c["size"], _counts(c["documents"]), c["min_similarity"],
             ", ".join(f"{s} #{d}" for s, d in c["members"][:8]) + (" …" if c["size"] > 8 else ""), c["example"]]
            for c in near["top"]]
    parts.append(_table(["documents", "per source", "lowest similarity", "members", "example"], rows,
                        "near-duplicates", text_columns={4}) if rows else "<p>none</p>")
    parts.append("</section>")
    return "\n".join(parts)


def _histograms(src: dict) -> str:
    """One PNG (base64) with a histogram per metric, the median and the outlier thresholds marked."""
    hists = src.get("histograms") or {}
    if not hists:
        return ""
    import matplotlib

    matplotlib.use("Agg")  # headless
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(hists), figsize=(4.2 * len(hists), 3), dpi=90, squeeze=False)
    for ax, (name, h) in zip(axes[0], hists.items()):
        edges, counts = h["edges"], h["counts"]
        ax.bar(edges[:-1], counts, width=[b - a for a, b in zip(edges, edges[1:])], align="edge", color="tab:blue")
        for value, style in ((h["median"], "-"), (h["high"], "--"), (h["low"], "--")):
            if value is not None:
                ax.axvline(value, color="tab:red", linestyle=style, linewidth=1)
        ax.set_yscale("log")
        ax.set_xlabel(("log10 " if h["log10"] else "") + _METRICS.get(name, name).split(" (")[0])
        ax.set_ylabel("documents")
        ax.grid(True, alpha=0.3)
    fig.suptitle(f"{src['name']}: median (solid) and outlier thresholds (dashed)", fontsize=10)
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def _drop_pattern(string: str) -> str:
    words = [re.escape(w) for w in string.split(" ")]
    return r"\b" + r"\W+".join(words) + r"\b"


class _Markup(str):
    """A cell's HTML, already escaped."""


class _Small(str):
    """A cell shown in small print."""


def _marked(text: str, string: str) -> _Markup:
    """`text` escaped, each whole-word `string` highlighted."""
    pattern = re.compile(r"(?<!\w)" + r"\W+".join(map(re.escape, string.split(" "))) + r"(?!\w)")
    parts, last = [], 0
    for match in pattern.finditer(text):
        parts += [_e(text[last : match.start()]), f"<mark>{_e(match.group())}</mark>"]
        last = match.end()
    return _Markup("".join(parts) + _e(text[last:]))


def _examples(examples: list[dict], value: bool = False) -> str:
    return "\n".join((f"[{e['value']:g}] " if value else "") + f"#{e['document']}: {e['text']}" for e in examples)


def _counts(counts: dict) -> str:
    return ", ".join(f"{k} {v:,}" for k, v in counts.items())


def _table(columns: list[str], rows: list[list], table_id: str, text_columns: set[int] = frozenset()) -> str:
    """A table; `text_columns` hold corpus text (monospace, wrapped), the last of them widest."""
    wide = max(text_columns, default=-1)
    head = "".join(f"<th>{_e(c)}</th>" for c in columns)
    body = []
    for row in rows:
        cells = []
        for j, value in enumerate(row):
            cls = ("text wide" if j == wide else "text" if j in text_columns
                   else "num" if isinstance(value, (int, float)) else "small" if isinstance(value, _Small) else "")
            shown = f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else str(value)
            content = value if isinstance(value, _Markup) else _e(shown)
            cells.append(f'<td class="{cls}">{content}</td>' if cls else f"<td>{content}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f'<table id="{_e(table_id)}"><tr>{head}</tr>' + "".join(body) + "</table>"


def _e(value) -> str:
    return html.escape(str(value))
