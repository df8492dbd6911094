"""What DPO and GRPO compute against a reference model: each answer's summed log-probabilities (sequence_logprobs),
the reference's (AgainstReference: a frozen copy of the starting policy, or the policy with its LoRA adapters off),
and the metrics a step reports beside its loss (StepMetrics).

Why one module: both objectives wrap the policy so that TrainStep runs them like a model, and both measure how far
it has moved from where it started; dpo.py and rl.py hold only what is their own. docs/FINETUNING.md says what the
reference costs and why it is a copy.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from burnout.errors import BurnoutError
from burnout.models.lora import disable_adapters, lora_layers
from burnout.models.transformer import Transformer, loss_chunk_rows, packed_mask, unwrapped
from burnout.train.distributed import joined_group, mean_across_ranks

# ----------------------------------------------------------------------------------------------
# Log-probabilities


def sequence_logprobs(model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                      positions: torch.Tensor | None = None) -> torch.Tensor:
    """(N,) fp32: per row, the sum over positions with y ≠ -1 of log softmax(logits)[y]. With `positions` (rows of
    sequences packed end to end, each from position 0: tokenized.PackedPairBatches), per sequence that has targets,
    in reading order.

    With our Transformer (it has hidden_states and lm_head) only the target positions go through the head,
    a chunk of rows at a time, each chunk checkpointed, so neither the (N, T, V) logits nor the targets'
    full (M, V) logits exist at once; the log-softmax is taken in fp32 whatever autocast computed the
    logits in. Any other model's logits(x) are used whole.
    """
    inner = unwrapped(model)
    packing = {} if positions is None else {"positions": positions}
    if hasattr(inner, "hidden_states") and hasattr(inner, "lm_head"):
        mask = None if positions is None else packed_mask(positions)
        return _head_logprobs(inner.hidden_states(x, positions=positions, mask=mask), inner.lm_head.weight, y,
                              positions)
    targets = y.reshape(-1)
    at = torch.nonzero(targets != -1).squeeze(1)  # (M,)
    logits = model(x, **packing).flatten(0, 1)[at]  # (M, V)
    token_logprobs = -F.cross_entropy(logits.float(), targets[at], reduction="none")
    return _sum_per_sequence(token_logprobs, at, y, positions)


# NOTE: outside torch.compile. The number of target positions M differs from batch to batch, and a graph
# taking the (M, C) rows was compiled again for every new M (each of those steps far slower, then eager for
# good at dynamo's recompile limit; docs/PERFORMANCE.md). The blocks, whose shapes depend on x's alone,
# stay in the compiled graph; what runs eager here is the head's matmuls, a chunk at a time.
@torch.compiler.disable
def _head_logprobs(hidden: torch.Tensor, weight: torch.Tensor, y: torch.Tensor,
                   positions: torch.Tensor | None) -> torch.Tensor:
    targets = y.reshape(-1)
    at = torch.nonzero(targets != -1).squeeze(1)  # (M,)
    hidden, picked = hidden.flatten(0, 1)[at], targets[at]  # (M, C), (M,)
    chunk = loss_chunk_rows(weight.size(0))
    parts = [checkpoint(_target_logprobs, hidden[s : s + chunk], weight, picked[s : s + chunk],
                        use_reentrant=False, preserve_rng_state=False)
             for s in range(0, hidden.size(0), chunk)]
    token_logprobs = torch.cat(parts) if parts else hidden.new_zeros(0, dtype=torch.float32)
    return _sum_per_sequence(token_logprobs, at, y, positions)


def _sum_per_sequence(token_logprobs: torch.Tensor, at: torch.Tensor, y: torch.Tensor,
                      positions: torch.Tensor | None) -> torch.Tensor:
    """The targets' log-probs (M,), at flat positions `at` of y, summed per row, or with `positions` per packed
    sequence that has targets (a sequence starts where its position is 0)."""
    if positions is None:
        sequence, count = torch.div(at, y.size(1), rounding_mode="floor"), y.size(0)  # (M,) each target's row
    else:
        started = (positions.reshape(-1) == 0).cumsum(0)[at]  # (M,) how many sequences began by each target
        numbers, sequence = torch.unique_consecutive(started, return_inverse=True)
        count = numbers.numel()
    return torch.zeros(count, dtype=torch.float32, device=y.device).index_add(0, sequence, token_logprobs)


def _target_logprobs(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    # NOTE: `weight.t()` for the reason chunked_cross_entropy gives: autocast casts it per chunk, so the
    # weight's gradient adds up over chunks in fp32.
    return -F.cross_entropy((hidden @ weight.t()).float(), targets, reduction="none")


# ----------------------------------------------------------------------------------------------
# The objective TrainStep runs: its metrics and its reference


@contextlib.contextmanager
def eval_mode(module: nn.Module) -> Iterator[None]:
    was_training = module.training
    module.eval()
    try:
        yield
    finally:
        module.train(was_training)


class StepMetrics:
    """What an objective reports of its last step beside its loss (the loop writes it into metrics.jsonl): the
    metrics of `micro_batches` training forwards (grad enabled), given to `_record` as 0-d tensors, averaged into
    `last_metrics`, over every rank's under torchrun. A subclass names its `metric_keys` and calls `_start_metrics`
    in its __init__."""

    metric_keys: tuple[str, ...] = ()

    def _start_metrics(self, micro_batches: int) -> None:
        self.micro_batches = int(micro_batches)
        self._sums: dict[str, torch.Tensor] = {}
        self._count = 0
        self._last: dict[str, torch.Tensor] = {}

    @torch.compiler.disable
    def _record(self, metrics: dict[str, torch.Tensor]) -> None:
        # Kept as tensors: a float per micro-batch would sync with the GPU every forward.
        for key, value in metrics.items():
            self._sums[key] = self._sums[key] + value if key in self._sums else value.float()
        self._count += 1
        if self._count >= self.micro_batches:
            # Under torchrun, the mean over every rank's micro-batches, as one process accumulating them all would
            # log: one small all-reduce per step, which every rank reaches (each runs every step's micro-batches).
            means = mean_across_ranks(torch.stack(list(self._sums.values())) / self._count, joined_group())
            self._last = dict(zip(self._sums, means))
            self._sums, self._count = {}, 0

    @property
    def last_metrics(self) -> dict[str, float]:
        """The last finished step's metrics (metric_keys), averaged over its micro-batches; empty before the
        first step. Reading it syncs with the device once."""
        if not self._last:
            return {}
        values = torch.stack([self._last[key] for key in self.metric_keys]).tolist()
        return dict(zip(self.metric_keys, values))


class AgainstReference:
    """An objective (an nn.Module) that compares its `policy` with a `reference`: a frozen copy of the starting model,
    or None, where the reference is the policy with its LoRA adapters off.

    The copy is kept out of the module tree, so the objective's parameters and state dict are the policy's alone
    (the optimizer, clipping, DDP, checkpoints: save `objective.policy`). Call the objective, never its methods,
    for a forward: FSDP gathers the weights outside the blocks in the root module's forward hook."""

    # Until _hold_reference: none (an objective that has no reference, GRPO without a KL penalty, never asks for it).
    reference: nn.Module | None = None

    def _hold_reference(self, policy: nn.Module, reference: nn.Module | None, adapters: bool, resumed: bool,
                        refusal: str) -> None:
        """Hold the reference: with `adapters`, none (the policy's adapters must then be fresh, B = 0, unless
        `resumed`, else `refusal`, one line); otherwise `reference` when given, else a frozen copy of `policy` as it
        is now, so build the objective before loading a resumed run's weights into the policy."""
        if adapters and not resumed and trained_adapters(policy):
            raise BurnoutError(refusal)
        if not adapters and reference is None:
            reference = copy.deepcopy(policy)
        if reference is not None:
            reference.requires_grad_(False).eval()
        # NOTE: kept out of the module tree, so the copy is in neither parameters() (the optimizer, gradient
        # clipping, DDP) nor state_dict() (checkpoints).
        self.__dict__["reference"] = reference

    @property
    def blocks(self) -> nn.ModuleList:
        """The policy's blocks: where train.optimizer=muon looks for its matrices."""
        return self.policy.blocks

    def reference_logprobs(self, x: torch.Tensor, y: torch.Tensor, positions: torch.Tensor | None = None
                           ) -> torch.Tensor:
        """log π_ref of each row (each packed sequence, with `positions`: sequence_logprobs), without gradients."""
        with torch.no_grad():
            if self.reference is not None:
                return sequence_logprobs(self.reference, x, y, positions)
            with disable_adapters(self.policy), eval_mode(self.policy):
                return sequence_logprobs(self.policy, x, y, positions)


def adapted(policy: nn.Module) -> bool:
    """Whether `policy` is our Transformer with LoRA adapters (whose reference can be the policy with them off)."""
    inner = unwrapped(policy)
    return isinstance(inner, Transformer) and bool(lora_layers(inner))


def trained_adapters(model: nn.Module) -> bool:
    # apply_lora starts every lora_B at zero; anything else was trained (or loaded) before the objective began.
    return any(bool(layer.lora_B.detach().any()) for layer in lora_layers(model).values())
