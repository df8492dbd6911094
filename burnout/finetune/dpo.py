"""Direct Preference Optimization (Rafailov et al., 2023) on the one training step.

For a prompt x with a chosen answer y_w and a rejected one y_l,

    loss = −log σ(β · [(log π(y_w|x) − log π_ref(y_w|x)) − (log π(y_l|x) − log π_ref(y_l|x))])

averaged over the pairs of a batch; β · (log π − log π_ref) is an answer's implicit reward. The batch is
`burnout.finetune.tokenized.PairBatches`' (x, y): 2B rows, the chosen answers first and then the rejected answers of
the same pairs, y the next token on the answer's assistant tokens and -1 elsewhere, so a row's summed
log-probabilities over y ≠ -1 are log π(answer | prompt). With dpo.packing the batch is `PackedPairBatches`'
(x, y, positions) instead: pairs packed into rows, each sequence from position 0 (so it attends only to itself),
each pair's chosen sequence then its rejected one, and the log-probabilities are summed per sequence.

`DPOObjective` wraps the policy so that `objective(x, y)` returns this loss: `TrainStep` (and with it the
loop, gradient accumulation, clipping, the non-finite skip, checkpoints and resume) runs DPO unchanged.

The reference is the starting policy, in one of two ways:

- with LoRA adapters: the same model with its adapters switched off (`lora.disable_adapters`); the frozen
  base weights are the reference, so nothing is copied. Exact only when the adapters start at B = 0, as
  `apply_lora` makes them: resuming DPO from a checkpoint keeps using the base, which is right, since the
  reference stays the SFT model whatever the adapters have learned.
- without LoRA: a frozen copy of the policy's weights made when the objective is built, so it costs one more
  set of weights in their training dtype (4 bytes per parameter in fp32: 4 GB at 1B parameters), and no
  gradients or optimizer state. Precomputing the reference log-probs instead would save those bytes but
  needs a pass over the data before step 1 and a store keyed by pair, which the batch-index-only loader
  does not give; a frozen copy keeps `objective(x, y)` a pure function of the batch. Under torchrun the copy is
  made before DDP or FSDP wraps the objective, so every rank holds it whole, FSDP included (only the
  policy is sharded); a LoRA DPO holds no copy.

The reference runs under no_grad and in eval mode (no dropout), so at step 0 the policy and the reference
give the very same log-probabilities and the loss is exactly ln 2 when the policy has no dropout either
(DPO is usually run with dropout 0; a policy with dropout starts near ln 2 instead).

Checkpoints: the objective's parameters are the policy's (the frozen copy is not a submodule), so the
optimizer sees only the policy's trainable weights; save `objective.policy`, whose state-dict keys are the
plain model's (FSDP gathers the objective's, "policy." in front). Call the objective, never its methods, for a
forward: FSDP gathers the weights outside the blocks in the root module's forward hook.
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Iterable, Iterator, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from burnout.common import unwrapped
from burnout.errors import BurnoutError
from burnout.models.lora import disable_adapters, lora_layers
from burnout.models.transformer import Transformer, loss_chunk_rows, packed_mask
from burnout.train.distributed import joined_group, mean_across_ranks

LN2 = math.log(2.0)
METRIC_KEYS = ("loss", "rewards/chosen", "rewards/rejected", "margin", "accuracy")
# How close to ln 2, and after how many steps, the loss counts as not learning (a first DPO run stayed near
# ln 2 without any tool saying so).
STALL_TOLERANCE = 0.005
STALL_AFTER_STEPS = 100
STALL_WINDOW = 10


# ----------------------------------------------------------------------------------------------
# Log-probabilities and the loss


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


def dpo_loss(policy_chosen: torch.Tensor, policy_rejected: torch.Tensor, ref_chosen: torch.Tensor,
             ref_rejected: torch.Tensor, beta: float) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The DPO (sigmoid) loss averaged over pairs, and its metrics as detached 0-d tensors: loss,
    rewards/chosen and rewards/rejected (mean β·(log π − log π_ref)), margin (their mean difference),
    accuracy (share of pairs whose chosen reward is strictly above the rejected one)."""
    chosen_rewards = beta * (policy_chosen - ref_chosen)
    rejected_rewards = beta * (policy_rejected - ref_rejected)
    margins = chosen_rewards - rejected_rewards
    # logsigmoid rather than log(sigmoid): finite for large negative margins.
    loss = -F.logsigmoid(margins).mean()
    metrics = {"loss": loss.detach(), "rewards/chosen": chosen_rewards.detach().mean(),
               "rewards/rejected": rejected_rewards.detach().mean(), "margin": margins.detach().mean(),
               "accuracy": (chosen_rewards > rejected_rewards).float().mean().detach()}
    return loss, metrics


