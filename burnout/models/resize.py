"""Growing a model's vocabulary for tokens added after pretraining (the chat template's <|im_start|>/<|im_end|>).

A new row starts at the mean of the trained rows rather than at random: as an output row its logit is
then the average of the others' logits, so the new tokens start with a small share of the probability
and the model's predictions barely move until fine-tuning teaches them (J. Hewitt, "Initializing new
word embeddings for pretrained language models", 2021). Call it before the optimizer is made and
before DDP/FSDP wrap the model: both hold the old parameters.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn as nn

from burnout.errors import BurnoutError
from burnout.models.transformer import unwrapped


@torch.no_grad()
def grow_vocab(model: nn.Module, new_size: int, reinit: Iterable[int] = ()) -> list[int]:
    """Grow `model`'s token embedding and LM head (tied or untied) to `new_size` rows; the rows it initialised.

    Rows [old size, new_size) and the existing rows listed in `reinit` (ids an added token took inside
    the model's padded vocabulary, never trained as that token) are set to the mean of the other existing
    rows, per matrix; every other row keeps its value. model.cfg.vocab_size follows; the caller saves
    the grown size in its run config.
    """
    model = unwrapped(model)
    old_size = model.tok_emb.num_embeddings
    if new_size < old_size:
        raise BurnoutError(f"cannot shrink the vocabulary from {old_size} to {new_size} tokens; "
                           "the tokenizer must keep every id the model was trained on")
    reinit = sorted(set(reinit))
    if any(not 0 <= i < old_size for i in reinit):
        raise BurnoutError(f"reinit ids {reinit} must be existing rows, below {old_size}")
    fresh = reinit + list(range(old_size, new_size))
    if len(reinit) >= old_size:
        raise BurnoutError("no trained rows left to take the mean of; reinit fewer ids")
    tied = model.lm_head.weight is model.tok_emb.weight
    model.tok_emb.weight = _grown(model.tok_emb.weight, new_size, reinit, fresh)
    model.tok_emb.num_embeddings = new_size
    if tied:
        model.lm_head.weight = model.tok_emb.weight
    else:
        model.lm_head.weight = _grown(model.lm_head.weight, new_size, reinit, fresh)
    model.lm_head.out_features = new_size
    model.cfg.vocab_size = new_size
    return fresh


def _grown(weight: torch.Tensor, new_size: int, reinit: list[int], fresh: list[int]) -> nn.Parameter:
    keep = torch.ones(weight.size(0), dtype=torch.bool, device=weight.device)
    keep[reinit] = False
    # The mean in fp32: a bf16 sum over tens of thousands of rows loses most of its digits.
    mean = weight[keep].float().mean(dim=0).to(weight.dtype)
    grown = torch.empty(new_size, weight.size(1), dtype=weight.dtype, device=weight.device)
    grown[: weight.size(0)] = weight
    grown[fresh] = mean
    return nn.Parameter(grown, requires_grad=weight.requires_grad)
