"""The playground in a real browser: `burnout playground` serving two trained runs, driven by headless
Chromium through Playwright. The screenshot is kept in test-artifacts/ for a person to look at."""

import re

import pytest
from playwright.sync_api import expect

pytestmark = pytest.mark.slow  # every test here trains, installs or drives a browser: not in `make test-fast`


@pytest.fixture
def playground(sampled_runs, start_playground):
    with start_playground(sampled_runs, "--concurrency", "2") as (url, _):
        yield url


def test_playground_in_chromium(chromium, playground):
    page = chromium.new_page(1280, 1000)
    page.goto(playground)

    # Choose a checkpoint: the model info panel follows.
    page.locator("#checkpoint input").click()
    page.get_by_role("option", name="fast · step 16").click()
    info = page.locator("#model-info")
    expect(info).to_contain_text("step 16")
    expect(info).to_contain_text("parameters")
    expect(info).to_contain_text("val loss")

    # Type a prompt, generate, read the streamed text.
    page.locator("#prompt textarea").fill("The ")
    page.get_by_role("button", name="Generate", exact=True).click()
    output = page.locator("#output textarea")
    expect(output).to_have_value(_longer_than("The "), timeout=60_000)
    assert output.input_value().startswith("The ")

    # Side by side: one prompt to two checkpoints of different runs.
    page.get_by_role("tab", name="Side by side").click()
    boxes = page.locator("#compare-checkpoints")
    for label in ("slow · step 8", "slow · step 16", "slow · step 24"):
        checkbox = boxes.get_by_label(label)
        if checkbox.is_checked():
            checkbox.uncheck()
    boxes.get_by_label("fast · step 8").check()
    boxes.get_by_label("slow · step 24").check()
    page.locator("#compare-prompt textarea").fill("def ")
    page.get_by_role("button", name="Generate side by side").click()
    for i in (0, 1):
        expect(page.locator(f"#compare-output-{i} textarea")).to_have_value(_longer_than("def "),
                                                                            timeout=60_000)
    expect(page.locator("#compare-output-0")).to_contain_text("fast · step 8")
    expect(page.locator("#compare-output-1")).to_contain_text("slow · step 24")
    expect(page.locator("#compare-output-2")).to_be_hidden()

    expect(page.locator(".generating")).to_have_count(0, timeout=60_000)  # streams finished
    chromium.keep_screenshot(page, "playground.png")


def _longer_than(prompt: str):
    """A regex for a value that starts with the prompt and continues it."""
    return re.compile("^" + re.escape(prompt) + r"[\s\S]+")
