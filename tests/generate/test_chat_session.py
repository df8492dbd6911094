"""Chat checkpoints: `burnout chat` holds a conversation in the ChatML template, streams, stops at the
<|im_end|> id, /system and /reset, drops the oldest turns when the context fills; `generate --chat`;
base checkpoints keep the continuation loop. The model is the rigged bigram of `chat_checkpoint`: it
answers every message with "Paris." and would start again after <|im_end|> if nothing stopped it."""

import io
import json
import re

import pytest

from burnout.cli import main
from burnout.core.chat_template import encode_prompt
from burnout.core.model_files import load_model
from burnout.errors import BurnoutError
from burnout.generate import chat as chat_module
from burnout.generate.chat import chat_loop, chat_prompt, chat_replies, fit_messages, plain_transcript, stream_reply

GREEDY = {"max_new_tokens": 20, "temperature": 0.0, "top_k": None, "top_p": None, "repetition_penalty": 1.0,
          "seed": 0}


@pytest.fixture(scope="module")
def chat_model(chat_checkpoint):
    model, tokenizer, ckpt = load_model(chat_checkpoint.run_dir)
    return model, tokenizer


def _run_loop(chat_model, lines, monkeypatch, **settings):
    """Run chat_loop on `lines`; returns (what it printed, the prompt ids of each answer)."""
    model, tokenizer = chat_model
    prompts = []

    def spy(model, tokenizer, ids, max_new_tokens, **sampling):
        prompts.append(list(ids))
        return stream_reply(model, tokenizer, ids, max_new_tokens, **sampling)

    monkeypatch.setattr(chat_module, "stream_reply", spy)
    feed = iter(lines)

    def read(_):
        try:
            return next(feed)
        except StopIteration:
            raise EOFError from None

    out = io.StringIO()
    chat_loop(model, tokenizer, {**GREEDY, **settings}, read=read, out=out)
    return out.getvalue(), prompts


def test_each_turn_renders_the_whole_history_and_stops_at_im_end(chat_model, chat_checkpoint, monkeypatch):
    tokenizer = chat_model[1]
    text, prompts = _run_loop(chat_model, ["/system Be brief.", "What is the capital of France?", "And Italy?",
                                           "/reset", "Hello"], monkeypatch, max_new_tokens=6)
    system = {"role": "system", "content": "Be brief."}
    first = {"role": "user", "content": "What is the capital of France?"}
    answer = {"role": "assistant", "content": chat_checkpoint.answer}
    assert prompts == [
        encode_prompt(tokenizer, [system, first]),
        encode_prompt(tokenizer, [system, first, answer, {"role": "user", "content": "And Italy?"}]),
        encode_prompt(tokenizer, [system, {"role": "user", "content": "Hello"}]),  # /reset kept the system prompt
    ]
    # Each answer ends at the <|im_end|> id, before the 6 tokens it would otherwise run to ("Paris.Paris.").
    assert text.count(f"bot> {chat_checkpoint.answer}\n") == 3
    assert "system prompt: Be brief." in text and "conversation cleared" in text


def test_the_sampling_commands_still_work_and_a_bad_one_keeps_the_session(chat_model, monkeypatch):
    text, prompts = _run_loop(chat_model, ["/len 2", "/topk x", "/system", "Hi"], monkeypatch)
    assert "max_new_tokens=2" in text and "/topk needs a number" in text and "system prompt: (none)" in text
    assert text.endswith("bot> Paris\n")  # the answer's first 2 tokens: "Pa", "ris"
    assert prompts == [encode_prompt(chat_model[1], [{"role": "user", "content": "Hi"}])]


def test_a_seed_out_of_range_is_refused_and_the_conversation_goes_on(chat_model, chat_checkpoint, monkeypatch):
    """`/seed 10**23` once crashed the session at the next message (torch's generator takes 64 bits), losing the
    conversation: the value is refused when given, and the next message continues the same conversation."""
    tokenizer = chat_model[1]
    text, prompts = _run_loop(chat_model, ["Hi", f"/seed {10**23}", "And Italy?"], monkeypatch)
    assert f"/seed: '{10**23}' must be in [0, 4294967295]; the setting stays 0" in text
    first, answer = {"role": "user", "content": "Hi"}, {"role": "assistant", "content": chat_checkpoint.answer}
    assert prompts[-1] == encode_prompt(tokenizer, [first, answer, {"role": "user", "content": "And Italy?"}])
    assert text.count(f"bot> {chat_checkpoint.answer}\n") == 2


