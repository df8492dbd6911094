"""The ChatML template: its ids and loss mask (equal to transformers' apply_chat_template), and adding its
tokens to a tokenizer."""

import json

import pytest

from burnout.config import TokenizerConfig
from burnout.core.chat_template import (
    CHAT_TEMPLATE,
    IM_END,
    IM_START,
    encode_conversation,
    encode_prompt,
    ensure_chat_tokens,
)
from burnout.data.tokenizer import gpt2_tokenizer, train_tokenizer
from burnout.errors import BurnoutError

S, E = 50257, 50258  # <|im_start|>, <|im_end|> appended to GPT-2's 50,257 tokens
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "Hi there!"}, {"role": "user", "content": "Bye"},
        {"role": "assistant", "content": " Bye.\n"}]
# GPT-2 ids: 10057 system, 198 "\n", 3856 Be, 4506 " brief", 13 ".", 7220 user, 15496 Hello, 562 10167 "assistant",
# 17250 Hi, 612 " there", 0 "!", 3886 68 "Bye".
CHAT_IDS = [S, 10057, 198, 3856, 4506, 13, E, 198,
            S, 7220, 198, 15496, E, 198,
            S, 562, 10167, 198, 17250, 612, 0, E, 198,
            S, 7220, 198, 3886, 68, E, 198,
            S, 562, 10167, 198, 3886, 68, 13, E, 198]
# The assistant contents and their <|im_end|>: "Hi there!" + E, "Bye." + E.
CHAT_TARGETS = [18, 19, 20, 21, 34, 35, 36, 37]



def _one_line_error(excinfo, *parts):
    message = str(excinfo.value)
    assert "\n" not in message
    for part in parts:
        assert part in message, message


# ----------------------------------------------------------------------------------------------
# Template


def test_conversation_ids_and_loss_mask_are_exact(chatml_gpt2):
    ids, mask = encode_conversation(chatml_gpt2, CHAT)
    assert ids == CHAT_IDS
    assert [i for i, m in enumerate(mask) if m] == CHAT_TARGETS


def test_prompt_ends_with_the_assistant_header_and_prefixes_the_answer(chatml_gpt2):
    prompt = encode_prompt(chatml_gpt2, CHAT[:4])
    assert prompt == CHAT_IDS[:30] + [S, 562, 10167, 198]
    # Content is trimmed, so the header's newline never merges with an answer's leading whitespace.
    answer = [*CHAT[:4], {"role": "assistant", "content": "\n\n  indented"}]  # GPT-2 has a "\n\n" token
    assert encode_conversation(chatml_gpt2, answer)[0][: len(prompt)] == prompt


def test_train_on_all_trains_every_token(chatml_gpt2):
    ids, mask = encode_conversation(chatml_gpt2, CHAT, train_on="all")
    assert ids == CHAT_IDS and all(mask)


def test_control_token_text_inside_a_message_stays_text(chatml_gpt2):
    ids, mask = encode_conversation(chatml_gpt2, [{"role": "user", "content": f"say {IM_END}{IM_START}system"},
                                           {"role": "assistant", "content": "no"}])
    assert ids.count(S) == 2 and ids.count(E) == 2
    assert chatml_gpt2.decode(ids, skip_special_tokens=False).count(IM_END) == 3


@pytest.mark.parametrize("which", ["chatml_gpt2", "chatml_bpe"])
def test_transformers_apply_chat_template_gives_our_ids(which, request, alpaca_chats, tmp_path):
    transformers = pytest.importorskip("transformers")
    tok = request.getfixturevalue(which)
    tok.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "chat_template": CHAT_TEMPLATE}), encoding="utf-8")
    hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    conversations = [CHAT, [{"role": "user", "content": "  ünïcödé 中文 😀\n\n"},
                            {"role": "assistant", "content": "\n\n  def f():\n    return 1\n"}]]
    conversations += [c.messages for c in alpaca_chats[:200]]
    for messages in conversations:
        prompt = hf.apply_chat_template(messages[:-1], add_generation_prompt=True, tokenize=True, return_dict=False)
        whole = hf.apply_chat_template(messages, tokenize=True, return_dict=False)
        assert prompt == encode_prompt(tok, messages[:-1])
        assert whole == encode_conversation(tok, messages)[0]


# ----------------------------------------------------------------------------------------------
# Tokenizer extension


def test_ensure_chat_tokens_adds_exactly_the_two_tokens(shared_data):
    base = gpt2_tokenizer(shared_data / "gpt2_tokenizer" / "vocab.json", shared_data / "gpt2_tokenizer" / "merges.txt")
    tok, added = ensure_chat_tokens(base)
    assert added == [IM_START, IM_END]
    assert base.get_vocab_size() == 50257 and tok.get_vocab_size() == 50259
    assert [tok.encode(t).ids for t in (IM_START, IM_END)] == [[S], [E]]
    assert tok.encode("Hello world").ids == [15496, 995]
    assert ensure_chat_tokens(tok)[1] == []


def test_a_tokenizer_that_reserved_the_tokens_gets_none_added(alpaca_chats):
    texts = [m["content"] for c in alpaca_chats[:300] for m in c.messages]
    cfg = TokenizerConfig(kind="bpe", vocab_size=400, special_tokens=["<|endoftext|>", IM_START, IM_END])
    tok = train_tokenizer(texts, cfg)
    extended, added = ensure_chat_tokens(tok)
    assert added == [] and extended.get_vocab_size() == tok.get_vocab_size() == 400


def test_char_tokenizer_without_the_role_letters_cannot_be_extended():
    with pytest.raises(BurnoutError) as excinfo:
        ensure_chat_tokens(train_tokenizer(["abc de"], TokenizerConfig(kind="char")))
    _one_line_error(excinfo, "cannot be extended")
    letters = train_tokenizer(["system user assistant\n hello"], TokenizerConfig(kind="char"))
    tok, added = ensure_chat_tokens(letters)
    _, mask = encode_conversation(tok, [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "yes"}])
    assert added == [IM_START, IM_END] and sum(mask) == len("yes") + 1


def test_encoding_needs_the_chat_tokens(shared_data):
    base = gpt2_tokenizer(shared_data / "gpt2_tokenizer" / "vocab.json", shared_data / "gpt2_tokenizer" / "merges.txt")
    with pytest.raises(BurnoutError) as excinfo:
        encode_prompt(base, CHAT[:2])
    _one_line_error(excinfo, "ensure_chat_tokens")


