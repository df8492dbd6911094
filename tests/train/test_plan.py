"""`burnout plan`'s memory: the lines of the prediction, DDP and FSDP, the verdict and its fixes, the refusal
before training (burnout/train/plan.py). Activations are traced on fake tensors, so large batches cost nothing."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest
import torch
import yaml

from burnout.base.text import format_count
from burnout.cli import main
from burnout.config import load_run_config
from burnout.errors import BurnoutError
from burnout.models.memory import param_counts
from burnout.runs import start_training
from burnout.train import plan as plan_mod
from burnout.train.hardware import hardware_table
from burnout.train.plan import GIB, Variant, check_fits, largest_fitting, plan_run, predict_memory

EAGER = Variant(compiled=False, checkpointing=False)


def small(**train):
    """llama-small (29M parameters) at a micro-batch whose activations need tens of GiB."""
    train = {"batch_size": 256, "grad_accum": 2, "seq_len": 512, "precision": "bf16", **train}
    return load_run_config({"model": "llama-small", "train": train})


@pytest.mark.slow
def test_lines_add_up_and_say_where_they_come_from():
    cfg = small()
    n = param_counts(cfg.model).total
    lines = predict_memory(cfg, "bf16", "cuda", 1, 256, EAGER)
    assert (lines["weights"], lines["gradients"], lines["optimizer"]) == (4 * n, 4 * n, 8 * n)
    allocated = sum(v for k, v in lines.items() if k not in ("overhead", "total"))
    assert lines["overhead"] == plan_mod.CUDA_CONTEXT_BYTES + round(plan_mod.ALLOCATOR_MARGIN * allocated)
    assert lines["total"] == allocated + lines["overhead"]
    assert "overhead" not in predict_memory(cfg, "bf16", "cpu", 1, 256, EAGER)  # no CUDA context on a CPU


@pytest.mark.slow
def test_activations_grow_with_the_micro_batch_and_checkpointing_cuts_them():
    cfg = small()
    half, full = (predict_memory(cfg, "bf16", "cuda", 1, b, EAGER) for b in (128, 256))
    assert full["activations"] == pytest.approx(2 * half["activations"], rel=0.01)
    ckpt = predict_memory(cfg, "bf16", "cuda", 1, 256, Variant(False, True))
    assert ckpt["activations"] < full["activations"] / 5
    assert ckpt["weights"] == full["weights"]


@pytest.mark.slow
def test_fsdp_divides_the_static_part_and_gathers_two_blocks():
    one = predict_memory(small(), "bf16", "cuda", 1, 256, EAGER)
    fsdp = predict_memory(small(distributed="fsdp"), "bf16", "cuda", 4, 256, EAGER)
    for key in ("weights", "gradients", "optimizer"):
        assert fsdp[key] == -(-one[key] // 4)
    assert fsdp["activations"] == one["activations"] and one["weight_copies"] > 0
    # FSDP gathers bf16 weights: nothing for autocast to copy. Gathered: bf16 weights and gradients and the
    # gradients' fp32 copy for the reduce-scatter, for the root module and two blocks.
    assert fsdp["weight_copies"] == 0
    counts = param_counts(small().model)
    assert fsdp["fsdp_unsharded"] == (2 + 2 + 4) * (counts.outside_blocks + 2 * counts.per_block)
    fp32 = predict_memory(small(distributed="fsdp", precision="fp32"), "fp32", "cuda", 4, 256, EAGER)
    assert fp32["fsdp_unsharded"] == (4 + 4) * (counts.outside_blocks + 2 * counts.per_block)


def test_ddp_keeps_a_whole_replica():
    one = predict_memory(small(), "bf16", "cuda", 1, 256, EAGER)
    ddp = predict_memory(small(distributed="ddp"), "bf16", "cuda", 2, 256, EAGER)
    assert ddp == one  # buckets are views of the gradients: nothing beside the replica


def test_largest_fitting_keeps_tokens_per_step():
    fits = lambda b: b <= 40  # noqa: E731
    assert largest_fitting(64, 16, fits, start_fits=True) == 32
    assert largest_fitting(64, 64, fits, start_fits=False) == 32
    assert largest_fitting(48, 48, lambda b: b <= 5, start_fits=False) == 4  # divisors of 48 only
    assert largest_fitting(64, 64, lambda b: False, start_fits=False) is None


@pytest.mark.slow
def test_the_blog_config_fits_an_a100_80gb_with_headroom(capsys):
    plan = plan_run(load_run_config("gpuburnout-1b"), "a100-80gb")
    memory = plan["memory"]
    assert memory["configured"] == "compiled" and memory["micro_batch"] == 16
    total = memory["variants"]["compiled"]["total"]
    assert memory["fits"] and total < 0.95 * 80 * GIB
    assert memory["largest_micro_batch"] >= 16
    assert main(["plan", "gpuburnout-1b", "--gpu", "a100-80gb"]) == 0
    out = capsys.readouterr().out
    assert "compiled (configured):" in out and "fits," in out and "does not fit" not in out
    for label in ("weights, fp32", "activations kept for backward", "CUDA context + allocator"):
        assert label in out


@pytest.mark.slow
def test_plan_cli_says_does_not_fit_and_names_the_fixes(tmp_path, capsys):
    path = tmp_path / "big.yaml"
    path.write_text(yaml.safe_dump({"model": "llama-small", "train": {"batch_size": 256, "grad_accum": 2,
                                                                      "seq_len": 512, "precision": "bf16"}}))
    assert main(["plan", str(path), "--gpu", "l4"]) == 0
    out = capsys.readouterr().out
    assert "eager (configured):" in out and "does not fit" in out
    assert "fits with train.activation_checkpointing=true" in out
    assert "fits with train.batch_size=" in out  # a smaller micro-batch, the same 512 sequences per step
    assert "largest micro-batch that fits: " in out


@pytest.mark.slow
def test_impossible_plans_are_one_line(tmp_path, capsys):
    # Explicit attention keeps T×T scores per head: at 32k tokens one block's exceeds 24 GiB, checkpointed or not.
    path = tmp_path / "long.yaml"
    path.write_text(yaml.safe_dump({"model": {"preset": "llama-tiny", "context_length": 32768, "attention": "math"},
                                    "train": {"batch_size": 1, "seq_len": 32768, "precision": "bf16"}}))
    assert main(["plan", str(path), "--gpu", "l4"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("burnout: error: train.batch_size: 1 × 32768 tokens needs")
    assert "not even micro-batch 1 with activation checkpointing fits" in err
    assert main(["plan", "gpuburnout-1b", "--gpus", "0"]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    assert main(["plan", "gpuburnout-1b", "--gpu", "a100-90gb"]) == 2
    assert "hardware 'a100-90gb' is not in" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_a_plan_two_thousand_blocks_deep_is_refused_in_one_line_at_once(capsys):
    """`model.n_layer=2000` (a slip for 20): not even its weights, gradients and AdamW state fit one GPU, and FSDP
    over 64 leaves each its activations; the refusal comes from tracing four and five blocks, not 2000."""
    from burnout.models.transformer import Transformer

    assert main(["plan", "gpuburnout-1b", "--gpu", "a100-80gb", "model.n_layer=2000"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("burnout: error: train.batch_size: 16 × 2048 tokens needs ")
    assert "not even micro-batch 1 with activation checkpointing fits, nor FSDP over 64 GPUs" in err
    model = load_run_config("gpuburnout-1b").model
    with torch.device("meta"):
        one, two = (sum(p.numel() for p in Transformer(dataclasses.replace(model, n_layer=n)).parameters())
                    for n in (1, 2))
    needed = float(err.split(" needs ")[1].split(" GiB")[0].replace(",", "")) * GIB
    assert needed > 16 * (one + 1999 * (two - one))  # fp32 weights and gradients, AdamW's two moments


@pytest.mark.slow
def test_a_plan_whose_static_memory_overflows_the_gpu_traces_only_the_configured_micro_batch(monkeypatch):
    """llama-3b's fp32 weights, gradients and AdamW state alone exceed an L4's 24 GiB: no micro-batch or variant on
    one L4 fits, so none is traced, and the plan's one fix is FSDP."""
    from burnout.models import memory

    traced = []
    trace_step = memory.trace_step

    def counted(cfg, batch_size, *rest):
        traced.append(batch_size)
        return trace_step(cfg, batch_size, *rest)

    monkeypatch.setattr(memory, "trace_step", counted)
    memory._measure_step_cached.cache_clear()
    cfg = load_run_config({"model": "llama-3b", "train": {"batch_size": 2, "grad_accum": 2, "seq_len": 1024,
                                                          "precision": "bf16", "compile": False}})
    assert sum(plan_mod.static_memory(cfg, 1).values()) > 24 * GIB
    memory_plan = plan_run(cfg, "l4")["memory"]
    assert not memory_plan["fits"] and memory_plan["largest_micro_batch"] is None
    (fix, _), = memory_plan["fixes"]
    assert fix.startswith("--gpus ") and fix.endswith(" train.distributed=fsdp")
    assert set(traced) == {2}


