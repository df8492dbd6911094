"""What the tests of the training engine share: a clock that moves by the train steps alone."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace

import pytest

from burnout.train import loop, probe
from burnout.train.step import TrainStep


class StepClock:
    """The training loop's and the step probe's clock (loop.time, probe.time), moved at each train step whatever the
    step really took, and by what a test adds to `now`, so that nothing timed depends on the machine's speed: by
    `seconds(step)` at each of the run's steps (the loop's, which ask for the stop flags), by `probe_seconds` at each
    of the probe's (`seconds(step)` when not given), which it counts."""

    def __init__(self, monkeypatch, seconds: Callable[[int], float], probe_seconds: float | None = None):
        self.now, self.probe_steps, real_call = 0.0, 0, TrainStep.__call__

        def timed_call(train_step, loader, step, *args, **kwargs):
            result = real_call(train_step, loader, step, *args, **kwargs)
            if kwargs.get("flags") is not None:
                self.now += seconds(step)
            else:
                self.now += seconds(step) if probe_seconds is None else probe_seconds
                self.probe_steps += 1
            return result

        monkeypatch.setattr(TrainStep, "__call__", timed_call)
        clock = SimpleNamespace(perf_counter=lambda: self.now)
        monkeypatch.setattr(loop, "time", clock)
        monkeypatch.setattr(probe, "time", clock)


@pytest.fixture
def step_clock(monkeypatch) -> Callable[..., StepClock]:
    """StepClock(seconds, probe_seconds=None), its settings undone after the test."""
    return lambda seconds, probe_seconds=None: StepClock(monkeypatch, seconds, probe_seconds)
