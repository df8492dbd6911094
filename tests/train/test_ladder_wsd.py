"""`burnout ladder --schedule wsd` (burnout/train/ladder.py): one warmup-stable run per size, each lower rung a decay
branched off it. The design's branch points and cost against a hand computation; then, on a small hand-made design
(two sizes, four levels): each branch reads the tokens designed, its LR is warmup-stable-decay as a hand computation
says, it ends exactly as a WSD run of its own length trained alone, and a ladder SIGKILLed at its first branch, or
stopped with a branch copied but not yet resumed and another's copy half made, ends as the one run without a stop.

Slow (all but the design's): the hand-made ladder is about half a minute of training, done three times."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from burnout.base.files import read_jsonl
from burnout.base.folders import OWNER_FILE
from burnout.config import load_saved_config
from burnout.data.shards import read_meta
from burnout.errors import BurnoutError
from burnout.models.info import model_info
from burnout.train import ladder as ladders
from burnout.train.ladder import (
    LADDER_FILE,
    LEVELS,
    MIN_RUNG_STEPS,
    STEP_SHARE,
    LadderBudget,
    branched,
    copy_branch_point,
    design,
    dial_shape,
    ladder_budget,
    shape_run_config,
    trained_steps,
)
from burnout.train.provenance import read_launches
from burnout.train.recipe import Pretraining
from burnout.train.run import start_run

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
SEQ_LEN = 64
TOKENS_PER_STEP = 8 * SEQ_LEN
# The hand-made design: each depth's steps at the lowest level, doubled at each level above.
BASE_STEPS = {1: 24, 2: 20}
BUDGET = ladder_budget(1, None, None, None, SEQ_LEN, "wsd")  # what the CLI's `--minutes 1 --seq-len 64` gives


def _fixed_rate(monkeypatch, seconds_per_flop: float) -> None:
    """Every depth's step time at one FLOP rate, instead of measuring it."""
    def measure(data_dir, depths, vocab, seq_len, say, measured):
        return {d: seconds_per_flop * ladders._info(d, vocab, seq_len)["flops_per_token"] * 8 * seq_len
                for d in depths}
    monkeypatch.setattr(ladders, "_measure", measure)


def test_a_wsd_design_branches_each_lower_rung_where_its_decay_starts_and_buys_a_larger_c0(tiny_bpe_data, monkeypatch):
    _fixed_rate(monkeypatch, 2e-11)
    wsd = design(tiny_bpe_data, BUDGET, lambda line: None)
    linear = design(tiny_bpe_data, dataclasses.replace(BUDGET, schedule="linear"), lambda line: None)
    assert wsd["depths"] == linear["depths"] and wsd["schedule"] == "wsd" and wsd["decay_fraction"] == 0.2
    # A size costs its top level and three decays of a fifth: 8 + 0.2·(1 + 2 + 4) = 9.4 units against 1 + 2 + 4 + 8.
    assert wsd["base_flops"] / linear["base_flops"] == pytest.approx(15 / 9.4)
    names = {r["name"]: r for r in wsd["rungs"]}
    branches = [r for r in wsd["rungs"] if "trunk" in r]
    assert branches and all(r["steps"] >= MIN_RUNG_STEPS for r in wsd["rungs"])
    for r in branches:
        trunk = names[r["trunk"]]
        assert (trunk["depth"], trunk["level"]) == (r["depth"], LEVELS - 1) and r["level"] < LEVELS - 1
        # The branch reads its own designed tokens, its last fifth in its decay, from a checkpoint its trunk keeps.
        assert r["D"] == r["steps"] * TOKENS_PER_STEP
        assert abs((r["steps"] - r["branch_step"]) - 0.2 * r["steps"]) <= 0.5
        assert r["branch_step"] in trunk["milestones"] and r["branch_step"] < trunk["steps"] * 0.8
    # The steps the rungs train (a branch: its decay alone) fill the budget's share for steps, as separate runs do.
    for made in (wsd, linear):
        planned = sum(trained_steps(r) * r["step_seconds"] for r in made["rungs"])
        # (a decay's fifth rounds to whole steps: up to half a step more per branch)
        assert 0.5 * 60 * STEP_SHARE < planned <= 1.02 * 60 * STEP_SHARE


