"""Data stage: sources, cleaning, tokenizers, the encoder pool, the shard format and batch loading.

Import-free on purpose: importing a submodule imports this package first, so `burnout.data.shards`
(what training and evaluation read data with) stays free of preparation's tokenizers and tqdm, and
preparation stays free of the loader's torch (a heavy import: docs/PERFORMANCE.md).
"""
