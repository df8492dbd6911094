"""`burnout serve RUN`: a run's newest checkpoint (or a checkpoint folder) behind the OpenAI API, so that the
`openai` client and the tools built on it talk to a model you trained.

    GET  /v1/models             the one model served, named after its run folder (or --name)
    POST /v1/completions        text continued, by a base or a chat model
    POST /v1/chat/completions   a conversation answered in the model's ChatML template (chat models: `burnout sft`)
    GET  /health                {"status": "ok"}

Requests take OpenAI's fields: max_tokens (max_completion_tokens), temperature, top_p, stop (up to 4 strings), n,
seed, stream (server-sent events) and stream_options.include_usage; fields we do not use are ignored, as other
OpenAI-compatible servers ignore them. A max_tokens beyond what the context leaves is cut to fit, and the choice
then ends with finish_reason "length"; a prompt that fills the context is refused. Errors come in OpenAI's shape,
{"error": {"message", "type", "param", "code"}}, with its status codes: 400 a bad request, 401 a missing or wrong
API key, 404 an unknown model or path, 413 a body over MAX_BODY_BYTES, 429 when the queue is full, 500 our fault.
A body is JSON in UTF-8, at most MAX_DEPTH levels deep, its text valid Unicode; a number is not true or false.

--concurrency generations run at once (default 1: on a CPU one already uses every core) and up to --queue-size
more wait; a request beyond those is refused at once with 429 rather than left to time out.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
import re
import socket
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from burnout.base.files import EOT_TOKEN
from burnout.base.text import first_line, install_extra
from burnout.base.values import SEED_MAX
from burnout.errors import BurnoutError

try:
    import pydantic
    import pydantic_core
    import uvicorn
    from starlette.applications import Starlette
    from starlette.concurrency import iterate_in_threadpool, run_in_threadpool
    from starlette.exceptions import HTTPException
    from starlette.requests import Request
    from starlette.responses import JSONResponse, StreamingResponse
    from starlette.routing import Route
except ImportError:
    raise BurnoutError(f"burnout serve needs Starlette and uvicorn; {install_extra('serve')}") from None

from burnout.core.chat_template import chat_token_ids, encode_prompt, is_chat_model  # noqa: E402
from burnout.core.checkpoint import run_dir_of  # noqa: E402
from burnout.core.model_files import load_model  # noqa: E402
from burnout.data.tokenizer import encode_text  # noqa: E402
from burnout.generate.sampling import check_sampling, stream_continuation  # noqa: E402

MAX_BODY_BYTES = 1 << 20
# Levels of arrays and objects in a body (the body itself is one); OpenAI's requests, tool schemas included, need
# far fewer, and Python's JSON parser recurses once per level.
MAX_DEPTH = 100
# Choices in one request: prompts × n.
MAX_CHOICES = 16
MAX_STOPS = 4


# ----------------------------------------------------------------------------------------------
# Requests


def _not_a_boolean(value):
    """JSON's true and false are not numbers (pydantic would take true as 1): refused in a number's field."""
    if isinstance(value, bool):
        raise pydantic_core.PydanticCustomError("bool_type", "true or false is not a number; send a number")
    return value


_Int = Annotated[int, pydantic.BeforeValidator(_not_a_boolean)]
_Float = Annotated[float, pydantic.BeforeValidator(_not_a_boolean)]


class _Request(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="ignore")

    model: str
    max_tokens: _Int | None = pydantic.Field(None, ge=1)
    temperature: _Float = pydantic.Field(1.0, ge=0, le=2, allow_inf_nan=False)
    top_p: _Float = pydantic.Field(1.0, gt=0, le=1, allow_inf_nan=False)
    n: _Int = pydantic.Field(1, ge=1, le=MAX_CHOICES)
    stop: str | list[str] | None = pydantic.Field(None, validate_default=True)  # a list once validated
    seed: _Int | None = pydantic.Field(None, ge=0, le=SEED_MAX)
    stream: bool = False
    stream_options: dict | None = None

    @pydantic.field_validator("stop")
    @classmethod
    def _stops(cls, stop):
        stops = [stop] if isinstance(stop, str) else stop or []
        if len(stops) > MAX_STOPS:
            raise ValueError(f"at most {MAX_STOPS} stop sequences")
        if not all(stops):
            raise ValueError("a stop sequence is empty")
        return stops

    def sampling(self, choice: int) -> dict:
        """stream_continuation's settings for choice number `choice`: with a seed, each choice its own."""
        seed = None if self.seed is None else (self.seed + choice) % (SEED_MAX + 1)
        return {"temperature": self.temperature, "top_p": None if self.top_p == 1 else self.top_p, "seed": seed}

    @property
    def include_usage(self) -> bool:
        return bool((self.stream_options or {}).get("include_usage"))


