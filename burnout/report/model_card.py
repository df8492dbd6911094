"""The model card an export carries (README.md in a Hugging Face folder, FILE.md beside a FILE.gguf), written from the
run's own files: Hugging Face's YAML front matter (huggingface_hub's ModelCardData: library, tags, datasets where a
source names one, the exported step's eval scores as model-index results), then what the model is, every data set it
learned from (its pretraining text and, for a chat model, its SFT / DPO / RL data) with their licenses where known,
how it was trained (the precision that ran, from launches.jsonl), what it started from, the exported step's scores
beside published ones, the data audit's findings, and what it is for. `gguf_metadata` gives a GGUF file the same
facts under llama.cpp's general.* keys.

Every figure comes from the checkpoint's config.yaml and info.json, its run's metrics.jsonl, launches.jsonl and
eval/, the data folders' meta.json and audit/audit.json, and the same files of each run it started from; a piece
that is not there is said to be missing, not guessed. A card is made to be published: it names no path of the
machine the model was trained on (a run by its folder's name, a file by its own name).
"""

from __future__ import annotations

import functools
import glob
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from huggingface_hub import EvalResult, ModelCardData

from burnout.base.files import (
    AUDIT_DIR,
    AUDIT_JSON,
    METRICS_FILE,
    RUN_CONFIG_FILE,
    read_jsonl,
    sha256_file,
    write_atomic,
)
from burnout.base.text import format_duration
from burnout.config import RunConfig, load_saved_config
from burnout.core.chat_template import is_chat_model
from burnout.core.checkpoint import CHECKPOINT_DIR, resolve_checkpoint, run_dir_of
from burnout.data.shards import META_FILE
from burnout.errors import BurnoutError
from burnout.eval.references import reference_table
from burnout.forensics.audit_summary import summary as audit_summary
from burnout.models.memory import param_counts
from burnout.train.provenance import read_launches

CARD_FILE = "README.md"
KNOWN_DATA_FILE = Path(__file__).with_name("known_data.yaml")
UNKNOWN_LICENSE = "unknown: check it before you publish"
HF_PREFIX = "hf:"  # a fine-tune's source streamed from the Hugging Face Hub: hf:NAME
_GLOB_CHARS = set("*?[")
# How a card of ours is told from a file someone wrote: an export writes its card again, never theirs.
_MARK = "<!-- model card written by `burnout export` from the run's own files -->"
# The metric of each task a model-index entry names, as lm-evaluation-harness reports it.
_TASK_METRICS = {"hellaswag": "acc_norm", "arc_easy": "acc", "arc_challenge": "acc_norm", "lambada": "acc",
                 "piqa": "acc_norm", "winogrande": "acc"}
# What each fine-tune learns from, by its kind.
_FINE_TUNE_DATA = {"SFT": "conversations", "DPO": "preference pairs", "RL (GRPO)": "questions"}
# Runs followed back from the exported one (a fine-tune of a fine-tune of a continued run ...), a cycle's bound.
MAX_GENERATIONS = 16
LIMITS = ("It was trained from scratch with GPUburnout, for learning and experiment. A model of this size writes "
          "text in the shape of its training data, not reliable facts: do not use its answers as advice or "
          "truth. It has had no safety training; it repeats what its data held, biases included.")


@dataclass
class Facts:
    """What a card says of a checkpoint, read from its run folders."""

    ckpt: Path
    cfg: RunConfig
    info: dict
    data_dir: Path
    data_dirs: list[Path] = field(default_factory=list)  # the data folders of every stage, this run's first
    datasets: list[DataSet] = field(default_factory=list)  # every stage's, the first stage first
    bases: list[tuple[str, int | None]] = field(default_factory=list)  # (run, step) started from, the nearest first
    missing: list[str] = field(default_factory=list)  # what of its history could not be read
    evals: dict = field(default_factory=dict)  # the exported step's scores: {task: {metric: value}}
    eval_limit: int | None = None  # the examples per task those scores were taken on (None: all)

    @property
    def run_dir(self) -> Path:
        return run_dir_of(self.ckpt)

    @property
    def chat(self) -> bool:
        return is_chat_model(self.cfg)


