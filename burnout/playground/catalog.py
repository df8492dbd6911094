"""What the playground may serve: the checkpoints under the runs it was given, and a bounded model cache.

Only checkpoints found here at start-up can be chosen: a request names a label, never a path, so a
browser cannot make the server load anything else from disk. A chat checkpoint (its config has an sft
section) answers in its chat template (`stream_chat`); a base one beside it gets the same conversation
as a plain "User: …/Assistant:" transcript to continue. The history comes from the browser, so it is
bounded here before anything is encoded.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from burnout.base.files import RUN_CONFIG_FILE, tokenizer_file
from burnout.base.values import checked_number
from burnout.config import RunConfig, load_run_config, load_saved_config
from burnout.core.chat_template import is_chat_model
from burnout.core.checkpoint import checkpoint_info, list_checkpoints
from burnout.core.model_files import load_model
from burnout.data.tokenizer import encode_text, load_tokenizer
from burnout.errors import BurnoutError
from burnout.finetune.tokenized import held_out_questions
from burnout.generate.chat import TRANSCRIPT_STOP, chat_prompt, fit_messages, plain_transcript, reply_room, stream_reply
from burnout.generate.prompts import data_prompts, sample_prompts
from burnout.generate.sampling import stream_text as sampling_stream_text

MAX_PROMPT_CHARS = 2000
MAX_NEW_TOKENS = 500
MAX_HISTORY_CHARS = 20_000  # of a conversation sent back by the browser; older messages are left out
# The Chat tab's examples from a run's own data: the questions of a chat run's first EXAMPLE_DOCUMENTS held-out
# conversations (the Generate tab's are its sample prompts: example_prompts).
EXAMPLE_DOCUMENTS = 3


@dataclass(frozen=True)
class Entry:
    label: str  # "run · step 1200": what the dropdown shows and requests name
    path: Path
    info: dict  # the checkpoint's info.json: step, tokens, losses
    chat: bool = False  # a chat model (core.chat_template.is_chat_model)


def discover(sources: list[str | Path], say: Callable[[str], None] = print) -> dict[str, Entry]:
    """Checkpoints of each source (a run folder: all its checkpoints; a checkpoint folder: itself), in order. A
    checkpoint whose info.json or config.yaml cannot be read is left out, said in a line: the others are served."""
    if not sources:
        raise BurnoutError("give at least one run folder or checkpoint folder to serve")
    entries: dict[str, Entry] = {}
    for source in sources:
        path = Path(source).resolve()
        if not path.is_dir():
            raise BurnoutError(f"'{source}' does not exist; give a run folder or one of its checkpoints/step_* folders")
        if (path / "model.safetensors").is_file():
            found, run_name = [path], path.parent.parent.name
        else:
            found, run_name = list_checkpoints(path), path.name
        if not found:
            raise BurnoutError(f"'{source}' holds no checkpoint (no model.safetensors, no checkpoints/step_*); "
                               "give a run folder made by `burnout train`")
        for ckpt in found:
            try:
                info, chat = checkpoint_info(ckpt), is_chat_model(load_run_config(ckpt / RUN_CONFIG_FILE))
            except BurnoutError as exc:
                say(f"left out: {exc}")
                continue
            label = f"{run_name} · step {info['step']}"
            n = 2
            while label in entries and entries[label].path != ckpt:  # two runs with one folder name
                label, n = f"{run_name} ({n}) · step {info['step']}", n + 1
            entries[label] = Entry(label, ckpt, info, chat)
    if not entries:
        raise BurnoutError(f"no checkpoint of {', '.join(map(str, sources))} can be read (each said above); give "
                           "runs with a readable checkpoint")
    return entries


def example_prompts(entries: dict[str, Entry]) -> list[str]:
    """Prompts for the served base models, from their own runs: each run's sample prompts (generate/prompts.py's
    sample_prompts: its train.sample_prompt, or the words of its val split it recorded); for a run with none (one
    that predates the record), words drawn as training draws them from the data folder it trained on, where still
    readable; "The " when none has any. Chat models are left out: their tab has questions."""
    prompts: dict[str, None] = {}
    for entry in entries.values():
        if not entry.chat:
            found = sample_prompts(entry.path) or _drawn_prompts(load_saved_config(entry.path / RUN_CONFIG_FILE))
            prompts.update(dict.fromkeys(found))
    return list(prompts) or ["The "]


def chat_questions(entries: dict[str, Entry]) -> list[str]:
    """Questions for the served chat models, from their own runs: the first user message of the first
    EXAMPLE_DOCUMENTS held-out conversations of each one's fine-tuning data (the kind it learnt to answer, never seen
    answered); none for a run whose data folder can no longer be read."""
    questions: dict[str, None] = {}
    data_dirs = dict.fromkeys(load_saved_config(entry.path / RUN_CONFIG_FILE).data.prepared_dir
                              for entry in entries.values() if entry.chat)
    for data_dir in filter(None, data_dirs):
        try:
            found = held_out_questions(Path(data_dir), EXAMPLE_DOCUMENTS)
        except (BurnoutError, OSError, ValueError):
            continue
        questions.update(dict.fromkeys(q for q in found if len(q) <= MAX_PROMPT_CHARS))
    return list(questions)


def _drawn_prompts(cfg: RunConfig) -> list[str]:
    """The sample prompts a run of `cfg` draws from its data folder (generate/prompts.py's data_prompts); none when
    the folder can no longer be read (moved or deleted since the run trained on it)."""
    if not cfg.data.prepared_dir:
        return []
    data_dir = Path(cfg.data.prepared_dir)
    try:
        return data_prompts(data_dir, cfg.train.seed, load_tokenizer(tokenizer_file(data_dir)),
                            cfg.model.context_length)
    except (BurnoutError, OSError):
        return []


@dataclass
class Loaded:
    model: object
    tokenizer: object
    bytes: int
    chat: bool = False


class ModelCache:
    """Least-recently-used models, evicted once their weights together would exceed `max_bytes`.

    The newest model always stays, even alone above the bound: a request must be served. A model
    evicted while another request still generates with it is freed when that request ends.
    """

    def __init__(self, entries: dict[str, Entry], max_bytes: int):
        self.entries = entries
        self.max_bytes = max_bytes
        self._loaded: OrderedDict[str, Loaded] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, label: str) -> Loaded:
        if not isinstance(label, str) or label not in self.entries:
            raise BurnoutError(f"unknown checkpoint '{label}'; choose one from the list")
        with self._lock:  # one load at a time: two requests for one cold model load it once
            if label in self._loaded:
                self._loaded.move_to_end(label)
                return self._loaded[label]
            model, tokenizer, ckpt = load_model(self.entries[label].path)
            size = sum(p.numel() * p.element_size() for p in model.parameters())
            while self._loaded and self.used_bytes() + size > self.max_bytes:
                self._loaded.popitem(last=False)
            loaded = Loaded(model, tokenizer, size, is_chat_model(ckpt.config))
            self._loaded[label] = loaded
            return loaded

    def used_bytes(self) -> int:
        return sum(m.bytes for m in self._loaded.values())

    def cached_labels(self) -> list[str]:
        return list(self._loaded)


def sampling_settings(temperature: float, top_k: float, top_p: float, penalty: float) -> dict:
    """The sampling fields as the app's API may send them (any JSON value, NaN included), checked: else one line."""
    return {"temperature": checked_number("temperature", temperature, low=0),
            "top_k": checked_number("top-k", top_k, integer=True, low=1),
            "top_p": checked_number("top-p", top_p, low=0, low_open=True, high=1),
            "repetition_penalty": checked_number("repetition penalty", penalty, low=0, low_open=True)}


def _check_request(prompt: str, max_new_tokens: float, what: str = "prompt") -> int:
    """The prompt checked, and max new tokens as a whole number in range."""
    if not isinstance(prompt, str):
        raise BurnoutError(f"the {what} must be text, got {type(prompt).__name__}")
    if not prompt.strip():
        raise BurnoutError(f"the {what} is empty; type some text")
    if len(prompt) > MAX_PROMPT_CHARS:
        raise BurnoutError(f"the {what} is {len(prompt):,} characters; "
                           f"the playground takes at most {MAX_PROMPT_CHARS:,}")
    return checked_number("max new tokens", max_new_tokens, integer=True, low=1, high=MAX_NEW_TOKENS)


def stream_text(loaded: Loaded, prompt: str, max_new_tokens: int, **sampling) -> Iterator[str]:
    """The prompt and its continuation so far, growing as tokens arrive (for a streaming text box)."""
    max_new_tokens = _check_request(prompt, max_new_tokens)
    # Made before the first yield: the sampler checks its settings and the prompt's length right here.
    pieces = sampling_stream_text(loaded.model, loaded.tokenizer, prompt, max_new_tokens, **sampling)
    text = prompt
    yield text
    for piece in pieces:
        text += piece
        yield text


def conversation(history: list, message: str, system: str = "") -> list[dict]:
    """The messages for the next answer: `system`, the chat component's `history` (newest messages up to
    MAX_HISTORY_CHARS; content as text or Gradio's text parts; empty answers left out) and `message`."""
    kept: list[dict] = []
    size = len(message) + len(system)
    for item in reversed(history if isinstance(history, list) else []):
        if not isinstance(item, dict) or item.get("role") not in ("user", "assistant"):
            continue
        content = item.get("content")
        if isinstance(content, list):  # Gradio's [{"type": "text", "text": ...}]
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
        if not isinstance(content, str) or not content.strip():
            continue
        size += len(content)
        if size > MAX_HISTORY_CHARS:
            break
        kept.append({"role": item["role"], "content": content})
    head = [{"role": "system", "content": system}] if system.strip() else []
    return [*head, *reversed(kept), {"role": "user", "content": message}]


def stream_chat(loaded: Loaded, history: list, message: str, max_new_tokens: int, system: str = "",
                **sampling) -> Iterator[str]:
    """The answer to `message` after `history` so far, growing as tokens arrive (for a chat component).

    A chat model answers in its template and stops at <|im_end|>; a base model continues the conversation as
    a plain transcript and stops where it starts the user's next line. The oldest turns that do not fit the
    context are left out."""
    max_new_tokens = _check_request(message, max_new_tokens, "message")
    if not isinstance(system, str):
        raise BurnoutError(f"the system prompt must be text, got {type(system).__name__}")
    if len(system) > MAX_PROMPT_CHARS:
        raise BurnoutError(f"the system prompt is {len(system):,} characters; the playground takes at most "
                           f"{MAX_PROMPT_CHARS:,}")
    messages = conversation(history, message, system)
    model, tokenizer = loaded.model, loaded.tokenizer
    context = model.cfg.context_length
    if loaded.chat:
        ids, _ = chat_prompt(tokenizer, messages, context, max_new_tokens)
        pieces = stream_reply(model, tokenizer, ids, max_new_tokens, **sampling)
    else:
        ids, dropped = fit_messages(messages, lambda kept: encode_text(tokenizer, plain_transcript(kept),
                                                                       "the conversation"),
                                    context, reply_room(context, max_new_tokens))
        kept = messages[:1] + messages[1 + dropped:] if messages[0]["role"] == "system" else messages[dropped:]
        pieces = sampling_stream_text(model, tokenizer, plain_transcript(kept), max_new_tokens,
                                      stop=TRANSCRIPT_STOP, **sampling)
    text = ""
    yield text
    for piece in pieces:
        text += piece
        yield text.strip()
