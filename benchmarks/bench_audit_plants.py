"""Does `burnout data audit` rank garbage above content? Plants of several kinds, at several rates, in real text.

    python -m benchmarks.bench_audit_plants [--documents 1000] [--rates 10,5,2,1] [--orders natural,shuffled]
                                            [--sets "chosen with,held out sixth"]

Three real sources: WikiText-2 (the raw test split, a line a document) and Tiny Shakespeare (a speech a
document) from the shared data (../shared/data), and Python's docs (the `stdlib_docs` source of the
quickstart's data mix, burnout/configs/data/default.yaml), the first --documents of each. Into one source at a
time, at each rate (a share of its documents, drawn at random for each plant, at least 3), each plant of a
set is put: a word at random places in the document (1 to 3 times), a line between its lines (once). The
three sources are audited together, as a data mix's are, in their natural order (a data mix's audit) or
shuffled (a prepared folder's). Five sets of plants, each planted on its own: the first was used while
choosing the score, the second ("held out") was fixed before it was first measured, the third ("held out again")
before the score's Lexicon was, the fourth before the rules of 2026-11-27 (docs/FORENSICS.md) were first measured
on it, the fifth after the fourth's misses had led to dotted placeholders and the lines' cohesion and before it was
first measured, the sixth after a capitalised nonsense word had led to words of no list being foreign whatever their
case and before it was first measured (docs/FORENSICS.md gives each set's first figures). `--sets` measures some.

For each plant: its rank in its source's suspicious strings (the first row holding one of its key strings, as the
row's term or one shown with it; "-" when none is among the top 100). Then each clean source's top ten, for a
person to judge what is garbage there.
"""

from __future__ import annotations

import argparse
import os
import random
import time
from pathlib import Path

from benchmarks import results

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"

