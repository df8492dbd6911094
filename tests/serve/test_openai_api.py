"""`burnout serve` as its users meet it: a real server process, talked to with the official `openai` client (and
with plain HTTP where a client would never send such a request)."""

import asyncio
import contextlib
import http.client
import json
import os
import re
import subprocess
import sys
import threading
import urllib.parse
from pathlib import Path

import httpx
import openai
import pytest

from burnout.core.chat_template import encode_prompt
from burnout.core.model_files import load_model
from burnout.errors import BurnoutError
from burnout.generate.sampling import generate_text
from burnout.serve.openai_api import MAX_BODY_BYTES, MAX_DEPTH, APIError, Gate, _key_bytes, build_app, load_served

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


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
def test_an_api_key_is_required_when_set(tiny_run):
    with running_server(tiny_run.run_dir, "--api-key", "s3cret") as (url, name, proc):
        with pytest.raises(openai.AuthenticationError):
            client(url).models.list()
        with pytest.raises(openai.AuthenticationError):
            client(url, "wrong").models.list()
        assert [m.id for m in client(url, "s3cret").models.list().data] == [name]


@pytest.mark.slow
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


@pytest.mark.slow
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


# ----------------------------------------------------------------------------------------------
# The security list: the key, the body's size, depth and text, and usage over every choice.

KEY = "s3cret-Key_9"


@pytest.fixture(scope="module")
def keyed_server(tiny_run):
    with running_server(tiny_run.run_dir, "--api-key", KEY) as server:
        yield server


@pytest.mark.slow
@pytest.mark.parametrize("authorization", [
    None, b"", b"Bearer ", b"Bearer s", b"Bearer s3cret-Key_", b"Bearer S3CRET-KEY_9", b"Bearer s3cret-key_9",
    b"Bearer s3cret-Key_9x", b"Bearer s3cret-Key_9 s3cret-Key_9", b"Bearer s3cret-Key_9\\", b"Basic s3cret-Key_9",
    "Bearer s3cret-Kéy_9".encode(), "Bearer s3cret-Key_9é".encode(), b"Bearer s3cret-Key_9\xe9", b"Bearer \xff",
], ids=lambda a: "no header" if a is None else repr(a))
def test_only_exactly_the_key_gets_in(keyed_server, authorization):
    """Sent with http.client, which sends a header's bytes as given (httpx refuses some of these)."""
    url, name, _ = keyed_server

    def request(method: str, path: str, authorization: bytes | None) -> tuple[int, dict]:
        address = urllib.parse.urlsplit(url)
        connection = http.client.HTTPConnection(address.hostname, address.port, timeout=60)
        body = json.dumps({"model": name, "prompt": "The ", "max_tokens": 1}) if method == "POST" else None
        headers = {} if authorization is None else {"Authorization": authorization}
        try:
            connection.request(method, f"{address.path}{path}", body, headers)
            response = connection.getresponse()
            return response.status, json.loads(response.read())
        finally:
            connection.close()

    for method, path in [("GET", "/models"), ("POST", "/completions")]:
        status, answer = request(method, path, authorization)
        assert status == 401 and answer["error"]["code"] == "invalid_api_key", answer
        status, answer = request(method, path, f"Bearer {KEY}".encode())
        assert status == 200, answer


@pytest.mark.parametrize("key", ["clé", "ключ", "", "   ", " s3cret", "s3cret ", "a\tb", "a\nb", "a\x7fb"])
def test_a_key_no_client_could_send_is_refused(key):
    with pytest.raises(BurnoutError) as refused:
        _key_bytes(key)
    assert str(refused.value).startswith("--api-key") and "\n" not in str(refused.value)
    assert not key.strip() or key.strip() not in str(refused.value)  # the key itself is not printed


@pytest.mark.parametrize("key", [KEY, "a b", "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"])
def test_a_key_of_printable_ascii_is_taken_as_its_bytes(key):
    assert _key_bytes(key) == key.encode("ascii")


@pytest.mark.slow
def test_a_non_ascii_or_empty_key_is_refused_at_start_in_one_line(tiny_run):
    env = {k: v for k, v in os.environ.items() if k != "BURNOUT_API_KEY"}
    non_ascii = subprocess.run([sys.executable, "-m", "burnout", "serve", str(tiny_run.run_dir), "--port", "0",
                                "--api-key", "clé-secrète"], capture_output=True, text=True, timeout=120, env=env)
    empty = subprocess.run([sys.executable, "-m", "burnout", "serve", str(tiny_run.run_dir), "--port", "0"],
                           capture_output=True, text=True, timeout=120, env={**env, "BURNOUT_API_KEY": ""})
    for result, fragment in [(non_ascii, "character 3 is not printable ASCII"), (empty, "is empty")]:
        assert result.returncode == 2 and fragment in result.stderr, result.stderr
        assert len(result.stderr.strip().splitlines()) == 1 and "serving" not in result.stdout, result.stderr
    assert "clé" not in non_ascii.stderr