def _hand_design(data: Path) -> dict:
    """Two depths × LEVELS levels of BASE_STEPS·2^level steps (not isoFLOP: the branches are under test), as WSD."""
    vocab = read_meta(data)["vocab_size"]
    rungs = []
    for level in range(LEVELS):
        for depth, base in BASE_STEPS.items():
            info = model_info(dial_shape(depth, vocab, SEQ_LEN), seq_len=SEQ_LEN)
            steps = base * 2**level
            rungs.append({"name": f"d{depth}-c{level}", "depth": depth, "level": level, "steps": steps,
                          "N": info["params_total"], "D": steps * TOKENS_PER_STEP,
                          "flops": steps * TOKENS_PER_STEP * info["flops_per_token"], "step_seconds": 0.01})
    return branched({"family": "depth dial", "depths": list(BASE_STEPS), "levels": LEVELS, "seq_len": SEQ_LEN,
                     "seqs_per_step": 8, "vocab_size": vocab, "base_flops": rungs[0]["flops"],
                     "train_tokens": read_meta(data)["splits"]["train"]["tokens"], "rungs": rungs})


# Starts a ladder of a given design as `burnout ladder DATA --out OUT --minutes 1 --seq-len 64` would continue it.
START = """import json, sys
from burnout.train.ladder import ladder_budget, run_ladder
design = json.loads(open(sys.argv[3]).read())
run_ladder(sys.argv[1], sys.argv[2], ladder_budget(1, None, None, None, 64, "wsd"), design_=design)
"""


def _continue(data: Path, out: Path) -> dict:
    """The user's command run again on `out`: it continues the ladder there."""
    done = subprocess.run([sys.executable, "-m", "burnout", "ladder", str(data), "--out", str(out), "--schedule", "wsd",
                           "--minutes", "1",
                           "--seq-len", str(SEQ_LEN)], capture_output=True, text=True, env=ENV, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "continuing the ladder" in done.stdout
    return json.loads((out / LADDER_FILE).read_text())


@pytest.fixture(scope="module")
def ladders_made(tiny_bpe_data, tmp_path_factory) -> dict:
    """The hand-made design trained without a stop (`whole`), and SIGKILLed once its first branch's folder exists,
    then continued (`killed`)."""
    root = tmp_path_factory.mktemp("wsd_ladders")
    spec = root / "design.json"
    spec.write_text(json.dumps(_hand_design(tiny_bpe_data)))
    whole = subprocess.run([sys.executable, "-c", START, str(tiny_bpe_data), str(root / "whole"), str(spec)],
                           capture_output=True, text=True, env=ENV, timeout=900)
    assert whole.returncode == 0, whole.stderr[-3000:]
    out, log = root / "killed", root / "killed.log"
    with open(log, "w") as sink:
        proc = subprocess.Popen([sys.executable, "-c", START, str(tiny_bpe_data), str(out), str(spec)], stdout=sink,
                                stderr=subprocess.STDOUT, env=ENV)
    try:
        deadline = time.monotonic() + 600
        while not (out / "rungs" / "d1-c0").is_dir():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait(timeout=60)
    at_kill = json.loads((out / LADDER_FILE).read_text())
    return {"root": root, "whole": root / "whole", "killed": out, "at_kill": at_kill,
            "continued": _continue(tiny_bpe_data, out)}


def _ladder(path: Path) -> dict:
    return json.loads((path / LADDER_FILE).read_text())


@pytest.mark.slow
def test_each_branch_reads_the_tokens_designed_from_its_trunks_checkpoint(ladders_made):
    whole = ladders_made["whole"]
    ladder = _ladder(whole)
    for r in (r for r in ladder["design"]["rungs"] if "trunk" in r):
        run = whole / ladder["done"][r["name"]]["run"]
        last = json.loads(sorted((run / "checkpoints").glob("step_*"))[-1].joinpath("info.json").read_text())
        assert (last["step"], last["tokens"]) == (r["steps"], r["D"])
        # Launched twice: the trunk from step 0 (its log, copied), the branch from the trunk's step branch_step.
        assert [launch["step"] for launch in read_launches(run)] == [0, r["branch_step"]]
        trunk = whole / "rungs" / r["trunk"] / "checkpoints" / f"step_{r['branch_step']:07d}"
        assert trunk.is_dir()  # a milestone the trunk keeps


@pytest.mark.slow
def test_a_branchs_lr_is_warmup_stable_decay_as_a_hand_computation_says(ladders_made):
    """d1-c1: 48 steps branched off d1-c3 (192 steps, so 10 warmup steps) at step 38; lr 1e-2, min_lr 0. The update
    at step i (logged as step i + 1): (i + 1)/10 · lr while i < 10, lr until 38, then lr · (1 − (i − 38)/10)."""
    run = ladders_made["whole"] / "rungs" / "d1-c1"
    tc = load_saved_config(run / "config.yaml").train
    assert (tc.lr, tc.min_lr, tc.warmup_steps, tc.max_steps, tc.schedule) == (1e-2, 0.0, 10, 48, "wsd")

    def hand(i: int) -> float:
        return 1e-2 * (i + 1) / 10 if i < 10 else 1e-2 if i < 38 else 1e-2 * (1 - (i - 38) / 10)
    logged = {r["step"]: r["lr"] for r in read_jsonl(run / "metrics.jsonl") if "lr" in r}
    # The trunk's log up to the branch point (every 10th step), then the branch's every step of its decay.
    assert {10, 20, 30} <= set(logged) and set(range(39, 49)) <= set(logged) and max(logged) == 48
    for step, lr in logged.items():
        assert lr == pytest.approx(hand(step - 1), abs=1e-12), step


@pytest.mark.slow
def test_a_branch_ends_exactly_as_a_wsd_run_of_its_own_length_trained_alone(ladders_made, tiny_bpe_data, tmp_path):
    ladder = _ladder(ladders_made["whole"])
    rung = next(r for r in ladder["design"]["rungs"] if r["name"] == "d2-c1")
    trunk = yaml.safe_load((ladders_made["whole"] / "rungs" / rung["trunk"] / "config.yaml").read_text())
    cfg = shape_run_config(tiny_bpe_data, dial_shape(2, ladder["design"]["vocab_size"], SEQ_LEN), rung["steps"], 8,
                           SEQ_LEN, extra=["train.schedule=wsd", "train.decay_fraction=0.2",
                                           f"train.warmup_steps={trunk['train']['optim']['warmup_steps']}"])
    alone = start_run(cfg, tmp_path / "alone", Pretraining(), tiny_bpe_data, on_event=lambda line: None,
                      progress=False)
    assert alone.step == rung["steps"]
    assert alone.val_loss == ladder["done"][rung["name"]]["val_loss"]  # bitwise: the same updates on the same tokens
    branch = ladders_made["whole"] / "rungs" / rung["name"] / "checkpoints" / f"step_{rung['steps']:07d}"
    mine, theirs = load_file(alone.checkpoint / "model.safetensors"), load_file(branch / "model.safetensors")
    assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)


