"""Your own text with no YAML: `burnout data prepare FILE|FOLDER|GLOB --out DIR`, `burnout train --data DIR --model
PRESET`, `--drop REGEX` proven on the decoded shards, and bad input as one line with nothing overwritten."""

from __future__ import annotations

import json
import os
import random
import re
import shutil

import pytest

from burnout.base.files import EOT_TOKEN
from burnout.cli import main
from burnout.config import load_run_config
from burnout.data.documents import iter_documents
from burnout.data.shards import read_tokens
from burnout.data.tokenizer import load_tokenizer
from burnout.models.memory import param_counts

WIKI = "wikitext2/wiki.test.raw"  # 2,891 lines, no blank lines, CRLF: one document per line


def _meta(folder):
    return json.loads((folder / "meta.json").read_text(encoding="utf-8"))


def _decoded(folder) -> str:
    """Every token of both splits decoded: what training would read."""
    tok = load_tokenizer(folder / "tokenizer.json")
    return "".join(tok.decode(read_tokens(folder, split).tolist(), skip_special_tokens=False)
                   for split in ("train", "val"))


def _one_error_line(capsys) -> str:
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("burnout: error: "), captured.err
    assert "Traceback" not in captured.err
    return lines[0]


@pytest.fixture(scope="module")
def wiki_data(shared_data, tmp_path_factory):
    """WikiText-2's raw test file prepared by path: no data mix, default tokenizer."""
    out = tmp_path_factory.mktemp("wiki") / "data"
    assert main(["data", "prepare", str(shared_data / WIKI), "--out", str(out), "--workers", "1"]) == 0
    return out


@pytest.mark.slow
def test_a_text_file_by_path_needs_no_data_mix(wiki_data, shared_data):
    meta = _meta(wiki_data)
    (source,) = meta["data_config"]["sources"]
    assert source["kind"] == "text" and source["split_by"] == "line" and source["name"] == "wiki.test"
    assert source["path"] == str(shared_data / WIKI)
    # The default tokenizer: byte-level BPE sized to a 1.3M-character corpus.
    assert meta["tokenizer_kind"] == "bpe" and meta["vocab_size"] == 8192
    assert load_tokenizer(wiki_data / "tokenizer.json").get_vocab_size() == 8192
    # Every line is a document, all of them prepared (the whole file is the budget), cleaned lenient (no CR).
    assert meta["sources"]["total"]["documents"] == 2891
    assert meta["sources"]["per_source"]["wiki.test"]["shortfall_tokens"] == 0
    assert meta["cleaning"]["mode"] == "lenient" and meta["data_config"]["val_fraction"] == 0.05
    text = _decoded(wiki_data)
    assert "Robert Boulter is an English film , television and theatre actor" in text and "\r" not in text


def _write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")


def write_stories(path, count: int, separator_line: str = EOT_TOKEN) -> list[str]:
    """`count` short stories of three paragraphs each, a line holding only `separator_line` between them: a
    newcomer's first text file, a few KB."""
    rng = random.Random(count)
    words = "the fox and a dog ran over old red hills to sleep by the river in warm hay all day".split()
    stories = ["\n\n".join(f"Story {i}, part {part}: " + " ".join(rng.choice(words) for _ in range(30)) + "."
                            for part in range(3)) for i in range(count)]
    path.write_text(f"\n{separator_line}\n".join(stories) + "\n", encoding="utf-8")
    return stories


def decoded_documents(folder, split: str) -> list[str]:
    """Each document of a prepared split (a part of one, for a document cut between the splits), decoded."""
    tok = load_tokenizer(folder / "tokenizer.json")
    return [tok.decode(ids.tolist(), skip_special_tokens=False) for _, ids in iter_documents(folder, split)]


def test_stories_between_endoftext_lines_are_documents_and_too_few_tokens_are_said_at_prepare_and_at_train(
        tmp_path, capsys):
    write_stories(tmp_path / "stories.txt", 5)
    data = tmp_path / "data"
    assert main(["data", "prepare", str(tmp_path / "stories.txt"), "--out", str(data), "--workers", "1"]) == 0
    meta = _meta(data)
    (source,) = meta["data_config"]["sources"]
    assert (source["split_by"], source["separator"]) == ("separator", EOT_TOKEN)
    # Each document is (a part of) one story, and every story is in them (a val part may end a story's last
    # paragraph, which names no story).
    documents = decoded_documents(data, "train") + decoded_documents(data, "val")
    told = [set(re.findall(r"Story (\d+)", doc)) for doc in documents]
    assert all(len(stories) <= 1 for stories in told) and set().union(*told) == {str(i) for i in range(5)}
    assert EOT_TOKEN not in "".join(documents)
    train = meta["splits"]["train"]["tokens"]
    assert f"warning: {train:,} train tokens, far too few to learn from for any model preset" in capsys.readouterr().err

    run = tmp_path / "run"
    assert main(["train", "--data", str(data), "--model", "shakespeare-char", "--out", str(run), "train.max_steps=1",
                 "train.batch_size=2", "train.seq_len=8", "train.eval_batches=1", "train.device=cpu",
                 "train.precision=fp32", "train.sample_tokens=0"]) == 0
    params = param_counts(load_run_config(run / "config.yaml").model).total
    assert (f"warning: {train:,} train tokens for {params:,} parameters: {train / params:.2g} tokens per parameter, "
            "far too few to learn from") in capsys.readouterr().out


