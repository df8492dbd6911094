"""`burnout serve` as its users meet it: a real server process, talked to with the official `openai` client (and
with plain HTTP where a client would never send such a request)."""

import contextlib
import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import openai
import pytest

from burnout.core.chat_template import encode_prompt
from burnout.core.model_files import load_model
from burnout.generate.sampling import generate_text
from burnout.serve.openai_api import MAX_BODY_BYTES, APIError, Gate

SERVING = re.compile(r"serving '(?P<name>[^']+)' .* at (?P<url>http://\S+/v1);")


@contextlib.contextmanager
def running_server(run, *options: str):
    """`burnout serve RUN --port 0 OPTIONS`; yields (base url, model name, process). Its first line says where it
    listens, once it listens: no polling."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("BURNOUT_API_KEY", None)
    proc = subprocess.Popen([sys.executable, "-m", "burnout", "serve", str(run), "--port", "0", *options],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        first = proc.stdout.readline()
        found = SERVING.search(first)
        if not found:
            pytest.fail(f"the server did not start: {first}{proc.communicate(timeout=30)[0]}")
        yield found["url"], found["name"], proc
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture(scope="module")
def base_server(tiny_run):
    """A server of tiny_run's newest checkpoint (a base model), shared by this module's tests."""
    with running_server(tiny_run.run_dir) as server:
        yield server


@pytest.fixture(scope="module")
def chat_server(chat_checkpoint):
    with running_server(chat_checkpoint.run_dir) as server:
        yield server


def client(url: str, key: str = "none") -> openai.OpenAI:
    return openai.OpenAI(base_url=url, api_key=key, max_retries=0, timeout=120)


def test_chat_completions_plain_and_streamed_answer_in_the_template_and_stop_at_im_end(chat_checkpoint, chat_server):
    model, tokenizer, _ = load_model(chat_checkpoint.run_dir)
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    url, name, _ = chat_server
    c = client(url)
    assert [m.id for m in c.models.list().data] == [name]
    plain = c.chat.completions.create(model=name, messages=messages, temperature=0)
    chunks = list(c.chat.completions.create(model=name, messages=messages, temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    choice = plain.choices[0]
    # The rig answers CHAT_ANSWER then <|im_end|>, and would start the answer again after it: only stopping at
    # <|im_end|> gives exactly the answer.
    assert choice.message.content == chat_checkpoint.answer and choice.finish_reason == "stop"
    assert choice.message.role == "assistant"
    assert plain.usage.prompt_tokens == len(encode_prompt(tokenizer, messages))
    assert plain.usage.completion_tokens == len(chat_checkpoint.answer_ids)
    assert plain.usage.total_tokens == plain.usage.prompt_tokens + plain.usage.completion_tokens
    streamed = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert streamed == chat_checkpoint.answer
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "stop"
    assert chunks[-1].usage.completion_tokens == plain.usage.completion_tokens and not chunks[-1].choices


def test_completions_equal_burnout_generate_and_end_by_length_or_stop_sequence(tiny_run, base_server):
    model, tokenizer, _ = load_model(tiny_run.run_dir)
    prompt = "The "
    expected = generate_text(model, tokenizer, prompt, 12, temperature=0)[len(prompt):]
    assert len(expected) > 4, "the tiny run must continue with some text for this test to mean anything"
    stop = expected[2:4]
    url, name, _ = base_server
    c = client(url)
    plain = c.completions.create(model=name, prompt=prompt, max_tokens=12, temperature=0)
    streamed = list(c.completions.create(model=name, prompt=prompt, max_tokens=12, temperature=0, stream=True))
    cut = c.completions.create(model=name, prompt=prompt, max_tokens=12, temperature=0, stop=[stop])
    seeded = [c.completions.create(model=name, prompt=prompt, max_tokens=12, temperature=1, seed=7, n=2)
              for _ in range(2)]
    assert plain.choices[0].text == expected
    assert plain.choices[0].finish_reason == "length" and plain.usage.completion_tokens == 12
    assert "".join(ch.choices[0].text for ch in streamed) == expected
    assert streamed[-1].choices[0].finish_reason == "length"
    assert cut.choices[0].text == expected[:expected.index(stop)] and cut.choices[0].finish_reason == "stop"
    # A seed makes a request repeatable; its n choices are sampled with seeds of their own.
    assert [ch.text for ch in seeded[0].choices] == [ch.text for ch in seeded[1].choices]
    assert [ch.index for ch in seeded[0].choices] == [0, 1]
    assert seeded[0].choices[0].text != seeded[0].choices[1].text


def test_bad_requests_get_openais_error_shape_and_status(tiny_run):
    with running_server(tiny_run.run_dir) as (url, name, proc):  # its own: the test reads all it printed
        c = client(url)
        with pytest.raises(openai.BadRequestError) as hot:
            c.completions.create(model=name, prompt="The ", temperature=5)
        with pytest.raises(openai.NotFoundError) as unknown:
            c.completions.create(model="gpt-4o", prompt="The ")
        with pytest.raises(openai.BadRequestError) as base_chat:
            c.chat.completions.create(model=name, messages=[{"role": "user", "content": "Hi"}])
        with pytest.raises(openai.BadRequestError) as too_long:
            c.completions.create(model=name, prompt="The " * 2000)
        not_json = httpx.post(f"{url}/completions", content=b"{not json", timeout=30)
        too_big = httpx.post(f"{url}/completions", content=b" " * (MAX_BODY_BYTES + 1), timeout=30)
        no_path = httpx.get(f"{url}/engines", timeout=30)
        healthy = c.completions.create(model=name, prompt="The ", max_tokens=2)
        proc.terminate()
        log = proc.communicate(timeout=30)[0]
    assert hot.value.status_code == 400 and hot.value.body["param"] == "temperature"
    assert unknown.value.status_code == 404 and name in unknown.value.body["message"]
    assert "use /v1/completions" in base_chat.value.body["message"]
    assert too_long.value.body["code"] == "context_length_exceeded"
    for response, status in [(not_json, 400), (too_big, 413), (no_path, 404)]:
        error = response.json()["error"]
        assert response.status_code == status and set(error) == {"message", "type", "param", "code"}, response.text
    assert healthy.choices[0].text is not None
    assert "Traceback" not in log, log


def test_an_api_key_is_required_when_set(tiny_run):
    with running_server(tiny_run.run_dir, "--api-key", "s3cret") as (url, name, proc):
        with pytest.raises(openai.AuthenticationError):
            client(url).models.list()
        with pytest.raises(openai.AuthenticationError):
            client(url, "wrong").models.list()
        assert [m.id for m in client(url, "s3cret").models.list().data] == [name]


def test_fifty_requests_from_ten_clients_are_answered_or_refused_with_429_and_the_server_stays_healthy(tiny_run):
    answers, refusals, other = [], [], []

    def one_client(c: openai.OpenAI, name: str) -> None:
        for _ in range(5):
            try:
                answers.append(c.completions.create(model=name, prompt="The ", max_tokens=4, temperature=0))
            except openai.RateLimitError as exc:
                refusals.append(exc.body)
            except Exception as exc:  # noqa: BLE001 (anything else is the failure this test looks for)
                other.append(repr(exc))

    with running_server(tiny_run.run_dir, "--queue-size", "2") as (url, name, proc):
        threads = [threading.Thread(target=one_client, args=(client(url), name)) for _ in range(10)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        after = client(url).completions.create(model=name, prompt="The ", max_tokens=4, temperature=0)
        # A stream, too, gives its place back when it ends: more streams one after another than the server
        # holds at once (1 running + 2 waiting) are all answered.
        streams = ["".join(ch.choices[0].text for ch in client(url).completions.create(
            model=name, prompt="The ", max_tokens=4, temperature=0, stream=True)) for _ in range(4)]
    assert not other and len(answers) + len(refusals) == 50
    assert len({a.choices[0].text for a in answers}) == 1  # greedy: every answer the same, none garbled
    assert all(r["code"] == "server_busy" for r in refusals)
    assert after.choices[0].text == answers[0].choices[0].text
    assert streams == [after.choices[0].text] * 4


def test_the_gate_admits_running_plus_waiting_requests_and_refuses_the_next():
    gate = Gate(running=1, waiting=2)
    for _ in range(3):
        gate.admit()
    with pytest.raises(APIError) as refused:
        gate.admit()
    assert refused.value.status == 429
    gate.leave()
    gate.admit()


def test_a_taken_port_or_a_missing_run_is_one_line(tiny_run, tmp_path):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        busy = subprocess.run([sys.executable, "-m", "burnout", "serve", str(tiny_run.run_dir), "--port", str(port)],
                              capture_output=True, text=True, timeout=120)
    missing = subprocess.run([sys.executable, "-m", "burnout", "serve", str(tmp_path / "nope")],
                             capture_output=True, text=True, timeout=120)
    for result, fragment in [(busy, f"cannot listen on 127.0.0.1:{port}"), (missing, "nope")]:
        assert result.returncode == 2 and fragment in result.stderr, result.stderr
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_stream_events_are_server_sent_events_ending_with_done(chat_server):
    url, name, _ = chat_server
    body = {"model": name, "messages": [{"role": "user", "content": "Hi"}], "stream": True, "temperature": 0}
    with httpx.stream("POST", f"{url}/chat/completions", json=body, timeout=60) as response:
        lines = [line for line in response.iter_lines() if line]
    assert response.headers["content-type"].startswith("text/event-stream")
    assert all(line.startswith("data: ") for line in lines) and lines[-1] == "data: [DONE]"
    first = json.loads(lines[0].removeprefix("data: "))
    assert first["object"] == "chat.completion.chunk" and first["choices"][0]["delta"]["role"] == "assistant"


def test_the_run_folder_is_left_as_it_was(tiny_run, base_server):
    before = {p: p.stat().st_mtime_ns for p in Path(tiny_run.run_dir).rglob("*")}
    url, name, _ = base_server
    client(url).completions.create(model=name, prompt="The ", max_tokens=2)
    assert {p: p.stat().st_mtime_ns for p in Path(tiny_run.run_dir).rglob("*")} == before