def _padded(body: dict, size: int) -> bytes:
    """`body` as JSON, padded with spaces (still JSON) to exactly `size` bytes."""
    raw = json.dumps(body).encode()
    return raw + b" " * (size - len(raw))


def _chunks(raw: bytes, size: int = 65536):
    """`raw` as an upload of unknown length: httpx sends a generator chunked, without Content-Length."""
    for i in range(0, len(raw), size):
        yield raw[i:i + size]


def test_a_body_of_exactly_the_bound_is_read_and_one_byte_more_is_413_chunked_or_not(base_server):
    url, name, _ = base_server
    at_bound = _padded({"model": name, "prompt": "The ", "max_tokens": 1}, MAX_BODY_BYTES)
    over = _padded({"model": name, "prompt": "The ", "max_tokens": 1}, MAX_BODY_BYTES + 1)
    sized = [httpx.post(f"{url}/completions", content=raw, timeout=60) for raw in (at_bound, over)]
    chunked = [httpx.post(f"{url}/completions", content=_chunks(raw), timeout=60)
               for raw in (at_bound, over, b" " * (4 * MAX_BODY_BYTES))]
    assert "content-length" not in chunked[0].request.headers  # the premise: sent without a length
    assert [r.status_code for r in sized] == [200, 413], sized[1].text
    assert [r.status_code for r in chunked] == [200, 413, 413], [r.text for r in chunked]
    assert chunked[1].json()["error"]["message"] == f"the body is over {MAX_BODY_BYTES:,} bytes"


def test_an_endless_chunked_body_is_read_only_to_the_bound(tiny_run):
    """The app itself, fed an upload that never ends: it answers 413 having taken at most the bound and one chunk
    more from the connection (uvicorn reads from the socket only as the app asks)."""
    app = build_app(load_served(tiny_run.run_dir))
    chunk, pulled, sent = b"{" + b" " * 65535, 0, []

    async def receive():
        nonlocal pulled
        pulled += len(chunk)
        return {"type": "http.request", "body": chunk, "more_body": pulled < 64 * MAX_BODY_BYTES}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": "/v1/completions", "raw_path": b"/v1/completions", "root_path": "", "query_string": b"",
             "headers": [(b"host", b"127.0.0.1"), (b"transfer-encoding", b"chunked")],
             "client": ("127.0.0.1", 5000), "server": ("127.0.0.1", 8000)}
    asyncio.run(app(scope, receive, send))
    assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 413
    assert MAX_BODY_BYTES < pulled <= MAX_BODY_BYTES + len(chunk)


def _deep(levels: int) -> str:
    return "[" * levels + "]" * levels


def test_a_body_nested_too_deep_is_a_400_naming_its_field(base_server):
    url, name, _ = base_server
    head = f'{{"model": "{name}", "prompt": "The ", "max_tokens": 1'
    cases = [  # (body, the field it must name); the body itself is one level
        (f'{{"model": "{name}", "prompt": {_deep(100_000)}}}', "prompt"),
        (f'{head}, "tools": {_deep(MAX_DEPTH)}}}', "tools"),
        (f'{head}, "a\\"b": "x", "c": "{_deep(MAX_DEPTH)}", "user": {{"d": {_deep(MAX_DEPTH - 1)}}}}}', "user"),
        (_deep(5000), "body"),
    ]
    for body, field in cases:
        response = httpx.post(f"{url}/completions", content=body.encode(), timeout=60)
        error = response.json()["error"]
        assert response.status_code == 400 and error["param"] == field, response.text[:300]
        assert error["message"].startswith(f"{field}: nested more than {MAX_DEPTH} ")
    # MAX_DEPTH levels, and more brackets than that beside them, are fine.
    deepest = f'{head}, "tools": {_deep(MAX_DEPTH - 1)}, "user": [[], {{}}, "]]]"]}}'
    deepest_allowed = httpx.post(f"{url}/completions", content=deepest.encode(), timeout=60)
    assert deepest_allowed.status_code == 200, deepest_allowed.text


