"""A time budget is a plan, not a cut-off (burnout/train/budget.py: TimeBudget), through the real commands: a run
whose steps slow down still ends its LR schedule at the budget, at the final LR; sft with --minutes finishes its
warmup and decays; a resume goes on where the run's elapsed_s puts its schedule; without a budget the LR is the
step's alone, as it always was. The clock the loop and the step probe read moves by each train step alone, so
nothing here depends on the machine's speed."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml

from burnout.cli import main
from burnout.config import load_run_config
from burnout.train.metrics import read_metrics
from burnout.train.schedule import budget_steps, lr_at


def _config(tiny_run_config, folder: Path, **train) -> str:
    path = folder / "run.yaml"
    path.write_text(yaml.safe_dump(tiny_run_config(log_interval=1, **train).to_dict()))
    return str(path)


def _lrs(run: Path) -> list[float]:
    records = read_metrics(run)
    assert [r["step"] for r in records] == list(range(1, len(records) + 1))  # every step logged
    return [r["lr"] for r in records]


def _final_lr(run: Path) -> tuple[float, int]:
    """The schedule's last LR as the run's config.yaml plans it, and the steps planned (in what the start-up left)."""
    tc = load_run_config(run / "config.yaml").train
    planned = budget_steps(tc.max_minutes, tc.step_seconds, tc.startup_seconds)
    return lr_at(planned - 1, tc, planned), planned


def test_a_run_whose_steps_slow_down_still_ends_its_schedule_at_the_budget(tiny_run_config, tiny_bpe_data, tmp_path,
                                                                           capsys, step_clock):
    """The probe measures 1 s a step (a warm-up and six steps: 7 s of the minute), so one minute plans 53; from step
    20 each step takes 3 s. The run stops near the minute, well short of 53 steps, and its last step is at the
    schedule's final LR (red when a step's LR follows its step alone, or when the time budget stops the run without
    having given its last step the final LR)."""
    step_clock(lambda step: 1.0 if step < 20 else 3.0, probe_seconds=1.0)
    run = tmp_path / "run"
    assert main(["train", _config(tiny_run_config, tmp_path, max_steps=1000), "--out", str(run),
                 "--data", str(tiny_bpe_data), "--minutes", "1"]) == 0
    out = capsys.readouterr().out
    assert "budget 1 min: measured 1 s/step → planning 53 steps; the LR schedule ends at the budget" in out
    final, planned = _final_lr(run)
    lrs = _lrs(run)
    assert 30 <= len(lrs) < planned, len(lrs)  # 20 steps of 1 s and about 13 of 3 s fill the minute
    assert lrs[-1] == final and lrs[-2] > final
    warmup = lrs.index(max(lrs))
    assert warmup < 5 and all(a >= b for a, b in zip(lrs[warmup:], lrs[warmup + 1:]))  # warm up, then decay
    assert f"step {len(lrs)} of {planned} planned; the last step's LR {final:.2e} (the schedule's final value" in out
    assert "time budget spent: step" in out
    # Its budget is spent: a resume says so, and how to train on.
    assert main(["train", "--resume", str(run)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("burnout: error: --resume: "), err
    assert "has trained 1m00s of its time budget (train.max_minutes=1" in err and "--minutes 2" in err, err



def test_a_run_that_trained_every_planned_step_resumes_at_its_end(tiny_run_config, tiny_bpe_data, tmp_path, capsys,
                                                                  step_clock):
    """Each step takes the 1 s the probe measured: the run trains all 53 steps the minute planned after the probe's
    7 s, which spends its budget. Resumed, it is at its end rather than past its budget: nothing is left to train, and
    it says it is done (red when a spent budget refuses the resume of a run already at its last step)."""
    step_clock(lambda step: 1.0, probe_seconds=1.0)
    run = tmp_path / "run"
    assert main(["train", _config(tiny_run_config, tmp_path, max_steps=1000), "--out", str(run),
                 "--data", str(tiny_bpe_data), "--minutes", "1"]) == 0
    assert len(_lrs(run)) == 53
    capsys.readouterr()
    assert main(["train", "--resume", str(run)]) == 0
    assert "done: step 53," in capsys.readouterr().out

def test_a_sudden_slowdown_overruns_the_budget_by_at_most_one_step(tiny_run_config, tiny_bpe_data, tmp_path,
                                                                   step_clock):
    """From step 33 of the 53 planned (40 s into the minute, the probe's 7 s and 33 steps) each step takes 10 s
    instead of 1: the next step is predicted at the latest step's 10 s, not the median of the last five (still 1 s),
    so the run ends within one slow step of the minute (red when the prediction follows the median alone: three
    slow steps pass before it moves)."""
    step_clock(lambda step: 1.0 if step < 33 else 10.0, probe_seconds=1.0)
    run = tmp_path / "run"
    assert main(["train", _config(tiny_run_config, tmp_path, max_steps=1000), "--out", str(run),
                 "--data", str(tiny_bpe_data), "--minutes", "1"]) == 0
    final, _ = _final_lr(run)
    records = read_metrics(run)
    assert records[-1]["elapsed_s"] <= 60 + 10, records[-1]
    assert records[-1]["lr"] == final


def test_a_dollar_budget_is_the_time_budget_it_buys_at_the_price_per_hour(tiny_run_config, tiny_bpe_data, tmp_path,
                                                                          capsys, step_clock):
    """--dollars at train.price_per_hour buys its minutes, planned as --minutes plans them (the probe's 1 s a step),
    and ends its LR schedule at the budget when the steps slow to 3 s; config.yaml keeps the dollars and the
    minutes they bought (red when the dollars are not turned into minutes at the price). Spent, a resume says so
    in dollars."""
    step_clock(lambda step: 1.0 if step < 20 else 3.0, probe_seconds=1.0)
    dollars, price = 0.01, 0.6
    run = tmp_path / "run"
    assert main(["train", _config(tiny_run_config, tmp_path, max_steps=1000), "--out", str(run), "--data",
                 str(tiny_bpe_data), "--dollars", str(dollars), f"train.price_per_hour={price}"]) == 0
    out = capsys.readouterr().out
    tc = load_run_config(run / "config.yaml").train
    final, planned = _final_lr(run)
    assert tc.max_dollars == dollars and tc.max_minutes == pytest.approx(dollars / price * 60)
    assert planned == int((dollars / price * 3600 - tc.startup_seconds) / tc.step_seconds)
    assert (f"budget ${dollars:g} ({tc.max_minutes:g} min at ${price:.2f}/h): measured 1 s/step → planning "
            f"{planned} steps; the LR schedule ends at the budget") in out
    lrs = _lrs(run)
    assert len(lrs) < planned and lrs[-1] == final
    assert main(["train", "--resume", str(run)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"(train.max_dollars={dollars:g}: " in err and "e.g. --dollars " in err, err


def test_a_resumed_budget_goes_on_where_the_elapsed_time_puts_its_schedule(tiny_run_config, tiny_bpe_data, tmp_path,
                                                                           capsys, step_clock):
    """Steps take 2 s where 1 s was measured, so the budget's clock, not the step, places each step. A run split
    at a phase end and resumed follows the schedule by the time it spent across both sessions: its LR goes on
    falling at the resume, and it ends at the step and the LR of the run left alone (red when a resumed session
    counts its own time alone)."""
    step_clock(lambda step: 2.0, probe_seconds=1.0)
    config = _config(tiny_run_config, tmp_path, max_steps=1000, phases=[{"name": "first", "steps": 10}])
    whole, split = tmp_path / "whole", tmp_path / "split"
    common = ["--data", str(tiny_bpe_data), "--minutes", "1"]
    assert main(["train", config, "--out", str(whole), *common, "train.phases=[]"]) == 0
    assert main(["train", config, "--out", str(split), *common]) == 0
    assert len(_lrs(split)) == 10
    assert main(["train", "--resume", str(split)]) == 0
    capsys.readouterr()
    final, planned = _final_lr(whole)
    left_alone, resumed = _lrs(whole), _lrs(split)
    assert len(resumed) == len(left_alone) < planned and resumed[-1] == left_alone[-1] == final
    assert resumed[10] <= resumed[9]  # the schedule did not go back to step 10's place
    tc = load_run_config(split / "config.yaml").train
    assert resumed[10] < lr_at(10, tc, planned)  # it is ahead of the step, where 22 s of the minute put it


def test_sft_with_minutes_finishes_its_warmup_and_decays(tiny_run, fine_tune_data, tmp_path, capsys, step_clock):
    """sft's warmup (train.warmup_steps 100 by default) is longer than the 30 steps 37 s plan at 1 s a step after the
    probe's 7: the budget warms up over a tenth of them, then decays to the final LR on the last step (red when the
    warmup is not fitted to the plan: the run would end still warming up)."""
    step_clock(lambda step: 1.0, probe_seconds=1.0)
    run = tmp_path / "sft"
    assert main(["sft", str(tiny_run.run_dir), "--data", str(fine_tune_data.chats), "--out", str(run), "--minutes",
                 "0.62", "train.device=cpu", "train.precision=fp32", "train.batch_size=4", "train.seq_len=64",
                 "train.log_interval=1"]) == 0
    assert "planning 30 steps" in capsys.readouterr().out
    tc = load_run_config(run / "config.yaml").train
    final, planned = _final_lr(run)
    lrs = _lrs(run)
    assert tc.warmup_steps == 100 and len(lrs) == planned == 30
    # Warm up over 3 steps to the peak (the budget's share rides the loss's float32 all-reduce: 1e-7 of a step).
    assert lrs[:3] == pytest.approx([tc.lr / 3, 2 * tc.lr / 3, tc.lr], rel=1e-6)
    # The first decay step may sit at the peak: the clock no longer runs ahead of the step (the start-up is out of
    # the time the steps were planned in).
    assert lrs[2] >= lrs[3] and all(a > b for a, b in zip(lrs[3:], lrs[4:])) and lrs[-1] == final < tc.lr / 2


def test_without_a_budget_each_step_has_the_lr_of_its_step(tiny_run_config, tiny_bpe_data, tmp_path):
    """No time budget: the LR of every step is the warmup-then-cosine of its step alone, bit for bit as before
    budgets existed (red when the budget's warmup or clock reaches a run without one)."""
    run = tmp_path / "run"
    assert main(["train", _config(tiny_run_config, tmp_path), "--out", str(run), "--data", str(tiny_bpe_data)]) == 0
    tc = load_run_config(run / "config.yaml").train
    assert tc.max_minutes is None and tc.step_seconds is None

    def lr_of_step(step: int) -> float:  # burnout/train/schedule.py's lr_at before time budgets
        if step < tc.warmup_steps:
            return tc.lr * (step + 1) / tc.warmup_steps
        progress = min(1.0, (step - tc.warmup_steps) / max(1, tc.max_steps - tc.warmup_steps))
        return tc.min_lr + 0.5 * (tc.lr - tc.min_lr) * (1.0 + math.cos(math.pi * progress))

    assert _lrs(run) == [lr_of_step(step) for step in range(tc.max_steps)]
