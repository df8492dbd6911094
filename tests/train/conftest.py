"""A tiny training run, made once per session and shared (read-only) by the training tests."""

from dataclasses import dataclass
from pathlib import Path

import pytest

from burnout.config import RunConfig
from burnout.train.loop import TrainResult
from burnout.train.run import start_training

RUN_STEPS = 24
CKPT_INTERVAL = 6


@dataclass
class TinyRun:
    cfg: RunConfig  # the config as passed to start_training
    run_dir: Path
    data_dir: Path
    result: TrainResult
    events: list[str]


@pytest.fixture(scope="session")
def tiny_run(tiny_run_config, tiny_bpe_data, tmp_path_factory) -> TinyRun:
    """24 steps of a 2-layer llama, batch 4 × accumulation 2 × 32 tokens, a checkpoint every 6 steps, all kept.

    Tests must not modify this folder: copy it first.
    """
    cfg = tiny_run_config(max_steps=RUN_STEPS, grad_accum=2, ckpt_interval=CKPT_INTERVAL, keep_last=100)
    run_dir = tmp_path_factory.mktemp("tiny_run") / "run"
    events: list[str] = []
    result = start_training(cfg, run_dir, data_dir=tiny_bpe_data, on_event=events.append, progress=False)
    return TinyRun(cfg, run_dir, tiny_bpe_data, result, events)
