import pytest

from burnout.base.files import EOT_TOKEN
from burnout.config import DataConfig, TokenizerConfig
from burnout.data.corpus import mix_documents
from burnout.data.tokenizer import eot_id, load_tokenizer, tokenizer_sha256, train_tokenizer
from burnout.errors import BurnoutError

TRICKY = [
    "plain ascii",
    "  leading and trailing spaces   ",
    "tabs\tand\nnewlines\r\n\n\nand    runs      of  spaces",
    "def f(x):\n    return {'a': [x ** 2 for x in range(3)]}  # comment\n",
    "ünïcödé, 中文字符, emoji 😀👍🏽, combining e\u0301, zero\u200bwidth",
    "",
    "\n",
]


@pytest.fixture(scope="module")
def corpus() -> list[str]:
    train, _, _ = mix_documents(DataConfig(max_chars=200_000))
    return train


@pytest.fixture(scope="module")
def bpe(corpus):
    return train_tokenizer(corpus, TokenizerConfig(kind="bpe", vocab_size=512))


def test_bpe_round_trips_any_string(bpe):
    for text in TRICKY:
        assert bpe.decode(bpe.encode(text).ids, skip_special_tokens=False) == text


def test_bpe_honours_vocab_size(bpe):
    assert bpe.get_vocab_size() == 512


def test_eot_is_one_token_in_both_kinds(bpe, corpus):
    char = train_tokenizer(corpus, TokenizerConfig(kind="char"))
    for tok in (bpe, char):
        ids = tok.encode(f"ab{EOT_TOKEN}cd").ids
        assert ids.count(eot_id(tok)) == 1
        assert len(tok.encode(EOT_TOKEN).ids) == 1
    assert eot_id(char) == 0


def test_char_round_trips_seen_characters():
    texts = TRICKY[:5]
    tok = train_tokenizer(texts, TokenizerConfig(kind="char"))
    for text in texts:
        encoding = tok.encode(text)
        assert len(encoding.ids) == len(text)  # one id per character, whitespace included
        assert tok.decode(encoding.ids) == text
    assert tok.get_vocab_size() == len(set("".join(texts))) + 1


def test_tiny_shakespeare_char_vocab(shared_data):
    text = (shared_data / "tinyshakespeare" / "input.txt").read_text(encoding="utf-8")
    tok = train_tokenizer([text], TokenizerConfig(kind="char"))
    assert tok.get_vocab_size() == 65 + 1
    sample = text[:2000]
    assert tok.decode(tok.encode(sample).ids) == sample


def test_training_is_deterministic(corpus, bpe):
    again = train_tokenizer(corpus, TokenizerConfig(kind="bpe", vocab_size=512))
    assert tokenizer_sha256(again) == tokenizer_sha256(bpe)


def test_save_and_load(tmp_path, bpe):
    path = tmp_path / "tokenizer.json"
    bpe.save(str(path))
    assert tokenizer_sha256(load_tokenizer(path)) == tokenizer_sha256(bpe)
    assert tokenizer_sha256(load_tokenizer(tmp_path)) == tokenizer_sha256(bpe)