# ----------------------------------------------------------------------------------------------
# The objective TrainStep runs


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
    """An objective that compares its `policy` with a `reference`: a frozen copy of the starting model, or None,
    where the reference is the policy with its LoRA adapters off."""

    def reference_logprobs(self, x: torch.Tensor, y: torch.Tensor, positions: torch.Tensor | None = None
                           ) -> torch.Tensor:
        """log π_ref of each row (each packed sequence, with `positions`: sequence_logprobs), without gradients."""
        with torch.no_grad():
            if self.reference is not None:
                return sequence_logprobs(self.reference, x, y, positions)
            with disable_adapters(self.policy), eval_mode(self.policy):
                return sequence_logprobs(self.policy, x, y, positions)


class DPOObjective(StepMetrics, AgainstReference, nn.Module):
    """`objective(x, y)` → the DPO loss of a PairBatches batch, for `TrainStep` to run like a model.

    The reference: with LoRA adapters, the policy with them switched off (they must be fresh, B = 0, unless
    `resumed`: a resumed run's adapters are trained, and its reference is still the base); otherwise
    `reference` when given (e.g. the starting checkpoint loaded again on resume), else a frozen copy of
    `policy` as it is now, so build the objective before loading a resumed run's weights into the policy.

    `micro_batches` is train.grad_accum: the metrics of that many training forwards (grad enabled) are
    averaged into `last_metrics`, the step just finished. Forwards under no_grad (evaluation) leave it alone;
    `evaluate_pairs` averages those instead. On several ranks the metrics are averaged over them (StepMetrics).
    """

    # The loss is a mean over pairs, so micro-batches weigh equally (not by their target tokens).
    loss_per_row = True
    metric_keys = METRIC_KEYS

    def __init__(self, policy: nn.Module, beta: float = 0.1, micro_batches: int = 1,
                 reference: nn.Module | None = None, resumed: bool = False):
        super().__init__()
        if not beta > 0:
            raise BurnoutError(f"dpo beta: must be positive, got {beta}; the usual value is 0.1")
        self.policy = policy
        self.beta = float(beta)
        self._start_metrics(micro_batches)
        inner = unwrapped(policy)
        self.uses_adapters = isinstance(inner, Transformer) and bool(lora_layers(inner)) and reference is None
        if self.uses_adapters and not resumed and trained_adapters(inner):
            raise BurnoutError("DPO with LoRA: the model's adapters are already trained, so switching them off "
                               "would not give the starting policy as the reference; merge them first "
                               "(burnout lora merge) and start DPO with fresh adapters")
        if not self.uses_adapters and reference is None:
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

    def pair_metrics(self, x: torch.Tensor, y: torch.Tensor, positions: torch.Tensor | None = None
                     ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The loss and metrics of one batch: 2B rows (chosen first, then rejected), or with `positions` rows of
        pairs packed, each pair's chosen sequence then its rejected one (tokenized.PackedPairBatches)."""
        ref_chosen, ref_rejected = chosen_and_rejected(self.reference_logprobs(x, y, positions), positions is not None)
        policy_chosen, policy_rejected = chosen_and_rejected(sequence_logprobs(self.policy, x, y, positions),
                                                             positions is not None)
        return dpo_loss(policy_chosen, policy_rejected, ref_chosen, ref_rejected, self.beta)

    def forward(self, x: torch.Tensor, y: torch.Tensor, positions: torch.Tensor | None = None,
                with_metrics: bool = False):
        """The loss; with `with_metrics`, (loss, metrics) and nothing recorded (evaluation)."""
        loss, metrics = self.pair_metrics(x, y, positions)
        if with_metrics:
            return loss, metrics
        if torch.is_grad_enabled():
            self._record(metrics)
        return loss


def chosen_and_rejected(logprobs: torch.Tensor, packed: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch's per-sequence log-probs split into its pairs' chosen and rejected answers: PairBatches' two halves,
    or PackedPairBatches' alternate sequences."""
    if logprobs.size(0) % 2:
        raise ValueError(f"a DPO batch holds chosen and rejected answers in pairs; got {logprobs.size(0)} sequences")
    return (logprobs[0::2], logprobs[1::2]) if packed else logprobs.chunk(2)


def trained_adapters(model: Transformer) -> bool:
    # apply_lora starts every lora_B at zero; anything else was trained (or loaded) before DPO began.
    return any(bool(layer.lora_B.detach().any()) for layer in lora_layers(model).values())


def evaluate_pairs(objective: DPOObjective, batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
                   device: torch.device | str = "cpu") -> dict[str, float]:
    """The metrics over held-out batches (e.g. PairBatches.iter_eval_batches), each batch weighted by its
    pairs, and the number of pairs; the policy is run in eval mode and put back as it was."""
    totals = dict.fromkeys(METRIC_KEYS, 0.0)
    pairs = 0
    with torch.no_grad(), eval_mode(objective):
        for x, y in batches:
            # NOTE: through the module's call, not pair_metrics: FSDP2 gathers the weights outside the blocks
            # (embedding, final norm, head) in the root module's forward hook.
            _, metrics = objective(x.to(device), y.to(device), with_metrics=True)
            n = x.size(0) // 2
            for key in METRIC_KEYS:
                totals[key] += float(metrics[key]) * n
            pairs += n
    return {**{key: value / pairs for key, value in totals.items()}, "pairs": pairs} if pairs else {"pairs": 0}


# ----------------------------------------------------------------------------------------------
# Noticing a run that learns nothing


def stalled_dpo(losses: Sequence[float], after_steps: int = STALL_AFTER_STEPS, tolerance: float = STALL_TOLERANCE,
                window: int = STALL_WINDOW) -> bool:
    """Whether a DPO run is not learning, from its loss history (one loss per step, step 1 first): at least
    `after_steps` steps, and the mean of the last `window` losses within `tolerance` of ln 2. The mean, not
    the last value: one noisy step near ln 2 in a run that learns is no stall."""
    return len(losses) >= max(after_steps, 1) and _near_ln2(losses, tolerance, window)


def _near_ln2(losses: Sequence[float], tolerance: float, window: int) -> bool:
    recent = list(losses)[-max(1, window):]
    return bool(recent) and abs(sum(recent) / len(recent) - LN2) < tolerance


def stall_warning(step: int, loss: float, beta: float, tolerance: float = STALL_TOLERANCE) -> str:
    """The one warning line for a stalled run: what is wrong, and what to change."""
    return (f"warning: DPO loss {loss:.4f} is still within {tolerance:g} of ln 2 = {LN2:.4f} after {step} steps: "
            "the policy has barely moved from the reference, so it is learning nothing; raise the learning rate "
            "(train.lr; with LoRA, 5e-7 is far too low: try 1e-5 to 1e-4), check that the chosen and rejected "
            f"answers really differ (identical pairs give no signal), or raise beta (now {beta:g})")


class StalledDPO:
    """The loop's watch: `update(step, loss)` after each step returns the warning line once, the first time
    `step` ≥ `after_steps` and the mean of the last `window` losses it was given is within `tolerance` of
    ln 2, and None otherwise. Keyed by the step rather than by how many losses it saw, so a resumed run
    still warns at the step it would have (from the losses seen since the resume)."""

    def __init__(self, beta: float, after_steps: int = STALL_AFTER_STEPS, tolerance: float = STALL_TOLERANCE,
                 window: int = STALL_WINDOW):
        self.beta, self.after_steps, self.tolerance, self.window = beta, after_steps, tolerance, window
        self.recent: list[float] = []
        self.warned = False

    def update(self, step: int, loss: float) -> str | None:
        self.recent = (self.recent + [float(loss)])[-max(1, self.window):]
        if self.warned or step < self.after_steps or not _near_ln2(self.recent, self.tolerance, self.window):
            return None
        self.warned = True
        return stall_warning(step, sum(self.recent) / len(self.recent), self.beta, self.tolerance)
