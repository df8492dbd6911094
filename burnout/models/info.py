"""What a model costs before it is built: parameters, FLOPs per token, memory.

The model is instantiated on the meta device with one block, so even llama-3b costs no memory here, and a model
of any depth no time: counts come from the real module tree, the block's counted n_layer times (the blocks are
identical); FLOPs are a formula, stated below. Training memory uses burnout/models/memory.py's
accounting, the one `burnout plan` uses: fp32 weights, gradients and AdamW state derived from the counts,
activations measured by tracing the model on fake tensors.
"""

from __future__ import annotations

import dataclasses

import torch

from burnout.config import ModelConfig
from burnout.models.memory import measure_step, param_counts, static_bytes
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


def matmul_parameters(model: torch.nn.Module) -> int:
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


def model_info(cfg: ModelConfig, batch_size: int = 1, seq_len: int | None = None, precision: str = "bf16",
               measure_memory: bool = False) -> dict:
    """Counts, FLOPs and the derived memory of training (fp32 weights, gradients, AdamW); with
    `measure_memory`, also one eager micro-batch's activations traced at batch_size × seq_len under
    `precision` autocast with CUDA's attention kernels (a second or two for the largest presets)."""
    cfg = cfg.resolved()
    seq_len = seq_len or cfg.context_length
    with torch.device("meta"):
        model = Transformer(dataclasses.replace(cfg, n_layer=1))
    block, more = model.blocks[0], cfg.n_layer - 1
    per_block = sum(p.numel() for p in block.parameters())
    params = {key: n + more * per_block for key, n in count_parameters(model).items()}
    matmul = matmul_parameters(model) + more * matmul_parameters(block)
    memory = static_bytes(param_counts(cfg))
    if measure_memory:
        step = measure_step(cfg, batch_size, seq_len, precision, target="cuda")
        memory.update(activations=step.saved, weight_copies=step.weight_copies, working=step.working)
        memory["total"] = sum(memory.values())
    # Inference keeps the weights in their own dtype, and so the cache.
    memory["kv_cache_per_sequence"] = 2 * cfg.n_layer * cfg.n_kv_head * cfg.head_dim * seq_len * \
        BYTES_PER_ELEMENT[precision]
    return {
        "family": cfg.family,
        **params,
        "params_matmul": matmul,
        "seq_len": seq_len,
        "batch_size": batch_size,
        "precision": precision,
        **flops_per_token(cfg, seq_len, matmul),
        "memory_bytes": memory,
        "config": cfg.__dict__.copy(),
    }


def format_model_info(name: str, info: dict) -> str:
    mem = info["memory_bytes"]
    autocast = "" if info["precision"] == "fp32" else " autocast"
    lines = [
        f"{name} ({info['family']})",
        f"  parameters        {info['params_total']:>16,}",
        f"  non-embedding     {info['params_non_embedding']:>16,}",
        f"  FLOPs/token       {info['flops_per_token']:>16,}  (train, fwd+bwd, seq_len {info['seq_len']};"
        f" attention {info['flops_per_token_attention'] / info['flops_per_token']:.1%})",
        f"  memory to train at batch {info['batch_size']} × {info['seq_len']}, {info['precision']}{autocast}, AdamW:",
        f"    weights         {_gib(mem['weights'])}  fp32 (derived)",
        f"    gradients       {_gib(mem['gradients'])}  fp32 (derived)",
        f"    AdamW state     {_gib(mem['optimizer'])}  2 × fp32 (derived)",
    ]
    if "total" in mem:
        lines += [
            f"    activations     {_gib(mem['activations'])}  kept for backward (measured, eager, CUDA kernels)",
            f"    weight copies   {_gib(mem['weight_copies'])}  autocast's casts kept for backward (measured)",
            f"    backward work   {_gib(mem['working'])}  above what forward keeps (measured)",
            f"    total           {_gib(mem['total'])}  before the CUDA context and allocator slack: "
            "`burnout plan` adds them, compiled and checkpointed variants and a GPU's verdict",
        ]
    lines.append(f"  KV cache/seq      {_gib(mem['kv_cache_per_sequence'])}  (inference, {info['precision']})")
    return "\n".join(lines)


def _gib(n: int) -> str:
    return f"{n / 2**30:>10.3f} GiB"
