"""Model zoo: one decoder-only transformer, two families (gpt2, llama), presets in burnout/configs/models."""

from burnout.models.transformer import KVCache, Transformer

__all__ = ["KVCache", "Transformer"]