def read_facts(checkpoint: str | Path) -> Facts:
    """The facts of `checkpoint` (a checkpoint folder, or a run folder: its newest) and of the runs it started from."""
    ckpt = resolve_checkpoint(checkpoint)
    cfg = load_saved_config(ckpt / RUN_CONFIG_FILE)
    facts = Facts(ckpt, cfg, _json(ckpt / "info.json") or {}, _data_dir(cfg, run_dir_of(ckpt)))
    _read_history(facts)
    record = _json(facts.run_dir / "eval" / f"{ckpt.name}.json")  # `burnout eval` of this checkpoint, no other's
    if record is not None:
        facts.evals, facts.eval_limit = record.get("tasks") or {}, record.get("limit")
    return facts


def write_model_card(checkpoint: str | Path, path: str | Path, name: str, gguf_file: str | None = None) -> Path | None:
    """Write the card of `checkpoint` to `path` (a Hugging Face folder's README.md; FILE.md beside `gguf_file`),
    unless a file of someone else's is there (not a card of ours): that one is kept and None returned."""
    path = Path(path)
    if path.exists() and _MARK not in path.read_text(encoding="utf-8", errors="replace"):
        return None
    write_atomic(path, model_card(checkpoint, name, gguf_file))
    return path


def model_card(checkpoint: str | Path, name: str, gguf_file: str | None = None) -> str:
    facts = read_facts(checkpoint)
    cfg = facts.cfg
    front = ModelCardData(
        model_name=name, library_name=None if gguf_file else "transformers", pipeline_tag="text-generation",
        tags=_tags(facts) + (["gguf"] if gguf_file else []),
        datasets=list(dict.fromkeys(d.hf_id for d in facts.datasets if d.hf_id)) or None,
        eval_results=_eval_results(facts.evals) or None)
    sections = [f"# {name}", _summary(cfg, facts.chat), _model_section(cfg), _data_section(facts),
                _license_section(facts), _training_section(facts), _start_section(facts),
                _eval_section(facts), _audit_section(facts.data_dirs),
                f"## Intended use and limits\n\n{LIMITS}", _use_section(facts.chat, gguf_file)]
    return f"---\n{front.to_yaml()}\n---\n{_MARK}\n\n" + "\n\n".join(s for s in sections if s) + "\n"


def gguf_metadata(checkpoint: str | Path, name: str) -> dict:
    """The card's facts as the fields of the `gguf` package's Metadata (a GGUF file's general.* keys): name,
    description (what the model is, what it learned from and under which licenses), tags, each data set
    (general.dataset.N.*: its name, what it trained, its tokens and license, its page) and each checkpoint it started
    from (general.base_model.N.name). general.license is left unset: it is the model's, the publisher's to choose."""
    facts = read_facts(checkpoint)
    learned = "; ".join(f"{d.title} ({d.stage}, license: {d.license})" for d in facts.datasets) or "not recorded"
    description = f"{_what(facts.cfg, facts.chat)} Trained on: {learned}."
    if facts.missing:
        description += " Not found when it was exported: " + "; ".join(facts.missing) + "."
    datasets = [{"name": d.title, **({"url": d.known.url} if d.known and d.known.url else {}),
                 "description": f"{d.stage} data, {d.kind} from {d.origin}"
                 + (f", {d.tokens:,} tokens" if d.tokens is not None else "") + f"; license: {d.license}"}
                for d in facts.datasets]
    return {"name": name, "description": description, "tags": _tags(facts), "datasets": datasets or None,
            "base_models": [{"name": _label(*base, markdown=False)} for base in facts.bases] or None}


