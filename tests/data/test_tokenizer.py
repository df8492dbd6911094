import pytest

from burnout.common import EOT_TOKEN
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
