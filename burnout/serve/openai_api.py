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

--concurrency generations run at once (default 1: on a CPU one already uses every core) and up to --queue-size
more wait; a request beyond those is refused at once with 429 rather than left to time out.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
import socket
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

from burnout.common import EOT_TOKEN, SEED_MAX, first_line, install_extra
from burnout.errors import BurnoutError

try:
    import pydantic
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
# Choices in one request: prompts × n.
MAX_CHOICES = 16
MAX_STOPS = 4


# ----------------------------------------------------------------------------------------------
# Requests


class _Request(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="ignore")

    model: str
    max_tokens: int | None = pydantic.Field(None, ge=1)
    temperature: float = pydantic.Field(1.0, ge=0, le=2, allow_inf_nan=False)
    top_p: float = pydantic.Field(1.0, gt=0, le=1, allow_inf_nan=False)
    n: int = pydantic.Field(1, ge=1, le=MAX_CHOICES)
    stop: str | list[str] | None = pydantic.Field(None, validate_default=True)  # a list once validated
    seed: int | None = pydantic.Field(None, ge=0, le=SEED_MAX)
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
    max_tokens: int | None = pydantic.Field(16, ge=1)  # OpenAI's default for completions

    @property
    def prompts(self) -> list[str]:
        return [self.prompt] if isinstance(self.prompt, str) else self.prompt


class ChatRequest(_Request):
    messages: list[dict]
    max_completion_tokens: int | None = pydantic.Field(None, ge=1)


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
    try:
        body = json.loads(await request.body())
    except (ValueError, UnicodeDecodeError):
        raise APIError(400, "the body is not JSON; send a JSON object") from None
    try:
        return model.model_validate(body)
    except pydantic.ValidationError as exc:
        error = exc.errors()[0]
        param = ".".join(str(part) for part in error["loc"]) or None
        raise APIError(400, f"{param or 'body'}: {error['msg']}", param=param) from None


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
        self.app, self.api_key = app, api_key

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        if self.api_key and scope["path"] != "/health":
            given = headers.get(b"authorization", b"").decode("latin-1").removeprefix("Bearer ").strip()
            if not hmac.compare_digest(given.encode(), self.api_key.encode()):
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


# ----------------------------------------------------------------------------------------------
# The command


def serve(run: str | Path, host: str = "127.0.0.1", port: int = 8000, api_key: str | None = None,
          concurrency: int = 1, queue_size: int = 16, name: str | None = None) -> None:
    """`burnout serve`: serve `run` until interrupted."""
    if concurrency < 1 or queue_size < 0:
        raise BurnoutError("--concurrency must be at least 1 and --queue-size at least 0")
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