def _json(path: Path) -> dict | None:
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def _data_dir(cfg: RunConfig, run_dir: Path) -> Path:
    """The data folder a run trained on: data.prepared_dir (relative: to the run folder), else RUN/data."""
    if not cfg.data.prepared_dir:
        return run_dir / "data"
    path = Path(cfg.data.prepared_dir).expanduser()
    return path if path.is_absolute() else run_dir / path


def _run_and_step(checkpoint: str | Path, step: int | None = None) -> tuple[str, int | None]:
    """A checkpoint as a card names it: its run folder's name and its step, never its path."""
    path = Path(str(checkpoint).rstrip("/\\"))
    run = path.parent.parent.name if path.parent.name == CHECKPOINT_DIR else path.name
    if step is None and path.parent.name == CHECKPOINT_DIR and path.name[5:].isdigit():
        step = int(path.name[5:])
    return run, step


def _label(run: str, step: int | None, markdown: bool = True) -> str:
    return (f"`{run}`" if markdown else run) + (f" step {step:,}" if step is not None else "")


def _read_history(facts: Facts) -> None:
    """Fill facts.datasets, .bases and .missing: this run's data, then each run it started from (a fine-tune's base,
    a continued run's --init-from, a grown model's parent), back to the first; a folder that is gone is said."""
    ckpt, cfg, info, seen = facts.ckpt, facts.cfg, facts.info, {facts.ckpt.resolve()}
    seen_data: set[Path] = set()
    for _ in range(MAX_GENERATIONS):
        run_dir = run_dir_of(ckpt)
        search = list(dict.fromkeys(Path(launch["cwd"]) for launch in read_launches(run_dir)
                                    if isinstance(launch.get("cwd"), str)))
        data_dir = _data_dir(cfg, run_dir)
        meta = _json(data_dir / META_FILE)
        facts.data_dirs.append(data_dir)
        if cfg.fine_tune is not None:
            kind = _fine_tune_kind(cfg)
            facts.datasets[:0] = [fine_tune_set(kind, _FINE_TUNE_DATA[kind], cfg.fine_tune.source, meta, search)]
            parent = cfg.fine_tune.base
        else:
            if data_dir.resolve() not in seen_data:
                seen_data.add(data_dir.resolve())
                if meta is None:
                    facts.missing.append(f"the pretraining data of {_label(*_run_and_step(ckpt, info.get('step')))} "
                                         "(its data folder)")
                else:
                    facts.datasets[:0] = pretraining_sets(meta, search)
            parent = cfg.train.init_from or (info.get("grown_from") or {}).get("checkpoint")
        if not parent:
            return
        try:
            found = resolve_checkpoint(_located(str(parent), search))
            cfg, info = load_saved_config(found / RUN_CONFIG_FILE), _json(found / "info.json") or {}
        except (BurnoutError, OSError):
            facts.missing.append(f"{_label(*_run_and_step(parent))}, the model "
                                 f"{_label(*_run_and_step(ckpt, info.get('step')))} started from, and what it learned "
                                 "from")
            return
        if found.resolve() in seen:
            return
        seen.add(found.resolve())
        ckpt = found
        facts.bases.append(_run_and_step(ckpt, info.get("step")))


def _located(recorded: str, search: list[Path]) -> Path:
    """A path a run recorded, relative ones looked for from where the run ran when not found from here."""
    path = Path(recorded).expanduser()
    if path.is_absolute() or path.exists():
        return path
    return next((Path(d) / path for d in search if (Path(d) / path).exists()), path)


def _tags(facts: Facts) -> list[str]:
    return ["gpuburnout", facts.cfg.model.family, "from-scratch", *(["chat", "chatml"] if facts.chat else [])]


def _what(cfg: RunConfig, chat: bool) -> str:
    params = param_counts(cfg.model).total
    kind = "a chat model (ChatML)" if chat else "a base model: it continues text"
    return f"A {cfg.model.family} language model of {params:,} parameters trained from scratch with GPUburnout; {kind}."


