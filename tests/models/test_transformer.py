"""The decoder-only transformer (burnout/models/transformer.py): fused SDPA attention against the
written-out reference, KV-cached decoding and packed branches against full recompute, causality, tying,
init and loss.

Tiny fp32 models on the CPU with fixed seeds; every comparison is to 1e-5.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from burnout.config import ModelConfig
from burnout.models.transformer import Transformer, causal_mask, explicit_attention

ATOL = 1e-5
VOCAB = 97
CONTEXT = 32


def make_cfg(family: str, **kw) -> ModelConfig:
    base = dict(family=family, vocab_size=VOCAB, n_layer=2, d_model=48, n_head=6, context_length=CONTEXT)
    if family == "llama":
        base["ffn_hidden"] = 80
    return ModelConfig(**{**base, **kw})


# (id, family, overrides): gpt2 and llama shapes, GQA, MQA, odd head counts, bias and tying on and off.
SHAPES = [
    ("gpt2", "gpt2", {}),
    ("gpt2-3heads-odd-dim-untied-nobias", "gpt2", dict(d_model=45, n_head=3, tie_embeddings=False, bias=False)),
    ("llama-mha", "llama", {}),
    ("llama-gqa-6/2", "llama", dict(n_kv_head=2)),
    ("llama-gqa-6/3-bias-untied", "llama", dict(n_kv_head=3, bias=True, tie_embeddings=False)),
    ("llama-mqa", "llama", dict(n_kv_head=1)),
    ("llama-3heads", "llama", dict(n_head=3, n_kv_head=1, d_model=48, n_layer=3)),
]
SHAPE_IDS = [s[0] for s in SHAPES]


def build(family: str, attention: str = "sdpa", seed: int = 0, **kw) -> Transformer:
    torch.manual_seed(seed)
    model = Transformer(make_cfg(family, attention=attention, **kw)).eval()
    if kw.get("bias"):
        # Biases start at zero; make them matter.
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith(".bias"):
                    p.normal_(0.0, 0.02)
    return model


def twin_math(model: Transformer) -> Transformer:
    """The same weights with the written-out attention."""
    cfg = model.cfg
    twin = Transformer(ModelConfig(**{**cfg.__dict__, "attention": "math"})).eval()
    twin.load_state_dict(model.state_dict())
    assert not twin.blocks[0].attn.use_sdpa and model.blocks[0].attn.use_sdpa
    return twin


def tokens(batch: int, length: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("family,kw", [(s[1], s[2]) for s in SHAPES], ids=SHAPE_IDS)
@torch.no_grad()
def test_sdpa_matches_explicit_attention(family, kw):
    model = build(family, **kw)
    ref = twin_math(model)
    idx = tokens(2, CONTEXT)
    out, expected = model(idx), ref(idx)
    assert out.shape == (2, CONTEXT, VOCAB)
    torch.testing.assert_close(out, expected, atol=ATOL, rtol=0)
    # The check has teeth: a different model gives different logits.
    other = build(family, seed=5, **kw)
    assert (other(idx) - expected).abs().max() > 1e-3


@pytest.mark.parametrize("kv_heads", [6, 2])
@torch.no_grad()
def test_explicit_attention_with_a_padding_mask_matches_sdpa(kv_heads):
    """A (B, 1, T, S) mask, as left-padded generation gives: each row's own mask, every head, GQA too."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(3, 6, 10, 8, generator=g)
    k, v = torch.randn(2, 3, kv_heads, 10, 8, generator=g)
    real_keys = torch.arange(10) >= torch.tensor([0, 3, 7])[:, None]  # (B, S): left padding of 0, 3 and 7
    mask = (causal_mask(10, 10, "cpu") & real_keys[:, None, :]) | torch.eye(10, dtype=torch.bool)  # sees itself
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask.unsqueeze(1), enable_gqa=kv_heads != 6)
    torch.testing.assert_close(explicit_attention(q, k, v, mask=mask.unsqueeze(1)), expected, atol=ATOL, rtol=0)


