"""What the rented GPU relies on, checked on CPU: train.compile=true trains like eager through the real
loop (inductor, the backend a GPU run uses), the train step's forward and loss are one graph, fused AdamW
updates as foreach AdamW does, and the first logged tokens/s, MFU and ETA leave the first step out."""

import copy
import functools
from types import SimpleNamespace

import pytest
import safetensors.torch
import torch
from torch._dynamo.utils import counters

from burnout.config import load_run_config
from burnout.data.loader import TokenLoader
from burnout.report.render import write_report
from burnout.runs import resume_training, start_training
from burnout.train import loop
from burnout.train.budget import PLAN_PROBE_STEPS
from burnout.train.metrics import read_metrics
from burnout.train.optim import make_optimizer
from burnout.train.step import TrainStep, accumulate_gradients, build_model

CPU = torch.device("cpu")


def _quiet(line):
    pass


def _weights(run_dir):
    return safetensors.torch.load_file(sorted((run_dir / "checkpoints").iterdir())[-1] / "model.safetensors")


SLOW_FIRST_STEP_S, STEP_S = 1.0, 0.5
# The step a session times for its plan before step 1 (a warm-up and PLAN_PROBE_STEPS steps on the step clock), in
# elapsed_s: a session's time counts from its command's start.
PROBE_S = SLOW_FIRST_STEP_S + PLAN_PROBE_STEPS * STEP_S


class _StepClock:
    """The training loop's clock, moved by the train step alone: `first_s` by each session's first step (compilation,
    warm-up), `step_s` by every later one, whatever the steps really took. Rates and times are then known exactly,
    however busy the machine is."""

    def __init__(self, monkeypatch, first_s: float, step_s: float):
        self.now, real_call, started = 0.0, TrainStep.__call__, set()

        def timed_call(train_step, *args, **kwargs):
            result = real_call(train_step, *args, **kwargs)
            self.now += step_s if train_step in started else first_s
            started.add(train_step)
            return result

        monkeypatch.setattr(TrainStep, "__call__", timed_call)
        monkeypatch.setattr(loop, "time", SimpleNamespace(perf_counter=lambda: self.now))


@pytest.fixture
def fresh_dynamo():
    """No compiled code from other tests in (a code object compiled too often runs eager from then on),
    none of this test's left for them."""
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


@pytest.mark.slow
def test_compiled_training_matches_eager(tiny_run_config, tiny_bpe_data, tmp_path, fresh_dynamo, monkeypatch):
    _StepClock(monkeypatch, first_s=SLOW_FIRST_STEP_S, step_s=STEP_S)
    runs = {}
    for compiled in (False, True):
        cfg = tiny_run_config(max_steps=6, log_interval=2, eval_interval=6, ckpt_interval=6, compile=compiled)
        counters.clear()
        start_training(cfg, tmp_path / str(compiled), data_dir=tiny_bpe_data, on_event=_quiet, progress=False)
        # The compiled run went through dynamo (and so inductor): not an eager run under another name.
        assert (counters["stats"]["unique_graphs"] > 0) == compiled
        runs[compiled] = tmp_path / str(compiled)
    eager, compiled = (read_metrics(runs[c]) for c in (False, True))
    assert [r["step"] for r in compiled] == [r["step"] for r in eager] == [2, 4, 6]
    # fp32 either way, but inductor fuses and reorders reductions: the runs differ by rounding, which
    # AdamW amplifies where a gradient is near zero. Measured after 6 steps: losses 8e-8 relative,
    # weights 1.2e-5 at most (the head). The tolerances leave 25× room or more and still fail on any real
    # change: one step at lr 3e-3 moves the loss by ~1e-2 and a weight by up to 3e-3.
    for a, b in zip(eager, compiled):
        assert b["train_loss"] == pytest.approx(a["train_loss"], rel=1e-5), (a, b)
    assert compiled[-1]["val_loss"] == pytest.approx(eager[-1]["val_loss"], rel=1e-5)
    w_eager, w_compiled = _weights(runs[False]), _weights(runs[True])
    assert w_eager.keys() == w_compiled.keys()
    for key in w_eager:
        torch.testing.assert_close(w_compiled[key], w_eager[key], rtol=0, atol=3e-4, msg=key)
    # Compilation happens in the first step, which the first record logs apart from its tokens/s: that rate is
    # the second step's alone. (The loop's clock is the step clock's: with the first step in, the rate would be
    # 2 × 128 tokens over both steps' time.)
    first = compiled[0]
    tokens_per_step = 4 * 32
    second_step_s = first["elapsed_s"] - PROBE_S - first["first_step_s"]
    assert (first["first_step_s"], second_step_s) == (SLOW_FIRST_STEP_S, STEP_S)
    assert first["tokens_per_s"] == tokens_per_step / STEP_S


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_train_steps_forward_and_loss_are_one_graph(tiny_run_config, tiny_bpe_data, monkeypatch, fresh_dynamo,
                                                       precision):
    """fullgraph=True turns a graph break into an error. aot_eager traces forward and backward as
    inductor does but runs the traced ops as they are (seconds instead of a minute of kernel code
    generation): graph breaks happen in the tracing, and inductor's code is the test above's. Running
    the same ops, it gives eager's loss and gradients (bitwise here; compared at fp32's tolerance)."""
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, fullgraph=True, backend="aot_eager"))
    cfg = tiny_run_config(compile=True, precision=precision)
    torch.manual_seed(0)
    model = build_model(cfg, CPU)
    twin = copy.deepcopy(model)
    for block in twin.blocks:  # eager under bf16 on a CPU would take the written-out attention; compiled, SDPA
        block.attn.explicit_on_cpu = False
    step = TrainStep(model, cfg.train, CPU, precision, end_of_run=10)
    loader = TokenLoader(tiny_bpe_data, "train", 4, 32, seed=0)
    loss, _ = accumulate_gradients(step.forward, loader, 0, 1, CPU, precision)
    assert counters["stats"]["unique_graphs"] == 1
    torch.testing.assert_close(loss, accumulate_gradients(twin, loader, 0, 1, CPU, precision)[0])
    for (name, p), q in zip(model.named_parameters(), twin.parameters()):
        torch.testing.assert_close(p.grad, q.grad, msg=name)


