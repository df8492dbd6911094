"""`burnout ladder` (burnout/train/ladder.py) and a plan made from it: a ladder killed (SIGKILL) in the middle of a rung
and run again with the same command ends with the same ladder.json, bitwise, as the same design run without a stop (CPU
runs resume bitwise); its rungs are ordinary run folders; a ladder of another budget is refused there; and a plan for a
half-minute budget on this CPU, written with --write-config and trained with `burnout train`, lands inside its interval,
which `burnout report` says beside the final val loss, with the ladder's plot.

Slow (all but the budget's conversion): a ladder is a minute and a half of training plus its fit, done twice, then
the planned run."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from burnout.base.folders import OWNER_FILE
from burnout.base.text import format_count
from burnout.cli import main
from burnout.train import scaling
from burnout.train.hardware import hardware_table
from burnout.train.ladder import LADDER_FILE, PLOT_FILE, STEP_SHARE, ladder_budget
from burnout.train.plan import plan_config, plan_run
from burnout.train.provenance import read_launches
from burnout.train.scaling import ScalingLaw

REPO = Path(__file__).resolve().parents[2]
# One thread in every process: the killed ladder, its continuation and the uninterrupted one compute alike.
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
MINUTES = "1.5"  # enough for the seven rungs a fit needs on a machine four times slower than a quiet 2-core one
SEQ_LEN = 64  # a quarter of the default: four times the steps in the test's minute


def _ladder(data: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "burnout", "ladder", str(data), "--out", str(out), "--minutes", MINUTES,
            "--seq-len", str(SEQ_LEN)]


def _read(out: Path) -> dict:
    return json.loads((out / LADDER_FILE).read_text())


@pytest.fixture(scope="module")
def ladder_data(tmp_path_factory) -> Path:
    """1.5M characters of the embedded corpus with tiny_bpe_data's 512-token BPE: about 0.7M train tokens, so the
    planned half-minute run reads them two or three times, not the 25 times tiny_bpe_data's 72K would be read, past
    where repeats are worth fresh tokens (scaling.fresh_tokens) or a model this small stops learning them by heart."""
    from burnout.config import DataConfig, TokenizerConfig
    from burnout.data.prepare import prepare_data

    out = tmp_path_factory.mktemp("ladder_data")
    prepare_data(DataConfig(max_chars=1_500_000), TokenizerConfig(kind="bpe", vocab_size=512), out)
    return out


@pytest.fixture(scope="module")
def killed(ladder_data, tmp_path_factory) -> dict:
    """A ladder SIGKILLed once its third rung has written a checkpoint, then the same command run again."""
    root = tmp_path_factory.mktemp("ladders")
    out, log = root / "killed", root / "killed.log"
    with open(log, "w") as sink:  # a file, not a pipe that nobody reads while the ladder runs
        proc = subprocess.Popen(_ladder(ladder_data, out), stdout=sink, stderr=subprocess.STDOUT, env=ENV)
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            assert proc.poll() is None, log.read_text()[-3000:]
            if (out / LADDER_FILE).is_file():
                third = _read(out)["design"]["rungs"][2]["name"]
                if list((out / "rungs" / third / "checkpoints").glob("step_*")):
                    break
            time.sleep(0.02)
        else:
            pytest.fail(f"the third rung wrote no checkpoint in 10 minutes: {log.read_text()[-3000:]}")
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait(timeout=60)
    at_kill = _read(out)
    again = subprocess.run(_ladder(ladder_data, out), capture_output=True, text=True, env=ENV, timeout=900)
    assert again.returncode == 0, again.stderr[-3000:]
    return {"out": out, "at_kill": at_kill, "third": third, "stdout": again.stdout}


@pytest.mark.slow
@pytest.mark.timeout(1800)  # with its fixture, three ladders of 1.5 minutes: 4 minutes quiet, 15 on a busy machine
def test_a_killed_ladder_run_again_ends_as_the_same_design_run_without_a_stop(killed, ladder_data, tmp_path):
    out, at_kill, third = killed["out"], killed["at_kill"], killed["third"]
    assert third not in at_kill["done"] and "fit" not in at_kill  # killed before its third rung was finished
    assert "continuing the ladder" in killed["stdout"]
    # The third rung was resumed from its checkpoint by its own resume: a second launch of the same run folder.
    assert len(read_launches(out / "rungs" / third)) == 2
    # The same design (step times are measured, so it is copied), run from its start without a stop.
    whole = tmp_path / "whole"
    whole.mkdir()
    shutil.copy(out / OWNER_FILE, whole / OWNER_FILE)
    (whole / LADDER_FILE).write_text(json.dumps({**at_kill, "done": {}}))
    done = subprocess.run(_ladder(ladder_data, whole), capture_output=True, text=True, env=ENV, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert _read(whole) == _read(out)
    ladder = _read(out)
    assert set(ladder["done"]) == {r["name"] for r in ladder["design"]["rungs"]}
    assert (out / PLOT_FILE).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # The rungs' planned steps fill the budget's share for steps (less the rungs under MIN_RUNG_STEPS, left out), each
    # level twice the FLOPs of the one below.
    planned = sum(r["steps"] * r["step_seconds"] for r in ladder["design"]["rungs"])
    assert 0.5 * float(MINUTES) * 60 * STEP_SHARE < planned <= float(MINUTES) * 60 * STEP_SHARE
    for r in ladder["design"]["rungs"]:
        assert r["flops"] == pytest.approx(ladder["design"]["base_flops"] * 2 ** r["level"], rel=0.1)
    # Held out: the top compute level, predicted by a fit of the others.
    top = {i for i, r in enumerate(ladder["design"]["rungs"]) if r["level"] == ladder["design"]["levels"] - 1}
    assert {r["index"] for r in ladder["fit"]["held_out"]["held_out"]} == top
    # Fitted at the fresh tokens each rung's D is worth on this data (scaling.fresh_tokens), repeats valued less.
    for row in ladder["fit"]["held_out"]["held_out"]:
        read = ladder["design"]["rungs"][row["index"]]["D"]
        assert row["D"] == pytest.approx(float(scaling.fresh_tokens(read, ladder["design"]["train_tokens"])))


@pytest.mark.slow
def test_each_rung_is_an_ordinary_run_folder(killed, capsys):
    ladder = _read(killed["out"])
    rung = ladder["design"]["rungs"][0]
    run = killed["out"] / ladder["done"][rung["name"]]["run"]
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    assert cfg["model"]["n_layer"] == rung["depth"] and cfg["train"]["max_steps"] == rung["steps"]
    assert main(["report", str(run), "--md"]) == 0
    assert f"val loss {ladder['done'][rung['name']]['val_loss']:.4f}" in capsys.readouterr().out


@pytest.mark.slow
def test_a_ladder_of_another_budget_is_refused_in_its_folder(killed, ladder_data, capsys):
    before = (killed["out"] / LADDER_FILE).read_bytes()
    assert main(["ladder", str(ladder_data), "--out", str(killed["out"]), "--minutes", "2", "--seq-len",
                 str(SEQ_LEN)]) == 2
    err = capsys.readouterr().err
    assert f"--out {killed['out']} holds a ladder of {MINUTES} minutes at --seq-len {SEQ_LEN}" in err
    assert len(err.splitlines()) == 1
    assert (killed["out"] / LADDER_FILE).read_bytes() == before


@pytest.mark.slow
def test_a_plan_for_half_a_minute_lands_inside_its_interval(killed, tmp_path, capsys):
    """The plan's run: about 30 s of steps on this CPU, the compute the ladder's fit extrapolates to. It proves the
    path from ladder to plan to run to report, and that this prediction held on this data; the benchmark
    (benchmarks/bench_ladder.py) measures it at a larger budget."""
    config, run = tmp_path / "planned.yaml", tmp_path / "run"
    assert main(["plan", "--minutes", "0.5", "--ladder", str(killed["out"]), "--write-config", str(config)]) == 0
    said = capsys.readouterr().out
    assert "predicted val loss" in said and "from the ladder" in said
    prediction = yaml.safe_load(config.read_text())["prediction"]
    assert prediction["source"] == "ladder" and prediction["low"] <= prediction["val_loss"] <= prediction["high"]
    assert main(["train", str(config), "--out", str(run)]) == 0
    capsys.readouterr()
    assert main(["report", str(run)]) == 0
    summary = capsys.readouterr().out
    assert "inside the interval" in summary, said + summary  # the plan's passes over the data are in `said`
    assert (run / "report" / "ladder.png").is_file()
    assert "## Predicted against achieved" in (run / "report" / "report.md").read_text()


@pytest.mark.slow
def test_a_named_model_is_told_its_predicted_loss_and_what_more_would_buy(killed, capsys):
    assert main(["plan", "llama-tiny", "--gpu", "h100", "--ladder", str(killed["out"])]) == 0
    out = capsys.readouterr().out
    law = ScalingLaw.from_dict(_read(killed["out"])["fit"]["law"])
    plan = plan_run(plan_config("llama-tiny"), "h100")
    n, d = plan["params"], sum(p["tokens"] for p in plan["phases"])
    assert f"predicted val loss of {format_count(n)} parameters × {format_count(d)} tokens" in out
    assert f"{law.loss(n, d):.3f} (90% interval" in out
    assert f"twice the tokens ({format_count(2 * d)}" in out and f"{law.loss(n, 2 * d):.3f}" in out
    assert "the compute-optimal shape for the same FLOPs" in out


def test_a_ladders_dollars_buy_minutes_at_the_gpus_price():
    budget = ladder_budget(None, 3, "h100", None)
    assert budget.minutes == pytest.approx(3 / hardware_table()["h100"]["price_per_hour"] * 60, rel=1e-5)
    assert ladder_budget(None, 3, None, 1.5).minutes == pytest.approx(120)
    assert ladder_budget(20, None, None, None).minutes == 20
