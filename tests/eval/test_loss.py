"""Validation loss: the token-weighted mean cross-entropy over the split's first windows."""

import math

import pytest
import torch
import torch.nn.functional as F

from burnout.config import ModelConfig
from burnout.data.loader import TokenLoader
from burnout.eval.loss import evaluate_loss
from burnout.models import Transformer

CPU = torch.device("cpu")
SEQ_LEN = 32


def tiny_model(vocab_size: int, **fields) -> Transformer:
    torch.manual_seed(0)
    cfg = ModelConfig(family="llama", vocab_size=vocab_size, n_layer=2, d_model=64, n_head=4, n_kv_head=2,
                      context_length=64, ffn_multiple_of=32, **fields)
    return Transformer(cfg)


def hand_computed_loss(model: Transformer, loader: TokenLoader, num_batches: int) -> tuple[float, int, list[float]]:
    """Sum of per-token cross-entropies in float64 over the same windows, divided by their count;
    also the count and each batch's own mean."""
    total, count, batch_means = 0.0, 0, []
    with torch.no_grad():
        for x, y in loader.iter_eval_batches(num_batches):
            logits = model(x).double()
            batch_sum = F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1), reduction="sum").item()
            total += batch_sum
            count += y.numel()
            batch_means.append(batch_sum / y.numel())
    return total / count, count, batch_means


def test_untrained_model_scores_about_ln_vocab(tiny_bpe_data):
    loader = TokenLoader(tiny_bpe_data, "val", batch_size=4, seq_len=SEQ_LEN, seed=0)
    vocab = loader.meta["vocab_size"]
    model = tiny_model(vocab)
    loss = evaluate_loss(model, loader, 4, CPU)
    assert abs(loss - math.log(vocab)) < 0.5, (loss, math.log(vocab))


@pytest.mark.parametrize("num_batches", [1, 3])
def test_equals_the_hand_computed_mean_cross_entropy(tiny_bpe_data, num_batches):
    loader = TokenLoader(tiny_bpe_data, "val", batch_size=4, seq_len=SEQ_LEN, seed=0)
    model = tiny_model(loader.meta["vocab_size"]).eval()
    expected, count, _ = hand_computed_loss(model, loader, num_batches)
    assert count == num_batches * 4 * SEQ_LEN
    assert evaluate_loss(model, loader, num_batches, CPU) == pytest.approx(expected, rel=1e-6)


def test_whole_split_weights_the_short_last_batch_by_its_tokens(tiny_bpe_data):
    """Asking for more batches than the split holds walks it all once; the last, smaller batch counts
    per token, not as a whole batch."""
    batch = 7
    loader = TokenLoader(tiny_bpe_data, "val", batch_size=batch, seq_len=SEQ_LEN, seed=0)
    windows = (loader.num_tokens - 1) // SEQ_LEN
    assert windows % batch, "the split should end in a partial batch for this test to mean something"
    model = tiny_model(loader.meta["vocab_size"])
    # Train it a little so per-window losses differ and a per-batch mean would be visibly wrong.
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    train = TokenLoader(tiny_bpe_data, "train", batch_size=8, seq_len=SEQ_LEN, seed=0)
    for step in range(5):
        model(*train.get_batch(step)).backward()
        opt.step()
        opt.zero_grad()
    expected, count, batch_means = hand_computed_loss(model, loader, 10_000)
    assert count == windows * SEQ_LEN and len(batch_means) == -(-windows // batch)
    got = evaluate_loss(model, loader, 10_000, CPU)
    assert got == pytest.approx(expected, rel=1e-6)
    assert got != pytest.approx(sum(batch_means) / len(batch_means), rel=1e-6)


def test_evaluation_ignores_dropout_and_restores_the_mode(tiny_bpe_data):
    loader = TokenLoader(tiny_bpe_data, "val", batch_size=4, seq_len=SEQ_LEN, seed=0)
    model = tiny_model(loader.meta["vocab_size"], dropout=0.5).train()
    first = evaluate_loss(model, loader, 2, CPU)
    assert model.training
    assert evaluate_loss(model, loader, 2, CPU) == first
    assert first == pytest.approx(hand_computed_loss(model.eval(), loader, 2)[0], rel=1e-6)
    assert not model.training
    evaluate_loss(model, loader, 2, CPU)
    assert not model.training
