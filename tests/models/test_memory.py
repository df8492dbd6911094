"""Training memory measured on fake tensors (burnout/models/memory.py) against what real CPU tensors do.

The references here are independent of the code under test: saved tensors counted by data pointer on a
real forward, the CPU allocator's own peak from the profiler, the optimizer's own parameter split.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json

import pytest
import torch

from burnout.config import ModelConfig, load_model_preset
from burnout.models import memory
from burnout.models.memory import chunked_loss, compiled_saved, cuda_attention, measure_step, param_counts, static_bytes
from burnout.models.transformer import Transformer

# Small enough to run for real in a blink; GQA (4 query heads over 2) and a SwiGLU MLP, or GELU + LayerNorm.
LLAMA = ModelConfig(family="llama", vocab_size=512, n_layer=2, d_model=64, n_head=4, n_kv_head=2, context_length=64,
                    ffn_multiple_of=32)
GPT2 = ModelConfig(family="gpt2", vocab_size=300, n_layer=2, d_model=64, n_head=4, context_length=64)


def real_saved_bytes(cfg: ModelConfig, batch_size: int, seq_len: int, precision: str) -> int:
    """Bytes of the distinct storages a real CPU forward saves for backward, parameters left out."""
    torch.manual_seed(0)
    model = Transformer(cfg)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            saved[storage.data_ptr()] = storage.nbytes()
        return t

    x, y = torch.randint(0, cfg.vocab_size, (2, batch_size, seq_len))
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16")
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), autocast:
        model(x, y)
    return sum(saved.values())


def allocator_peak(prof) -> int:
    """Peak of the CPU allocator's running total over a profile, from its allocation events in time order."""
    from torch._C._profiler import _EventType

    events, stack = [], list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        if node.tag == _EventType.Allocation:
            events.append((node.start_time_ns, node.extra_fields.alloc_size))
        stack.extend(node.children)
    return max(itertools.accumulate(size for _, size in sorted(events)))


@pytest.mark.parametrize("cfg", [LLAMA, GPT2], ids=["llama", "gpt2"])
@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_saved_bytes_equal_a_real_cpu_forward(cfg, precision):
    step = measure_step(cfg, 3, 48, precision, target="cpu")
    assert step.saved + step.weight_copies == real_saved_bytes(cfg, 3, 48, precision)
    if precision == "fp32":
        assert step.weight_copies == 0
    else:  # every linear in the blocks keeps its bf16 weight for backward; the loss may keep the head's
        real = Transformer(cfg)
        blocks = sum(2 * m.weight.numel() for m in real.blocks.modules() if isinstance(m, torch.nn.Linear))
        assert blocks <= step.weight_copies <= blocks + 2 * real.lm_head.weight.numel()


@pytest.mark.parametrize("checkpointing", [False, True])
def test_peak_equals_the_cpu_allocators_peak(checkpointing):
    """The whole micro-batch (forward, backward, gradients already allocated) against the CPU allocator's
    running total, read from the profiler's allocation events."""
    from torch.profiler import ProfilerActivity, profile
    from torch.utils.checkpoint import checkpoint

    # A vocabulary large beside d_model, as in real models, so the loss's chunk weighs in the peak.
    cfg, b, t = dataclasses.replace(LLAMA, n_layer=4, vocab_size=4096), 4, 64
    predicted = measure_step(cfg, b, t, "bf16", checkpointing, target="cpu")
    model = Transformer(cfg)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    for block in model.blocks if checkpointing else []:
        block.forward = functools.partial(checkpoint, block.forward, use_reentrant=False)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        x = torch.randint(0, cfg.vocab_size, (b, t))
        y = torch.randint(0, cfg.vocab_size, (b, t))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(x, y)
        loss.backward()
    peak = allocator_peak(prof)
    # Within 1 % (3 % checkpointed): a trace at the dispatcher does not see temporaries a kernel makes inside
    # itself, such as logsumexp's shifted copy of its input, where the checkpointed model's peak can fall.
    assert predicted.peak == pytest.approx(peak, rel=0.03 if checkpointing else 0.01)