def test_a_separator_of_your_own_ends_a_document_at_each_occurrence(tmp_path, capsys):
    text = tmp_path / "chapters.txt"
    stories = write_stories(text, 4, separator_line="* * *")
    # One occurrence inside a line, with text on both sides; two in a row, with nothing but a line break between.
    written = text.read_text(encoding="utf-8")
    text.write_text(written.replace("\n* * *\nStory 3", " * * * Story 3").replace("* * *", "* * *\n* * *", 1),
                    encoding="utf-8")
    out = tmp_path / "data"
    assert main(["data", "prepare", str(text), "--out", str(out), "--separator", "* * *", "--workers", "1",
                 "data.max_tokens=1000000"]) == 0  # a budget far above the text: every story whole, to one split
    (source,) = _meta(out)["data_config"]["sources"]
    assert (source["split_by"], source["separator"]) == ("separator", "* * *")
    assert sorted(decoded_documents(out, "train") + decoded_documents(out, "val")) == sorted(stories)
    capsys.readouterr()


def test_a_jsonl_glob_and_a_folder_of_text(tmp_path, capsys):
    shards = tmp_path / "web"
    shards.mkdir()
    for part in range(3):
        _write_jsonl(shards / f"part{part}.jsonl",
                     [{"id": i, "body": f"record {part}-{i} says the quick brown fox jumps over the lazy dog"}
                      for i in range(40)])
    (shards / "notes.md").write_text("not matched by the glob", encoding="utf-8")
    out = tmp_path / "web-data"
    assert main(["data", "prepare", str(shards / "*.jsonl"), "--out", str(out), "--text-field", "body",
                 "--tokenizer", "bpe:300", "--workers", "1"]) == 0
    meta = _meta(out)
    (source,) = meta["data_config"]["sources"]
    assert (source["kind"], source["text_field"], source["name"]) == ("jsonl", "body", "web")
    assert meta["sources"]["total"]["documents"] == 120 and meta["vocab_size"] == 300
    assert "record 2-39 says the quick brown fox" in _decoded(out)

    books = tmp_path / "books"
    (books / "shelf").mkdir(parents=True)
    for i in range(4):
        paragraphs = [f"Book {i}, chapter {c}: it was a dark and stormy night.\nThe rain fell." for c in range(5)]
        (books / "shelf" / f"book{i}.txt").write_text("\n\n".join(paragraphs) + "\n", encoding="utf-8")
    out = tmp_path / "book-data"
    assert main(["data", "prepare", str(books), "--out", str(out), "--tokenizer", "char", "--workers", "1"]) == 0
    meta = _meta(out)
    (source,) = meta["data_config"]["sources"]
    assert (source["kind"], source["split_by"], source["name"]) == ("text", "paragraph", "books")
    assert meta["sources"]["total"]["documents"] == 20  # blank lines separate them: one per paragraph
    assert meta["tokenizer_kind"] == "char"
    assert "Book 3, chapter 4: it was a dark and stormy night.\nThe rain fell." in _decoded(out)
    capsys.readouterr()


