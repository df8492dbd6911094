"""`burnout playground`: the blog's "Try it yourself" page for your own runs, as a local Gradio app.

Pick a checkpoint, type a prompt, watch it stream; or send one prompt to two or three checkpoints at
once and watch the model get less stupid from step to step. Chat checkpoints (from `burnout sft`) get a
Chat tab: a conversation in the chat template, side by side with a base checkpoint when one is served.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

# The playground runs offline: no usage reporting to Gradio's servers unless the user asks for it.
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

from burnout.base.text import first_line, install_extra
from burnout.base.values import checked_number
from burnout.errors import BurnoutError  # noqa: E402

try:
    import gradio as gr  # after the environment default above
except ImportError:
    raise BurnoutError(f"the playground needs Gradio; {install_extra('playground')}") from None

import pydantic  # noqa: E402  (installed with Gradio)
from starlette.middleware import Middleware  # noqa: E402  (installed with Gradio)
from starlette.responses import PlainTextResponse  # noqa: E402

from burnout.playground.catalog import (  # noqa: E402
    MAX_NEW_TOKENS,
    MAX_PROMPT_CHARS,
    Entry,
    ModelCache,
    chat_questions,
    discover,
    example_prompts,
    sampling_settings,
    stream_chat,
    stream_text,
)

# A question is for a chat model: the Chat tab's examples when the chat runs' own data give none (chat_questions);
# with no chat checkpoint served, the first is one of the Generate tab's, for a base model to continue.
CHAT_EXAMPLES = ["What is the capital of France?", "Give me three tips for staying focused.",
                 "Explain what a GPU does in one sentence."]
MAX_SIDE_BY_SIDE = 3
NO_BASE = "(none)"


def build_app(entries: dict[str, Entry], cache: ModelCache) -> gr.Blocks:
    labels = list(entries)
    chat_labels = [label for label, entry in entries.items() if entry.chat]

    # The handlers' parameter names are the API's field names (Gradio names them from the signature).
    def info_markdown(checkpoint: str) -> str:
        if checkpoint not in entries:
            return ""
        entry = entries[checkpoint]
        model = cache.get(checkpoint).model
        cfg = model.cfg
        params = sum(p.numel() for p in model.parameters())
        val = entry.info.get("val_loss")
        return "\n".join([
            f"**{checkpoint}**" + (" (chat model: try the Chat tab)" if entry.chat else ""),
            f"- parameters: {params:,} ({cfg.family}, {cfg.n_layer} layers × {cfg.d_model} wide)",
            f"- tokenizer: {cache.get(checkpoint).tokenizer.get_vocab_size():,} tokens; context {cfg.context_length}",
            f"- step {entry.info['step']:,}, {entry.info.get('tokens', 0):,} tokens trained",
            f"- val loss: {val:.4f}" if isinstance(val, (int, float)) else "- val loss: not measured",
        ])

    def generate(checkpoint: str, prompt: str, max_new_tokens: float, temperature: float, top_k: float,
                 top_p: float, repetition_penalty: float) -> Iterator[str]:
        try:
            loaded = cache.get(checkpoint)
            settings = sampling_settings(temperature, top_k, top_p, repetition_penalty)
            yield from stream_text(loaded, prompt, max_new_tokens, **settings)
        except BurnoutError as exc:
            raise refusal(str(exc)) from None

    def side_by_side(checkpoints: list[str], prompt: str, max_new_tokens: float, temperature: float, top_k: float,
                     top_p: float, repetition_penalty: float):
        if not isinstance(checkpoints, list) or not 2 <= len(checkpoints) <= MAX_SIDE_BY_SIDE:
            count = len(checkpoints) if isinstance(checkpoints, list) else 0
            raise refusal(f"choose 2 or {MAX_SIDE_BY_SIDE} checkpoints to compare (chosen: {count})")
        try:
            settings = sampling_settings(temperature, top_k, top_p, repetition_penalty)
            streams = [stream_text(cache.get(label), prompt, max_new_tokens, **settings) for label in checkpoints]
            texts = [""] * len(checkpoints)
            live = list(range(len(checkpoints)))
            # One token for each checkpoint in turn, so the columns grow together.
            while live:
                for i in list(live):
                    try:
                        texts[i] = next(streams[i])
                    except StopIteration:
                        live.remove(i)
                yield _columns(checkpoints, texts)
        except BurnoutError as exc:
            raise refusal(str(exc)) from None

    with CheckedBlocks(title="GPUburnout playground", analytics_enabled=False) as app:
        gr.Markdown("# GPUburnout playground\nPick a checkpoint and see how it generates. "
                    f"Serving {len(labels)} checkpoint(s) from the runs given to `burnout playground`.")
        with gr.Row():
            max_new = gr.Slider(1, MAX_NEW_TOKENS, value=100, step=1, label="max new tokens")
            temperature = gr.Slider(0.1, 1.5, value=0.8, step=0.05, label="temperature")
            top_k = gr.Slider(1, 100, value=50, step=1, label="top-k")
            top_p = gr.Slider(0.05, 1.0, value=1.0, step=0.05, label="top-p")
            penalty = gr.Slider(1.0, 2.0, value=1.0, step=0.05, label="repetition penalty")
        sampling = [max_new, temperature, top_k, top_p, penalty]
        with gr.Tab("Generate"):
            with gr.Row():
                with gr.Column(scale=2):
                    checkpoint = gr.Dropdown(labels, value=labels[-1], label="checkpoint", elem_id="checkpoint")
                    prompt = gr.Textbox(label="prompt", lines=3, max_length=MAX_PROMPT_CHARS, elem_id="prompt")
                    gr.Examples([*example_prompts(entries), *([] if chat_labels else CHAT_EXAMPLES[:1])],
                                inputs=prompt)
                    button = gr.Button("Generate", variant="primary", elem_id="generate")
                with gr.Column(scale=1):
                    info = gr.Markdown(info_markdown(labels[-1]), elem_id="model-info")
            output = gr.Textbox(label="output", lines=8, elem_id="output")
            checkpoint.change(info_markdown, checkpoint, info, api_name="model_info")
            button.click(generate, [checkpoint, prompt, *sampling], output, api_name="generate")
        with gr.Tab("Side by side"):
            gr.Markdown("One prompt, two or three checkpoints at once: watch it get less stupid.")
            chosen = gr.CheckboxGroup(labels, value=labels[-MAX_SIDE_BY_SIDE:] if len(labels) > 1 else [],
                                      label="checkpoints (2 or 3)", elem_id="compare-checkpoints")
            compare_prompt = gr.Textbox(label="prompt", lines=2, max_length=MAX_PROMPT_CHARS, elem_id="compare-prompt")
            compare_button = gr.Button("Generate side by side", variant="primary", elem_id="compare")
            with gr.Row():
                columns = [gr.Textbox(label=f"checkpoint {i + 1}", lines=8, elem_id=f"compare-output-{i}")
                           for i in range(MAX_SIDE_BY_SIDE)]
            compare_button.click(side_by_side, [chosen, compare_prompt, *sampling], columns, api_name="side_by_side")
        if chat_labels:
            _chat_tab(entries, cache, sampling)
    return app


def _chat_tab(entries: dict[str, Entry], cache: ModelCache, sampling: list) -> None:
    """The Chat tab: a chat checkpoint's conversation, and beside it a base checkpoint's answers to the same."""
    chat_labels = [label for label, entry in entries.items() if entry.chat]
    base_labels = [label for label, entry in entries.items() if not entry.chat]

    def chat_turn(chat_checkpoint: str, base_checkpoint: str, system: str, message: str, history: list,
                  base_history: list, max_new_tokens: float, temperature: float, top_k: float, top_p: float,
                  repetition_penalty: float):
        chats = [(chat_checkpoint, history if isinstance(history, list) else [])]
        if base_checkpoint in base_labels:
            chats.append((base_checkpoint, base_history if isinstance(base_history, list) else []))
        try:
            settings = sampling_settings(temperature, top_k, top_p, repetition_penalty)
            streams = [stream_chat(cache.get(name), past, message, max_new_tokens, system or "", **settings)
                       for name, past in chats]
            answers = [next(stream) for stream in streams]  # the requests are checked here, before any output
            live = list(range(len(streams)))
            while True:
                shown = [[*past, {"role": "user", "content": message}, {"role": "assistant", "content": answer}]
                         for (_, past), answer in zip(chats, answers)]
                yield shown[0], shown[1] if len(shown) > 1 else (base_history or []), ""
                if not live:
                    return
                for i in list(live):  # one token for each model in turn, so the answers grow together
                    try:
                        answers[i] = next(streams[i])
                    except StopIteration:
                        live.remove(i)
        except BurnoutError as exc:
            raise refusal(str(exc)) from None

    with gr.Tab("Chat"):
        gr.Markdown("Talk to a chat checkpoint: each message goes through its chat template and the answer "
                    "ends at `<|im_end|>`. A base checkpoint beside it gets the same conversation as a plain "
                    "`User:`/`Assistant:` transcript to continue.")
        with gr.Row():
            chat_checkpoint = gr.Dropdown(chat_labels, value=chat_labels[-1], label="chat checkpoint",
                                          elem_id="chat-checkpoint")
            base_checkpoint = gr.Dropdown([NO_BASE, *base_labels], value=(base_labels or [NO_BASE])[-1],
                                          label="side by side with a base checkpoint", elem_id="chat-base")
        system = gr.Textbox(label="system prompt (optional)", max_length=MAX_PROMPT_CHARS, elem_id="chat-system")
        with gr.Row():
            chat_bot = gr.Chatbot(label="chat model", elem_id="chat-bot", height=360)
            base_bot = gr.Chatbot(label="base model", elem_id="base-bot", height=360, visible=bool(base_labels))
        message = gr.Textbox(label="message (Enter sends)", max_length=MAX_PROMPT_CHARS, elem_id="chat-message")
        gr.Examples(chat_questions(entries) or CHAT_EXAMPLES, inputs=message)
        with gr.Row():
            send = gr.Button("Send", variant="primary", elem_id="chat-send")
            clear = gr.Button("Clear conversation", elem_id="chat-clear")
        inputs = [chat_checkpoint, base_checkpoint, system, message, chat_bot, base_bot, *sampling]
        send.click(chat_turn, inputs, [chat_bot, base_bot, message], api_name="chat_turn")
        # Enter does what Send does: one endpoint in the API, not a second copy of it.
        message.submit(chat_turn, inputs, [chat_bot, base_bot, message], api_visibility="undocumented")
        # What the page itself does on a click, not endpoints of the API.
        clear.click(lambda: ([], []), None, [chat_bot, base_bot], api_visibility="undocumented")
        # Another base model starts from an empty conversation (it did not say what the old one said).
        base_checkpoint.change(lambda name: gr.update(visible=name != NO_BASE, value=[]), base_checkpoint, base_bot,
                               api_visibility="undocumented")


def refusal(message: str) -> gr.Error:
    """A bad request's answer: `message` to the client, and one line to the server's terminal (not the traceback
    Gradio prints for each error it is given)."""
    print(f"playground: refused a request: {message}", file=sys.stderr, flush=True)
    return gr.Error(message, print_exception=False)


class CheckedBlocks(gr.Blocks):
    """gr.Blocks whose requests are checked field by field (`request_problem`) before Gradio's own preprocessing,
    which answers a missing field, a number sent as text or a malformed chat history with {"error": null} and a
    traceback on the server's terminal."""

    async def preprocess_data(self, block_fn, inputs, state, explicit_call=False):
        problem = request_problem(block_fn.inputs, inputs)
        if problem is not None:
            raise refusal(problem)
        return await super().preprocess_data(block_fn, inputs, state, explicit_call)


