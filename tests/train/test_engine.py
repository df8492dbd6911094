"""The engine around the loop: crash/kill/signal resume, phases and their summaries, stop conditions,
non-finite steps, milestones and the mirror, auto-batch, schedules and `burnout plan` (torchrun's runs are
in test_distributed.py)."""

import json
import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import safetensors.torch
import torch
import yaml

from burnout.base.files import PHASES_FILE, RESUMES_FILE
from burnout.cli import main
from burnout.config import load_run_config
from burnout.core.checkpoint import list_checkpoints
from burnout.errors import BurnoutError
from burnout.models import Transformer
from burnout.runs import resume_training, start_training
from burnout.train.forecast import forecast_loss
from burnout.train.metrics import TIMING_KEYS, read_metrics
from burnout.train.plan import plan_run
from burnout.train.probe import largest_micro_batch, oom_message
from burnout.train.schedule import lr_at, total_steps

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _quiet(line):
    pass


def _weights(checkpoint):
    return safetensors.torch.load_file(checkpoint / "model.safetensors")


def _assert_same_weights(a, b):
    a, b = _weights(a), _weights(b)
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def _without_timing(records):
    return [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in records]


def _env():
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": REPO}


# ----------------------------------------------------------------------------------------------
# Exact resume after SIGKILL and SIGTERM


