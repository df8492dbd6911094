"""`burnout bench` and `--ablate`: a smoke test on a tiny model (a couple of steps, no timing asserts)."""

from __future__ import annotations

import json
import sys

import pytest
import torch

from burnout.bench import RUNGS, Setup, ablate, bench, format_ablation, format_bench
from burnout.bench.bench import PARTS, PythonBatcher, StepTimer, bench_step, default_setup, measure
from burnout.cli import main
from burnout.core.checkpoint import load_checkpoint
from burnout.data.loader import TokenLoader
from burnout.errors import BurnoutError
from burnout.runs import start_training

CPU = torch.device("cpu")


def _measured_cpu(monkeypatch, bf16_gflops: float, fp32_gflops: float) -> None:
    entry = {"choice": "bf16" if bf16_gflops > fp32_gflops else "fp32", "bf16_gflops": bf16_gflops,
             "fp32_gflops": fp32_gflops, "cpu": "test CPU", "threads": 2}
    monkeypatch.setattr(sys.modules["burnout.bench.bench"], "cpu_precision_entry", lambda: (entry, True))


@pytest.fixture(autouse=True)
def bf16_instructions(monkeypatch):
    """The ladder's tests see a CPU with bf16 instructions whatever this one has (Zen 4's figures)."""
    _measured_cpu(monkeypatch, 418.0, 98.0)


@pytest.mark.slow
def test_bench_reports_split_mfu_and_memory(tiny_run_config, tiny_bpe_data):
    r = bench(tiny_run_config(), tiny_bpe_data, steps=2, warmup=1)
    assert r["tokens_per_step"] == 4 * 32 and r["tokens_per_s"] > 0
    assert set(r["split_s"]) == set(PARTS) and all(v >= 0 for v in r["split_s"].values())
    assert sum(r["split_fraction"].values()) == pytest.approx(1.0)
    assert r["peak_flops_measured"] > 0 and 0 < r["mfu_measured"]
    assert r["peak_rss_mb"] > 0
    assert r["setup"] == {"loader": "preload", "batching": "vectorized", "compile": False, "precision": "fp32",
                          "attention": "sdpa"}
    text = format_bench(r)
    for word in ("tokens/s", "data", "forward", "backward", "optimizer", "MFU", "peak RSS"):
        assert word in text


def test_a_peak_below_what_the_step_achieved_is_measured_again(tiny_run_config, tiny_bpe_data, monkeypatch):
    """A peak measured in a burst of other load would print an MFU over 100%: bench measures it again."""
    achieved = bench(tiny_run_config(), tiny_bpe_data, steps=2, warmup=1)["achieved_flops"]
    peaks = iter([achieved / 100, achieved / 50, achieved * 100])  # the second run's rate is within 50× of this
    monkeypatch.setattr(sys.modules["burnout.bench.bench"], "measure_peak",
                        lambda device, precision, again=False: next(peaks))
    again = bench(tiny_run_config(), tiny_bpe_data, steps=2, warmup=1)
    assert again["peak_flops_measured"] == achieved * 100 and again["mfu_measured"] < 1


def test_a_step_that_outruns_every_measurement_of_the_peak_gets_no_mfu(tiny_run_config, tiny_bpe_data, monkeypatch):
    """Over 100% is impossible: where the step outran the peak measured three times (the machine busy throughout;
    here 1 FLOP/s), bench says why MFU is left out instead of printing a figure. The two later measurements are
    new ones (`again`), not the CPU's kept best read twice more."""
    asked = []
    monkeypatch.setattr(sys.modules["burnout.bench.bench"], "measure_peak",
                        lambda device, precision, again=False: asked.append(again) or 1.0)
    r = bench(tiny_run_config(), tiny_bpe_data, steps=2, warmup=1)
    assert asked == [False, True, True] and "mfu_measured" not in r and r["peak_flops_measured"] == 1.0
    achieved = f"{r['achieved_flops'] / 1e9:,.1f}"
    assert (f"MFU           left out: the step ran {achieved} GFLOP/s, above the 0.0 GFLOP/s fp32 matmul peak "
            "measured three times (other work on this machine slowed the measurements; bench again when it is "
            "quiet)") in format_bench(r).splitlines()


