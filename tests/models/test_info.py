"""Model cost accounting (burnout/models/info.py): parameter counts, FLOPs per token, and the
`burnout model info` command. Every model here is built on the meta device, so even llama-3b is free.

Expected numbers are written out from the preset shapes, not copied from the code under test.
"""

from __future__ import annotations

import dataclasses
import json
import resource

import pytest
import torch

from burnout.cli import main
from burnout.config import load_model_preset, model_preset_names
from burnout.models import info as info_mod
from burnout.models.info import model_info

# name: (total parameters, vocab, d_model, learned-position rows or 0 for RoPE models)
PRESETS = {
    "shakespeare-char": (421_504, 65, 128, 128),
    "gpt2-124m": (124_439_808, 50257, 768, 1024),
    "gpt2-134m": (134_601_216, 32000, 768, 512),
    "llama-1b": (1_038_692_352, 32005, 2048, 0),
    "llama-2b": (1_921_181_184, 32005, 2304, 0),
    "llama-3b": (3_122_969_600, 32005, 2560, 0),
    "llama-tiny": (4_196_608, 4096, 256, 0),
    "llama-small": (29_368_832, 8192, 512, 0),
    # 6 × (12·384² + 2·384) + 384 + 66·384 + 256·384 (no biases, tied)
    "gpt2-10m": (10_745_472, 66, 384, 256),
    # 3 × (128·384 + 128² + 3·128·384 + 2·128) + 128 + 66·128 (SwiGLU hidden 384, tied)
    "shakespeare-fast": (648_320, 66, 128, 0),
}


def test_every_preset_is_covered():
    assert sorted(PRESETS) == model_preset_names()


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_preset_parameter_counts(name):
    total, vocab, d_model, positions = PRESETS[name]
    info = model_info(load_model_preset(name))
    assert info["params_total"] == total
    # Non-embedding: the token table and (gpt2 only) the learned position table come out.
    assert info["params_non_embedding"] == total - vocab * d_model - positions * d_model


def test_gpt2_124m_by_hand():
    """GPT-2 small from first principles: 12 blocks of 12·C² + 13·C, final LayerNorm, two tables."""
    C, L, V, T = 768, 12, 50257, 1024
    block = 12 * C * C + 13 * C  # qkv + proj + fc + proj weights, their biases, two LayerNorms
    assert model_info(load_model_preset("gpt2-124m"))["params_total"] == L * block + 2 * C + V * C + T * C


def test_untied_head_is_counted_in_non_embedding():
    tied = model_info(load_model_preset("gpt2-134m", {"tie_embeddings": True}))
    untied = model_info(load_model_preset("gpt2-134m"))
    assert untied["params_total"] - tied["params_total"] == 32000 * 768
    assert untied["params_non_embedding"] - tied["params_non_embedding"] == 32000 * 768


def test_flops_per_token_gpt2_124m():
    C, L, V, T = 768, 12, 50257, 1024
    matmul = L * (C * 3 * C + C * C + 2 * C * 4 * C) + C * V  # qkv, proj, fc, proj; then the head
    info = model_info(load_model_preset("gpt2-124m"), seq_len=T)
    assert info["params_matmul"] == matmul
    assert info["flops_per_token_dense"] == 6 * matmul
    assert info["flops_per_token_attention"] == 12 * L * T * C
    assert info["flops_per_token"] == 6 * matmul + 12 * L * T * C == 854_438_400


def test_flops_scale_with_seq_len_only_in_attention():
    cfg = load_model_preset("gpt2-124m")
    short, long = model_info(cfg, seq_len=256), model_info(cfg, seq_len=1024)
    assert short["flops_per_token_dense"] == long["flops_per_token_dense"]
    assert long["flops_per_token_attention"] == 4 * short["flops_per_token_attention"]