def test_oldest_turns_are_dropped_when_the_context_fills(chat_model, monkeypatch):
    model, tokenizer = chat_model
    lines = ["/system Be brief."] + [f"Question number {i}?" for i in range(6)]
    text, prompts = _run_loop(chat_model, lines, monkeypatch, max_new_tokens=20)
    context, room = model.cfg.context_length, 20
    assert all(len(p) + room <= context for p in prompts)
    # Dropped messages leave the history: each notice counts the newly dropped exchange alone.
    assert set(re.findall(r"the oldest (\d+) message\(s\) no longer fit the context", text)) == {"2"}
    last = tokenizer.decode(prompts[-1], skip_special_tokens=False)
    assert last.startswith("<|im_start|>system\nBe brief.<|im_end|>")  # the system prompt always stays
    assert "Question number 5?" in last and "Question number 0?" not in last
    assert text.count("bot> Paris.") == 6


def test_fit_messages_drops_whole_exchanges_and_refuses_a_message_that_cannot_fit():
    def encode(messages):
        return [0] * sum(len(m["content"]) for m in messages)

    msgs = [{"role": "system", "content": "ss"}, {"role": "user", "content": "u1" * 5},
            {"role": "assistant", "content": "a1" * 5}, {"role": "user", "content": "u2"},
            {"role": "assistant", "content": "a2"}, {"role": "user", "content": "new"}]
    ids, dropped = fit_messages(msgs, encode, context=20, reserve=10)
    assert dropped == 2 and len(ids) == len("ss" + "u2" + "a2" + "new")
    assert fit_messages(msgs, encode, context=100, reserve=10)[1] == 0
    with pytest.raises(BurnoutError, match="system prompt and the message need 9 tokens") as excinfo:
        fit_messages([msgs[0], {"role": "user", "content": "x" * 7}], encode, context=9, reserve=1)
    assert "\n" not in str(excinfo.value)


def test_chat_replies_answer_a_batch_and_a_base_tokenizer_is_one_line(chat_model, chat_checkpoint):
    model, tokenizer = chat_model
    answers = chat_replies(model, tokenizer, ["What is the capital of France?", "Hi", "Hey"], 20, temperature=0.0)
    assert answers == [chat_checkpoint.answer] * 3
    ids, _ = chat_prompt(tokenizer, [{"role": "user", "content": "Hi"}], 64, 20)
    assert "".join(stream_reply(model, tokenizer, ids, 20, temperature=0.0)) == chat_checkpoint.answer


def test_plain_transcript_for_a_base_model():
    assert plain_transcript([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi "},
                             {"role": "assistant", "content": "Hello"}, {"role": "user", "content": "Bye"}]) == (
        "System: Be brief.\nUser: Hi\nAssistant: Hello\nUser: Bye\nAssistant:")


# ----------------------------------------------------------------------------------------------
# The command line


def test_cli_chat_talks_to_a_chat_checkpoint(chat_checkpoint, monkeypatch, capsys):
    monkeypatch.setattr("sys.stdin", io.StringIO("What is the capital of France?\n/quit\n"))
    assert main(["chat", str(chat_checkpoint.run_dir), "--temperature", "0", "--system", "Be brief."]) == 0
    out = capsys.readouterr().out
    assert "a chat model" in out and f"bot> {chat_checkpoint.answer}\n" in out


@pytest.fixture(scope="module")
def base_checkpoint(chat_checkpoint, tmp_path_factory):
    """The chat checkpoint's model and tokenizer saved without an sft section: a base model."""
    from burnout.config import load_run_config
    from burnout.core.checkpoint import load_checkpoint, save_checkpoint

    ckpt = load_checkpoint(chat_checkpoint.run_dir)
    cfg = load_run_config({"model": ckpt.config.to_dict()["model"]})
    run = tmp_path_factory.mktemp("base") / "base"
    save_checkpoint(run, cfg, ckpt.model, {"step": 1, "tokens": 1}, {"step": 1, "tokens": 1},
                    ckpt.path / "tokenizer.json", keep_last=1)
    return run


