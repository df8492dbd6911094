"""Encoding documents (burnout/data/encoder.py): a long document is encoded in pieces, a batch at a time, to the
ids its tokenizer gives it whole."""

from __future__ import annotations

import numpy as np
import pytest
from tokenizers import pre_tokenizers

from burnout.config import TokenizerConfig
from burnout.data import encoder as encoder_module
from burnout.data import tokenizer as tokenizer_module
from burnout.data.encoder import Encoder, encode_documents
from burnout.data.tokenizer import cuts_exactly, gpt2_tokenizer, train_tokenizer

# Where a cut in the wrong place changes the pre-tokens: runs of spaces (GPT-2's regex gives all but the last space
# of a run a token of their own), line breaks and tabs beside spaces, a non-breaking and an ideographic space,
# contractions, digits, the end-of-text token written out, CRLF.
LONG = "".join(f"word{i}   and{i % 7 * ' '}\n\n{i}'s  \t x\u00a0y\u3000z it's 12 345 <|endoftext|> a\r\nb "
               for i in range(2000))


@pytest.fixture(scope="module")
def tokenizers(shared_data):
    files = shared_data / "gpt2_tokenizer"
    return {"bpe": train_tokenizer([LONG], TokenizerConfig(kind="bpe", vocab_size=600)),
            "char": train_tokenizer([LONG], TokenizerConfig(kind="char")),
            "gpt2": gpt2_tokenizer(files / "vocab.json", files / "merges.txt")}


def whole_ids(tok, text: str) -> np.ndarray:
    return np.asarray(tok.encode(text, add_special_tokens=False).ids, dtype=np.uint32)


@pytest.mark.parametrize("kind", ["bpe", "char", "gpt2"])
def test_a_long_document_encodes_in_pieces_to_the_ids_of_the_whole(tokenizers, kind, monkeypatch):
    tok = tokenizers[kind]
    monkeypatch.setattr(tokenizer_module, "PIECE_CHARS", 100)
    monkeypatch.setattr(encoder_module, "BATCH_CHARS", 1_000)
    docs = [LONG, "words", "", LONG[:5_000], " " * 300 + "x"]
    assert cuts_exactly(tok)
    encoded = encode_documents(tok, docs)
    assert len(encoded) == len(docs)
    for doc, ids in zip(docs, encoded):
        assert ids.dtype == np.uint32 and np.array_equal(ids, whole_ids(tok, doc))
    with Encoder(tok, 2) as background:  # the thread pool's path, with each document's characters
        assert [(ids.tolist(), chars, dropped) for ids, chars, dropped in background.submit(docs).result()] == \
            [(whole_ids(tok, doc).tolist(), len(doc), {}) for doc in docs]


def test_a_tokenizer_whose_pieces_would_differ_encodes_each_document_whole(tokenizers, monkeypatch):
    """With a space added before every pre-token, a piece's first word would gain one: such a tokenizer is not
    cut, and its ids are still the whole document's."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(tokenizers["bpe"].to_str())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    monkeypatch.setattr(tokenizer_module, "PIECE_CHARS", 100)
    assert not cuts_exactly(tok)
    assert np.array_equal(encode_documents(tok, [LONG])[0], whole_ids(tok, LONG))
