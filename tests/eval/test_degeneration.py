"""Degeneration scores (burnout/eval/degeneration.py): distinct-n on hand-counted texts, the degenerate flag
for loops and for suspicious strings, and reading those strings from a file or an audit.json."""

import json

import pytest

from burnout.cli import main
from burnout.errors import BurnoutError
from burnout.eval.degeneration import degeneration, distinct_n, read_suspicious, summarize


def test_distinct_n_counts_unique_word_ngrams():
    # "the cat sat on the cat": 6 words; 2-grams the-cat, cat-sat, sat-on, on-the, the-cat → 4 unique of 5.
    assert distinct_n("the cat sat on the cat", 2) == pytest.approx(4 / 5)
    assert distinct_n("the cat sat on the cat", 1) == pytest.approx(4 / 6)
    assert distinct_n("a, a, a", 1) == pytest.approx(2 / 5)  # punctuation marks are words too
    assert distinct_n("two words", 3) == 1.0  # no 3-grams: nothing repeats


def test_a_loop_is_degenerate_and_a_sentence_is_not():
    loop = "the total of the total of the total of the total of the total of"
    assert degeneration(loop)["repetition"] > 0.5 and degeneration(loop)["degenerate"]
    sentence = "Paris is the capital of France, and it sits on the Seine."
    assert degeneration(sentence) == {"distinct_1": pytest.approx(13 / 14), "distinct_2": 1.0, "distinct_3": 1.0,
                                      "repetition": 0.0, "suspicious": [], "degenerate": False}


def test_a_suspicious_string_flags_an_answer_case_sensitively():
    answer = "Sure! PersonX wants to help PersonY."
    assert degeneration(answer, ["PersonX", "AndroidRuntime"])["suspicious"] == ["PersonX"]
    assert degeneration(answer, ["personx"])["degenerate"] is False
    summary = summarize([answer, "A fine answer here.", "no no no no no no no no no"], ["PersonX"])
    assert summary["degenerate"] == 2 and summary["texts"] == 3 and summary["suspicious"] == ["PersonX"]


def test_suspicious_strings_come_from_a_text_file_or_an_audit_json(tmp_path):
    (tmp_path / "s.txt").write_text("PersonX\n\nprettyprint\n")
    assert read_suspicious(tmp_path / "s.txt") == ["PersonX", "prettyprint"]
    terms = [{"string": f"term{i}", "score": 20.0 - i} for i in range(12)]
    (tmp_path / "audit.json").write_text(json.dumps({"sources": [
        {"name": "web", "suspicious_terms": [{"string": "fefefe", "score": 3.0}]},
        {"name": "code", "suspicious_terms": [{"string": "fefefe", "score": 2.0}, *terms]}]}))
    # each source's 10 best, once each
    assert read_suspicious(tmp_path / "audit.json") == ["fefefe", *(f"term{i}" for i in range(9))]
    (tmp_path / "bad.json").write_text("[1, 2]")
    with pytest.raises(BurnoutError, match="not the audit.json"):
        read_suspicious(tmp_path / "bad.json")


def test_compare_refuses_a_missing_suspicious_file_in_one_line(tmp_path, capsys):
    assert main(["compare", str(tmp_path), "--suspicious", str(tmp_path / "none.txt")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--suspicious" in err


def test_training_samples_carry_the_suspicious_strings_of_the_data_audit(tiny_run_config, tiny_bpe_data, tmp_path):
    """A data folder audited by `burnout data audit` (DATA/audit/audit.json): each training sample's record lists
    the audit's strings it holds, beside its repetition."""
    import shutil

    from burnout.runs import start_training
    from burnout.train.metrics import read_metrics

    data = tmp_path / "data"
    shutil.copytree(tiny_bpe_data, data)
    (data / "audit").mkdir()
    (data / "audit" / "audit.json").write_text(json.dumps({"sources": [
        {"name": "docs", "suspicious_terms": [{"string": "The "}, {"string": "zqxNeverSeen"}]}]}))
    cfg = tiny_run_config(max_steps=4, eval_interval=2, sample_prompt="The ", sample_tokens=8)
    start_training(cfg, tmp_path / "run", data_dir=data, on_event=lambda line: None, progress=False)
    samples = [r for r in read_metrics(tmp_path / "run") if "sample" in r]
    assert [r["step"] for r in samples] == [2, 4]
    for r in samples:  # every sample starts with its prompt, "The "
        assert r["sample_suspicious"] == ["The "]
        assert r["sample_repetition"] == pytest.approx(1 - distinct_n(r["sample"], 3))