class OutputDtypes(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.dtypes = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.dtypes |= {t.dtype for t in (out if isinstance(out, (tuple, list)) else [out])
                        if isinstance(t, torch.Tensor) and t.dim() == 3}  # the (B·H, T, S) scores and weights
        return out


def test_explicit_attention_under_bf16_autocast_computes_its_weights_in_bf16():
    """The training path of attention dropout on a CPU: scores, softmax and dropout stay bf16, forward and
    backward (an fp32 softmax with its casts took 8× as long), and agree with fp32 attention to bf16 precision."""
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 4, 64, 16, generator=g).bfloat16().requires_grad_() for _ in range(3))
    with OutputDtypes() as ops, torch.autocast("cpu", dtype=torch.bfloat16):
        out = explicit_attention(q, k, v, p=0.0)
        out.sum().backward()
    assert ops.dtypes == {torch.bfloat16}
    expected = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True)
    torch.testing.assert_close(out.float(), expected, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("family,kw", [(s[1], s[2]) for s in SHAPES], ids=SHAPE_IDS)
@torch.no_grad()
def test_a_prefill_for_its_last_position_alone_fills_the_same_cache_with_less_work(family, kw, padded):
    """hidden_states(last_only=True): the last position's output and every layer's keys and values as the whole
    prompt's run gives them (within 1e-5), with a padding mask too; the last block's attention and MLP for one
    position (fewer FLOPs by about their share; red when the block keeps every position)."""
    from torch.utils.flop_counter import FlopCounterMode

    model = build(family, **kw)
    cfg = model.cfg
    seq, T = tokens(2, 12, seed=5), 12
    positions = mask = None
    if padded:  # the first row padded by 3 on the left, as stream_batch pads prompts of different lengths
        pads = torch.tensor([3, 0])
        real = torch.arange(T)[None, :] >= pads[:, None]
        positions = (torch.arange(T)[None, :] - pads[:, None]).clamp(min=0)
        mask = (torch.ones(T, T, dtype=torch.bool).tril()[None] & real[:, None, :]) | torch.eye(T, dtype=torch.bool)
    caches = [model.new_cache(2, T), model.new_cache(2, T)]
    with FlopCounterMode(display=False) as everything:
        full = model.hidden_states(seq, caches[0], positions, mask)
    with FlopCounterMode(display=False) as last:
        alone = model.hidden_states(seq, caches[1], positions, mask, last_only=True)
    assert alone.shape == (2, 1, cfg.d_model)
    torch.testing.assert_close(alone, full[:, -1:], atol=ATOL, rtol=0)
    torch.testing.assert_close(caches[1].k, caches[0].k, atol=ATOL, rtol=0)
    torch.testing.assert_close(caches[1].v, caches[0].v, atol=ATOL, rtol=0)
    assert caches[1].length == T
    # The last block's MLP alone, over the positions it skips, is a lower bound on the saving.
    mlp_flops = 2 * 2 * (T - 1) * cfg.d_model * cfg.ffn_hidden * (2 if family == "gpt2" else 3)
    assert everything.get_total_flops() - last.get_total_flops() >= mlp_flops


@pytest.mark.parametrize("attention", ["sdpa", "math"])
@pytest.mark.parametrize("family,kw", [(s[1], s[2]) for s in SHAPES], ids=SHAPE_IDS)
@torch.no_grad()
def test_kv_cache_greedy_decode_matches_full_recompute(family, kw, attention):
    model = build(family, attention=attention, **kw)
    cfg = model.cfg
    seq = tokens(2, 5)
    cache = model.new_cache(batch_size=2)
    assert cache.k.shape == cache.v.shape == (cfg.n_layer, 2, cfg.n_kv_head, CONTEXT, cfg.head_dim)
    logits = model(seq, cache=cache)  # prefill
    torch.testing.assert_close(logits, model(seq), atol=ATOL, rtol=0)
    assert cache.length == 5
    while seq.size(1) < CONTEXT:
        nxt = logits[:, -1].argmax(-1, keepdim=True)
        seq = torch.cat([seq, nxt], dim=1)
        logits = model(nxt, cache=cache)  # one token at a time
        assert logits.shape == (2, 1, VOCAB)
        torch.testing.assert_close(logits[:, -1], model(seq)[:, -1], atol=ATOL, rtol=0)
    assert cache.length == CONTEXT
    # A full cache refuses another token.
    with pytest.raises(ValueError, match="context length"):
        model(seq[:, -1:], cache=cache)


@pytest.mark.parametrize("attention", ["sdpa", "math"])
@pytest.mark.parametrize("family,kw", [(s[1], s[2]) for s in SHAPES], ids=SHAPE_IDS)
@torch.no_grad()
def test_kv_cache_chunked_prefill(family, kw, attention):
    """Chunks of several tokens after a cached prefix need the causal mask shifted by the prefix."""
    model = build(family, attention=attention, **kw)
    seq = tokens(3, 20, seed=7)
    full = model(seq)
    cache = model.new_cache(batch_size=3, max_len=20)
    assert cache.k.shape[3] == 20
    pieces = [(0, 6), (6, 10), (10, 11), (11, 17), (17, 20)]
    for a, b in pieces:
        out = model(seq[:, a:b], cache=cache)
        torch.testing.assert_close(out, full[:, a:b], atol=ATOL, rtol=0)
    assert cache.length == 20


@pytest.mark.parametrize("attention", ["sdpa", "math"])
@pytest.mark.parametrize("family,kw", [(s[1], s[2]) for s in SHAPES], ids=SHAPE_IDS)
@torch.no_grad()
def test_packed_branches_match_separate_sequences(family, kw, attention):
    """hidden_states with positions and a mask: a prefix and two branches in one row (each branch at the
    positions after the prefix, seeing the prefix and itself) equal the two sequences run alone."""
    model = build(family, attention=attention, **kw)
    prefix, a, b = tokens(2, 7, seed=2), tokens(2, 5, seed=3), tokens(2, 3, seed=4)
    row = torch.cat([prefix, a, b], dim=1)
    positions = torch.cat([torch.arange(12), torch.arange(7, 10)]).expand(2, -1)
    branch = torch.tensor([0] * 7 + [1] * 5 + [2] * 3)
    mask = torch.ones(15, 15, dtype=torch.bool).tril() & ((branch[None, :] == 0) | (branch[None, :] == branch[:, None]))
    logits = model.lm_head(model.hidden_states(row, positions=positions, mask=mask.expand(2, -1, -1)))
    full_a, full_b = model(torch.cat([prefix, a], dim=1)), model(torch.cat([prefix, b], dim=1))
    torch.testing.assert_close(logits[:, :12], full_a, atol=ATOL, rtol=0)
    torch.testing.assert_close(logits[:, 12:], full_b[:, 7:], atol=ATOL, rtol=0)
    # Without the mask, branch b would see branch a: the check has teeth.
    causal_only = torch.ones(2, 15, 15, dtype=torch.bool).tril()
    unmasked = model.lm_head(model.hidden_states(row, positions=positions, mask=causal_only))
    assert (unmasked[:, 12:] - full_b[:, 7:]).abs().max() > 1e-3
    with pytest.raises(ValueError, match="past the context length"):
        model.hidden_states(row, positions=positions + CONTEXT - 11, mask=mask.expand(2, -1, -1))


@pytest.mark.parametrize("family", ["gpt2", "llama"])
@torch.no_grad()
def test_causality(family):
    model = build(family, n_kv_head=2 if family == "llama" else None)
    idx = tokens(2, 24)
    changed = idx.clone()
    changed[:, 15] = (changed[:, 15] + 1) % VOCAB
    a, b = model(idx), model(changed)
    torch.testing.assert_close(a[:, :15], b[:, :15], atol=1e-6, rtol=0)
    assert (a[:, 15:] - b[:, 15:]).abs().amax(dim=-1).min() > 1e-4  # every later position sees the change


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_tied_and_untied_embeddings(family):
    tied = build(family, tie_embeddings=True)
    untied = build(family, tie_embeddings=False)
    assert tied.lm_head.weight is tied.tok_emb.weight
    assert untied.lm_head.weight is not untied.tok_emb.weight
    n_tied = sum(p.numel() for p in tied.parameters())
    n_untied = sum(p.numel() for p in untied.parameters())
    assert n_untied - n_tied == VOCAB * 48
    # Tied weights share storage, so a gradient step on the head moves the embedding too.
    idx = tokens(1, 8)
    tied(idx, targets=idx).backward()
    assert tied.tok_emb.weight.grad is not None and tied.tok_emb.weight.grad.abs().sum() > 0


def test_positional_tables_by_family():
    gpt2, llama = build("gpt2"), build("llama")
    assert gpt2.pos_emb is not None and gpt2.pos_emb.weight.shape == (CONTEXT, 48) and gpt2.rope is None
    assert llama.pos_emb is None and llama.rope is not None
    assert isinstance(gpt2.norm, torch.nn.LayerNorm) and isinstance(llama.norm, torch.nn.RMSNorm)
    assert gpt2.blocks[0].attn.qkv.bias is not None and llama.blocks[0].attn.qkv.bias is None


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_init_scales(family):
    n_layer = 6
    torch.manual_seed(0)
    model = Transformer(ModelConfig(family=family, vocab_size=4096, n_layer=n_layer, d_model=256, n_head=8,
                                    context_length=256))
    residual_std = 0.02 / math.sqrt(2 * n_layer)
    residual = ("attn.proj.weight", "mlp.proj.weight", "mlp.down.weight")
    seen_residual = seen_other = 0
    for name, p in model.named_parameters():
        if p.dim() < 2:
            if name.endswith("bias"):
                assert torch.all(p == 0), name
            else:  # norm gains
                assert torch.all(p == 1), name
            continue
        expected = residual_std if name.endswith(residual) else 0.02
        seen_residual += name.endswith(residual)
        seen_other += not name.endswith(residual)
        assert p.std().item() == pytest.approx(expected, rel=0.03), name
        assert abs(p.mean().item()) < expected / 20, name
    assert seen_residual == 2 * n_layer  # attn.proj and mlp.proj / mlp.down in every block
    # gpt2: tok_emb, pos_emb, then qkv and fc per block; llama: tok_emb, then qkv, gate and up per block.
    assert seen_other == (2 + 2 * n_layer if family == "gpt2" else 1 + 3 * n_layer)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_sequence_longer_than_context_raises(family):
    model = build(family)
    model(tokens(1, CONTEXT))  # exactly the context is fine
    with pytest.raises(ValueError, match=f"{CONTEXT + 1} tokens exceeds the context length {CONTEXT}"):
        model(tokens(1, CONTEXT + 1))
    cache = model.new_cache(1)
    model(tokens(1, CONTEXT - 2), cache=cache)
    with pytest.raises(ValueError, match="exceeds the context length"):
        model(tokens(1, 3), cache=cache)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_loss_is_cross_entropy_ignoring_minus_one(family):
    model = build(family)
    idx, targets = tokens(2, 16, seed=3), tokens(2, 16, seed=4)
    targets[0, :5] = -1
    targets[1, 10:] = -1
    loss = model(idx, targets=targets)
    logits = model(idx)
    assert loss.dim() == 0
    torch.testing.assert_close(loss, F.cross_entropy(logits.view(-1, VOCAB), targets.view(-1), ignore_index=-1))
    # By hand: mean negative log-likelihood over the 21 kept positions only.
    keep = targets != -1
    logp = logits.log_softmax(-1)[keep].gather(-1, targets[keep].unsqueeze(-1))
    assert keep.sum() == 32 - 5 - 6
    torch.testing.assert_close(loss, -logp.mean())
    # An untrained model is close to uniform: loss ≈ ln(V).
    assert loss.item() == pytest.approx(math.log(VOCAB), abs=0.1)
    loss.backward()
    assert model.blocks[0].attn.qkv.weight.grad.abs().sum() > 0


def test_dropout_only_in_training():
    model = build("llama", dropout=0.5)
    idx = tokens(1, 8)
    with torch.no_grad():
        torch.testing.assert_close(model(idx), model(idx))
        model.train()
        assert (model(idx) - model(idx)).abs().max() > 1e-4
