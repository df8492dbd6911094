"""The playground's chat: chat checkpoints found as such, answers in the template up to <|im_end|>, a base model
beside them on a plain transcript, the browser's history bounded, the France example on the Chat tab."""

import pytest

from burnout.core.chat_template import encode_prompt
from burnout.errors import BurnoutError
from burnout.playground import catalog
from burnout.playground.catalog import MAX_HISTORY_CHARS, ModelCache, conversation, discover, stream_chat

GRADIO_HISTORY = [{"role": "user", "metadata": None, "content": [{"text": "Hi", "type": "text"}], "options": None},
                  {"role": "assistant", "metadata": None, "content": [{"text": "Paris.", "type": "text"}]}]


@pytest.fixture(scope="module")
def cache(chat_checkpoint, sampled_runs):
    entries = discover([chat_checkpoint.run_dir, sampled_runs[0]])
    return ModelCache(entries, 10**9)


def test_discover_tells_chat_checkpoints_from_base_ones(cache):
    assert {label: entry.chat for label, entry in cache.entries.items()} == {
        "chat · step 10": True, "fast · step 8": False, "fast · step 16": False, "fast · step 24": False}
    assert cache.get("chat · step 10").chat and not cache.get("fast · step 24").chat


def test_a_chat_model_answers_in_its_template_and_stops_at_im_end(cache, chat_checkpoint, monkeypatch):
    loaded = cache.get("chat · step 10")
    prompts = []
    real = catalog.stream_reply
    monkeypatch.setattr(catalog, "stream_reply",
                        lambda m, t, ids, n, **s: prompts.append(ids) or real(m, t, ids, n, **s))
    texts = list(stream_chat(loaded, GRADIO_HISTORY, "And Italy?", 6, system="Be brief.", temperature=0.1, top_k=50))
    assert texts[0] == "" and texts[-1] == chat_checkpoint.answer  # 6 tokens would be "Paris.Paris."
    assert all(b.startswith(a) for a, b in zip(texts, texts[1:]))
    assert prompts == [encode_prompt(loaded.tokenizer, [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Paris."}, {"role": "user", "content": "And Italy?"}])]


def test_a_base_model_continues_a_plain_transcript(cache, monkeypatch):
    seen = []
    real = catalog.sampling_stream_text
    monkeypatch.setattr(catalog, "sampling_stream_text",
                        lambda m, t, prompt, n, **s: seen.append((prompt, s["stop"])) or real(m, t, prompt, n, **s))
    texts = list(stream_chat(cache.get("fast · step 24"), GRADIO_HISTORY, "And Italy?", 8, seed=0))
    assert seen == [("User: Hi\nAssistant: Paris.\nUser: And Italy?\nAssistant:", ("\nUser:",))]
    assert texts[0] == "" and "\nUser:" not in texts[-1]


def test_history_from_the_browser_is_bounded_and_cleaned():
    history = [*GRADIO_HISTORY, {"role": "assistant", "content": ""}, "junk", {"role": "tool", "content": "x"},
               {"role": "user", "content": "Bye"}]
    assert conversation(history, "Next", "sys") == [
        {"role": "system", "content": "sys"}, {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Paris."}, {"role": "user", "content": "Bye"},
        {"role": "user", "content": "Next"}]
    long = [{"role": "user", "content": "x" * 1000}] * (2 * MAX_HISTORY_CHARS // 1000)
    kept = conversation(long, "Next")
    assert sum(len(m["content"]) for m in kept) <= MAX_HISTORY_CHARS and len(kept) > 10


@pytest.mark.parametrize("message, max_new, system, match", [
    ("  ", 5, "", "message is empty"), ("x" * 2001, 5, "", "at most"),
    ("Hi", 0, "", r"max new tokens: 0 must be in \[1, "),
    ("Hi", 5, "s" * 2001, "system prompt is"), ("Hi " * 40, 5, "", "context is 64"),
])
def test_bad_chat_requests_are_one_line(cache, message, max_new, system, match):
    with pytest.raises(BurnoutError, match=match) as excinfo:
        next(stream_chat(cache.get("chat · step 10"), [], message, max_new, system=system))
    assert "\n" not in str(excinfo.value)


def examples(app, tab: str) -> list[str]:
    """The examples (gr.Examples) that the app shows on its tab `tab`."""
    found = []
    for block in app.blocks.values():
        if type(block).__name__ == "Dataset":  # gr.Examples' table
            parent = block.parent
            while parent is not None and getattr(parent, "label", None) not in ("Generate", "Chat"):
                parent = parent.parent
            if parent is not None and parent.label == tab:
                found += [row[0] for row in block.samples]
    return found


def test_the_france_example_is_on_the_chat_tab_when_a_chat_model_is_served(cache, sampled_runs):
    from burnout.playground.app import CHAT_EXAMPLES, build_app

    with_chat = build_app(cache.entries, cache)
    assert "What is the capital of France?" in examples(with_chat, "Chat")
    assert "What is the capital of France?" not in examples(with_chat, "Generate")
    base_entries = discover(sampled_runs[:1])
    base_only = build_app(base_entries, ModelCache(base_entries, 10**9))
    assert examples(base_only, "Chat") == [] and CHAT_EXAMPLES[0] in examples(base_only, "Generate")


def test_the_chat_tabs_examples_are_the_chat_runs_held_out_questions(chat_run, sampled_runs, fine_tune_data):
    """A chat run fine-tuned on conversations offers the questions of its first held-out ones, found again in the
    conversations file by their place in it (red when the Chat tab shows the general questions instead)."""
    import json

    import numpy as np

    from burnout.playground.app import build_app
    from burnout.playground.catalog import EXAMPLE_DOCUMENTS

    entries = discover([chat_run, sampled_runs[0]])
    held_out = np.load(chat_run / "data" / "val_index.npy")[:EXAMPLE_DOCUMENTS]
    conversations = [json.loads(line)["messages"] for line in fine_tune_data.chats.read_text().splitlines()]
    assert len(held_out) > 0
    chat_examples = examples(build_app(entries, ModelCache(entries, 10**9)), "Chat")
    assert chat_examples == [conversations[i][0]["content"] for i in held_out]