@pytest.mark.slow
def test_check_fits_refuses_a_plan_too_big_for_a_faked_cuda_device():
    cuda = torch.device("cuda")  # never touched: memory and attention kernels are given
    with pytest.raises(BurnoutError) as info:
        check_fits(small(), cuda, 1, "bf16", memory_bytes=24 * GIB, target="cuda")
    message = str(info.value)
    assert message.startswith("predicted peak ") and "exceeds the GPU's 24.0 GiB" in message
    assert "try train.activation_checkpointing=true" in message and "train.memory_check=false" in message
    check_fits(small(memory_check=False), cuda, 1, "bf16", memory_bytes=24 * GIB, target="cuda")
    check_fits(small(batch_size=2, grad_accum=256), cuda, 1, "bf16", memory_bytes=24 * GIB, target="cuda")
    check_fits(small(), torch.device("cpu"), 1, "bf16")  # a CPU has no fixed budget


@pytest.mark.slow
def test_a_cpu_plan_has_no_verdict(tmp_path, capsys):
    path = tmp_path / "cpu.yaml"
    path.write_text(yaml.safe_dump({"model": "llama-small", "train": {"batch_size": 2, "seq_len": 512}}))
    plan = plan_run(load_run_config(path), "cpu")
    assert plan["memory"]["fits"] is None and plan["memory"]["target"] == "cpu"
    assert plan["memory"]["precision"] == "fp32" and "overhead" not in plan["memory"]["variants"]["eager"]
    assert main(["plan", str(path), "--gpu", "cpu"]) == 0
    assert "a CPU has no fixed memory budget" in capsys.readouterr().out


