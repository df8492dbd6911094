"""A run's own sample prompts: words drawn from the val split of a real prepared folder, and the record every command
reads them from."""

import json
import shutil

import pytest

from burnout.base.files import SAMPLE_PROMPTS_FILE
from burnout.config import DataConfig, SourceConfig, TokenizerConfig
from burnout.data.documents import iter_documents
from burnout.data.prepare import prepare_data
from burnout.data.tokenizer import load_tokenizer, unencodable
from burnout.errors import BurnoutError
from burnout.generate.prompts import (
    PLACES_TRIED,
    PROMPT_WORDS,
    RUN_PROMPTS,
    data_prompts,
    sample_prompts,
    suggested_prompt,
    write_sample_prompts,
)


def _prepared(shared_data, tmp_path_factory, name: str, path: str, split_by: str, tokenizer: TokenizerConfig):
    out = tmp_path_factory.mktemp(name)
    source = SourceConfig(name=name, kind="text", path=str(shared_data / path), split_by=split_by)
    prepare_data(DataConfig(sources=[source]), tokenizer, out)
    return out


@pytest.fixture(scope="module")
def wiki(shared_data, tmp_path_factory):
    """WikiText-2's raw test split, one document per line (its " = Heading = " lines among them): no document is
    cut between train and val."""
    return _prepared(shared_data, tmp_path_factory, "wiki", "wikitext2/wiki.test.raw", "line",
                     TokenizerConfig(kind="bpe", vocab_size=1024))


@pytest.fixture(scope="module")
def shakespeare(shared_data, tmp_path_factory):
    """Tiny Shakespeare as one document with a char tokenizer: its val part, cut from it, starts mid-line."""
    return _prepared(shared_data, tmp_path_factory, "shakespeare", "tinyshakespeare/input.txt", "file",
                     TokenizerConfig(kind="char"))


def _line_openings(data_dir, split: str, skip_first_line: bool = False) -> set[str]:
    """The reference, read document by document: the first PROMPT_WORDS words of each line of `split` that goes on
    past them (without each document's first line, which a cut may have started mid-line)."""
    tok = load_tokenizer(data_dir / "tokenizer.json")
    return {" ".join(line.split()[:PROMPT_WORDS]) for _, ids in iter_documents(data_dir, split)
            for line in tok.decode(ids.tolist()).splitlines()[1 if skip_first_line else 0:]
            if len(line.split()) > PROMPT_WORDS}


def test_prompts_open_lines_of_val_documents_that_go_on_past_them(wiki):
    tok = load_tokenizer(wiki / "tokenizer.json")
    prompts = data_prompts(wiki, 1337, tok, 256)
    assert len(prompts) == RUN_PROMPTS == len(set(prompts))
    openings = _line_openings(wiki, "val")
    assert set(prompts) <= openings  # within one document: none runs into the next
    # So are those of every place looked at, under ten seeds: some places are in headings of a few words
    # (" = = Background = = "), which a window read past their document's end would run into the next one.
    for seed in range(10):
        every = data_prompts(wiki, seed, tok, 256, count=PLACES_TRIED)
        assert len(every) > 2 * RUN_PROMPTS and set(every) <= openings
    assert all(len(p.split()) == PROMPT_WORDS and not unencodable(tok, p) for p in prompts)
    # Seeded: the same seed the same prompts, another seed others.
    assert data_prompts(wiki, 1337, tok, 256) == prompts
    assert data_prompts(wiki, 7, tok, 256) != prompts
    # Only prompts that leave room in the context: each one under the limit in tokens.
    limit = sorted(len(tok.encode(p).ids) for p in prompts)[1]
    assert all(len(tok.encode(p).ids) < limit for p in data_prompts(wiki, 1337, tok, limit))


def test_a_cut_documents_prompts_start_at_a_line_not_mid_line(shakespeare):
    tok = load_tokenizer(shakespeare / "tokenizer.json")
    prompts = data_prompts(shakespeare, 1337, tok, 64)
    assert len(prompts) == RUN_PROMPTS == len(set(prompts))
    assert set(prompts) <= _line_openings(shakespeare, "val", skip_first_line=True)


def test_the_record_is_what_every_reader_gets(sampled_runs, tmp_path):
    """A run folder and its checkpoints read RUN/sample_prompts.json; a run without one (older) its config's
    train.sample_prompt; a damaged one is one line; a folder with neither has none ("The " suggested)."""
    run = tmp_path / "run"
    shutil.copytree(sampled_runs[0], run)  # trained with train.sample_prompt "The "
    checkpoint = sorted((run / "checkpoints").iterdir())[-1]
    assert json.loads((run / SAMPLE_PROMPTS_FILE).read_text()) == {"prompts": ["The "], "from": "train.sample_prompt"}
    write_sample_prompts(run, ["one two three", "four five"], "the val split's documents")
    assert sample_prompts(run) == sample_prompts(checkpoint) == ["one two three", "four five"]
    assert suggested_prompt(checkpoint) == "one two three"
    (run / SAMPLE_PROMPTS_FILE).unlink()
    assert sample_prompts(run) == sample_prompts(checkpoint) == ["The "]
    (run / SAMPLE_PROMPTS_FILE).write_text(json.dumps({"prompts": "not a list", "from": "x"}))
    with pytest.raises(BurnoutError, match=f"{SAMPLE_PROMPTS_FILE} does not hold a run's sample prompts"):
        sample_prompts(checkpoint)
    assert sample_prompts(tmp_path / "nothing") == [] and suggested_prompt(tmp_path / "nothing") == "The "
