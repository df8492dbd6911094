"""`burnout report`: a run's report as a self-contained HTML page and a Markdown file, and a terminal summary.

The report is built once as a list of blocks (headings, tables, images, text) and written in both formats,
so the HTML and the Markdown always say the same thing.
"""

from __future__ import annotations

import base64
import html
import json
import math
import shlex
import statistics
from dataclasses import dataclass
from pathlib import Path

from burnout.base.files import REPORT_DIR, write_atomic
from burnout.base.folders import check_output_folder, mark_folder
from burnout.base.text import first_line, format_duration, next_steps
from burnout.core.checkpoint import mirror_run_logs
from burnout.errors import BurnoutError
from burnout.eval.references import reference_table
from burnout.finetune.rl import EXAMPLES_FILE
from burnout.generate.prompts import sample_prompts
from burnout.generate.sampling import shown_sample
from burnout.report import plots
from burnout.report.runlog import RunLog, anomalies, eval_rows, load_run, phase_rows, throughput
from burnout.train.checkpointing import best_checkpoint
from burnout.train.ladder import ladder_figure, read_ladder


@dataclass
class Block:
    kind: str  # "h2", "p", "table", "image", "list", "markdown"
    text: str = ""
    columns: list[str] | None = None
    rows: list[list] | None = None
    items: list[str] | None = None
    png: bytes = b""


def write_report(run_paths: list[str | Path], out: str | Path | None = None, html_page: bool = True,
                 markdown: bool = True, log_scale: bool = False,
                 overwrite: bool = False) -> tuple[list[RunLog], list[Path]]:
    """Write the report of one run (default: RUN/report/) or the overlay of several (needs `out`). Any `out` but a
    run's own RUN/report is new, empty or a report of the same runs (of others: with `overwrite`)."""
    runs = [load_run(p) for p in run_paths]
    if out is None:
        if len(runs) > 1:
            raise BurnoutError("a report over several runs needs --out DIR (where to write the overlay)")
        out = runs[0].path / REPORT_DIR
    out = Path(out)
    if len(runs) > 1 or out.resolve() != (runs[0].path / REPORT_DIR).resolve():
        source = ", ".join(str(run.path.resolve()) for run in runs)
        check_output_folder(out, "--out", "report", source, reads=[run.path for run in runs], overwrite=overwrite)
        mark_folder(out, "report", source)
    out.mkdir(parents=True, exist_ok=True)
    title, blocks = (run_blocks(runs[0], log_scale) if len(runs) == 1 else overlay_blocks(runs, log_scale))
    written = write_blocks(out, title, blocks, html_page, markdown)
    mirror = runs[0].train.checkpoint.mirror_dir
    if mirror and out == runs[0].path / REPORT_DIR:  # the run's own report survives the machine with its logs
        mirror_run_logs(runs[0].path, Path(mirror))
        written.append(Path(mirror) / REPORT_DIR)
    return runs, written


def write_blocks(out: Path, title: str, blocks: list[Block], html_page: bool = True,
                 markdown: bool = True) -> list[Path]:
    """OUT/report.md (its images beside it) and OUT/report.html (images embedded) from the same blocks."""
    written = []
    if markdown:
        written += _write_markdown(out, title, blocks)
    if html_page:
        path = out / "report.html"
        write_atomic(path, _html(title, blocks))
        written.append(path)
    return written