# name: (how it is planted, the text planted, the strings whose first row is the plant's rank)
PLANTS = {
    "nonsense word": ("word", "florbix", ("florbix",)),
    "{{user_name}}": ("word", "{{user_name}}", ("user_name",)),
    "PersonX": ("word", "PersonX", ("PersonX",)),
    "log line": ("line", "E/AndroidRuntime: FATAL EXCEPTION: main", ("AndroidRuntime", "FATAL", "EXCEPTION")),
    "markup line": ("line", '<p class="footer">&nbsp;</p>', ("nbsp",)),
    "code identifier": ("word", "mLayoutInflater", ("mLayoutInflater",)),
}
HELD_OUT = {
    "nonsense word 2": ("word", "quazzle", ("quazzle",)),
    "[[FIRST_NAME]]": ("word", "[[FIRST_NAME]]", ("FIRST_NAME",)),
    "<|im_start|>": ("word", "<|im_start|>", ("im_start",)),
    "log line 2": ("line", "W/System.err: at java.lang.Thread.run(Thread.java:764)",
                   ("System.err", "java.lang.Thread.run", "Thread.java")),
    "markup line 2": ("line", '<div class="mw-parser-output">', ("div",)),
    "boilerplate line": ("line", "Click here to subscribe to our newsletter!", ("subscribe", "newsletter")),
    "code identifier 2": ("word", "getElementById", ("getElementById",)),
}
# Fixed on 2026-11-26 before the audit's Lexicon (a word of no language's list) was first measured, which was added
# after "held out"'s nonsense word missed: a third set, to see whether it generalises.
HELD_OUT_AGAIN = {
    "nonsense word 3": ("word", "grindlewop", ("grindlewop",)),
    "mojibake word": ("word", "donâ€™t", ("donâ",)),
    "%%template%%": ("word", "%%CUSTOMER_ID%%", ("CUSTOMER_ID",)),
    "tracking parameter": ("word", "utm_source=newsletter", ("utm_source",)),
    "log line 3": ("line", "INFO [main] o.s.b.w.embedded.tomcat.TomcatWebServer : Tomcat started on port(s): 8080",
                   ("o.s.b.w.embedded.tomcat.TomcatWebServer", "Tomcat")),
}
# Fixed on 2026-11-27 after the run gap in characters, the placeholder shape, own identifiers, one row per artifact and
# the line ranking were chosen on the three sets above, and before this set was first measured.
HELD_OUT_FOURTH = {
    "nonsense word 4": ("word", "blorptic", ("blorptic",)),
    "jinja placeholder": ("word", "{{ product.title }}", ("product.title",)),
    "code identifier 3": ("word", "setOnClickListener", ("setOnClickListener",)),
    "click id": ("word", "fbclid=IwAR2xQ", ("fbclid", "IwAR2xQ")),
    "log line 4": ("line", "2023-04-01 12:00:01,123 ERROR [worker-3] Connection reset by peer", ("ERROR", "worker")),
    "footer line": ("line", "© 2024 Example Media. All rights reserved. | Privacy Policy | Terms of Use",
                    ("Privacy", "Policy")),
}
# Fixed on 2026-11-28 after the fourth set's misses in Python's docs led to dotted placeholders and the lines'
# cohesion, and before this set was first measured.
HELD_OUT_FIFTH = {
    "nonsense word 5": ("word", "vexmoril", ("vexmoril",)),
    "mojibake word 2": ("word", "cafÃ©", ("cafÃ",)),
    "erb placeholder": ("word", "<%= user.name %>", ("user.name",)),
    "base64 image": ("word", "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDw"
                     "AChwGA60e6kgAAAABJRU5ErkJggg==",
                     ("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg",
                      "base64")),
    "escaped entity": ("word", "&amp;quot;", ("quot", "amp")),
    "cookie line": ("line", "We use cookies to improve your experience. Accept all cookies", ("cookies", "Accept")),
    "script error line": ("line", "Uncaught TypeError: Cannot read properties of undefined (reading 'map')",
                          ("Uncaught", "TypeError")),
}
# Fixed on 2026-11-29 after a capitalised nonsense word in 20 of 368 WikiText-2 documents was found unranked (issue 48)
# and led to words of no list being foreign whatever their case, and before this set was first measured: each kind
# varies what the sets above hold fixed (case, length, script, documents, occurrences). Each made-up word is in no
# English word list of wordfreq's and in none of the three sources; `Подробнее` ("read more") is Russian.
HELD_OUT_SIXTH = {
    "capitalised nonsense word": ("word", "Quorvane", ("Quorvane",)),
    "ALLCAPS nonsense word": ("word", "ZENTROK", ("ZENTROK",)),
    "short nonsense word": ("word", "vyx", ("vyx",)),
    "long nonsense word": ("word", "flumberquastivane", ("flumberquastivane",)),
    "mixed-case token": ("word", "kQpWzRtvYb", ("kQpWzRtvYb",)),
    "Cyrillic word": ("word", "Подробнее", ("Подробнее",)),
    "CJK string": ("word", "点击这里", ("点击这里",)),
    "capitalised word once": ("once", "Velmoraine", ("Velmoraine",)),
    "dense word in 3 documents": ("few", "plimbet", ("plimbet",)),
    "boilerplate line 2": ("line", "Posted in Uncategorized | Leave a comment", ("Uncategorized",)),
}
SETS = {"chosen with": PLANTS, "held out": HELD_OUT, "held out again": HELD_OUT_AGAIN,
        "held out fourth": HELD_OUT_FOURTH, "held out fifth": HELD_OUT_FIFTH, "held out sixth": HELD_OUT_SIXTH}


def read_sources(documents: int) -> dict[str, list[str]]:
    """The first `documents` non-empty documents of each source, as the audit reads them."""
    from burnout.config import SourceConfig
    from burnout.data.corpus import iter_documents

    specs = {
        "wikitext": SourceConfig(name="wikitext", kind="text", split_by="line",
                                 path=str(SHARED / "wikitext2" / "wiki.test.raw")),
        "shakespeare": SourceConfig(name="shakespeare", kind="text", split_by="paragraph",
                                    path=str(SHARED / "tinyshakespeare" / "input.txt")),
        "docs": SourceConfig(name="docs", kind="stdlib_docs"),
    }
    out = {}
    for name, spec in specs.items():
        docs = []
        for text in iter_documents(spec):
            docs.append(text)
            if len(docs) >= documents:
                break
        out[name] = docs
    return out


