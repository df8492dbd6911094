"""Training memory of a model, measured by running its real forward and backward on fake tensors.

Fake tensors (torch's FakeTensorMode) allocate nothing, so even a large model at a large micro-batch traces in
seconds on a CPU, and the figure is what the model's own code keeps rather than a formula that drifts from it: the
planner (burnout/train/plan.py) sizes and refuses runs by it. What is measured: `StepMemory`; how a model of any
depth costs two shallow traces: `_measure_step_cached`; a micro-batch of any size, a few: `loss_chunks_traced`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import weakref
from collections.abc import Callable, Hashable

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.checkpoint import checkpoint

from burnout.config import ModelConfig
from burnout.models.size import addressable
from burnout.models.transformer import Transformer, chunked_cross_entropy, loss_chunk_rows

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
# Training keeps the weights, their gradients and AdamW's two moments in fp32; Muon keeps one momentum.
FP32 = 4
ADAMW_STATE_BYTES = 2 * FP32
MUON_STATE_BYTES = FP32
# torchao's AdamW8bit (train.optimizer=adamw8bit) as torchao.optim lays it out: a moment of a tensor of at least
# ADAMW8BIT_MIN_VALUES values, a multiple of the block, is one uint8 code per value, an fp32 scale per block of
# ADAMW8BIT_BLOCK values and its own 256-entry fp32 lookup table; a smaller tensor's moments stay fp32.
ADAMW8BIT_BLOCK = 256
ADAMW8BIT_MIN_VALUES = 4096
ADAMW8BIT_TABLE_BYTES = 256 * FP32
# Blocks told apart at each end of a traced model (_measure_step_cached).
EDGE_BLOCKS = 2
# The most chunks of the loss traced as they run; past them, three and four larger ones (loss_chunks_traced).
TRACED_CHUNKS = 8


@dataclasses.dataclass(frozen=True)
class ParamCounts:
    total: int
    muon: int  # the blocks' 2-D weights: Muon's share under train.optimizer=muon (burnout/train/optim.py)
    per_block: int
    outside_blocks: int  # embeddings, an untied head, the final norm: FSDP's root module
    # Values in each parameter tensor (a tied one once): those outside the blocks, and one block's, which every
    # one of the n_layer blocks has (kept once, so that a count of a deep model is as small as a shallow one's).
    outside_sizes: tuple[int, ...]
    block_sizes: tuple[int, ...]
    n_layer: int


@dataclasses.dataclass(frozen=True)
class StepMemory:
    """Bytes of one micro-batch's forward and backward at (batch_size, seq_len).

    - saved: bytes of the tensors autograd keeps for backward, from `saved_tensors_hooks` around the forward,
      deduplicated by storage (keyed by the storage's identity): a tensor saved twice, or several views of one
      storage, count once, and a view counts its whole storage, which it keeps alive; parameters left out;
    - weight_copies: autocast's low-precision copies of the weights still alive when forward has ended
      (the saved ones: a linear keeps its cast weight for backward);
    - peak: the most bytes alive at any moment of forward and backward (every op's output storage, counted
      from creation until freed), the batch itself included and the gradients left out: they are allocated
      beforehand, as at every micro-batch after a step's first, and accounted for as static memory.

    Fake tensors are CPU tensors, so CPU autocast applies: it casts the same ops this model runs (linears and
    attention to bf16/fp16; norms, residual stream and loss stay fp32), which on meta alone it would not. Not
    visible to the trace: workspaces a kernel allocates inside itself (cuBLAS, flash attention's), allocator
    rounding and fragmentation; on a "cpu" target the one such allocation that matters, a pointwise op's promoted
    copy of a mixed-dtype input, is added (LiveBytes). The planner adds its stated margin for those on CUDA.
    """
    saved: int  # activations kept for backward, weight copies excluded
    weight_copies: int
    peak: int

    @property
    def working(self) -> int:
        """Peak above what forward leaves saved: wherever the peak falls, backward's gradients of activations,
        a recomputed block, the loss's chunks, autocast's cache of weight copies until forward ends."""
        return self.peak - self.saved - self.weight_copies


def checkpoint_blocks(model: Transformer) -> Transformer:
    """Recompute each block's activations in backward (train.activation_checkpointing), as training does."""
    for block in model.blocks:
        # An instance attribute: the module tree, and so the checkpoint's tensor names, stay unchanged.
        block.forward = functools.partial(checkpoint, block.forward, use_reentrant=False)
    return model


def param_counts(cfg: ModelConfig) -> ParamCounts:
    """Counted on a model of one block on the meta device, the block n_layer times: the blocks are identical,
    and building every block of a deep model would take minutes."""
    with torch.device("meta"):
        model = Transformer(dataclasses.replace(cfg, n_layer=1))
    block = list(model.blocks.parameters())
    per_block = sum(p.numel() for p in block)
    outside = tuple(p.numel() for p in model.parameters() if all(p is not q for q in block))
    muon = cfg.n_layer * sum(p.numel() for p in block if p.dim() == 2)
    return ParamCounts(sum(outside) + cfg.n_layer * per_block, muon, per_block, sum(outside), outside,
                       tuple(p.numel() for p in block), cfg.n_layer)


def adamw8bit_state_bytes(values: int) -> int:
    """The two moments torchao's AdamW8bit keeps for a tensor of `values` values (see ADAMW8BIT_BLOCK)."""
    if values >= ADAMW8BIT_MIN_VALUES and values % ADAMW8BIT_BLOCK == 0:
        return 2 * (values + FP32 * (values // ADAMW8BIT_BLOCK) + ADAMW8BIT_TABLE_BYTES)
    return ADAMW_STATE_BYTES * values


def static_bytes(counts: ParamCounts, optimizer: str = "adamw") -> dict[str, int]:
    """fp32 weights and gradients, and the optimizer's state: AdamW's two moments, in fp32 or in 8 bits
    (adamw8bit), or Muon's momentum for the blocks' matrices beside AdamW for the rest."""
    muon = counts.muon if optimizer == "muon" else 0
    state = (sum(map(adamw8bit_state_bytes, counts.outside_sizes))
             + counts.n_layer * sum(map(adamw8bit_state_bytes, counts.block_sizes)) if optimizer == "adamw8bit"
             else ADAMW_STATE_BYTES * (counts.total - muon) + MUON_STATE_BYTES * muon)
    return {"weights": FP32 * counts.total, "gradients": FP32 * counts.total, "optimizer": state}


class LiveBytes(TorchDispatchMode):
    """Bytes of the storages that ops create, from creation until the storage is freed; their peak.

    `cpu_casts`: also count, for the length of the op, the copy that a CPU pointwise op makes of an input
    whose dtype differs from the result's (CPU's TensorIterator promotes inputs into temporaries; CUDA's
    kernels cast as they read, with no copy)."""

    def __init__(self, params: list[torch.Tensor], cpu_casts: bool = False):
        super().__init__()
        self.params = {p.untyped_storage()._cdata for p in params}
        self.cpu_casts = cpu_casts
        self.sizes: dict[int, int] = {}
        self.copies: set[int] = set()  # storages that are a cast of a parameter
        self.now = self.peak = 0
        self.phase: Hashable = "before the blocks"
        self.phase_peaks: dict[Hashable, int] = {}

    def enter(self, phase: Hashable) -> None:
        """Count the peaks from here on under `phase` (see _mark_phases)."""
        self.phase = phase
        self._reach(self.now)

    def _reach(self, level: int) -> None:
        self.peak = max(self.peak, level)
        self.phase_peaks[self.phase] = max(self.phase_peaks.get(self.phase, 0), level)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        # A view's, an in-place op's or an out= op's result lives in an input's storage: nothing new.
        inputs = {t.untyped_storage()._cdata for t in tensors}
        copy = func is torch.ops.aten._to_copy.default and args[0].untyped_storage()._cdata in self.params
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.untyped_storage()._cdata not in inputs:
                self._track(t.untyped_storage(), copy)
        if self.cpu_casts and torch.Tag.pointwise in func.tags and isinstance(out, torch.Tensor):
            # One-element operands are read as scalars, never copied.
            cast = sum(t.numel() * out.element_size() for t in tensors if t.dtype != out.dtype and t.numel() > 1)
            self._reach(self.now + cast)
        return out

    def _track(self, storage: torch.UntypedStorage, copy: bool) -> None:
        key = storage._cdata
        if key in self.sizes:  # an output already seen, e.g. returned twice
            return
        self.sizes[key] = storage.nbytes()
        if copy:
            self.copies.add(key)
        self.now += self.sizes[key]
        self._reach(self.now)
        weakref.finalize(storage, self._freed, key)

    def _freed(self, key: int) -> None:
        self.now -= self.sizes.pop(key)
        self.copies.discard(key)

    def copy_bytes(self) -> int:
        return sum(self.sizes[k] for k in self.copies)


class CudaAttention(TorchFunctionMode):
    """F.scaled_dot_product_attention as the kernel CUDA picks, called as its own op so that autograd
    saves what that kernel saves (flash: q, k, v, output and a row logsumexp): flash for bf16/fp16 without a mask
    from Ampere on (target "cuda"; "cuda-pre-ampere" has no flash), else memory-efficient without GQA, else math.
    On a "cpu" target the CPU's own choice runs."""

    def __init__(self, flash: bool):
        super().__init__()
        self.flash = flash

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is not F.scaled_dot_product_attention:
            return func(*args, **(kwargs or {}))
        return cuda_attention(*args, **(kwargs or {}), flash=self.flash)


def cuda_attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False,
                   flash=True):
    aten = torch.ops.aten
    half = q.dtype in (torch.bfloat16, torch.float16)
    if flash and half and attn_mask is None and q.size(-1) <= 256:
        return aten._scaled_dot_product_flash_attention(q, k, v, dropout_p, is_causal, scale=scale)[0]
    if k.size(-3) == q.size(-3):  # the memory-efficient kernel has no grouped-query attention
        return aten._scaled_dot_product_efficient_attention(q, k, v, attn_mask, True, dropout_p, is_causal,
                                                            scale=scale)[0]
    return aten._scaled_dot_product_attention_math(q, k, v, attn_mask, dropout_p, is_causal, None, scale=scale,
                                                   enable_gqa=True)[0]


def _autocast(precision: str):
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast("cpu", dtype=DTYPES[precision])


def _fake_mode():
    """Fake tensors; a data-dependent scalar (`.item()`) becomes a symbol rather than an error, since no
    size this model allocates depends on one."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    return FakeTensorMode(allow_non_fake_inputs=True, shape_env=ShapeEnv())


def _fake_model(cfg: ModelConfig, checkpointing: bool, target: str, loss_rows: int | None = None) -> Transformer:
    """Inside a FakeTensorMode: the model with gradients already allocated (StepMemory's peak leaves them out), its
    loss in chunks of `loss_rows` rows when given."""
    model = chunked_loss(Transformer(cfg), loss_rows)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    if target != "cpu":
        for block in model.blocks:
            block.attn.explicit_on_cpu = False
            # Per call, not around the whole trace: a checkpointed block's recomputation in backward runs
            # without the function modes that were active in forward.
            block.attn.forward = _under(functools.partial(CudaAttention, flash=target == "cuda"), block.attn.forward)
    return checkpoint_blocks(model) if checkpointing else model


def chunked_loss(model: Transformer, rows: int | None = None) -> Transformer:
    """The model, its loss taken in chunks (of `rows` rows when given, else loss_chunk_rows) even when compiled.

    Partitioned on fake CPU tensors, the compiled whole-logits loss keeps an fp32 copy of the logits that inductor's
    fused loss never makes, which would overstate its peak: the chunked loss stands in for it, close to the peaks
    measured with either loss (docs/PERFORMANCE.md). Larger chunks trace a long micro-batch in a few
    (loss_chunks_traced). An instance attribute, as checkpoint_blocks sets: the model's class and weights stay as
    they are."""
    rows = rows or loss_chunk_rows(model.cfg.vocab_size)
    model.head_loss = functools.partial(_chunked_head_loss, model.lm_head, rows)
    return model


def _chunked_head_loss(head: torch.nn.Linear, rows: int, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return chunked_cross_entropy(hidden, head.weight, targets, rows)


def _under(mode: Callable[[], TorchFunctionMode], forward):
    @functools.wraps(forward)
    def run(*args, **kwargs):
        with mode():
            return forward(*args, **kwargs)
    return run


def _mark_phases(model: Transformer, live: LiveBytes) -> None:
    """Tell `live` where each phase (_measure_step_cached) begins: a block's forward when the block is called,
    the head's when the final norm is; the backward of a block (of the embedding, for the first block) once the
    gradient of its output is complete, which is that of the next block's input (of the final norm's)."""
    depth = len(model.blocks)

    def place(i: int) -> int:  # from the nearer end: 0, 1, ..., -2, -1
        return i if i < EDGE_BLOCKS else i - depth

    def on_call(forward: Hashable, backward_of_input: Hashable):
        def hook(module, args):
            live.enter(forward)
            args[0].register_hook(lambda grad: live.enter(backward_of_input))
        return hook

    for i, block in enumerate(model.blocks):
        block.register_forward_pre_hook(
            on_call(("forward", place(i)), ("backward", place(i - 1)) if i else "embedding's backward"))
    model.norm.register_forward_pre_hook(on_call("head and loss", ("backward", place(depth - 1))))


def trace_step(cfg: ModelConfig, batch_size: int, seq_len: int, precision: str, checkpointing: bool,
               target: str, loss_rows: int | None = None) -> tuple[StepMemory, dict[Hashable, int]]:
    """One micro-batch as burnout/train/step.py runs it, forward under autocast, then backward outside it, with
    every block traced (the loss in chunks of `loss_rows` when given): its memory, and the peak of each phase."""
    with _fake_mode():
        model = _fake_model(cfg, checkpointing, target, loss_rows)
        live = LiveBytes(list(model.parameters()), cpu_casts=target == "cpu")
        _mark_phases(model, live)
        saved: dict[int, int] = {}

        def pack(t: torch.Tensor) -> torch.Tensor:
            storage = t.untyped_storage()
            if storage._cdata not in live.params:
                saved[storage._cdata] = storage.nbytes()
            return t

        with live:
            x = torch.zeros(batch_size, seq_len, dtype=torch.long)
            y = torch.zeros(batch_size, seq_len, dtype=torch.long)
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), _autocast(precision):
                loss = model(x, y)
            # Autocast has let go of its cache of weight copies: those left are the ones saved for backward.
            copies = live.copy_bytes()
            saved_copies = sum(n for key, n in saved.items() if key in live.copies)
            live.enter("loss's backward")
            loss.backward()
    return StepMemory(sum(saved.values()) - saved_copies, copies, live.peak), live.phase_peaks


def loss_chunks_traced(cfg: ModelConfig, rows: int) -> tuple[int, ...] | None:
    """Rows per chunk of the loss to trace `rows` rows with, and so the cost of a trace: None (the loss's own
    chunks) up to TRACED_CHUNKS of them, else three and four chunks.

    The loss runs over the micro-batch's B·T rows in chunks (models/transformer.py), and a trace costs time per
    chunk, so a micro-batch of more chunks (a huge batch, a long context) is traced instead with its rows in three
    larger chunks and in four, and the loss's two phases are carried along the line through them to the real
    chunk's size: from three chunks on, each phase's peak is what grows with the rows (the hidden states, their
    gradient) plus one chunk's buffers, which grow with the chunk's rows alone. Every other figure is the same in
    both traces. A micro-batch of any size then costs a few shallow traces.
    """
    if -(-rows // loss_chunk_rows(cfg.vocab_size)) <= TRACED_CHUNKS:
        return None
    return -(-rows // 3), -(-rows // 4)


def _on_line(first: tuple, second: tuple, at_first: int, at_second: int, at: int) -> tuple:
    """Two traces' figures (bytes, or {phase: its peak}, where the phases both have count) at `at_first` and
    `at_second`, carried along the line through them to `at`: each grows by the same amount per unit (a block, a
    row of a chunk)."""
    def point(a, b):
        if isinstance(a, dict):
            return {name: point(a[name], b[name]) for name in a.keys() & b.keys()}
        return a + (b - a) * (at - at_first) // (at_second - at_first)

    return tuple(point(a, b) for a, b in zip(first, second))


def _trace_figures(cfg: ModelConfig, batch_size: int, seq_len: int, precision: str, checkpointing: bool,
                   target: str) -> tuple[int, int, dict]:
    """(saved, weight copies, each phase's peak) of a model of any length of micro-batch (loss_chunks_traced)."""
    chunks = loss_chunks_traced(cfg, batch_size * seq_len)
    traces = [trace_step(cfg, batch_size, seq_len, precision, checkpointing, target, rows)
              for rows in chunks or (None,)]
    figures = [(step.saved, step.weight_copies, phases) for step, phases in traces]
    if chunks is None:
        return figures[0]
    return _on_line(*figures, *chunks, loss_chunk_rows(cfg.vocab_size))


@functools.lru_cache(maxsize=64)
def _measure_step_cached(cfg_items: tuple, batch_size: int, seq_len: int, precision: str, checkpointing: bool,
                         target: str) -> StepMemory:
    """measure_step of a model of any depth: one of more than five blocks is traced with four and with five, and
    each figure grown by what the fifth block added, once per further block, since the blocks are identical.

    Saved bytes and weight copies grow by the same amount with each block. The peak does not (where it falls
    moves: the loss's backward in a shallow model, the end of forward in a deep checkpointed one, where autocast
    still caches a bf16 copy of every weight), so the trace keeps the peak of each phase: before the blocks, each
    block's forward, the head and loss, the loss's backward, each block's backward, the embedding's backward.
    Each phase's peak grows by the same amount with each block, and the model's peak is the largest of them.
    Blocks are told apart by their place from the nearer end, the first two and the last two (EDGE_BLOCKS); the
    peaks of the blocks between lie on a line between theirs.
    """
    cfg = ModelConfig(**dict(cfg_items))
    shape = (batch_size, seq_len, precision, checkpointing, target)
    shallow = 2 * EDGE_BLOCKS
    if cfg.n_layer <= shallow + 1:
        saved, copies, phases = _trace_figures(cfg, *shape)
    else:
        saved, copies, phases = _on_line(*(_trace_figures(dataclasses.replace(cfg, n_layer=n), *shape)
                                           for n in (shallow, shallow + 1)), shallow, shallow + 1, cfg.n_layer)
    return StepMemory(saved, copies, max(phases.values()))


def measure_step(cfg: ModelConfig, batch_size: int, seq_len: int, precision: str = "bf16",
                 checkpointing: bool = False, target: str = "cuda") -> StepMemory:
    """Eager training memory of one micro-batch (StepMemory), a deep model's grown from four and five blocks
    (_measure_step_cached), a long one's loss from three and four chunks (loss_chunks_traced); cached: the planner
    asks for the same shapes repeatedly."""
    cfg = cfg.resolved()
    addressable(cfg, batch_size, seq_len)
    items = tuple(sorted(dataclasses.asdict(cfg).items()))
    return _measure_step_cached(items, batch_size, seq_len, precision, checkpointing, target)


# Ops whose result is another view of their input's storage, followed back to find a weight's cast.
_VIEW_OPS = {torch.ops.aten.t.default, torch.ops.aten.view.default, torch.ops.aten.transpose.int,
             torch.ops.aten.permute.default, torch.ops.aten.expand.default, torch.ops.aten.unsqueeze.default,
             torch.ops.aten.slice.Tensor, torch.ops.aten.alias.default}


def _saved_by_partition(fw_graph, num_fwd_outputs: int) -> tuple[int, int]:
    """(activations, weight copies): the forward graph's outputs past the loss are what backward gets."""
    output = next(n for n in fw_graph.nodes if n.op == "output").args[0]
    acts: dict[int, int] = {}
    copies: dict[int, int] = {}
    for node in output[num_fwd_outputs:]:
        value = node.meta.get("val")
        if node.op == "placeholder" or not isinstance(value, torch.Tensor):  # a parameter or the batch: no new memory
            continue
        base = node
        while base.op == "call_function" and base.target in _VIEW_OPS:
            base = base.args[0]
        is_copy = (base.op == "call_function" and base.target is torch.ops.aten._to_copy.default
                   and base.args[0].op == "placeholder")
        storage = value.untyped_storage()
        (copies if is_copy else acts)[storage._cdata] = storage.nbytes()
    return sum(acts.values()), sum(copies.values())


def _partition(cfg: ModelConfig, seq_len: int, precision: str, target: str,
               loss_rows: int | None = None) -> tuple[int, int]:
    """What torch.compile saves for backward at micro-batch 1: dynamo captures the training forward (fake
    tensors pass through it as real ones would), AOTAutograd traces the joint forward and backward graph and
    splits it with the min-cut partitioner inductor uses, which recomputes cheap pointwise ops and the
    checkpointed regions (the loss's chunks, of `loss_rows` rows when given) in backward. The forward graph then
    runs as it is, on fake tensors: nothing is compiled. Summed over the graphs, should dynamo break the forward
    into several."""
    import torch._dynamo
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    found: list[tuple[int, int]] = []

    def partition(joint, inputs, **kwargs):
        fw, bw = min_cut_rematerialization_partition(joint, inputs, compiler="inductor", **kwargs)
        found.append(_saved_by_partition(fw.graph, kwargs["num_fwd_outputs"]))
        return fw, bw

    backend = aot_autograd(fw_compiler=lambda graph, example_inputs: graph.forward, partition_fn=partition)
    mode = _fake_mode()
    with mode:
        model = _fake_model(cfg, False, target, loss_rows)
        x = torch.zeros(1, seq_len, dtype=torch.long)
    try:
        with mode, _autocast(precision):
            # One fixed shape: after compiles of this forward at other lengths, dynamo would trace sizes symbolic.
            torch.compile(model, backend=backend, dynamic=False)(x, x.clone())
    finally:
        # Forget the graphs compiled for this fake model; nothing else is compiled before training starts.
        torch._dynamo.reset()
    return tuple(sum(column) for column in zip(*found))


def _partitioned(cfg: ModelConfig, seq_len: int, precision: str, target: str) -> tuple[int, int]:
    """_partition of a sequence of any length: a long one's loss in three and four chunks (loss_chunks_traced)."""
    chunks = loss_chunks_traced(cfg, seq_len)
    if chunks is None:
        return _partition(cfg, seq_len, precision, target)
    return _on_line(*(_partition(cfg, seq_len, precision, target, rows) for rows in chunks), *chunks,
                    loss_chunk_rows(cfg.vocab_size))


@functools.lru_cache(maxsize=16)
def _compiled_cached(cfg_items: tuple, seq_len: int, precision: str, target: str) -> tuple[int, int]:
    cfg = ModelConfig(**dict(cfg_items))
    if cfg.n_layer <= 2:
        return _partitioned(cfg, seq_len, precision, target)
    return _on_line(*(_partitioned(dataclasses.replace(cfg, n_layer=n), seq_len, precision, target) for n in (1, 2)),
                    1, 2, cfg.n_layer)


def compiled_saved(cfg: ModelConfig, batch_size: int, seq_len: int, precision: str = "bf16",
                   target: str = "cuda") -> tuple[int, int]:
    """(activations, weight copies) that a torch.compile'd training forward keeps for backward.

    Partitioned at micro-batch 1 with one and two blocks, since dynamo's capture costs seconds per block, then
    scaled: activations by the micro-batch (the same graph over more rows: the same cut), and each further
    block adding what the second did (identical blocks are cut alike). Inductor's reuse of buffers inside its
    fused kernels is not modelled: the planner keeps eager's working memory for compiled runs, an upper bound.
    """
    cfg = cfg.resolved()
    addressable(cfg, batch_size, seq_len)
    acts, copies = _compiled_cached(tuple(sorted(dataclasses.asdict(cfg).items())), seq_len, precision, target)
    return acts * batch_size, copies
