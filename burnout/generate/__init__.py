"""Generation stage: sampling with a KV cache, and chat."""