def test_train_asks_the_plan_before_building_anything(tiny_run_config, tiny_bpe_data, tmp_path, monkeypatch):
    from burnout.train import loop, recipe

    def refuse(cfg, device, world_size, precision):
        raise BurnoutError("predicted peak 90.0 GiB exceeds the GPU's 80.0 GiB")

    def no_model(*args, **kwargs):
        raise AssertionError("a model was built before the plan was checked")

    monkeypatch.setattr(loop, "check_fits", refuse)
    monkeypatch.setattr(recipe, "build_model", no_model)
    with pytest.raises(BurnoutError, match="predicted peak"):
        start_training(tiny_run_config(), tmp_path / "run", data_dir=tiny_bpe_data, on_event=lambda line: None,
                       progress=False)
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
@pytest.mark.parametrize("gpu, expected", [("t4", "fp16"), ("v100", "fp16"), ("a100-80gb", "bf16"), ("cpu", "fp32")])
def test_plan_picks_what_precision_auto_would_on_that_hardware(gpu, expected):
    assert plan_run(load_run_config("quickstart"), gpu)["precision"] == expected


@pytest.mark.slow
def test_plan_takes_a_model_preset_a_run_config_or_a_run_folder_and_says_small_runs_in_human_units(sampled_runs,
                                                                                                     capsys):
    """llama-small (29.4M parameters) as a preset with `train --model`'s settings, and as the model of the
    quickstart's config (model.preset replaces the whole model section: not the quickstart's 128-wide layers
    under its name); a run folder's own config; each a line of millions (or thousands), seconds and cents."""
    from burnout.config import load_model_preset
    from burnout.models.info import model_info

    small_params = model_info(load_model_preset("llama-small"))["params_total"]
    run_params = model_info(load_run_config(sampled_runs[0] / "config.yaml").model)["params_total"]
    for target, params, unit in ((["llama-small"], small_params, 1e6),
                                 (["quickstart", "model.preset=llama-small"], small_params, 1e6),
                                 ([str(sampled_runs[0])], run_params, 1e3)):
        assert main(["plan", *target, "--gpu", "rtx-4090"]) == 0
        out = capsys.readouterr().out
        assert out.startswith(f"{params / unit:.1f}{'M' if unit == 1e6 else 'K'} parameters, "), (target, out)
        total = next(line for line in out.splitlines() if line.startswith("total")).split()
        assert re.fullmatch(r"[\d.]+[KM]", total[1]) and total[3] == "s" and total[4] in ("<$0.01", "$0.01"), total
        assert "0.00B" not in out and "$0.00" not in out and "0.0 " not in out.split("peak memory")[0]