def test_a_cpu_op_on_mixed_dtypes_counts_its_promoted_copy():
    """CPU's TensorIterator copies a bf16 operand to fp32 before an fp32 op (the residual add does this every
    block): the trace counts that copy for the op's duration, as the CPU allocator shows it."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.profiler import ProfilerActivity, profile

    x, y = torch.ones(2**18), torch.ones(2**18, dtype=torch.bfloat16)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        x + y
    real_peak = allocator_peak(prof)
    with FakeTensorMode():
        x, y = torch.ones(2**18), torch.ones(2**18, dtype=torch.bfloat16)
        with memory.LiveBytes([], cpu_casts=True) as live:
            x + y
    assert live.peak == real_peak == 2 * 2**18 * 4  # the fp32 result and the fp32 copy of y


def test_checkpointing_keeps_the_block_inputs():
    """With each block checkpointed, a block adds only its fp32 input (b·T·C·4) to what forward keeps."""
    b, t = 3, 48
    deeper = dataclasses.replace(LLAMA, n_layer=3)
    ckpt = [measure_step(c, b, t, "bf16", checkpointing=True, target="cpu") for c in (LLAMA, deeper)]
    eager = [measure_step(c, b, t, "bf16", target="cpu") for c in (LLAMA, deeper)]
    assert ckpt[1].saved - ckpt[0].saved == b * t * LLAMA.d_model * 4
    assert eager[1].saved - eager[0].saved > 10 * b * t * LLAMA.d_model * 4
    # The blocks' casts are redone in backward, not kept; a loss of one chunk keeps the head's bf16 copy.
    assert ckpt[0].weight_copies == LLAMA.vocab_size * LLAMA.d_model * 2
    assert ckpt[0].peak < eager[0].peak


def test_attention_kernel_as_cuda_picks_it():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        q = torch.empty(2, 4, 16, 8, requires_grad=True)
        k = torch.empty(2, 2, 16, 8, requires_grad=True)

        def kernel(q_, k_, **kw):
            return type(cuda_attention(q_, k_, k_, is_causal=True, enable_gqa=True, **kw).grad_fn).__name__

        assert kernel(q.bfloat16(), k.bfloat16()) == "ScaledDotProductFlashAttentionBackward0"
        assert kernel(q, q) == "ScaledDotProductEfficientAttentionBackward0"  # fp32: no flash
        assert kernel(q.bfloat16(), q.bfloat16(), flash=False) == "ScaledDotProductEfficientAttentionBackward0"
        assert "Flash" not in kernel(q, k) and "Efficient" not in kernel(q, k)  # fp32 with GQA: math


def test_flash_keeps_no_attention_matrix():
    """On CUDA's flash kernel, attention keeps O(T) per head; the math kernel of fp32 GQA keeps T×T."""
    cfg = dataclasses.replace(LLAMA, n_layer=1, context_length=256)
    flash = [measure_step(cfg, 1, t, "bf16", target="cuda").saved for t in (128, 256)]
    math = [measure_step(cfg, 1, t, "fp32", target="cuda").saved for t in (128, 256)]
    # Doubling T doubles the linear part; what grows beyond that is the T×T part: none for flash, about one
    # fp32 T×T matrix per head for math (the softmax's output).
    t_squared_part = cfg.n_head * (256**2 - 2 * 128**2) * 4
    assert abs(flash[1] - 2 * flash[0]) < 0.01 * flash[1]
    assert math[1] - 2 * math[0] > 0.8 * t_squared_part


def test_static_bytes_and_muons_share():
    from burnout.train.optim import hidden_matrices

    counts = param_counts(LLAMA)
    real = Transformer(LLAMA)
    assert counts.total == sum(p.numel() for p in real.parameters())
    assert counts.muon == sum(p.numel() for p in hidden_matrices(real))
    assert counts.per_block * LLAMA.n_layer + counts.outside_blocks == counts.total
    adamw, muon = static_bytes(counts, "adamw"), static_bytes(counts, "muon")
    assert adamw == {"weights": 4 * counts.total, "gradients": 4 * counts.total, "optimizer": 8 * counts.total}
    assert muon["optimizer"] == 8 * (counts.total - counts.muon) + 4 * counts.muon