def test_first_record_rates_leave_the_first_step_out(tiny_run_config, tiny_bpe_data, tmp_path, monkeypatch):
    """The first step of each session (compilation, warm-up: here 1 s of the step clock against 0.5 s for the
    others) is logged as first_step_s and left out of tokens_per_s, MFU and ETA; a first window of that step alone
    logs no rate at all."""
    _StepClock(monkeypatch, first_s=SLOW_FIRST_STEP_S, step_s=STEP_S)
    cfg = tiny_run_config(max_steps=6, log_interval=3, eval_interval=100, ckpt_interval=6, hardware="cpu",
                          price_per_hour=3.0)
    run = tmp_path / "run"
    start_training(cfg, run, data_dir=tiny_bpe_data, on_event=_quiet, progress=False)
    events = []
    resume_training(run, ["train.max_steps=8", "train.log_interval=1"], on_event=events.append, progress=False)
    first, second, after_resume, next_one = read_metrics(run)
    assert [r["step"] for r in (first, second, after_resume, next_one)] == [3, 6, 7, 8]
    tokens_per_step = 4 * 32
    for record in (first, after_resume):
        assert record["first_step_s"] == SLOW_FIRST_STEP_S
    assert "first_step_s" not in second and "first_step_s" not in next_one
    # The rate is that of steps 2 and 3 alone: with the first step beside them it would be 3 × 128 tokens in 2 s.
    assert first["tokens_per_s"] == second["tokens_per_s"] == next_one["tokens_per_s"] == tokens_per_step / STEP_S
    assert first["elapsed_s"] == PROBE_S + SLOW_FIRST_STEP_S + 2 * STEP_S  # wall time keeps it
    # MFU and ETA follow that rate: MFU in proportion to it, ETA the 3 steps left at it.
    assert first["mfu"] / first["tokens_per_s"] == pytest.approx(second["mfu"] / second["tokens_per_s"])
    eta = 3 * tokens_per_step / first["tokens_per_s"]
    assert first["eta_s"] == round(eta, 1)
    assert first["dollars_projected"] == pytest.approx((first["elapsed_s"] + eta) / 3600 * 3.0)
    # Step 7 is the resumed session's first step alone: nothing measured the rate, so none is logged.
    assert not {"tokens_per_s", "mfu", "eta_s", "dollars_projected"} & after_resume.keys()
    assert after_resume["dollars"] == pytest.approx(after_resume["elapsed_s"] / 3600 * 3.0)
    assert next_one["mfu"] > 0
    line = next(e for e in events if e.startswith("step 7/8"))
    assert "tok/s" not in line and f"first step {after_resume['first_step_s']:.1f} s" in line
    # The report shows what starting each session cost.
    write_report([run], out=tmp_path / "report", html_page=False)
    assert (f"| first step of each session | {first['first_step_s']:.1f} s, {after_resume['first_step_s']:.1f} s "
            "(compilation, warm-up; not in tokens/s) |") in (tmp_path / "report" / "report.md").read_text()