# ----------------------------------------------------------------------------------------------
# 8-bit optimizer states and FSDP's CPU offload: fitting llama-2b and llama-3b on one GPU


def test_adamw8bit_shrinks_the_optimizer_line_alone():
    adamw, lowbit = (predict_memory(small(optimizer=name), "bf16", "cuda", 1, 256, EAGER) for name in ("adamw",
                                                                                                      "adamw8bit"))
    n = param_counts(small().model).total
    assert 2 * n < lowbit["optimizer"] < 2.1 * n  # one byte per moment and value, plus block scales and norms
    assert {k: v for k, v in lowbit.items() if k not in ("optimizer", "overhead", "total")} == \
        {k: v for k, v in adamw.items() if k not in ("optimizer", "overhead", "total")}


@pytest.mark.slow
def test_llama_3b_on_one_a100_80gb_names_checkpointing_and_its_speed_cost(capsys):
    """The preset's plan: eager does not fit one A100 80GB; activation checkpointing alone does, said with
    what it costs in speed (not measured yet)."""
    assert main(["plan", "llama-3b", "--gpu", "a100-80gb"]) == 0
    out = capsys.readouterr().out
    assert "eager (configured):" in out and "does not fit" in out
    fix = next(line for line in out.splitlines() if line.startswith("  fits with train.activation_checkpointing=true:"))
    assert "(speed: checkpointing runs each block's forward again in backward" in fix and "not measured" in fix


@pytest.mark.slow
def test_the_smallest_change_set_that_fits_combines_checkpointing_and_8bit_states(capsys):
    """llama-3b with AdamW on an A100 40GB: fp32 weights, gradients and AdamW's moments alone exceed it, so no
    checkpointing or micro-batch fits without 8-bit states, and 8-bit states fit only checkpointed: the plan names
    the three settings together, and that config is predicted to fit where each part alone is not."""
    cfg = load_run_config({"model": "llama-3b", "train": {"precision": "bf16", "batch_size": 8}})
    capacity = 40 * GIB
    assert sum(plan_mod.static_memory(cfg, 1).values()) > capacity
    memory = plan_run(cfg, "a100-40gb")["memory"]
    (fix, total), = memory["fixes"]
    settings = fix.split()
    assert settings[:2] == ["train.activation_checkpointing=true", "train.optimizer=adamw8bit"]
    fixed = load_run_config({"model": "llama-3b", "train": {"precision": "bf16", "batch_size": 8}}, settings)
    assert total == predict_memory(fixed, "bf16", "cuda", 1, fixed.train.batch_size, Variant(False, True))["total"]
    assert total <= capacity < predict_memory(fixed, "bf16", "cuda", 1, 8, Variant(False, False))["total"]
    assert fixed.train.batch_size * fixed.train.grad_accum == 8  # the same tokens per step
    assert main(["plan", "llama-3b", "--gpu", "a100-40gb", "train.optimizer=adamw"]) == 0
    assert f"fits with {fix}: {total / GIB:.1f} GiB (speed: checkpointing" in capsys.readouterr().out


def test_fsdp_cpu_offload_keeps_the_shards_in_cpu_memory():
    plain = predict_memory(small(distributed="fsdp"), "bf16", "cuda", 4, 256, EAGER)
    offloaded = predict_memory(small(distributed="fsdp", cpu_offload=True), "bf16", "cuda", 4, 256, EAGER)
    assert offloaded["weights"] == offloaded["gradients"] == offloaded["optimizer"] == 0
    for key in ("activations", "working", "fsdp_unsharded"):  # the GPU still gathers blocks and computes
        assert offloaded[key] == plain[key] > 0
    cfg = small(distributed="fsdp", cpu_offload=True)
    assert plan_mod.offloaded_memory(cfg, 4) == plain["weights"] + plain["gradients"] + plain["optimizer"]
    assert plan_mod.offloaded_memory(cfg, 1) == 0  # one process: no FSDP, nothing offloaded


