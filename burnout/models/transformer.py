"""The decoder-only transformer behind every GPUburnout model.

Two families share one set of layers and differ only in the pieces they pick:

    gpt2   learned positions · LayerNorm · GELU MLP   · multi-head attention · biases
    llama  RoPE              · RMSNorm   · SwiGLU MLP · grouped-query attention · no biases

Shapes: B batch, T time (tokens), C = d_model, H query heads, K key/value heads, D head dim, V vocab.
Parameter names map one-to-one onto Hugging Face's GPT2LMHeadModel / LlamaForCausalLM
(see burnout/models/hf.py); the query/key/value projections are fused into one matrix here.

On a CPU a few ops take faster routes with the same results (burnout/models/cpu_paths.py): read
`linear(layer, x)` as `layer(x)`, `gelu_tanh` as GPT-2's tanh GELU, and `explicit_is_faster` as the choice
between SDPA's kernel and the written-out attention, which compute the same attention.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from burnout.config import ModelConfig
from burnout.models.cpu_paths import explicit_is_faster, gelu_tanh, linear
from burnout.models.dropout import Dropout, dropout
from burnout.models.size import addressable


class RotaryEmbedding(nn.Module):
    """Rotary position embedding in the "rotate half" layout that Hugging Face's LLaMA uses."""

    def __init__(self, head_dim: int, max_len: int, theta: float):
        super().__init__()
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
        angles = torch.outer(torch.arange(max_len, dtype=torch.float32), inv_freq)  # (max_len, D/2)
        angles = torch.cat((angles, angles), dim=-1)  # (max_len, D)
        # Not persistent: derived from the config, so checkpoints carry only learned weights.
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, x: torch.Tensor, start: int, positions: torch.Tensor | None = None) -> torch.Tensor:
        """x (B, heads, T, D) at positions start.. start+T-1, or at `positions` (B, T) when given."""
        if positions is None:
            T = x.size(-2)
            cos, sin = self.cos[start : start + T], self.sin[start : start + T]
        else:
            cos, sin = self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)  # (B, 1, T, D)
        cos, sin = cos.to(x.dtype), sin.to(x.dtype)
        x1, x2 = x.chunk(2, dim=-1)
        return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class KVCache:
    """Keys and values of past tokens, preallocated per layer. Sized by K (not H), so GQA shrinks it."""

    def __init__(self, cfg: ModelConfig, batch_size: int, max_len: int, device, dtype):
        shape = (cfg.n_layer, batch_size, cfg.n_kv_head, max_len, cfg.head_dim)
        # Not zeroed: update returns the written slots alone, and zeroing is a noticeable share of a CPU prefill.
        self.k = torch.empty(shape, device=device, dtype=dtype)
        self.v = torch.empty(shape, device=device, dtype=dtype)
        self.length = 0  # tokens already stored

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        end = self.length + k.size(2)
        self.k[layer, :, :, self.length : end] = k
        self.v[layer, :, :, self.length : end] = v
        return self.k[layer, :, :, :end], self.v[layer, :, :, :end]


def causal_mask(n_query: int, n_key: int, device) -> torch.Tensor:
    """(n_query, n_key) boolean mask: query i (the last n_query positions) sees keys 0..its position."""
    offset = n_key - n_query
    return torch.ones(n_query, n_key, dtype=torch.bool, device=device).tril(diagonal=offset)


def packed_mask(positions: torch.Tensor) -> torch.Tensor:
    """(B, T) positions of sequences packed into rows, restarting at 0 with each → (B, T, T) mask, True where
    query t may attend to key s: s ≤ t, in t's own sequence."""
    sequence = (positions == 0).cumsum(dim=1)  # (B, T): which sequence of its row each token is in
    T = positions.size(1)
    return causal_mask(T, T, positions.device) & (sequence[:, :, None] == sequence[:, None, :])