@pytest.mark.slow
def test_compiled_saved_equals_what_torch_compile_partitions():
    """torch.compile (dynamo, then AOTAutograd with inductor's min-cut partitioner) on a real three-block model
    keeps for backward what compiled_saved predicts from one- and two-block traces on fake tensors."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    cfg, b, t = dataclasses.replace(LLAMA, n_layer=3).resolved(), 4, 64
    found = []

    def partition(joint, inputs, **kwargs):
        fw, bw = min_cut_rematerialization_partition(joint, inputs, compiler="inductor", **kwargs)
        output = next(n for n in fw.graph.nodes if n.op == "output").args[0][kwargs["num_fwd_outputs"]:]
        storages = {}
        for node in output:  # what the forward hands to backward, parameters and the batch left out
            value = node.meta.get("val")
            if node.op != "placeholder" and isinstance(value, torch.Tensor):
                storages[value.untyped_storage()._cdata] = value.untyped_storage().nbytes()
        found.append(sum(storages.values()))
        return fw, bw

    torch._dynamo.reset()
    keep = aot_autograd(fw_compiler=lambda gm, _: gm.forward, bw_compiler=lambda gm, _: gm.forward,
                        partition_fn=partition)
    x, y = torch.randint(0, cfg.vocab_size, (2, b, t))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model = Transformer(cfg)
        chunked_loss(model)  # as the planner traces it (see burnout/models/memory.py)
        torch.compile(model, backend=keep)(x, y)
    acts, copies = compiled_saved(cfg, b, t, "bf16", target="cpu")
    assert acts + copies == pytest.approx(found[0], rel=0.01)
    assert copies > 0  # the bf16 weight casts, told apart through the views (t, view) that follow them


@pytest.mark.slow
def test_the_compiled_partition_counts_plain_bytes_after_the_model_was_compiled_at_other_lengths():
    """A process that compiled the model at one length and then another (a compiled run, the planner's own traces)
    has dynamo treat the length as dynamic in later compiles of the same forward; the planner's trace is of one
    fixed shape, so its figures are plain ints, those of a fresh process."""
    cfg = dataclasses.replace(LLAMA, n_layer=1).resolved()
    memory._compiled_cached.cache_clear()
    fresh = compiled_saved(cfg, 1, 32, "bf16", target="cpu")
    memory._compiled_cached.cache_clear()
    compiled = torch.compile(Transformer(cfg), backend="eager")
    for length in (16, 24):  # the second length recompiles, with the length dynamic from then on
        x = torch.randint(0, cfg.vocab_size, (1, length))
        compiled(x, x)
    again = compiled_saved(cfg, 1, 32, "bf16", target="cpu")
    torch._dynamo.reset()
    assert again == fresh and {type(v) for v in again} == {int}, again


@pytest.mark.slow
def test_llama_1b_at_the_blog_micro_batch_is_measured_in_seconds():
    """The 1B at 16 × 2048 traces on fake tensors: its activations come out in tens of GiB, not allocated."""
    import resource

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    cfg = load_model_preset("llama-1b")
    step = measure_step(cfg, 16, 2048)
    assert 30 * 2**30 < step.saved < 120 * 2**30
    matrices = param_counts(cfg).muon  # the blocks' matrices, each kept in bf16; the head's copy is the loss's call
    assert 2 * matrices <= step.weight_copies <= 2 * (matrices + cfg.vocab_size * cfg.d_model)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 1_000_000  # KiB


DEEP_CASES = [dataclasses.replace(LLAMA, vocab_size=4096), dataclasses.replace(GPT2, dropout=0.1)]


@pytest.mark.slow
@pytest.mark.parametrize("cfg", DEEP_CASES, ids=["llama", "gpt2-dropout"])
@pytest.mark.parametrize("checkpointing", [False, True])
@pytest.mark.parametrize("precision, target", [("bf16", "cuda"), ("bf16", "cpu"), ("fp32", "cuda-pre-ampere")])
def test_a_deep_models_memory_grown_from_four_and_five_blocks_equals_its_whole_trace(cfg, checkpointing, precision,
                                                                                     target):
    deep = dataclasses.replace(cfg, n_layer=16).resolved()
    whole, _ = memory.trace_step(deep, 2, 64, precision, checkpointing, target)
    assert measure_step(deep, 2, 64, precision, checkpointing, target) == whole


@pytest.mark.slow
def test_the_peak_of_a_deep_checkpointed_model_moves_and_is_still_exact():
    """Checkpointed, the peak falls in the loss's backward up to eleven blocks of this model, and past them at the
    end of forward, where autocast still holds every block's bf16 weights: no straight line through the peaks of
    four and five blocks reaches sixteen's, and the per-phase growth does."""
    cfg = dataclasses.replace(LLAMA, vocab_size=4096).resolved()
    peaks = {n: memory.trace_step(dataclasses.replace(cfg, n_layer=n), 2, 64, "bf16", True, "cuda")[0].peak
             for n in (4, 5, 16)}
    assert peaks[16] > peaks[4] + 12 * (peaks[5] - peaks[4])
    assert measure_step(dataclasses.replace(cfg, n_layer=16), 2, 64, "bf16", True, "cuda").peak == peaks[16]


@pytest.mark.slow
@pytest.mark.parametrize("name, batch_size", [("gpt2-124m", 2), ("llama-1b", 1)])
@pytest.mark.parametrize("checkpointing", [False, True])
def test_a_presets_memory_equals_its_whole_trace(name, batch_size, checkpointing):
    cfg = load_model_preset(name).resolved()
    whole, _ = memory.trace_step(cfg, batch_size, cfg.context_length, "bf16", checkpointing, "cuda")
    assert measure_step(cfg, batch_size, cfg.context_length, "bf16", checkpointing, "cuda") == whole


def test_a_deep_models_parameters_are_counted_as_its_modules_count_them():
    cfg = dataclasses.replace(GPT2, n_layer=9, tie_embeddings=False)
    with torch.device("meta"):
        real = Transformer(cfg)
    counts = param_counts(cfg)
    assert counts.total == sum(p.numel() for p in real.parameters())
    assert counts.per_block == sum(p.numel() for p in real.blocks[0].parameters())
    assert counts.muon == sum(p.numel() for p in real.blocks.parameters() if p.dim() == 2)


# A 65,536-token vocabulary makes the loss's chunks 1,024 rows: 9 × 32 + 5 sequences of 32 tokens are ten chunks.
LONG_CASES = [dataclasses.replace(LLAMA, vocab_size=65536), dataclasses.replace(GPT2, vocab_size=65536, dropout=0.1)]
LONG_BATCH = 9 * 32 + 5


@pytest.mark.slow
@pytest.mark.parametrize("cfg, precision, target", [
    (LONG_CASES[0], "bf16", "cuda"), (LONG_CASES[0], "bf16", "cpu"), (LONG_CASES[0], "fp32", "cuda-pre-ampere"),
    (LONG_CASES[1], "bf16", "cuda")], ids=["llama-cuda", "llama-cpu", "llama-fp32-pre-ampere", "gpt2-dropout"])
@pytest.mark.parametrize("checkpointing", [False, True])
def test_a_long_micro_batchs_memory_from_three_and_four_chunks_equals_its_whole_trace(cfg, precision, target,
                                                                                       checkpointing):
    cfg = cfg.resolved()
    assert memory.loss_chunks_traced(cfg, LONG_BATCH * 32) is not None  # past TRACED_CHUNKS: the line is taken
    whole, _ = memory.trace_step(cfg, LONG_BATCH, 32, precision, checkpointing, target)
    assert measure_step(cfg, LONG_BATCH, 32, precision, checkpointing, target) == whole


@pytest.mark.slow
def test_a_deep_model_of_one_long_sequence_is_exact_along_both_lines():
    cfg = dataclasses.replace(LONG_CASES[0], n_layer=7, context_length=10_000).resolved()
    whole, _ = memory.trace_step(cfg, 1, 9_800, "bf16", False, "cuda")
    assert measure_step(cfg, 1, 9_800, "bf16", False, "cuda") == whole


@pytest.mark.slow
def test_a_long_sequences_compiled_partition_from_three_and_four_chunks_equals_its_whole_partition():
    cfg = dataclasses.replace(LONG_CASES[0], n_layer=1, context_length=10_000).resolved()
    assert compiled_saved(cfg, 1, 9_800) == memory._partition(cfg, 9_800, "bf16", "cuda")


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_model_info_of_a_billion_sequences_traces_a_few_chunks_and_lies_on_the_batchs_line(monkeypatch, capsys):
    """`--batch-size 1000000000` traces the loss in a few chunks, not 15.6 million (whose trace took hours), and
    its activations are where the line through two whole traces of 3 and 4 chunks (129 and 256 sequences) puts
    them: each sequence keeps as much as the one before."""
    from burnout.cli import main
    from burnout.models.transformer import loss_chunk_rows

    cfg = load_model_preset("llama-tiny").resolved()
    (low, _), (high, _) = (memory.trace_step(cfg, b, 256, "bf16", False, "cuda") for b in (129, 256))
    memory._measure_step_cached.cache_clear()
    trace = memory.trace_step

    def bounded(cfg, batch_size, seq_len, precision, checkpointing, target, loss_rows=None):
        assert -(-batch_size * seq_len // (loss_rows or loss_chunk_rows(cfg.vocab_size))) <= memory.TRACED_CHUNKS
        return trace(cfg, batch_size, seq_len, precision, checkpointing, target, loss_rows)

    monkeypatch.setattr(memory, "trace_step", bounded)
    assert main(["model", "info", "llama-tiny", "--batch-size", "1000000000", "--json"]) == 0
    figures = json.loads(capsys.readouterr().out)["memory_bytes"]
    assert figures["activations"] == low.saved + (10**9 - 129) * (high.saved - low.saved) // 127
    assert figures["weight_copies"] == low.weight_copies == high.weight_copies
