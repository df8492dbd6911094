"""The Chat tab in a real browser: `burnout playground` serving a chat checkpoint and a base run, driven by
headless Chromium through Playwright through a two-turn conversation, the base model answering beside it.
The chat model is the rigged bigram of `chat_checkpoint` ("Paris." then <|im_end|>, every time)."""

import os
import re
import shutil
from pathlib import Path

import pytest
from playwright.sync_api import expect, sync_playwright

REPO_ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO_ROOT / "test-artifacts"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]


@pytest.fixture
def playground(chat_checkpoint, sampled_runs, start_playground):
    if not Path(CHROMIUM).is_file():
        message = f"Chromium not found at {CHROMIUM}; install it with `apt-get install -y chromium` (.ci/run does)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    with start_playground([chat_checkpoint.run_dir, sampled_runs[0]], "--concurrency", "2") as (url, _):
        yield url


def test_two_turn_conversation_in_chromium(playground, chat_checkpoint):
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 1100})
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

            shot = ARTIFACTS / "playground-chat.png"
            page.screenshot(path=str(shot), full_page=True)
            print(f"screenshot: {shot}")
        finally:
            browser.close()
    assert shot.stat().st_size > 10_000