def run_blocks(run: RunLog, log_scale: bool) -> tuple[str, list[Block]]:
    m, last, train = run.model, run.last, run.config.get("train", {})
    speed, logged = throughput(run.records), run.series("tokens_per_s")[2]
    summary = [
        ["model", f"{m['family']}, {m['config']['n_layer']} layers × {m['config']['d_model']} wide, "
                  f"{m['config']['n_head']} heads, context {m['config']['context_length']}"],
        ["parameters", f"{m['params_total']:,} ({m['params_non_embedding']:,} non-embedding)"],
        ["FLOPs per token", f"{m['flops_per_token']:,} (train, forward + backward, seq_len {m['seq_len']})"],
        ["vocabulary", f"{m['config']['vocab_size']:,} ({run.config.get('tokenizer', {}).get('kind', '?')} tokenizer)"],
        ["batch", f"{train.get('batch_size')} × {train.get('grad_accum')} accumulation × {m['seq_len']} tokens"],
        ["hardware", (f"{run.launches[-1]['device']}, " if run.launches else "")
                     + f"device {train.get('device')}, precision {train.get('precision')}"],
        ["steps", f"{last['step']:,} of {train.get('max_steps')}"],
        ["tokens", f"{last['tokens']:,}"],
        ["final train loss", _fmt(run.last_value("train_loss"))],
        ["final val loss", _fmt(run.last_value("val_loss"))],
        ["wall time", format_duration(last["elapsed_s"])],
        ["tokens/s", _rate(speed["tokens_per_s"]) + " (tokens over the wall time, evaluation and checkpoints "
                     "included)" + (f"; {_rate(statistics.median(logged))} while stepping (the median of the log's "
                                    "lines)" if logged else "")],
        ["config hash", f"{run.config_hash} (sha256 of config.yaml's content)"],
    ]
    if "mfu" in speed:
        summary.append(["MFU", _percent(speed["mfu"]) + " (the mean of the log's lines)"])
    if run.last_value("dollars") is not None:
        summary.append(["dollars spent", _fmt(run.last_value("dollars"))])
    best = best_checkpoint(run.checkpoints)
    if best is not None:
        kept = " (kept by train.keep_best)" if run.train.checkpoint.keep_best else ""
        summary.append(["best checkpoint", f"{best['name']}, val loss {_fmt(best['val_loss'])}{kept}"])
    first_steps = run.series("first_step_s")[2]  # compile and warm-up: what tokens/s leaves out
    if first_steps:
        summary.append(["first step of each session", ", ".join(f"{s:.1f} s" for s in first_steps)
                        + " (compilation, warm-up; not in tokens/s)"])
    blocks = [
        Block("p", f"Run folder `{run.path}`. Every number below comes from its config.yaml, metrics.jsonl, "
                   "checkpoints and eval files."),
        Block("table", columns=["", "value"], rows=summary),
        *prediction_blocks(run),
        *lineage_blocks(run),
        *fine_tune_blocks(run),
        Block("h2", "Loss and learning rate"),
        Block("image", "loss_vs_steps", png=plots.loss_plot(run, "step", log_scale)),
        Block("image", "loss_vs_tokens", png=plots.loss_plot(run, "tokens", log_scale)),
        Block("image", "learning_rate", png=plots.lr_plot(run)),
        Block("h2", "Phases"),
        _phase_table(run),
        Block("h2", "Checkpoints"),
        Block("table", columns=["checkpoint", "step", "tokens", "train loss", "val loss", "elapsed"],
              rows=[[c["name"] + (" (best)" if c is best else ""), c.get("step"), c.get("tokens"),
                     c.get("train_loss"), c.get("val_loss"),
                     format_duration(c["elapsed_s"]) if "elapsed_s" in c else None] for c in run.checkpoints]),
    ]
    blocks.append(Block("h2", "Evaluation"))
    if any(k.startswith("eval/") for r in run.records for k in r):
        blocks.append(Block("p", f"Scored during training at each evaluation (train.eval_tasks, the first "
                                 f"{run.train.eval.eval_task_items} items of each):"))
        blocks.append(Block("image", "benchmarks_during_training", png=plots.task_plot(run)))
    if run.evals:
        columns, rows = eval_rows(run)
        blocks.append(Block("table", columns=columns, rows=[[row.get(c) for c in columns] for row in rows]))
        published = reference_table(task for _, data in run.evals for task in data.get("tasks", {}))
        if published:
            blocks.append(Block("p", "Published scores of public models at comparable sizes, for context "
                                     "(burnout/eval/references.yaml, each row with its source):"))
            blocks.append(Block("markdown", published))
    else:
        blocks.append(Block("p", f"No evaluation results in `{run.path / 'eval'}`; run `burnout eval {run.path}`."))
    blocks.append(Block("h2", "Same prompts, different checkpoints"))
    if run.compare_md:
        blocks.append(Block("markdown", run.compare_md))
    else:
        blocks.append(Block("p", f"No `compare.md` yet; `burnout compare {run.path}` writes one."))
    samples = [r for r in run.records if r.get("sample")]
    if samples:
        blocks.append(Block("h2", "Samples during training"))
        prompts = sample_prompts(run.path)
        blocks.append(Block("p", (f"Each continues the run's first sample prompt (its prompts: "
                                  f"{', '.join(map(json.dumps, prompts))}). " if prompts else "")
                            + "Repetition: the share of a sample's word 3-grams that repeat (1 − distinct-3); "
                              "a loop reads near 1."))
        blocks.append(Block("table", columns=["step", "val loss", "repetition", "sample"],
                            rows=[[r["step"], r.get("val_loss"), r.get("sample_repetition"),
                                   shown_sample(r["sample"], r.get("sample_prompt", run.train.eval.sample_prompt))]
                                  for r in samples]))
    blocks += [Block("h2", "Launches"), _launch_table(run)]
    found = anomalies(run)
    blocks += [Block("h2", "Anomalies"), Block("list", items=found or ["none: no non-finite loss, skipped step, "
                                                                       "throughput drop, val loss above a uniform "
                                                                       "guess or far above train in the log"])]
    return f"Run report: {run.name}", blocks