class CompletionRequest(_Request):
    prompt: str | list[str]
    max_tokens: _Int | None = pydantic.Field(16, ge=1)  # OpenAI's default for completions

    @property
    def prompts(self) -> list[str]:
        return [self.prompt] if isinstance(self.prompt, str) else self.prompt


class ChatRequest(_Request):
    messages: list[dict]
    max_completion_tokens: _Int | None = pydantic.Field(None, ge=1)


class APIError(Exception):
    """An error for the client, sent in OpenAI's shape."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.kind, self.param, self.code = status, message, kind, param, code

    def response(self) -> JSONResponse:
        return error_response(self.status, self.message, self.kind, self.param, self.code)


def error_response(status: int, message: str, kind: str = "invalid_request_error", param: str | None = None,
                   code: str | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": code}},
                        status_code=status)


async def _parsed(request: Request, model: type[_Request]) -> _Request:
    body = _json_body(await request.body())
    try:
        return model.model_validate(body)
    except pydantic.ValidationError as exc:
        error = exc.errors()[0]
        param = ".".join(str(part) for part in error["loc"]) or None
        raise APIError(400, f"{param or 'body'}: {error['msg']}", param=param) from None


# A JSON string once its escapes are blanked (unterminated, the rest of the body: then it is not JSON), or a bracket.
_JSON_TOKEN = re.compile(rb'"[^"]*"?|[][{}]')
_SURROGATE = re.compile("[\ud800-\udfff]")
# A \u escape of a surrogate, which JSON allows alone although it is no character.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def _json_body(raw: bytes) -> object:
    """A request's body parsed as JSON in UTF-8, or a 400 naming the field at fault: nested deeper than MAX_DEPTH
    (Python's parser would overflow its stack), or text that is not Unicode (bytes that are not UTF-8, a lone
    surrogate), which the tokenizer and the response's own UTF-8 cannot take."""
    deep = _too_deep(raw)
    if deep:
        raise APIError(400, f"{deep}: nested more than {MAX_DEPTH} arrays or objects deep; send a flatter body",
                       param=deep)
    text = raw.decode("utf-8-sig", "surrogateescape")  # a byte that is not UTF-8 becomes a lone surrogate
    try:
        body = json.loads(text)
    except ValueError:
        raise APIError(400, "the body is not JSON; send a JSON object") from None
    found = _surrogate_in(body) if _SURROGATE.search(text) or _SURROGATE_ESCAPE.search(raw) else None
    if found:
        path, char = found
        what = (f"the byte 0x{ord(char) - 0xDC00:02x}, which is not UTF-8; send the body encoded as UTF-8"
                if char in text  # strict UTF-8 never decodes to a surrogate: this one was a byte
                else f"\\u{ord(char):04x}, half of a surrogate pair, which is no character; send valid Unicode")
        raise APIError(400, f"{path}: holds {what}", param=path)
    return body


