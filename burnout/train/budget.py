"""A run's time or dollar budget (train.max_minutes, train.max_dollars): everything a budgeted run does that
others do not, so the Trainer only asks it.

    settle_budget   before the plan: a dollar budget as the minutes it buys at the run's price per hour, and a
                    step's seconds measured when train.step_seconds is not given; config.yaml records both
    Budget          the lines that say what the budget plans and what a session reached; a resume refused when
                    its budget is spent
    TimeBudget      a session's steps on the LR schedule by the clock, and when the budget is spent

A time budget plans its steps from a step's seconds (schedule.budget_steps, which stays beside the run's other ends
in schedule.total_steps) and places each step on the schedule at the larger of its step and the share of the
budget spent: when the machine slows down, warmup and decay still end at the budget, and the last step is at the
final LR. A run without a budget is placed by its step alone."""

from __future__ import annotations

import dataclasses
import math
import statistics
from pathlib import Path

import torch

from burnout.base.text import format_duration
from burnout.config import RunConfig, TrainConfig
from burnout.errors import BurnoutError
from burnout.train.distributed import DistContext, from_main, gather_to_main
from burnout.train.hardware import hardware_price
from burnout.train.probe import measure_step_seconds
from burnout.train.recipe import Recipe
from burnout.train.schedule import budget_steps, lr_at

# A time budget predicts a step's seconds by the median of the session's last few: on a busy machine neighbouring
# steps differ widely (docs/PERFORMANCE.md). The step about to run is predicted by the latest step where that took
# longer: the median of five alone follows a sudden slowdown only after three steps, each over the budget.
PREDICT_FROM_STEPS = 5


def settle_budget(cfg: RunConfig, data_dir: Path, recipe: Recipe, device: torch.device, precision: str,
                  dist: DistContext) -> tuple[RunConfig, Budget | None]:
    """`cfg` with its budget in minutes and a step's seconds (train.max_minutes, train.step_seconds), and the
    Budget; None for a run without one. The same on every rank."""
    price = None
    if cfg.train.budget.max_dollars is not None:
        cfg, price = _dollars_to_minutes(cfg, device, dist)
    if cfg.train.budget.max_minutes is None:
        return cfg, None
    measured = cfg.train.budget.step_seconds is None
    if measured:
        cfg = _measure_step(cfg, data_dir, recipe, device, precision, dist)
    return cfg, Budget(cfg.train, price, measured)


def _dollars_to_minutes(cfg: RunConfig, device: torch.device, dist: DistContext) -> tuple[RunConfig, float]:
    """A dollar budget is the time budget it buys at the run's price per hour, every device's: set as
    train.max_minutes for this session (config.yaml records it), the price returned; refused in one line where
    no price is known. The same on every rank: rank 0's price."""
    tc = cfg.train
    price, what = hardware_price(tc.budget.hardware, tc.budget.price_per_hour, device)
    price = from_main(price * dist.world_size if price is not None else None, dist)
    if price is None:
        raise BurnoutError(f"train.max_dollars: no price per hour is known for {what}; give one "
                           "(train.price_per_hour=0.5, dollars per device-hour) or a time budget (--minutes N)")
    minutes = float(f"{tc.budget.max_dollars / price * 60:.4g}")
    return dataclasses.replace(cfg, train=dataclasses.replace(
        tc, budget=dataclasses.replace(tc.budget, max_minutes=minutes))), price


def _measure_step(cfg: RunConfig, data_dir: Path, recipe: Recipe, device: torch.device, precision: str,
                  dist: DistContext) -> RunConfig:
    """A time budget plans its steps from a step's seconds: measured now on every rank (one rank's step,
    weights discarded), the slowest rank's kept in train.step_seconds, which config.yaml records."""
    try:
        seconds = measure_step_seconds(cfg, data_dir, recipe, device, precision)
    except torch.OutOfMemoryError:
        raise BurnoutError("train.max_minutes: timing a step for the plan ran out of memory (it runs one rank's "
                           "copy of the model); give the seconds a step takes as train.step_seconds") from None
    everyone = gather_to_main(seconds, dist)
    seconds = float(f"{from_main(max(everyone) if everyone is not None else None, dist):.4g}")
    budget = dataclasses.replace(cfg.train.budget, step_seconds=seconds)
    return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, budget=budget))