def prediction_verdict(run: RunLog) -> str | None:
    """What `burnout plan` predicted for a run written with --write-config (its prediction section) against its final
    val loss: inside the interval or not, and by how much; None for a run without one."""
    p = run.config.get("prediction")
    if not isinstance(p, dict):
        return None
    kind = f"{p['level']:.0%} interval" if p.get("ladder") else "the published fits' range"
    said = f"predicted val loss {p['val_loss']:.4f} ({kind} {p['low']:.4f}–{p['high']:.4f})"
    steps, _, losses = run.series("val_loss")
    end = run.config.get("train", {}).get("max_steps")
    if not losses or steps[-1] != end:
        return f"{said}; the run has no final val loss yet (its last evaluation is not at step {end})"
    final, off = losses[-1], losses[-1] / p["val_loss"] - 1
    where = "inside the interval" if p["low"] <= final <= p["high"] else \
        f"outside the interval ({'below' if final < p['low'] else 'above'} it)"
    return f"{said}; final val loss {final:.4f}, {off:+.2%} from the prediction: {where}"


def prediction_blocks(run: RunLog) -> list[Block]:
    """A planned run's section: the prediction against the final val loss and, when the prediction came from a
    ladder that is still there, the ladder's plot with this run's point on it."""
    verdict = prediction_verdict(run)
    if verdict is None:
        return []
    p = run.config["prediction"]
    blocks = [Block("h2", "Predicted against achieved"),
              Block("p", f"{verdict}. Source: {'the ladder ' + p['ladder'] if p.get('ladder') else p['source']}, "
                         f"for {p['params']:,} parameters and {p['tokens']:,} tokens.")]
    if p.get("ladder"):
        try:
            ladder = read_ladder(p["ladder"], "prediction.ladder")
        except BurnoutError as exc:
            return [*blocks, Block("p", f"The ladder's plot is left out: {exc}")]
        final = run.last_value("val_loss") if "final val loss" in verdict else None
        point = {"flops": run.model["flops_per_token"] * p["tokens"], "predicted": p["val_loss"], "low": p["low"],
                 "high": p["high"], "val_loss": final, "label": run.name}
        blocks.append(Block("image", "ladder", png=ladder_figure(ladder, point)))
    return blocks


def lineage_blocks(run: RunLog) -> list[Block]:
    """A continued run's section (train.init_from): the checkpoint its step 0 loaded, the parent's data and its own."""
    lineage = run.lineage
    if lineage is None:
        return []
    curve = ("its loss curve comes first in the loss plots" if run.parent_records else
             "its metrics.jsonl is not there, so the loss plots show this run alone")
    rows = [["started from", f"`{lineage['init_from']}` (step {lineage['parent_step']:,}, "
                             f"{lineage.get('parent_tokens', 0):,} tokens)"],
            ["parent run", f"`{lineage['parent_run']}`: {curve}"],
            ["parent's data", f"`{lineage['parent_data']}`"],
            ["this run's data", f"`{lineage['data']}`"],
            ["weights loaded", f"sha256 {lineage['weights_sha256']} (model.safetensors)"],
            ["optimizer", "the parent's moments carried" if run.config.get("train", {}).get("init_optimizer")
             == "carry" else "fresh"]]
    return [Block("h2", "Continued from"), Block("table", columns=["", "value"], rows=rows)]