def request_problem(components: list, values: list) -> str | None:
    """What is wrong with a request's `values` for an endpoint's input `components`, naming the field (its
    label), or None: each field present, a slider's a number within the slider, a chat history a list of
    {role, content} messages, a text box's text, a choice among the choices."""
    names = [component.label or type(component).__name__ for component in components]
    if len(values) < len(components):
        return (f"the request has no value for '{names[len(values)]}': this endpoint takes {len(components)} values "
                f"({', '.join(names)}), in that order")
    for name, component, value in zip(names, components, values):
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
        if isinstance(component, gr.Slider):
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                return f"{name}: {shown} is not a number; send a number from {component.minimum} to {component.maximum}"
            try:
                checked_number(name, value, low=component.minimum, high=component.maximum)
            except BurnoutError as exc:
                return str(exc)
        elif isinstance(component, gr.Chatbot) and value is not None:
            try:
                component.data_model.model_validate(value)
            except pydantic.ValidationError as exc:
                error = exc.errors()[0]
                where = " ".join(f"message {part + 1}" if isinstance(part, int) else str(part) for part in error["loc"])
                return (f"{name}: the chat history is malformed ({where + ': ' if where else ''}"
                        f"{first_line(error['msg'])}); send it as the chat gives it back: a list of "
                        '{"role": ..., "content": [{"type": "text", "text": ...}]} messages')
        elif isinstance(component, gr.Textbox) and value is not None and not isinstance(value, str):
            return f"{name}: {shown} is not text"
        elif isinstance(component, (gr.Dropdown, gr.CheckboxGroup)):
            choices = [choice for _, choice in component.choices]
            chosen = value if isinstance(component, gr.CheckboxGroup) else [value]
            if not isinstance(chosen, list) or any(v is not None and v not in choices for v in chosen):
                listed = ", ".join(map(repr, choices[:4])) + (", ..." if len(choices) > 4 else "")
                kind = "a list of its choices" if isinstance(component, gr.CheckboxGroup) else "one of its choices"
                return f"{name}: {shown} is not {kind} ({listed})"
    return None