def _summary(cfg: RunConfig, chat: bool) -> str:
    return f"{_what(cfg, chat)} Every figure below was read from its run's own files when it was exported."


def _model_section(cfg: RunConfig) -> str:
    m = cfg.model
    rows = [("family", m.family), ("layers", m.n_layer), ("width (d_model)", m.d_model), ("attention heads", m.n_head),
            ("context", f"{m.context_length} tokens"), ("vocabulary", f"{m.vocab_size:,}"),
            ("parameters", f"{param_counts(m).total:,}")]
    if m.family == "llama":
        rows.insert(4, ("key/value heads", m.n_kv_head or m.n_head))
    return "## Model\n\n" + _table(rows)


def _data_section(facts: Facts) -> str:
    """Every data set, the first stage first, then this run's own split and tokenizer (a pretraining run's)."""
    lines = ["## Training data", ""]
    if facts.datasets:
        rows = [(d.stage, d.name, d.kind, d.origin + (f" ({d.known.name})" if d.known and d.known.name != d.origin
                                                       else ""),
                 f"{d.tokens:,}" if d.tokens is not None else "not recorded", d.license) for d in facts.datasets]
        lines.append(_table(rows, ["stage", "source", "kind", "from", "tokens", "license"]))
    lines += [f"\nNot found when this card was written: {missing}." for missing in facts.missing]
    meta = _json(facts.data_dir / META_FILE) if facts.cfg.fine_tune is None else None
    if meta is not None:
        splits = meta.get("splits", {})
        lines.append(f"\n{splits.get('train', {}).get('tokens', 0):,} train and "
                     f"{splits.get('val', {}).get('tokens', 0):,} val tokens; tokenizer: {meta.get('tokenizer_kind')}, "
                     f"{meta.get('vocab_size', 0):,} tokens.")
    return "\n".join(lines).replace("\n\n\n", "\n\n")


def _license_section(facts: Facts) -> str:
    """The license of each data set the model learned from; the model's own is its publisher's to choose."""
    licenses = list(dict.fromkeys((d.title, d.license) for d in facts.datasets))
    lines = ["## Licenses", "", "The model's own license is yours to choose when you publish it; it must respect the "
             "licenses of the data it learned from:", "", *(f"- {title}: {lic}" for title, lic in licenses)]
    if facts.missing:
        lines += ["", "Not listed, since it could not be read: " + "; ".join(facts.missing) + ". Find out what that "
                  "data was, and its license, before you publish this model."]
    if any(lic == UNKNOWN_LICENSE for _, lic in licenses):
        lines += ["", "A data set whose license is unknown was not recognised as a known public one (or its files "
                  "were not found): check its license before you publish this model."]
    return "\n".join(lines)


def _training_section(facts: Facts) -> str:
    cfg, info, tc = facts.cfg, facts.info, facts.cfg.train
    optim = tc.optim
    step = info.get("step", 0)
    # The launches that trained steps up to this checkpoint's: a launch at step s trains from s on.
    launches = [launch for launch in read_launches(facts.run_dir) if launch.get("step", 0) < step]
    rows = [("steps", f"{step:,}"), ("tokens", f"{info.get('tokens', 0):,}"),
            ("batch", f"{tc.batch_size} × {tc.grad_accum} accumulation × {tc.seq_len or cfg.model.context_length}"),
            ("learning rate", f"{optim.lr:g} ({optim.schedule}, warmup {optim.warmup_steps}, min {optim.min_lr:g})"),
            ("precision", _precision(tc.precision, launches))]
    for key, label in (("train_loss", "train loss"), ("val_loss", "val loss")):
        if info.get(key) is not None:
            rows.append((label, f"{info[key]:.4f}"))
    if info.get("elapsed_s") is not None:
        rows.append(("training time", format_duration(info["elapsed_s"])))
    if launches:
        rows.append(("hardware", ", ".join(dict.fromkeys(str(launch.get("device")) for launch in launches))))
    dollars = [r["dollars"] for r in read_jsonl(facts.run_dir / METRICS_FILE)
               if r.get("step", 0) <= step and isinstance(r.get("dollars"), (int, float))]
    if dollars:
        rows.append(("cost", f"${dollars[-1]:.2f}"))
    return "## Training\n\n" + _table(rows)