def explicit_attention(q, k, v, p: float = 0.0, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Attention written out in full: the reference that the fused SDPA kernels are checked against.
    `mask` (True = may attend) replaces the causal mask when given."""
    B, H, T, D = q.shape
    K, S = k.size(1), k.size(2)
    k = k.repeat_interleave(H // K, dim=1)  # (B, H, S, D)
    v = v.repeat_interleave(H // K, dim=1)
    # One GEMM scales the scores and adds the mask as a bias, and the softmax runs in the scores' dtype (its
    # kernel accumulates in fp32): under bf16 autocast on a CPU, an fp32 softmax with its two casts and a
    # masked_fill of the scores cost several times as much.
    if mask is None:
        mask = causal_mask(T, S, q.device)
    bias = torch.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill_(~mask, float("-inf"))
    if bias.dim() == 4:  # (B, 1, T, S); the causal (T, S) one broadcasts without a copy
        bias = bias.expand(B, H, T, S).reshape(B * H, T, S)
    scores = torch.baddbmm(bias, q.reshape(B * H, T, D),
                           k.reshape(B * H, S, D).transpose(1, 2), alpha=1 / math.sqrt(D))  # (B·H, T, S)
    weights = dropout(scores.softmax(dim=-1), p)
    return (weights @ v.reshape(B * H, S, D)).view(B, H, T, D)


class Attention(nn.Module):
    """Causal self-attention: H query heads over K key/value heads (K = H in gpt2; K < H is llama's GQA)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_head, self.n_kv_head, self.head_dim = cfg.n_head, cfg.n_kv_head, cfg.head_dim
        self.qkv = nn.Linear(cfg.d_model, (cfg.n_head + 2 * cfg.n_kv_head) * cfg.head_dim, bias=cfg.bias)
        self.proj = nn.Linear(cfg.n_head * cfg.head_dim, cfg.d_model, bias=cfg.bias)
        self.dropout = cfg.dropout
        self.use_sdpa = cfg.attention == "sdpa"
        # Whether a CPU step may take the written-out attention where it is faster (explicit_is_faster); the
        # memory planner's trace of a CUDA step, which runs on CPU tensors, turns it off.
        self.explicit_on_cpu = True

    def forward(self, x, rope: RotaryEmbedding | None, cache: KVCache | None, layer: int,
                positions: torch.Tensor | None = None, mask: torch.Tensor | None = None,
                last_only: bool = False) -> torch.Tensor:
        """x (B, T, C) → (B, T, C); with last_only, keys and values for all T positions but the output for the
        last one alone (B, 1, C)."""
        B, T, _ = x.shape
        H, K, D = self.n_head, self.n_kv_head, self.head_dim
        q, k, v = linear(self.qkv, x).split([H * D, K * D, K * D], dim=-1)
        q = q.view(B, T, H, D).transpose(1, 2)  # (B, H, T, D)
        k = k.view(B, T, K, D).transpose(1, 2)  # (B, K, T, D)
        v = v.view(B, T, K, D).transpose(1, 2)  # (B, K, T, D)
        start = cache.length if cache is not None else 0
        if rope is not None:
            q, k = rope(q, start, positions), rope(k, start, positions)
        if cache is not None:
            k, v = cache.update(layer, k, v)  # (B, K, start + T, D)
        if last_only:
            q, T = q[:, :, -1:], 1  # (B, H, 1, D)
            mask = mask[:, -1:] if mask is not None else None
        p = self.dropout if self.training else 0.0
        if mask is not None:
            mask = mask.unsqueeze(1)  # (B, 1, T, keys): the same for every head
        if self.use_sdpa and not (self.explicit_on_cpu and explicit_is_faster(x, k.size(2), p)):
            # A given mask replaces the causal one. Queries that start at the first key take the kernel's own
            # causal mask. Past them, a lone query sees every key (no mask), and several need the mask shifted.
            first_key = k.size(2) - T
            if mask is None and first_key > 0 and T > 1:
                mask = causal_mask(T, k.size(2), x.device)
            y = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, is_causal=mask is None and first_key == 0 and T > 1, dropout_p=p,
                enable_gqa=K != H,
            )
        else:
            y = explicit_attention(q, k, v, p, mask)
        y = y.transpose(1, 2).reshape(B, T, H * D)  # (B, T, C)
        return linear(self.proj, y)


class MLP(nn.Module):
    """GPT-2's feed-forward block: d → ffn → d with a tanh-approximated GELU."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.fc = nn.Linear(cfg.d_model, cfg.ffn_hidden, bias=cfg.bias)
        self.proj = nn.Linear(cfg.ffn_hidden, cfg.d_model, bias=cfg.bias)

    def forward(self, x):
        """x (B, T, C) → (B, T, C), through (B, T, ffn_hidden)."""
        return linear(self.proj, gelu_tanh(linear(self.fc, x)))


class SwiGLU(nn.Module):
    """LLaMA's gated feed-forward block: down(silu(gate(x)) * up(x))."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate = nn.Linear(cfg.d_model, cfg.ffn_hidden, bias=cfg.bias)
        self.up = nn.Linear(cfg.d_model, cfg.ffn_hidden, bias=cfg.bias)
        self.down = nn.Linear(cfg.ffn_hidden, cfg.d_model, bias=cfg.bias)

    def forward(self, x):
        """x (B, T, C) → (B, T, C), through (B, T, ffn_hidden)."""
        return linear(self.down, F.silu(linear(self.gate, x)) * linear(self.up, x))


def make_norm(cfg: ModelConfig) -> nn.Module:
    if cfg.family == "gpt2":
        return nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps, bias=cfg.bias)
    return nn.RMSNorm(cfg.d_model, eps=cfg.norm_eps)


