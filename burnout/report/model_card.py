"""The model card an export carries (README.md in the Hugging Face folder), written from the run's own files:
Hugging Face's YAML front matter (huggingface_hub's ModelCardData: library, tags, datasets where a source names
one, the eval scores as model-index results), then what the model is, what it was trained on and how, what it
started from, its scores beside published ones, the data audit's findings, and what it is for.

Every figure comes from the checkpoint's config.yaml and info.json, the run's metrics.jsonl, launches.jsonl and
eval/, and the data folder's meta.json and audit/audit.json; a piece that is not there is said to be missing,
not guessed.
"""

from __future__ import annotations

import json
from pathlib import Path

from huggingface_hub import EvalResult, ModelCardData

from burnout.common import AUDIT_DIR, AUDIT_JSON, METRICS_FILE, format_duration, read_jsonl, write_atomic
from burnout.config import load_run_config
from burnout.core.chat_template import is_chat_model
from burnout.core.checkpoint import checkpoint_info, resolve_checkpoint, run_dir_of
from burnout.data.shards import META_FILE
from burnout.eval.references import reference_table
from burnout.forensics.audit_summary import summary as audit_summary
from burnout.models.memory import param_counts
from burnout.train.provenance import read_launches

CARD_FILE = "README.md"
# How a card of ours is told from a README.md someone wrote: an export writes its card again, never theirs.
_MARK = "<!-- model card written by `burnout export` from the run's own files -->"
# The metric of each task a model-index entry names, as lm-evaluation-harness reports it.
_TASK_METRICS = {"hellaswag": "acc_norm", "arc_easy": "acc", "arc_challenge": "acc_norm", "lambada": "acc",
                 "piqa": "acc_norm", "winogrande": "acc"}
LIMITS = ("It was trained from scratch with GPUburnout, for learning and experiment. A model of this size writes "
          "text in the shape of its training data, not reliable facts: do not use its answers as advice or "
          "truth. It has had no safety training; it repeats what its data held, biases included.")


def write_model_card(checkpoint: str | Path, folder: str | Path) -> Path | None:
    """Write FOLDER/README.md, the card of `checkpoint` (a checkpoint folder, or a run folder: its newest), unless
    a README.md of someone else's is there (not a card of ours): that one is kept and None returned."""
    path = Path(folder) / CARD_FILE
    if path.exists() and _MARK not in path.read_text(encoding="utf-8", errors="replace"):
        return None
    write_atomic(path, model_card(checkpoint, Path(folder).name))
    return path


def model_card(checkpoint: str | Path, name: str) -> str:
    ckpt = resolve_checkpoint(checkpoint)
    run_dir = run_dir_of(ckpt)
    cfg = load_run_config(ckpt / "config.yaml")
    info = checkpoint_info(ckpt)
    data_dir = Path(cfg.data.prepared_dir) if cfg.data.prepared_dir else run_dir / "data"
    meta = _json(data_dir / META_FILE)
    evals = _evals(run_dir, info.get("step"))
    chat = is_chat_model(cfg)
    front = ModelCardData(
        model_name=name, library_name="transformers", pipeline_tag="text-generation",
        tags=["gpuburnout", cfg.model.family, "from-scratch", *(["chat", "chatml"] if chat else [])],
        datasets=[s.dataset for s in cfg.data.sources if s.kind == "hf" and s.dataset] or None,
        eval_results=_eval_results(evals) or None)
    sections = [f"# {name}", _summary(cfg, chat), _model_section(cfg), _data_section(cfg, meta, data_dir),
                _training_section(cfg, info, run_dir), _start_section(cfg, run_dir), _eval_section(evals),
                _audit_section(data_dir), f"## Intended use and limits\n\n{LIMITS}", _use_section(chat)]
    return f"---\n{front.to_yaml()}\n---\n{_MARK}\n\n" + "\n\n".join(s for s in sections if s) + "\n"


def _json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _summary(cfg, chat: bool) -> str:
    params = param_counts(cfg.model).total
    kind = "a chat model (ChatML)" if chat else "a base model: it continues text"
    return (f"A {cfg.model.family} language model of {params:,} parameters trained from scratch with GPUburnout; "
            f"{kind}. Every figure below was read from its run's own files when it was exported.")


def _model_section(cfg) -> str:
    m = cfg.model
    rows = [("family", m.family), ("layers", m.n_layer), ("width (d_model)", m.d_model), ("attention heads", m.n_head),
            ("context", f"{m.context_length} tokens"), ("vocabulary", f"{m.vocab_size:,}"),
            ("parameters", f"{param_counts(m).total:,}")]
    if m.family == "llama":
        rows.insert(4, ("key/value heads", m.n_kv_head or m.n_head))
    return "## Model\n\n" + _table(rows)