def test_llama_gqa_flops_and_kv_cache():
    """llama-1b: q is 32 heads but k/v only 8, so qkv is C × (32 + 2·8)·64; the KV cache uses 8 heads."""
    C, L, V, H, K, D, F, T = 2048, 16, 32005, 32, 8, 64, 8192, 2048
    matmul = L * (C * (H + 2 * K) * D + H * D * C + 3 * C * F) + C * V
    info = model_info(load_model_preset("llama-1b"), precision="bf16")
    assert info["params_matmul"] == matmul
    assert info["flops_per_token"] == 6 * matmul + 12 * L * T * H * D
    # Training keeps fp32 weights under autocast too (its bf16 copies are activations, measured on request);
    # gradients are fp32 and AdamW keeps two fp32 moments.
    P = 1_038_692_352
    assert {k: info["memory_bytes"][k] for k in ("weights", "gradients", "optimizer")} == \
        {"weights": P * 4, "gradients": P * 4, "optimizer": P * 8}
    assert info["memory_bytes"]["kv_cache_per_sequence"] == 2 * L * K * D * T * 2
    fp32 = model_info(load_model_preset("llama-1b"), precision="fp32")
    assert fp32["memory_bytes"]["weights"] == P * 4
    assert fp32["memory_bytes"]["kv_cache_per_sequence"] == 2 * L * K * D * T * 4


def test_model_info_builds_on_meta(monkeypatch):
    """The model that info counts is built on the meta device: no parameter storage is allocated."""
    built = []
    real = info_mod.Transformer

    def spy(cfg):
        model = real(cfg)
        built.append({p.device.type for p in model.parameters()})
        return model

    monkeypatch.setattr(info_mod, "Transformer", spy)
    model_info(load_model_preset("llama-3b"))
    assert built == [{"meta"}]


def test_cli_model_info_json_llama_3b(capsys):
    C, L, V, H, K, D, F, T = 2560, 32, 32005, 40, 10, 64, 10240, 2048
    peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    assert main(["model", "info", "llama-3b", "--json"]) == 0
    peak_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    data = json.loads(capsys.readouterr().out)
    assert data["params_total"] == 3_122_969_600
    assert data["params_non_embedding"] == 3_122_969_600 - V * C
    matmul = L * (C * (H + 2 * K) * D + H * D * C + 3 * C * F) + C * V
    assert data["flops_per_token"] == 6 * matmul + 12 * L * T * H * D
    assert data["config"]["n_kv_head"] == K and data["config"]["ffn_hidden"] == F
    # 3.1B fp32 weights would be 12 GB; building on meta costs next to nothing.
    assert peak_after - peak_before < 1_000_000