@pytest.mark.slow
def test_sigkill_mid_run_then_resume_is_bitwise_identical(tiny_run, tmp_path):
    """A real process killed with SIGKILL between checkpoints (after step 16, the last checkpoint at 12)."""
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(tiny_run.cfg.to_dict()))
    run_b = tmp_path / "b"
    driver = textwrap.dedent(f"""
        import os, signal
        from burnout.config import load_run_config
        from burnout.runs import start_training

        def on_event(line):
            if line.startswith("step 16/"):
                os.kill(os.getpid(), signal.SIGKILL)

        start_training(load_run_config({str(config)!r}), {str(run_b)!r}, data_dir={str(tiny_run.data_dir)!r},
                       on_event=on_event, progress=False)
    """)
    proc = subprocess.run([sys.executable, "-c", driver], env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert [p.name for p in list_checkpoints(run_b)] == ["step_0000006", "step_0000012"]
    assert read_metrics(run_b)[-1]["step"] == 16  # logged past the last checkpoint

    result = resume_training(run_b, [], on_event=_quiet, progress=False)
    assert result.step == 24 and result.stop_reason == "done"
    for step in (18, 24):
        name = f"checkpoints/step_{step:07d}"
        _assert_same_weights(tiny_run.run_dir / name, run_b / name)
    assert _without_timing(read_metrics(run_b)) == _without_timing(read_metrics(tiny_run.run_dir))


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_sigterm_and_sigint_save_a_checkpoint_and_stop_cleanly(tiny_run, tmp_path, sig):
    run_b = tmp_path / "b"
    events = []
    before = signal.getsignal(signal.SIGINT)  # Python's default, or SIG_IGN under a shell's background job

    def on_event(line):
        events.append(line)
        if line.startswith("step 14/"):
            # Arrives after step 14's checks: the loop finishes step 15, logs, evaluates, checkpoints, stops.
            os.kill(os.getpid(), sig)

    result = start_training(tiny_run.cfg, run_b, data_dir=tiny_run.data_dir, on_event=on_event, progress=False)
    assert result.stop_reason == "signal" and result.step == 15
    assert list_checkpoints(run_b)[-1].name == "step_0000015"
    assert "val_loss" in read_metrics(run_b)[-1]
    assert any("--resume" in line for line in events)
    # The handlers are restored: the test process still reacts to SIGINT as it did before.
    assert signal.getsignal(signal.SIGINT) is before

    result = resume_training(run_b, [], on_event=_quiet, progress=False)
    assert result.step == 24
    _assert_same_weights(tiny_run.run_dir / "checkpoints/step_0000024", run_b / "checkpoints/step_0000024")
    records = read_metrics(run_b)
    assert [r["step"] for r in records] == [2, 4, 6, 8, 10, 12, 14, 15, 16, 18, 20, 22, 24]
    assert _without_timing([r for r in records if r["step"] != 15]) == _without_timing(read_metrics(tiny_run.run_dir))


# ----------------------------------------------------------------------------------------------
# Phases


def test_phases_stop_with_a_summary_and_resume_continues(tiny_run_config, tiny_bpe_data, tmp_path):
    phases = "train.phases=[{name: smoke, steps: 6, budget: 0.5}, {name: main, steps: 12, budget: 1}]"
    cfg = tiny_run_config([phases], hardware="cpu", price_per_hour=3.0, keep_last=1, ckpt_interval=100)
    run = tmp_path / "run"
    events = []
    result = start_training(cfg, run, data_dir=tiny_bpe_data, on_event=events.append, progress=False)
    assert (result.stop_reason, result.phase, result.step) == ("phase", "smoke", 6)
    assert any(line.startswith("phase 'smoke' done at step 6") and "$" in line for line in events)
    assert any(line.startswith("next phase 'main'") for line in events)
    summary = json.loads((run / PHASES_FILE).read_text().splitlines()[0])
    assert summary["phase"] == "smoke" and summary["step"] == 6 and summary["budget"] == 0.5
    assert summary["dollars"] == pytest.approx(summary["phase_seconds"] / 3600 * 3.0, rel=1e-3)
    assert summary["next"]["phase"] == "main" and summary["next"]["tokens"] == 12 * 4 * 32

    record = read_metrics(run)[-1]
    assert record["dollars"] == pytest.approx(record["elapsed_s"] / 3600 * 3.0, rel=1e-3)
    assert 0 < record["mfu"] < 1 and record["eta_s"] == 0

    result = resume_training(run, [], on_event=_quiet, progress=False)
    assert (result.stop_reason, result.phase, result.step) == ("done", "main", 12)
    # Phase ends are kept although keep_last is 1.
    assert [p.name for p in list_checkpoints(run)] == ["step_0000006", "step_0000012"]

    # The same 12 steps without phases: identical weights (phases change where it stops, nothing else).
    plain = tmp_path / "plain"
    start_training(tiny_run_config(), plain, data_dir=tiny_bpe_data, on_event=_quiet, progress=False)
    _assert_same_weights(list_checkpoints(plain)[-1], run / "checkpoints/step_0000012")


def test_phase_validation(tiny_run_config):
    with pytest.raises(BurnoutError, match=r"train.phases\[1\].steps: 5 must exceed"):
        tiny_run_config(["train.phases=[{name: a, steps: 6}, {name: b, steps: 5}]"])
    with pytest.raises(BurnoutError, match="train.max_steps: 12 ends before the last phase"):
        tiny_run_config(["train.phases=[{name: a, steps: 20}]"])


def test_power_law_forecast_recovers_a_known_curve():
    tokens = np.linspace(1e6, 1e8, 60)
    losses = 2.0 + 40.0 * tokens**-0.3 + np.random.default_rng(0).normal(0, 0.01, 60)
    f = forecast_loss(tokens, losses, 4e8)
    truth = 2.0 + 40.0 * 4e8**-0.3
    assert f["low"] <= f["loss"] <= f["high"]
    assert abs(f["loss"] - truth) < 0.05
    assert forecast_loss(tokens[:3], losses[:3], 4e8) is None


# ----------------------------------------------------------------------------------------------
# Stop conditions, non-finite steps, memory


def test_max_minutes_stops_after_one_step_with_eval_and_checkpoint_in_bf16(tiny_run_config, tiny_bpe_data, tmp_path):
    cfg = tiny_run_config(max_minutes=1e-9, precision="bf16")
    result = start_training(cfg, tmp_path / "run", data_dir=tiny_bpe_data, on_event=_quiet, progress=False)
    assert (result.stop_reason, result.step) == ("time", 1)
    assert np.isfinite(result.val_loss) and list_checkpoints(tmp_path / "run")[-1].name == "step_0000001"


def test_token_and_epoch_limits_end_the_run_and_its_schedule(tiny_run_config):
    tc = tiny_run_config(max_tokens=1000, max_epochs=None).train
    assert total_steps(tc, 128, 10**6) == 8  # ceil(1000 / 128)
    tc = tiny_run_config(max_epochs=0.5).train
    assert total_steps(tc, 128, 1280) == 5
    assert total_steps(tiny_run_config().train, 128, 10**6) == 12
    assert lr_at(7, tc, 8) < lr_at(6, tc, 8)


def test_schedules():
    from burnout.config import OptimConfig, TrainConfig

    linear = TrainConfig(max_steps=110, optim=OptimConfig(lr=1e-3, min_lr=0.0, warmup_steps=10, schedule="linear"))
    assert lr_at(60, linear) == pytest.approx(0.5e-3) and lr_at(110, linear) == pytest.approx(0.0)
    wsd = TrainConfig(max_steps=100, optim=OptimConfig(lr=1e-3, min_lr=1e-4, warmup_steps=10, schedule="wsd",
                                                       decay_fraction=0.2))
    assert lr_at(10, wsd) == lr_at(80, wsd) == pytest.approx(1e-3)  # stable until the last 20%
    assert lr_at(90, wsd) == pytest.approx(5.5e-4) and lr_at(100, wsd) == pytest.approx(1e-4)


def _nan_on(monkeypatch, calls):
    """Make the model's training loss NaN on the given forward calls (1-based): a numerical blow-up."""
    forward = Transformer.forward
    count = {"n": 0}

    def patched(self, idx, targets=None, cache=None):
        out = forward(self, idx, targets, cache)
        if targets is not None and self.training:
            count["n"] += 1
            if count["n"] in calls:
                return out * float("nan")
        return out

    monkeypatch.setattr(Transformer, "forward", patched)


def test_a_nan_step_is_skipped_and_counted(tiny_run_config, tiny_bpe_data, tmp_path, monkeypatch):
    _nan_on(monkeypatch, {5})  # step 5 (one micro-batch per step)
    events = []
    # train.step_seconds: no step timed for the plan before step 1, whose forward calls would count here.
    result = start_training(tiny_run_config(step_seconds=1.0), tmp_path / "run", data_dir=tiny_bpe_data,
                            on_event=events.append, progress=False)
    assert result.step == 12 and result.skipped_steps == 1 and np.isfinite(result.train_loss)
    assert any("step 5" in line and "update skipped" in line for line in events)
    records = {r["step"]: r for r in read_metrics(tmp_path / "run")}
    assert records[4]["skipped_steps"] == 0 and records[6]["skipped_steps"] == 1


def test_repeated_nans_stop_the_run_with_the_last_good_checkpoint_intact(tiny_run_config, tiny_bpe_data, tmp_path,
                                                                         monkeypatch):
    _nan_on(monkeypatch, set(range(8, 100)))
    run = tmp_path / "run"
    with pytest.raises(BurnoutError, match=r"not finite for 3 steps in a row \(up to step 10\).*step_0000006"):
        start_training(tiny_run_config(max_bad_steps=3, step_seconds=1.0), run, data_dir=tiny_bpe_data,
                       on_event=_quiet, progress=False)  # no step timed for the plan (_nan_on counts its forwards)
    assert [p.name for p in list_checkpoints(run)] == ["step_0000006"]


def test_out_of_memory_becomes_one_line_naming_the_micro_batch(tiny_run_config, tiny_bpe_data, tmp_path, monkeypatch):
    def oom(self, *args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(Transformer, "forward", oom)
    with pytest.raises(BurnoutError) as info:
        start_training(tiny_run_config(batch_size=4, grad_accum=2), tmp_path / "run", data_dir=tiny_bpe_data,
                       on_event=_quiet, progress=False)
    assert str(info.value) == oom_message(tiny_run_config(batch_size=4, grad_accum=2).train, 32)
    assert "train.batch_size=2 train.grad_accum=4" in str(info.value) and "\n" not in str(info.value)


def test_auto_batch_picks_the_largest_divisor_that_fits(tiny_run_config, tiny_bpe_data, tmp_path):
    tried = []

    def fits(b):
        tried.append(b)
        return b <= 5

    assert largest_micro_batch(24, fits) == 4 and tried == [24, 12, 8, 6, 4]
    with pytest.raises(BurnoutError, match="not even a micro-batch of one"):
        largest_micro_batch(8, lambda b: False)
    # On this CPU everything fits: 2 × 4 becomes 8 × 1, the same tokens per step, recorded in config.yaml.
    cfg = tiny_run_config(batch_size=2, grad_accum=4)
    events = []
    result = start_training(cfg, tmp_path / "run", data_dir=tiny_bpe_data, on_event=events.append, progress=False,
                            auto_batch=True)
    saved = load_run_config(tmp_path / "run" / "config.yaml").train
    assert (saved.batch_size, saved.grad_accum) == (8, 1) and result.tokens == 12 * 8 * 32
    assert any(line.startswith("auto-batch: micro-batch 8 × accumulation 1") for line in events)


def test_the_real_probe_counts_an_out_of_memory_step_as_not_fitting(tiny_run_config, tiny_bpe_data, tmp_path,
                                                                     monkeypatch):
    """The probe's own trial steps: one that runs out of memory (here: any micro-batch above 4, as a small GPU
    would) is a batch that does not fit, and the run trains at the largest divisor that did."""
    from burnout.train import probe
    from burnout.train.step import TrainStep

    real_call, tried = TrainStep.__call__, []

    def small_device(self, batches, *args, **kwargs):
        if isinstance(batches, probe.RandomBatches):
            tried.append(batches.batch_size)
            if batches.batch_size > 4:
                raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return real_call(self, batches, *args, **kwargs)

    monkeypatch.setattr(TrainStep, "__call__", small_device)
    fits = probe.memory_probe(tiny_run_config(), torch.device("cpu"), "fp32", 32)
    assert (fits(8), fits(4), fits(1)) == (False, True, True)
    events = []
    start_training(tiny_run_config(batch_size=2, grad_accum=4), tmp_path / "run", data_dir=tiny_bpe_data,
                   on_event=events.append, progress=False, auto_batch=True)
    saved = load_run_config(tmp_path / "run" / "config.yaml").train
    assert (saved.batch_size, saved.grad_accum) == (4, 2) and 8 in tried
    assert any(line.startswith("auto-batch: micro-batch 4 × accumulation 2") for line in events)


# ----------------------------------------------------------------------------------------------
# Milestones, mirror, resume records


def test_milestones_survive_pruning_and_the_mirror_holds_every_kept_checkpoint(tiny_run_config, tiny_bpe_data,
                                                                              tmp_path):
    cfg = tiny_run_config(["train.milestones=[4]"], ckpt_interval=3, keep_last=1, mirror_dir=str(tmp_path / "mirror"))
    start_training(cfg, tmp_path / "run", data_dir=tiny_bpe_data, on_event=_quiet, progress=False)
    kept = [p.name for p in list_checkpoints(tmp_path / "run")]
    assert kept == ["step_0000004", "step_0000012"]
    mirrored = tmp_path / "mirror" / "checkpoints"
    assert sorted(p.name for p in mirrored.iterdir()) == kept
    for name in kept:
        for f in (tmp_path / "run" / "checkpoints" / name).iterdir():
            assert (mirrored / name / f.name).read_bytes() == f.read_bytes()


def test_resume_records_safe_overrides_and_refuses_another_tokenizer(tiny_run, tmp_path):
    import shutil

    run_b = tmp_path / "b"
    shutil.copytree(tiny_run.run_dir, run_b)
    resume_training(run_b, ["train.max_steps=26", "train.log_interval=1"], on_event=_quiet, progress=False)
    record = json.loads((run_b / RESUMES_FILE).read_text().splitlines()[-1])
    assert record["changed"] == {"train.max_steps": 26, "train.log_interval": 1}

    other_data = tmp_path / "data"
    shutil.copytree(tiny_run.data_dir, other_data)
    tok = json.loads((other_data / "tokenizer.json").read_text())
    tok["added_tokens"][0]["content"] = "<|other|>"
    (other_data / "tokenizer.json").write_text(json.dumps(tok))
    raw = yaml.safe_load((run_b / "config.yaml").read_text())
    raw["data"]["prepared_dir"] = str(other_data)
    (run_b / "config.yaml").write_text(yaml.safe_dump(raw))
    with pytest.raises(BurnoutError, match="holds other data than the run trained on"):
        resume_training(run_b, ["train.max_steps=30"], on_event=_quiet, progress=False)
    # A run launched before launches recorded their data's fingerprint: its checkpoint's tokenizer still tells.
    launches = [json.loads(line) for line in (run_b / "launches.jsonl").read_text().splitlines()]
    (run_b / "launches.jsonl").write_text("".join(json.dumps({k: v for k, v in launch.items() if k != "data"}) + "\n"
                                                  for launch in launches))
    with pytest.raises(BurnoutError, match="is not the tokenizer"):
        resume_training(run_b, ["train.max_steps=30"], on_event=_quiet, progress=False)


# ----------------------------------------------------------------------------------------------
# burnout plan


@pytest.mark.slow
def test_plan_for_the_1b_run_on_an_a100():
    plan = plan_run(load_run_config("gpuburnout-1b"), "a100-80gb", mfu=0.4, price_per_hour=1.45)
    assert plan["tokens_per_step"] == 131_072 and plan["precision"] == "bf16"
    assert [r["phase"] for r in plan["phases"]] == ["smoke-test", "proof-of-life", "long-run", "diminishing-returns"]
    assert [r["to_step"] for r in plan["phases"]] == [200, 10_000, 60_000, 90_000]
    assert [r["budget"] for r in plan["phases"]] == [5, 25, 100, 50]
    assert sum(r["tokens"] for r in plan["phases"]) == 90_000 * 131_072  # the blog's 11.8B tokens
    for r in plan["phases"]:
        expected_h = r["tokens"] * plan["flops_per_token"] / (312e12 * 0.4) / 3600
        assert r["hours"] == pytest.approx(expected_h) and r["dollars"] == pytest.approx(expected_h * 1.45)
    assert 6.5e9 < plan["flops_per_token"] < 7.5e9  # 6 × 1.04B plus attention at 2048


@pytest.mark.slow
def test_plan_cli(capsys):
    assert main(["plan", "gpuburnout-1b", "--gpu", "a100-80gb", "--mfu", "0.5"]) == 0
    out = capsys.readouterr().out
    assert "assumed MFU 50%" in out and "$1.45/device-hour" in out and "diminishing-returns" in out
    assert main(["plan", "gpuburnout-1b", "--gpu", "tpu-v9"]) == 2
    assert "hardware 'tpu-v9' is not in" in capsys.readouterr().err
    assert main(["plan", "gpuburnout-1b", "--mfu", "1.5"]) == 2