def test_char_and_gpt2_tokenizers(shared_data, tmp_path):
    speeches = tmp_path / "speeches.txt"
    speeches.write_text((shared_data / "tinyshakespeare" / "input.txt").read_text(encoding="utf-8")[:3000],
                        encoding="utf-8")
    char_out, gpt2_out = tmp_path / "char", tmp_path / "gpt2"
    assert main(["data", "prepare", str(speeches), "--out", str(char_out), "--tokenizer", "char",
                 "--workers", "1"]) == 0
    meta = _meta(char_out)
    assert meta["tokenizer_kind"] == "char" and meta["tokenizer_config"]["kind"] == "char"
    # One token per distinct character of the text (newlines inside speeches included), plus <|endoftext|>.
    assert meta["vocab_size"] == len(set(speeches.read_text(encoding="utf-8"))) + 1
    assert "First Citizen:\nBefore we proceed any further, hear me speak." in _decoded(char_out)

    text = tmp_path / "story.txt"
    text.write_text((shared_data / "tinystories" / "tinystories_sample.txt").read_text(encoding="utf-8"),
                    encoding="utf-8")
    assert main(["data", "prepare", str(text), "--out", str(gpt2_out), "--tokenizer", "gpt2", "--workers", "1"]) == 0
    meta = _meta(gpt2_out)
    assert meta["tokenizer_config"]["kind"] == "gpt2" and meta["vocab_size"] == 50257 and meta["eot_id"] == 50256
    assert meta["tokenizer_config"]["vocab_path"] == str((shared_data / "gpt2_tokenizer" / "vocab.json").resolve())
    assert load_tokenizer(gpt2_out / "tokenizer.json").encode("Hello world").ids == [15496, 995]
    assert "Once upon a time there was a little boy named Ben." in _decoded(gpt2_out)


def test_train_a_preset_on_a_data_folder_without_a_config(wiki_data, tmp_path, capsys):
    run = tmp_path / "run"
    tiny = ["train.max_steps=3", "train.batch_size=2", "train.seq_len=16", "train.device=cpu", "train.precision=fp32",
            "train.eval_batches=1", "train.sample_tokens=4", "model.n_layer=1"]
    assert main(["train", "--data", str(wiki_data), "--model", "llama-tiny", "--out", str(run), *tiny]) == 0
    assert "done: step 3" in capsys.readouterr().out
    assert (run / "checkpoints" / "step_0000003" / "model.safetensors").is_file()
    import yaml

    saved = yaml.safe_load((run / "config.yaml").read_text(encoding="utf-8"))
    assert saved["model"]["vocab_size"] == 8192 and saved["model"]["d_model"] == 256  # llama-tiny, data's vocab
    assert saved["model"]["n_layer"] == 1  # the override
    optim = saved["train"]["optim"]
    assert (optim["lr"], optim["optimizer"]) == (1.0e-2, "muon")  # the quickstart's train section
    assert saved["data"]["prepared_dir"] == str(wiki_data.resolve())

    refused = tmp_path / "refused"
    assert main(["train", "--data", str(wiki_data), "--model", "llama-tiny", "--out", str(refused), *tiny,
                 "model.vocab_size=4096"]) == 2
    line = _one_error_line(capsys)
    assert "model.vocab_size" in line and "8,192" in line
    assert not refused.exists()


def _plant(folder, name, docs, planted):
    """A text file of blank-line separated documents; `planted` of them carry junk."""
    body = [f"{name} document {i}: an ordinary paragraph about gardens and rivers." for i in range(docs)]
    for i, junk in planted.items():
        body[i] += f" {junk}"
    (folder / f"{name}.txt").write_text("\n\n".join(body) + "\n", encoding="utf-8")