def fine_tune_blocks(run: RunLog) -> list[Block]:
    """An SFT, DPO or RL run's section: what it started from and trained on, what its loss counts, (DPO) the
    rewards' margin and accuracy on training and held-out pairs, and (RL) the reward and the held-out pass rates."""
    sft, dpo, rl = run.config.get("sft"), run.config.get("dpo"), run.config.get("rl")
    section = dpo or sft or rl
    if section is None:
        return []
    kind = "DPO" if dpo else "RL (GRPO)" if rl else "SFT"
    lora = section.get("lora")
    rows = [["kind", kind + (f", LoRA r={lora['r']} alpha={lora['alpha']:g} on "
                                                  f"{', '.join(lora['targets'])} (base frozen)" if lora else
                                                  ", full fine-tuning")],
            ["started from", f"`{section['base']}`"],
            ["data", f"`{section['source']}` ({section.get('layout', 'auto')} layout), "
                     f"{section.get('val_fraction')} held out"]]
    if dpo:
        rows.append(["loss", f"DPO's, β {dpo['beta']}, against the starting model as reference; ln 2 = 0.6931 "
                             "at step 0"])
    elif rl:
        rows.append(["loss", f"GRPO's: {rl['group_size']} answers sampled per question (temperature "
                             f"{rl['temperature']:g}), scored by the {rl['reward']} reward, each weighed by its "
                             "reward less its group's mean" + (f"; KL to the start × {rl['kl_coef']:g}"
                                                              if rl.get("kl_coef") else "")])
    else:
        rows.append(["loss", "on assistant tokens only" if sft.get("train_on", "assistant") == "assistant"
                     else "on every token but the template's role headers"])
    if sft and sft.get("added_tokens"):
        rows.append(["tokens added to the base", ", ".join(f"`{t}`" for t in sft["added_tokens"])])
    blocks = [Block("h2", "Fine-tuning"), Block("table", columns=["", "value"], rows=rows)]
    if dpo and run.series("margin")[2]:
        blocks.append(Block("image", "dpo_rewards", png=plots.dpo_plot(run)))
        last = {key: run.last_value(key) for key in ("accuracy", "margin", "val_accuracy", "val_margin")}
        blocks.append(Block("table", columns=["last", "train pairs", "held-out pairs"],
                            rows=[["reward accuracy", last["accuracy"], last["val_accuracy"]],
                                  ["reward margin", last["margin"], last["val_margin"]]]))
    if rl and run.series("reward")[2]:
        blocks.append(Block("image", "rl_rewards", png=plots.rl_plot(run)))
        rows = [[name, *(values[i] if values else None for i in (0, -1))]
                for name, values in (("mean reward (train answers)", run.series("reward")[2]),
                                     ("groups with signal", run.series("signal")[2]),
                                     ("held-out pass@1", run.series("val_pass@1")[2]),
                                     (f"held-out pass@{rl['group_size']}", run.series("val_pass@k")[2]))]
        blocks.append(Block("table", columns=["", "first", "last"], rows=rows))
    examples = run.path / EXAMPLES_FILE
    if rl and examples.is_file():
        try:
            rows = [[e["question"], f"{e['before']['answer']} (reward {e['before']['reward']:g})",
                     f"{e['after']['answer']} (reward {e['after']['reward']:g})"]
                    for e in json.loads(examples.read_text(encoding="utf-8"))]
        except (OSError, ValueError, KeyError, TypeError) as exc:  # cut short or edited: said, not fatal
            blocks.append(Block("p", f"`{examples}` cannot be read ({type(exc).__name__}: {first_line(exc)}), so "
                                     "the held-out answers are left out; the run writes it again at its end"))
        else:
            blocks.append(Block("table", columns=["held-out question", "the starting model's answer",
                                                  "the run's answer"], rows=rows))
    return blocks


