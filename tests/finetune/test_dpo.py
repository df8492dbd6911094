"""DPO (burnout/finetune/dpo.py): the loss starts at exactly ln 2, gradients reach only the policy (only its
adapters under LoRA), log-probabilities equal a direct log-softmax, the metrics on a hand-made case, the
stall warning, TrainStep running DPO unchanged, and the loss and metrics equal to TRL's DPOTrainer on the
same model, β and pairs (trl is only the reference here).

Tiny random models in fp32 on the CPU; a tokenizer trained on a few sentences; no network.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F

from burnout.config import ModelConfig, TokenizerConfig
from burnout.core.chat_template import ensure_chat_tokens
from burnout.data.tokenizer import train_tokenizer
from burnout.errors import BurnoutError
from burnout.finetune import objective as shared
from burnout.finetune.conversations import PreferencePair
from burnout.finetune.dpo import (
    LN2,
    DPOObjective,
    StalledDPO,
    dpo_loss,
    evaluate_pairs,
    stall_warning,
    stalled_dpo,
)
from burnout.finetune.objective import sequence_logprobs
from burnout.finetune.tokenized import PairBatches, prepare_pairs
from burnout.models.lora import LoRAConfig, apply_lora, base_state_dict, lora_layers, merge_lora
from burnout.models.transformer import Transformer

SEQ_LEN = 48
TEXTS = ["The capital of France is Paris.", "Two plus two is four.", "I do not know, friend.",
         "Hello there! How are you today?", "Five is not the answer."]


def _turn(role: str, text: str) -> list[dict]:
    return [{"role": role, "content": text}]


PAIRS = [
    PreferencePair(_turn("user", "What is the capital of France?"), _turn("assistant", "Paris."),
                   _turn("assistant", "I do not know, friend.")),
    PreferencePair(_turn("user", "Two plus two?"), _turn("assistant", "Two plus two is four."),
                   _turn("assistant", "Five.")),
    PreferencePair(_turn("system", "Be brief.") + _turn("user", "Hi"), _turn("assistant", "Hello there!"),
                   _turn("assistant", "How are you today? Hello.")),
]


@pytest.fixture(scope="module")
def pairs_dir(tmp_path_factory):
    """A prepare_pairs folder of the three pairs, and the tokenizer.json that encoded them."""
    tok = ensure_chat_tokens(train_tokenizer(TEXTS * 20, TokenizerConfig(kind="bpe", vocab_size=300)))[0]
    out = tmp_path_factory.mktemp("dpo_pairs")
    prepare_pairs(PAIRS, tok, out / "pairs", seq_len=SEQ_LEN, val_fraction=0)
    tok.save(str(out / "tokenizer.json"))
    return out


def _batches(pairs_dir, batch_size: int = 3) -> PairBatches:
    return PairBatches(pairs_dir / "pairs", "train", batch_size=batch_size, seq_len=SEQ_LEN, seed=0)


def _model(family: str = "llama", seed: int = 0, vocab: int = 302) -> Transformer:
    torch.manual_seed(seed)
    if family == "gpt2":
        cfg = ModelConfig(family="gpt2", vocab_size=vocab, n_layer=2, d_model=32, n_head=4, context_length=64,
                          bias=True, tie_embeddings=True)
    else:
        cfg = ModelConfig(family="llama", vocab_size=vocab, n_layer=2, d_model=32, n_head=4, n_kv_head=2,
                          ffn_hidden=64, context_length=64)
    return Transformer(cfg)


def _perturb(params, seed: int = 1, scale: float = 0.05) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in params:
            p.add_(torch.randn(p.shape, generator=g) * scale)


def _lora_objective(beta: float = 0.1) -> tuple[Transformer, DPOObjective]:
    model = apply_lora(_model(), LoRAConfig(r=4, alpha=8))
    return model, DPOObjective(model, beta=beta)


# ----------------------------------------------------------------------------------------------
# The loss at step 0, and where gradients go


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_loss_at_step_0_is_exactly_ln_2(lora, pairs_dir):
    x, y = _batches(pairs_dir).get_batch(0)
    objective = _lora_objective()[1] if lora else DPOObjective(_model(), beta=0.1)
    loss = objective(x, y)
    metrics = objective.last_metrics
    assert loss.item() == torch.tensor(LN2, dtype=torch.float32).item()
    assert metrics["margin"] == metrics["rewards/chosen"] == metrics["rewards/rejected"] == 0.0
    assert metrics["accuracy"] == 0.0  # a tie is not a win


def test_gradients_reach_the_policy_and_never_the_frozen_copy(pairs_dir):
    x, y = _batches(pairs_dir).get_batch(0)
    model = _model()
    objective = DPOObjective(model, beta=0.1)
    _perturb(model.parameters())
    objective(x, y).backward()
    policy = {id(p) for p in model.parameters()}
    assert {id(p) for p in objective.parameters()} == policy  # the copy is no parameter: not optimized, not saved
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())
    assert all(not p.requires_grad and p.grad is None for p in objective.reference.parameters())
    assert not any(k.startswith("reference") for k in objective.state_dict())


def test_lora_reference_is_the_base_with_adapters_off_and_only_adapters_learn(pairs_dir):
    x, y = _batches(pairs_dir).get_batch(0)
    model, objective = _lora_objective(beta=0.5)
    assert objective.reference is None  # no second copy of the weights
    _perturb([p for n, p in model.named_parameters() if n.endswith("lora_B")])
    loss = objective(x, y)
    loss.backward()
    for name, p in model.named_parameters():
        trained = name.endswith(("lora_A", "lora_B"))
        assert (p.grad is not None and p.grad.abs().sum() > 0) if trained else p.grad is None, name
    assert all(layer.adapter_enabled for layer in lora_layers(model).values())
    # The reference equals a separate plain model holding the base weights alone.
    base = _model()
    base.load_state_dict(base_state_dict(model))
    with torch.no_grad():
        ref_chosen, ref_rejected = sequence_logprobs(base, x, y).chunk(2)
        pol_chosen, pol_rejected = sequence_logprobs(model, x, y).chunk(2)
    expected, _ = dpo_loss(pol_chosen, pol_rejected, ref_chosen, ref_rejected, 0.5)
    torch.testing.assert_close(loss.detach(), expected, rtol=0, atol=1e-6)
    assert abs(loss.item() - LN2) > 1e-3
    assert not objective.reference_logprobs(x, y).requires_grad


def test_the_reference_is_the_starting_policy_or_the_one_given(pairs_dir):
    x, y = _batches(pairs_dir).get_batch(0)
    start = _model()
    given = copy.deepcopy(start)
    objective = DPOObjective(start, beta=0.1, reference=given)  # e.g. the SFT checkpoint loaded again on resume
    _perturb(start.parameters())
    assert objective.reference is given and not any(p.requires_grad for p in given.parameters())
    objective(x, y)
    assert objective.last_metrics["loss"] != pytest.approx(LN2, abs=1e-4)
    # LoRA: adapters trained before DPO would make "adapters off" a different model from the start.
    model = apply_lora(_model(), LoRAConfig(r=4, alpha=8))
    _perturb([p for n, p in model.named_parameters() if n.endswith("lora_B")])
    with pytest.raises(BurnoutError, match="merge them first"):
        DPOObjective(model)
    assert DPOObjective(model, resumed=True).reference is None


# ----------------------------------------------------------------------------------------------
# Log-probabilities and the metrics


def test_sequence_logprobs_equal_a_direct_log_softmax_gather(pairs_dir, monkeypatch):
    x, y = _batches(pairs_dir).get_batch(0)
    model = _model(seed=3)
    _perturb(model.parameters(), scale=0.1)
    logits = model(x).float()
    direct = (F.log_softmax(logits, -1).gather(-1, y.clamp(min=0).unsqueeze(-1)).squeeze(-1) * (y != -1)).sum(1)
    direct.sum().backward()
    direct_grad = model.lm_head.weight.grad.clone()
    model.zero_grad()
    monkeypatch.setattr(shared, "loss_chunk_rows", lambda vocab: 5)  # several chunks, one of them ragged
    ours = sequence_logprobs(model, x, y)
    ours.sum().backward()
    assert ours.shape == (6,) and ours.dtype == torch.float32
    torch.testing.assert_close(ours, direct, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(model.lm_head.weight.grad, direct_grad, rtol=1e-4, atol=1e-6)


def test_rewards_margin_and_accuracy_on_a_hand_made_case():
    t = torch.tensor
    loss, m = dpo_loss(t([-10.0, -12.0, -5.0]), t([-14.0, -11.0, -6.0]), t([-11.0, -11.0, -5.0]),
                       t([-12.0, -12.0, -6.0]), beta=0.1)
    # chosen rewards 0.1·(1, −1, 0), rejected 0.1·(−2, 1, 0): margins 0.3, −0.2, 0 (a tie: no win)
    assert m["rewards/chosen"].item() == pytest.approx(0.0, abs=1e-6)
    assert m["rewards/rejected"].item() == pytest.approx(-0.1 / 3, abs=1e-6)
    assert m["margin"].item() == pytest.approx(0.1 / 3, abs=1e-6)
    assert m["accuracy"].item() == pytest.approx(1 / 3)
    expected = (math.log1p(math.exp(-0.3)) + math.log1p(math.exp(0.2)) + math.log(2)) / 3
    assert loss.item() == pytest.approx(expected, abs=1e-6)


# ----------------------------------------------------------------------------------------------
# The stall warning


def test_stall_detector_warns_once_after_n_steps_near_ln_2():
    assert not stalled_dpo([LN2] * 99, after_steps=100)
    assert stalled_dpo([LN2 + 0.004] * 100, after_steps=100)
    assert not stalled_dpo([LN2 - 0.006] * 100, after_steps=100)
    learning = [LN2 - 0.001 * i for i in range(100)] + [LN2]  # one noisy step back at ln 2 is no stall
    assert not stalled_dpo(learning, after_steps=50)
    watch = StalledDPO(beta=0.1, after_steps=20)
    lines = [watch.update(step, 0.6925 + 0.002 * (step % 2)) for step in range(1, 41)]
    warnings = [(step, line) for step, line in enumerate(lines, start=1) if line]
    assert [step for step, _ in warnings] == [20]
    line = warnings[0][1]
    assert "\n" not in line
    for part in ("after 20 steps", "ln 2", "train.lr", "chosen and rejected", "beta (now 0.1)"):
        assert part in line, line
    assert line == stall_warning(20, sum(0.6925 + 0.002 * (s % 2) for s in range(11, 21)) / 10, 0.1)


# ----------------------------------------------------------------------------------------------
# TrainStep runs DPO unchanged


def test_train_step_runs_dpo_from_ln_2_to_winning_pairs(pairs_dir, tiny_run_config):
    from burnout.train.step import TrainStep

    steps = 8
    tc = tiny_run_config(lr=3e-3, min_lr=3e-3, warmup_steps=0, grad_accum=2, max_steps=steps).train
    loader = _batches(pairs_dir, batch_size=2)
    model = _model()
    objective = DPOObjective(model, beta=0.5, micro_batches=tc.grad_accum)
    step = TrainStep(objective, tc, torch.device("cpu"), "fp32", end_of_run=steps)
    results = [step(loader, s) for s in range(steps)]
    assert results[0].loss == pytest.approx(LN2, abs=1e-6)
    # last_metrics is the last step's average over its micro-batches: the loss TrainStep reports.
    assert objective.last_metrics["loss"] == pytest.approx(results[-1].loss, rel=1e-5, abs=1e-6)
    assert results[-1].loss < LN2 - 0.1
    held_out = evaluate_pairs(objective, loader.iter_eval_batches(2))
    assert held_out["pairs"] == 3 and held_out["accuracy"] == 1.0 and held_out["margin"] > 0
    # The frozen copy stayed the starting policy.
    torch.testing.assert_close(objective.reference.state_dict(), _model().state_dict())


# ----------------------------------------------------------------------------------------------
# Equality with TRL


def _trl_examples(loader: PairBatches) -> list[dict]:
    """The batch's pairs as trl's collator takes them: the completion is the masked answer tokens (a
    trailing unmasked newline changes no earlier log-probability, so it is left out)."""
    examples = []
    for pair in loader.examples_of(0):
        prompt, _ = loader.prompts.row(pair)
        example = {}
        for side, rows in (("chosen", loader.chosen), ("rejected", loader.rejected)):
            ids, mask = rows.row(pair)
            targets = [i for i, m in enumerate(mask) if m]
            assert targets == list(range(targets[0], targets[-1] + 1))
            example["prompt_ids"] = [int(i) for i in prompt] + [int(i) for i in ids[: targets[0]]]
            example[f"{side}_ids"] = [int(i) for i in ids[targets[0] : targets[-1] + 1]]
        examples.append(example)
    return examples


# trl's own FutureWarnings (transformers renaming gradient_checkpointing) are not ours to fix.
@pytest.mark.filterwarnings("ignore::FutureWarning")
@pytest.mark.parametrize("family,lora", [("llama", False), ("llama", True), ("gpt2", False)],
                         ids=["llama-full", "llama-lora", "gpt2-full"])
def test_loss_and_metrics_equal_trl_dpo_trainer(family, lora, pairs_dir, tmp_path, monkeypatch):
    pytest.importorskip("trl")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast
    from trl import DPOConfig, DPOTrainer
    from trl.trainer.dpo_trainer import DataCollatorForPreference

    from burnout.models.hf import save_hf

    beta = 0.5
    loader = _batches(pairs_dir)
    x, y = loader.get_batch(0)
    model = _model(family)
    if lora:
        apply_lora(model, LoRAConfig(r=4, alpha=8))
        objective = DPOObjective(model, beta=beta)
        _perturb([p for n, p in model.named_parameters() if n.endswith("lora_B")], scale=0.2)
        reference = _model(family)
        reference.load_state_dict(base_state_dict(model))
        policy = merge_lora(copy.deepcopy(model))
    else:
        objective = DPOObjective(model, beta=beta)
        _perturb(model.parameters())
        policy, reference = model, objective.reference
    loss = objective(x, y)
    ours = objective.last_metrics

    tokenizer = pairs_dir / "tokenizer.json"
    save_hf(policy, tmp_path / "policy", tokenizer_path=tokenizer)
    save_hf(reference, tmp_path / "reference", tokenizer_path=tokenizer)
    hf_tok = PreTrainedTokenizerFast(tokenizer_file=str(tokenizer), pad_token="<|im_end|>", eos_token="<|im_end|>")
    args = DPOConfig(output_dir=str(tmp_path / "trl"), beta=beta, report_to="none", use_cpu=True, bf16=False,
                     max_length=None)
    trainer = DPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(tmp_path / "policy", dtype=torch.float32),
        ref_model=AutoModelForCausalLM.from_pretrained(tmp_path / "reference", dtype=torch.float32),
        args=args, processing_class=hf_tok,
        # The trainer wants a dataset to start; the batch compared is ours, given as token ids below.
        train_dataset=Dataset.from_list([{"prompt": "Hi", "chosen": " there", "rejected": " you"}]))
    inputs = DataCollatorForPreference(pad_token_id=hf_tok.pad_token_id)(_trl_examples(loader))
    trainer.model.train()
    trl_loss = trainer.compute_loss(trainer.model, inputs)
    theirs = {key: values[-1] for key, values in trainer._metrics["train"].items()}

    assert loss.item() == pytest.approx(trl_loss.item(), abs=1e-5)
    assert abs(loss.item() - LN2) > 1e-3  # a batch where the policy and the reference differ
    for ours_key, trl_key in (("rewards/chosen", "rewards/chosen"), ("rewards/rejected", "rewards/rejected"),
                              ("margin", "rewards/margins"), ("accuracy", "rewards/accuracies")):
        assert ours[ours_key] == pytest.approx(theirs[trl_key], abs=1e-5), ours_key
