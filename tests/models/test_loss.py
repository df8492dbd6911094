"""The training loss (burnout/models/transformer.py, chunked_cross_entropy): equal to F.cross_entropy over
full logits, in value and in every parameter's gradient, without ever making the (B·T, V) logits, eager
or compiled.

Chunks are made small here (7 rows for 2 × 20 tokens: boundaries fall mid-sequence and the last chunk is
short) so that tiny models cross several of them.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from functorch.compile import make_boxed_func, min_cut_rematerialization_partition
from torch._dynamo.backends.common import aot_autograd
from torch.utils._python_dispatch import TorchDispatchMode

from burnout.config import ModelConfig
from burnout.models import transformer
from burnout.models.transformer import Transformer, loss_chunk_rows

VOCAB = 97
B, T = 2, 20

SHAPES = [
    ("gpt2-tied", dict(family="gpt2")),
    ("llama-gqa-untied", dict(family="llama", ffn_hidden=80, n_kv_head=2, tie_embeddings=False)),
    ("llama-tied", dict(family="llama", ffn_hidden=80)),
]


def build(seed: int = 0, vocab_size: int = VOCAB, **kw) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(ModelConfig(vocab_size=vocab_size, n_layer=2, d_model=48, n_head=6, context_length=32, **kw))


def batch(vocab_size: int = VOCAB, rows: int = B) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    x, y = (torch.randint(0, vocab_size, (rows, T), generator=g) for _ in range(2))
    y[0, :5] = -1  # ignored at both ends of a row and across a chunk boundary (rows 7..13)
    y[1, 13:] = -1
    return x, y


def loss_and_grads(model: Transformer, loss_fn, autocast: bool = False) -> tuple[torch.Tensor, dict]:
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        loss = loss_fn()
    loss.backward()
    return loss.detach(), {name: p.grad for name, p in model.named_parameters()}


def full_logits_loss(model: Transformer, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The loss as it was: the head over every position, upcast, then F.cross_entropy."""
    logits = model.lm_head(model.hidden_states(x)).float()
    return F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1), ignore_index=-1)


class OpOutputs(TorchDispatchMode):
    """Records the element count of the largest tensor any op produces, backward included, the dtypes
    that matrix products come out in, and the (shape, dtype) of every sum of two tensors."""

    def __init__(self):
        super().__init__()
        self.largest = 0
        self.matmul_dtypes = set()
        self.adds = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
                if func in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default):
                    self.matmul_dtypes.add(t.dtype)
                if func in (torch.ops.aten.add.Tensor, torch.ops.aten.add_.Tensor):
                    self.adds.append((tuple(t.shape), t.dtype))
        return out


@pytest.fixture
def chunk_rows(monkeypatch, request) -> int:
    rows = getattr(request, "param", 7)
    monkeypatch.setattr(transformer, "loss_chunk_rows", lambda vocab_size: rows)
    return rows


@pytest.mark.parametrize("chunk_rows", [7, 1, B * T], indirect=True)
@pytest.mark.parametrize("kw", [s[1] for s in SHAPES], ids=[s[0] for s in SHAPES])
def test_chunked_loss_and_gradients_equal_full_cross_entropy(kw, chunk_rows):
    """fp32: the loss to 1e-6 relative, each parameter's gradient to 1e-6 + 1e-5 relative (float sums
    taken in another order differ by ~1e-7 of a gradient's largest entry)."""
    model = build(**kw)
    x, y = batch()
    loss, grads = loss_and_grads(model, lambda: model(x, y))
    ref_loss, ref_grads = loss_and_grads(model, lambda: full_logits_loss(model, x, y))
    torch.testing.assert_close(loss, ref_loss, rtol=1e-6, atol=0)
    assert grads.keys() == ref_grads.keys()
    for name, grad in grads.items():
        assert grad is not None and grad.abs().max() > 0, name
        torch.testing.assert_close(grad, ref_grads[name], rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.parametrize("kw", [s[1] for s in SHAPES], ids=[s[0] for s in SHAPES])
def test_chunked_loss_under_bf16_autocast(kw, chunk_rows):
    """bf16 autocast: the same bf16 logits, so the loss agrees to 1e-4 relative. Gradients agree to 2% of
    each tensor's largest entry (about 5 bf16 ulps): the head's gradients are rounded to bf16 in both, and
    the weight's is summed over chunks in fp32 here but comes out of one bf16 GEMM in the reference."""
    model = build(**kw)
    x, y = batch()
    with OpOutputs() as ops:
        loss, grads = loss_and_grads(model, lambda: model(x, y), autocast=True)
    assert ops.matmul_dtypes == {torch.bfloat16}  # the head's GEMMs too, forward and backward
    ref_loss, ref_grads = loss_and_grads(model, lambda: full_logits_loss(model, x, y), autocast=True)
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, ref_loss, rtol=1e-4, atol=0)
    for name, grad in grads.items():
        scale = ref_grads[name].abs().max()
        assert (grad - ref_grads[name]).abs().max() <= 0.02 * scale, name