def overlay_blocks(runs: list[RunLog], log_scale: bool) -> tuple[str, list[Block]]:
    rows = [[r.name, r.model["params_total"], r.last["step"], r.last["tokens"], r.last_value("train_loss"),
             r.last_value("val_loss"), format_duration(r.last["elapsed_s"]), r.config_hash] for r in runs]
    return "Runs compared: " + ", ".join(r.name for r in runs), [
        Block("p", "Runs: " + ", ".join(f"`{r.path}`" for r in runs)),
        Block("image", "overlay_loss_vs_tokens", png=plots.overlay_plot(runs, log_scale)),
        Block("table", columns=["run", "params", "steps", "tokens", "final train loss", "final val loss",
                                "wall time", "config hash"], rows=rows),
    ]


def _launch_table(run: RunLog) -> Block:
    if not run.launches:
        return Block("p", f"No `launches.jsonl` in `{run.path}`: "
                          f"the run was started by a burnout that did not record launches.")
    rows = [[launch["time"], launch["step"], shlex.join(launch["argv"]),
             launch.get("git_commit") or "not a git checkout",
             launch["device"] + (f" × {launch['world_size']}" if launch.get("world_size", 1) > 1 else ""),
             launch["versions"]["torch"]] for launch in run.launches]
    return Block("table", columns=["started", "from step", "command", "git commit", "device", "torch"], rows=rows)


def _phase_table(run: RunLog) -> Block:
    phases = phase_rows(run)
    columns = ["phase", "steps", "tokens", "train loss", "val loss", "time", "tokens/s"]
    keys = ["phase", "steps", "tokens", "train_loss", "val_loss", "time_s", "tokens_per_s"]
    for key, label in (("mfu", "MFU"), ("budget", "budget $"), ("dollars_predicted", "predicted $"),
                       ("dollars", "actual $")):
        if any(key in p for p in phases):
            columns.append(label)
            keys.append(key)
    shown = {"time_s": format_duration, "tokens_per_s": _rate, "mfu": _percent}
    rows = [[shown[k](p[k]) if k in shown and p.get(k) is not None else p.get(k) for k in keys] for p in phases]
    return Block("table", columns=columns, rows=rows)


def _rate(tokens_per_s: float | None) -> str:
    """Tokens/s to the token, as the log prints them."""
    return "–" if tokens_per_s is None else f"{tokens_per_s:,.0f}"


def _percent(mfu: float) -> str:
    """MFU as a percentage, as the log prints it."""
    return f"{mfu:.1%}"


def terminal_summary(runs: list[RunLog], written: list[Path]) -> str:
    lines = []
    for run in runs:
        last = run.last
        lines.append(f"{run.name}: {last['step']:,} steps, {last['tokens']:,} tokens, "
                     f"train loss {_fmt(run.last_value('train_loss'))}, val loss {_fmt(run.last_value('val_loss'))}, "
                     f"{format_duration(last['elapsed_s'])}, {run.model['params_total']:,} params")
        steps, _, losses = run.series("train_loss")
        lines.append(text_curve(steps, losses))
        lines += [f"  anomaly: {a}" for a in anomalies(run)]
        verdict = prediction_verdict(run)
        if verdict is not None:
            lines.append(f"  {verdict}")
    lines += [f"wrote {p}" for p in written]
    if len(runs) == 1:  # the commands whose results the report would show, and does not yet
        run, rows = shlex.quote(str(runs[0].path)), []
        if not runs[0].evals:
            rows.append(("eval", f"burnout eval {run} --tasks val"))
        if runs[0].compare_md is None:
            rows.append(("compare", f"burnout compare {run}   (the same prompts at each checkpoint)"))
        lines += next_steps(rows)
    return "\n".join(lines)