def test_cli_chat_keeps_the_continuation_loop_for_a_base_checkpoint(base_checkpoint, monkeypatch, capsys):
    monkeypatch.setattr("sys.stdin", io.StringIO("The capital\n"))
    assert main(["chat", str(base_checkpoint), "--max-new-tokens", "3"]) == 0
    out = capsys.readouterr().out
    assert "type text to continue" in out and "The capital" in out and "bot>" not in out
    assert main(["chat", str(base_checkpoint), "--system", "x"]) == 2
    assert "needs a chat checkpoint" in capsys.readouterr().err


def test_cli_generate_chat(chat_checkpoint, base_checkpoint, tmp_path, capsys):
    run = str(chat_checkpoint.run_dir)
    assert main(["generate", run, "--chat", "--prompt", "What is the capital of France?", "--temperature", "0"]) == 0
    assert capsys.readouterr().out == chat_checkpoint.answer + "\n"
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Hi\nWhat is the capital of France?\n")
    assert main(["generate", run, "--chat", "--prompts-file", str(prompts), "--system", "Be brief.",
                 "--temperature", "0"]) == 0
    assert [r["answer"] for r in json.loads(capsys.readouterr().out)] == [chat_checkpoint.answer] * 2

    for argv, message in ((["generate", run, "--prompt", "x", "--system", "y"], "--system goes with --chat"),
                          (["generate", run, "--chat", "--prompt", "x", "--stop", "y"], "ends at <|im_end|>"),
                          (["generate", run, "--chat", "--prompt", "x " * 80], "context is 64")):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1 and "Traceback" not in err


def test_generate_chat_needs_the_chat_tokens(tmp_path, capsys):
    from burnout.config import TokenizerConfig, load_run_config
    from burnout.core.checkpoint import save_checkpoint
    from burnout.data.tokenizer import train_tokenizer
    from burnout.models import Transformer

    train_tokenizer(["plain text without chat tokens"] * 5, TokenizerConfig(kind="bpe", vocab_size=270)).save(
        str(tmp_path / "tokenizer.json"))
    cfg = load_run_config({"model": {"family": "llama", "vocab_size": 270, "n_layer": 1, "d_model": 32,
                                     "n_head": 4, "context_length": 32, "ffn_multiple_of": 32}})
    save_checkpoint(tmp_path / "run", cfg, Transformer(cfg.model), {"step": 1, "tokens": 1}, {"step": 1, "tokens": 1},
                    tmp_path / "tokenizer.json", keep_last=1)
    assert main(["generate", str(tmp_path / "run"), "--chat", "--prompt", "Hi"]) == 2
    err = capsys.readouterr().err
    assert "<|im_start|>" in err and err.count("\n") == 1


def test_ctrl_c_stops_the_answer_not_the_session_and_an_empty_answer_is_not_kept(chat_model, monkeypatch):
    model, tokenizer = chat_model
    replies = iter([["Pa", KeyboardInterrupt], [], ["ok"]])
    prompts = []

    def fake_reply(model, tokenizer, ids, max_new_tokens, **sampling):
        prompts.append(list(ids))
        for piece in next(replies):
            if piece is KeyboardInterrupt:
                raise KeyboardInterrupt
            yield piece

    monkeypatch.setattr(chat_module, "stream_reply", fake_reply)
    out = io.StringIO()
    lines = iter(["one", "two", "three"])

    def read(_):
        try:
            return next(lines)
        except StopIteration:
            raise EOFError from None

    chat_loop(model, tokenizer, dict(GREEDY), read=read, out=out)
    assert "bot> Pa [stopped]\n" in out.getvalue() and "bot> ok\n" in out.getvalue()
    user = [{"role": "user", "content": t} for t in ("one", "two", "three")]
    stopped = {"role": "assistant", "content": "Pa"}
    # The stopped answer stays in the history; "two", answered with nothing, does not.
    assert prompts[2] == encode_prompt(tokenizer, [user[0], stopped, user[2]])


def test_stream_reply_checks_its_settings_before_streaming(chat_model):
    model, tokenizer = chat_model
    ids, _ = chat_prompt(tokenizer, [{"role": "user", "content": "Hi"}], 64, 5)
    with pytest.raises(BurnoutError, match="top-p"):
        stream_reply(model, tokenizer, ids, 5, top_p=1.5)
