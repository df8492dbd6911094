"""The Chat tab in a real browser: `burnout playground` serving a chat checkpoint and a base run, driven by
headless Chromium through Playwright through a two-turn conversation, the base model answering beside it.
The chat model is the rigged bigram of `chat_checkpoint` ("Paris." then <|im_end|>, every time)."""

import re

import pytest
from playwright.sync_api import expect

pytestmark = pytest.mark.slow  # every test here trains, installs or drives a browser: not in `make test-fast`


@pytest.fixture
def playground(chat_checkpoint, sampled_runs, start_playground):
    with start_playground([chat_checkpoint.run_dir, sampled_runs[0]], "--concurrency", "2") as (url, _):
        yield url


def test_two_turn_conversation_in_chromium(chromium, playground, chat_checkpoint):
    page = chromium.new_page(1280, 1100)
    page.goto(playground)
    page.get_by_role("tab", name="Chat").click()
    expect(page.locator("#chat-checkpoint input")).to_have_value("chat · step 10")
    expect(page.locator("#chat-base input")).to_have_value("fast · step 24")

    # Turn 1: the example question, from the Chat tab's examples.
    page.get_by_role("button", name="What is the capital of France?").click()
    expect(page.locator("#chat-message textarea")).to_have_value("What is the capital of France?")
    page.get_by_role("button", name="Send", exact=True).click()
    chat_bot, base_bot = page.locator("#chat-bot"), page.locator("#base-bot")
    expect(chat_bot.locator(".message.bot")).to_have_count(1, timeout=60_000)
    expect(chat_bot.locator(".message.bot").first).to_have_text(re.compile(r"^\s*Paris\.\s*$"))
    expect(page.locator(".generating")).to_have_count(0, timeout=60_000)
    expect(page.locator("#chat-message textarea")).to_have_value("")

    # Turn 2: typed, sent with Enter; the history holds both turns, each answer ended at <|im_end|>.
    page.locator("#chat-message textarea").fill("And the capital of Italy?")
    page.locator("#chat-message textarea").press("Enter")
    expect(chat_bot.locator(".message.bot")).to_have_count(2, timeout=60_000)
    expect(page.locator(".generating")).to_have_count(0, timeout=60_000)
    expect(chat_bot.locator(".message.user")).to_have_text([re.compile("capital of France"),
                                                            re.compile("capital of Italy")])
    expect(chat_bot.locator(".message.bot")).to_have_text([re.compile(r"^\s*Paris\.\s*$")] * 2)
    # The base model beside it got the same two messages.
    expect(base_bot.locator(".message.user")).to_have_count(2)

    chromium.keep_screenshot(page, "playground-chat.png")
