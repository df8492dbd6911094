"""Prepared SFT and pair folders: the held-out split, truncation, and batches that target exactly the
assistant tokens as a pure function of seed and index."""

import json

import numpy as np
import pytest

from burnout.core.chat_template import IM_END, Conversation, encode_conversation, encode_prompt
from burnout.errors import BurnoutError
from burnout.finetune.conversations import encode_pair, read_pairs
from burnout.finetune.tokenized import PairBatches, SFTBatches, format_report, prepare_pairs, prepare_sft, read_sft_meta

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "Hi there!"}, {"role": "user", "content": "Bye"},
        {"role": "assistant", "content": " Bye.\n"}]


def _one_line_error(excinfo, *parts):
    message = str(excinfo.value)
    assert "\n" not in message
    for part in parts:
        assert part in message, message


# ----------------------------------------------------------------------------------------------
# Prepared SFT folders and their batches


def _examples(tok, conversations, train_on="assistant"):
    return [encode_conversation(tok, c.messages, train_on) for c in conversations]


def test_prepare_sft_splits_reports_and_truncates(chatml_bpe, alpaca_chats, tmp_path):
    conversations = alpaca_chats[:400]
    meta = prepare_sft(conversations, chatml_bpe, tmp_path / "a", seq_len=64, val_fraction=0.1, seed=3)
    lengths = np.array([len(ids) for ids, _ in _examples(chatml_bpe, conversations)])
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
    same = prepare_sft(conversations, chatml_bpe, tmp_path / "b", seq_len=4096, val_fraction=0.1, seed=3)
    prepare_sft(conversations, chatml_bpe, tmp_path / "c", seq_len=4096, val_fraction=0.1, seed=4)

    def held_out(folder):
        return set(np.load(folder / "val_index.npy").tolist())

    assert same["truncated"] == 0 and len(held_out(tmp_path / "b")) == 40 and held_out(tmp_path / "b") != held_out(
        tmp_path / "c")
    assert held_out(tmp_path / "a") <= held_out(tmp_path / "b")  # the same split, less what no longer fits
    assert len(held_out(tmp_path / "a")) == meta["splits"]["val"]["examples"]


def test_overflow_drop_leaves_long_examples_out(chatml_bpe, alpaca_chats, tmp_path):
    meta = prepare_sft(alpaca_chats[:400], chatml_bpe, tmp_path, seq_len=64, val_fraction=0, overflow="drop")
    assert meta["dropped"]["too_long"] == meta["truncated"] > 0
    assert meta["splits"]["train"]["examples"] == 400 - meta["truncated"] and meta["splits"]["val"]["examples"] == 0


def test_sft_batches_target_exactly_the_assistant_tokens(chatml_gpt2, tmp_path):
    conversations = [Conversation(CHAT), Conversation([{"role": "user", "content": "Why?"},
                                                       {"role": "assistant", "content": "Because."}])]
    prepare_sft(conversations, chatml_gpt2, tmp_path, seq_len=48, val_fraction=0)
    loader = SFTBatches(tmp_path, "train", batch_size=2, seq_len=48, seed=0)
    x, y = loader.get_batch(0)
    assert x.shape == y.shape == (2, 48)
    for row, example in enumerate(loader.examples_of(0)):
        ids, mask = encode_conversation(chatml_gpt2, conversations[example].messages)
        n = len(ids) - 1
        assert x[row, :n].tolist() == ids[:-1]
        assert y[row].tolist() == [ids[t + 1] if mask[t + 1] else -1 for t in range(n)] + [-1] * (48 - n)
    chat_row = loader.examples_of(0).tolist().index(0)
    targets = [t for t in y[chat_row].tolist() if t != -1]
    assert chatml_gpt2.decode(targets, skip_special_tokens=False) == f"Hi there!{IM_END}Bye.{IM_END}"


def test_sft_batches_are_a_pure_function_of_seed_and_index(chatml_bpe, alpaca_chats, tmp_path):
    prepare_sft(alpaca_chats[:50], chatml_bpe, tmp_path, seq_len=1024, val_fraction=0)
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


