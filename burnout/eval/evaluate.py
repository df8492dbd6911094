"""`burnout eval`: validation loss and zero-shot benchmarks for one checkpoint or every checkpoint of a run.

Results land in the run folder (a checkpoint outside a run folder keeps them in its own folder):

    RUN/eval/step_0000500.json   one checkpoint: {"checkpoint", "step", "tokens", "tasks": {task: metrics}}
    RUN/eval/summary.md          step → scores table over every evaluated checkpoint (also printed)
    RUN/eval/summary.json        the same rows, machine-readable
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer

from burnout.common import write_atomic
from burnout.core.checkpoint import list_checkpoints, resolve_checkpoint
from burnout.core.device import autocast, configure_backends, resolve_device, resolve_precision
from burnout.core.model_files import load_model
from burnout.data.loader import TokenLoader
from burnout.data.shards import read_meta
from burnout.data.tokenizer import tokenizer_sha256
from burnout.errors import BurnoutError
from burnout.eval.scoring import score_examples
from burnout.eval.tasks import BENCHMARKS, load_task, task_file
from burnout.models import Transformer

TASKS = ("val", *BENCHMARKS)
EVAL_DIR = "eval"


def parse_tasks(spec: str | list[str]) -> list[str]:
    """'val,hellaswag' → ['val', 'hellaswag'], each checked against TASKS ('all' means every task)."""
    names = [t.strip() for t in (spec.split(",") if isinstance(spec, str) else spec) if t.strip()]
    if names == ["all"]:
        return list(TASKS)
    if not names:
        raise BurnoutError(f"--tasks is empty; choose from {','.join(TASKS)}")
    for name in names:
        if name not in TASKS:
            raise BurnoutError(f"unknown task '{name}'; choose from {','.join(TASKS)} (comma-separated) or all")
    return list(dict.fromkeys(names))


def run_dir_of(checkpoint: Path) -> Path:
    """The run folder holding RUN/checkpoints/step_N, or the checkpoint folder itself when it stands alone."""
    return checkpoint.parent.parent if checkpoint.parent.name == "checkpoints" else checkpoint


def token_byte_lengths(tokenizer: Tokenizer) -> torch.Tensor:
    """UTF-8 bytes of text that each token id stands for; 0 for special tokens such as <|endoftext|>.

    Byte-level BPE writes each byte as one character of its 256-symbol alphabet, so a token's byte
    count is its string length; other tokenizers' tokens are plain text.
    """
    from tokenizers import pre_tokenizers

    byte_level = isinstance(tokenizer.pre_tokenizer, pre_tokenizers.ByteLevel)
    special = {t.content for t in tokenizer.get_added_tokens_decoder().values() if t.special}
    lengths = torch.zeros(tokenizer.get_vocab_size(), dtype=torch.long)
    for token, i in tokenizer.get_vocab().items():
        if token not in special:
            lengths[i] = len(token) if byte_level else len(token.encode("utf-8"))
    return lengths


@torch.no_grad()
def evaluate_val(model: Transformer, tokenizer: Tokenizer, data_dir: str | Path, seq_len: int, batch_size: int = 8,
                 limit: int | None = None) -> dict[str, float]:
    """Loss, perplexity and bits per byte over the val split's non-overlapping windows (the first `limit`).

    loss and perplexity average over every token, as training's val_loss does. bits_per_byte is
    tokenizer-independent: the summed loss of tokens that stand for text (not <|endoftext|>), in bits,
    over the UTF-8 bytes they stand for.
    """
    meta = read_meta(data_dir)
    if meta.get("tokenizer_sha256") and meta["tokenizer_sha256"] != tokenizer_sha256(tokenizer):
        raise BurnoutError(
            f"val data '{data_dir}' was tokenized with another tokenizer than this checkpoint's; "
            "pass --data with a folder prepared with the checkpoint's tokenizer.json"
        )
    loader = TokenLoader(data_dir, "val", batch_size=batch_size, seq_len=seq_len, seed=0)
    windows = (loader.num_tokens - 1) // seq_len
    windows = min(windows, limit) if limit else windows
    byte_lengths = token_byte_lengths(tokenizer)
    device = model.tok_emb.weight.device
    # On a GPU, bf16 (fp16 before Ampere) with TF32 for what stays fp32, as training computes its val loss:
    # plain fp32 there gets neither tensor cores nor flash attention. On CPU it is fp32, as before.
    precision = resolve_precision("auto", device)
    configure_backends(device)
    total_nats, count, text_nats, text_bytes = 0.0, 0, 0.0, 0
    for x, y in loader.iter_eval_batches(math.ceil(windows / batch_size)):
        left = windows - count // seq_len
        x, y = x[:left], y[:left]
        with autocast(device, precision):
            logits = model(x.to(device))
        logits = logits.float()
        nats = F.cross_entropy(logits.view(-1, logits.size(-1)), y.to(device).view(-1), reduction="none").cpu().double()
        total_nats += float(nats.sum())
        count += y.numel()
        nbytes = byte_lengths[y.view(-1)]
        text_nats += float(nats[nbytes > 0].sum())
        text_bytes += int(nbytes.sum())
    loss = total_nats / count
    return {
        "loss": loss,
        "perplexity": math.exp(loss),
        "bits_per_byte": text_nats / math.log(2) / text_bytes if text_bytes else math.nan,
        "tokens": count,
    }


def evaluate_checkpoint(
    path: str | Path,
    tasks: list[str],
    limit: int | None = None,
    data_root: str | Path | None = None,
    task_files: dict[str, str] | None = None,
    data_dir: str | Path | None = None,
    batch_size: int = 16,
    device: str = "auto",
    say: Callable[[str], None] = print,
) -> dict:
    """Score one checkpoint on `tasks` and write RUN/eval/step_N.json; returns that record."""
    tasks = parse_tasks(tasks)
    # Resolve every data file first: a missing one fails before any model is loaded.
    files = {t: task_file(t, data_root, task_files) for t in tasks if t != "val"}
    dev = resolve_device(device)
    model, tokenizer, ckpt = load_model(path, dev)
    record: dict = {"checkpoint": str(ckpt.path), "step": ckpt.info.get("step"), "tokens": ckpt.info.get("tokens"),
                    "limit": limit, "tasks": {}}
    for task in tasks:
        if task == "val":
            val_dir = data_dir or ckpt.config.data.prepared_dir
            if not val_dir:
                raise BurnoutError(f"checkpoint {ckpt.path} names no prepared data; pass --data DIR for the val task")
            seq_len = ckpt.config.train.seq_len or model.cfg.context_length
            result = evaluate_val(model, tokenizer, val_dir, seq_len, limit=limit)
        else:
            examples = load_task(task, files[task], limit)
            result, _ = score_examples(model, tokenizer, task, examples, batch_size)
        record["tasks"][task] = result
        say(f"step {record['step']}: {task} " + ", ".join(f"{k} {_fmt(v)}" for k, v in result.items()))
    out = run_dir_of(ckpt.path) / EVAL_DIR / f"{ckpt.path.name}.json"
    _write_json(out, record)
    return record


def evaluate(
    target: str | Path,
    tasks: list[str] | str,
    all_checkpoints: bool = False,
    say: Callable[[str], None] = print,
    **kwargs,
) -> list[dict]:
    """Evaluate a checkpoint, a run's latest checkpoint, or (all_checkpoints) every checkpoint of a run;
    then rewrite RUN/eval/summary.{md,json} from every result in RUN/eval and print the table."""
    tasks = parse_tasks(tasks)
    if all_checkpoints:
        paths = list_checkpoints(Path(target))
        if not paths:
            raise BurnoutError(f"'{target}' holds no checkpoints/step_* folders; --all-checkpoints needs a run folder")
    else:
        paths = [resolve_checkpoint(target)]
    records = [evaluate_checkpoint(p, tasks, say=say, **kwargs) for p in paths]
    run_dir = run_dir_of(paths[0])
    table = write_summary(run_dir)
    say(table)
    return records


SUMMARY_COLUMNS = [
    ("val", "loss", "val loss"), ("val", "perplexity", "val ppl"), ("val", "bits_per_byte", "val bpb"),
    ("hellaswag", "acc", "hellaswag acc"), ("hellaswag", "acc_norm", "hellaswag acc_norm"),
    ("arc_easy", "acc", "arc_easy acc"), ("arc_easy", "acc_norm", "arc_easy acc_norm"),
    ("lambada", "acc", "lambada acc"), ("lambada", "perplexity", "lambada ppl"),
]


def write_summary(run_dir: Path) -> str:
    """The step → scores Markdown table over RUN/eval/step_*.json, written to summary.md and summary.json."""
    eval_dir = Path(run_dir) / EVAL_DIR
    records = sorted(
        (json.loads(p.read_text(encoding="utf-8")) for p in eval_dir.glob("step_*.json")),
        key=lambda r: r.get("step") or 0,
    )
    present = [c for c in SUMMARY_COLUMNS if any(c[1] in r["tasks"].get(c[0], {}) for r in records)]
    lines = ["| step | tokens | " + " | ".join(c[2] for c in present) + " |",
             "|---:|---:|" + "---:|" * len(present)]
    for r in records:
        cells = [_fmt(r["tasks"].get(task, {}).get(key)) for task, key, _ in present]
        lines.append(f"| {r.get('step')} | {r.get('tokens') or ''} | " + " | ".join(cells) + " |")
    table = "\n".join(lines) + "\n"
    write_atomic(eval_dir / "summary.md", table)
    _write_json(eval_dir / "summary.json", {"rows": records})
    return table


def _fmt(value) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.4f}"
    return str(value)


def _write_json(path: Path, data) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(data, indent=2) + "\n")