def _too_deep(raw: bytes) -> str | None:
    """The top-level field of `raw` (or "body") that nests arrays and objects more than MAX_DEPTH deep, if one does;
    counted on the bytes, before a parser recurses into them."""
    if raw.count(b"[") + raw.count(b"{") <= MAX_DEPTH:
        return None
    blanked = raw.replace(b"\\\\", b"__").replace(b'\\"', b"__")  # the same length, and no quote escaped
    depth, field, keyed = 0, "body", raw.lstrip()[:1] == b"{"
    for token in _JSON_TOKEN.finditer(blanked):
        if token.group()[:1] == b'"':
            if depth == 1 and keyed:  # a key, or a value that the next key follows
                field = raw[token.start() + 1:token.end() - 1].decode("utf-8", "backslashreplace")
        elif token.group() in (b"[", b"{"):
            depth += 1
            if depth > MAX_DEPTH:
                return field
        else:
            depth -= 1
    return None


def _surrogate_in(body: object) -> tuple[str, str] | None:
    """The path (as pydantic writes it: prompt.1) of a string or key of `body` that holds a surrogate, and that
    surrogate; None if none does."""
    stack: list[tuple[tuple, object]] = [((), body)]
    while stack:
        path, value = stack.pop()
        items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
        for key, item in items:
            stack.append(((*path, key), item))
            if isinstance(key, str):
                stack.append(((*path, key), key))  # a key is text too
        if isinstance(value, str) and (found := _SURROGATE.search(value)):
            name = ".".join(str(part).encode("utf-8", "backslashreplace").decode() for part in path)
            return name or "body", found.group()
    return None


# ----------------------------------------------------------------------------------------------
# Generation


@dataclass
class Served:
    name: str
    model: object  # models.Transformer
    tokenizer: object  # tokenizers.Tokenizer
    chat: bool
    created: int

    @property
    def context(self) -> int:
        return self.model.cfg.context_length

    def stop_ids(self) -> list[int]:
        ids = [self.tokenizer.token_to_id(EOT_TOKEN)]
        if self.chat:
            ids.append(chat_token_ids(self.tokenizer)[1])  # <|im_end|>
        return [i for i in ids if i is not None]


def load_served(run: str | Path, name: str | None = None) -> Served:
    model, tokenizer, ckpt = load_model(run)
    path = Path(run).resolve()
    default = path.name if run_dir_of(path) == path else f"{run_dir_of(path).name}-{path.name}"
    return Served(name or default, model, tokenizer, is_chat_model(ckpt.config), int(time.time()))


@dataclass
class Choice:
    """One choice being generated: its pieces come from `pieces`; the ids sampled collect in `new_ids`."""
    index: int
    pieces: Iterator[str]
    new_ids: list[int]
    room: int  # the most tokens it may get: max_tokens, cut to what the context leaves
    text: str = ""

    def finish_reason(self, tokenizer) -> str:
        # "length" when the tokens ran out and nothing cut the text; "stop" for a stop token or sequence.
        cut = tokenizer.decode(self.new_ids) != self.text
        return "length" if len(self.new_ids) >= self.room and not cut else "stop"


def _choices(served: Served, prompts_ids: list[list[int]], req: _Request, max_tokens: int | None) -> list[Choice]:
    """Every choice of the request, checked before any is generated (a bad one fails the request with 400)."""
    choices = []
    for ids in prompts_ids:
        if len(ids) >= served.context:
            raise APIError(400, f"the prompt is {len(ids)} tokens but the model's context is {served.context}; "
                           "shorten it", param="messages" if isinstance(req, ChatRequest) else "prompt",
                           code="context_length_exceeded")
        room = served.context - len(ids) if max_tokens is None else min(max_tokens, served.context - len(ids))
        for _ in range(req.n):
            sampling = req.sampling(len(choices))
            try:
                check_sampling(served.model, ids, sampling["temperature"], None, sampling["top_p"], 1.0)
            except BurnoutError as exc:
                raise APIError(400, str(exc)) from None
            new_ids: list[int] = []
            pieces = stream_continuation(served.model, served.tokenizer, ids, room, req.stop,
                                         stop_ids=served.stop_ids(), new_ids=new_ids, **sampling)
            choices.append(Choice(len(choices), pieces, new_ids, room))
    if len(choices) > MAX_CHOICES:
        raise APIError(400, f"{len(choices)} choices asked for (prompts × n); at most {MAX_CHOICES}", param="n")
    return choices