def test_preference_pairs_prepare_and_batch(chatml_gpt2, tmp_path):
    pair_file = tmp_path / "pairs.jsonl"
    pair_file.write_text("".join(json.dumps(r) + "\n" for r in [
        {"prompt": "Capital of France?", "chosen": "Paris.", "rejected": "It is Rome, I think."},
        {"chosen": "\n\nHuman: Hi\n\nAssistant: Hello!\n\nHuman: 2+2?\n\nAssistant: 4",
         "rejected": "\n\nHuman: Hi\n\nAssistant: Hello!\n\nHuman: 2+2?\n\nAssistant: five"}]), encoding="utf-8")
    pairs = list(read_pairs(pair_file))
    prompt, (chosen, chosen_mask), _ = encode_pair(chatml_gpt2, pairs[0])
    assert prompt == encode_prompt(chatml_gpt2, pairs[0].prompt) and all(chosen_mask[:-1])
    assert chatml_gpt2.decode(chosen, skip_special_tokens=False) == f"Paris.{IM_END}\n"
    meta = prepare_pairs(pairs, chatml_gpt2, tmp_path / "dpo", seq_len=32, val_fraction=0)
    assert meta["splits"]["train"]["pairs"] == 2
    loader = PairBatches(tmp_path / "dpo", "train", batch_size=2, seq_len=32, seed=0)
    x, y = loader.get_batch(0)
    assert x.shape == (4, 32)
    for row, pair in enumerate(loader.examples_of(0)):
        for side, text in ((row, pairs[pair].chosen[0]["content"]), (row + 2, pairs[pair].rejected[0]["content"])):
            targets = [t for t in y[side].tolist() if t != -1]
            assert chatml_gpt2.decode(targets, skip_special_tokens=False) == text + IM_END
            assert x[side, : len(encode_prompt(chatml_gpt2, pairs[pair].prompt))].tolist() == \
                encode_prompt(chatml_gpt2, pairs[pair].prompt)


def test_a_pairs_system_turn_comes_first_in_the_prompt_a_dpo_batch_trains_on(tmp_path):
    """A pair's `system` field opens its prompt (ChatML: system, then the user's turns), whatever form the prompt
    takes (text, messages, a Human:/Assistant: transcript): the batch's prompt tokens spell the template written out
    by hand."""
    from burnout.config import TokenizerConfig
    from burnout.core.chat_template import ensure_chat_tokens
    from burnout.data.tokenizer import train_tokenizer

    tok = ensure_chat_tokens(train_tokenizer(["Be brief. Capital of France? Paris. Rome. Hi Hello 2+2? 4 5"] * 20,
                                             TokenizerConfig(kind="bpe", vocab_size=300)))[0]
    pair_file = tmp_path / "pairs.jsonl"
    pair_file.write_text("".join(json.dumps({"system": "Be brief.", **r}) + "\n" for r in [
        {"prompt": "Capital of France?", "chosen": "Paris.", "rejected": "Rome."},
        {"prompt": [{"role": "user", "content": "2+2?"}], "chosen": "4", "rejected": "5"},
        {"prompt": "\n\nHuman: Hi\n\nAssistant: Hello\n\nHuman: 2+2?\n\nAssistant:", "chosen": " 4",
         "rejected": " 5"}]), encoding="utf-8")
    pairs = list(read_pairs(pair_file))
    assert [[m["role"] for m in pair.prompt] for pair in pairs] == [["system", "user"], ["system", "user"],
                                                                    ["system", "user", "assistant", "user"]]
    expected = ["<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nCapital of France?<|im_end|>\n",
                "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n",
                "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
                "Hello<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n"]
    prepare_pairs(pairs, tok, tmp_path / "dpo", seq_len=64, val_fraction=0)
    loader = PairBatches(tmp_path / "dpo", "train", batch_size=3, seq_len=64, seed=0)
    x, y = loader.get_batch(0)
    for row, pair in enumerate(loader.examples_of(0)):
        for side in (row, row + 3):  # the chosen answer's row, the rejected answer's
            prompt_end = int((y[side] != -1).nonzero()[0]) + 1  # the first target follows the prompt's last token
            text = tok.decode(x[side, :prompt_end].tolist(), skip_special_tokens=False)
            assert text == expected[pair] + "<|im_start|>assistant\n", (pair, text)


def test_an_unfinished_folder_is_refused(chatml_bpe, alpaca_chats, tmp_path):
    prepare_sft(alpaca_chats[:20], chatml_bpe, tmp_path, seq_len=64)
    (tmp_path / "meta.json").unlink()
    with pytest.raises(BurnoutError) as excinfo:
        SFTBatches(tmp_path, "train", 2, 64, seed=0)
    _one_line_error(excinfo, "never finished")
