"""Tokenizers: byte-level BPE and character-level, both plain HF `tokenizers.Tokenizer` objects.

Both kinds are saved as a single tokenizer.json, which the HF ecosystem loads as is. Neither kind has
a normalizer, so decoding the ids of a text gives back exactly that text.

A long text is trained on and encoded in pieces (`pieces`), since a tokenizer's pre-tokenization of a text holds
many bytes per character (docs/PERFORMANCE.md): a document of any length then costs the memory of one piece, and
the pieces give the merges and the ids that the whole text would.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

from burnout.common import EOT_TOKEN, first_line, tokenizer_file
from burnout.config import TokenizerConfig
from burnout.errors import BurnoutError

BYTE_ALPHABET_SIZE = 256
# The char kind's pre-tokenizer: every character a pre-token of its own ([\s\S] rather than "." so newlines too).
CHAR_PATTERN = r"[\s\S]"
# Characters of a text pre-tokenized at once: a piece (see `pieces`).
PIECE_CHARS = 65_536
# Where `pieces` may cut: a space or line break after a character that is not whitespace.
_CUT = re.compile(r"(?<=\S)[ \n]")


def train_tokenizer(texts: Iterable[str], cfg: TokenizerConfig) -> Tokenizer:
    """A new tokenizer of kind `cfg.kind` fitted to `texts`.

    `bpe` learns merges up to cfg.vocab_size tokens (fewer if the texts run out of pairs seen
    cfg.min_frequency times). `char` has one token per distinct character in `texts`, so its vocabulary
    size follows from the data and cfg.vocab_size is not used.
    """
    cfg.validate()
    if cfg.kind == "bpe":
        return _train_bpe(texts, cfg)
    if cfg.kind == "char":
        return _train_char(texts, cfg)
    if cfg.kind == "gpt2":
        return gpt2_tokenizer(cfg.vocab_path, cfg.merges_path, cfg.special_tokens)
    raise BurnoutError(f"tokenizer.kind: unknown kind '{cfg.kind}'; use bpe, char or gpt2")


def build_tokenizer(cfg: TokenizerConfig, texts: Iterable[str] | None = None) -> Tokenizer:
    """The tokenizer `cfg` describes: read from files for gpt2, otherwise trained on `texts`."""
    cfg.validate()
    if cfg.kind == "gpt2":
        return gpt2_tokenizer(cfg.vocab_path, cfg.merges_path, cfg.special_tokens)
    return train_tokenizer(texts if texts is not None else [], cfg)


def gpt2_tokenizer(vocab_path: str | Path, merges_path: str | Path,
                   special_tokens: Iterable[str] = (EOT_TOKEN,)) -> Tokenizer:
    """GPT-2's byte-level BPE, offline, from its vocab.json (encoder.json) and merges.txt (vocab.bpe).

    Same ids as tiktoken's "gpt2" encoding: "Hello world" -> [15496, 995], <|endoftext|> = 50256.
    Special tokens missing from the vocabulary are appended after it.
    """
    for key, path in (("vocab_path", vocab_path), ("merges_path", merges_path)):
        if not path or not Path(path).is_file():
            raise BurnoutError(f"tokenizer.{key}: file '{path}' does not exist; "
                               f"give the path of GPT-2's {Path(str(path)).name or key}")
    try:
        model = models.BPE.from_file(str(vocab_path), str(merges_path))
    except Exception as exc:  # the Rust side raises a bare Exception for any parse failure
        raise BurnoutError(
            f"tokenizer: cannot read GPT-2 BPE from '{vocab_path}' + '{merges_path}' ({first_line(exc)})"
        ) from None
    tok = Tokenizer(model)
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(special_tokens))
    return tok


def _train_bpe(texts: Iterable[str], cfg: TokenizerConfig) -> Tokenizer:
    smallest = BYTE_ALPHABET_SIZE + len(cfg.special_tokens)
    if cfg.vocab_size < smallest:
        raise BurnoutError(
            f"tokenizer.vocab_size: {cfg.vocab_size} is too small for byte-level BPE, which needs the "
            f"{BYTE_ALPHABET_SIZE} byte symbols plus {len(cfg.special_tokens)} special tokens; use at least {smallest}"
        )
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=cfg.vocab_size,
        min_frequency=cfg.min_frequency,
        special_tokens=list(cfg.special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # Each text in pieces: the trainer counts the same pre-tokens, so it learns the same merges.
    remaining = (piece for text in texts for piece in pieces(text))
    first = next((piece for piece in remaining if piece), None)
    if first is None:
        raise BurnoutError("tokenizer: no text to train on; check that the data sources contain documents")
    tok.train_from_iterator(itertools.chain([first], remaining), trainer=trainer)
    # The trainer reserves the special tokens' ids; registering them as added tokens makes the
    # encoder match them in raw text as one id instead of splitting them into bytes.
    tok.add_special_tokens(list(cfg.special_tokens))
    return tok


def _train_char(texts: Iterable[str], cfg: TokenizerConfig) -> Tokenizer:
    chars: set[str] = set()
    for text in texts:
        chars.update(text)
    if not chars:
        raise BurnoutError("tokenizer: no text to train on; check that the data sources contain documents")
    vocab = {token: i for i, token in enumerate(cfg.special_tokens)}
    for char in sorted(chars - vocab.keys()):
        vocab[char] = len(vocab)
    # No unk token: every character of the training text has an id, and an unseen character is an
    # error at encode time rather than a silent, lossy <unk>.
    tok = Tokenizer(models.WordLevel(vocab, unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(CHAR_PATTERN), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens(list(cfg.special_tokens))
    return tok


def pieces(text: str) -> Iterator[str]:
    """`text` in consecutive pieces of at most PIECE_CHARS characters (a longer stretch without a place to cut is
    one piece), each cut just before a space or line break that follows a character other than whitespace.

    Byte-level BPE's pre-tokenizer (GPT-2's regex) never puts whitespace after another character into one
    pre-token, and looks ahead only past whitespace, so a text's pre-tokens are those of its pieces, one after the
    other; BPE merges within a pre-token, so the pieces' ids are the text's (`cuts_exactly`: for which tokenizers).
    """
    start = 0
    while len(text) - start > PIECE_CHARS:
        cut = _last_cut(text, start, start + PIECE_CHARS)
        if cut is None:
            found = _CUT.search(text, start + PIECE_CHARS)
            if found is None:
                break
            cut = found.start()
        yield text[start:cut]
        start = cut
    yield text[start:]


def _last_cut(text: str, start: int, end: int) -> int | None:
    """The last place in (start, end] where `pieces` may cut, or None."""
    for mark in " \n":
        at = end + 1
        while (at := text.rfind(mark, start + 1, at)) > 0:
            if not text[at - 1].isspace():
                return at
    return None


def cuts_exactly(tok: Tokenizer) -> bool:
    """Whether `tok` encodes the pieces of a text (`pieces`) to the ids of the whole: byte-level BPE's
    pre-tokenizer (the bpe and gpt2 kinds) or one pre-token per character (char), no normalizer, and no added
    token that holds whitespace or takes the whitespace after it (rstrip), either of which could reach across a
    cut. Another tokenizer (one given in a file) encodes each document whole."""
    if tok.normalizer is not None or tok.pre_tokenizer is None:
        return False
    pre = json.loads(tok.pre_tokenizer.__getstate__())
    byte_level = pre.get("type") == "ByteLevel" and pre.get("use_regex") and not pre.get("add_prefix_space")
    per_char = pre == {"type": "Split", "pattern": {"Regex": CHAR_PATTERN}, "behavior": "Isolated", "invert": False}
    added = tok.get_added_tokens_decoder().values()
    return bool(byte_level or per_char) and not any(t.rstrip or any(c.isspace() for c in t.content) for t in added)


def load_tokenizer(path: str | Path) -> Tokenizer:
    """The tokenizer saved at `path` (a tokenizer.json, or a folder holding one)."""
    path = tokenizer_file(path)
    try:
        return Tokenizer.from_file(str(path))
    except Exception as exc:  # the Rust side raises a bare Exception for any parse failure
        raise BurnoutError(f"tokenizer file '{path}' is not a valid tokenizer.json ({first_line(exc)})") from None


def tokenizer_sha256(tok: Tokenizer) -> str:
    return hashlib.sha256(tok.to_str().encode("utf-8")).hexdigest()


def eot_id(tok: Tokenizer) -> int:
    token_id = tok.token_to_id(EOT_TOKEN)
    if token_id is None:
        raise BurnoutError(f"the tokenizer has no '{EOT_TOKEN}' token; "
                           f"retrain it with '{EOT_TOKEN}' in tokenizer.special_tokens")
    return token_id


def tokenizer_kind(tok: Tokenizer) -> str:
    """'bpe' or 'char' for tokenizers made here; the model's class name, lowercased, otherwise."""
    if isinstance(tok.model, models.BPE):
        return "bpe"
    if isinstance(tok.model, models.WordLevel):
        return "char"
    return type(tok.model).__name__.lower()
