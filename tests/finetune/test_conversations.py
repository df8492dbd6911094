"""The readers of every conversation and preference-pair layout: real files, parquet, Hugging Face streams,
and one line for each kind of bad record."""

import json
import sys
import types

import pytest

from burnout.errors import BurnoutError
from burnout.finetune.conversations import read_conversations, read_pairs


def _jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def _one_line_error(excinfo, *parts):
    message = str(excinfo.value)
    assert "\n" not in message
    for part in parts:
        assert part in message, message


# ----------------------------------------------------------------------------------------------
# Readers


def test_alpaca_reader_on_the_real_file(shared_data, alpaca_chats):
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