def plant(docs: list[str], plants: dict, rate: float, seed: int) -> list[str]:
    """`docs` with each of `plants` in `rate` of them (at least 3; a "few" plant in 3 at any rate), its documents
    drawn at random among those of 8 words or more."""
    rng = random.Random(f"plant {seed}")
    docs = list(docs)
    body = [i for i, text in enumerate(docs) if len(text.split()) >= 8]
    count = max(3, round(rate * len(docs)))
    for how, text, _ in plants.values():
        for i in rng.sample(body, 3 if how == "few" else count):
            docs[i] = put(docs[i], how, text, rng)
    return docs


# How many times a word is put into each of its documents, by how it is planted.
TIMES = {"word": (1, 3), "once": (1, 1), "few": (5, 9)}


def put(doc: str, how: str, text: str, rng: random.Random) -> str:
    """`doc` with `text` planted: as a "word" 1 to 3 times between its words ("once": once; "few": 5 to 9 times), as
    a "line" once between its lines."""
    if how in TIMES:
        words = doc.split(" ")
        for _ in range(rng.randint(*TIMES[how])):
            words.insert(rng.randrange(1, len(words)), text)
        return " ".join(words)
    lines = doc.split("\n")
    lines.insert(rng.randrange(1, len(lines) + 1), text)
    return "\n".join(lines)


def audit(sources: dict[str, list[str]], shuffled: bool) -> dict[str, tuple[list[list[str]], list[str]]]:
    """Each source's suspicious terms (each row's term, then those shown with it) and repeated lines, best first
    (the sources audited together, top 100); `shuffled` reads each source's documents in a seeded random order, as a
    prepared folder holds them."""
    from burnout.forensics.audit import audit_streams
    from burnout.forensics.audit_settings import AuditSettings

    if shuffled:
        sources = {name: random.Random(f"order {name}").sample(docs, len(docs)) for name, docs in sources.items()}
    streams = [(name, "text", lambda docs=docs: iter(docs)) for name, docs in sources.items()]
    report = audit_streams(streams, AuditSettings(top=100))
    return {src["name"]: ([[row["string"], *row["together_with"]] for row in src["suspicious_terms"]],
                          [row["text"] for row in src["repeated_lines"]]) for src in report["sources"]}


def plant_rank(lists: tuple[list[list[str]], list[str]], how: str, text: str, keys: tuple[str, ...]) -> str | None:
    """Where a plant is found: the rank of the first suspicious string's row holding one of its key strings ("3"),
    or for a planted line, its rank among the repeated lines where that is better ("L1"); None when in neither top
    100."""
    rows, lines = lists
    term = next((rank for rank, row in enumerate(rows, 1) if any(key in row for key in keys)), None)
    line = lines.index(" ".join(text.split())) + 1 if how == "line" and " ".join(text.split()) in lines else None
    if line is not None and (term is None or line < term):
        return f"L{line}"
    return None if term is None else str(term)


def without_others(lists: tuple[list[list[str]], list[str]], plants: dict, name: str
                   ) -> tuple[list[list[str]], list[str]]:
    """The ranked lists without the rows and lines of the set's plants other than `name`: where a plant stands among
    the source's own strings (a set's plants are planted together, so a set of many fills its top ten itself)."""
    rows, lines = lists
    keys = {key for other, (_, _, found) in plants.items() if other != name for key in found}
    texts = {" ".join(text.split()) for other, (how, text, _) in plants.items() if other != name and how == "line"}
    return [row for row in rows if keys.isdisjoint(row)], [line for line in lines if line not in texts]


def _rank_number(rank: str) -> int:
    return int(rank.lstrip("L"))


