"""A newcomer's first hour, end to end and short: benchmarks/bench_first_hour.py's own steps (raw text by path
prepared without YAML, a preset trained with --minutes, generate, sft on Alpaca with --minutes, a chat answer,
the export loaded by transformers), each through the real `burnout` command in this process, with budgets and
step caps small enough for a busy 2-core machine. Nothing here reads a clock: what each step made is checked."""

from __future__ import annotations

import json
import re

import pytest

from benchmarks.bench_first_hour import first_hour
from burnout.cli import main
from burnout.config import load_run_config
from burnout.data.shards import read_meta

pytestmark = pytest.mark.slow  # every test here trains, installs or drives a browser: not in `make test-fast`

pytest.importorskip("transformers")

TRAIN_MINUTES, SFT_MINUTES = 0.2, 0.2


def test_raw_text_to_a_chat_model_that_transformers_loads(shared_data, tmp_path, capsys):
    def burnout(*args: str) -> tuple[str, float]:
        """The `burnout` command in this process; its output, and no minutes (this test times nothing)."""
        code = main(list(args))
        out = capsys.readouterr()
        assert code == 0, f"burnout {' '.join(args)}: {out.err[-2000:]}"
        return out.out + out.err, 0.0

    text = shared_data / "tinyshakespeare" / "input.txt"
    rows = first_hour(tmp_path, text, shared_data / "sft" / "alpaca_5000.json", "llama-tiny", TRAIN_MINUTES,
                      SFT_MINUTES, run=burnout, prepare_options=["--tokenizer", "bpe:512"],
                      train_options=["train.max_steps=30", "train.eval_batches=2"],
                      sft_options=["sft.max_examples=64", "train.max_steps=10", "train.batch_size=4",
                                   "train.eval_batches=2"])
    gave = {name: what for name, _, what in rows}
    assert list(gave) == ["data prepare", "train", "generate", "sft", "generate --chat", "export",
                          "transformers loads the export"]
    # The text by path, no data mix: one text source, the whole file read.
    meta = read_meta(tmp_path / "data")
    assert [source["path"] for source in meta["data_config"]["sources"]] == [str(text)]
    for run, minutes, chat in ((tmp_path / "run", TRAIN_MINUTES, False), (tmp_path / "chat", SFT_MINUTES, True)):
        cfg = load_run_config(run / "config.yaml")
        assert cfg.train.max_minutes == minutes and cfg.train.step_seconds > 0  # planned from a measured step
        assert (cfg.tokenizer.chat_template == "chatml") == chat
    for name in ("train", "sft"):  # each run's last step at its schedule's final LR, a val loss measured
        last, final = re.search(r"the last step's LR (\S+) \(the schedule's final value (\S+)\)", gave[name]).groups()
        assert last == final and "val loss" in gave[name], gave[name]
    assert gave["generate"].strip("'\"") and not gave["generate --chat"].startswith("0 words")
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["model_type"] == "llama"
    assert gave["transformers loads the export"].startswith("'The")
