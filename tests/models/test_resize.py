"""Growing the vocabulary for added tokens: old rows kept, new rows at the mean, config in sync."""

import pytest
import torch

from burnout.config import ModelConfig
from burnout.errors import BurnoutError
from burnout.models import Transformer
from burnout.models.resize import grow_vocab

TINY = {"vocab_size": 96, "n_layer": 1, "d_model": 32, "n_head": 2, "context_length": 16, "ffn_multiple_of": 16}


def _model(family: str, tied: bool) -> Transformer:
    torch.manual_seed(0)
    return Transformer(ModelConfig(family=family, tie_embeddings=tied, **TINY))


@pytest.mark.parametrize("family", ["llama", "gpt2"])
@pytest.mark.parametrize("tied", [True, False])
def test_grow_vocab_keeps_old_rows_and_sets_new_rows_to_the_mean(family, tied):
    model = _model(family, tied)
    embedding, head = model.tok_emb.weight.detach().clone(), model.lm_head.weight.detach().clone()
    assert grow_vocab(model, 98) == [96, 97]
    assert model.cfg.vocab_size == 98 and model.tok_emb.weight.shape == model.lm_head.weight.shape == (98, 32)
    assert torch.equal(model.tok_emb.weight[:96], embedding)
    assert torch.equal(model.lm_head.weight[:96], head)
    assert torch.allclose(model.tok_emb.weight[96:], embedding.mean(0).expand(2, -1))
    assert torch.allclose(model.lm_head.weight[96:], head.mean(0).expand(2, -1))
    assert (model.lm_head.weight is model.tok_emb.weight) == tied
    idx = torch.tensor([[1, 96, 97, 5]])
    assert model(idx).shape == (1, 4, 98)
    model(idx, idx).backward()  # the new rows train
    assert model.tok_emb.weight.grad[97].abs().sum() > 0


def test_reinit_rows_take_the_mean_of_the_others():
    model = _model("llama", tied=True)
    embedding = model.tok_emb.weight.detach().clone()
    assert grow_vocab(model, 96, reinit=[94, 95]) == [94, 95]
    assert torch.allclose(model.tok_emb.weight[94], embedding[:94].mean(0))
    assert torch.equal(model.tok_emb.weight[:94], embedding[:94]) and model.cfg.vocab_size == 96


def test_grow_vocab_refuses_to_shrink():
    with pytest.raises(BurnoutError, match="cannot shrink"):
        grow_vocab(_model("llama", tied=True), 90)
