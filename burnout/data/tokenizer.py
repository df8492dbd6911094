"""Tokenizers: byte-level BPE and character-level, both plain HF `tokenizers.Tokenizer` objects.

Both kinds are saved as a single tokenizer.json, which the HF ecosystem loads as is. Neither kind has
a normalizer, so decoding the ids of a text gives back exactly that text.

A long text is trained on and encoded in pieces (`pieces`), since a tokenizer's pre-tokenization of a text holds
many bytes per character (docs/PERFORMANCE.md): a document of any length then costs the memory of one piece, and
the pieces give the merges and the ids that the whole text would.

A text a tokenizer cannot encode (`unencodable`: a char tokenizer's unseen character, a lone surrogate) is said in
one line naming its characters by `encode_text` wherever a user's text is encoded (prompts, chat lines, task
files, conversations); data preparation drops them instead (`drop_unencodable`) and counts what it dropped.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

from burnout.base.files import EOT_TOKEN, tokenizer_file
from burnout.base.text import first_line
from burnout.config import TokenizerConfig
from burnout.errors import BurnoutError

BYTE_ALPHABET_SIZE = 256
# The char kind's pre-tokenizer: every character a pre-token of its own ([\s\S] rather than "." so newlines too).
CHAR_PATTERN = r"[\s\S]"
# Characters of a text pre-tokenized at once: a piece (see `pieces`).
PIECE_CHARS = 65_536
# Where `pieces` may cut: a space or line break after a character that is not whitespace.
_CUT = re.compile(r"(?<=\S)[ \n]")
# A lone surrogate (U+D800..U+DFFF outside a pair) is no character: no tokenizer takes one and it cannot be written
# as UTF-8. Python makes one of a byte that is not UTF-8 in a command's arguments or a piped line (surrogateescape:
# byte 0xff becomes U+DCFF) and of a "\ud800" escape in JSON.
_SURROGATE = re.compile("[\ud800-\udfff]")
# Characters a message names; the rest are counted.
SHOWN_CHARACTERS = 5


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
    # Each text in pieces: the trainer counts the same pre-tokens, so it learns the same merges. A lone surrogate is
    # no character (the trainer cannot take one): left out, as encoding the data leaves it out (drop_unencodable).
    remaining = (_SURROGATE.sub("", piece) for text in texts for piece in pieces(text))
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
    for char in sorted(c for c in chars - vocab.keys() if not _SURROGATE.match(c)):  # a lone surrogate is no character
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
    added = tok.get_added_tokens_decoder().values()
    return bool(byte_level or _per_char(tok)) and not any(t.rstrip or any(c.isspace() for c in t.content)
                                                          for t in added)


def _per_char(tok: Tokenizer) -> bool:
    """Whether `tok` pre-tokenizes every character on its own (the char kind's pre-tokenizer)."""
    if tok.pre_tokenizer is None:
        return False
    pre = json.loads(tok.pre_tokenizer.__getstate__())
    return pre == {"type": "Split", "pattern": {"Regex": CHAR_PATTERN}, "behavior": "Isolated", "invert": False}


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


# ----------------------------------------------------------------------------------------------
# Text a tokenizer cannot encode


def closed_char_vocabulary(tok: Tokenizer) -> bool:
    """Whether `tok` has an id only for the characters it was trained on (the char kind: one pre-token per
    character, looked up in a vocabulary without an unknown token), so that any other character cannot be encoded."""
    return isinstance(tok.model, models.WordLevel) and tok.model.unk_token not in tok.get_vocab() and _per_char(tok)


def unencodable(tok: Tokenizer, text: str) -> list[str]:
    """The distinct characters of `text` that `tok` cannot encode, in the order they first appear: lone surrogates
    (any tokenizer) and, for a closed char vocabulary, every character outside it. Text that `tok` matches as an
    added token (<|endoftext|>) is that one token, whatever its characters."""
    if not closed_char_vocabulary(tok):
        return list(dict.fromkeys(_SURROGATE.findall(text)))
    vocab = tok.get_vocab()
    return [c for c in dict.fromkeys("".join(_split_at_added(tok, text)[::2])) if c not in vocab]


def _split_at_added(tok: Tokenizer, text: str) -> list[str]:
    """`text` as [plain, added token, plain, ...]: the added tokens `tok` matches in it (special ones unless the
    tokenizer encodes them as text), longest first, as the tokenizer matches them."""
    added = sorted((t.content for t in tok.get_added_tokens_decoder().values()
                    if not (t.special and tok.encode_special_tokens)), key=len, reverse=True)
    return re.split("(" + "|".join(map(re.escape, added)) + ")", text) if added else [text]


def drop_unencodable(tok: Tokenizer, text: str) -> tuple[str, Counter]:
    """`text` without the characters `tok` cannot encode (`unencodable`), and how many of each were dropped."""
    bad = set(unencodable(tok, text))
    if not bad:
        return text, Counter()
    parts = _split_at_added(tok, text)
    dropped = Counter(c for part in parts[::2] for c in part if c in bad)
    table = dict.fromkeys(map(ord, bad))
    return "".join(part if i % 2 else part.translate(table) for i, part in enumerate(parts)), dropped


def name_characters(chars: Sequence[str], distinct: int | None = None) -> str:
    """"'😀' (U+1F600), '\\udcff' (byte 0xff, not UTF-8)": the first SHOWN_CHARACTERS, then how many more of the
    `distinct` characters (default: of `chars`)."""
    def one(char: str) -> str:
        code = ord(char)
        if 0xDC80 <= code <= 0xDCFF:  # surrogateescape's stand-in for a byte that is not UTF-8
            return f"{char!r} (byte {code - 0xDC00:#04x}, not UTF-8)"
        if _SURROGATE.match(char):
            return f"{char!r} (U+{code:04X}, a lone surrogate)"
        return f"{char!r} (U+{code:04X})"
    named = ", ".join(map(one, chars[:SHOWN_CHARACTERS]))
    more = (len(chars) if distinct is None else distinct) - min(len(chars), SHOWN_CHARACTERS)
    return named + (f" and {more} more" if more > 0 else "")


def unencodable_error(tok: Tokenizer, text: str, where: str, fix: str | None = None,
                      error: BaseException | None = None) -> BurnoutError:
    """The one line for a text `tok` could not encode: `where`, the characters and why, and `fix` (by default: leave
    out what a char tokenizer never saw; give text as UTF-8)."""
    chars = unencodable(tok, text)
    if not chars:  # another tokenizer's refusal (a tokenizer.json of words given in a file, say)
        return BurnoutError(f"{where}: the tokenizer cannot encode it ({first_line(error or 'no reason given')}); "
                            f"{fix or 'use a byte-level BPE tokenizer, which encodes any text'}")
    why, default = [], []
    if any(_SURROGATE.match(c) for c in chars):
        why.append("a byte that is not UTF-8, or half of a surrogate pair, is no character")
        default.append("give the text as UTF-8")
    if any(not _SURROGATE.match(c) for c in chars):
        known = sum(len(token) == 1 for token in tok.get_vocab())
        why.append(f"this char-level tokenizer has tokens only for the {known} characters of the text it was "
                   "trained on")
        default.append("leave them out")
    return BurnoutError(f"{where} holds {name_characters(chars)}, which the tokenizer cannot encode: "
                        f"{'; '.join(why)}; {fix or ' and '.join(default)}")


def encode_text(tok: Tokenizer, text: str, where: str, fix: str | None = None,
                add_special_tokens: bool = True) -> list[int]:
    """The ids of `text`, a user's (a prompt, a line typed): text `tok` cannot encode is a BurnoutError naming
    `where` and the characters (`unencodable_error`)."""
    try:
        return tok.encode(text, add_special_tokens=add_special_tokens).ids
    except Exception as exc:  # the Rust side raises a bare Exception (an unseen character), TypeError (a surrogate)
        raise unencodable_error(tok, text, where, fix, exc) from None
