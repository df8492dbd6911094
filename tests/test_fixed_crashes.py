"""Inputs that reached the catch-all `burnout: internal error` line (issue 48) and should now WORK, through the real
`burnout` command: a chat session that goes on after a line that is not UTF-8, a corpus whose rare characters the
char tokenizer lacks, `compare` on the README's shakespeare-fast run, a run folder with a damaged info.json; and
refusals that come after work has begun and shown its progress bar. Those refused before any work are cases of
tests/test_bad_inputs.py's catalogue (its last block), whose runner these use.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("bad_inputs_catalogue", Path(__file__).with_name("test_bad_inputs.py"))
catalogue = sys.modules[_spec.name] = importlib.util.module_from_spec(_spec)  # its runner and run-folder helpers
_spec.loader.exec_module(catalogue)


def _run(tmp_path: Path, jobs: dict[str, list[str]], cwd: Path | None = None) -> dict[str, tuple[int, str, str]]:
    """`burnout ARGV` for each named job (two at a time, as the catalogue runs them): (exit code, stdout, stderr)."""
    return catalogue.run_cli_cases([{"name": name, "argv": argv, "cwd": str(cwd or tmp_path)}
                                    for name, argv in jobs.items()], tmp_path / ".logs")


def _no_internal_error(code: int, out: str, err: str) -> None:
    assert "internal error" not in err and "Traceback" not in err + out, err[-3000:]
    assert code == 0, err[-3000:]


# ------------------------------------------------------------------------------------------------
# The README's shakespeare-fast run: a sample prompt it cannot encode is refused before the first step, the data
# prepared are kept for the next start, and `compare` with its built-in prompts leaves out the one with parentheses.


@pytest.mark.slow
def test_shakespeare_fast_refuses_a_bad_sample_prompt_at_once_then_trains_and_compares(shared_data, tmp_path):
    run = tmp_path / "fast"
    short = ["train.max_steps=2", "train.eval_batches=2", "train.sample_tokens=8"]
    refused = _run(tmp_path, {"refused": ["train", "shakespeare-fast", "--out", str(run), *short,
                                          'train.sample_prompt="def f(x):"']}, cwd=REPO_ROOT)["refused"]
    code, out, err = refused
    assert code == 2 and err.splitlines()[-1].startswith("burnout: error: train.sample_prompt holds '(' (U+0028)")
    assert "step 1" not in out and not (run / "checkpoints").exists()  # refused before the first step
    prepared = (run / "data" / "meta.json").stat().st_mtime_ns
    trained = _run(tmp_path, {"trained": ["train", "shakespeare-fast", "--out", str(run), *short,
                                          'train.sample_prompt="ROMEO:"']}, cwd=REPO_ROOT)["trained"]
    _no_internal_error(*trained)
    assert (run / "data" / "meta.json").stat().st_mtime_ns == prepared  # the data were kept, not prepared again
    assert "sample: \"ROMEO:" in trained[1]
    # Without its record and its config's train.sample_prompt: a run with no sample prompts, compared on built-ins.
    (run / "sample_prompts.json").unlink()
    (run / "config.yaml").write_text((run / "config.yaml").read_text().replace("sample_prompt: 'ROMEO:'",
                                                                               "sample_prompt: ''"))
    code, out, err = _run(tmp_path, {"compare": ["compare", str(run), "--max-new-tokens", "4"]})["compare"]
    _no_internal_error(code, out, err)
    assert "left out the built-in prompt 'def fibonacci(n):': the tokenizer has no token for '(' (U+0028), ')' " \
           "(U+0029)" in out
    assert json.loads((run / "compare.json").read_text())["prompts"] == ["What is the capital of France?",
                                                                         "The meaning of life is"]


@pytest.mark.slow
def test_compare_refuses_when_no_built_in_prompt_fits_and_names_the_option(tmp_path):
    catalogue._untrained(tmp_path / "char", catalogue._char_tokenizer())  # To be, or not to be: no capitals but T
    code, out, err = _run(tmp_path, {"compare": ["compare", str(tmp_path / "char")]})["compare"]
    assert code == 2 and "Traceback" not in err
    assert err.splitlines()[-1] == ("burnout: error: none of the built-in prompts can be encoded by this tokenizer (it "
                                    "lacks characters of each: a char model knows only those of its text); give "
                                    "prompts of its text with --prompts FILE")
    assert not (tmp_path / "char" / "compare.md").exists()


# ------------------------------------------------------------------------------------------------
# `burnout chat`: a line that is not UTF-8 is said to be unreadable, and the session goes on.


def _chat(run: Path, typed: bytes) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.run([sys.executable, "-m", "burnout", "chat", str(run), "--max-new-tokens", "3"], input=typed,
                          capture_output=True, timeout=300, env=env)


@pytest.mark.slow
@pytest.mark.parametrize("model", ["base", "chat"])
def test_a_chat_session_goes_on_after_a_line_that_is_not_utf8(model, sampled_runs, chat_checkpoint):
    run = sampled_runs[0] if model == "base" else chat_checkpoint.run_dir
    done = _chat(run, b"The first\n\xff\xfe line\nThe last\n/quit\n")
    out, err = done.stdout.decode(), done.stderr.decode()
    assert done.returncode == 0 and "internal error" not in err and "Traceback" not in err, err
    assert out.count("error: the line could not be read: byte 0xff is not UTF-8 text; type it again") == 1, out
    answered = out.count("bot> ") if model == "chat" else out.count("The first") + out.count("The last")
    assert answered == 2, out  # the lines before and after it were both answered


def _typed(lines: list[str]):
    """A `read` for a chat loop that gives `lines`, then the end of input."""
    def read(prompt: str) -> str:
        if not lines:
            raise EOFError
        return lines.pop(0)
    return read


def test_a_line_of_surrogate_escaped_bytes_is_refused_and_the_session_goes_on(sampled_runs, chat_checkpoint):
    """Under a C or POSIX locale Python reads a terminal's byte 0xff as U+DCFF (surrogateescape): the line is named
    unreadable by the same one line as any text the tokenizer cannot encode, and the next line is answered."""
    import io

    from burnout.core.model_files import load_model
    from burnout.generate.chat import chat, chat_loop

    settings = {"max_new_tokens": 2, "temperature": 0.0}
    for run, loop in ((sampled_runs[0], chat), (chat_checkpoint.run_dir, chat_loop)):
        model, tokenizer, _ = load_model(run)
        out = io.StringIO()
        loop(model, tokenizer, settings, read=_typed(["The \udcff", "The end"]), out=out)
        shown = out.getvalue()
        assert "error: " in shown and "holds '\\udcff' (byte 0xff, not UTF-8), which the tokenizer cannot encode" \
            in shown, shown
        assert shown.count("error: ") == 1 and ("bot> " in shown if loop is chat_loop else "The end" in shown), shown


# ------------------------------------------------------------------------------------------------
# Data preparation: characters the tokenizer cannot encode are left out and counted, not fatal.


@pytest.mark.slow
def test_prepare_leaves_out_what_the_char_tokenizer_lacks_counts_it_and_says_so_once(tmp_path):
    from burnout.config import TokenizerConfig
    from burnout.data.tokenizer import load_tokenizer, train_tokenizer

    docs = [f"record {i}: plain words, the same letters." for i in range(300)]
    docs[40] += " café 😀😀😀"
    docs[90] += " 中文中"
    docs[170] += " lone \ud800 surrogate"  # written as JSON's \ud800 escape
    (tmp_path / "docs.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    tok = train_tokenizer(["abcdefghijklmnopqrstuvwxyz 0123456789:,."], TokenizerConfig(kind="char"))
    tok.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "recipe.yaml").write_text(json.dumps({"data": {
        "sources": [{"name": "j", "kind": "jsonl", "path": str(tmp_path / "docs.jsonl")}], "clean": "none",
        "max_tokens": 100_000}, "tokenizer": {"kind": "char"}}))
    out = tmp_path / "out"
    code, stdout, err = _run(tmp_path, {"prepare": ["data", "prepare", str(tmp_path / "recipe.yaml"), "--out",
                                                    str(out), "--tokenizer", str(tmp_path / "tokenizer.json")]}
                             )["prepare"]
    _no_internal_error(code, stdout, err)
    vocab = set(tok.get_vocab())
    expected = Counter(c for d in docs for c in d if c not in vocab)  # by hand: é, 😀 ×3, 中 ×2, 文, \ud800
    assert expected == {"😀": 3, "中": 2, "é": 1, "文": 1, "\ud800": 1}
    report = json.loads((out / "meta.json").read_text())["dropped_characters"]
    assert report["characters"] == 8 and report["distinct"] == 5 and report["documents"] == 3
    assert {char: count for char, _, count in report["most_common"]} == expected
    assert report["most_common"][0] == ["😀", "U+1F600", 3]
    warnings = [line for line in err.splitlines() if "the tokenizer cannot encode" in line]
    assert warnings == ["warning: left out 8 characters that the tokenizer cannot encode, from 3 documents: '😀' "
                        "(U+1F600), '中' (U+4E2D), 'é' (U+00E9), '文' (U+6587), '\\ud800' (U+D800, a lone surrogate); "
                        "to keep them, raise data.max_chars so that the tokenizer's sample holds them, or use "
                        "tokenizer.kind: bpe, which encodes any character; a lone surrogate (a JSON \\ud800 escape "
                        "without its pair) is no character"]
    # Every other character is kept, each as often as the documents hold it (the shards decoded back).
    meta, tok = json.loads((out / "meta.json").read_text()), load_tokenizer(out)
    ids = np.concatenate([np.fromfile(out / shard["file"], dtype=meta["dtype"]) for split in ("train", "val")
                          for shard in meta["splits"][split]["shards"]])
    decoded = tok.decode(ids[ids != meta["eot_id"]].tolist())
    assert Counter(decoded) == Counter(c for d in docs for c in d if c in vocab)


@pytest.mark.slow
def test_prepare_refuses_a_tokenizer_that_cannot_encode_more_than_a_rare_character(tmp_path):
    """A char tokenizer of another text (all but 18 characters missing) is refused once 100,000 characters are read:
    the refusal is the last line, after the progress bar; the unfinished folder is left to prepare again."""
    catalogue._notes(tmp_path)
    catalogue._char_tokenizer().save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "more.txt").write_text((tmp_path / "notes.txt").read_text() * 40)  # past DROPPED_CHECK_CHARS
    jobs = {name: ["data", "prepare", str(tmp_path / f"{name}.txt"), "--out", str(tmp_path / name), "--tokenizer",
                   str(tmp_path / "tokenizer.json")] for name in ("notes", "more")}
    results = _run(tmp_path, jobs)
    for name, (code, _, err) in results.items():
        assert code == 2 and "Traceback" not in err and "internal error" not in err, err
        last = err.splitlines()[-1]
        assert last.startswith("burnout: error: the tokenizer has no token for ") and \
            "more than the 1% it may leave out" in last and "prepare with a tokenizer trained on it" in last, last
        assert not (tmp_path / name / "meta.json").exists()
    assert "of the first 100," in results["more"][2].splitlines()[-1]  # at the check, before the end of its text


@pytest.mark.slow
def test_prepare_of_jsonl_with_a_lone_surrogate_in_the_tokenizers_sample_works(tmp_path):
    """A JSON "\\ud800" in the sample a tokenizer is trained on (both kinds) crashed the training of the tokenizer and
    dedup's hash; it is left out of both and counted."""
    docs = [f"note {i}: the quick brown fox." for i in range(200)]
    docs[3] = "a lone \ud800 in the sample"
    (tmp_path / "docs.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    jobs = {}
    for kind in ("char", "bpe"):
        (tmp_path / f"{kind}.yaml").write_text(json.dumps({"data": {
            "sources": [{"name": "j", "kind": "jsonl", "path": str(tmp_path / "docs.jsonl")}], "dedup": True,
            "max_tokens": 100_000}, "tokenizer": {"kind": kind, "vocab_size": 300}}))
        jobs[kind] = ["data", "prepare", str(tmp_path / f"{kind}.yaml"), "--out", str(tmp_path / kind)]
    for kind, (code, out, err) in _run(tmp_path, jobs).items():
        _no_internal_error(code, out, err)
        report = json.loads((tmp_path / kind / "meta.json").read_text())["dropped_characters"]
        assert report["most_common"] == [["\ud800", "U+D800", 1]], (kind, report)


# ------------------------------------------------------------------------------------------------
# JSON files read at start: one damaged checkpoint is left out, the rest served or reported.


def test_the_playground_serves_the_checkpoints_whose_info_it_can_read(sampled_runs, tmp_path):
    from burnout.playground.catalog import discover

    run = tmp_path / "run"
    shutil.copytree(sampled_runs[0], run)
    damaged = sorted((run / "checkpoints").iterdir())[0]
    os.truncate(damaged / "info.json", 7)
    said: list[str] = []
    entries = discover([run], say=said.append)
    assert [e.path.name for e in entries.values()] == [p.name for p in sorted((run / "checkpoints").iterdir())][1:]
    assert len(said) == 1 and said[0].startswith(f"left out: checkpoint {damaged}: info.json is unreadable (not JSON: ")
    assert said[0].endswith("); use another checkpoint of the run (or its copy in train.mirror_dir)")


@pytest.mark.slow
def test_report_leaves_out_a_damaged_info_or_eval_file_and_says_so(sampled_runs, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(sampled_runs[0], run)
    damaged = sorted((run / "checkpoints").iterdir())[0]
    os.truncate(damaged / "info.json", 7)
    (run / "eval").mkdir(exist_ok=True)
    (run / "eval" / "step_0000008.json").write_text('{"tasks": {"val": ')
    code, out, err = _run(tmp_path, {"report": ["report", str(run), "--out", str(tmp_path / "report")]})["report"]
    _no_internal_error(code, out, err)
    report = (tmp_path / "report" / "report.md").read_text()
    assert f"checkpoint {damaged}: info.json is unreadable" in report and "the report leaves it out" in report
    assert f"{run / 'eval' / 'step_0000008.json'} is left out (unreadable: " in report


@pytest.mark.slow
def test_eval_summarises_the_scores_it_can_read_beside_one_cut_short(sampled_runs, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(sampled_runs[0], run)
    (run / "eval").mkdir(exist_ok=True)
    (run / "eval" / "step_0000008.json").write_text('{"step": 8, "tasks": {"val": {"loss": 3.')
    code, out, err = _run(tmp_path, {"eval": ["eval", str(run), "--tasks", "val", "--limit", "2"]})["eval"]
    _no_internal_error(code, out, err)
    summary = (run / "eval" / "summary.md").read_text()
    assert f"{run / 'eval' / 'step_0000008.json'} is left out (unreadable: " in summary
    assert "| 24 |" in summary  # the newest checkpoint, scored now


# ------------------------------------------------------------------------------------------------
# `burnout serve`: a prompt the tokenizer cannot encode is the client's 400, naming the field.


def test_serve_answers_400_naming_the_prompt_for_text_a_char_model_cannot_encode(tmp_path):
    pytest.importorskip("starlette")
    from starlette.testclient import TestClient

    from burnout.serve.openai_api import build_app, load_served

    catalogue._untrained(tmp_path / "char", catalogue._char_tokenizer())
    client = TestClient(build_app(load_served(tmp_path / "char", name="char")))
    asks = {"emoji": "To be 😀", "surrogate": "To be \ud800", "list": ["To be", "or (not)"], "fine": "To be"}
    answers = {name: client.post("/v1/completions", content=json.dumps({"model": "char", "prompt": prompt,
                                                                        "max_tokens": 2}))
               for name, prompt in asks.items()}
    for name, fragment in [("emoji", "prompt holds '😀' (U+1F600), which the tokenizer cannot encode"),
                           # A lone surrogate is no Unicode: the body's own check refuses it before any tokenizer.
                           ("surrogate", "prompt: holds \\ud800, half of a surrogate pair, which is no character"),
                           ("list", "prompt[1] holds '(' (U+0028), ')' (U+0029)")]:
        error = answers[name].json()["error"]
        assert answers[name].status_code == 400 and error["param"] == "prompt" and fragment in error["message"], error
    assert answers["fine"].status_code == 200


# ------------------------------------------------------------------------------------------------
# The catch-all line itself, for what nobody foresaw: it must not fail on an argument of bytes that are not UTF-8.


def test_the_catch_all_keeps_the_trace_of_a_command_given_bytes_that_are_not_utf8():
    from burnout import cli

    try:
        raise RuntimeError("an unforeseen bug")
    except RuntimeError:
        where = cli._keep_trace(["generate", "run", "--prompt", "The \udcff"])  # Python's argv for a byte 0xff
    assert where.startswith("the full trace is in ") and where.endswith("; please report it"), where
    saved = Path(where.removeprefix("the full trace is in ").removesuffix("; please report it")).read_text()
    assert saved.startswith("burnout generate run --prompt 'The \\udcff'\n") and "RuntimeError: an unforeseen bug" \
        in saved