def _columns(chosen: list[str], texts: list[str]) -> list:
    return [gr.update(label=chosen[i], value=texts[i], visible=True) if i < len(chosen) else gr.update(visible=False)
            for i in range(MAX_SIDE_BY_SIDE)]


class RefuseUploads:
    """ASGI middleware: the playground takes no files, yet Gradio's upload route would store any file from any
    origin and answer with its path on the server (which /gradio_api/file= then serves back). 403 instead."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"].rstrip("/").endswith("/upload"):
            await PlainTextResponse("this playground takes no uploads", status_code=403)(scope, receive, send)
            return
        await self.app(scope, receive, send)


def serve(sources: list[str | Path], host: str = "127.0.0.1", port: int = 7860, max_cache_mb: float = 2048,
          concurrency: int = 2, queue_size: int = 32) -> None:
    """Start the app and block until interrupted."""
    if concurrency < 1 or queue_size < 1 or max_cache_mb <= 0:
        raise BurnoutError("--concurrency, --queue-size and --max-cache-mb must be positive")
    entries = discover(sources)
    cache = ModelCache(entries, int(max_cache_mb * 2**20))
    app = build_app(entries, cache)
    # The queue bounds both parallel generations (CPU time, memory) and how many requests may wait.
    app.queue(default_concurrency_limit=concurrency, max_size=queue_size)
    print(f"serving {len(entries)} checkpoint(s): " + ", ".join(entries))
    try:
        app.launch(server_name=host, server_port=port, footer_links=[], max_file_size=0,
                   app_kwargs={"middleware": [Middleware(RefuseUploads)]})
    except OSError as exc:
        raise BurnoutError(f"cannot listen on {host}:{port} ({exc}); choose another --port") from None
