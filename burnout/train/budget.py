"""A run's time or dollar budget (train.max_minutes, train.max_dollars), and the plan every run says before it spends:
everything a budgeted run does that others do not, so the Trainer only asks it.

    settle_budget   before the plan: a dollar budget as the minutes it buys at the run's price per hour, a step's
                    seconds measured when train.step_seconds is not given and the seconds the command's start-up
                    took; config.yaml records them. A run without a budget has a step timed for its plan alone.
    spend_lines     what a session is about to spend, said before its first step: steps, time (and dollars at a
                    price), the run's tokens per parameter, a warning where they are far below what its size needs
    Budget          the lines that say what the budget plans and what a session reached; a resume refused when
                    its budget is spent
    TimeBudget      a session's steps on the LR schedule by the clock, and when the budget is spent

A budget covers the whole command: the clock starts when the command does (train/run.py), so data preparation, a
fine-tune's probe, the step measurement and the model's set-up count, and elapsed_s holds them. A time budget plans
its steps from a step's seconds in what the start-up left (schedule.budget_steps, which stays beside the run's other
ends in schedule.total_steps) and places each step on the schedule at the larger of its step and the share of that
time spent: when the machine slows down, warmup and decay still end at the budget, and the last step is at the
final LR. A run without a budget is placed by its step alone."""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Callable
from pathlib import Path

import torch

from burnout.base.text import format_count, format_duration
from burnout.config import RunConfig, TrainConfig
from burnout.errors import BurnoutError
from burnout.models.memory import param_counts
from burnout.train.distributed import DistContext, from_main, gather_to_main
from burnout.train.hardware import hardware_price
from burnout.train.plan import cost_words, tokens_per_parameter_note
from burnout.train.probe import measure_step_seconds
from burnout.train.recipe import Recipe
from burnout.train.schedule import budget_steps, lr_at

# A time budget predicts a step's seconds by the median of the session's last few: on a busy machine neighbouring
# steps differ widely (docs/PERFORMANCE.md). The step about to run is predicted by the latest step where that took
# longer: the median of five alone follows a sudden slowdown only after three steps, each over the budget.
PREDICT_FROM_STEPS = 5
# A run without a time budget times this many steps (after a warm-up step) for the plan it says before its first
# step: it plans nothing by them, so fewer than a budget's six keep the added start-up short (docs/USAGE.md).
PLAN_PROBE_STEPS = 2


@dataclasses.dataclass(frozen=True)
class StepTime:
    """A step's seconds for the plan a run says before its first step (spend_lines), and where they come from
    ("measured", "train.step_seconds"); `seconds` None where no step could be timed."""
    seconds: float | None
    how: str


def settle_budget(cfg: RunConfig, data_dir: Path, recipe: Recipe, device: torch.device, precision: str,
                  dist: DistContext, spent: Callable[[], float],
                  resumed: bool = False) -> tuple[RunConfig, Budget | None, StepTime]:
    """`cfg` with its budget in minutes, a step's seconds and its start-up's (train.max_minutes, train.step_seconds,
    train.startup_seconds: `spent()`, the seconds since the command started, once the step is measured), and the
    Budget; None for a run without one. A `resumed` run keeps its plan: the first session's start-up, or none where
    its config.yaml holds a step's seconds but no start-up (a budget planned before start-ups counted), unless this
    session plans anew (a step measured now). Also the step time the run's plan says: the budget's own measurement,
    else one of PLAN_PROBE_STEPS steps. The same on every rank."""
    price = None
    if cfg.train.budget.max_dollars is not None:
        cfg, price = _dollars_to_minutes(cfg, device, dist)
    budget = cfg.train.budget
    if budget.max_minutes is None:
        if budget.step_seconds is not None:
            return cfg, None, StepTime(budget.step_seconds, "train.step_seconds")
        return cfg, None, _plan_step(cfg, data_dir, recipe, device, precision, dist)
    measured = budget.step_seconds is None
    if measured:
        cfg = _measure_step(cfg, data_dir, recipe, device, precision, dist)
    if cfg.train.budget.startup_seconds is None and (measured or not resumed):
        cfg = _with_budget(cfg, startup_seconds=float(f"{from_main(spent(), dist):.4g}"))
    step_time = StepTime(cfg.train.budget.step_seconds, "measured" if measured else "train.step_seconds")
    return cfg, Budget(cfg.train, price, measured), step_time