def test_cli_model_info_text(capsys):
    assert main(["model", "info", "llama-tiny"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("llama-tiny (llama)")
    assert "4,196,608" in out and "3,148,032" in out
    assert "weights              0.016 GiB  fp32 (derived)" in out  # 4,196,608 × 4 bytes
    assert "activations" in out and "(measured, eager, CUDA kernels)" in out


def test_cli_model_info_memory_adds_up(capsys):
    """The measured lines come from burnout.models.memory and the total is the sum that `burnout plan` uses."""
    from burnout.models.memory import measure_step

    assert main(["model", "info", "llama-tiny", "--batch-size", "8", "--json"]) == 0
    mem = json.loads(capsys.readouterr().out)["memory_bytes"]
    step = measure_step(load_model_preset("llama-tiny"), 8, 256, "bf16", target="cuda")
    assert (mem["activations"], mem["weight_copies"], mem["working"]) == (step.saved, step.weight_copies,
                                                                          step.working)
    assert mem["total"] == sum(mem[k] for k in ("weights", "gradients", "optimizer", "activations",
                                                "weight_copies", "working"))


@pytest.mark.parametrize("override", ["n_layer=2", "model.n_layer=2", "--n_layer=2"])
def test_cli_model_info_override_halves_blocks(capsys, override):
    assert main(["model", "info", "llama-tiny", "--json"]) == 0
    four = json.loads(capsys.readouterr().out)
    assert main(["model", "info", "llama-tiny", override, "--json"]) == 0
    two = json.loads(capsys.readouterr().out)
    final_norm = 256
    assert two["config"]["n_layer"] == 2
    assert two["params_non_embedding"] - final_norm == (four["params_non_embedding"] - final_norm) // 2
    assert four["params_total"] - two["params_total"] == (four["params_non_embedding"] - final_norm) // 2
    # One llama-tiny block: qkv 256×(8+2·4)·32, proj 256², SwiGLU 3·256·768, two RMSNorms.
    assert two["params_non_embedding"] == 2 * (256 * 512 + 256 * 256 + 3 * 256 * 768 + 2 * 256) + final_norm


def test_cli_model_info_rejects_bad_override(capsys):
    assert main(["model", "info", "llama-tiny", "n_head=7"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("burnout: error: model.n_head")
    assert main(["model", "info", "llama-tiny", "n_layrs=2"]) == 2
    assert "model.n_layrs: unknown key; did you mean 'n_layer'" in capsys.readouterr().err


@pytest.mark.timeout(60)
def test_cli_model_info_of_a_million_blocks_counts_one_and_traces_five(capsys):
    """`model.n_layer=1000000` (a slip for 10) is answered at once: the blocks are identical, so one is counted and
    four and five are traced, where building or tracing every block would take hours."""
    from burnout.models.memory import trace_step
    from burnout.models.transformer import Transformer

    assert main(["model", "info", "llama-tiny", "model.n_layer=1000000", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    cfg = load_model_preset("llama-tiny")
    with torch.device("meta"):
        one, two = (sum(p.numel() for p in Transformer(dataclasses.replace(cfg, n_layer=n)).parameters())
                    for n in (1, 2))
    assert info["params_total"] == one + 999_999 * (two - one)
    assert info["memory_bytes"]["weights"] == 4 * info["params_total"]
    # Each block keeps as much for backward as the one before: whole traces of six and seven blocks give the line.
    six, seven = (trace_step(dataclasses.replace(cfg, n_layer=n).resolved(), 1, 256, "bf16", False, "cuda")[0]
                  for n in (6, 7))
    for line, field in (("activations", "saved"), ("weight_copies", "weight_copies")):
        low, high = getattr(six, field), getattr(seven, field)
        assert info["memory_bytes"][line] == low + (1_000_000 - 6) * (high - low) > 0


@pytest.mark.timeout(60)
def test_cli_model_info_of_a_trillion_blocks_keeps_no_list_of_them(capsys):
    """A count of 10^12 blocks keeps one block's tensor sizes, not 10^12 copies (the list alone would take 70 TB):
    the parameters and the optimizer state are the line through one and two blocks, adamw8bit's too."""
    from burnout.models.memory import adamw8bit_state_bytes, param_counts, static_bytes
    from burnout.models.transformer import Transformer

    assert main(["model", "info", "llama-tiny", "model.n_layer=1000000000000", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    cfg = load_model_preset("llama-tiny")
    one, two = (param_counts(dataclasses.replace(cfg, n_layer=n)) for n in (1, 2))
    assert info["params_total"] == one.total + (10**12 - 1) * (two.total - one.total)
    assert info["memory_bytes"]["optimizer"] == 8 * info["params_total"]

    def tree_state(n: int) -> int:  # adamw8bit's state of each tensor of the real module tree (a tied one once)
        with torch.device("meta"):
            model = Transformer(dataclasses.replace(cfg, n_layer=n))
        return sum(adamw8bit_state_bytes(p.numel()) for p in model.parameters())

    lowbit = [tree_state(n) for n in (1, 2, 3)]
    assert static_bytes(param_counts(dataclasses.replace(cfg, n_layer=3)), "adamw8bit")["optimizer"] == lowbit[2]
    deep = param_counts(dataclasses.replace(cfg, n_layer=10**12))
    assert static_bytes(deep, "adamw8bit")["optimizer"] == lowbit[0] + (10**12 - 1) * (lowbit[1] - lowbit[0])


def test_info_matches_a_real_model():
    """The meta-device count equals the count of a real (tiny) model's parameters."""
    from burnout.models.transformer import Transformer

    cfg = load_model_preset("llama-tiny", {"tie_embeddings": False})
    real = Transformer(cfg)
    assert model_info(cfg)["params_total"] == sum(p.numel() for p in real.parameters()) == 4_196_608 + 4096 * 256
    assert all(p.device == torch.device("cpu") for p in real.parameters())