@pytest.mark.slow
def test_cpu_offload_is_the_fix_when_fsdp_alone_fits_on_no_number_of_gpus(capsys):
    """4,000 blocks at a tiny micro-batch: their sharded fp32 state exceeds an 80 GB GPU even over 64 GPUs, while
    the checkpointed activations are small: FSDP with CPU offload on the fewest GPUs is the one fix. (In fp32: under
    bf16 the trace's working memory keeps autocast's cache of every block's weight copy, which FSDP's bf16 gathering
    never makes.)"""
    overrides = ["model.n_layer=4000", "train.batch_size=1", "train.seq_len=128", "train.activation_checkpointing=true",
                 "train.optimizer=adamw", "train.precision=fp32"]
    memory = plan_run(plan_mod.plan_config("llama-3b", overrides), "a100-80gb")["memory"]
    (fix, total), = memory["fixes"]
    assert fix == "--gpus 2 train.distributed=fsdp train.cpu_offload=true" and total <= 80 * GIB
    assert main(["plan", "llama-3b", "--gpu", "a100-80gb", "--gpus", "2", *overrides, "train.distributed=fsdp",
                 "train.cpu_offload=true"]) == 0
    out = capsys.readouterr().out
    assert "2 GPUs, FSDP + CPU offload (GiB)" in out and "fits," in out
    assert re.search(r"train.cpu_offload: the weights', gradients' and optimizer state's shards, [\d.]+ GiB per "
                     r"process, are in CPU memory", out)