def _with_budget(cfg: RunConfig, **settings) -> RunConfig:
    """`cfg` with these train.budget settings."""
    budget = dataclasses.replace(cfg.train.budget, **settings)
    return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, budget=budget))


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
    return _with_budget(cfg, max_minutes=minutes), price


def _measure_step(cfg: RunConfig, data_dir: Path, recipe: Recipe, device: torch.device, precision: str,
                  dist: DistContext) -> RunConfig:
    """A time budget plans its steps from a step's seconds: measured now on every rank (one rank's step,
    weights discarded), the slowest rank's kept in train.step_seconds, which config.yaml records."""
    seconds = _slowest_step(cfg, data_dir, recipe, device, precision, dist)
    if seconds is None:
        raise BurnoutError("train.max_minutes: timing a step for the plan ran out of memory (it runs one rank's "
                           "copy of the model); give the seconds a step takes as train.step_seconds")
    return _with_budget(cfg, step_seconds=seconds)


def _plan_step(cfg: RunConfig, data_dir: Path, recipe: Recipe, device: torch.device, precision: str,
               dist: DistContext) -> StepTime:
    """The step time of a run without a budget, for its plan alone: PLAN_PROBE_STEPS steps timed as a budget times
    six. Not under FSDP over several devices, whose probe would hold one rank's whole copy of a model that may fit
    only sharded (None then, and where a rank's copy ran out of memory: the plan then says no time)."""
    if dist.enabled and cfg.train.perf.distributed == "fsdp":
        return StepTime(None, "not timed under FSDP")
    seconds = _slowest_step(cfg, data_dir, recipe, device, precision, dist, steps=PLAN_PROBE_STEPS)
    return StepTime(seconds, "measured" if seconds is not None else "not timed: one rank's copy ran out of memory")


def _slowest_step(cfg: RunConfig, data_dir: Path, recipe: Recipe, device: torch.device, precision: str,
                  dist: DistContext, steps: int | None = None) -> float | None:
    """A step's seconds measured on every rank (probe.measure_step_seconds: its default steps, or `steps`), the
    slowest rank's, to 4 digits; None on every rank where any rank's copy of the model ran out of memory."""
    try:
        seconds = measure_step_seconds(cfg, data_dir, recipe, device, precision,
                                       **({"steps": steps} if steps is not None else {}))
    except torch.OutOfMemoryError:
        seconds = None
    everyone = gather_to_main(seconds, dist)
    slowest = None if everyone is None or None in everyone else float(f"{max(everyone):.4g}")
    return from_main(slowest, dist)


