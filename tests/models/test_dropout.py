"""The CPU dropout's mask from 16-bit draws: the keep rate, expectation and variance of torch's dropout, the
gradient through the kept elements only, draws from torch's generator (so a resumed run's RNG state replays
them), and the model's layers using it."""

import pytest
import torch

from burnout.config import ModelConfig
from burnout.models import Transformer
from burnout.models.dropout import Dropout, dropout, keep_probability

N = 2_000_000


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("p", [0.1, 0.2, 0.5])
def test_keep_rate_expectation_and_variance_are_dropouts(p, dtype):
    torch.manual_seed(0)
    y = dropout(torch.ones(N, dtype=dtype), p)
    assert y.dtype == dtype
    keep = keep_probability(p)
    assert abs(keep - (1 - p)) <= 0.5 / 65536
    kept = y != 0
    sigma = (keep * (1 - keep) / N) ** 0.5
    assert abs(kept.float().mean().item() - keep) < 5 * sigma  # a binomial count within 5 sigma
    assert torch.equal(y[kept], torch.full_like(y[kept], 1 / keep))  # kept values scaled by the exact inverse
    rounding = 2**-8 if dtype == torch.bfloat16 else 0  # bf16 holds 1 / keep to 8 bits (1/0.9 → 1.109)
    assert y.double().mean().item() == pytest.approx(1.0, abs=5 * sigma / keep + rounding)
    assert y.double().var().item() == pytest.approx(p / (1 - p), rel=0.01)  # torch's variance, 1/q - 1


def test_each_lane_of_a_draw_keeps_at_the_rate_and_the_mask_ignores_the_input():
    """A 64-bit draw gives four elements their 16 bits each: the top lane must not lose its sign bit (a draw
    over [0, 2^63) would keep it at 1/2 whatever p is)."""
    torch.manual_seed(1)
    kept = dropout(torch.ones(N), 0.2) != 0
    by_lane = kept.view(-1, 4).float().mean(dim=0)
    sigma = (0.16 / (N / 4)) ** 0.5
    assert (by_lane - keep_probability(0.2)).abs().max() < 5 * sigma, by_lane
    other = torch.randn(N) + 3
    torch.manual_seed(1)
    assert torch.equal(dropout(other, 0.2) != 0, kept)  # the mask is the generator's alone


def test_the_gradient_flows_through_the_kept_elements_scaled():
    x = torch.randn(1000, 300, requires_grad=True)
    torch.manual_seed(2)
    y = dropout(x, 0.3)
    y.backward(torch.ones_like(y))
    kept = y != 0
    assert torch.equal(x.grad, kept.float() / keep_probability(0.3))


def test_the_generator_state_replays_the_masks_and_eval_mode_is_the_identity():
    x = torch.randn(256, 384)
    torch.manual_seed(3)
    state = torch.get_rng_state()
    first = dropout(x, 0.2)
    torch.set_rng_state(state)
    assert torch.equal(dropout(x, 0.2), first)
    assert not torch.equal(dropout(x, 0.2), first)  # the stream moved on
    layer = Dropout(0.2).eval()
    assert layer(x) is x and dropout(x, 0.0) is x


def test_the_model_drops_with_it_in_training_only():
    cfg = ModelConfig(family="gpt2", vocab_size=64, n_layer=2, d_model=32, n_head=4, context_length=16, dropout=0.2)
    model = Transformer(cfg)
    assert all(isinstance(m, Dropout) for m in (model.dropout, *(b.dropout for b in model.blocks)))
    ids = torch.randint(0, 64, (2, 16))
    model.eval()
    assert torch.equal(model(ids), model(ids))
    model.train()
    torch.manual_seed(4)
    a = model(ids)
    torch.manual_seed(4)
    assert torch.equal(model(ids), a) and not torch.equal(model(ids), a)
