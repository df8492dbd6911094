"""CPU fast paths (burnout/models/cpu_paths.py): the choice of the written-out attention, a decoding step's
few rows through oneDNN with weights packed once, and GPT-2's GELU through a sigmoid, each against the plain op.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from burnout.models.cpu_paths import (
    _ONEDNN,
    FEW_ROWS,
    _packed,
    explicit_is_faster,
    few_row_products,
    forget_packed_weights,
    gelu_tanh,
    linear,
)


def test_a_cpu_step_takes_the_explicit_attention_where_it_measured_faster():
    """With dropout in either precision (SDPA's CPU dropout is its math kernel with a Bernoulli mask), in bf16 up
    to 512 keys; SDPA in fp32 without dropout, past 512 keys in bf16, and in compiled graphs."""
    x = torch.zeros(1, 4, 8)
    assert explicit_is_faster(x, 256, 0.2) and not explicit_is_faster(x, 256, 0.0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert explicit_is_faster(x, 512, 0.0) and not explicit_is_faster(x, 1024, 0.0)
        assert explicit_is_faster(x, 1024, 0.1)
    assert not torch.compile(explicit_is_faster, fullgraph=True, backend="eager")(x, 256, 0.2)


class Ops(TorchDispatchMode):
    """The ops that run under it, in order."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(func)
        return func(*args, **(kwargs or {}))


PACKED_PRODUCT, PACKING = torch.ops.mkldnn._linear_pointwise.default, torch.ops.mkldnn._reorder_linear_weight.default
needs_onednn = pytest.mark.skipif(not _ONEDNN, reason="this build of PyTorch has no oneDNN")


@needs_onednn
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("rows", [(1, 1), (4, 1), (2, 4), (1, FEW_ROWS)])
def test_a_few_rows_on_a_cpu_without_autograd_take_onednn_with_the_weight_packed_once(rows, bias):
    """A decoding step's rows (B, 1, C), or a short prompt's: the layer's output within 1e-5 in its shape, from
    oneDNN's product with the weight packed at the first call only (red when the route or the store is dropped)."""
    g = torch.Generator().manual_seed(0)
    layer = torch.nn.Linear(48, 500, bias=bias)
    x = torch.randn(*rows, 48, generator=g)
    with torch.no_grad(), few_row_products():
        with Ops() as first:
            out = linear(layer, x)
        with Ops() as second:
            again = linear(layer, x)
    assert first.ops.count(PACKING) == 1 and first.ops.count(PACKED_PRODUCT) == 1
    assert PACKING not in second.ops and second.ops.count(PACKED_PRODUCT) == 1
    assert out.shape == (*rows, 500) and out.is_contiguous()
    torch.testing.assert_close(out, layer(x), atol=1e-5, rtol=0)
    torch.testing.assert_close(again, out, atol=0, rtol=0)


@needs_onednn
def test_a_weight_changed_in_place_is_packed_again_and_forgetting_frees_the_copies():
    """An optimizer's step between two generations (the training loop's samples) changes the weight in place, and
    a parameter may be replaced or its data swapped: the next product reads the new weight (red without the
    version, identity or address check). forget_packed_weights drops the copy."""
    g = torch.Generator().manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(48, 500))
    layer, x = model[0], torch.randn(4, 1, 48, generator=g)
    with torch.no_grad(), few_row_products():
        linear(layer, x)
        layer.weight.mul_(-2.0)
        torch.testing.assert_close(linear(layer, x), layer(x), atol=2e-5, rtol=0)
        layer.weight = torch.nn.Parameter(torch.randn(500, 48, generator=g))
        torch.testing.assert_close(linear(layer, x), layer(x), atol=2e-5, rtol=0)
        layer.weight.data = torch.randn(500, 48, generator=g)  # as Module.to() swaps a parameter's data
        torch.testing.assert_close(linear(layer, x), layer(x), atol=2e-5, rtol=0)
        # A parameter deleted and another made: malloc may hand this one the same address (on glibc here), and a
        # fresh tensor has the same version (0: a .data swap keeps the parameter's): its identity and storage tell
        # it apart. Its values written, not torch.empty's: those are whatever the memory held (NaN at times).
        version = layer.weight._version
        del layer.weight
        fresh = torch.randn(500, 48, generator=g)
        layer.weight = torch.nn.Parameter(fresh)
        assert fresh._version == version
        torch.testing.assert_close(linear(layer, x), layer(x), atol=2e-5, rtol=0)
    assert layer in _packed
    forget_packed_weights(model)
    assert layer not in _packed


