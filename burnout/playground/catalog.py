"""What the playground may serve: the checkpoints under the runs it was given, and a bounded model cache.

Only checkpoints found here at start-up can be chosen: a request names a label, never a path, so a
browser cannot make the server load anything else from disk.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from burnout.core.checkpoint import list_checkpoints
from burnout.core.model_files import load_model
from burnout.errors import BurnoutError
from burnout.generate.sampling import stream_text as sampling_stream_text

MAX_PROMPT_CHARS = 2000
MAX_NEW_TOKENS = 500


@dataclass(frozen=True)
class Entry:
    label: str  # "run · step 1200": what the dropdown shows and requests name
    path: Path
    info: dict  # the checkpoint's info.json: step, tokens, losses


def discover(sources: list[str | Path]) -> dict[str, Entry]:
    """Checkpoints of each source (a run folder: all its checkpoints; a checkpoint folder: itself), in order."""
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
            info = json.loads((ckpt / "info.json").read_text())
            label = f"{run_name} · step {info['step']}"
            n = 2
            while label in entries and entries[label].path != ckpt:  # two runs with one folder name
                label, n = f"{run_name} ({n}) · step {info['step']}", n + 1
            entries[label] = Entry(label, ckpt, info)
    return entries


@dataclass
class Loaded:
    model: object
    tokenizer: object
    bytes: int


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
        if label not in self.entries:
            raise BurnoutError(f"unknown checkpoint '{label}'; choose one from the list")
        with self._lock:  # one load at a time: two requests for one cold model load it once
            if label in self._loaded:
                self._loaded.move_to_end(label)
                return self._loaded[label]
            model, tokenizer, _ = load_model(self.entries[label].path)
            size = sum(p.numel() * p.element_size() for p in model.parameters())
            while self._loaded and self.used_bytes() + size > self.max_bytes:
                self._loaded.popitem(last=False)
            loaded = Loaded(model, tokenizer, size)
            self._loaded[label] = loaded
            return loaded

    def used_bytes(self) -> int:
        return sum(m.bytes for m in self._loaded.values())

    def cached_labels(self) -> list[str]:
        return list(self._loaded)


def stream_text(loaded: Loaded, prompt: str, max_new_tokens: int, **sampling) -> Iterator[str]:
    """The prompt and its continuation so far, growing as tokens arrive (for a streaming text box)."""
    if not prompt.strip():
        raise BurnoutError("the prompt is empty; type some text to continue")
    if len(prompt) > MAX_PROMPT_CHARS:
        raise BurnoutError(f"the prompt is {len(prompt):,} characters; "
                           f"the playground takes at most {MAX_PROMPT_CHARS:,}")
    if not 1 <= max_new_tokens <= MAX_NEW_TOKENS:
        raise BurnoutError(f"max new tokens {max_new_tokens} is outside 1–{MAX_NEW_TOKENS}")
    # Made before the first yield: the sampler checks its settings and the prompt's length right here.
    pieces = sampling_stream_text(loaded.model, loaded.tokenizer, prompt, max_new_tokens, **sampling)
    text = prompt
    yield text
    for piece in pieces:
        text += piece
        yield text