def test_fused_adamw_updates_as_foreach_adamw(tiny_run_config, tiny_bpe_data):
    """make_optimizer's fused AdamW on the CPU against foreach AdamW over the same param groups (weight
    decay on the matrices only), five steps of the real model on real batches."""
    cfg = tiny_run_config()
    torch.manual_seed(0)
    model = build_model(cfg, CPU)
    twin = copy.deepcopy(model)
    (fused,) = make_optimizer(model, cfg.train).optimizers
    assert fused.defaults["fused"] and not fused.defaults["foreach"]
    assert [(g["weight_decay"], {p.dim() for p in g["params"]}) for g in fused.param_groups] == [
        (cfg.train.weight_decay, {2}), (0.0, {1})]
    name = {id(p): n for n, p in model.named_parameters()}
    twin_params = dict(twin.named_parameters())
    foreach = torch.optim.AdamW(
        [{**{k: v for k, v in group.items() if k not in ("params", "fused", "foreach")},
          "params": [twin_params[name[id(p)]] for p in group["params"]]} for group in fused.param_groups],
        foreach=True)
    loader = TokenLoader(tiny_bpe_data, "train", 4, 32, seed=0)
    for step in range(5):
        for net, optimizer in ((model, fused), (twin, foreach)):
            accumulate_gradients(net, loader, step, 1, CPU, "fp32")
            optimizer.step()
            optimizer.zero_grad()
    # Measured: 2e-7 at most (an ulp or two of the norms' gains near 1). A real difference is far larger:
    # eps 1e-7 instead of 1e-8 already fails, and one step at lr 3e-3 moves a weight by up to 3e-3.
    for (key, p), q in zip(model.named_parameters(), twin.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-6, msg=key)


FINE_TUNE_TRAIN = {"device": "cpu", "precision": "fp32", "batch_size": 4, "seq_len": 64, "max_steps": 6, "lr": 1e-3,
                   "min_lr": 1e-4, "warmup_steps": 2, "log_interval": 2, "eval_interval": 3, "eval_batches": 2,
                   "ckpt_interval": 6}


@pytest.mark.slow
@pytest.mark.parametrize("stage", ["sft", "dpo"])
def test_compiled_fine_tunes_train_like_eager_and_compile_once(tiny_run, chat_run, fine_tune_data, tmp_path,
                                                               fresh_dynamo, stage):
    """SFT and DPO with train.compile=true: eager's losses and weights, and every graph compiled by the first
    logged step (2): none again for later batches whose number of targets differs (DPO's whole model was, for each new
    count, until dynamo's recompile limit left it eager)."""
    base, source = (tiny_run.run_dir, fine_tune_data.chats) if stage == "sft" else (chat_run, fine_tune_data.pairs)
    runs, graphs_by_step_2 = {}, {}

    def count_graphs(line):
        if line.startswith("step 2/"):
            graphs_by_step_2[compiled] = counters["stats"]["unique_graphs"]

    for compiled in (False, True):
        cfg = load_run_config({stage: {"base": str(base), "source": str(source)},
                               "train": {**FINE_TUNE_TRAIN, "compile": compiled}})
        counters.clear()
        start_training(cfg, tmp_path / str(compiled), on_event=count_graphs, progress=False)
        assert counters["stats"]["unique_graphs"] == graphs_by_step_2[compiled]
        runs[compiled] = read_metrics(tmp_path / str(compiled))
    assert graphs_by_step_2[False] == 0 and graphs_by_step_2[True] > 0
    for a, b in zip(runs[False], runs[True], strict=True):
        assert b["train_loss"] == pytest.approx(a["train_loss"], rel=1e-5), (a, b)
        if "val_loss" in a:
            assert b["val_loss"] == pytest.approx(a["val_loss"], rel=1e-5)
    assert "val_loss" in runs[True][-1]
    w_eager, w_compiled = _weights(tmp_path / "False"), _weights(tmp_path / "True")
    for key in w_eager:
        torch.testing.assert_close(w_compiled[key], w_eager[key], rtol=0, atol=3e-4, msg=key)
