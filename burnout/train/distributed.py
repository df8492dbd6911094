"""torchrun support: process groups, DDP / FSDP2 wrapping, and the few collectives the loop needs.

A plain `python -m burnout train` is world size 1 and touches none of torch.distributed. Under
`torchrun --nproc_per_node N -m burnout train ...` each process joins a group (NCCL on GPUs, gloo on
CPU), reads its own micro-batches and averages gradients; only rank 0 writes logs and checkpoints.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from burnout.train.optim import Optimizers


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
                                device_id=device if device.type == "cuda" else None)
    return DistContext(rank, world_size, local_rank, owns), device


def shutdown(ctx: DistContext) -> None:
    if ctx.owns_group and dist.is_initialized():
        dist.destroy_process_group()


def wrap_model(model: torch.nn.Module, ctx: DistContext, strategy: str, device: torch.device) -> torch.nn.Module:
    """DDP or FSDP2 around `model` (FSDP shards each block, then the rest); unchanged at world size 1."""
    if not ctx.enabled:
        return model
    if strategy == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
        return model
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)


def grad_sync(model: torch.nn.Module, sync: bool):
    """Skip the gradient all-reduce on all but the last micro-batch of an accumulated step."""
    inner = getattr(model, "_orig_mod", model)  # under torch.compile
    if hasattr(inner, "no_sync"):  # DDP
        return contextlib.nullcontext() if sync else inner.no_sync()
    if hasattr(inner, "set_requires_gradient_sync"):  # FSDP2
        inner.set_requires_gradient_sync(sync)
    return contextlib.nullcontext()


def mean_across_ranks(value: torch.Tensor, ctx: DistContext) -> torch.Tensor:
    if ctx.enabled:
        value = value.clone()
        dist.all_reduce(value, op=dist.ReduceOp.SUM)  # gloo has no AVG
        value /= ctx.world_size
    return value


def any_rank(flags: list[bool], ctx: DistContext, device: torch.device) -> list[bool]:
    """Each flag true on every rank if it is true on any: ranks must agree on when to stop."""
    if not ctx.enabled:
        return flags
    t = torch.tensor([int(f) for f in flags], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return [bool(v) for v in t.tolist()]


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
    if ctx.enabled and strategy == "fsdp":
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        set_optimizer_state_dict(model, optimizer.optimizers, state, options=StateDictOptions(full_state_dict=True))
    else:
        optimizer.load_state_dict(state)
