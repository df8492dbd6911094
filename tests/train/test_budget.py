"""Every training command says its plan before it spends (burnout/train/budget.py: spend_lines), and a time budget
covers the whole command, its start-up included (settle_budget, TimeBudget; the clock starts in train/run.py).
The loop's clock (loop.time) and the step probe's move by each train step alone and by what a test adds, so nothing
here depends on the machine's speed."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from burnout.base.text import format_count
from burnout.cli import main
from burnout.config import load_run_config
from burnout.data.shards import read_meta
from burnout.models.memory import param_counts
from burnout.train import recipe
from burnout.train import run as run_module
from burnout.train.budget import PLAN_PROBE_STEPS
from burnout.train.metrics import read_metrics
from burnout.train.schedule import lr_at


def _config(tiny_run_config, folder: Path, **train) -> str:
    path = folder / "run.yaml"
    path.write_text(yaml.safe_dump(tiny_run_config(**train).to_dict()))
    return str(path)


def _run_words(tokens: int, train_tokens: int, params: int) -> str:
    """The run's part of the plan line, its figures computed here."""
    return (f"the run: {format_count(tokens)} tokens, {tokens / train_tokens:.2g} passes over the train data, "
            f"{tokens / params:.3g} tokens per parameter")


def test_train_says_its_steps_time_and_tokens_per_parameter_before_its_first_step(tiny_run_config, tiny_bpe_data,
                                                                                  tmp_path, capsys, step_clock):
    """No budget: a warm-up and PLAN_PROBE_STEPS steps are timed (1 s each here), and before step 1's line the run
    says its 12 steps, their 12 s at 1 s a step, its tokens (12 × 4 × 32), its passes over the data and its tokens
    per parameter, with the warning: far below the ~20 its size needs (red when the plan comes after the first step,
    when no step is timed for it, or when the warning is missing)."""
    clock = step_clock(lambda step: 1.0)
    run = tmp_path / "run"
    assert main(["train", _config(tiny_run_config, tmp_path, max_steps=12, log_interval=1), "--out", str(run),
                 "--data", str(tiny_bpe_data)]) == 0
    out = capsys.readouterr().out.splitlines()
    cfg = load_run_config(run / "config.yaml")
    tokens, params = 12 * 4 * 32, param_counts(cfg.model).total
    plan = ("plan: steps 0 → 12, about 0m12s at 1 s a step (measured); "
            + _run_words(tokens, read_meta(tiny_bpe_data)["splits"]["train"]["tokens"], params))
    assert plan in out, out
    warning = next(line for line in out if "far below the ~20" in line)
    assert warning.startswith(f"warning: {format_count(tokens)} tokens for {format_count(params)} parameters: "
                              f"{tokens / params:.3g} tokens per parameter, far below"), warning
    assert out.index(plan) < out.index(warning) < next(i for i, line in enumerate(out) if line.startswith("step 1/"))
    assert clock.probe_steps == PLAN_PROBE_STEPS + 1
    assert cfg.train.step_seconds is None  # the plan's measurement plans nothing: config.yaml is as it was


def test_a_session_that_ends_at_a_phase_says_its_own_cost_and_the_runs(tiny_run_config, tiny_bpe_data, tmp_path, capsys,
                                                                       step_clock):
    """A phase ends the session at step 4 of 12; at $3.60 an hour and 100 s a step it costs 6m40s and $0.40, the run
    20m00s and $1.20; the resumed session says what is left (red when the price or the session's end is ignored)."""
    step_clock(lambda step: 100.0)
    config = _config(tiny_run_config, tmp_path, max_steps=12, price_per_hour=3.6,
                     phases=[{"name": "first", "steps": 4}])
    run = tmp_path / "run"
    assert main(["train", config, "--out", str(run), "--data", str(tiny_bpe_data)]) == 0
    out = capsys.readouterr().out
    assert ("plan: steps 0 → 4 of 12, about 6m40s, $0.40 at 100 s a step (measured); to step 12 about 20m00s, "
            "$1.20; the run: ") in out, out
    assert main(["train", "--resume", str(run)]) == 0
    assert "plan: steps 4 → 12, about 13m20s, $0.80 at 100 s a step (measured); the run: " in capsys.readouterr().out


def test_a_fine_tune_says_its_passes_and_no_tokens_per_parameter(tiny_run, fine_tune_data, tmp_path, capsys,
                                                                 step_clock):
    """sft, unpacked: 12 steps of 4 rows are 48 conversations, over those it holds for training: the plan says those
    passes, and neither tokens per parameter nor a warning, though its tokens are a sliver of its parameters: a
    fine-tune starts from a trained model (red when the pretraining rule reaches a fine-tune)."""
    step_clock(lambda step: 1.0)
    run = tmp_path / "sft"
    assert main(["sft", str(tiny_run.run_dir), "--data", str(fine_tune_data.chats), "--out", str(run),
                 "train.device=cpu", "train.precision=fp32", "train.batch_size=4", "train.seq_len=64",
                 "train.max_steps=12", "sft.packing=false"]) == 0
    out = capsys.readouterr().out
    rows = json.loads((run / "data" / "meta.json").read_text())["splits"]["train"]["examples"]
    assert (f"plan: steps 0 → 12, about 0m12s at 1 s a step (measured); the run: {12 * 4 / rows:.2g} passes over the "
            "train data (a fine-tune: tokens per parameter do not apply)") in out, out
    assert "tokens per parameter, far below" not in out


