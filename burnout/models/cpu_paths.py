"""CPU fast paths that burnout/models/transformer.py takes where PyTorch's general CPU kernels are slow.

Each computes the same function as the plain op, only rounded differently, and is taken only on a CPU, eager;
GPUs and compiled graphs keep PyTorch's own ops. The measurements that justify each one are in
docs/PERFORMANCE.md.

- linear: a decoding step's few rows multiplied by a weight packed once for oneDNN; packs_weights decides whether
  a model's decoding takes it, few_row_products turns it on, forget_packed_weights frees the packed copies;
- gelu_tanh: GPT-2's GELU through a sigmoid rather than PyTorch's slow CPU tanh;
- explicit_is_faster: where the written-out attention beats SDPA's CPU kernels.
"""

from __future__ import annotations

import contextlib
import math
import threading
import weakref
from collections.abc import Iterator

import torch
import torch.nn as nn
import torch.nn.functional as F

from burnout.base.machine import available_memory

# Rows up to which a decoding step's fp32 product on a CPU takes oneDNN with a packed weight (see linear), and the size
# of weights from which they are read from memory at every step rather than from the caches (see packs_weights).
FEW_ROWS = 32
STREAMED_WEIGHT_BYTES = 32 * 2**20
# oneDNN's inner product, which x86 builds of PyTorch carry (torch.compile's CPU backend packs weights for it too).
_ONEDNN = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


class _FewRowProducts(threading.local):
    on = False


_few_row_products = _FewRowProducts()
# Each layer's weight in oneDNN's blocked layout, with the weight, storage, address and version it was packed from
# (a parameter replaced, moved or changed in place is packed again), for as long as the layer lives: packing a weight
# costs about what its packed copy saves over many decoding steps, so it is done once. The storage, not only the
# address: a .data swap keeps the parameter's version, and the allocator may hand the new data the address of the
# old (Module.half() then .float()). Writes through .data, which autograd does not see either, go unseen.
_packed: weakref.WeakKeyDictionary[nn.Linear, tuple[weakref.ref, weakref.ref, int, int, torch.Tensor]] = (
    weakref.WeakKeyDictionary())


def packs_weights(model: nn.Module) -> bool:
    """Whether `model`'s decoding steps take `linear`'s packed route: oneDNN is there, a step reads the weights from
    memory (at least STREAMED_WEIGHT_BYTES), and their packed copy, which stays with the layers, takes at most half
    the memory available now (or is already made). Weights small enough to stay in the caches keep MKL's GEMM:
    there oneDNN's call costs more than the product it speeds up."""
    nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    if not _ONEDNN or nbytes < STREAMED_WEIGHT_BYTES:
        return False
    available = available_memory()
    return available is None or 2 * nbytes <= available or any(m in _packed for m in model.modules())


@contextlib.contextmanager
def few_row_products(on: bool = True) -> Iterator[None]:
    """Within it, in this thread, `linear` may take its packed route (a decoding step of a model that
    packs_weights)."""
    previous, _few_row_products.on = _few_row_products.on, on
    try:
        yield
    finally:
        _few_row_products.on = previous


def forget_packed_weights(model: nn.Module) -> None:
    """Free the packed copies of `model`'s weights (as much memory again as its linear layers) that decoding keeps."""
    for module in model.modules():
        _packed.pop(module, None)


def linear(layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """layer(x), or within few_row_products, on a CPU without autograd, for a plain nn.Linear in fp32 over at most
    FEW_ROWS rows (a decoding step's batch), oneDNN's inner product with the weight packed once into its blocked
    layout (see _packed; packed again when the weight changes): the same products summed in another order (within
    1e-6).

    MKL's fp32 GEMM with a weight read from memory runs well below the memory's speed at a few rows; the packed
    weight comes closer to it. LoRA and fp8 layers, autocast, autograd and compiled graphs take the layer's own
    forward.
    """
    # The flag first: outside a streamed decoding step (training, scoring, small models) this costs one attribute.
    if (not _few_row_products.on or type(layer) is not nn.Linear or x.numel() > FEW_ROWS * x.size(-1)
            or x.device.type != "cpu" or x.dtype != torch.float32 or torch.is_grad_enabled()
            or torch.is_autocast_enabled("cpu") or torch.compiler.is_compiling()):
        return layer(x)
    rows, weight = x.numel() // x.size(-1), layer.weight
    storage, stored = weight.untyped_storage(), _packed.get(layer)
    if (stored is None or stored[0]() is not weight or stored[1]() is not storage
            or stored[2:4] != (weight.data_ptr(), weight._version)):
        packed = torch.ops.mkldnn._reorder_linear_weight(weight, rows)
        stored = _packed[layer] = (weakref.ref(weight), weakref.ref(storage), weight.data_ptr(), weight._version,
                                   packed)
    out = torch.ops.mkldnn._linear_pointwise(x.reshape(rows, -1), stored[4], layer.bias, "none", [], "")  # (N, out)
    return out.view(*x.shape[:-1], -1)


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    """GPT-2's GELU, x·(1 + tanh(u))/2 with u = √(2/π)·(x + 0.044715·x³). In fp32 on a CPU without autograd, as the
    same function x·sigmoid(2u) (within 1e-6): PyTorch's CPU tanh is slow, its sigmoid is not."""
    if (x.device.type != "cpu" or x.dtype != torch.float32 or torch.is_grad_enabled()
            or torch.compiler.is_compiling()):
        return F.gelu(x, approximate="tanh")
    scale = 2 * math.sqrt(2 / math.pi)
    u = (x * x).mul_(0.044715 * scale).add_(scale).mul_(x)  # 2u
    return u.sigmoid_().mul_(x)


def explicit_is_faster(x: torch.Tensor, n_keys: int, p: float) -> bool:
    """Whether the written-out attention beats SDPA here: on a CPU, eager, with dropout (SDPA's CPU kernel has none
    and falls back to its math kernel with torch's Bernoulli mask), and under bf16 autocast also up to 512 keys.
    Past 512 keys SDPA's flash kernel wins by skipping the masked half; in fp32 without dropout SDPA stays."""
    if x.device.type != "cpu" or torch.compiler.is_compiling():
        return False
    return p > 0 or (torch.is_autocast_enabled("cpu") and n_keys <= 512)
