"""Data stage: corpus mixing, tokenizers, token files and batch loading."""

from burnout.data.corpus import iter_documents, mix_documents
from burnout.data.loader import TokenLoader, check_compatible
from burnout.data.prepare import prepare_data, read_meta
from burnout.data.tokenizer import eot_id, load_tokenizer, tokenizer_sha256, train_tokenizer

__all__ = [
    "TokenLoader",
    "check_compatible",
    "eot_id",
    "iter_documents",
    "load_tokenizer",
    "mix_documents",
    "prepare_data",
    "read_meta",
    "tokenizer_sha256",
    "train_tokenizer",
]
