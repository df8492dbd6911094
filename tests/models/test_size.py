"""Sizes checked before work (burnout/models/size.py): the parameter count of a config's arithmetic against the
module tree, the shapes no machine can address, the floor of a step's activations against what the tracer
measures, and what this process may still take. Nothing here builds a model larger than a few blocks."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import pytest
import torch

from burnout.config import ModelConfig, load_model_preset, model_preset_names
from burnout.errors import BurnoutError
from burnout.models import size
from burnout.models.memory import compiled_saved, measure_step
from burnout.models.transformer import Transformer

LLAMA = ModelConfig(family="llama", vocab_size=512, n_layer=2, d_model=64, n_head=4, n_kv_head=2, context_length=64,
                    ffn_multiple_of=32)
GPT2 = ModelConfig(family="gpt2", vocab_size=300, n_layer=2, d_model=64, n_head=4, context_length=64)
SHAPES = [LLAMA, GPT2, dataclasses.replace(LLAMA, tie_embeddings=False, bias=True, ffn_hidden=100),
          dataclasses.replace(GPT2, bias=False, tie_embeddings=False, n_layer=3),
          dataclasses.replace(LLAMA, n_kv_head=1, n_head=8)]


def _modules(cfg: ModelConfig) -> tuple[int, int]:
    """(parameters, fp32 bytes of parameters and buffers) of the real module tree, on the meta device."""
    with torch.device("meta"):
        model = Transformer(cfg)
    return (sum(p.numel() for p in model.parameters()),
            sum(t.numel() * 4 for t in [*model.parameters(), *model.buffers()]))


@pytest.mark.parametrize("cfg", SHAPES + [load_model_preset(name) for name in model_preset_names()],
                         ids=[f"shape{i}" for i in range(len(SHAPES))] + model_preset_names())
def test_the_arithmetic_counts_what_the_modules_hold(cfg):
    params, nbytes = _modules(cfg)
    assert size.parameter_count(cfg) == params
    assert size.weights_bytes(cfg) == nbytes  # the RoPE table's cos and sin too


@pytest.mark.parametrize("cfg, key", [
    (dataclasses.replace(LLAMA, vocab_size=2**60), "model.vocab_size 1,152,921,504,606,846,976: the token embedding"),
    (dataclasses.replace(LLAMA, d_model=2**31, n_head=2**20, n_kv_head=2**20), "model.d_model 2,147,483,648"),
    (dataclasses.replace(GPT2, context_length=2**60), "model.context_length 1,152,921,504,606,846,976: the position"),
    (dataclasses.replace(LLAMA, n_layer=2**60), "model.n_layer 1,152,921,504,606,846,976: the weights together"),
])
def test_a_shape_past_a_64_bit_address_space_is_refused_naming_its_setting(cfg, key):
    with pytest.raises(BurnoutError, match="past the 2\\^63") as caught:
        size.addressable(cfg)
    assert str(caught.value).startswith(key) and str(caught.value).endswith("give a smaller " + key.split()[0])


def test_no_module_is_built_of_a_shape_past_it_even_on_the_meta_device():
    with torch.device("meta"), pytest.raises(BurnoutError, match="^model.vocab_size 1,152,921,504,606,846,976: "):
        Transformer(dataclasses.replace(LLAMA, vocab_size=2**60))


def test_a_batch_or_sequence_past_it_names_the_flag_that_set_it_or_the_context():
    size.addressable(LLAMA, 2**46, 64)  # 2^52 tokens of 192 values (the MLP's) in fp32: 2^61.6 bytes
    with pytest.raises(BurnoutError, match="^--batch-size 281,474,976,710,656: a step's hidden states"):
        size.addressable(LLAMA, 2**48, 64, "--batch-size", "--seq-len")  # 2^63.6 bytes
    with pytest.raises(BurnoutError, match="^model.context_length 1,073,741,824: a step's attention scores"):
        size.addressable(dataclasses.replace(LLAMA, context_length=2**30), 1)  # 4 heads × 2^60 scores in fp32
    size.addressable(dataclasses.replace(LLAMA, context_length=2**30))  # the model alone: its tables are addressable
    with pytest.raises(BurnoutError, match="^--seq-len 100: longer than the model's context_length 64"):
        size.check_sequence(LLAMA, 1, 100, "--batch-size", "--seq-len")


@pytest.mark.slow
@pytest.mark.parametrize("cfg", [LLAMA, GPT2], ids=["llama", "gpt2"])
def test_the_activations_floor_is_below_what_every_variant_keeps(cfg):
    """A refusal on the floor is never wrong: eager, checkpointed and compiled steps each keep more, at any
    precision."""
    floor = size.activations_floor(cfg, 3, 32)
    for precision in ("bf16", "fp32"):
        for checkpointing in (False, True):
            assert floor <= measure_step(cfg, 3, 32, precision, checkpointing, "cuda").saved
    assert floor <= compiled_saved(cfg, 3, 32, "bf16", "cuda")[0]
    # Checkpointed, a block keeps its fp32 input and nothing more: the floor's share of a block is exact.
    deeper = measure_step(dataclasses.replace(cfg, n_layer=3), 3, 32, "bf16", True, "cuda").saved
    assert deeper - measure_step(cfg, 3, 32, "bf16", True, "cuda").saved == floor // cfg.n_layer


def test_refuse_unless_fits_says_the_parts_the_room_and_the_fix():
    parts = [("weights", 3_000_000_000), ("activations, at least", 2_000_000_000)]
    size.refuse_unless_fits("x", parts, (5_000_000_000, "there are 5.0 GB"), "fix it")  # exactly fits
    size.refuse_unless_fits("x", parts, None, "fix it")  # nothing known of the room: nothing refused
    with pytest.raises(BurnoutError) as caught:
        size.refuse_unless_fits("a step", parts, (4_999_999_999, "there are 5.0 GB"), "fix it")
    assert str(caught.value) == ("a step needs 5.0 GB (weights 3.0 GB; activations, at least 2.0 GB) and there are "
                                 "5.0 GB; fix it")


@pytest.mark.slow
def test_machine_memory_is_what_an_address_space_limit_leaves():
    """Under `ulimit -v`, what the process may still map: its limit less what it has mapped already."""
    limit = 6 * 2**30
    code = ("from burnout.models.size import machine_memory, _address_space_used; "
            "room, words = machine_memory(); used = _address_space_used(); "
            f"print(room, used, room == {limit} - used, 'ulimit -v' in words)")

    def cap():
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, preexec_fn=cap,
                         env={**os.environ, "OMP_NUM_THREADS": "1"}, check=True).stdout.split()
    assert int(out[1]) > 0 and out[2:] == ["True", "True"], out


def test_weights_that_do_not_fit_are_refused_before_a_module_is_built(monkeypatch):
    params, nbytes = _modules(LLAMA)
    built = []
    monkeypatch.setattr(Transformer, "__init__", lambda *a, **k: built.append(a))
    monkeypatch.setattr(size, "machine_memory", lambda: (nbytes - 1, "there is less"))
    with pytest.raises(BurnoutError) as caught:
        size.check_weights_fit(LLAMA, "the run's model")
    assert str(caught.value) == (f"the run's model, {params / 1000:.1f}K parameters: n_layer 2, d_model 64, vocab_size "
                                 f"512, needs {nbytes / 1000:.1f} kB for its fp32 weights and there is less; choose a "
                                 "smaller model")
    monkeypatch.setattr(size, "machine_memory", lambda: (nbytes, "there is enough"))
    size.check_weights_fit(LLAMA, "the run's model")
    assert not built
