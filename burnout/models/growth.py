"""Function-preserving model growth: the weights of a larger model whose outputs equal a trained one's.

    grown_model_config   the larger shape asked for, checked (only what can be grown exactly), defaults filled in
    grow_state_dict      the trained weights → the larger model's weights; same logits, up to float rounding

Deeper by identity blocks (LLaMA Pro, `_deepened`), wider by copied channels (`_Widening`), so that training the
grown model starts from what the small one learned rather than from scratch; only what can be grown exactly is.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from burnout.config import ModelConfig, from_dict
from burnout.errors import BurnoutError

# Model keys a grow changes; dropout and attention are settings, not weights, and may change too.
GROWN_KEYS = ("n_layer", "d_model", "n_head", "n_kv_head", "ffn_hidden")
FREE_KEYS = ("dropout", "attention")
# Std of the zero-sum noise on a split column, relative to its matrix's std (_Widening: symmetry).
SPLIT_NOISE = 0.01
# New heads and MLP units start as Transformer._init_weights starts every weight.
INIT_STD = 0.02
# Each block's output projections: zero in a new block, which is then the identity.
BLOCK_OUTPUTS = ("attn.proj.weight", "attn.proj.bias", "mlp.proj.weight", "mlp.proj.bias", "mlp.down.weight")


def grown_model_config(old: ModelConfig, changes: dict[str, Any]) -> ModelConfig:
    """The model `old` (resolved) grows into with `changes` (model keys → values as given), resolved.

    Not given: n_head, n_kv_head and ffn_hidden scale with the width factor, so head_dim and the group and MLP
    ratios stay; norm_eps follows the tied embeddings' scaling. Refused in one line: anything not larger, or not
    growable exactly: the vocabulary (another tokenizer is another model), the family, a non-whole width factor
    (copying some channels but not others changes the norms' statistics), head_dim, and every other key of the
    model section (context, RoPE base, biases, tying) but dropout and the attention kernel, which hold no
    weights."""
    old = old.resolved()
    for key, value in changes.items():
        if key not in (*GROWN_KEYS, *FREE_KEYS) and value != getattr(old, key, value):
            raise BurnoutError(_fixed_key(key, getattr(old, key, None), value))
    given = from_dict(ModelConfig, {**dataclasses.asdict(old), **changes}, "model")
    if given.d_model < old.d_model:
        raise BurnoutError(_not_larger(old, given, ["d_model"]))
    if given.d_model % old.d_model:
        raise BurnoutError(f"model.d_model: {given.d_model} is not a whole multiple of {old.d_model}; width grows "
                           f"exactly only by a whole factor (e.g. model.d_model={2 * old.d_model}), each channel "
                           "copied, which keeps what the norms see")
    k = given.d_model // old.d_model
    for key in ("n_head", "n_kv_head", "ffn_hidden"):
        if key not in changes:
            setattr(given, key, k * getattr(old, key))
    if given.n_head * old.head_dim != given.d_model:
        raise BurnoutError(f"model.n_head: {given.n_head} heads of {given.d_model} channels are not "
                           f"{old.head_dim} wide; heads grow but keep their width (RoPE ties it), so give "
                           f"model.n_head={given.d_model // old.head_dim} (or leave it out)")
    if old.family == "gpt2" and "n_kv_head" not in changes:
        given.n_kv_head = given.n_head
    if old.tie_embeddings:
        given.norm_eps = old.norm_eps / k**2
    new = given.resolved()
    smaller = [key for key in GROWN_KEYS if getattr(new, key) < getattr(old, key)]
    if smaller or all(getattr(new, key) == getattr(old, key) for key in GROWN_KEYS):
        raise BurnoutError(_not_larger(old, new, smaller))
    old_group, new_group = old.n_head // old.n_kv_head, new.n_head // new.n_kv_head
    needed = old.n_kv_head * -(-old_group // new_group)
    if needed > new.n_kv_head:
        raise BurnoutError(f"model.n_kv_head: {old.n_kv_head} key/value heads of {old_group} query heads each need "
                           f"{needed} groups of {new_group}, and {new.n_kv_head} were given; give model.n_kv_head="
                           f"{needed} or more (a divisor of n_head={new.n_head})")
    return new


def _not_larger(old: ModelConfig, new: ModelConfig, smaller: list[str]) -> str:
    """The refusal of a shape with `smaller` keys, or (none) the same shape."""
    shape = ", ".join(f"{key} {getattr(old, key)} → {getattr(new, key)}" for key in smaller or GROWN_KEYS)
    return (f"model: growing needs a larger shape, and {shape} is {'smaller' if smaller else 'the same'}; give "
            f"larger values, e.g. model.n_layer={2 * old.n_layer}")


def _fixed_key(key: str, old: Any, new: Any) -> str:
    if key == "vocab_size":
        return (f"model.vocab_size: {new} differs from the model's {old}; a grown model keeps its vocabulary and "
                "tokenizer (another tokenizer is another model: train it from scratch)")
    if key == "family":
        return f"model.family: {new} differs from the model's {old}; a model grows within its family"
    return (f"model.{key}: {new} differs from the model's {old}; a grow changes only "
            f"{', '.join(f'model.{k}' for k in GROWN_KEYS)} (and {' and '.join(FREE_KEYS)}), the shapes it can "
            "grow exactly")


@torch.no_grad()
def grow_state_dict(old: ModelConfig, state: dict[str, torch.Tensor], new: ModelConfig,
                    seed: int = 0) -> dict[str, torch.Tensor]:
    """The weights of `new` (from grown_model_config) whose logits equal those of `old`'s `state` (a
    Transformer's state_dict). `seed` draws the new heads and units and the split columns' noise."""
    old, new = old.resolved(), new.resolved()
    widening = _Widening(old, new, torch.Generator().manual_seed(seed))
    grown = {"tok_emb.weight": widening.written(state["tok_emb.weight"], dim=1)}
    if "pos_emb.weight" in state:
        grown["pos_emb.weight"] = widening.written(state["pos_emb.weight"], dim=1)
    blocks = [widening.block(_block(state, i)) for i in range(old.n_layer)]
    for i, block in enumerate(_deepened(blocks, new.n_layer)):
        grown.update({f"blocks.{i}.{name}": tensor for name, tensor in block.items()})
    grown.update({name: widening.norm(state[name]) for name in ("norm.weight", "norm.bias") if name in state})
    if new.tie_embeddings:
        grown["lm_head.weight"] = grown["tok_emb.weight"]
    else:
        grown["lm_head.weight"] = widening.read(state["lm_head.weight"])
    return grown


def _block(state: dict[str, torch.Tensor], i: int) -> dict[str, torch.Tensor]:
    prefix = f"blocks.{i}."
    return {name[len(prefix):]: tensor for name, tensor in state.items() if name.startswith(prefix)}


def _deepened(blocks: list[dict], n_layer: int) -> list[dict]:
    """`blocks` with n_layer - len(blocks) identity blocks interleaved: new block j follows old block
    ceil((j + 1)·old / added) - 1, whose weights it copies, its output projections zero.

    Its attention and MLP output projections (and their biases) zero, a new block adds nothing to the residual
    stream (LLaMA Pro, Wu et al. 2024: n_layer 4 → 8, one after every old block; 4 → 6, after blocks 1 and 3).
    Interleaved rather than stacked on top: the new capacity is spread through the depth, where stacking it above
    the last block puts all of it where the features are already the output's. A copy rather than random input
    weights: the new block's first updates (its output projections get gradients at once; its other weights from
    the step after, when those are no longer zero) work on features that mean something at that depth."""
    added = n_layer - len(blocks)
    follows = [-(-(j + 1) * len(blocks) // added) - 1 for j in range(added)]
    deepened = []
    for i, block in enumerate(blocks):
        deepened.append(block)
        for _ in range(follows.count(i)):
            deepened.append({name: torch.zeros_like(t) if name in BLOCK_OUTPUTS else t.clone()
                             for name, t in block.items()})
    return deepened


def _head_plan(old: ModelConfig, new: ModelConfig) -> tuple[list[int | None], list[int | None]]:
    """(for each new query head, the old one it is; for each new key/value head, the old one it copies), None
    for a new head. Old key/value head j's query heads fill groups of the new group size in order, each group's
    key/value head a copy of j; grown_model_config has checked that they fit."""
    old_group, new_group = old.n_head // old.n_kv_head, new.n_head // new.n_kv_head
    queries: list[int | None] = [None] * new.n_head
    kv: list[int | None] = [None] * new.n_kv_head
    group = 0
    for j in range(old.n_kv_head):
        heads = list(range(j * old_group, (j + 1) * old_group))
        for start in range(0, old_group, new_group):
            chunk = heads[start:start + new_group]
            kv[group] = j
            queries[group * new_group:group * new_group + len(chunk)] = chunk
            group += 1
    return queries, kv


class _Widening:
    """The width half of a grow, tensor by tensor: `k` copies of each channel, the stream scaled by `scale` (1/k
    with tied embeddings, else 1).

    Each residual channel is copied k times ([x, x, …, x]): the copies keep the mean and the variance of the
    channels, so LayerNorm and RMSNorm give the copied output when their gains (and biases) are copied too. A layer
    that reads the stream (qkv, MLP inputs, an untied LM head) splits each input column over its k copies (each 1/k
    of it), so it computes what it computed before; a layer that writes it (embeddings, attention and MLP output
    projections) copies its rows. Heads grow, head_dim does not (RoPE ties its frequencies to head_dim): old heads
    keep their weights, new heads and new MLP units start at the model's random init with zero output weights
    (free). Grouped-query attention regroups exactly: an old key/value head is copied to as many new ones as its
    query heads need groups (_head_plan); a shape where they cannot fit is refused.

    Tied embeddings: the token embedding is both a writer (rows copied) and the head, a reader (columns split), so
    it cannot be both as is. Tied, the whole stream is scaled by 1/k (the embedding and every writer by 1/k, which
    makes the tied matrix exactly the split head) and norm_eps by 1/k², where the scale-free norms then give the
    same output.

    Symmetry: copies of a channel fed and read alike would get equal gradients and stay copies for ever. Each
    reader's split columns carry small noise that sums to zero over the k copies of a channel (Net2Net, Chen et
    al. 2016): the copies are equal, so the sum is unchanged, but their gradients differ from the first step. The
    tied head cannot carry it (its rows write the stream, which must stay copied); the other readers do.
    """

    def __init__(self, old: ModelConfig, new: ModelConfig, generator: torch.Generator):
        self.old, self.new, self.generator = old, new, generator
        self.k = new.d_model // old.d_model
        self.scale = 1 / self.k if new.tie_embeddings else 1.0
        self.queries, self.kv = _head_plan(old, new)

    def written(self, weight: torch.Tensor, dim: int) -> torch.Tensor:
        """A writer of the stream: its d_model dimension `dim` copied k times, scaled."""
        return weight.repeat(*(self.k if d == dim else 1 for d in range(weight.dim()))) * self.scale

    def norm(self, weight: torch.Tensor) -> torch.Tensor:
        return weight.repeat(self.k)

    def read(self, weight: torch.Tensor) -> torch.Tensor:
        """A reader of the stream (out, d_model) → (out, k·d_model): each column split over its k copies, plus noise
        that sums to zero over them."""
        out, width = weight.shape
        split = (weight / self.k).repeat(1, self.k).view(out, self.k, width)
        if self.k > 1:
            noise = self._random((out, self.k, width), weight, SPLIT_NOISE * float(weight.float().std()))
            split = split + (noise - noise.mean(dim=1, keepdim=True))
        return split.reshape(out, self.k * width)

    def _random(self, shape: tuple[int, ...], like: torch.Tensor, std: float) -> torch.Tensor:
        return (torch.randn(shape, generator=self.generator) * std).to(like.device, like.dtype)

    def _new_rows(self, rows: int, like: torch.Tensor) -> torch.Tensor:
        """Rows of a reader for new heads or units: the random init, over the widened stream."""
        return self._random((rows, self.new.d_model), like, INIT_STD)

    def block(self, block: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        grown = {name: self.norm(block[name]) for name in block if name.startswith(("norm_attn.", "norm_mlp."))}
        grown.update(self._attention(block))
        mlp = ("mlp.fc", "mlp.proj") if "mlp.fc.weight" in block else ("mlp.gate", "mlp.up", "mlp.down")
        grown.update(self._mlp(block, mlp[:-1], mlp[-1]))
        return grown

    def _attention(self, block: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        old, D = self.old, self.old.head_dim
        sizes, plans = [old.n_head * D, old.n_kv_head * D, old.n_kv_head * D], [self.queries, self.kv, self.kv]
        weight = block["attn.qkv.weight"]  # rows: the query heads, then the keys', then the values'
        grown = {"attn.qkv.weight": torch.cat([self._heads(part.view(-1, D, old.d_model), plan)
                                               for part, plan in zip(weight.split(sizes), plans)])}
        if "attn.qkv.bias" in block:
            grown["attn.qkv.bias"] = torch.cat([self._head_biases(part.view(-1, D), plan)
                                                for part, plan in zip(block["attn.qkv.bias"].split(sizes), plans)])
        proj = block["attn.proj.weight"]  # (d_model, H·D): a new query head's columns are zero
        columns = [proj[:, h * D:(h + 1) * D] if h is not None else proj.new_zeros(proj.size(0), D)
                   for h in self.queries]
        grown["attn.proj.weight"] = self.written(torch.cat(columns, dim=1), dim=0)
        if "attn.proj.bias" in block:
            grown["attn.proj.bias"] = self.written(block["attn.proj.bias"], dim=0)
        return grown

    def _heads(self, heads: torch.Tensor, plan: list[int | None]) -> torch.Tensor:
        """(old heads, D, d_model) → (new heads·D, k·d_model): old heads read the widened stream, new ones random."""
        D = heads.size(1)
        return torch.cat([self.read(heads[h]) if h is not None else self._new_rows(D, heads) for h in plan])

    @staticmethod
    def _head_biases(biases: torch.Tensor, plan: list[int | None]) -> torch.Tensor:
        return torch.cat([biases[h] if h is not None else biases.new_zeros(biases.size(1)) for h in plan])

    def _mlp(self, block: dict[str, torch.Tensor], inputs: tuple[str, ...], output: str) -> dict[str, torch.Tensor]:
        """Inputs: old units read the widened stream, new units random (bias zero); the output: new units' columns
        zero, rows copied."""
        added = self.new.ffn_hidden - self.old.ffn_hidden
        grown = {}
        for name in inputs:
            weight = block[f"{name}.weight"]
            grown[f"{name}.weight"] = torch.cat([self.read(weight), self._new_rows(added, weight)])
            if f"{name}.bias" in block:
                bias = block[f"{name}.bias"]
                grown[f"{name}.bias"] = torch.cat([bias, bias.new_zeros(added)])
        weight = block[f"{output}.weight"]
        grown[f"{output}.weight"] = self.written(torch.cat([weight, weight.new_zeros(weight.size(0), added)], dim=1),
                                                 dim=0)
        if f"{output}.bias" in block:
            grown[f"{output}.bias"] = self.written(block[f"{output}.bias"], dim=0)
        return grown