def test_load_missing_or_invalid_tokenizer(tmp_path):
    with pytest.raises(BurnoutError, match="nope.json.*does not exist"):
        load_tokenizer(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json", encoding="utf-8")
    with pytest.raises(BurnoutError, match="bad.json.*not a valid tokenizer.json"):
        load_tokenizer(bad)


def test_bpe_vocab_too_small_for_bytes():
    with pytest.raises(BurnoutError, match="at least 257"):
        train_tokenizer(["abc"], TokenizerConfig(kind="bpe", vocab_size=100))


def test_no_text_to_train_on():
    for kind in ("bpe", "char"):
        with pytest.raises(BurnoutError, match="no text"):
            train_tokenizer(["", ""], TokenizerConfig(kind=kind))


def test_pieces_are_cut_before_a_space_or_line_break_that_follows_a_character(monkeypatch):
    from burnout.data import tokenizer as tokenizer_module
    from burnout.data.tokenizer import pieces

    monkeypatch.setattr(tokenizer_module, "PIECE_CHARS", 100)
    text = "".join(f"w{i}  x\n\ny{i % 5 * ' '}\tz " for i in range(500))
    parts = list(pieces(text))
    assert "".join(parts) == text and len(parts) > len(text) // 100
    assert all(0 < len(part) <= 100 for part in parts)
    assert all(after[0] in " \n" and not before[-1].isspace() for before, after in zip(parts, parts[1:]))
    # No place to cut in the first 100 characters: the stretch up to the next one is a piece of its own.
    assert list(pieces("x" * 250 + " y")) == ["x" * 250, " y"]


def test_bpe_trained_on_a_long_text_in_pieces_learns_the_merges_of_the_whole(monkeypatch):
    from burnout.data import tokenizer as tokenizer_module

    text = "".join(f"word{i % 300}   and{i % 7 * ' '}\n\n{i}'s  \t x\u00a0y it's {i % 50}  " for i in range(3000))
    cfg = TokenizerConfig(kind="bpe", vocab_size=700)
    monkeypatch.setattr(tokenizer_module, "PIECE_CHARS", 10**9)
    whole = train_tokenizer([text], cfg)
    monkeypatch.setattr(tokenizer_module, "PIECE_CHARS", 100)
    assert train_tokenizer([text], cfg).to_str() == whole.to_str()


# ------------------------------------------------------------------------------------------------
# Text a tokenizer cannot encode (issue 48): named, or left out and counted, never an error from the Rust side.


def test_unencodable_names_what_a_char_vocabulary_lacks_in_order_and_spares_added_tokens():
    from collections import Counter

    from burnout.data.tokenizer import drop_unencodable, encode_text, unencodable

    tok = train_tokenizer(["abc d"], TokenizerConfig(kind="char"))
    text = "ab😀c<|endoftext|>x\ud800a😀"  # <|endoftext|> is one token though '<', '|', ... are not in the vocabulary
    assert unencodable(tok, text) == ["😀", "x", "\ud800"]
    kept, dropped = drop_unencodable(tok, text)
    assert kept == "abc<|endoftext|>a" and dropped == Counter({"😀": 2, "x": 1, "\ud800": 1})
    assert encode_text(tok, kept, "TEXT") == tok.encode(kept).ids
    bpe = train_tokenizer(["abc d " * 50], TokenizerConfig(kind="bpe", vocab_size=300))
    assert unencodable(bpe, text) == ["\ud800"]  # byte-level BPE encodes any character, but no lone surrogate
    assert drop_unencodable(bpe, "ab😀") == ("ab😀", Counter())


def test_encode_text_refuses_in_one_line_naming_each_character_by_code_point():
    from burnout.data.tokenizer import SHOWN_CHARACTERS, encode_text

    tok = train_tokenizer(["abc d"], TokenizerConfig(kind="char"))
    with pytest.raises(BurnoutError) as unseen:
        encode_text(tok, "a中b文", "--prompt")
    assert str(unseen.value) == ("--prompt holds '中' (U+4E2D), '文' (U+6587), which the tokenizer cannot encode: this "
                                 "char-level tokenizer has tokens only for the 5 characters of the text it was "
                                 "trained on; leave them out")
    with pytest.raises(BurnoutError) as undecoded:
        encode_text(tok, "a\udcff\ud800", "the line", fix="type it again")
    assert str(undecoded.value) == ("the line holds '\\udcff' (byte 0xff, not UTF-8), '\\ud800' (U+D800, a lone "
                                    "surrogate), which the tokenizer cannot encode: a byte that is not UTF-8, or half "
                                    "of a surrogate pair, is no character; type it again")
    many = "".join(chr(0x4E00 + i) for i in range(SHOWN_CHARACTERS + 3))
    with pytest.raises(BurnoutError, match=r"\(U\+4E04\) and 3 more, which"):
        encode_text(tok, many, "TEXT")
