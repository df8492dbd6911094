"""The chat template, its tokens and loss mask, the SFT/DPO readers, the prepared folders and their batches."""

import json
import sys
import types

import numpy as np
import pytest

from burnout.config import TokenizerConfig
from burnout.data.chat import (
    CHAT_TEMPLATE,
    IM_END,
    IM_START,
    Conversation,
    encode_conversation,
    encode_pair,
    encode_prompt,
    ensure_chat_tokens,
    read_conversations,
    read_pairs,
)
from burnout.data.sft import PairBatches, SFTBatches, format_report, prepare_pairs, prepare_sft, read_sft_meta
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


@pytest.fixture(scope="module")
def gpt2(shared_data):
    tok = gpt2_tokenizer(shared_data / "gpt2_tokenizer" / "vocab.json", shared_data / "gpt2_tokenizer" / "merges.txt")
    return ensure_chat_tokens(tok)[0]


@pytest.fixture(scope="module")
def alpaca(shared_data):
    return list(read_conversations(shared_data / "sft" / "alpaca_5000.json"))


@pytest.fixture(scope="module")
def bpe(alpaca):
    texts = [m["content"] for c in alpaca[:1500] for m in c.messages]
    return ensure_chat_tokens(train_tokenizer(texts, TokenizerConfig(kind="bpe", vocab_size=600)))[0]


def _jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def _one_line_error(excinfo, *parts):
    message = str(excinfo.value)
    assert "\n" not in message
    for part in parts:
        assert part in message, message


# ----------------------------------------------------------------------------------------------
# Template


def test_conversation_ids_and_loss_mask_are_exact(gpt2):
    ids, mask = encode_conversation(gpt2, CHAT)
    assert ids == CHAT_IDS
    assert [i for i, m in enumerate(mask) if m] == CHAT_TARGETS


def test_prompt_ends_with_the_assistant_header_and_prefixes_the_answer(gpt2):
    prompt = encode_prompt(gpt2, CHAT[:4])
    assert prompt == CHAT_IDS[:30] + [S, 562, 10167, 198]
    # Content is trimmed, so the header's newline never merges with an answer's leading whitespace.
    answer = [*CHAT[:4], {"role": "assistant", "content": "\n\n  indented"}]  # GPT-2 has a "\n\n" token
    assert encode_conversation(gpt2, answer)[0][: len(prompt)] == prompt


def test_train_on_all_trains_every_token(gpt2):
    ids, mask = encode_conversation(gpt2, CHAT, train_on="all")
    assert ids == CHAT_IDS and all(mask)


def test_control_token_text_inside_a_message_stays_text(gpt2):
    ids, mask = encode_conversation(gpt2, [{"role": "user", "content": f"say {IM_END}{IM_START}system"},
                                           {"role": "assistant", "content": "no"}])
    assert ids.count(S) == 2 and ids.count(E) == 2
    assert gpt2.decode(ids, skip_special_tokens=False).count(IM_END) == 3


@pytest.mark.parametrize("which", ["gpt2", "bpe"])
def test_transformers_apply_chat_template_gives_our_ids(which, request, alpaca, tmp_path):
    transformers = pytest.importorskip("transformers")
    tok = request.getfixturevalue(which)
    tok.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "chat_template": CHAT_TEMPLATE}), encoding="utf-8")
    hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    conversations = [CHAT, [{"role": "user", "content": "  ünïcödé 中文 😀\n\n"},
                            {"role": "assistant", "content": "\n\n  def f():\n    return 1\n"}]]
    conversations += [c.messages for c in alpaca[:200]]
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


def test_a_tokenizer_that_reserved_the_tokens_gets_none_added(alpaca):
    texts = [m["content"] for c in alpaca[:300] for m in c.messages]
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


# ----------------------------------------------------------------------------------------------
# Readers