def _generate_all(choices: list[Choice]) -> None:
    for choice in choices:
        choice.text = "".join(choice.pieces)


def _usage(prompts_ids: list[list[int]], choices: list[Choice]) -> dict:
    prompt = sum(len(ids) for ids in prompts_ids)
    completion = sum(len(c.new_ids) for c in choices)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


# ----------------------------------------------------------------------------------------------
# The queue


class Gate:
    """At most `running` generations at once and `waiting` more queued behind them; any more are refused."""

    def __init__(self, running: int, waiting: int):
        self._running, self._limit, self._inside = running, running + waiting, 0
        self._slots: asyncio.Semaphore | None = None

    def admit(self) -> None:
        if self._inside >= self._limit:
            raise APIError(429, f"the server is busy: {self._inside} requests running or queued; retry later",
                           kind="rate_limit_error", code="server_busy")
        self._inside += 1

    def leave(self) -> None:
        self._inside -= 1

    @property
    def slots(self) -> asyncio.Semaphore:
        if self._slots is None:  # made inside the server's event loop
            self._slots = asyncio.Semaphore(self._running)
        return self._slots


# ----------------------------------------------------------------------------------------------
# The app


def build_app(served: Served, api_key: str | None = None, concurrency: int = 1, queue_size: int = 16) -> Starlette:
    gate = Gate(concurrency, queue_size)

    def check_model(req: _Request) -> None:
        if req.model != served.name:
            raise APIError(404, f"the model '{req.model}' does not exist here; this server serves '{served.name}'",
                           param="model", code="model_not_found")

    async def models(request: Request) -> JSONResponse:
        return JSONResponse({"object": "list", "data": [
            {"id": served.name, "object": "model", "created": served.created, "owned_by": "burnout"}]})

    async def health(request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    async def completions(request: Request):
        req = await _parsed(request, CompletionRequest)
        check_model(req)
        try:
            prompts_ids = [encode_text(served.tokenizer, p, f"prompt[{i}]" if len(req.prompts) > 1 else "prompt")
                           for i, p in enumerate(req.prompts)]
        except BurnoutError as exc:  # a character a char model lacks, a lone surrogate: the client's text
            raise APIError(400, str(exc), param="prompt") from None
        if not prompts_ids or not all(prompts_ids):
            raise APIError(400, "a prompt is empty; give at least one character", param="prompt")
        return await respond(req, prompts_ids, req.max_tokens, "text_completion", "cmpl")

    async def chat_completions(request: Request):
        req = await _parsed(request, ChatRequest)
        check_model(req)
        if not served.chat:
            raise APIError(400, f"'{served.name}' is a base model, without a chat template; use /v1/completions, "
                           "or fine-tune it into a chat model with `burnout sft`", param="messages")
        try:
            prompt_ids = encode_prompt(served.tokenizer, req.messages)
        except BurnoutError as exc:
            raise APIError(400, str(exc), param="messages") from None
        return await respond(req, [prompt_ids], req.max_completion_tokens or req.max_tokens, "chat.completion",
                             "chatcmpl")

    async def respond(req: _Request, prompts_ids: list[list[int]], max_tokens: int | None, obj: str, prefix: str):
        choices = _choices(served, prompts_ids, req, max_tokens)
        head = {"id": f"{prefix}-{uuid.uuid4().hex}", "object": obj, "created": int(time.time()),
                "model": served.name}
        gate.admit()
        if req.stream:
            return _GatedStream(stream(req, head, prompts_ids, choices), gate)
        try:
            async with gate.slots:
                await run_in_threadpool(_generate_all, choices)
        finally:
            gate.leave()
        return JSONResponse({**head, "choices": [_whole(obj, c, served.tokenizer) for c in choices],
                             "usage": _usage(prompts_ids, choices)})

    async def stream(req: _Request, head: dict, prompts_ids: list[list[int]], choices: list[Choice]):
        chunk = {**head, "object": f"{head['object']}.chunk"} if head["object"] == "chat.completion" else head
        async with gate.slots:
            for choice in choices:
                async for event in _choice_events(chunk, choice, served.tokenizer):
                    yield event
            if req.include_usage:
                yield _event({**chunk, "choices": [], "usage": _usage(prompts_ids, choices)})
            yield "data: [DONE]\n\n"

    async def on_api_error(request: Request, exc: APIError) -> JSONResponse:
        return exc.response()

    async def on_http_error(request: Request, exc: HTTPException) -> JSONResponse:
        return error_response(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}")

    async def on_internal_error(request: Request, exc: Exception) -> JSONResponse:
        return _internal_error(exc)

    routes = [Route("/v1/models", models), Route("/health", health),
              Route("/v1/completions", completions, methods=["POST"]),
              Route("/v1/chat/completions", chat_completions, methods=["POST"])]
    app = Starlette(routes=routes, exception_handlers={APIError: on_api_error, HTTPException: on_http_error,
                                                       Exception: on_internal_error})
    return _Limits(app, api_key)


def _whole(obj: str, choice: Choice, tokenizer) -> dict:
    reason = choice.finish_reason(tokenizer)
    if obj == "chat.completion":
        return {"index": choice.index, "message": {"role": "assistant", "content": choice.text},
                "logprobs": None, "finish_reason": reason}
    return {"index": choice.index, "text": choice.text, "logprobs": None, "finish_reason": reason}


async def _choice_events(chunk: dict, choice: Choice, tokenizer) -> AsyncIterator[str]:
    chat = chunk["object"] == "chat.completion.chunk"

    def event(piece: dict, reason: str | None = None) -> str:
        return _event({**chunk, "choices": [{"index": choice.index, **piece, "logprobs": None,
                                             "finish_reason": reason}]})

    if chat:
        yield event({"delta": {"role": "assistant", "content": ""}})
    async for piece in iterate_in_threadpool(choice.pieces):
        choice.text += piece
        yield event({"delta": {"content": piece}} if chat else {"text": piece})
    yield event({"delta": {}} if chat else {"text": ""}, choice.finish_reason(tokenizer))


def _internal_error(exc: Exception) -> JSONResponse:
    return error_response(500, f"internal error: {first_line(exc)}", kind="server_error")


def _event(payload: dict) -> str:
    return f"data: {json.dumps(payload)}\n\n"


class _GatedStream(StreamingResponse):
    """A stream of server-sent events that leaves the gate when it ends, however it ends: also when the client
    went away before the first event (its generator then never starts, so its own `finally` would not run)."""

    def __init__(self, events: AsyncIterator[str], gate: Gate):
        super().__init__(events, media_type="text/event-stream")
        self._gate = gate

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._gate.leave()


class _Limits:
    """ASGI middleware: the API key (when one is set) and the body's size, checked before any route reads it; an
    error of ours is one line on the server's terminal and a 500 in OpenAI's shape (when nothing was sent yet)."""

    def __init__(self, app, api_key: str | None):
        self.app, self.key = app, _key_bytes(api_key)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        if self.key is not None and scope["path"] != "/health":
            # The header's own bytes, compared in constant time: equal, not a prefix, not another case.
            given = headers.get(b"authorization", b"").removeprefix(b"Bearer ").strip()
            if not hmac.compare_digest(given, self.key):
                return await error_response(401, "missing or wrong API key: send it as 'Authorization: Bearer KEY'",
                                            code="invalid_api_key")(scope, receive, send)
        length = headers.get(b"content-length", b"0")
        if not length.isdigit() or int(length) > MAX_BODY_BYTES:
            return await error_response(413, f"the body is over {MAX_BODY_BYTES:,} bytes")(scope, receive, send)
        received = 0

        async def limited_receive():
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > MAX_BODY_BYTES:  # a chunked body, which said no length
                raise APIError(413, f"the body is over {MAX_BODY_BYTES:,} bytes")
            return message

        started = False

        async def tracked_send(message):
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited_receive, tracked_send)
        except Exception as exc:  # Starlette re-raises an error of ours after sending on_internal_error's 500
            print(f"burnout serve: internal error on {scope['path']}: {first_line(exc)}", file=sys.stderr)
            if not started:
                await _internal_error(exc)(scope, receive, send)


