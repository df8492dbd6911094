"""The audit ranks garbage above content: strings foreign to a source's text, planted into a few of its
documents of unrelated topics, come out in its top 10 suspicious strings, above the words of its topics.

Three real sources (WikiText-2 lines, Tiny Shakespeare speeches, Python's docs), 300 documents each,
shuffled as a prepared folder holds them (no read order tells a topic's documents apart). The plants are
of the kinds the old ranking missed: a nonsense word in 6% of the documents (over the old 5% ceiling of
candidates); an HTML entity, a log line and a lone nonsense word on a line of their own, once per
document in 2% (ranked by how unlike the source's words they are spelled, not by repetition); a
template placeholder in 5% of the docs, whose every word is an identifier of some sort (ranked above
them because its documents have nothing else in common); a nonsense word spelled as English words are
(`quazzle`, in 2%), which only the source's word list (Lexicon) tells from the words of its topics. Seeds of
the plantings other than SEED: docs/FORENSICS.md."""

from __future__ import annotations

import contextlib
import io
import json
import random
import re
from pathlib import Path

import pytest
import yaml

from benchmarks.bench_audit_plants import put
from burnout.cli import main
from burnout.common import AUDIT_JSON
from burnout.config import SourceConfig
from burnout.data.corpus import iter_documents
from burnout.forensics.suspicious_strings import SHAPES, Lexicon, Spelling, _ForeignSpelling

DOCUMENTS = 300
SEED = 0  # of each source's planting; seeds 0 to 7 were checked (docs/FORENSICS.md)
# source: [(text, "word" (1 to 3 times at random places) or "line" (once, between lines), share, the key
# string the audit should rank)]
PLANTS = {
    "wikitext": [("florbix", "word", 0.06, "florbix"), ('<p class="footer">&nbsp;</p>', "line", 0.02, "nbsp"),
                 ("quazzle", "word", 0.02, "quazzle")],
    "shakespeare": [("E/AndroidRuntime: FATAL EXCEPTION: main", "line", 0.02, "AndroidRuntime"),
                    ("vorplex", "line", 0.02, "vorplex")],
    "docs": [("PersonX", "word", 0.05, "PersonX")],
}


def _sources(shared_data: Path) -> dict[str, list[str]]:
    specs = {"wikitext": dict(kind="text", split_by="line", path=str(shared_data / "wikitext2" / "wiki.test.raw")),
             "shakespeare": dict(kind="text", split_by="paragraph",
                                 path=str(shared_data / "tinyshakespeare" / "input.txt")),
             "docs": dict(kind="stdlib_docs")}
    out = {}
    for name, spec in specs.items():
        docs = out[name] = []
        for text in iter_documents(SourceConfig(name=name, **spec)):
            docs.append(text)
            if len(docs) == DOCUMENTS:
                break
    return out


def _plant(docs: list[str], plants: list[tuple], rng: random.Random) -> tuple[list[str], dict[str, set[int]]]:
    """The documents with the plants in, shuffled; and which documents hold each plant's key."""
    docs = list(docs)
    body = [i for i, text in enumerate(docs) if len(text.split()) >= 8]
    for text, how, share, _ in plants:
        for i in rng.sample(body, round(share * len(docs))):
            docs[i] = put(docs[i], how, text, rng)
    rng.shuffle(docs)
    return docs, {key: {n for n, text in enumerate(docs) if re.search(rf"(?<!\w){key}(?!\w)", text)}
                  for *_, key in plants}


@pytest.fixture(scope="module")
def audited(shared_data, tmp_path_factory):
    """The planted sources audited once through the command line: (audit.json, where each plant is)."""
    folder = tmp_path_factory.mktemp("plants")
    where, sources = {}, []
    for name, docs in _sources(shared_data).items():
        planted, where[name] = _plant(docs, PLANTS[name], random.Random(SEED))
        path = folder / f"{name}.jsonl"
        path.write_text("".join(json.dumps({"text": text}) + "\n" for text in planted), encoding="utf-8")
        sources.append({"name": name, "kind": "jsonl", "path": str(path)})
    recipe = folder / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({"data": {"sources": sources}}), encoding="utf-8")
    out = folder / "audit"
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["data", "audit", str(recipe), "--chars-per-source", "0", "--out", str(out)]) == 0
    return json.loads((out / AUDIT_JSON).read_text(encoding="utf-8")), where


@pytest.mark.parametrize("source,key", [(name, plant[-1]) for name, plants in PLANTS.items() for plant in plants])
def test_planted_garbage_ranks_in_its_sources_top_10(audited, source, key):
    report, where = audited
    rows = next(s for s in report["sources"] if s["name"] == source)["suspicious_terms"]
    ranked = [row["string"] for row in rows]
    assert key in ranked[:10], f"{key} not in {source}'s top 10: {ranked[:10]}"
    row = rows[ranked.index(key)]
    assert row["documents"] == len(where[source][key])
    assert row["examples"] and all(e["document"] in where[source][key] for e in row["examples"])


