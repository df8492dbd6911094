"""The val split is a fair sample of the text by tokens, whatever its documents' lengths (burnout/data/split.py).

Proved three ways: ValSplit's counts against a hand computation; a prepared corpus of documents of very different
lengths, where short and long documents hold the parts of val they hold of the text; and WikiText-2's raw test
text, one document per line, where the heading lines (2.3% of the text) made 32% of val under the previous rule.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from burnout.cli import main
from burnout.data.documents import iter_documents
from burnout.data.shards import read_meta
from burnout.data.split import FAR_LENGTH_MIX, ValSplit, length_class, split_warnings
from burnout.data.tokenizer import load_tokenizer


def test_length_classes_are_powers_of_two():
    assert [length_class(n) for n in (1, 2, 3, 4, 7, 8, 127, 128, 129)] == [1, 2, 2, 4, 4, 8, 64, 128, 128]


def test_each_length_class_sends_its_fraction_of_documents_within_one_whatever_the_lengths():
    """1,000 documents of 5 tokens and 1,000 of 500, shuffled, under a budget far above them: each class sends
    100 of its documents to val, give or take the phase's one (and the source's first, sent early)."""
    lengths = [5] * 1000 + [500] * 1000
    random.Random(0).shuffle(lengths)
    split = ValSplit(0.1, 1337, ["s"], {"s": 10**9})
    sent = {5: 0, 500: 0}
    taken = taken_val = 0
    for length in lengths:
        tokens = split.val_tokens(0, length, first_due=taken_val == 0 and taken > 0)
        assert tokens in (0, length)  # whole documents: none is larger than val's share
        sent[length] += tokens == length
        taken += length
        taken_val += tokens
    assert 99 <= sent[5] <= 101 and 99 <= sent[500] <= 101
    # By tokens: short documents hold their part of val (5,000 of 505,000 tokens: ~1%), not more.
    assert sent[5] * 5 / (sent[5] * 5 + sent[500] * 500) == pytest.approx(5 / 505, rel=0.03)


def test_every_document_goes_to_val_with_the_fraction_as_its_chance():
    """Over 400 seeds, each position of a stream of mixed lengths goes to val about val_fraction of the time:
    the phase is uniform, so no position and no length is favoured."""
    lengths = [3, 900, 40, 7, 300, 12, 2000, 5] * 5
    hits = np.zeros(len(lengths))
    for seed in range(400):
        split = ValSplit(0.25, seed, ["s"], {"s": 10**9})
        hits += [split.val_tokens(0, n, first_due=False) == n for n in lengths]
    assert hits.mean() / 400 == pytest.approx(0.25, abs=0.01)
    by_length = {n: hits[[i for i, m in enumerate(lengths) if m == n]].mean() / 400 for n in set(lengths)}
    assert all(abs(p - 0.25) < 0.08 for p in by_length.values()), by_length


def test_a_document_larger_than_its_sources_val_share_is_cut_at_the_fraction():
    split = ValSplit(0.1, 0, ["s"], {"s": 5_000})
    assert split.val_tokens(0, 1_999, first_due=False) == 200  # round(0.1 * (1,999 + the cut's <|endoftext|>))
    assert split.val_tokens(0, 500, first_due=False) in (0, 500)  # exactly val's share: whole


def test_a_sources_second_document_goes_to_val_when_none_has_and_its_class_pays_it_back():
    split = ValSplit(0.1, 0, ["s"], {"s": 10**9})
    phase = split._phase(0, length_class(30))
    assert split.val_tokens(0, 30, first_due=True) == 30
    assert split.counts[(0, length_class(30))] == pytest.approx(phase + 0.1 - 1)


def _wordy(rng: random.Random, words: int) -> str:
    vocab = "river stone light green over under quiet winter field harbour market engine".split()
    return " ".join(rng.choice(vocab) for _ in range(words))


@pytest.fixture(scope="module")
def headings_and_articles(tmp_path_factory):
    """One document per line: 1,500 headings of 3 words and 500 articles of 150 words, shuffled, prepared as a
    newcomer prepares a file (no data mix, the default 5% to val)."""
    rng = random.Random(7)
    lines = [f"= {_wordy(rng, 3)} =" for _ in range(1500)] + [_wordy(rng, 150) + " ." for _ in range(500)]
    rng.shuffle(lines)
    folder = tmp_path_factory.mktemp("lengths")
    (folder / "lines.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert main(["data", "prepare", str(folder / "lines.txt"), "--out", str(folder / "data"), "--split-by", "line",
                 "--workers", "1", "--tokenizer", "bpe:512"]) == 0
    return folder / "data"


def _heading_share(folder, split: str) -> tuple[float, float]:
    """(share of the split's tokens in heading documents, mean tokens per document) of a prepared split."""
    tok = load_tokenizer(folder / "tokenizer.json")
    tokens = headings = documents = 0
    for _, ids in iter_documents(folder, split):
        documents += 1
        tokens += len(ids)
        headings += len(ids) if tok.decode(ids.tolist()).lstrip().startswith("=") else 0
    return headings / tokens, tokens / documents


def test_short_and_long_documents_hold_the_parts_of_val_they_hold_of_the_text(headings_and_articles):
    train_share, train_mean = _heading_share(headings_and_articles, "train")
    val_share, val_mean = _heading_share(headings_and_articles, "val")
    assert val_share == pytest.approx(train_share, abs=0.01)  # ~2.5% each; whole documents sent where val lacks
    assert val_mean == pytest.approx(train_mean, rel=0.1)     # half of one gave val ~70% headings
    meta = read_meta(headings_and_articles)
    assert meta["splits"]["val"]["tokens"] / meta["sources"]["total"]["tokens"] == pytest.approx(0.05, rel=0.05)
    assert split_warnings(meta) == []


def test_the_length_mix_is_recorded_and_sums_to_each_splits_tokens(headings_and_articles):
    meta = read_meta(headings_and_articles)
    (entry,) = meta["sources"]["per_source"].values()
    for split in ("train", "val"):
        assert sum(entry["lengths"][split].values()) == entry[f"{split}_tokens"]
        assert all(int(group) == length_class(int(group)) for group in entry["lengths"][split])


def _meta(lengths: dict, fraction: float = 0.1) -> dict:
    train = sum(lengths["train"].values())
    val = sum(lengths["val"].values())
    return {"split_rule": 3, "data_config": {"val_fraction": fraction, "split": "documents"},
            "splits": {"train": {"tokens": train}, "val": {"tokens": val}},
            "sources": {"per_source": {"web": {"lengths": lengths}}}}


def test_a_val_whose_lengths_are_far_from_trains_is_said_with_the_class_furthest_off():
    """Train: 70% of tokens in documents of 512-1023 tokens, 20% in 64-127, 10% in 8-15; val: 10%, 30%, 60% (total
    variation 0.6, the largest gap in 512-1023)."""
    meta = _meta({"train": {"512": 700, "64": 200, "8": 100}, "val": {"512": 10, "64": 30, "8": 60}})
    (line,) = split_warnings(meta)
    assert line.startswith("warning: the val split's documents are not a fair sample of the text's lengths: ")
    assert "documents of 512-1,023 tokens of 'web' hold 10% of val's tokens against 70% of train's" in line
    # Within FAR_LENGTH_MIX (0.25) it is fair enough: nothing said.
    near = _meta({"train": {"512": 800, "8": 200}, "val": {"512": 60, "8": 40}})
    assert 0.2 < FAR_LENGTH_MIX and split_warnings(near) == []


def test_a_folder_of_the_previous_rule_is_said_to_lean_towards_short_documents():
    meta = {**_meta({"train": {"8": 90}, "val": {"8": 10}}), "split_rule": 2}
    (line,) = split_warnings(meta)
    assert "older rule of burnout's, which sent short documents to val far more often" in line
    assert split_warnings({**meta, "data_config": {"val_fraction": 0.1, "split": "contiguous"}}) == []


@pytest.mark.slow
def test_wikitext_headings_hold_their_share_of_val(shared_data, tmp_path):
    """WikiText-2's raw test text prepared as the README prepares a file: every line a document. Its heading lines
    (' = Title = ') are 2.3% of the text; the previous rule gave them 32% of val's tokens."""
    out = tmp_path / "data"
    assert main(["data", "prepare", str(shared_data / "wikitext2/wiki.test.raw"), "--out", str(out),
                 "--workers", "1"]) == 0
    train_share, train_mean = _heading_share(out, "train")
    val_share, val_mean = _heading_share(out, "val")
    assert train_share == pytest.approx(0.023, abs=0.003)
    assert val_share == pytest.approx(train_share, abs=0.01)
    assert val_mean == pytest.approx(train_mean, rel=0.15)


def test_every_document_is_prepared_whole_when_cuts_add_their_endoftext(tmp_path):
    """Five stories, each larger than val's share, all cut: the budget holds the <|endoftext|> each cut adds, so
    every story is in the shards whole (its train part, then its val part), none lost at the budget's end."""
    from .test_own_text import decoded_documents, write_stories

    stories = write_stories(tmp_path / "stories.txt", 5)
    out = tmp_path / "data"
    assert main(["data", "prepare", str(tmp_path / "stories.txt"), "--out", str(out), "--workers", "1",
                 "data.val_fraction=0.1"]) == 0
    train, val = decoded_documents(out, "train"), decoded_documents(out, "val")
    assert len(train) == len(val) == 5
    eot = "<|endoftext|>"
    assert sorted(t.removesuffix(eot) + v.removesuffix(eot) for t, v in zip(train, val)) == sorted(stories)