def text_curve(xs: list[int], ys: list[float], width: int = 60, height: int = 10) -> str:
    """The loss curve drawn with `*` in a character grid, y labelled at top, middle and bottom."""
    if not ys:
        return "  (no loss logged)"
    lo, hi = min(ys), max(ys)
    span = (hi - lo) or 1.0
    x0, x1 = xs[0], xs[-1]
    grid = [[" "] * width for _ in range(height)]
    for x, y in zip(xs, ys):
        col = round((x - x0) / ((x1 - x0) or 1) * (width - 1))
        row = round((hi - y) / span * (height - 1))
        grid[row][col] = "*"
    labels = {0: hi, height // 2: hi - span * (height // 2) / (height - 1), height - 1: lo}
    out = [f"{labels[i]:>8.3f} |{''.join(r)}" if i in labels else f"{'':>8} |{''.join(r)}"
           for i, r in enumerate(grid)]
    out.append(f"{'':>8} +{'-' * width}")
    out.append(f"{'':>9}step {x0}{'':>{max(1, width - 10 - len(str(x0)) - len(str(x1)))}}step {x1}")
    return "\n".join(out)


# ----------------------------------------------------------------------------------------------
# Formats


def _write_markdown(out: Path, title: str, blocks: list[Block]) -> list[Path]:
    parts, written = [f"# {title}", ""], []
    for b in blocks:
        if b.kind == "image":
            png = out / f"{b.text}.png"
            write_atomic(png, b.png)
            written.append(png)
            parts.append(f"![{b.text}]({png.name})")
        elif b.kind == "h2":
            parts.append(f"## {b.text}")
        elif b.kind == "table":
            parts.append(_md_table(b.columns, b.rows))
        elif b.kind == "list":
            parts.append("\n".join(f"- {item}" for item in b.items))
        else:  # "p" and "markdown" are Markdown already
            parts.append(b.text.strip())
        parts.append("")
    path = out / "report.md"
    write_atomic(path, "\n".join(parts))
    return [path, *written]


def _md_table(columns: list[str], rows: list[list]) -> str:
    def cell(v) -> str:
        return _fmt(v).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


_CSS = """body{font-family:system-ui,sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem;color:#222}
table{border-collapse:collapse;margin:1rem 0}td,th{border:1px solid #ccc;padding:.3rem .6rem;vertical-align:top}
th{background:#f3f3f3}td{white-space:pre-wrap}img{max-width:100%;display:block;margin:1rem 0}code{background:#f3f3f3}"""


def _html(title: str, blocks: list[Block]) -> str:
    body = [f"<h1>{html.escape(title)}</h1>"]
    for b in blocks:
        if b.kind == "image":
            data = base64.b64encode(b.png).decode()
            body.append(f'<img alt="{b.text}" src="data:image/png;base64,{data}">')
        elif b.kind == "h2":
            body.append(f"<h2>{html.escape(b.text)}</h2>")
        elif b.kind == "table":
            body.append(_html_table(b.columns, [[_fmt(v) for v in row] for row in b.rows]))
        elif b.kind == "list":
            body.append("<ul>" + "".join(f"<li>{html.escape(i)}</li>" for i in b.items) + "</ul>")
        elif b.kind == "markdown":
            body.append(_markdown_to_html(b.text))
        else:
            body.append(f"<p>{_inline(b.text)}</p>")
    return (f'<!doctype html>\n<html><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
            f"<style>{_CSS}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")


def _html_table(columns: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    # Cells hold logged text (samples of code, too): escaped, never interpreted.
    body = "".join("<tr>" + "".join(f"<td>{html.escape(v)}</td>" for v in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _markdown_to_html(text: str) -> str:
    """The subset `burnout compare` writes: headings, pipe tables and paragraphs."""
    out, table = [], []

    def flush():
        if table:
            cells = [[c.strip().replace("\\|", "|") for c in _split_row(line)] for line in table]
            rows = [r for r in cells[1:] if not all(set(c) <= set("-: ") for c in r)]
            out.append(_html_table(cells[0], rows))
            table.clear()

    for line in text.splitlines():
        if line.lstrip().startswith("|"):
            table.append(line.strip())
            continue
        flush()
        if line.startswith("#"):
            level = min(6, len(line) - len(line.lstrip("#")) + 1)  # nested under the report's own h2
            out.append(f"<h{level}>{_inline(line.lstrip('#').strip())}</h{level}>")
        elif line.strip():
            out.append(f"<p>{_inline(line)}</p>")
    flush()
    return "\n".join(out)


def _split_row(line: str) -> list[str]:
    cells, current, escaped = [], "", False
    for ch in line.strip().strip("|"):
        if ch == "|" and not escaped:
            cells.append(current)
            current = ""
        else:
            current += ch
        escaped = ch == "\\"
    return [*cells, current]


def _inline(text: str) -> str:
    """Escape, then render `code` spans."""
    parts = html.escape(text).split("`")
    return "".join(f"<code>{p}</code>" if i % 2 else p for i, p in enumerate(parts))


def _fmt(value) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if not math.isfinite(value):
        return str(value)
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4f}"