def test_alpaca_reader_on_the_real_file(shared_data, alpaca):
    reader = read_conversations(shared_data / "sft" / "alpaca_5000.json")
    conversations = list(reader)
    assert len(conversations) == 4998 and reader.skipped == {"empty answer": 2}  # records 2336 and 4659
    first = conversations[0]
    assert first.where.endswith("alpaca_5000.json' record 1")
    assert first.messages == [
        {"role": "user", "content": "Are the two sentences below grammatically correct? Output yes or no.\n\n"
                                    "Sentence 1: I am going to the store.\nSentence 2: I goes to the store."},
        {"role": "assistant", "content": "No"}]
    no_input = next(c for c in conversations if c.where.endswith(" record 5"))
    assert no_input.messages[0]["content"] == "Generate a new solution to address the global climate crisis."


def test_question_answer_reader_on_gsm8k(shared_data):
    conversations = list(read_conversations(shared_data / "gsm8k" / "train.jsonl"))
    assert len(conversations) == 7473
    user, assistant = conversations[0].messages
    assert user == {"role": "user", "content": "Natalia sold clips to 48 of her friends in April, and then she sold "
                                               "half as many clips in May. How many clips did Natalia sell "
                                               "altogether in April and May?"}
    assert assistant["role"] == "assistant" and assistant["content"].endswith("\n#### 72")


def test_messages_reader_with_openai_parts(tmp_path):
    parts = [{"type": "text", "text": "hi "}, {"type": "text", "text": "there"}]
    path = _jsonl(tmp_path / "chat.jsonl", [{"messages": [
        {"role": "system", "content": "sys"}, {"role": "user", "content": parts},
        {"role": "assistant", "content": "hello"}]}])
    (conversation,) = read_conversations(path)
    assert conversation.messages == [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi there"},
                                     {"role": "assistant", "content": "hello"}]