def _precision(configured: str, launches: list[dict]) -> str:
    """The precision the steps ran in, as each launch recorded it; else the configured one when it names one
    (`auto` chooses by the machine, so it names none)."""
    ran = list(dict.fromkeys(launch["precision"] for launch in launches if launch.get("precision")))
    if ran and all(launch.get("precision") for launch in launches):
        return ", ".join(ran)
    if configured != "auto":
        return configured
    return "auto (the precision it chose on the machine was not recorded)"


def _fine_tune_kind(cfg: RunConfig) -> str:
    return "RL (GRPO)" if cfg.rl is not None else "DPO" if cfg.dpo is not None else "SFT"


def _start_section(facts: Facts) -> str:
    if not facts.bases and not (facts.cfg.fine_tune or facts.cfg.train.init_from):
        return ""
    how = (f"fine-tuned with {_fine_tune_kind(facts.cfg)}" if facts.cfg.fine_tune is not None
           else "continued pretraining on the data above")
    first = _label(*facts.bases[0]) if facts.bases else "a model that was not found when this card was written"
    lines = [f"## Started from\n\n{first}, {how}."]
    if len(facts.bases) > 1:
        lines.append("Which itself started from " + ", then ".join(_label(*b) for b in facts.bases[1:]) + ".")
    return "\n\n".join(lines)


def _eval_results(evals: dict) -> list[EvalResult]:
    results = []
    for task, scores in evals.items():
        metric = _TASK_METRICS.get(task, next(iter(scores), None))
        if metric in scores and isinstance(scores[metric], (int, float)):
            results.append(EvalResult(task_type="text-generation", dataset_type=task, dataset_name=task,
                                      metric_type=metric, metric_value=scores[metric]))
    return results


def _eval_section(facts: Facts) -> str:
    step = facts.info.get("step", 0)
    if not facts.evals:
        return (f"## Evaluation\n\nStep {step:,} was not evaluated (`burnout eval` of this checkpoint writes the "
                "scores its card shows; another step's scores are not this model's).")
    rows = [(task, metric, f"{value:.4f}" if isinstance(value, float) else value)
            for task, scores in facts.evals.items() for metric, value in scores.items()]
    limit = f" (on the first {facts.eval_limit:,} examples of each task: windows, for val)" if facts.eval_limit else ""
    published = reference_table(facts.evals)
    return (f"## Evaluation\n\nScores of step {step:,}{limit}:\n\n" + _table(rows, ["task", "metric", "score"])
            + ("\n\nPublished scores of public models near this size, for context:\n\n" + published
               if published else ""))


def _audit_section(data_dirs: list[Path]) -> str:
    """The summary of the audit of the nearest data folder that has one (`burnout data audit` writes it there)."""
    audit = next((found for d in data_dirs if (found := _json(d / AUDIT_DIR / AUDIT_JSON)) is not None), None)
    if audit is None:
        return ""
    try:  # the audit's target as a placeholder: its path is the machine's
        text = audit_summary({**audit, "target": {"kind": "prepared", "path": "DATA"}}, rows=5)
    except (KeyError, TypeError):  # an audit.json of another format
        return "## Data audit\n\nThe data folder's audit report could not be read (an audit.json of another format)."
    return f"## Data audit\n\n`burnout data audit` of the training data (DATA) found:\n\n```\n{text}\n```"