def test_the_lexicon_is_the_language_whose_word_list_holds_the_sources_words():
    english = Lexicon(["river", "album", "during", "between", "hurricane", "metres", "season", "released"])
    assert english.language == "en" and english.knows("vertebrae") and not english.knows("quazzle")
    # Identifiers run list words together; the plants of bench_audit_plants do not.
    assert all(english.compound(word) for word in ("lineno", "isinstance", "startswith", "frozenset"))
    assert not any(english.compound(word) for word in ("quazzle", "grindlewop", "florbix", "vorplex", "kwargs"))
    assert english.compound("getattr", own={"attr"}) and not english.compound("grindlewop", own={"attr"})
    german = Lexicon(["gemeinde", "einwohner", "bürgermeister", "landkreis", "ortsteil", "jahrhundert", "kirche",
                      "bahnhof", "straße", "zwischen"])
    assert german.language == "de" and german.knows("ortschaft") and not german.knows("quazzle")
    consonants = Lexicon(["xkcdq", "brtzv", "qwrtp", "zxcvb", "mnbvc", "lkjhg", "pqrst", "vbnmx"])
    assert consonants.language is None and consonants.knows("quazzle")  # no list fits: nothing is unknown


def test_a_word_of_no_list_is_foreign_only_in_a_source_where_such_words_are_rare():
    """Python's docs hold many words of no list (`lineno`, `kwargs`): there an unknown word is the source's own
    vocabulary, and the bonus that lifts `quazzle` in prose would lift its identifiers above planted garbage."""
    import wordfreq

    plain = [w for w in wordfreq.top_n_list("en", 400) if w.isalpha() and len(w) >= 3][:300]
    words = plain + [f"{n}th" for n in range(4, 20)]  # and ordinals, as WikiText-2 has them
    lexicon, spelling = Lexicon(plain), Spelling(words)
    prose = _ForeignSpelling(spelling, words, lexicon, code_foreignness=1.0)
    # "thather" is spelled as this source's words are (its spelling alone gives 1), and is no word of any list.
    assert prose("thather") == SHAPES["camel"] and prose("wending") < 1.1
    assert prose("24th") < SHAPES["camel"]  # with digits: judged by its spelling alone (the lists hold "00th")
    identifiers = ["kwargs", "getattr", "hasattr", "setattr", "delattr", "asyncio", "bufsize", "fileobj", "funcname",
                   "tzinfo"]  # no compounds; 10 of 310 words: 3.2%, over OWN_UNKNOWN_WORDS's upper bound
    code = _ForeignSpelling(spelling, words + identifiers, lexicon, code_foreignness=1.0)
    assert code.unknown == 1.0 and code("thather") == 1.0


def test_compounds_are_a_sources_own_words_only_where_it_writes_many():
    """Python's docs run list words together (`lineno`, `isinstance`): there such a compound is its vocabulary and a
    nonsense word (`grindlewop`) is still foreign; in prose a compound of no list is as foreign as any other word."""
    import wordfreq

    plain = [w for w in wordfreq.top_n_list("en", 400) if w.isalpha() and len(w) >= 3][:300]
    lexicon, spelling = Lexicon(plain), Spelling(plain)
    compounds = ["lineno", "isinstance", "frozenset", "bytearray", "divmod", "issubclass"]  # 6 of 306: 2.0%
    code = _ForeignSpelling(spelling, plain + compounds, lexicon, code_foreignness=1.0)
    assert code("grindlewop") == SHAPES["camel"] and code("lineno") < SHAPES["camel"]
    prose = _ForeignSpelling(spelling, plain + ["lineno"], lexicon, code_foreignness=1.0)  # 1 of 301: 0.3%
    assert prose("lineno") == SHAPES["camel"]
    # Where compounds are its own, their parts may be the source's own words too (`get` + `attr`, `kw` + `args`, of
    # one letter with them: `n` + `bytes`), and those are neither lifted nor counted among its words of no list:
    # 8 more of 314 (2.5%) would have taken most of the bonus from `grindlewop`.
    own = {"attr", "args", "kw", "bytes", "dict", "buf", "size"}
    identifiers = ["getattr", "setattr", "hasattr", "delattr", "kwargs", "nbytes", "dicts", "bufsize"]
    code = _ForeignSpelling(spelling, plain + compounds + identifiers, lexicon, code_foreignness=1.0, own=own)
    assert all(code(word) < SHAPES["camel"] for word in identifiers) and code("grindlewop") == SHAPES["camel"]
    prose = _ForeignSpelling(spelling, plain + ["getattr"], lexicon, code_foreignness=1.0, own=own)
    assert prose("getattr") == SHAPES["camel"]


def test_a_common_word_of_the_language_is_spelled_as_the_language_spells():
    """A source's own trigrams find `jazz` and `mechanism` oddly spelled (Python's docs gave `mechanism` the largest
    spelling factor); a word the language uses often is no foreign string, while a rare one (`nbsp`) still is."""
    import wordfreq

    plain = [w for w in wordfreq.top_n_list("en", 400) if w.isalpha() and len(w) >= 3][:300]
    lexicon, spelling = Lexicon(plain), Spelling(plain)
    prose = _ForeignSpelling(spelling, plain, lexicon, code_foreignness=1.0)
    for word in ("jazz", "mechanism", "psychology"):
        median, mad = prose.scale.get(min(len(word), 8), prose.pooled)
        assert spelling.bits(word) > median + 4 * mad  # its spelling alone would give it 2 or more
        assert prose(word) == 1.0
    assert prose("nbsp") == SHAPES["camel"]
