"""The playground's API (burnout/playground/app.py) fed bad requests over HTTP, as any client may send them: each
is answered with one line naming the field, and the server's terminal gets one line for it, not a traceback.
Before, Gradio's own preprocessing answered a number sent as text, a missing field or a malformed chat history
with {"error": null} and printed a traceback for each."""

import json

import httpx
import pytest

FAST = "fast · step 24"
SAMPLING = [0.8, 50, 1.0, 1.0]  # temperature, top-k, top-p, repetition penalty

# (endpoint, the request's values, fragments of the one-line answer)
BAD_REQUESTS = [
    ("generate", [FAST, "The ", 8, "nan", *SAMPLING[1:]],
     ["temperature: 'nan' is not a number; send a number from 0.1 to 1.5"]),
    ("generate", [FAST, "The ", "8", *SAMPLING], ["max new tokens: '8' is not a number"]),
    ("generate", [FAST, "The ", 8, 99, *SAMPLING[1:]], ["temperature: 99 must be in [0.1, 1.5]"]),
    ("generate", [FAST, "The ", 8], ["the request has no value for 'temperature'", "takes 7 values"]),
    ("generate", [FAST, None, 8, *SAMPLING], ["the prompt must be text"]),
    ("generate", ["runs/../secret", "The ", 8, *SAMPLING], ["checkpoint: 'runs/../secret' is not one of its choices"]),
    ("side_by_side", [FAST, "The ", 8, *SAMPLING], ["checkpoints (2 or 3): 'fast · step 24' is not a list of its"]),
    ("chat_turn", ["chat · step 10", "(none)", "", "Hi", "garbage", [], 8, *SAMPLING],
     ["chat model: the chat history is malformed (Input should be a valid list)"]),
    ("chat_turn", ["chat · step 10", "(none)", "", "Hi", [{"role": "user"}], [], 8, *SAMPLING],
     ["chat model: the chat history is malformed (message 1 content: Field required)"]),
]


def _call(url: str, endpoint: str, values: list) -> tuple[str, object]:
    """POST a request to the endpoint as any HTTP client may; the (event, data) it ends with."""
    started = httpx.post(f"{url}gradio_api/call/{endpoint}", json={"data": values}, timeout=30)
    started.raise_for_status()
    stream = httpx.get(f"{url}gradio_api/call/{endpoint}/{started.json()['event_id']}", timeout=120).text
    lines = stream.strip().splitlines()
    return lines[-2].removeprefix("event: "), json.loads(lines[-1].removeprefix("data: "))


@pytest.mark.slow
def test_bad_requests_are_refused_in_one_line_naming_the_field_and_the_terminal_gets_one_line_each(
        sampled_runs, chat_checkpoint, start_playground):
    with start_playground([sampled_runs[0], chat_checkpoint.run_dir]) as (url, proc):
        answers = [_call(url, endpoint, values) for endpoint, values, _ in BAD_REQUESTS]
        healthy = _call(url, "generate", [FAST, "The ", 4, *SAMPLING])
    log = proc.stdout.read()
    for (endpoint, values, fragments), (event, data) in zip(BAD_REQUESTS, answers):
        assert event == "error", (endpoint, values, event, data)
        message = data["error"]
        assert isinstance(message, str) and "\n" not in message, (endpoint, values, data)
        for fragment in fragments:
            assert fragment in message, (endpoint, values, message)
    assert "Traceback" not in log, log[-3000:]
    refusals = [line.removeprefix("playground: refused a request: ") for line in log.splitlines()
                if line.startswith("playground: refused a request: ")]
    assert refusals == [data["error"] for _, data in answers]
    # The server still answers a good request afterwards.
    assert healthy[0] == "complete" and healthy[1][0].startswith("The ")


def test_the_api_names_each_endpoint_and_field(sampled_runs, chat_checkpoint):
    """What a client sees at /gradio_api/info: each endpoint under its name, each field under its own name and the
    label the page shows it with (not param_3 … param_6); the Generate tab's examples are the runs' own."""
    from burnout.playground.app import CHAT_EXAMPLES, build_app
    from burnout.playground.catalog import ModelCache, discover, example_prompts

    entries = discover([sampled_runs[0], chat_checkpoint.run_dir])
    app = build_app(entries, ModelCache(entries, 10**9))
    endpoints = app.get_api_info()["named_endpoints"]
    sampling = [("temperature", "temperature"), ("top_k", "top-k"), ("top_p", "top-p"),
                ("repetition_penalty", "repetition penalty")]
    expected = {
        "/generate": [("checkpoint", "checkpoint"), ("prompt", "prompt"), ("max_new_tokens", "max new tokens"),
                      *sampling],
        "/side_by_side": [("checkpoints", "checkpoints (2 or 3)"), ("prompt", "prompt"),
                          ("max_new_tokens", "max new tokens"), *sampling],
        "/chat_turn": [("chat_checkpoint", "chat checkpoint"),
                       ("base_checkpoint", "side by side with a base checkpoint"),
                       ("system", "system prompt (optional)"), ("message", "message (Enter sends)"),
                       ("history", "chat model"), ("base_history", "base model"), ("max_new_tokens", "max new tokens"),
                       *sampling],
        "/model_info": [("checkpoint", "checkpoint")],
    }
    assert {name: [(p["parameter_name"], p["label"]) for p in endpoint["parameters"]]
            for name, endpoint in endpoints.items()} == expected
    generate_examples = [row[0] for block in app.blocks.values() if type(block).__name__ == "Dataset"
                         for row in block.samples if row[0] not in CHAT_EXAMPLES]
    assert generate_examples == example_prompts(entries) and generate_examples[0] == "The "
