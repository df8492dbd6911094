"""What DPO and GRPO share (burnout/finetune/objective.py): the reference runs without dropout whatever mode the policy
trains in, as a frozen copy or as the policy with its adapters off, and leaves the policy as it was; adapters trained
before the objective began are refused for both, since switching them off would not give the starting policy.

Tiny random models in fp32 on the CPU; no network.
"""

from __future__ import annotations

import pytest
import torch

from burnout.config import ModelConfig, RLConfig, TokenizerConfig
from burnout.core.chat_template import ensure_chat_tokens
from burnout.data.tokenizer import train_tokenizer
from burnout.errors import BurnoutError
from burnout.finetune.dpo import DPOObjective
from burnout.finetune.objective import eval_mode, sequence_logprobs
from burnout.finetune.rl import GRPOObjective
from burnout.models.lora import LoRAConfig, apply_lora
from burnout.models.transformer import Transformer

VOCAB = 64


def _model(dropout: float = 0.0) -> Transformer:
    torch.manual_seed(0)
    return Transformer(ModelConfig(family="llama", vocab_size=VOCAB, n_layer=2, d_model=32, n_head=4, n_kv_head=2,
                                   ffn_hidden=64, context_length=32, dropout=dropout))


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, VOCAB, (4, 16), generator=g)
    y = torch.randint(0, VOCAB, (4, 16), generator=g)
    y[:, :5] = -1  # the prompt: no targets
    return x, y


def _train_adapters(model: Transformer) -> None:
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("lora_B"):
                p.add_(0.05)


@pytest.mark.parametrize("lora", [False, True], ids=["copy", "adapters-off"])
def test_the_reference_runs_without_dropout_and_leaves_the_policy_training(lora):
    policy = _model(dropout=0.5)
    if lora:
        policy = apply_lora(policy, LoRAConfig(r=4, alpha=8))
    policy.train()
    objective = DPOObjective(policy)
    assert (objective.reference is None) == lora
    x, y = _batch()
    with torch.no_grad(), eval_mode(policy):
        start = sequence_logprobs(policy, x, y)  # fresh adapters (B = 0): the policy is its own start
    first, second = objective.reference_logprobs(x, y), objective.reference_logprobs(x, y)
    assert torch.equal(first, start) and torch.equal(second, start)  # no dropout mask: the same every time
    assert policy.training and all(m.training for m in policy.modules())
    with torch.no_grad():
        assert not torch.equal(sequence_logprobs(policy, x, y), start)  # the policy itself still drops out


def test_adapters_trained_before_the_objective_are_refused_for_dpo_and_for_grpos_kl():
    tokenizer = ensure_chat_tokens(train_tokenizer(["two plus two is four"] * 20,
                                                   TokenizerConfig(kind="bpe", vocab_size=300)))[0]
    policy = apply_lora(_model(), LoRAConfig(r=4, alpha=8))
    _train_adapters(policy)
    section = RLConfig(base="chat", source="tasks.jsonl", kl_coef=0.1)
    with pytest.raises(BurnoutError, match=r"^DPO with LoRA: .*merge them first"):
        DPOObjective(policy)
    with pytest.raises(BurnoutError, match=r"^rl.kl_coef with LoRA: .*merge them first"):
        GRPOObjective(policy, tokenizer, [], lambda *a: 0.0, section, seed=0)
    # A resumed run's adapters are trained, and its reference is still the base; without a KL penalty none is needed.
    assert GRPOObjective(policy, tokenizer, [], lambda *a: 0.0, section, seed=0, resumed=True).reference is None
    unpenalized = RLConfig(base="chat", source="tasks.jsonl", kl_coef=0.0)
    assert GRPOObjective(policy, tokenizer, [], lambda *a: 0.0, unpenalized, seed=0).reference is None
    plain = _model()
    penalized = GRPOObjective(plain, tokenizer, [], lambda *a: 0.0, section, seed=0)
    assert penalized.reference is not None and penalized.reference is not plain  # a frozen copy
    assert not any(p.requires_grad for p in penalized.reference.parameters())
