"""What a model costs before it is built: parameters, FLOPs per token, memory.

The model is instantiated on the meta device, so even llama-3b costs no memory here. Counts come
from the real module tree; FLOPs and activation memory are formulas, stated below, not measurements.
"""

from __future__ import annotations

import torch

from burnout.config import ModelConfig
from burnout.models.transformer import Transformer

BYTES_PER_ELEMENT = {"fp32": 4, "bf16": 2, "fp16": 2}


def count_parameters(model: Transformer) -> dict[str, int]:
    """Total parameters (a tied matrix counted once) and non-embedding parameters.

    Non-embedding excludes the token and position lookup tables; an untied output head stays in,
    since it is a matrix multiply like any other layer.
    """
    total = sum(p.numel() for p in model.parameters())
    embedding = model.tok_emb.weight.numel()
    if model.pos_emb is not None:
        embedding += model.pos_emb.weight.numel()
    return {"params_total": total, "params_non_embedding": total - embedding}


def matmul_parameters(model: Transformer) -> int:
    """Weights that take part in a matrix multiply per token: every Linear, the output head included."""
    return sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))


def flops_per_token(cfg: ModelConfig, seq_len: int, matmul_params: int) -> dict[str, int]:
    """Training FLOPs per token, forward + backward (backward = 2× forward).

    Dense layers: 2 FLOPs per weight per token forward → 6·N_matmul for training.
    Attention scores and weighted sum: 2·2·T·(H·D) per token per layer forward → 12·L·T·H·D for
    training, counted over the full T×T square (the causal half is not subtracted, as in the
    PaLM/nanoGPT convention that MFU figures are usually quoted in).
    """
    dense = 6 * matmul_params
    attention = 12 * cfg.n_layer * seq_len * cfg.n_head * cfg.head_dim
    return {"flops_per_token": dense + attention, "flops_per_token_dense": dense,
            "flops_per_token_attention": attention, "forward_flops_per_token": (dense + attention) // 3}


def activation_bytes(cfg: ModelConfig, batch_size: int, seq_len: int, precision: str) -> int:
    """Estimate of the tensors autograd keeps for backward, with a flash-style attention kernel.

    Per layer and token: the two norms' inputs and outputs (4·C), q/k/v before and q/k after RoPE,
    the attention output (C), the MLP's hidden tensors (2·F for GELU, 4·F for SwiGLU); then the final
    norm and the logits kept in fp32 for the loss. Dropout masks and allocator slack are not counted.
    """
    C, D, H, K, F = cfg.d_model, cfg.head_dim, cfg.n_head, cfg.n_kv_head, cfg.ffn_hidden
    per_layer = 4 * C + (H + 2 * K) * D + (H + K) * D + C + (2 * F if cfg.family == "gpt2" else 4 * F)
    tokens = batch_size * seq_len
    bytes_ = BYTES_PER_ELEMENT[precision]
    return tokens * (cfg.n_layer * per_layer * bytes_ + 2 * C * bytes_ + cfg.vocab_size * (bytes_ + 4))


def model_info(cfg: ModelConfig, batch_size: int = 1, seq_len: int | None = None, precision: str = "bf16") -> dict:
    cfg = cfg.resolved()
    seq_len = seq_len or cfg.context_length
    with torch.device("meta"):
        model = Transformer(cfg)
    params = count_parameters(model)
    matmul = matmul_parameters(model)
    weight_bytes = params["params_total"] * BYTES_PER_ELEMENT[precision]
    # AdamW keeps fp32 master weights' gradients plus two fp32 moments per parameter.
    grad_and_adam_bytes = params["params_total"] * 4 * 3
    return {
        "family": cfg.family,
        **params,
        "params_matmul": matmul,
        "seq_len": seq_len,
        "batch_size": batch_size,
        "precision": precision,
        **flops_per_token(cfg, seq_len, matmul),
        "memory_bytes": {
            "weights": weight_bytes,
            "grads_and_adamw_state": grad_and_adam_bytes,
            "activations_estimate": activation_bytes(cfg, batch_size, seq_len, precision),
            "kv_cache_per_sequence": 2 * cfg.n_layer * cfg.n_kv_head * cfg.head_dim * seq_len
            * BYTES_PER_ELEMENT[precision],
        },
        "config": cfg.__dict__.copy(),
    }


def format_model_info(name: str, info: dict) -> str:
    mem = info["memory_bytes"]
    lines = [
        f"{name} ({info['family']})",
        f"  parameters        {info['params_total']:>16,}",
        f"  non-embedding     {info['params_non_embedding']:>16,}",
        f"  FLOPs/token       {info['flops_per_token']:>16,}  (train, fwd+bwd, seq_len {info['seq_len']};"
        f" attention {info['flops_per_token_attention'] / info['flops_per_token']:.1%})",
        f"  memory at batch {info['batch_size']} × {info['seq_len']}, {info['precision']}:",
        f"    weights         {_gib(mem['weights'])}",
        f"    grads + AdamW   {_gib(mem['grads_and_adamw_state'])}  (fp32)",
        f"    activations     {_gib(mem['activations_estimate'])}  (estimate, flash attention)",
        f"    KV cache/seq    {_gib(mem['kv_cache_per_sequence'])}",
    ]
    return "\n".join(lines)


def _gib(n: int) -> str:
    return f"{n / 2**30:>10.3f} GiB"
