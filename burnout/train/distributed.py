"""torchrun support: process groups, DDP / FSDP2 wrapping, and the few collectives the loop needs.

A plain `python -m burnout train` is world size 1 and touches none of torch.distributed. Under
`torchrun --nproc_per_node N -m burnout train ...` each process joins a group (NCCL on GPUs, gloo on
CPU), reads its own micro-batches and averages gradients; only rank 0 writes logs and checkpoints.
"""

from __future__ import annotations

import contextlib
import datetime
import inspect
import os
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist

from burnout.core.device import LOW_PRECISION_DTYPES, compute_precision
from burnout.errors import BurnoutError
from burnout.train.optim import Optimizers

# How long a collective waits for the slowest rank. Rank 0 alone evaluates and writes each checkpoint
# while the others wait in the next collective: the 1B's 12.5 GB checkpoint (weights and AdamW's moments) on a
# slow network volume can pass NCCL's 10-minute default (docs/PERFORMANCE.md). 30 minutes (gloo's default)
# covers a volume three times slower than that, and a hung job still ends within the hour.
COLLECTIVE_TIMEOUT = datetime.timedelta(minutes=30)

# DDP's gradient buckets, in MB. torch.compile splits the graph at each bucket boundary (DDPOptimizer), so
# the default 25 MB cut the 1B into many small graphs (docs/PERFORMANCE.md); 256 MB is about one of its blocks
# (243 MB of fp32 gradients): about a graph per block, and each block's all-reduce still overlaps the backward
# of the block before it.
DDP_BUCKET_MB = 256


