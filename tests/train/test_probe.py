"""The step probe a time budget plans with (burnout/train/probe.py)."""

import time

import pytest
import torch

from burnout.train import probe

pytestmark = pytest.mark.slow  # every test here trains, installs or drives a browser: not in `make test-fast`


def test_a_budget_plans_with_the_fastest_step_timed(tiny_run_config, tiny_bpe_data, monkeypatch):
    """Of the six timed steps (after a warm-up step), the fastest is the plan's: the clock places steps slower than
    it, and a plan from a slower step ends the run early when the machine speeds up (red with the median)."""
    seconds = iter([0.5, 0.4, 0.4, 0.05, 0.4, 0.4, 0.4])

    class TimedStep:
        def __init__(self, *args, **kwargs):
            pass

        def __call__(self, loader, step):
            time.sleep(next(seconds))

    monkeypatch.setattr(probe, "TrainStep", TimedStep)
    measured = probe.measure_step_seconds(tiny_run_config(), tiny_bpe_data, device=torch.device("cpu"),
                                          precision="fp32")
    assert 0.05 <= measured < 0.3
    assert next(seconds, None) is None  # all seven steps ran