@needs_onednn
def test_a_weight_reallocated_at_the_same_address_and_version_is_packed_again():
    """Module.half() then .float() frees a weight and may allocate its new data at the old address, and a .data
    swap keeps the parameter's version: the storage alone tells them apart (red without the storage check). A new
    parameter over the same storage, at the version the copy was packed at, is told apart by its identity alone
    (red without the identity check). Both deterministic: another storage over the same memory stands for the
    allocator's reuse."""
    g = torch.Generator().manual_seed(0)
    layer, x = torch.nn.Linear(48, 500), torch.randn(4, 1, 48, generator=g)
    with torch.no_grad(), few_row_products():
        linear(layer, x)
        address, version = layer.weight.data_ptr(), layer.weight._version
        reallocated = torch.from_numpy(layer.weight.detach().numpy())  # the same memory, another storage
        reallocated.normal_(generator=g)  # new values, written through its own version counter
        layer.weight.data = reallocated
        assert layer.weight.data_ptr() == address and layer.weight._version == version
        torch.testing.assert_close(linear(layer, x), layer(x), atol=2e-5, rtol=0)

        layer.weight = torch.nn.Parameter(torch.randn(500, 48, generator=g))  # version 0
        linear(layer, x)
        layer.weight.mul_(-2.0)
        layer.weight = torch.nn.Parameter(layer.weight.data)  # the same storage and address, version 0 again
        assert layer.weight._version == 0
        torch.testing.assert_close(linear(layer, x), layer(x), atol=2e-5, rtol=0)


def test_linear_takes_the_layers_own_forward_past_a_few_rows_with_autograd_adapters_or_autocast():
    """Each case's output is the layer's own, bitwise, and nothing is packed; outside few_row_products too."""
    from burnout.models.lora import LoRALinear

    g = torch.Generator().manual_seed(0)
    layer = torch.nn.Linear(48, 500)
    x = torch.randn(2, 4, 48, generator=g)
    adapted = LoRALinear(layer, r=2, alpha=4)
    torch.nn.init.normal_(adapted.lora_B, generator=g)  # an adapter that changes the output
    many = torch.randn(1, FEW_ROWS + 1, 48, generator=g)
    cases = [(layer, many, few_row_products), (adapted, x, few_row_products), (layer, x, torch.enable_grad),
             (layer, x, lambda: torch.autocast("cpu", dtype=torch.bfloat16)), (layer, x, contextlib.nullcontext)]
    for module, rows, context in cases:
        with torch.no_grad(), few_row_products(context is not contextlib.nullcontext), context():
            with Ops() as ops:
                out = linear(module, rows)
            assert PACKED_PRODUCT not in ops.ops and PACKING not in ops.ops
            torch.testing.assert_close(out, module(rows), atol=0, rtol=0)
    assert (adapted(x) - layer(x)).abs().max() > 1e-2


def test_gpt2_gelu_without_autograd_is_the_tanh_gelu():
    """The sigmoid form that inference on a CPU takes equals F.gelu(approximate="tanh") within 1e-6 from -12 to
    12; with autograd, in bf16 and on the tensor's own device otherwise it is F.gelu itself."""
    x = torch.linspace(-12, 12, 100_001)
    with torch.no_grad():
        torch.testing.assert_close(gelu_tanh(x), F.gelu(x, approximate="tanh"), atol=1e-6, rtol=1e-6)
        exact = F.gelu(x.double(), approximate="tanh")
        assert (gelu_tanh(x).double() - exact).abs().max() < 1e-6
        half = x.bfloat16()
        assert torch.equal(gelu_tanh(half), F.gelu(half, approximate="tanh"))
    x.requires_grad_()
    y = gelu_tanh(x)
    assert y.grad_fn is not None and torch.equal(y, F.gelu(x, approximate="tanh"))