def _table(title: str, plants: dict, ranks: dict, alone: dict) -> int:
    """Print a set's table; the cells in which a plant was in its source's top ten."""
    print(f"\n{title}: rank of each plant in its source's suspicious strings, or Ln in its repeated lines "
          "(- : in neither top 100); alone: in the top 10 with the set's other plants left out\n")
    print("| source, order, rate | " + " | ".join(name.replace("|", "\\|") for name in plants)
          + " | in the top 10 | alone |")
    print("|---|" + "---|" * (len(plants) + 2))
    in_top_ten = 0
    for cell, found in ranks.items():
        cells = [" ".join(r or "-" for r in found[name]) for name in plants]
        top, by_itself = (sum(1 for name in plants for r in got[name] if r and _rank_number(r) <= 10)
                          for got in (found, alone[cell]))
        total = sum(len(found[name]) for name in plants)
        print(f"| {cell} | " + " | ".join(cells) + f" | {top} of {total} | {by_itself} of {total} |")
        in_top_ten += top
    return in_top_ten


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--documents", type=int, default=1000, help="documents per source (default 1000)")
    parser.add_argument("--rates", default="10,5,2,1", help="planted shares of documents, in %% (default 10,5,2,1)")
    parser.add_argument("--orders", default="natural,shuffled", help="read orders (default natural,shuffled)")
    parser.add_argument("--seeds", type=int, default=1, help="plantings per source, rate and set (default 1)")
    parser.add_argument("--sets", default=",".join(SETS), help="the sets of plants to measure (default: all)")
    args = parser.parse_args()
    unknown = [name for name in args.sets.split(",") if name not in SETS]
    if unknown:
        raise SystemExit(f"no set of plants named {', '.join(unknown)}; the sets: {', '.join(SETS)}")
    sets = {name: SETS[name] for name in args.sets.split(",")}
    if not SHARED.is_dir():
        raise SystemExit(f"the shared data folder {SHARED} is missing")
    rates = [float(r) / 100 for r in args.rates.split(",")]
    orders = args.orders.split(",")
    clean = read_sources(args.documents)
    start, cpu, load_before = time.perf_counter(), time.process_time(), results.load()
    ranks: dict[str, dict] = {name: {} for name in sets}
    alone: dict[str, dict] = {name: {} for name in sets}
    for set_name, plants in sets.items():
        for name in clean:
            for order in orders:
                for rate in rates:
                    cell = f"{name}, {order}, {rate:.0%}"
                    found = ranks[set_name].setdefault(cell, {p: [] for p in plants})
                    by_itself = alone[set_name].setdefault(cell, {p: [] for p in plants})
                    for seed in range(args.seeds):
                        ranked = audit({**clean, name: plant(clean[name], plants, rate, seed)},
                                       order == "shuffled")[name]
                        for plant_name, (how, text, keys) in plants.items():
                            found[plant_name].append(plant_rank(ranked, how, text, keys))
                            by_itself[plant_name].append(
                                plant_rank(without_others(ranked, plants, plant_name), how, text, keys))
    baseline = {order: audit(clean, order == "shuffled") for order in orders}
    sizes = ", ".join(f"{name} {len(docs)}" for name, docs in clean.items())
    print(f"documents: {sizes}; {args.seeds} planting(s) per cell; {time.perf_counter() - start:.0f} s wall, "
          f"{time.process_time() - cpu:.0f} s CPU, load {os.getloadavg()[0]:.1f}")
    in_top_ten = {set_name: _table(f"plants {set_name} the score", plants, ranks[set_name], alone[set_name])
                  for set_name, plants in sets.items()}
    if (args.documents, args.rates, args.orders, args.seeds) == (1000, "10,5,2,1", "natural,shuffled", 1):
        first_five = list(SETS)[:5]
        if all(name in in_top_ten for name in first_five):
            results.record("forensics.plants_top_ten", sum(in_top_ten[name] for name in first_five),
                           load_before=load_before)
        if "held out sixth" in in_top_ten:
            results.record("forensics.sixth_set_top_ten", in_top_ten["held out sixth"], load_before=load_before)
    print("\neach clean source's top ten\n")
    for order, ranked in baseline.items():
        for name, (strings, _) in ranked.items():
            print(f"- {name}, {order}: " + ", ".join(f"`{row[0]}`" for row in strings[:10]))


if __name__ == "__main__":
    main()