@pytest.mark.slow
def test_a_wsd_ladder_killed_at_its_first_branch_ends_as_the_one_run_without_a_stop(ladders_made):
    at_kill = ladders_made["at_kill"]
    trunks = {r["name"] for r in at_kill["design"]["rungs"] if "milestones" in r}
    assert set(at_kill["done"]) == trunks and "fit" not in at_kill  # killed after the trunks, at the first branch
    assert ladders_made["continued"] == _ladder(ladders_made["whole"])


@pytest.mark.slow
def test_a_branch_copied_but_not_resumed_and_a_half_made_copy_are_continued(ladders_made, tiny_bpe_data):
    """Stopped just after d1-c0 was copied from its trunk (its config.yaml still the trunk's, 192 steps) and while
    d2-c0's copy was being made: the same command trains both to their own ends."""
    whole, out = ladders_made["whole"], ladders_made["root"] / "copied"
    ladder = _ladder(whole)
    trunks = [r for r in ladder["design"]["rungs"] if "milestones" in r]
    out.mkdir()
    for name in (OWNER_FILE, LADDER_FILE):
        shutil.copy(whole / name, out / name)
    for r in trunks:
        shutil.copytree(whole / "rungs" / r["name"], out / "rungs" / r["name"])
    (out / LADDER_FILE).write_text(json.dumps({key: value for key, value in ladder.items() if key != "fit"}
                                              | {"done": {r["name"]: ladder["done"][r["name"]] for r in trunks}}))
    copy_branch_point(out / "rungs" / "d1-c3", 19, out / "rungs" / "d1-c0")
    assert yaml.safe_load((out / "rungs" / "d1-c0" / "config.yaml").read_text())["train"]["max_steps"] == 192
    half = out / "rungs" / ".d2-c0.partial"
    half.mkdir()
    (half / "config.yaml").write_text("half a copy")
    assert _continue(tiny_bpe_data, out) == ladder
    assert not half.exists()


def test_a_ladder_budget_names_its_schedule_and_refuses_another():
    assert ladder_budget(2, None, None, None).schedule == "linear"
    assert ladder_budget(2, None, None, None, SEQ_LEN, "linear") == LadderBudget(2, "2 minutes", SEQ_LEN, "linear")
    with pytest.raises(BurnoutError, match="--schedule cosine: not a ladder's schedule; give one of linear, wsd"):
        ladder_budget(2, None, None, None, SEQ_LEN, "cosine")