@dataclass
class DistContext:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    owns_group: bool = False  # we initialized the process group, so we tear it down

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def init_distributed(device: torch.device) -> tuple[DistContext, torch.device]:
    """Join the torchrun process group if there is one; returns the context and this rank's device."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size == 1:
        return DistContext(), device
    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    if device.type == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    owns = not dist.is_initialized()
    if owns:
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo",
                                device_id=device if device.type == "cuda" else None, timeout=COLLECTIVE_TIMEOUT)
    return DistContext(rank, world_size, local_rank, owns), device


@contextlib.contextmanager
def process_group(device: torch.device) -> Iterator[tuple[DistContext, torch.device]]:
    """The torchrun process group joined for the time of a run (init_distributed: the context and this rank's
    device), and left however the run ends, if this process joined it."""
    ctx, device = init_distributed(device)
    try:
        yield ctx, device
    finally:
        if ctx.owns_group and dist.is_initialized():
            dist.destroy_process_group()


def wrap_model(model: torch.nn.Module, ctx: DistContext, strategy: str, device: torch.device,
               precision: str, cpu_offload: bool = False) -> torch.nn.Module:
    """DDP or FSDP2 around `model` (FSDP shards each block, then the rest; with `cpu_offload` its shards live in
    CPU memory); unchanged at world size 1."""
    if not ctx.enabled:
        if cpu_offload:  # no FSDP in one process, so nothing to offload: the run would not get the memory it planned
            raise BurnoutError("train.cpu_offload: offloads FSDP's shards, and FSDP runs across processes; start "
                               "the run under torchrun with 2 or more (torchrun --nproc_per_node 2 -m burnout "
                               "train ...) or drop train.cpu_offload")
        return model
    if strategy == "fsdp":
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

        # Gather bf16/fp16 weights (half the traffic) and compute in them; without this autocast's casts
        # of the gathered weights, kept for backward, add up to a full low-precision replica on every
        # rank. Gradients are reduced and accumulated in fp32 and the fp32 shards stay the master
        # weights, so the optimizer and fp16's grad scaler see fp32 gradients, as under autocast alone.
        low = LOW_PRECISION_DTYPES.get(compute_precision(precision))
        policy = MixedPrecisionPolicy(param_dtype=low, reduce_dtype=torch.float32 if low else None)
        # Offloaded, the shards, their gradients and so the optimizer's state live on the CPU, where the
        # optimizer steps; pinned pages (CUDA only) let each block's copy to the GPU run asynchronously.
        offload = CPUOffloadPolicy(pin_memory=device.type == "cuda") if cpu_offload else OffloadPolicy()
        for block in model.blocks:
            fully_shard(block, mp_policy=policy, offload_policy=offload)
        fully_shard(model, mp_policy=policy, offload_policy=offload)
        return model
    from torch.nn.parallel import DistributedDataParallel

    # The only buffers, RoPE's tables, are computed from the config, alike on every rank: re-sending them
    # before each forward is waste. torch 2.13 renamed broadcast_buffers (deprecated there) forward_sync_buffers.
    renamed = "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters
    no_buffer_sync = {"forward_sync_buffers" if renamed else "broadcast_buffers": False}
    # gradient_as_bucket_view: gradients live in the all-reduce buckets instead of beside them (one fp32
    # copy of all gradients less: 4.15 GB on the 1B).
    return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None,
                                   gradient_as_bucket_view=True, bucket_cap_mb=DDP_BUCKET_MB, **no_buffer_sync)


@contextlib.contextmanager
def whole_weights(model: torch.nn.Module) -> Iterator[None]:
    """The FSDP2 shards of `model`'s sharded submodules gathered on entering, and kept whole until the block ends, so
    that the forwards inside take no collective and each rank may run its own number of them (RL samples its own
    answers, a token at a time). Every rank enters together (the gathering is a collective); the weights take their
    whole size meanwhile. Nothing under DDP or in one process."""
    from torch.distributed.fsdp import FSDPModule

    sharded = [m for m in model.modules() if isinstance(m, FSDPModule)]
    for module in sharded:
        module.unshard()
        # FSDP's documented switch for evaluation: a forward then leaves the weights gathered.
        module.set_reshard_after_forward(False, recurse=False)
    try:
        yield
    finally:
        for module in sharded:
            module.set_reshard_after_forward(True, recurse=False)  # wrap_model's setting, the default
            module.reshard()


def grad_sync(model: torch.nn.Module, sync: bool):
    """Skip the gradient all-reduce on all but the last micro-batch of an accumulated step."""
    # Under torch.compile only: DDP's own wrapper is the one that can skip the all-reduce (not `unwrapped`).
    inner = getattr(model, "_orig_mod", model)
    if hasattr(inner, "no_sync"):  # DDP
        return contextlib.nullcontext() if sync else inner.no_sync()
    if hasattr(inner, "set_requires_gradient_sync"):  # FSDP2
        inner.set_requires_gradient_sync(sync)
    return contextlib.nullcontext()


def joined_group() -> DistContext:
    """The context of the torchrun group this process has joined (init_distributed's), for code that is not handed
    one (an objective inside the model); one process when it has joined none."""
    if not (dist.is_available() and dist.is_initialized()):
        return DistContext()
    return DistContext(dist.get_rank(), dist.get_world_size())


def mean_across_ranks(value: torch.Tensor, ctx: DistContext) -> torch.Tensor:
    if ctx.enabled:
        value = value.clone()
        dist.all_reduce(value, op=dist.ReduceOp.SUM)  # gloo has no AVG
        value /= ctx.world_size
    return value


def min_across_ranks(value: int, ctx: DistContext, device: torch.device) -> int:
    """The smallest of every rank's `value`: what all of them can do."""
    if not ctx.enabled:
        return value
    t = torch.tensor([value], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return int(t.item())


def gather_to_main(obj, ctx: DistContext) -> list | None:
    """Every rank's `obj`, in rank order, on rank 0 (None elsewhere); [obj] in one process."""
    if not ctx.enabled:
        return [obj]
    gathered = [None] * ctx.world_size if ctx.is_main else None
    dist.gather_object(obj, gathered, dst=0)
    return gathered


def from_main(obj, ctx: DistContext):
    """Rank 0's `obj` on every rank: a decision that reads the disk is made once, so all ranks act alike."""
    if not ctx.enabled:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def barrier(ctx: DistContext) -> None:
    if ctx.enabled:
        dist.barrier()


def full_state(model: torch.nn.Module, optimizer: Optimizers, strategy: str, ctx: DistContext):
    """(model state dict, optimizer state) as plain CPU tensors, gathered from shards under FSDP (there
    one dict for all the optimizers, keyed by parameter name; else one state dict per optimizer)."""
    if ctx.enabled and strategy == "fsdp":
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
            get_optimizer_state_dict,
        )

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return (get_model_state_dict(model, options=options),
                get_optimizer_state_dict(model, optimizer.optimizers, options=options))
    return None, optimizer.state_dict()


def load_optimizer_state(model, optimizer: Optimizers, state: dict | list[dict], strategy: str,
                         ctx: DistContext) -> None:
    """Put a checkpoint's optimizer state back. A DDP rank holds the whole state, read from the file; an
    FSDP rank holds its shards, sent from rank 0 tensor by tensor (`state` is used on rank 0 only)."""
    if ctx.enabled and strategy == "fsdp":
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        set_optimizer_state_dict(model, optimizer.optimizers, state if ctx.is_main else {},
                                 options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
    else:
        optimizer.load_state_dict(state)