def test_a_cpus_peak_is_trainings_kept_best_and_again_measures_anew(monkeypatch, tmp_path):
    """bench's CPU peak is the one training's MFU is over (the best kept for this CPU, a busy measurement of 20
    GFLOP/s leaving it at 50); `again` measures anew instead of reading the process's first measurement."""
    from burnout.bench.bench import measure_peak
    from burnout.train import hardware

    monkeypatch.setenv("BURNOUT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(hardware, "_PROCESS_PEAKS", {})  # none kept from earlier tests, none left for later ones
    figures = [50e9, 20e9, 80e9]
    monkeypatch.setattr(hardware, "measure_cpu_peak", lambda precision: figures.pop(0))
    peaks = [measure_peak(CPU, "fp32", again=again) for again in (False, False, True, True)]
    assert peaks == [50e9, 50e9, 50e9, 80e9] and figures == []


@pytest.mark.parametrize("overrides", [[], ["train.grad_accum=2", "train.optimizer=muon"]])
def test_bench_runs_the_loops_step_bitwise(tiny_run_config, tiny_bpe_data, tmp_path, overrides):
    """The step bench times is the loop's: from the same seed, bench's steps and the loop's steps give
    bitwise-equal weights (same initialization, batches, LR schedule, clipping and optimizer)."""
    cfg = tiny_run_config(overrides, max_steps=4, warmup_steps=1, ckpt_interval=4, eval_interval=4)
    result = start_training(cfg, tmp_path / "run", data_dir=tiny_bpe_data, on_event=lambda line: None,
                            progress=False)
    trained = load_checkpoint(result.checkpoint).model.state_dict()

    train_step, batches = bench_step(cfg, tiny_bpe_data, default_setup(cfg, tiny_bpe_data, CPU), CPU)
    for step in range(cfg.train.max_steps):
        train_step(batches, step, clock=StepTimer(CPU))
    benched = train_step.model.state_dict()
    assert benched.keys() == trained.keys()
    for name, tensor in benched.items():
        assert torch.equal(tensor, trained[name]), name


def test_python_batching_gives_the_loaders_batches(tiny_bpe_data):
    loader = TokenLoader(tiny_bpe_data, "train", 4, 32, seed=3, mode="mmap")
    for step in (0, 7):
        x, y = loader.get_batch(step)
        px, py = PythonBatcher(loader).get_batch(step)
        assert torch.equal(x, px) and torch.equal(y, py)


def test_every_rung_trains_the_same_first_step(tiny_run_config, tiny_bpe_data):
    """Preload and vectorized batching change nothing but speed: same batches, same loss."""
    cfg = tiny_run_config()
    losses = {mode: measure(cfg, tiny_bpe_data, Setup(loader=mode[0], batching=mode[1], attention="math"),
                            steps=1, warmup=1)["final_loss"]
              for mode in (("mmap", "python"), ("preload", "python"), ("preload", "vectorized"))}
    assert len(set(losses.values())) == 1


def test_ablate_ladder_and_compile_fallback(tiny_run_config, tiny_bpe_data, monkeypatch):
    def broken_compile(model, *args, **kwargs):
        def fail(*a, **k):
            raise RuntimeError("no C++ compiler here")
        return fail

    monkeypatch.setattr(torch, "compile", broken_compile)
    r = ablate(tiny_run_config(), tiny_bpe_data, steps=1, warmup=1)
    assert [x["rung"] for x in r["rungs"]] == [key for key, _, _ in RUNGS]
    compiled = r["rungs"][3]
    assert compiled["note"] and "no C++ compiler" in compiled["note"] and not compiled["setup"]["compile"]
    assert all(not x["setup"]["compile"] for x in r["rungs"][3:])  # later rungs go on without it
    last = r["rungs"][-1]["setup"]
    assert last["precision"] in ("bf16", "fp16") and last["attention"] == "sdpa" and last["loader"] == "preload"
    assert r["rungs"][0]["speedup_total"] == 1.0
    assert all(x["tokens_per_s"] > 0 and x["speedup_prev"] > 0 for x in r["rungs"])
    text = format_ablation(r)
    assert "unavailable" in text and "+ SDPA" in text


def test_ablate_leaves_the_bf16_rung_out_where_the_cpu_emulates_bf16(tiny_run_config, tiny_bpe_data, monkeypatch):
    """An AVX2 EPYC ran bf16 matmuls at 1.4 GFLOP/s against 181 in fp32: a bf16 rung would take minutes a step."""
    _measured_cpu(monkeypatch, 1.4, 181.0)
    r = ablate(tiny_run_config(), tiny_bpe_data, steps=1, warmup=1, skip=("compile",))
    bf16, sdpa = r["rungs"][3], r["rungs"][4]
    assert bf16["rung"] == "bf16" and "1.4 GFLOP/s against 181 in fp32" in bf16["skipped"]
    assert "tokens_per_s" not in bf16
    assert sdpa["skipped"] is None and sdpa["setup"]["precision"] == "fp32" and sdpa["setup"]["attention"] == "sdpa"
    assert sdpa["speedup_prev"] == sdpa["tokens_per_s"] / r["rungs"][2]["tokens_per_s"]
    assert "+ bf16 autocast (left out: bf16 emulated here)" in format_ablation(r)


def test_cli_bench_json_and_ablate_skip(tiny_run_config, tiny_bpe_data, tmp_path, capsys):
    import yaml

    raw = tiny_run_config(batch_size=2, seq_len=16).to_dict()
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(raw))
    assert main(["bench", str(config), "--steps", "1", "--warmup", "1", "--data", str(tiny_bpe_data), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["tokens_per_step"] == 32 and "mfu_measured" in out
    assert main(["bench", str(config), "--ablate", "--skip", "compile", "--steps", "1", "--warmup", "1",
                 "--data", str(tiny_bpe_data), "train.batch_size=3"]) == 0
    text = capsys.readouterr().out
    assert "+ bf16 autocast" in text and "torch.compile" not in text and "× 16 tokens" in text
    assert main(["bench", str(config), "--ablate", "--skip", "nope", "--data", str(tiny_bpe_data)]) == 2


def test_training_preloads_small_token_files(tiny_bpe_data, monkeypatch):
    from burnout.data import loader

    assert loader.loader_mode(tiny_bpe_data) == "preload"
    monkeypatch.setattr(loader, "PRELOAD_MAX_BYTES", 0)
    assert loader.loader_mode(tiny_bpe_data) == "mmap"


def fake_out_of_memory(monkeypatch, fails) -> list:
    """Transformer.forward raises CUDA's out-of-memory error wherever `fails(model)`; torch.compile is
    the identity (fast). Returns weak references to the models that failed; a later forward checks that
    they were freed, as a GPU needs for the next rung to have the memory back."""
    import weakref

    from burnout.models import Transformer

    failed, forward = [], Transformer.forward

    def maybe_oom(self, idx, targets=None, cache=None):
        assert all(ref() is None for ref in failed), "a rung that ran out of memory is still alive"
        if fails(self):
            failed.append(weakref.ref(self))
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 8.00 GiB")
        return forward(self, idx, targets, cache)

    monkeypatch.setattr(Transformer, "forward", maybe_oom)
    monkeypatch.setattr(torch, "compile", lambda model, *args, **kwargs: model)
    return failed


def explicit_attention(model) -> bool:
    return not model.blocks[0].attn.use_sdpa


def test_ablate_goes_on_past_a_rung_that_runs_out_of_memory(tiny_run_config, tiny_bpe_data, monkeypatch):
    failed = fake_out_of_memory(monkeypatch, lambda m: explicit_attention(m) and torch.is_autocast_enabled("cpu"))
    r = ablate(tiny_run_config(), tiny_bpe_data, steps=1, warmup=1)
    assert len(failed) == 1
    assert [x["rung"] for x in r["rungs"]] == [key for key, _, _ in RUNGS]
    bf16, sdpa = r["rungs"][4], r["rungs"][5]
    assert bf16["skipped"] == "out of memory at this rung: CUDA out of memory. Tried to allocate 8.00 GiB"
    assert "tokens_per_s" not in bf16 and bf16["setup"]["precision"] == "bf16"
    # The ladder goes on from the skipped rung's setup, and ×prev skips over it.
    assert sdpa["skipped"] is None and sdpa["setup"]["precision"] == "bf16" and sdpa["setup"]["compile"]
    assert sdpa["speedup_prev"] == sdpa["tokens_per_s"] / r["rungs"][3]["tokens_per_s"]
    text = format_ablation(r)
    assert "+ bf16 autocast (skipped: out of memory)" in text
    assert "bf16: out of memory at this rung: CUDA out of memory" in text and "first rung that fit" not in text


def test_cli_ablate_when_only_sdpa_fits(tiny_run_config, tiny_bpe_data, tmp_path, monkeypatch, capsys):
    """The 1B's case: explicit attention runs out of memory at every rung that has it."""
    import yaml

    fake_out_of_memory(monkeypatch, explicit_attention)
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(tiny_run_config(batch_size=2, seq_len=16).to_dict()))
    args = ["bench", str(config), "--ablate", "--steps", "1", "--warmup", "1", "--data", str(tiny_bpe_data)]
    assert main(args + ["--json"]) == 0
    rungs = json.loads(capsys.readouterr().out)["rungs"]
    assert [x["rung"] for x in rungs if x["skipped"]] == [key for key, _, _ in RUNGS[:-1]]
    assert all(x["skipped"].startswith("out of memory at this rung: ") for x in rungs[:-1])
    sdpa = rungs[-1]
    assert sdpa["setup"] == {"loader": "preload", "batching": "vectorized", "compile": True, "precision": "bf16",
                             "attention": "sdpa"}
    assert sdpa["speedup_prev"] == sdpa["speedup_total"] == 1.0 and sdpa["tokens_per_s"] > 0
    assert main(args) == 0
    text = capsys.readouterr().out
    assert text.count("(skipped: out of memory)") == 5 and "baseline: out of memory at this rung" in text
    assert "×base is over sdpa, the first rung that fit" in text


def test_out_of_memory_in_a_compiled_step_is_not_a_compile_failure(tiny_run_config, tiny_bpe_data, monkeypatch):
    """A compiled step that runs out of memory is not retried eager (which needs more memory) and
    reported as a compiler failure: the rung did not fit."""
    def compiled_out_of_memory(model, *args, **kwargs):
        def step(*a, **k):
            raise torch.OutOfMemoryError("CUDA out of memory")
        return step

    monkeypatch.setattr(torch, "compile", compiled_out_of_memory)
    with pytest.raises(torch.OutOfMemoryError):
        measure(tiny_run_config(), tiny_bpe_data, Setup(compile=True), steps=1, warmup=1)


def test_bench_out_of_memory_is_one_line_with_the_fix(tiny_run_config, tiny_bpe_data, monkeypatch, capsys):
    from burnout.models import Transformer

    def oom(self, *args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")

    monkeypatch.setattr(Transformer, "forward", oom)
    cfg = tiny_run_config()
    with pytest.raises(BurnoutError, match=r"out of GPU memory at micro-batch train.batch_size=4 .* try "):
        bench(cfg, tiny_bpe_data, steps=1, warmup=1)