class Block(nn.Module):
    """Pre-norm residual block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.norm_attn = make_norm(cfg)
        self.attn = Attention(cfg)
        self.norm_mlp = make_norm(cfg)
        self.mlp = MLP(cfg) if cfg.family == "gpt2" else SwiGLU(cfg)
        self.dropout = Dropout(cfg.dropout)

    def forward(self, x, rope, cache, layer, positions=None, mask=None, last_only=False):
        """x (B, T, C) → (B, T, C), or (B, 1, C) with last_only (see Attention.forward)."""
        attended = self.attn(self.norm_attn(x), rope, cache, layer, positions, mask, last_only)
        x = (x[:, -1:] if last_only else x) + self.dropout(attended)
        return x + self.dropout(self.mlp(self.norm_mlp(x)))


# A chunk being worked on holds about three buffers the size of its logits (forward: the matmul's bf16
# output, its fp32 copy, log-softmax's output; backward: those gradients). 256 MiB of fp32 logits per
# chunk bounds the loss's memory whatever the batch, where the full logits grow with it; and 2,048 rows at
# a 32k vocab still make a GEMM big enough to run at full speed. Rows come in multiples of 128, a GEMM tile.
LOSS_CHUNK_BYTES = 256 * 2**20
LOSS_CHUNK_ALIGN = 128


def loss_chunk_rows(vocab_size: int) -> int:
    """Rows of hidden states whose logits the loss computes at once (2048 at a 32,005-token vocab)."""
    rows = LOSS_CHUNK_BYTES // (4 * vocab_size)
    return max(LOSS_CHUNK_ALIGN, rows // LOSS_CHUNK_ALIGN * LOSS_CHUNK_ALIGN)


def chunked_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                          chunk_rows: int) -> torch.Tensor:
    """Mean cross-entropy of the logits hidden @ weightᵀ against targets (-1 ignored), without the logits.

    hidden (N, C), weight (V, C), targets (N,). Each chunk of `chunk_rows` rows is checkpointed: autograd
    keeps only its inputs and backward recomputes its logits, so neither the full logits nor their fp32
    copy ever exist. A checkpoint rather than a hand-written autograd.Function: torch.compile's
    partitioner merges a Function's recomputed matmul with the forward's (CSE) and then keeps every
    chunk's logits for backward, while a checkpoint's tags make it recompute them.
    """
    if hidden.size(0) <= chunk_rows and not torch.compiler.is_compiling():
        # One chunk: keeping its logits for backward peaks no higher than recomputing them there (every
        # activation is still alive when the loss's backward runs) and saves a second head GEMM and log-softmax.
        # Compiled, only the memory planner's stand-in gets here (models/memory.py: chunked_loss), and it keeps the
        # checkpoint.
        return _chunk_loss_sum(hidden, weight, targets) / (targets != -1).sum()
    total = torch.zeros((), device=hidden.device)
    for start in range(0, hidden.size(0), chunk_rows):
        rows = slice(start, start + chunk_rows)
        # No RNG state to save: nothing random happens in a chunk.
        total = total + checkpoint(_chunk_loss_sum, hidden[rows], weight, targets[rows], use_reentrant=False,
                                   preserve_rng_state=False)
    return total / (targets != -1).sum()


def _chunk_loss_sum(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    # Autocast runs the matmul in bf16/fp16 and the cross-entropy in fp32, upcasting one chunk's logits.
    # NOTE: `weight.t()`, not F.linear(hidden, weight): autocast casts a view afresh in each chunk, while
    # it would cast the weight itself once and share that copy, whose gradient would then be summed over
    # the chunks in bf16; cast per chunk, each chunk's comes back in fp32 and they add up in fp32.
    logits = hidden @ weight.t()
    return F.cross_entropy(logits, targets, ignore_index=-1, reduction="sum")


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        cfg = cfg.resolved()
        addressable(cfg)  # a shape no machine can hold: refused in one line, on any device (meta too)
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.context_length, cfg.d_model) if cfg.family == "gpt2" else None
        self.rope = (
            RotaryEmbedding(cfg.head_dim, cfg.context_length, cfg.rope_theta) if cfg.family == "llama" else None
        )
        self.dropout = Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.norm = make_norm(cfg)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.tok_emb.weight
        self.apply(self._init_weights)
        # GPT-2 init: residual projections scaled by 1/sqrt(2·n_layer) so the residual stream's
        # variance does not grow with depth.
        residual_std = 0.02 / math.sqrt(2 * cfg.n_layer)
        for name, param in self.named_parameters():
            if name.endswith(("attn.proj.weight", "mlp.proj.weight", "mlp.down.weight")):
                nn.init.normal_(param, mean=0.0, std=residual_std)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None, cache: KVCache | None = None,
                positions: torch.Tensor | None = None):
        """idx (B, T) token ids → logits (B, T, V); with targets (B, T) → mean cross-entropy loss.

        Targets equal to -1 are ignored. With a cache, idx continues the cached tokens. With positions (B, T),
        each row holds several sequences packed end to end, each one's positions restarting at 0: each attends
        only to itself (packed_mask).
        """
        mask = packed_mask(positions) if positions is not None else None
        hidden = self.hidden_states(idx, cache, positions, mask)  # (B, T, C)
        if targets is None:
            return self.lm_head(hidden)  # (B, T, V)
        return self.head_loss(hidden.flatten(0, 1), targets.reshape(-1))  # (B·T, C), (B·T,)

    def head_loss(self, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The mean cross-entropy of the head's logits of `hidden` (N, C) against `targets` (N,), -1 ignored: in
        chunks (chunked_cross_entropy), the whole logits never held at once."""
        weight = self.lm_head.weight
        if torch.compiler.is_compiling():
            # Compiled, the whole logits cost no more memory than the chunks (inductor fuses the upcast and
            # the log-softmax into the loss) and skip the chunks' recomputed head GEMM.
            return F.cross_entropy(hidden @ weight.t(), targets, ignore_index=-1)
        return chunked_cross_entropy(hidden, weight, targets, loss_chunk_rows(weight.size(0)))

    def hidden_states(
        self,
        idx: torch.Tensor,
        cache: KVCache | None = None,
        positions: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
        last_only: bool = False,
    ) -> torch.Tensor:
        """idx (B, T) → the final norm's output (B, T, C), which lm_head maps to logits.

        Callers that need logits at a few positions apply lm_head to those rows only. `positions` (B, T)
        and `mask` (B, T, T), True where query t may attend to key s, replace the default 0..T-1 and
        causal mask (no cache): several sequences can then share one row, e.g. continuations that each
        see a common prefix but not each other.

        last_only: the output at the last position alone (B, 1, C), as a prompt's prefill needs. Every layer but
        the last still runs all T positions (the next one's keys and values need them), and the last one its keys
        and values (the cache's); its queries, attention and MLP run for one position.
        """
        B, T = idx.shape
        start = cache.length if cache is not None else 0
        if positions is None and start + T > self.cfg.context_length:
            raise ValueError(f"sequence of {start + T} tokens exceeds the context length {self.cfg.context_length}")
        if positions is not None and int(positions.max()) >= self.cfg.context_length:
            raise ValueError(f"position {int(positions.max())} is past the context length {self.cfg.context_length}")
        x = self.tok_emb(idx)  # (B, T, C)
        if self.pos_emb is not None:
            x = x + self.pos_emb(torch.arange(start, start + T, device=idx.device) if positions is None else positions)
        x = self.dropout(x)
        for layer, block in enumerate(self.blocks):
            x = block(x, self.rope, cache, layer, positions, mask, last_only and layer == len(self.blocks) - 1)
        if cache is not None:
            # NOTE: advance only after every layer has written its keys and values at `start`.
            cache.length += T
        return self.norm(x)

    def new_cache(self, batch_size: int, max_len: int | None = None) -> KVCache:
        param = self.tok_emb.weight
        return KVCache(self.cfg, batch_size, max_len or self.cfg.context_length, param.device, param.dtype)


def unwrapped(model):
    """The module inside torch.compile's and DDP's wrappers (told by their attributes, so no wrapper's class need
    be imported), whose parameter names carry no `_orig_mod.` or `module.` prefix."""
    while True:
        inner = getattr(model, "_orig_mod", None)
        if inner is None and type(model).__name__ == "DistributedDataParallel":
            inner = model.module
        if inner is None:
            return model
        model = inner