def test_a_budget_covers_the_data_preparation_and_elapsed_s_holds_it(tiny_run_config, tiny_bpe_data, tmp_path,
                                                                     monkeypatch, capsys, step_clock):
    """`--minutes 1` at train.step_seconds=1, and preparing the data takes 30 s of the command's clock: the budget
    plans the 30 steps the other 30 s hold, config.yaml keeps the start-up for a resume's plan, the first step is the
    schedule's first (its warmup not skipped), and elapsed_s counts the preparation, so the run ends at the minute
    (red when the clock starts after the data are prepared, or at the first step)."""
    clock = step_clock(lambda step: 1.0)

    def prepared_slowly(cfg, data_dir, *args, **kwargs):
        shutil.copytree(tiny_bpe_data, data_dir)
        clock.now += 30.0

    monkeypatch.setattr(recipe, "prepare_on_rank_0", prepared_slowly)
    run = tmp_path / "run"
    assert main(["train", _config(tiny_run_config, tmp_path, max_steps=1000, log_interval=1), "--out", str(run),
                 "--minutes", "1", "train.step_seconds=1"]) == 0
    out = capsys.readouterr().out
    assert ("budget 1 min: train.step_seconds 1 s/step → planning 30 steps; the LR schedule ends at the budget; the "
            "start-up (data, probe, step timing) took 30 s of it") in out, out
    tc = load_run_config(run / "config.yaml").train
    assert tc.startup_seconds == 30.0
    records = read_metrics(run)
    assert len(records) == 30
    assert (records[0]["lr"], records[-1]["lr"]) == pytest.approx((lr_at(0, tc, 30), lr_at(29, tc, 30)), rel=1e-6)
    assert [r["elapsed_s"] for r in records] == [30.0 + step for step in range(1, 31)]


@pytest.mark.parametrize("minutes, planned", [(1, 53), (2, 113)])
def test_a_budget_plans_from_what_the_step_measurement_left(tiny_run_config, tiny_bpe_data, tmp_path, capsys, minutes,
                                                            planned, step_clock):
    """The budget's probe times a warm-up and six steps, 1 s each: the start-up took 7 s, so a minute plans 53 steps
    and two 113 (red when the measurement is left out of the start-up)."""
    step_clock(lambda step: 1.0)
    run = tmp_path / "run"
    assert main(["train", _config(tiny_run_config, tmp_path, max_steps=1000, log_interval=1), "--out", str(run),
                 "--data", str(tiny_bpe_data), "--minutes", str(minutes), "train.max_steps=3"]) == 0
    out = capsys.readouterr().out
    assert f"measured 1 s/step → {planned} steps would fit; the run ends at step 3 first" in out, out
    assert load_run_config(run / "config.yaml").train.startup_seconds == 7.0


def test_a_resumed_budget_keeps_its_plan_and_counts_its_own_start_up(tiny_run_config, tiny_bpe_data, tmp_path,
                                                                    monkeypatch, capsys, step_clock):
    """A run whose config.yaml holds a step's seconds and no start-up (a budget planned before start-ups counted)
    keeps its 60 planned steps when resumed, though checking its data took 5 s of the resumed session; those 5 s are
    in its elapsed_s (red when a resume plans anew from its own start-up, or leaves it out of the time)."""
    clock = step_clock(lambda step: 1.0)
    config = _config(tiny_run_config, tmp_path, max_steps=1000, log_interval=1, phases=[{"name": "first", "steps": 10}])
    run = tmp_path / "run"
    assert main(["train", config, "--out", str(run), "--data", str(tiny_bpe_data), "--minutes", "1",
                 "train.step_seconds=1"]) == 0
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["train"]["budget"].pop("startup_seconds") == 0.0
    (run / "config.yaml").write_text(yaml.safe_dump(saved))
    real_check = run_module.check_resume_data

    def slow_check(*args, **kwargs):
        clock.now += 5.0
        return real_check(*args, **kwargs)

    monkeypatch.setattr(run_module, "check_resume_data", slow_check)
    capsys.readouterr()
    assert main(["train", "--resume", str(run)]) == 0
    assert "budget 1 min: train.step_seconds 1 s/step → planning 60 steps" in capsys.readouterr().out
    records = read_metrics(run)
    assert load_run_config(run / "config.yaml").train.startup_seconds is None
    assert records[10]["elapsed_s"] == 10.0 + 5.0 + 1.0  # the 10 steps, the resume's check, its first step
