"""`burnout bench` and `--ablate`: a smoke test on a tiny model (a couple of steps, no timing asserts)."""

from __future__ import annotations

import json

import pytest
import torch

from burnout.bench import RUNGS, Setup, ablate, bench, format_ablation, format_bench
from burnout.bench.bench import PARTS, PythonBatcher, StepTimer, bench_step, default_setup, measure
from burnout.cli import main
from burnout.core.checkpoint import load_checkpoint
from burnout.data.loader import TokenLoader
from burnout.train.run import start_training

CPU = torch.device("cpu")


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
    from burnout.train import loop

    assert loop.loader_mode(tiny_bpe_data) == "preload"
    monkeypatch.setattr(loop, "PRELOAD_MAX_BYTES", 0)
    assert loop.loader_mode(tiny_bpe_data) == "mmap"