class Budget:
    """A settled budget (settle_budget): train.max_minutes at train.step_seconds (`measured` before the first
    step, or given); a dollar budget's at `price` per hour."""

    def __init__(self, tc: TrainConfig, price: float | None, measured: bool):
        self.tc, self.price, self.measured = tc, price, measured

    def words(self) -> str:
        """The budget as the lines say it: '3 min', or '$0.5 (42.9 min at $0.70/h)'."""
        minutes = f"{self.tc.budget.max_minutes:g} min"
        if self.tc.budget.max_dollars is None:
            return minutes
        return f"${self.tc.budget.max_dollars:g} ({minutes} at ${self.price:.2f}/h)"

    def plan_line(self, end_of_run: int, elapsed_before: float) -> str:
        """The line that says what a time budget plans: its steps, and where the LR schedule ends (`end_of_run`)."""
        tc, planned = self.tc, budget_steps(self.tc.budget.max_minutes, self.tc.budget.step_seconds)
        how = "measured" if self.measured else "train.step_seconds"
        line = f"budget {self.words()}: {how} {tc.budget.step_seconds:.3g} s/step → "
        if planned == end_of_run:
            line += f"planning {planned:,} steps; the LR schedule ends at the budget"
        else:
            line += (f"{planned:,} steps would fit; the run ends at step {end_of_run:,} first (about "
                     f"{format_duration(end_of_run * tc.budget.step_seconds)}), and so does the LR schedule, or at the "
                     "budget if the steps slow down")
        if elapsed_before:
            line += f"; {format_duration(elapsed_before)} of it spent before this session"
        return line

    def check_resume(self, run_dir: Path, elapsed: float, step: int, end_of_run: int) -> None:
        """Refuse a resume at `step`, `elapsed` seconds into the run, whose next step would end past the budget,
        where it could only repeat the final LR (unless the run is already at its end, `end_of_run`)."""
        budget = self.tc.budget
        if elapsed + budget.step_seconds < budget.max_minutes * 60 or step == end_of_run:
            return
        if budget.max_dollars is None:
            named = f"train.max_minutes={budget.max_minutes:g}"
            larger = f"--minutes {math.ceil(elapsed / 60) + budget.max_minutes:g}"
        else:
            named = f"train.max_dollars={budget.max_dollars:g}: {budget.max_minutes:g} min at ${self.price:.2f}/h"
            larger = f"--dollars {math.ceil(elapsed / 3600 * self.price * 100) / 100 + budget.max_dollars:g}"
        raise BurnoutError(f"--resume: {run_dir} has trained {format_duration(elapsed)} of its time budget ({named}, "
                           f"which counts every session), and a step takes {budget.step_seconds:.3g} s; to train on, "
                           f"give a larger budget, e.g. {larger}, and its LR schedule stretches to it (config.yaml is "
                           "left as it was)")

    def session(self, end_of_run: int, elapsed_before: float) -> TimeBudget:
        """The clock of a session that starts `elapsed_before` seconds into the run."""
        return TimeBudget(self.tc, end_of_run, elapsed_before)

    def end_line(self, elapsed: float, step: int, end_of_run: int, lr: float) -> str:
        """What a time-budgeted session reached: its minutes and steps against the plan, and the LR of its last step
        against the schedule's last."""
        final = lr_at(end_of_run - 1, self.tc, end_of_run)
        return (f"budget {self.words()}: {format_duration(elapsed)} trained, step {step:,} of "
                f"{end_of_run:,} planned; the last step's LR {lr:.2e} (the schedule's final value {final:.2e})")


class TimeBudget:
    """Where a time-budgeted run's steps sit on its schedule, and when its budget is spent.

    `fraction` is the share of the budget at whose end the step about to run is predicted to end, agreed
    across ranks (each rank's prediction rides on the train step's all-reduce; their mean is used, and never
    goes down). A step is placed at the larger of its own step and that share of the `total` steps planned,
    at most the last: a step predicted to end at or past the budget gets the final LR, and is the last
    (`spent`). A session's first step is predicted from the checkpoint's elapsed_s and the plan's step, the same
    on every rank."""

    def __init__(self, tc: TrainConfig, total: int, elapsed_before: float):
        self.seconds, self.total = tc.budget.max_minutes * 60, total
        self.planned_step_seconds = tc.budget.step_seconds
        self.fraction = (elapsed_before + tc.budget.step_seconds) / self.seconds
        self.local = self.fraction  # this rank's prediction for the next step, before agreement
        self.recent: list[float] | None = None  # this session's last steps' seconds, from its second step on

    def step_starts(self, elapsed: float) -> None:
        """At a step's start, `elapsed` into the run: predict where the step after it ends (two steps on)."""
        if self.recent:  # the step about to run like the latest, if slower, and the one after like the median
            median = statistics.median(self.recent)
            self.local = (elapsed + max(median, self.recent[-1]) + median) / self.seconds
        else:
            self.local = (elapsed + 2 * self.planned_step_seconds) / self.seconds

    def step_took(self, seconds: float) -> None:
        """A session's first step (compilation, warm-up) predicts nothing; the later ones predict the next."""
        if self.recent is None:
            self.recent = []
        else:
            self.recent = [*self.recent, seconds][-PREDICT_FROM_STEPS:]

    def schedule_step(self, step: int) -> float:
        """The schedule position of the update made at `step`."""
        return min(self.total - 1, max(step, self.fraction * self.total - 1))

    def agree(self, agreed: float) -> bool:
        """After a step, with the ranks' agreed prediction: whether that step was the budget's last."""
        spent = self.fraction >= 1
        self.fraction = max(self.fraction, agreed)
        return spent