def test_text_that_is_not_unicode_is_a_400_naming_its_field(base_server, chat_server):
    url, name, _ = base_server
    cases = [  # (raw body, the field it must name, a fragment of the message)
        (f'{{"model": "{name}", "prompt": "a\\ud800b"}}', "prompt", "\\ud800, half of a surrogate pair"),
        (f'{{"model": "{name}", "prompt": ["The ", "\\uDFFF"]}}', "prompt.1", "\\udfff"),
        (f'{{"model": "{name}\\udc00", "prompt": "The "}}', "model", "\\udc00"),
        (f'{{"model": "{name}", "prompt": "The ", "stop": ["\\ud83d"]}}', "stop.0", "\\ud83d"),
        (f'{{"model": "{name}", "prompt": "The ", "user": {{"k\\ud800": 1}}}}', "user.k\\ud800", "\\ud800"),
        (f'{{"model": "{name}", "prompt": "a'.encode() + b'\xff"}', "prompt", "the byte 0xff, which is not UTF-8"),
        (f'{{"model": "{name}", "prompt": ["The ", "'.encode() + "é".encode("latin-1") + b'"]}', "prompt.1",
         "the byte 0xe9"),
    ]
    for body, field, fragment in cases:
        raw = body if isinstance(body, bytes) else body.encode()
        response = httpx.post(f"{url}/completions", content=raw, timeout=60)
        assert response.status_code == 400 and response.json()["error"]["param"] == field, response.text
        assert response.json()["error"]["message"].startswith(f"{field}: holds ") and fragment in response.text
    not_json = httpx.post(f"{url}/completions", content=b'{"model": \xff}', timeout=60)
    assert not_json.status_code == 400 and "not JSON" in not_json.json()["error"]["message"]
    # A surrogate pair is one character (an emoji), and an escaped backslash before "ud800" is plain text.
    for prompt in ['"\\ud83d\\ude00 The "', '"C:\\\\ud800 "']:
        fine = httpx.post(f"{url}/completions", timeout=60,
                          content=f'{{"model": "{name}", "prompt": {prompt}, "max_tokens": 1}}'.encode())
        assert fine.status_code == 200, fine.text
    chat_url, chat_name, _ = chat_server
    chat = httpx.post(f"{chat_url}/chat/completions", timeout=60, content=(
        f'{{"model": "{chat_name}", "messages": [{{"role": "user", "content": "Hi \\udbff"}}]}}').encode())
    assert chat.status_code == 400 and chat.json()["error"]["param"] == "messages.0.content", chat.text


@pytest.mark.parametrize("field", ["max_tokens", "n", "seed", "temperature", "top_p"])
@pytest.mark.parametrize("value", [True, False])
def test_true_or_false_is_not_a_number(base_server, chat_server, field, value):
    url, name, _ = base_server
    response = httpx.post(f"{url}/completions", json={"model": name, "prompt": "The ", field: value}, timeout=60)
    error = response.json()["error"]
    assert response.status_code == 400 and error["param"] == field, response.text
    assert error["message"] == f"{field}: true or false is not a number; send a number"
    if field == "max_tokens":
        chat_url, chat_name, _ = chat_server
        chat = httpx.post(f"{chat_url}/chat/completions", timeout=60, json={
            "model": chat_name, "messages": [{"role": "user", "content": "Hi"}], "max_completion_tokens": value})
        assert chat.status_code == 400 and chat.json()["error"]["param"] == "max_completion_tokens", chat.text


def test_usage_counts_every_prompt_once_and_every_choice(tiny_run, base_server, chat_checkpoint, chat_server):
    """Two prompts × n=2, the long prompt's choices cut by the context: each choice ends by length, so it has
    min(max_tokens, context - its prompt) tokens, different for the two prompts."""
    model, tokenizer, _ = load_model(tiny_run.run_dir)
    prompts, max_tokens = ["The ", "The king " * 12], 20
    lengths = [len(tokenizer.encode(p).ids) for p in prompts]
    rooms = [min(max_tokens, model.cfg.context_length - n) for n in lengths]
    assert rooms[0] != rooms[1], "the premise: the two prompts' choices get different numbers of tokens"
    url, name, _ = base_server
    request = {"model": name, "prompt": prompts, "n": 2, "max_tokens": max_tokens, "temperature": 1, "seed": 3}
    plain = client(url).completions.create(**request)
    streamed = list(client(url).completions.create(**request, stream=True, stream_options={"include_usage": True}))
    assert [c.finish_reason for c in plain.choices] == ["length"] * 4, plain.choices
    expected = {"prompt_tokens": sum(lengths), "completion_tokens": 2 * sum(rooms),
                "total_tokens": sum(lengths) + 2 * sum(rooms)}
    assert plain.usage.model_dump(include=set(expected)) == expected
    assert streamed[-1].usage.model_dump(include=set(expected)) == expected
    chat_url, chat_name, _ = chat_server
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    chat = client(chat_url).chat.completions.create(model=chat_name, messages=messages, n=3, temperature=0)
    chat_tokenizer = load_model(chat_checkpoint.run_dir)[1]
    assert [c.message.content for c in chat.choices] == [chat_checkpoint.answer] * 3
    assert chat.usage.prompt_tokens == len(encode_prompt(chat_tokenizer, messages))
    assert chat.usage.completion_tokens == 3 * len(chat_checkpoint.answer_ids)