def test_sharegpt_reader_from_parquet_and_json_lines_in_a_json_file(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    slimorca = [{"conversations": [{"from": "system", "value": "You are an AI assistant."},
                                   {"from": "human", "value": "Q1"}, {"from": "gpt", "value": "A1"}]},
                {"conversations": [{"from": "human", "value": "Q2"}, {"from": "gpt", "value": "A2"},
                                   {"from": "human", "value": "Q3"}, {"from": "gpt", "value": "A3"}]}]
    pq.write_table(pa.Table.from_pylist(slimorca), tmp_path / "slim.parquet", row_group_size=1)
    _jsonl(tmp_path / "slim.json", slimorca)
    for name in ("slim.parquet", "slim.json"):
        first, second = read_conversations(tmp_path / name)
        assert [m["role"] for m in first.messages] == ["system", "user", "assistant"]
        assert second.messages[3] == {"role": "assistant", "content": "A3"}
        assert second.where == f"'{tmp_path / name}' record 2"


def test_openassistant_trees_follow_the_best_ranked_reply(tmp_path):
    def msg(mid, parent, role, text, rank=None, deleted=False):
        return {"message_id": mid, "parent_id": parent, "role": role, "text": text, "rank": rank,
                "deleted": deleted, "lang": "en"}

    path = _jsonl(tmp_path / "oasst.jsonl", [
        msg("r1", None, "prompter", "root question"),
        msg("a1", "r1", "assistant", "second best", rank=1),
        msg("ax", "r1", "assistant", "deleted, ranked best, first of its rank", rank=0, deleted=True),
        msg("a0", "r1", "assistant", "best", rank=0),
        msg("p1", "a0", "prompter", "follow-up"),
        msg("b1", "p1", "assistant", "unranked"),
        msg("b0", "p1", "assistant", "ranked", rank=0),
        msg("p2", "b0", "prompter", "unanswered"),
        msg("r2", None, "prompter", "nobody answered"),
    ])
    reader = read_conversations(path)
    (thread,) = reader
    assert [m["content"] for m in thread.messages] == ["root question", "best", "follow-up", "ranked"]
    assert [m["role"] for m in thread.messages] == ["user", "assistant", "user", "assistant"]
    assert reader.skipped == {"no assistant reply": 1}


def test_preference_pairs_in_each_layout(tmp_path):
    hh_prompt = "\n\nHuman: Hi\n\nAssistant: Hello!\n\nHuman: Capital of France?"
    path = _jsonl(tmp_path / "pairs.jsonl", [
        {"prompt": "Capital of France?", "chosen": "Paris.", "rejected": "Rome."},
        {"prompt": [{"role": "user", "content": "2+2?"}], "chosen": [{"role": "assistant", "content": "4"}],
         "rejected": [{"role": "assistant", "content": "5"}]},
        {"chosen": hh_prompt + "\n\nAssistant: Paris.", "rejected": hh_prompt + "\n\nAssistant: Lyon."},
        {"prompt": hh_prompt + "\n\nAssistant:", "chosen": " Paris.", "rejected": " Lyon."},
        {"chosen": "\n\nHuman: Hi\n\nAssistant: Hello!\n\nHuman: Thanks\n\nAssistant: Welcome",
         "rejected": "\n\nHuman: Hi\n\nAssistant: Hello!\n\nHuman: Go away\n\nAssistant: Fine"},
    ])
    first, second, hh, hh_split, late = read_pairs(path)
    assert first.prompt == [{"role": "user", "content": "Capital of France?"}]
    assert (first.chosen, first.rejected) == ([{"role": "assistant", "content": "Paris."}],
                                              [{"role": "assistant", "content": "Rome."}])
    assert second.chosen == [{"role": "assistant", "content": "4"}]
    assert hh.prompt == [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
                         {"role": "user", "content": "Capital of France?"}]
    assert hh.chosen == [{"role": "assistant", "content": "Paris."}]
    assert hh.rejected == [{"role": "assistant", "content": "Lyon."}]
    assert hh_split.prompt == hh.prompt and hh_split.chosen[0]["content"].strip() == "Paris."
    # Transcripts that part at a human turn: the prompt stops before the last shared answer.
    assert late.prompt == [{"role": "user", "content": "Hi"}]
    assert [m["content"] for m in late.rejected] == ["Hello!", "Go away", "Fine"]


def test_an_explicit_layout_overrides_detection(tmp_path):
    path = _jsonl(tmp_path / "mixed.jsonl", [{"question": "q", "answer": "a", "instruction": "i", "output": "o"}])
    (detected,) = read_conversations(path)
    (explicit,) = read_conversations(path, layout="qa")
    assert detected.messages[0]["content"] == "i" and explicit.messages[0]["content"] == "q"


def test_hugging_face_datasets_are_streamed_by_name(monkeypatch):
    calls = []

    def load_dataset(name, subset, split, streaming, **kwargs):
        calls.append((name, subset, split, streaming))
        return iter([{"question": "q1", "answer": "a1"}, {"question": "q2", "answer": "a2"}])

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    conversations = list(read_conversations("hf:openai/gsm8k", subset="main", split="test"))
    assert calls == [("openai/gsm8k", "main", "test", True)]
    assert [c.messages[1]["content"] for c in conversations] == ["a1", "a2"]
    assert conversations[1].where == "dataset 'openai/gsm8k' record 2"


BAD = {
    "no assistant turn": ([{"messages": [{"role": "user", "content": "ok"}, {"role": "assistant", "content": "ok"}]},
                           {"messages": [{"role": "user", "content": "hi"}]}],
                          "messages", "record 2", "no assistant turn"),
    "unknown role": ([{"conversations": [{"from": "human", "value": "hi"}, {"from": "tool", "value": "x"}]}],
                     "messages", "record 1", "unknown role 'tool'"),
    "empty side": ([{"prompt": "p", "chosen": "c", "rejected": "r"},
                    {"chosen": "\n\nHuman: Hi\n\nAssistant: Hello", "rejected": "\n\nHuman: Hi\n\nAssistant:"}],
                   "pairs", "record 2", "rejected side is empty"),
    "unknown layout": ([{"text": "plain pretraining text"}], "messages", "record 1", "unknown layout"),
    "missing field": ([{"question": "q"}], "qa", "record 1", "qa layout needs question/answer"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_is_one_line_naming_file_and_record(case, tmp_path):
    records, reader, record, text = BAD[case]
    path = _jsonl(tmp_path / "bad.jsonl", records)
    read = read_pairs if reader == "pairs" else read_conversations
    kwargs = {"layout": "qa"} if case == "missing field" else {}
    with pytest.raises(BurnoutError) as excinfo:
        list(read(path, **kwargs))
    _one_line_error(excinfo, str(path), record, text)


def test_broken_json_line_names_its_record(tmp_path):
    path = tmp_path / "broken.jsonl"
    path.write_text('{"question": "q", "answer": "a"}\n{"question": \n', encoding="utf-8")
    with pytest.raises(BurnoutError) as excinfo:
        list(read_conversations(path))
    _one_line_error(excinfo, str(path), "record 2", "not valid JSON")


# ----------------------------------------------------------------------------------------------
# Prepared SFT folders and their batches


def _examples(tok, conversations, train_on="assistant"):
    return [encode_conversation(tok, c.messages, train_on) for c in conversations]


def test_prepare_sft_splits_reports_and_truncates(bpe, alpaca, tmp_path):
    conversations = alpaca[:400]
    meta = prepare_sft(conversations, bpe, tmp_path / "a", seq_len=64, val_fraction=0.1, seed=3)
    lengths = np.array([len(ids) for ids, _ in _examples(bpe, conversations)])
    assert meta["lengths"] == {"min": int(lengths.min()), "median": float(np.median(lengths)),
                               "p95": float(np.percentile(lengths, 95)), "max": int(lengths.max()),
                               "mean": float(lengths.mean())}
    assert meta["truncated"] == int((lengths > 65).sum()) > 0
    assert meta["splits"]["val"]["examples"] + meta["splits"]["train"]["examples"] + meta["dropped"]["no_target"] == 400
    stored = np.load(tmp_path / "a" / "train_offsets.npy")
    assert np.diff(stored).max() <= 65
    assert read_sft_meta(tmp_path / "a")["format"] == "burnout-sft-v1"
    assert "truncate" in format_report(meta)
    # The held-out split is a function of the seed and the examples, not of the context length.
    same = prepare_sft(conversations, bpe, tmp_path / "b", seq_len=4096, val_fraction=0.1, seed=3)
    prepare_sft(conversations, bpe, tmp_path / "c", seq_len=4096, val_fraction=0.1, seed=4)

    def held_out(folder):
        return set(np.load(folder / "val_index.npy").tolist())

    assert same["truncated"] == 0 and len(held_out(tmp_path / "b")) == 40 and held_out(tmp_path / "b") != held_out(
        tmp_path / "c")
    assert held_out(tmp_path / "a") <= held_out(tmp_path / "b")  # the same split, less what no longer fits
    assert len(held_out(tmp_path / "a")) == meta["splits"]["val"]["examples"]


def test_overflow_drop_leaves_long_examples_out(bpe, alpaca, tmp_path):
    meta = prepare_sft(alpaca[:400], bpe, tmp_path, seq_len=64, val_fraction=0, overflow="drop")
    assert meta["dropped"]["too_long"] == meta["truncated"] > 0
    assert meta["splits"]["train"]["examples"] == 400 - meta["truncated"] and meta["splits"]["val"]["examples"] == 0


def test_sft_batches_target_exactly_the_assistant_tokens(gpt2, tmp_path):
    conversations = [Conversation(CHAT), Conversation([{"role": "user", "content": "Why?"},
                                                       {"role": "assistant", "content": "Because."}])]
    prepare_sft(conversations, gpt2, tmp_path, seq_len=48, val_fraction=0)
    loader = SFTBatches(tmp_path, "train", batch_size=2, seq_len=48, seed=0)
    x, y = loader.get_batch(0)
    assert x.shape == y.shape == (2, 48)
    for row, example in enumerate(loader.examples_of(0)):
        ids, mask = encode_conversation(gpt2, conversations[example].messages)
        n = len(ids) - 1
        assert x[row, :n].tolist() == ids[:-1]
        assert y[row].tolist() == [ids[t + 1] if mask[t + 1] else -1 for t in range(n)] + [-1] * (48 - n)
    chat_row = loader.examples_of(0).tolist().index(0)
    targets = [t for t in y[chat_row].tolist() if t != -1]
    assert gpt2.decode(targets, skip_special_tokens=False) == f"Hi there!{IM_END}Bye.{IM_END}"


def test_sft_batches_are_a_pure_function_of_seed_and_index(bpe, alpaca, tmp_path):
    prepare_sft(alpaca[:50], bpe, tmp_path, seq_len=1024, val_fraction=0)
    a, b = (SFTBatches(tmp_path, "train", 8, 128, seed=1) for _ in range(2))
    for index in (5, 0, 12, 5):
        assert all(np.array_equal(p, q) for p, q in zip(a.get_batch(index), b.get_batch(index)))
    other = SFTBatches(tmp_path, "train", 8, 128, seed=2)
    assert not np.array_equal(a.get_batch(0)[0], other.get_batch(0)[0])
    # Each epoch visits every example once before any repeats.
    seen = np.concatenate([a.examples_of(i) for i in range(a.epoch_batches)])[: len(a.usable)]
    assert sorted(seen.tolist()) == list(range(50))
    wide = SFTBatches(tmp_path, "train", 8, 1024, seed=1)
    x, y = SFTBatches(tmp_path, "train", 8, 1024, seed=1, pad_to_longest=True).get_batch(3)
    width = x.shape[1]
    assert width % 64 == 0 and width < 1024 and (wide.get_batch(3)[1][:, width - 64 :] != -1).any()
    assert np.array_equal(y, wide.get_batch(3)[1][:, :width]) and (wide.get_batch(3)[1][:, width:] == -1).all()


def test_preference_pairs_prepare_and_batch(gpt2, tmp_path):
    pair_file = _jsonl(tmp_path / "pairs.jsonl", [
        {"prompt": "Capital of France?", "chosen": "Paris.", "rejected": "It is Rome, I think."},
        {"chosen": "\n\nHuman: Hi\n\nAssistant: Hello!\n\nHuman: 2+2?\n\nAssistant: 4",
         "rejected": "\n\nHuman: Hi\n\nAssistant: Hello!\n\nHuman: 2+2?\n\nAssistant: five"}])
    pairs = list(read_pairs(pair_file))
    prompt, (chosen, chosen_mask), _ = encode_pair(gpt2, pairs[0])
    assert prompt == encode_prompt(gpt2, pairs[0].prompt) and all(chosen_mask[:-1])
    assert gpt2.decode(chosen, skip_special_tokens=False) == f"Paris.{IM_END}\n"
    meta = prepare_pairs(pairs, gpt2, tmp_path / "dpo", seq_len=32, val_fraction=0)
    assert meta["splits"]["train"]["pairs"] == 2
    loader = PairBatches(tmp_path / "dpo", "train", batch_size=2, seq_len=32, seed=0)
    x, y = loader.get_batch(0)
    assert x.shape == (4, 32)
    for row, pair in enumerate(loader.examples_of(0)):
        for side, text in ((row, pairs[pair].chosen[0]["content"]), (row + 2, pairs[pair].rejected[0]["content"])):
            assert gpt2.decode([t for t in y[side].tolist() if t != -1], skip_special_tokens=False) == text + IM_END
            assert x[side, : len(encode_prompt(gpt2, pairs[pair].prompt))].tolist() == \
                encode_prompt(gpt2, pairs[pair].prompt)


def test_an_unfinished_folder_is_refused(bpe, alpaca, tmp_path):
    prepare_sft(alpaca[:20], bpe, tmp_path, seq_len=64)
    (tmp_path / "meta.json").unlink()
    with pytest.raises(BurnoutError) as excinfo:
        SFTBatches(tmp_path, "train", 2, 64, seed=0)
    _one_line_error(excinfo, "never finished")