def _key_bytes(api_key: str | None) -> bytes | None:
    """The bytes a client sends after 'Bearer ' for `api_key` (None: no key asked). HTTP clients, the openai one
    among them, send a header in ASCII and drop spaces at its ends: a key that could never match is refused."""
    if api_key is None:
        return None
    odd = next((i for i, c in enumerate(api_key) if not (c.isascii() and c.isprintable())), None)
    if not api_key.strip():
        raise BurnoutError("--api-key (or $BURNOUT_API_KEY) is empty; give a key, or unset both to serve without one")
    if odd is not None:
        raise BurnoutError(f"--api-key (or $BURNOUT_API_KEY): character {odd + 1} is not printable ASCII, and HTTP "
                           "clients (the openai one among them) send a key only in ASCII; choose a key of ASCII "
                           "letters, digits and punctuation")
    if api_key != api_key.strip():
        raise BurnoutError("--api-key (or $BURNOUT_API_KEY) starts or ends with a space, which HTTP drops from a "
                           "header; remove it")
    return api_key.encode("ascii")


# ----------------------------------------------------------------------------------------------
# The command


def serve(run: str | Path, host: str = "127.0.0.1", port: int = 8000, api_key: str | None = None,
          concurrency: int = 1, queue_size: int = 16, name: str | None = None) -> None:
    """`burnout serve`: serve `run` until interrupted."""
    if concurrency < 1 or queue_size < 0:
        raise BurnoutError("--concurrency must be at least 1 and --queue-size at least 0")
    _key_bytes(api_key)  # before the model loads
    served = load_served(run, name)
    app = build_app(served, api_key, concurrency, queue_size)
    sock = _listening(host, port)
    bound = sock.getsockname()[1]
    kind = "a chat model: /v1/chat/completions and /v1/completions" if served.chat else \
        "a base model: /v1/completions (fine-tune it with `burnout sft` for chat)"
    print(f"serving '{served.name}' ({kind}) at http://{host}:{bound}/v1; Ctrl-C stops it", flush=True)
    if not api_key and not _is_loopback(host):
        print(f"warning: --host {host} lets other machines use it, and no --api-key is set", flush=True)
    print(f"  try: python -c \"from openai import OpenAI; c = OpenAI(base_url='http://{host}:{bound}/v1', "
          f"api_key='{'KEY' if api_key else 'none'}'); print(c.completions.create(model='{served.name}', "
          "prompt='Hello', max_tokens=20).choices[0].text)\"", flush=True)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
    server.run(sockets=[sock])


def _listening(host: str, port: int) -> socket.socket:
    try:
        info = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(info[0], socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(info[4])
        sock.listen(128)  # connections wait in the backlog until the server accepts them
    except OSError as exc:
        raise BurnoutError(f"cannot listen on {host}:{port} ({exc.strerror or exc}); choose another --port "
                           "or --host") from None
    return sock


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"