def _use_section(chat: bool, gguf_file: str | None) -> str:
    if gguf_file is not None:
        name = Path(gguf_file).name
        run = f"llama-cli -m {name} -cnv" if chat else f"llama-cli -m {name} -p 'Once upon a time' -n 60"
        return f"## How to use\n\nWith llama.cpp, in the folder of `{name}`:\n\n```\n{run}\n```"
    call = ("chat([{'role': 'user', 'content': 'Name a color.'}], max_new_tokens=60)[0]['generated_text'][-1]"
            if chat else "chat('Once upon a time', max_new_tokens=60)[0]['generated_text']")
    return ("## How to use\n\n```python\nfrom transformers import pipeline\n\n"
            f"chat = pipeline('text-generation', 'PATH_TO_THIS_FOLDER')\nprint({call})\n```")


def _table(rows, columns=("", "value")) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------
# The data sets a model learned from: each source of its pretraining text (a prepared data folder's meta.json) and of
# its fine-tunes, named without a path of the machine (a file by its name, a Hugging Face dataset by its id) and with
# its license where it is a known public data set (known_data.yaml: a file told by its sha256, a Hugging Face dataset
# by its name, burnout's built-in corpus by its kind). Any other's license is UNKNOWN_LICENSE, never guessed.


@dataclass(frozen=True)
class Known:
    """A public data set of known_data.yaml: its name, license (as its publisher states it) and page."""

    name: str
    license: str
    url: str | None = None


@dataclass(frozen=True)
class DataSet:
    """One data set a model learned from, as a card names it."""

    stage: str  # what it trained: pretraining, SFT, DPO or RL
    name: str  # the source's name in its data mix (a fine-tune's: its origin)
    kind: str  # text, jsonl, parquet, hf, stdlib_docs, stdlib_code; a fine-tune's: conversations, pairs, questions
    origin: str  # where it came from, without a path: a file's, folder's or glob's name, hf:NAME, the built-in corpus
    tokens: int | None  # tokens taken from it (a fine-tune's: of its prepared examples), None when not recorded
    known: Known | None  # the public data set it was told to be, None when it is none known

    @property
    def license(self) -> str:
        return self.known.license if self.known is not None else UNKNOWN_LICENSE

    @property
    def hf_id(self) -> str | None:
        """Its Hugging Face dataset id, when it was streamed from the Hub."""
        return self.origin[len(HF_PREFIX):].split(" (")[0] if self.origin.startswith(HF_PREFIX) else None

    @property
    def title(self) -> str:
        """The data set as a reader knows it: the public set's name, else where it came from."""
        return self.known.name if self.known is not None else self.origin


@functools.cache
def known_data() -> dict:
    """known_data.yaml: {"files": {sha256: (bytes, Known)}, "hf": {lower-case name: Known},
    "builtin": {kind: Known}}."""
    raw = yaml.safe_load(KNOWN_DATA_FILE.read_text(encoding="utf-8"))

    def known(entry: dict) -> Known:
        return Known(entry["name"], entry["license"], entry.get("url"))

    return {"files": {e["sha256"]: (e["bytes"], known(e)) for e in raw["files"]},
            "hf": {e["name"].lower(): Known(e["name"], e["license"], f"https://huggingface.co/datasets/{e['name']}")
                   for e in raw["hf"]},
            "builtin": {kind: known(e) for kind, e in raw["builtin"].items()}}


def pretraining_sets(meta: dict, search: Iterable[Path]) -> list[DataSet]:
    """The sources of a prepared data folder (its meta.json's `data_config` and per-source counts), each told
    against known_data.yaml; relative paths are looked for from each folder of `search` (where the run ran)."""
    counts = (meta.get("sources") or {}).get("per_source") or {}
    configured = {s.get("name"): s for s in (meta.get("data_config") or {}).get("sources") or []}
    sets = []
    for name in counts or configured:
        source = configured.get(name) or {"name": name, "kind": counts[name].get("kind")}
        tokens = counts.get(name, {}).get("tokens")
        sets.append(DataSet("pretraining", str(name), str(source.get("kind")), _origin(source),
                            tokens if isinstance(tokens, int) else None, _identify(source, list(search))))
    return sets