def test_head_gradient_sums_the_chunks_in_fp32(chunk_rows):
    """Under bf16 autocast each chunk's gradient of the head's weight comes back in fp32 and the six chunks
    add up in fp32 (from a single cast of the weight shared by all chunks, they would add up in bf16)."""
    model = build(family="llama", ffn_hidden=80, tie_embeddings=False)
    x, y = batch()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(x, y)
    with OpOutputs() as ops:
        loss.backward()
    head_sums = [dtype for shape, dtype in ops.adds if shape == (VOCAB, 48)]
    assert head_sums == [torch.float32] * 5  # 40 rows: chunks of 7, 7, 7, 7, 7, 5


def test_full_logits_are_never_made(chunk_rows):
    """No op, forward or backward, outputs a tensor the size of the logits (B·T·V) or their fp32 copy, and
    autograd keeps none for backward: the largest is the head's weight (and its gradient)."""
    vocab, rows = 4096, 6  # 120 positions: the logits dwarf all else, the head (4096 × 48) included
    model = build(vocab_size=vocab, family="llama", ffn_hidden=80)
    x, y = batch(vocab, rows)
    full = rows * T * vocab
    saved = []
    with OpOutputs() as made, torch.autograd.graph.saved_tensors_hooks(
            lambda t: saved.append(tuple(t.shape)) or t, lambda t: t):
        model(x, y).backward()
    assert made.largest == vocab * 48 < full  # the head's weight and its gradient
    assert {s for s in saved if vocab in s} == {(vocab, 48)}  # the head's weight, an input of each chunk
    # The check has teeth: the logits themselves are seen when asked for.
    with OpOutputs() as made:
        model(x)
    assert made.largest == full


def test_chunk_rows_bound_a_chunks_fp32_logits():
    rows = loss_chunk_rows(32005)  # the 1B's vocab
    assert rows == 2048 and rows * 32005 * 4 <= transformer.LOSS_CHUNK_BYTES
    assert loss_chunk_rows(50257) == 1280 and loss_chunk_rows(512) == 131072
    assert loss_chunk_rows(10**7) == transformer.LOSS_CHUNK_ALIGN  # at least one GEMM tile


def test_compiled_loss_matches_eager_and_keeps_one_logits_tensor(chunk_rows):
    """torch.compile traces the whole-logits loss in one graph (fullgraph) and matches eager's chunked loss;
    the partitioner inductor uses (min-cut) keeps for backward the weight and one (B·T, V) tensor, not one
    per chunk nor an fp32 copy beside a bf16 one: the memory `burnout plan` predicts for a compiled run (it
    partitions the same graph). Run through AOTAutograd without inductor's code generation, whose C++
    build takes ~20 s on two cores."""
    vocab = 256
    model = build(vocab_size=vocab, family="llama", ffn_hidden=80)
    x, y = batch(vocab)
    kept = []

    def forward_compiler(gm, example_inputs):
        outputs = next(n for n in gm.graph.nodes if n.op == "output").args[0]
        kept.extend(tuple(o.meta["val"].shape) for o in outputs if o is not None and "val" in o.meta)
        return make_boxed_func(gm.forward)

    backend = aot_autograd(fw_compiler=forward_compiler, bw_compiler=lambda gm, _: make_boxed_func(gm.forward),
                           partition_fn=min_cut_rematerialization_partition)
    loss, grads = loss_and_grads(model, lambda: model(x, y))
    compiled = torch.compile(model, backend=backend, fullgraph=True)
    c_loss, c_grads = loss_and_grads(model, lambda: compiled(x, y))
    torch.testing.assert_close(c_loss, loss, rtol=1e-6, atol=0)
    for name, grad in c_grads.items():
        torch.testing.assert_close(grad, grads[name], rtol=1e-5, atol=1e-6, msg=name)
    rows = x.numel()
    assert sorted(s for s in kept if vocab in s) == sorted([(vocab, 48), (rows, vocab)])
