"""A small trained run shared (read-only) by the evaluation and comparison tests."""

from pathlib import Path

import pytest

from burnout.runs import start_training


@pytest.fixture(scope="session")
def trained_run(tiny_run_config, tiny_bpe_data, tmp_path_factory) -> Path:
    """30 steps of the tiny 2-layer llama (context 128: long enough for any HellaSwag ending, short
    enough that many HellaSwag contexts are truncated on the left), checkpoints at steps 10, 20 and 30.

    Trained rather than random so that scores differ between checkpoints and log-likelihoods are not
    near-uniform ties. Tests must not modify this folder: copy it first.
    """
    cfg = tiny_run_config(["model.context_length=128"], max_steps=30, ckpt_interval=10, eval_interval=10, keep_last=10)
    run_dir = tmp_path_factory.mktemp("trained_run") / "run"
    start_training(cfg, run_dir, data_dir=tiny_bpe_data, on_event=lambda _: None, progress=False)
    return run_dir