def test_drop_removes_planted_documents_counted_per_pattern_and_source(tmp_path, capsys):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    _plant(corpus, "news", 60, {i: "BUY CHEAP PILLS" for i in range(0, 60, 10)})  # 6
    _plant(corpus, "forum", 50, {**{i: "buy cheap pills!!" for i in (3, 4, 5, 6)},  # 4
                                 **{i: "Lorem ipsum dolor" for i in (20, 30, 40)}})  # 3
    mix = tmp_path / "mix.yaml"
    mix.write_text(
        "data:\n  sources:\n"
        f"    - {{name: news, kind: text, split_by: paragraph, path: {corpus / 'news.txt'}}}\n"
        f"    - {{name: forum, kind: text, split_by: paragraph, path: {corpus / 'forum.txt'}}}\n"
        "  max_tokens: 1000000\n  max_chars: 1000000\n"
        "tokenizer: {kind: char}\n", encoding="utf-8")
    out = tmp_path / "data"
    drops = ["(?i)buy cheap pills", "(?i)lorem ipsum"]
    assert main(["data", "prepare", str(mix), "--out", str(out), "--workers", "1",
                 *[arg for pattern in drops for arg in ("--drop", pattern)]]) == 0
    assert "dropped 13 documents" in capsys.readouterr().out
    junk = _meta(out)["cleaning"]["junk"]
    assert junk["dropped_documents"] == 13
    assert {p: e["documents"] for p, e in junk["patterns"].items()} == {drops[0]: 10, drops[1]: 3}
    assert junk["by_source"] == {"news": {"dropped_documents": 6, "patterns": {drops[0]: 6, drops[1]: 0}},
                                 "forum": {"dropped_documents": 7, "patterns": {drops[0]: 4, drops[1]: 3}}}
    assert _meta(out)["cleaning"]["per_source"]["forum"]["documents_out"] == 43
    text = _decoded(out)
    assert "forum document 49" in text and "news document 59" in text
    assert not any(re.search(pattern, text) for pattern in drops)

    assert main(["data", "inspect", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "junk '(?i)buy cheap pills': 10 documents dropped (news 6, forum 4)" in printed
    assert "source forum: 50 documents in, 43 kept; dropped: junk 7" in printed

    # The same on your own text: one source, named after the file.
    mine = tmp_path / "mine"
    assert main(["data", "prepare", str(corpus / "forum.txt"), "--out", str(mine), "--tokenizer", "char",
                 "--drop", drops[1], "--workers", "1"]) == 0
    junk = _meta(mine)["cleaning"]["junk"]
    assert junk["by_source"] == {"forum": {"dropped_documents": 3, "patterns": {drops[1]: 3}}}
    assert "buy cheap pills" in _decoded(mine) and not re.search(drops[1], _decoded(mine))


def test_a_broken_yaml_mix_still_says_yaml(tmp_path, capsys):
    broken = "data:\n  sources: [\n    {name: a, kind: text\n"
    for name in ("recipe.yaml", "recipe"):  # by extension, and by content (a file opening with `data:`)
        path = tmp_path / name
        path.write_text(broken, encoding="utf-8")
        assert main(["data", "prepare", str(path), "--out", str(tmp_path / "out")]) == 2
        assert "is not valid YAML" in _one_error_line(capsys)
    assert not (tmp_path / "out").exists()


def _bad_inputs(root) -> dict[str, tuple[list[str], str]]:
    """case -> (arguments before --out, a fragment of its one error line)."""
    (root / "empty.txt").write_bytes(b"")
    (root / "binary.txt").write_bytes(b"text\x00\x01\x02")
    (root / "latin1.txt").write_bytes("caf\xe9 au lait\n".encode("latin-1"))
    (root / "ok.txt").write_text("first paragraph\n\nsecond paragraph\n", encoding="utf-8")
    mixed = root / "mixed"
    mixed.mkdir()
    (mixed / "a.txt").write_text("text", encoding="utf-8")
    _write_jsonl(mixed / "b.jsonl", [{"text": "json"}])
    cases = {
        "empty file": ([str(root / "empty.txt")], "is empty"),
        "unreadable (binary) file": ([str(root / "binary.txt")], "looks binary"),
        "unreadable (not UTF-8) file": ([str(root / "latin1.txt")], "is not UTF-8"),
        "glob matching nothing": ([str(root / "nothing" / "*.jsonl")], "matches no files"),
        "missing file": ([str(root / "missing.txt")], "does not exist"),
        "unknown tokenizer": ([str(root / "ok.txt"), "--tokenizer", "wordpiece:100"], "is not a tokenizer"),
        "bpe too small": ([str(root / "ok.txt"), "--tokenizer", "bpe:10"], "at least 257"),
        "gpt2 files missing": ([str(root / "ok.txt"), "--tokenizer", f"gpt2:{root}"], "has no vocab.json"),
        "bad regex": ([str(root / "ok.txt"), "--drop", "(unclosed"], "--drop '(unclosed' is not a valid regular"),
        "folder of two kinds": ([str(mixed)], "several kinds"),
        "text field on text": ([str(root / "ok.txt"), "--text-field", "body"], "--text-field applies"),
        "separator on jsonl": ([str(mixed / "b.jsonl"), "--separator", "* * *"], "--separator applies to text files"),
        "separator and split-by": ([str(root / "ok.txt"), "--separator", "* * *", "--split-by", "line"],
                                   "--split-by line and --separator each say where documents end; give one"),
        "blank separator": ([str(root / "ok.txt"), "--separator", "  "], "must hold something other than spaces"),
    }
    if os.geteuid() != 0:  # root reads a file whatever its mode
        locked = root / "locked.txt"
        locked.write_text("secret", encoding="utf-8")
        locked.chmod(0)
        cases["unreadable (permissions) file"] = ([str(locked)], "cannot read")
    return cases


def test_bad_input_is_one_line_exit_2_and_overwrites_nothing(wiki_data, tmp_path, capsys):
    existing = tmp_path / "existing"
    shutil.copytree(wiki_data, existing)
    before = {p.name: p.read_bytes() for p in existing.iterdir()}
    for case, (args, fragment) in _bad_inputs(tmp_path).items():
        assert main(["data", "prepare", *args, "--out", str(existing), "--overwrite", "--workers", "1"]) == 2, case
        line = _one_error_line(capsys)
        assert fragment in line, (case, line)
        assert {p.name: p.read_bytes() for p in existing.iterdir()} == before, case
