"""The audit ranks garbage above content: strings foreign to a source's text, planted into a few of its
documents of unrelated topics, come out in its top 10 suspicious strings, above the words of its topics.

Three real sources (WikiText-2 lines, Tiny Shakespeare speeches, Python's docs), 300 documents each,
shuffled as a prepared folder holds them (no read order tells a topic's documents apart). The plants are
of the kinds the old ranking missed: a nonsense word in 6% of the documents (over the old 5% ceiling of
candidates); an HTML entity, a log line and a lone nonsense word on a line of their own, once per
document in 2% (ranked by how unlike the source's words they are spelled, not by repetition); a
template placeholder in 5% of the docs, whose every word is an identifier of some sort (ranked above
them because its documents have nothing else in common); a nonsense word spelled as English words are
(`quazzle`, in 2%), which only the source's word list (Lexicon) tells from the words of its topics; in 2% of the
docs, a placeholder of the docs' own words (`{{user_name}}`: its delimiters mark it), a tracking parameter
(`utm_source`: a part the docs never use), a JavaScript method (`getElementById`: a style they hardly use) and a
boilerplate line among the repeated lines (its words found nowhere else). Seeds of the plantings other than SEED:
docs/FORENSICS.md."""

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
from burnout.base.files import AUDIT_JSON
from burnout.cli import main
from burnout.config import SourceConfig
from burnout.data.corpus import iter_documents
from burnout.forensics.audit import audit_streams
from burnout.forensics.audit_settings import AuditSettings
from burnout.forensics.suspicious_strings import (
    CODE_REGISTER,
    OWN_IDENTIFIER_BONUS,
    SHAPES,
    Lexicon,
    Spelling,
    _ForeignSpelling,
    expected_runs,
)