def fine_tune_set(stage: str, kind: str, source: str, meta: dict | None, search: Iterable[Path]) -> DataSet:
    """A fine-tune's data (`source`: a file, folder or glob, or hf:NAME), with the tokens of its prepared examples
    (its data folder's meta.json, when it records them)."""
    splits = (meta or {}).get("splits") or {}
    tokens = [s.get("tokens") for s in splits.values() if isinstance(s, dict)]
    total = sum(tokens) if tokens and all(isinstance(t, int) for t in tokens) else None
    if source.startswith(HF_PREFIX):
        entry = {"kind": "hf", "dataset": source[len(HF_PREFIX):]}
    else:
        entry = {"kind": "file", "path": source}
    origin = _origin(entry)
    return DataSet(stage, origin, kind, origin, total, _identify(entry, list(search)))


def _origin(source: dict) -> str:
    """Where a source came from, with no folder of the machine: hf:NAME (subset, split), a file's or glob's name,
    a folder's name and /, the built-in corpus."""
    kind = source.get("kind")
    if kind == "hf":
        extra = ", ".join(str(source[k]) for k in ("subset", "split") if source.get(k))
        return f"{HF_PREFIX}{source.get('dataset')}" + (f" ({extra})" if extra else "")
    if kind in known_data()["builtin"]:
        return known_data()["builtin"][kind].name
    raw = str(source.get("path") or "")
    if not raw:
        return "(not recorded)"
    name = Path(raw.rstrip("/\\")).name or raw
    return name + "/" if raw.endswith(("/", "\\")) or (not _GLOB_CHARS & set(raw) and os.path.isdir(raw)) else name


def _identify(source: dict, search: list[Path]) -> Known | None:
    """The known public data set `source` is: by its kind (the built-in corpus), its Hugging Face name, the sha256
    its data mix recorded, or the sha256 of its files where they are found (each file must be a known one)."""
    known = known_data()
    kind = source.get("kind")
    if kind in known["builtin"]:
        return known["builtin"][kind]
    if kind == "hf":
        return known["hf"].get(str(source.get("dataset") or "").lower())
    if source.get("sha256") in known["files"]:
        return known["files"][source["sha256"]][1]
    files = _files(str(source.get("path") or ""), search)
    found = [_known_file(f) for f in files]
    if not found or None in found:
        return None
    names, licenses = list(dict.fromkeys(k.name for k in found)), list(dict.fromkeys(k.license for k in found))
    return found[0] if len(names) == 1 else Known(" + ".join(names), "; ".join(licenses))


def _known_file(path: Path) -> Known | None:
    """The known data set whose file `path` is byte for byte; only a file of a known size is read."""
    try:
        size = path.stat().st_size
    except OSError:
        return None
    for digest, (length, known) in known_data()["files"].items():
        if size == length and sha256_file(path) == digest:
            return known
    return None


def _files(raw: str, search: list[Path]) -> list[Path]:
    """The files a recorded path names (a file, a folder's files, a glob's matches), looked for as it is and, when
    relative, from each folder of `search`; [] when none is found."""
    if not raw:
        return []
    raw = os.path.expanduser(raw)
    bases = [Path(raw)] if os.path.isabs(raw) else [Path(raw), *(Path(d) / raw for d in search)]
    for base in bases:
        if _GLOB_CHARS & set(raw):
            files = sorted(Path(p) for p in glob.glob(str(base), recursive=True) if Path(p).is_file())
        elif base.is_dir():
            files = sorted(p for p in base.rglob("*") if p.is_file())
        else:
            files = [base] if base.is_file() else []
        if files:
            return files
    return []