def _data_section(cfg, meta: dict | None, data_dir: Path) -> str:
    lines = ["## Training data", ""]
    fine_tune = cfg.fine_tune
    if fine_tune is not None:
        lines.append(f"Fine-tuned ({_fine_tune_kind(cfg)}) on `{fine_tune.source}`.")
        return "\n".join(lines)
    if meta is None:
        return "\n".join([*lines, f"The data folder `{data_dir}` was not found when this card was written."])
    per_source = meta.get("sources", {}).get("per_source", {})
    where = {s.name: s.dataset or s.path or "" for s in cfg.data.sources}
    rows = [(name, s.get("kind"), where.get(name, ""), f"{s.get('share', 0):.0%}", f"{s.get('tokens', 0):,}",
             f"{s.get('documents', 0):,}") for name, s in per_source.items()]
    lines.append(_table(rows, ["source", "kind", "from", "share", "tokens", "documents"]))
    splits = meta.get("splits", {})
    lines.append(f"\n{splits.get('train', {}).get('tokens', 0):,} train and {splits.get('val', {}).get('tokens', 0):,} "
                 f"val tokens; tokenizer: {meta.get('tokenizer_kind')}, {meta.get('vocab_size', 0):,} tokens.")
    return "\n".join(lines)


def _training_section(cfg, info: dict, run_dir: Path) -> str:
    tc = cfg.train
    rows = [("steps", f"{info.get('step', 0):,}"), ("tokens", f"{info.get('tokens', 0):,}"),
            ("batch", f"{tc.batch_size} × {tc.grad_accum} accumulation × {tc.seq_len or cfg.model.context_length}"),
            ("learning rate", f"{tc.lr:g} ({tc.schedule}, warmup {tc.warmup_steps}, min {tc.min_lr:g})"),
            ("precision", tc.precision)]
    for key, label in (("train_loss", "train loss"), ("val_loss", "val loss")):
        if info.get(key) is not None:
            rows.append((label, f"{info[key]:.4f}"))
    if info.get("elapsed_s") is not None:
        rows.append(("training time", format_duration(info["elapsed_s"])))
    launches = read_launches(run_dir)
    if launches:
        rows.append(("hardware", ", ".join(dict.fromkeys(launch["device"] for launch in launches))))
    dollars = [r["dollars"] for r in read_jsonl(run_dir / METRICS_FILE)
               if r.get("step", 0) <= info.get("step", 0) and isinstance(r.get("dollars"), (int, float))]
    if dollars:
        rows.append(("cost", f"${dollars[-1]:.2f}"))
    return "## Training\n\n" + _table(rows)


def _fine_tune_kind(cfg) -> str:
    return "RL (GRPO)" if cfg.rl is not None else "DPO" if cfg.dpo is not None else "SFT"


def _start_section(cfg, run_dir: Path) -> str:
    fine_tune = cfg.fine_tune
    if fine_tune is not None:
        return f"## Started from\n\n`{fine_tune.base}`, fine-tuned with {_fine_tune_kind(cfg)}."
    if cfg.train.init_from:
        return f"## Started from\n\n`{cfg.train.init_from}` (continued pretraining on the data above)."
    return ""


def _evals(run_dir: Path, step: int | None) -> dict:
    """The scores of the exported step (else of the newest step scored): {task: {metric: value}}."""
    records = [r for r in (_json(p) for p in sorted((run_dir / "eval").glob("step_*.json"))) if r]
    same = [r for r in records if r.get("step") == step]
    chosen = (same or records or [{}])[-1]
    return chosen.get("tasks", {})


def _eval_results(evals: dict) -> list[EvalResult]:
    results = []
    for task, scores in evals.items():
        metric = _TASK_METRICS.get(task, next(iter(scores), None))
        if metric in scores and isinstance(scores[metric], (int, float)):
            results.append(EvalResult(task_type="text-generation", dataset_type=task, dataset_name=task,
                                      metric_type=metric, metric_value=scores[metric]))
    return results


def _eval_section(evals: dict) -> str:
    if not evals:
        return "## Evaluation\n\nNot evaluated (`burnout eval RUN --tasks …` writes the scores a card shows)."
    rows = [(task, metric, f"{value:.4f}" if isinstance(value, float) else value)
            for task, scores in evals.items() for metric, value in scores.items()]
    published = reference_table(evals)
    return ("## Evaluation\n\n" + _table(rows, ["task", "metric", "score"])
            + ("\n\nPublished scores of public models near this size, for context:\n\n" + published
               if published else ""))


def _audit_section(data_dir: Path) -> str:
    audit = _json(data_dir / AUDIT_DIR / AUDIT_JSON)
    if audit is None:
        return ""
    try:
        text = audit_summary(audit, rows=5)
    except (KeyError, TypeError):  # an audit.json of another format
        return f"## Data audit\n\n`{data_dir / AUDIT_DIR / AUDIT_JSON}` could not be read as an audit report."
    return f"## Data audit\n\n`burnout data audit` of the training data found:\n\n```\n{text}\n```"


def _use_section(chat: bool) -> str:
    call = ("chat([{'role': 'user', 'content': 'Name a color.'}], max_new_tokens=60)[0]['generated_text'][-1]"
            if chat else "chat('Once upon a time', max_new_tokens=60)[0]['generated_text']")
    return ("## How to use\n\n```python\nfrom transformers import pipeline\n\n"
            f"chat = pipeline('text-generation', 'PATH_TO_THIS_FOLDER')\nprint({call})\n```")


def _table(rows, columns=("", "value")) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)