DOCUMENTS = 300
BOILERPLATE = "Click here to subscribe to our newsletter!"  # a plant ranked among the repeated lines
SEED = 0  # of each source's planting; seeds 0 to 7 were checked (docs/FORENSICS.md)
# source: [(text, "word" (1 to 3 times at random places) or "line" (once, between lines), share, the key
# string the audit should rank)]
PLANTS = {
    "wikitext": [("florbix", "word", 0.06, "florbix"), ('<p class="footer">&nbsp;</p>', "line", 0.02, "nbsp"),
                 ("quazzle", "word", 0.02, "quazzle")],
    "shakespeare": [("E/AndroidRuntime: FATAL EXCEPTION: main", "line", 0.02, "AndroidRuntime"),
                    ("vorplex", "line", 0.02, "vorplex")],
    "docs": [("PersonX", "word", 0.05, "PersonX"), ("{{user_name}}", "word", 0.02, "user_name"),
             ("utm_source=newsletter", "word", 0.02, "utm_source"), ("getElementById", "word", 0.02, "getElementById"),
             (BOILERPLATE, "line", 0.02, BOILERPLATE)],
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
    return docs, {key: {n for n, text in enumerate(docs) if re.search(rf"(?<!\w){re.escape(key)}(?!\w)", text)}
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
    mix = folder / "recipe.yaml"
    mix.write_text(yaml.safe_dump({"data": {"sources": sources}}), encoding="utf-8")
    out = folder / "audit"
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["data", "audit", str(mix), "--chars-per-source", "0", "--out", str(out)]) == 0
    return json.loads((out / AUDIT_JSON).read_text(encoding="utf-8")), where


@pytest.mark.slow
@pytest.mark.parametrize("source,key", [(name, plant[-1]) for name, plants in PLANTS.items() for plant in plants])
def test_planted_garbage_ranks_in_its_sources_top_10(audited, source, key):
    report, where = audited
    found = next(s for s in report["sources"] if s["name"] == source)
    if key == BOILERPLATE:
        lines = [row["text"] for row in found["repeated_lines"]]
        assert key in lines[:10], f"{key} not in {source}'s top 10 lines: {lines[:10]}"
        assert found["repeated_lines"][lines.index(key)]["documents"] == len(where[source][key])
        return
    rows = found["suspicious_terms"]
    rank = next((i for i, row in enumerate(rows) if key == row["string"] or key in row["together_with"]), None)
    assert rank is not None and rank < 10, f"{key} not in {source}'s top 10: {[row['string'] for row in rows[:10]]}"
    row = rows[rank]
    assert row["documents"] == len(where[source][key])
    assert row["examples"] and all(e["document"] in where[source][key] for e in row["examples"])
    assert (row["shape"] == "markup") == (key in ("user_name", "nbsp"))  # a template's delimiters, an entity


@pytest.mark.slow  # the module's `audited` fixture takes seconds
def test_a_planted_lines_words_are_one_row(audited):
    """The log line's words come in the same documents: one row, its best word shown, the others with it."""
    report, _ = audited
    rows = next(s for s in report["sources"] if s["name"] == "shakespeare")["suspicious_terms"]
    log_line = {"AndroidRuntime", "FATAL", "EXCEPTION"}
    held = [row for row in rows if log_line & {row["string"], *row["together_with"]}]
    assert len(held) == 1 and log_line <= {held[0]["string"], *held[0]["together_with"]}


@pytest.mark.slow
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


def test_a_word_of_no_list_is_foreign_whatever_its_case():
    """`Zorblax` and `ZORBLAX` are no more words of English than `zorblax`: each gets the lift of a word of no list from
    its class's factor (issue 48: a capitalised nonsense word in 20 of 368 WikiText-2 documents was ranked nowhere, at
    the Capitalized class's 0.5). A name or an acronym of the list (`Nelson`, `NASA`) keeps its class's factor, and
    where words of no list are the source's own (its identifiers) none is lifted, whatever its case."""
    import wordfreq

    plain = [w for w in wordfreq.top_n_list("en", 400) if w.isalpha() and len(w) >= 3][:300]
    lexicon, spelling = Lexicon(plain), Spelling(plain)
    prose = _ForeignSpelling(spelling, plain, lexicon, code_foreignness=1.0)
    assert prose("zorblax") == prose.cased("Zorblax", "title") == prose.cased("ZORBLAX", "upper") == SHAPES["camel"]
    assert prose.cased("Привет", "title") == SHAPES["camel"]  # no word of the source's language in any script
    assert prose.cased("Nelson", "title") == SHAPES["title"] and prose.cased("NASA", "upper") == SHAPES["upper"]
    # Half the register's foreignness: half of the lift from each class's own factor (0.5 + 2.5 / 2, 1.5 + 1.5 / 2).
    half = _ForeignSpelling(spelling, plain, lexicon, code_foreignness=0.5)
    assert half.cased("Zorblax", "title") == pytest.approx(1.75) and half.cased("ZORBLAX", "upper") == 2.25
    identifiers = ["kwargs", "getattr", "hasattr", "setattr", "delattr", "asyncio", "bufsize", "fileobj", "funcname",
                   "tzinfo"]  # 10 of 310 words of no list: the source's own vocabulary
    code = _ForeignSpelling(spelling, plain + identifiers, lexicon, code_foreignness=1.0)
    assert code.cased("Zorblax", "title") == SHAPES["title"] and code.cased("ZORBLAX", "upper") == SHAPES["upper"]


SHARED_JARGON = ["kubectl", "kubelet", "etcd", "daemonset", "configmap", "kubeadm", "minikube", "coredns", "kustomize",
                 "istio", "statefulset", "kubeconfig"]  # words of no list, each a word of both sources


def _jargon_source(seed: int, garbage_documents: int) -> list[str]:
    """240 documents of 250 English words (each word in about 30 documents: no topic's rare words), the jargon 3 to 5
    times in each of 20 documents, and `florbix` once in each of `garbage_documents` others."""
    import wordfreq

    rng = random.Random(seed)
    vocabulary = [w for w in wordfreq.top_n_list("en", 3000) if w.isalpha() and len(w) >= 3][:1800]
    documents = [rng.choices(vocabulary, k=250) for _ in range(240)]
    for word in SHARED_JARGON:
        for i in rng.sample(range(240), 20):
            for _ in range(rng.randint(3, 5)):
                documents[i].insert(rng.randrange(len(documents[i])), word)
    for i in rng.sample(range(240), garbage_documents):
        documents[i].insert(rng.randrange(len(documents[i])), "florbix")
    return [" ".join(words) for words in documents]


def test_words_another_source_also_uses_do_not_crowd_out_garbage():
    """Two sources about one system both write its jargon (`kubectl`, `etcd`: no list holds them, and in the forum
    they are denser than the planted `florbix`): in ordinary use in the manual too, they are vocabulary, not the
    forum's artifact, and the discount for that (elsewhere 0.5) keeps them below the one string no other source has.
    Without it twelve of them would rank above it (their score before the discount, from the report, says so)."""
    forum, manual = _jargon_source(0, garbage_documents=12), _jargon_source(1, garbage_documents=0)
    report = audit_streams([("forum", "text", lambda: iter(forum)), ("manual", "text", lambda: iter(manual))])
    rows = report["sources"][0]["suspicious_terms"]
    garbage, jargon = rows[0], {row["string"]: row for row in rows if row["string"] in SHARED_JARGON}
    assert (garbage["string"], garbage["documents"], garbage["other_sources"]) == ("florbix", 12, {})
    assert garbage["factors"]["elsewhere"] == 1.0 and set(jargon) == set(SHARED_JARGON)
    for row in jargon.values():
        assert row["other_sources"] == {"manual": 20} and row["factors"]["elsewhere"] == 0.5
    undiscounted = [row["score"] / row["factors"]["elsewhere"] for row in jargon.values()]
    assert sum(score > garbage["score"] for score in undiscounted) >= 10  # the top ten, but for the discount


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


def test_an_identifier_is_the_sources_own_when_written_in_its_style_and_words():
    """In a source that writes identifiers (compounds of its own words), one written in a style it uses and in words
    it uses (`OSError`, `io.open`) keeps half its shape bonus; one with a part it never uses (`utm` of `utm_source`,
    `Person` of `PersonX`) or in a style it hardly uses (lowerCamel `getElementById` in Python's docs) is foreign."""
    import wordfreq

    plain = [w for w in wordfreq.top_n_list("en", 400) if w.isalpha() and len(w) >= 3][:300]
    compounds = ["lineno", "isinstance", "frozenset", "bytearray", "divmod", "issubclass"]  # its own compounds
    identifiers = ["OSError", "KeyError", "io.open", "os.path", "sys.argv", "file_name", "get_value", "max_size",
                   "ValueError", "TextIO"]  # CapWords, dotted, snake_case: no lowerCamel
    own = {"os", "io", "open", "error", "key", "value", "get", "file", "name", "max", "size", "source", "element",
           "by", "id", "path", "sys"}
    code = _ForeignSpelling(Spelling(plain), plain + compounds + identifiers, Lexicon(plain), code_foreignness=1.0,
                            own=own)
    assert code.compounds_are_own
    assert code.own_identifier("OSError") and code.own_identifier("io.open") and code.own_identifier("get_value")
    assert not code.own_identifier("utm_source") and not code.own_identifier("PersonX")
    assert not code.own_identifier("getElementById")  # its words are the source's; its style is not
    prose = _ForeignSpelling(Spelling(plain), plain + identifiers, Lexicon(plain), code_foreignness=1.0, own=own)
    assert not prose.own_identifier("OSError")  # a source that writes no identifiers has none of its own


@pytest.mark.slow  # the module's `audited` fixture takes seconds
def test_an_identifier_in_the_docs_own_style_and_words_gets_half_the_code_bonus(audited):
    """`AttributeError` (CapWords, the docs' words) is the docs' own; `getElementById` (lowerCamel) is not."""
    report, _ = audited
    rows = {row["string"]: row for row in next(s for s in report["sources"] if s["name"] == "docs")["suspicious_terms"]}
    foreign, own = rows["getElementById"]["factors"]["shape"], rows["AttributeError"]["factors"]["shape"]
    assert rows["AttributeError"]["shape"] == rows["getElementById"]["shape"] == "camel"
    assert own == pytest.approx(1 + (foreign - 1) * OWN_IDENTIFIER_BONUS, abs=0.002) and own < foreign - 0.5


def _filler(documents: int, vocabulary: list[str], seed: int) -> list[str]:
    rng = random.Random(seed)
    return ["\n".join(" ".join(rng.choices(vocabulary, k=12)) for _ in range(6)) for _ in range(documents)]


FILLER_WORDS = ["the", "a", "of", "in", "is", "and", "value", "list", "file", "object", "returns", "module"]


@pytest.mark.slow
def test_spread_is_reproducible_from_the_reports_own_figures():
    """spread = (runs + 1) / (expected runs + 1), the chance runs over gaps of 1 + run_gap_chars / mean document
    length: a term in four pairs of neighbouring long documents."""
    documents = _filler(120, FILLER_WORDS, 0)
    documents = [text + "\n" + text + "\n" + text for text in documents]  # about 1,500 characters each
    for first in (10, 40, 70, 100):
        for i in (first, first + 1):
            documents[i] += " zorblat"
    report = audit_streams([("long", "text", lambda: iter(documents))])
    source = report["sources"][0]
    row = next(row for row in source["suspicious_terms"] if row["string"] == "zorblat")
    n, chars = source["documents"], source["chars"]
    gap = 1 + AuditSettings().run_gap_chars * n / chars
    assert (row["documents"], row["runs"]) == (8, 4)
    expected = (row["runs"] + 1) / (expected_runs(row["documents"], n, gap) + 1)
    assert row["factors"]["spread"] == pytest.approx(expected, abs=0.002) and expected < 0.9


def test_markup_is_marked_by_its_form_in_any_register_whatever_its_documents_share():
    """In a code source (snake_case everywhere), `{{user_name}}` in three runs of pages that share rare words keeps
    the full markup shape, and neither spread nor cohesion lowers it; the same plain word (`zorblat`, in one page more
    of the first run) is lowered by both. A term in a template's delimiters in half its documents is markup."""
    documents = _filler(100, FILLER_WORDS + ["get_value", "set_item", "read_file", "to_dict"], 1)
    for first in (10, 40, 70):
        for i in (first, first + 1, first + 2):
            documents[i] += " {{user_name}} zorblat"
    documents[13] += " zorblat"
    for word, found_in in (("sampwidth", (10, 40, 95)), ("framerate", (40, 70, 5)), ("comptype", (10, 70, 60))):
        for i in found_in:
            documents[i] += f" {word}"
    for i in (20, 50, 80):
        documents[i] += " {{ order_id }}"
    for i in (25, 55, 85):
        documents[i] += " order_id"
    report = audit_streams([("code", "text", lambda: iter(documents))])
    rows = {row["string"]: row for row in report["sources"][0]["suspicious_terms"]}
    assert report["sources"][0]["code_share"] >= CODE_REGISTER
    markup, plain = rows["user_name"], rows["zorblat"]
    assert markup["shape"] == "markup" and markup["factors"]["shape"] == SHAPES["markup"]
    assert markup["factors"]["spread"] == markup["factors"]["cohesion"] == 1.0
    assert plain["factors"]["spread"] < 0.95 and plain["factors"]["cohesion"] < 0.9
    assert rows["order_id"]["shape"] == "markup"