def spend_lines(cfg: RunConfig, step_time: StepTime, start: int, stop: int, end: int, tokens_per_step: int,
                train_tokens: int, price: float | None) -> list[str]:
    """What a session is about to spend, said before its first step: its steps (`start` → `stop`, of the run's
    `end`), their time at `step_time` (and dollars at `price` per hour, all devices), the run's tokens, its passes over
    the `train_tokens` of its data and, for a model trained from scratch, its tokens per parameter with a warning
    where they are far below what its size needs (plan.tokens_per_parameter_note). A fine-tune is told its passes
    alone: it starts from a trained model, whose pretraining is what the tokens-per-parameter rule is about."""
    line = f"plan: steps {start:,} → {stop:,}" + (f" of {end:,}" if stop != end else "")
    seconds = step_time.seconds
    if seconds is None:
        line += f" ({step_time.how}: the time shows once steps run)"
    else:
        line += f", about {cost_words((stop - start) * seconds, price)} at {seconds:.3g} s a step ({step_time.how})"
        line += f"; to step {end:,} about {cost_words((end - start) * seconds, price)}" if stop != end else ""
    tokens, note = end * tokens_per_step, None
    passes = f"{tokens / train_tokens:.2g} passes over the train data" if train_tokens else "no train data"
    if cfg.fine_tune is not None:
        line += f"; the run: {passes} (a fine-tune: tokens per parameter do not apply)"
    else:
        params = param_counts(cfg.model).total
        words, note = tokens_per_parameter_note(tokens, params, from_scratch=not cfg.train.init_from)
        line += f"; the run: {format_count(tokens)} tokens, {passes}, {words}"
    return [line, *([note] if note else [])]


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
        """The line that says what a time budget plans: its steps in what the start-up left, and where the LR schedule
        ends (`end_of_run`)."""
        budget = self.tc.budget
        planned = budget_steps(budget.max_minutes, budget.step_seconds, budget.startup_seconds or 0.0)
        how = "measured" if self.measured else "train.step_seconds"
        line = f"budget {self.words()}: {how} {budget.step_seconds:.3g} s/step → "
        if planned == end_of_run:
            line += f"planning {planned:,} steps; the LR schedule ends at the budget"
        else:
            line += (f"{planned:,} steps would fit; the run ends at step {end_of_run:,} first (about "
                     f"{format_duration(end_of_run * budget.step_seconds)}), and so does the LR schedule, or at the "
                     "budget if the steps slow down")
        startup = budget.startup_seconds or 0.0
        line += (f"; the start-up (data, probe, step timing) took "
                 f"{format_duration(startup) if startup >= 60 else f'{startup:.2g} s'} of it")
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

    def session(self, end_of_run: int, elapsed: float) -> TimeBudget:
        """The clock of a session whose first step starts `elapsed` seconds into the run (its start-up counted)."""
        return TimeBudget(self.tc, end_of_run, elapsed)

    def end_line(self, elapsed: float, step: int, end_of_run: int, lr: float) -> str:
        """What a time-budgeted session reached: its minutes and steps against the plan, and the LR of its last step
        against the schedule's last."""
        final = lr_at(end_of_run - 1, self.tc, end_of_run)
        return (f"budget {self.words()}: {format_duration(elapsed)} trained, step {step:,} of "
                f"{end_of_run:,} planned; the last step's LR {lr:.2e} (the schedule's final value {final:.2e})")


class TimeBudget:
    """Where a time-budgeted run's steps sit on its schedule, and when its budget is spent.

    The steps were planned in the time the first session's start-up left (train.startup_seconds to the budget's
    end): `fraction` is the share of that time at whose end the step about to run is predicted to end, agreed
    across ranks (each rank's prediction rides on the train step's all-reduce; their mean is used, and never
    goes down). A step is placed at the larger of its own step and that share of the `total` steps planned,
    at most the last: a step predicted to end at or past the budget gets the final LR, and is the last
    (`spent`). A session's first step is predicted from `elapsed` (the checkpoint's elapsed_s and this session's
    start-up) and the plan's step, the same on every rank."""

    def __init__(self, tc: TrainConfig, total: int, elapsed: float):
        budget = tc.budget
        self.start, self.total = budget.startup_seconds or 0.0, total
        # A start-up that took the whole budget leaves its one planned step a step's time.
        self.seconds = max(budget.max_minutes * 60 - self.start, budget.step_seconds)
        self.planned_step_seconds = budget.step_seconds
        self.fraction = (elapsed - self.start + budget.step_seconds) / self.seconds
        self.local = self.fraction  # this rank's prediction for the next step, before agreement
        self.recent: list[float] | None = None  # this session's last steps' seconds, from its second step on

    def step_starts(self, elapsed: float) -> None:
        """At a step's start, `elapsed` into the run: predict where the step after it ends (two steps on)."""
        elapsed -= self.start
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
