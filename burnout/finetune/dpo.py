"""Direct Preference Optimization (Rafailov et al., 2023): the DPO loss of a batch of preference pairs, the objective
TrainStep runs, the held-out pairs' metrics, and the warning for a run whose loss stays at ln 2.

For a prompt x with a chosen answer y_w and a rejected one y_l,

    loss = −log σ(β · [(log π(y_w|x) − log π_ref(y_w|x)) − (log π(y_l|x) − log π_ref(y_l|x))])

averaged over the pairs; β · (log π − log π_ref) is an answer's implicit reward. `DPOObjective(x, y)` returns it, so
the Trainer runs DPO as it runs pretraining. The log-probabilities and the reference are objective.py's, shared with
GRPO; docs/FINETUNING.md says what the reference costs and why the loss starts at exactly ln 2.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from burnout.errors import BurnoutError
from burnout.finetune.objective import AgainstReference, StepMetrics, adapted, eval_mode, sequence_logprobs

LN2 = math.log(2.0)
METRIC_KEYS = ("loss", "rewards/chosen", "rewards/rejected", "margin", "accuracy")
# How close to ln 2, and after how many steps, the loss counts as not learning (a first DPO run stayed near
# ln 2 without any tool saying so).
STALL_TOLERANCE = 0.005
STALL_AFTER_STEPS = 100
STALL_WINDOW = 10


# ----------------------------------------------------------------------------------------------
# The loss


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
        self._hold_reference(policy, reference, adapted(policy) and reference is None, resumed,
                             "DPO with LoRA: the model's adapters are already trained, so switching them off would "
                             "not give the starting policy as the reference; merge them first (burnout lora merge) "
                             "and start DPO with fresh adapters")

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