def _floor_parts(cfg, batch: int, devices: int = 1) -> tuple[int, int]:
    """(weights + gradients + optimizer state per process, the activations' floor), counted here by hand: 16 bytes
    a parameter under AdamW, divided among the GPUs under FSDP; every block's fp32 input."""
    n = param_counts(cfg.model).total
    static = 16 * n if cfg.train.distributed != "fsdp" or devices == 1 else 4 * -(-4 * n // devices)
    seq = cfg.train.seq_len or cfg.model.context_length
    return static, cfg.model.n_layer * batch * seq * cfg.model.d_model * 4


def test_the_memory_floor_refuses_what_cannot_fit_and_says_the_largest_micro_batch_that_might():
    cfg = small(batch_size=8)
    static, floor8 = _floor_parts(cfg, 8)
    per_sequence = floor8 // 8
    cpu = torch.device("cpu")
    plan_mod.check_memory_floor(cfg, cpu, room=(static + floor8, "there is just enough"))  # no refusal
    with pytest.raises(BurnoutError) as caught:
        plan_mod.check_memory_floor(cfg, cpu, room=(static + 5 * per_sequence + 3, "there is less"))
    line = str(caught.value)
    assert line.startswith("a training step at micro-batch 8 × 512 tokens (29.4M parameters: n_layer 8, d_model 512, "
                           "vocab_size 8,192) needs ")
    assert f"weights, gradients and optimizer state {static / 1e6:.1f} MB" in line
    assert f"activations, at least {floor8 / 1e6:.1f} MB" in line
    assert "and there is less; lower train.batch_size to 5 or less (raise train.grad_accum" in line
    with pytest.raises(BurnoutError, match="choose a smaller model or a shorter train.seq_len"):
        plan_mod.check_memory_floor(cfg, cpu, room=(static + per_sequence - 1, "there is less"))
    with pytest.raises(BurnoutError, match=r"choose a smaller model \(model.n_layer, model.d_model\)"):
        plan_mod.check_memory_floor(cfg, cpu, room=(static - 1, "there is less"))
    unchecked = dataclasses.replace(cfg.train, perf=dataclasses.replace(cfg.train.perf, memory_check=False))
    # The user's word: start anyway.
    plan_mod.check_memory_floor(dataclasses.replace(cfg, train=unchecked), cpu, room=(1, "there is nothing"))


def test_the_memory_floor_of_an_fsdp_run_is_its_share_of_the_weights():
    """A model whose weights, gradients and AdamW state fit only sharded over 8 GPUs is not refused there."""
    cfg = small(batch_size=1, distributed="fsdp")
    static_one, floor = _floor_parts(cfg, 1)
    static_eight, _ = _floor_parts(cfg, 1, devices=8)
    room = (static_eight + floor, "each GPU has enough for its share")
    plan_mod.check_memory_floor(cfg, torch.device("cpu"), world_size=8, room=room)
    with pytest.raises(BurnoutError, match="weights, gradients and optimizer state"):
        plan_mod.check_memory_floor(cfg, torch.device("cpu"), world_size=1, room=room)
    assert static_one > static_eight


def test_a_run_of_a_billion_layers_is_refused_before_its_data_are_prepared(tmp_path, capsys):
    """Its sources would be prepared first (minutes, for a large corpus): nothing is written, not even RUN."""
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({
        "model": {"family": "llama", "vocab_size": 512, "n_layer": 10**9, "d_model": 64, "n_head": 4,
                  "context_length": 64, "ffn_multiple_of": 32},
        "data": {"max_chars": 50_000}, "tokenizer": {"kind": "bpe", "vocab_size": 512},
        "train": {"device": "cpu", "batch_size": 2, "seq_len": 32, "max_steps": 2}}))
    assert main(["train", str(config), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("burnout: error: a training step at micro-batch 2 × 32 tokens (")
    assert "parameters: n_layer 1,000,000,000, d_model 64" in err[0] and "choose a smaller model" in err[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.yaml"]


def test_a_micro_batch_that_cannot_fit_is_refused_before_the_model_is_built(tiny_run_config, tiny_bpe_data, tmp_path,
                                                                               monkeypatch):
    from burnout.train import recipe

    def no_model(*args, **kwargs):
        raise AssertionError("a model was built before its size was checked")

    monkeypatch.setattr(recipe, "build_model", no_model)
    with pytest.raises(BurnoutError, match="micro-batch 1,000,000,000,000 × 32 tokens .* lower train.batch_size"):
        start_training(tiny_run_config(batch_size=10**12), tmp_path / "run", data_dir=tiny_bpe_data,
                       on_event=lambda line: None, progress=False)
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_plan_of_a_vast_accumulation_searches_the_divisors_not_every_number(capsys):
    """8 × 10^18 sequences a step: the largest micro-batch that fits is a divisor of it, found among its divisors
    (a list over every number below it would never end), and no divisor between it and the next one up fits."""
    seqs = 8 * 10**18
    assert main(["plan", "llama-tiny", f"train.grad_accum={10**18}", "--json"]) == 0
    memory = json.loads(capsys.readouterr().out)["memory"]
    best = memory["largest_micro_batch"]
    assert seqs % best == 0 and memory["fits"]
    fits = lambda b: b <= 5000  # noqa: E731
    assert largest_fitting(seqs, 8, fits, start_fits=True) == max(d for d in range(1, 5001) if seqs % d == 0)
    # Against every number, on a count small enough to list them all.
    for n in (720, 1001, 97, 2**10 * 3**4):
        for cap in (1, 7, 50, n):
            brute = max(d for d in range(1, n + 1) if n % d == 0 and d <= cap)
            assert largest_fitting(n, 1, lambda b, cap=cap: b <= cap, start_fits=True) == brute


def test_a_fine_tunes_micro_batch_is_checked_before_its_model_is_built(tiny_run, fine_tune_data, tmp_path,
                                                                       monkeypatch):
    """A fine-tune's model is its base's, known once the base is read: the Trainer checks it, as it does a resumed
    run's, before building it."""
    from burnout.finetune import recipes

    def no_model(*args, **kwargs):
        raise AssertionError("a model was built before its size was checked")

    monkeypatch.setattr(recipes, "build_model", no_model)
    cfg = load_run_config({"sft": {"base": str(tiny_run.run_dir), "source": str(fine_tune_data.chats)},
                           "train": {"device": "cpu", "batch_size": 10**12, "seq_len": 64, "max_steps": 2}})
    with pytest.raises(BurnoutError, match="^a training step at micro-batch 1,000,000,000,000 × 64 tokens .* lower "
                                           "train.batch_size"):
        start_training(cfg, tmp_path / "sft", on_event=lambda line: None, progress=False)


# ----------------------------------------------------------------------------------------------
# What the tokens buy (issue 50): tokens per parameter, and the planner's speed calibrated on published runs


@pytest.mark.slow
def test_plan_says_the_runs_tokens_per_parameter_and_warns_far_below_what_its_size_needs(capsys):
    """`burnout plan PRESET` trains the quickstart's steps: a sliver of a token per parameter of llama-small, which the
    plan says beside its dollars, with the warning (red when the plan says the dollars without a word)."""
    assert main(["plan", "llama-small", "--gpu", "h100"]) == 0
    out = capsys.readouterr().out
    plan = plan_run(plan_mod.plan_config("llama-small"), "h100")
    tokens, params = sum(r["tokens"] for r in plan["phases"]), plan["params"]
    assert tokens / params < 2 and plan["tokens_per_parameter"] == tokens / params
    assert (f"{format_count(tokens)} tokens for {format_count(params)} parameters: {tokens / params:.3g} tokens per "
            "parameter\n") in out
    assert (f"warning: {format_count(tokens)} tokens for {format_count(params)} parameters: {tokens / params:.3g} "
            "tokens per parameter, far below the ~20") in out


@pytest.mark.parametrize("ratio, warned", [(1.99, True), (2.0, False), (11.3, False)])
def test_far_below_is_under_a_tenth_of_the_twenty_tokens_per_parameter(ratio, warned):
    """Under 2 tokens per parameter (a tenth of Hoffmann et al.'s ~20) a model trained from scratch is warned; a
    continued run is told its ratio alone, its parent's tokens unknown to it (red when the threshold moves)."""
    params = 1_000_000
    words, warning = plan_mod.tokens_per_parameter_note(ratio * params, params)
    assert words == f"{ratio:.3g} tokens per parameter" and (warning is not None) == warned
    words, warning = plan_mod.tokens_per_parameter_note(ratio * params, params, from_scratch=False)
    assert warning is None and "its parent trained on its own" in words


@pytest.mark.slow
def test_the_a100s_mfu_is_the_blogs_1b_and_predicts_llm_cs_gpt2_124m_within_15_percent():
    """hardware.yaml's A100 80GB MFU is the blog's GPUburnout-1B, recomputed here by hand: 90,000 steps of 131,072
    tokens for $175 at $1.45/h, at llama-1b's training FLOPs per token (6 × its matmul weights, plus 12·L·T·d for
    attention). At that MFU the planner's hours for llm.c's GPT-2 124M (19,073 steps of 524,288 tokens on 8 A100
    80GB SXM, reported ~90 minutes) are this hand computation's, within 15% of llm.c's (red when the table's MFU, the
    FLOPs count or the planner's arithmetic moves)."""
    d, layers, ffn, kv, vocab, seq = 2048, 16, 8192, 512, 32005, 2048  # llama-1b: GQA 32/8 heads of 64
    flops_1b = 6 * (layers * (2 * d * d + 2 * d * kv + 3 * d * ffn) + vocab * d) + 12 * layers * seq * d
    blog_mfu = 90_000 * 131_072 * flops_1b / (175 / 1.45 * 3600 * 312e12)
    a100 = hardware_table()["a100-80gb"]
    assert a100["mfu"] == pytest.approx(blog_mfu, abs=0.005)  # the table keeps it to two digits
    d, layers, vocab, seq = 768, 12, 50257, 1024  # GPT-2 124M, its head tied to the embedding
    flops_124m = 6 * (layers * 12 * d * d + vocab * d) + 12 * layers * seq * d
    hours = 19_073 * 524_288 * flops_124m / (312e12 * a100["mfu"] * 8) / 3600
    cfg = plan_mod.plan_config("gpt2-124m", ["train.seq_len=1024", "train.batch_size=16", "train.grad_accum=4",
                                             "train.max_steps=19073", "train.precision=bf16", "train.distributed=ddp"])
    plan = plan_run(cfg, "a100-80gb", devices=8)
    assert plan["flops_per_token"] == flops_124m and plan["mfu_note"] == a100["mfu_note"]
    assert sum(r["hours"] for r in plan["phases"]) == pytest.approx(hours, rel=1e-9)
    assert abs(hours - 1.5) / 1.5 < 0.15, hours
