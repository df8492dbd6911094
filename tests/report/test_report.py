"""`burnout report` on real training runs: the files, the plots and the numbers in the tables."""

import base64
import io
import json
import math
import re
import shlex
import shutil
import statistics
from pathlib import Path

import pytest
import yaml
from PIL import Image

from burnout.cli import main
from burnout.errors import BurnoutError
from burnout.eval.degeneration import distinct_n
from burnout.report.render import text_curve, write_report
from burnout.train.metrics import read_metrics


def assert_png(data: bytes) -> None:
    image = Image.open(io.BytesIO(data))
    assert image.format == "PNG"
    image.load()  # decodes every pixel: a truncated file fails here
    assert image.size[0] >= 400 and image.size[1] >= 200


def fmt(value: float) -> str:
    return f"{value:.4f}"


def test_report_of_one_run_holds_its_logged_numbers(sampled_runs, tmp_path):
    run = sampled_runs[0]
    records = read_metrics(run)
    runs, written = write_report([run], out=tmp_path / "r")
    names = sorted(p.name for p in written)
    assert names == ["learning_rate.png", "loss_vs_steps.png", "loss_vs_tokens.png", "report.html", "report.md"]
    for png in (tmp_path / "r").glob("*.png"):
        assert_png(png.read_bytes())

    md = (tmp_path / "r" / "report.md").read_text()
    last = records[-1]
    assert f"| final train loss | {fmt(last['train_loss'])} |" in md
    assert f"| final val loss | {fmt(last['val_loss'])} |" in md
    assert f"| tokens | {last['tokens']:,} |" in md
    assert f"{runs[0].model['params_total']:,}" in md
    # One phase (the run logged none) spanning the whole run.
    assert (f"| all | 0–{last['step']} | {last['tokens']:,} | "
            f"{fmt(last['train_loss'])} | {fmt(last['val_loss'])} |") in md
    infos = {ckpt: json.loads((run / "checkpoints" / f"step_{ckpt:07d}" / "info.json").read_text())
             for ckpt in (8, 16, 24)}
    best = min(infos, key=lambda ckpt: infos[ckpt]["val_loss"])  # each checkpoint's val loss is its own
    assert f"| best checkpoint | step_{best:07d}, val loss {fmt(infos[best]['val_loss'])} |" in md
    for ckpt, info in infos.items():
        assert (f"| step_{ckpt:07d}{' (best)' if ckpt == best else ''} | {ckpt} | {info['tokens']:,} | "
                f"{fmt(info['train_loss'])} | {fmt(info['val_loss'])} |") in md
    samples = [r for r in records if r.get("sample")]
    assert [r["step"] for r in samples] == [8, 16, 24]
    for r in samples:
        cell = r["sample"].replace("|", "\\|").replace("\n", " ")
        assert r["sample_repetition"] == pytest.approx(1 - distinct_n(r["sample"], 3))
        assert f"| {r['step']} | {fmt(r['val_loss'])} | {fmt(r['sample_repetition'])} | {cell} |" in md

    # The HTML page embeds the same PNGs, and loads nothing from elsewhere.
    page = (tmp_path / "r" / "report.html").read_text()
    embedded = re.findall(r'src="data:image/png;base64,([^"]+)"', page)
    assert len(embedded) == 3
    assert base64.b64decode(embedded[0]) == (tmp_path / "r" / "loss_vs_steps.png").read_bytes()
    assert "http://" not in page and "https://" not in page
    assert f"<td>final val loss</td><td>{fmt(last['val_loss'])}</td>" in page

    # Which command, code and machine produced these numbers.
    [launch] = runs[0].launches
    assert "## Launches" in md
    assert f"| {launch['time']} | 0 | {shlex.join(launch['argv'])} |" in md
    assert launch["device"] in md


def test_report_shows_phases_evals_compare_and_anomalies(sampled_runs, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(sampled_runs[0], run)
    records = read_metrics(run)
    # What the training engine logs on longer runs: MFU, dollars, phase summaries, a skipped NaN step.
    for r in records:
        r.update(mfu=0.25, dollars=r["step"] * 0.01)
    (run / "phases.jsonl").write_text(json.dumps(
        {"phase": "smoke", "step": 12, "budget": 0.5, "next": {"phase": "proof", "dollars_estimate": 0.12}}) + "\n")
    records[7]["train_loss"] = None
    records[7]["nan_skipped"] = 1
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (run / "eval").mkdir()
    (run / "eval" / "step_0000024.json").write_text(json.dumps({"step": 24, "val": {"loss": 5.25, "ppl": 190.6}}))
    (run / "compare.md").write_text("## Prompt: 'The '\n\n| step | output |\n|---|---|\n| 8 | The a\\|b |\n")

    write_report([run])
    md = (run / "report" / "report.md").read_text()
    header = ("| phase | steps | tokens | train loss | val loss | time | tokens/s | MFU | "
              "budget $ | predicted $ | actual $ |")
    assert header in md
    rows = [line for line in md.splitlines() if line.startswith(("| smoke |", "| proof (in progress) |"))]
    assert rows[0].startswith("| smoke | 0–12 | 1,536 |") and rows[0].endswith("| 25.0% | 0.5000 | – | 0.1200 |")
    assert (rows[1].startswith("| proof (in progress) | 12–24 | 1,536 |")
            and rows[1].endswith("| 25.0% | – | 0.1200 | 0.1200 |"))
    assert "| file | step | val.loss | val.ppl |" in md and "| step_0000024 | 24 | 5.2500 | 190.6000 |" in md
    assert "| 8 | The a\\|b |" in md
    assert f"step {records[7]['step']}: train loss is not finite" in md
    assert f"step {records[7]['step']}: nan_skipped = 1" in md
    page = (run / "report" / "report.html").read_text()
    assert "<tr><td>8</td><td>The a|b</td></tr>" in page


def test_overlay_and_cli(sampled_runs, tmp_path, capsys):
    assert main(["report", *map(str, sampled_runs), "--out", str(tmp_path / "both"), "--html"]) == 0
    out = capsys.readouterr().out
    assert "fast: 24 steps" in out and "slow: 24 steps" in out
    assert not (tmp_path / "both" / "report.md").exists()  # --html only
    page = (tmp_path / "both" / "report.html").read_text()
    embedded = re.findall(r'src="data:image/png;base64,([^"]+)"', page)
    assert len(embedded) == 1
    assert_png(base64.b64decode(embedded[0]))
    for run in sampled_runs:
        assert f"<td>{run.name}</td>" in page
        assert f"<td>{fmt(read_metrics(run)[-1]['val_loss'])}</td>" in page

    assert main(["report", *map(str, sampled_runs)]) == 2
    assert "needs --out" in capsys.readouterr().err
    assert main(["report", str(tmp_path)]) == 2
    assert "is not a run folder" in capsys.readouterr().err


@pytest.mark.slow
def test_a_report_folder_is_rewritten_for_its_runs_and_replaced_for_others_only_with_overwrite(sampled_runs, tmp_path,
                                                                                              capsys):
    out = tmp_path / "r"
    fast, slow = (str(run) for run in sampled_runs)
    assert main(["report", fast, "--out", str(out)]) == 0
    assert main(["report", fast, "--out", str(out)]) == 0  # the same run's report: written again
    page = (out / "report.html").read_bytes()
    capsys.readouterr()
    assert main(["report", slow, "--out", str(out)]) == 2
    assert capsys.readouterr().err == (
        f"burnout: error: --out {out} holds a report of {sampled_runs[0].resolve()}, not of "
        f"{sampled_runs[1].resolve()}; pass --overwrite to replace it, or choose another folder\n")
    assert (out / "report.html").read_bytes() == page
    assert main(["report", slow, "--out", str(out), "--overwrite"]) == 0
    assert (out / "report.html").read_bytes() != page
    run = shutil.copytree(sampled_runs[0], tmp_path / "run")
    (run / "report").mkdir()
    (run / "report" / "notes.md").write_text("mine")
    assert main(["report", str(run)]) == 0  # the run's own RUN/report, named or not, whatever else it holds
    assert main(["report", str(run), "--out", str(run / "report")]) == 0
    assert (run / "report" / "notes.md").read_text() == "mine"


def test_text_curve_draws_first_and_last_point():
    lines = text_curve([0, 10, 20], [6.0, 5.0, 4.0], width=21, height=5).splitlines()
    assert lines[0] == "   6.000 |*" + " " * 20
    assert lines[4] == "   4.000 |" + " " * 20 + "*"
    assert lines[2][10 + 10] == "*"


def test_empty_metrics_is_a_clear_error(sampled_runs, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(sampled_runs[0], run)
    (run / "metrics.jsonl").write_text("")
    with pytest.raises(BurnoutError, match="logged no step yet"):
        write_report([run])


def test_a_malformed_metrics_record_is_left_out_with_a_line_naming_it(sampled_runs, tmp_path, capsys):
    """A record whose step is text (a hand edit, another program's line) once failed the report with a TypeError:
    it is left out, and the report says so in one line naming the file and the line."""
    run = tmp_path / "run"
    shutil.copytree(sampled_runs[0], run)
    lines = (run / "metrics.jsonl").read_text().splitlines()
    record = json.loads(lines[2])
    lines[2] = json.dumps({**record, "step": str(record["step"])})
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")

    assert main(["report", str(run)]) == 0
    notice = (f'anomaly: {run / "metrics.jsonl"} line 3 is left out: its "step" is \'{record["step"]}\', not a '
              "whole number")
    out = capsys.readouterr().out
    assert notice in out and notice.removeprefix("anomaly: ") in (run / "report" / "report.md").read_text()
    assert f"run: {read_metrics(sampled_runs[0])[-1]['step']:,} steps" in out  # the other records are read


def test_metrics_with_no_usable_record_is_one_line(sampled_runs, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(sampled_runs[0], run)
    (run / "metrics.jsonl").write_text('{"step": "8", "tokens": 512, "elapsed_s": 1.0}\n[1, 2]\n')
    with pytest.raises(BurnoutError) as refused:
        write_report([run])
    assert str(refused.value) == (f'{run / "metrics.jsonl"} line 1 is left out: its "step" is \'8\', not a whole '
                                  f"number, and no record of {run / 'metrics.jsonl'} can be read; it was not written "
                                  "by `burnout train`, or was edited: restore it from train.mirror_dir")


def test_an_impossible_logged_mfu_is_left_out_with_a_line_saying_so(sampled_runs, tmp_path, capsys):
    """Logs from before the CPU's best peak was kept hold MFUs above 100% (506%, 653% were printed under load): the
    report shows none of them, and says how many it left out."""
    run = tmp_path / "run"
    shutil.copytree(sampled_runs[0], run)
    records = read_metrics(run)
    for record, mfu in zip(records, [0.25] * (len(records) - 2) + [5.06, 6.53]):
        record["mfu"] = mfu
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))

    assert main(["report", str(run)]) == 0
    notice = (f"anomaly: {run / 'metrics.jsonl'}: the MFU of 2 records is left out: above 100%, it was logged over a "
              "CPU peak measured while the machine was busy")
    md = (run / "report" / "report.md").read_text()
    assert notice in capsys.readouterr().out and notice.removeprefix("anomaly: ") in md
    assert "| MFU | 25.0% " in md and "5.06" not in md and "6.53" not in md


def test_tokens_per_second_and_mfu_are_one_figure_each_as_the_log_gives_them(tiny_run_config, tiny_bpe_data, tmp_path,
                                                                             capsys):
    """The summary's tokens/s is the phase row's: the last record's tokens over its wall time (not the mean of the
    log's windows, which time the steps alone, shown apart as such). MFU is a percentage, as the log prints it, the
    same mean in both tables."""
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(tiny_run_config(max_steps=12).to_dict()))
    run = tmp_path / "run"
    assert main(["train", str(config), "--out", str(run), "--data", str(tiny_bpe_data)]) == 0
    records = read_metrics(run)
    for i, record in enumerate(records):
        record["mfu"] = (0.2, 0.3, 0.31)[i % 3]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert main(["report", str(run)]) == 0
    md = (run / "report" / "report.md").read_text()
    shown = re.search(r"\| tokens/s \| ([\d,]+) \(", md).group(1)
    assert shown == f"{records[-1]['tokens'] / records[-1]['elapsed_s']:,.0f}"
    stepping = statistics.median(r["tokens_per_s"] for r in records if "tokens_per_s" in r)
    assert f"; {stepping:,.0f} while stepping" in md
    mfu = f"{statistics.fmean(r['mfu'] for r in records):.1%}"
    assert f"| MFU | {mfu} (" in md
    [phase] = [line for line in md.splitlines() if line.startswith("| all |")]
    assert phase.endswith(f"| {shown} | {mfu} |")


@pytest.mark.slow
def test_val_loss_above_a_uniform_guess_and_far_above_train_are_anomalies(sampled_runs, tmp_path, capsys):
    """What 628 train tokens under a 3.3M-parameter model logged (train 0.057, val 8.32 against ln 460 = 6.13): val
    above a uniform guess over the vocabulary, and far above train. The run as trained shows neither; nor do a gap
    with train not low, or a low train with val close to it (nanoGPT's Shakespeare overfits to 1.07 against 1.47)."""
    run = tmp_path / "run"
    shutil.copytree(sampled_runs[0], run)
    assert main(["report", str(run)]) == 0
    out = capsys.readouterr().out
    assert "uniform guess" not in out and "memorises" not in out
    vocab = yaml.safe_load((run / "config.yaml").read_text())["model"]["vocab_size"]
    uniform = math.log(vocab)
    records = read_metrics(run)
    evaluated = [r for r in records if "val_loss" in r]
    first, last = evaluated[0], evaluated[-1]

    def report(first_val, last_val, last_train) -> str:
        first["val_loss"] = first_val
        last.update(val_loss=last_val, train_loss=last_train)
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        assert main(["report", str(run)]) == 0
        printed = capsys.readouterr().out
        md = (run / "report" / "report.md").read_text()
        lines = [line.removeprefix("  anomaly: ") for line in printed.splitlines() if line.startswith("  anomaly: ")]
        assert all(line in md for line in lines)
        return "\n".join(lines)

    guess = f"a uniform guess (ln {vocab:,} = {uniform:.4f})"
    found = report(uniform - 1.5, uniform + 2, 0.06)
    assert (f"step {last['step']}: val loss {uniform + 2:.4f}, up from {uniform - 1.5:.4f} at step {first['step']}, "
            f"is above {guess}") in found
    assert (f"step {last['step']}: val loss {uniform + 2:.4f} against train loss 0.0600: the model memorises its "
            "training text") in found
    for r in evaluated:
        r["val_loss"] = uniform + 0.5
    found = report(uniform + 0.25, uniform + 0.5, 6.0)
    assert f"val loss never went below {guess}, its best {uniform + 0.25:.4f} at step {first['step']}:" in found
    assert "memorises" not in found
    for val, train in ((uniform - 0.5, uniform - 1.7), (1.5, 0.7)):  # train not low; val within 1 of train
        found = report(uniform - 1.0, val, train)
        assert "uniform guess" not in found and "memorises" not in found



def test_a_continued_run_shows_its_lineage_and_its_parents_curve_first(sampled_runs, tiny_bpe_data, tmp_path):
    from burnout.base.files import sha256_file
    from burnout.core.checkpoint import list_checkpoints
    from burnout.report.plots import loss_curves
    from burnout.report.runlog import load_run

    parent = sampled_runs[0]
    config = tmp_path / "child.yaml"
    config.write_text(yaml.safe_dump({"train": {"device": "cpu", "precision": "fp32", "batch_size": 2,
                                                "seq_len": 32, "max_steps": 4, "log_interval": 1,
                                                "eval_interval": 2, "eval_batches": 1, "ckpt_interval": 4}}))
    child = tmp_path / "child"
    assert main(["train", str(config), "--out", str(child), "--init-from", str(parent), "--data",
                 str(tiny_bpe_data)]) == 0
    assert main(["report", str(child)]) == 0
    md = (child / "report" / "report.md").read_text()
    checkpoint = list_checkpoints(parent)[-1]
    section = md[md.index("## Continued from"):]
    for fragment in (f"`{checkpoint.resolve()}` (step 24", f"`{parent.resolve()}`: its loss curve comes first",
                     f"sha256 {sha256_file(checkpoint / 'model.safetensors')}", "| optimizer | fresh |"):
        assert fragment in section, fragment

    run, parent_log = load_run(child), read_metrics(parent)
    curves = {label: (xs, ys) for label, xs, ys, _ in loss_curves(run, "step")}
    parent_train = [r for r in parent_log if "train_loss" in r and r["step"] <= 24]
    assert curves["parent train loss"] == ([r["step"] for r in parent_train], [r["train_loss"] for r in parent_train])
    own = [r for r in read_metrics(child) if "train_loss" in r]
    assert curves["train loss"] == ([24 + r["step"] for r in own], [r["train_loss"] for r in own])
    tokens = {label: xs for label, xs, _, _ in loss_curves(run, "tokens")}
    assert tokens["train loss"] == [parent_train[-1]["tokens"] + r["tokens"] for r in own]


def _anomalies(capsys) -> list[str]:
    return [line.removeprefix("  anomaly: ") for line in capsys.readouterr().out.splitlines()
            if line.startswith("  anomaly: ")]


@pytest.mark.slow
def test_a_run_that_ends_worse_than_it_started_is_an_anomaly(sampled_runs, tiny_bpe_data, tmp_path, capsys):
    """Where a run started: a continued run's parent's val loss at the checkpoint it loaded (a grown start point's: the
    checkpoint it was grown from), on the same data; else the run's own first evaluation. Trained far too hard, each
    ends above it and the report says so; trained gently, none does."""
    from burnout.core.checkpoint import list_checkpoints

    parent = sampled_runs[0]
    checkpoint = list_checkpoints(parent)[-1]
    parent_val = json.loads((checkpoint / "info.json").read_text())["val_loss"]
    log = ["train.max_steps=4", "train.eval_interval=2", "train.ckpt_interval=4", "train.warmup_steps=0"]
    hard, gentle = ["train.lr=0.3", "train.min_lr=0.3"], ["train.lr=1e-6", "train.min_lr=0"]

    def child(name: str, start: Path, lr: list[str]) -> list[str]:
        assert main(["train", "--init-from", str(start), "--out", str(tmp_path / name), *log, *lr]) == 0
        capsys.readouterr()
        assert main(["report", str(tmp_path / name)]) == 0
        found = _anomalies(capsys)
        md = (tmp_path / name / "report" / "report.md").read_text()
        assert all(line in md for line in found)
        return [line for line in found if "worse than it started" in line]

    [line] = child("hard", parent, hard)
    last = [r for r in read_metrics(tmp_path / "hard") if "val_loss" in r][-1]["val_loss"]
    assert last > parent_val + 0.01
    assert line.startswith(f"step 4: val loss {last:.4f} ends above {parent_val:.4f}, that of {checkpoint.resolve()}, "
                           "the model it started from: the run ended worse than it started; a continued run"), line
    assert "give it a lower train.lr" in line
    assert child("gentle", parent, gentle) == []
    # A start point `burnout grow` wrote holds no val loss: the model it was grown from does, and has its outputs.
    assert main(["grow", str(parent), "--out", str(tmp_path / "grown"), "model.n_layer=3"]) == 0
    [line] = child("grown-hard", tmp_path / "grown", hard)
    assert (f"ends above {parent_val:.4f}, that of {checkpoint.resolve()}, which the model it started from was grown "
            "from (the same outputs)") in line, line
    # A run of its own: its first evaluation, here one it resumed past with an LR far too high.
    run = tmp_path / "own"
    shutil.copytree(parent, run)
    first = [r for r in read_metrics(run) if "val_loss" in r][0]
    assert main(["train", "--resume", str(run), "train.max_steps=28", "train.eval_interval=4", *hard]) == 0
    capsys.readouterr()
    assert main(["report", str(run)]) == 0
    last = [r for r in read_metrics(run) if "val_loss" in r][-1]["val_loss"]
    assert (f"step 28: val loss {last:.4f} ends above {first['val_loss']:.4f}, its first, at step {first['step']}: "
            "the run ended worse than it started") in _anomalies(capsys)


def _with_prediction(run: Path, to: Path, low: float, central: float, high: float) -> Path:
    """A copy of `run` whose config.yaml carries a prediction, as `burnout plan --write-config` writes it."""
    shutil.copytree(run, to)
    cfg = yaml.safe_load((to / "config.yaml").read_text())
    cfg["prediction"] = {"val_loss": central, "low": low, "high": high, "level": 0.9, "source": "ladder",
                         "params": 1000, "tokens": 2000, "ladder": str(to / "no-ladder-here")}
    (to / "config.yaml").write_text(yaml.safe_dump(cfg))
    return to


def test_a_planned_run_is_reported_against_its_prediction(sampled_runs, tmp_path, capsys):
    final = [r for r in read_metrics(sampled_runs[0]) if "val_loss" in r][-1]["val_loss"]
    # Above the central prediction, below the interval's top: inside.
    inside = _with_prediction(sampled_runs[0], tmp_path / "inside", final * 0.97, final * 0.99, final * 1.03)
    assert main(["report", str(inside)]) == 0
    out = capsys.readouterr().out
    assert (f"predicted val loss {final * 0.99:.4f} (90% interval {final * 0.97:.4f}–{final * 1.03:.4f}); final val "
            f"loss {final:.4f}, {final / (final * 0.99) - 1:+.2%} from the prediction: inside the interval") in out
    md = (inside / "report" / "report.md").read_text()
    assert "## Predicted against achieved" in md and "The ladder's plot is left out: prediction.ladder" in md
    below = _with_prediction(sampled_runs[0], tmp_path / "below", final * 0.90, final * 0.92, final * 0.95)
    assert main(["report", str(below)]) == 0
    assert "outside the interval (above it)" in capsys.readouterr().out
    assert main(["report", str(sampled_runs[1]), "--out", str(tmp_path / "plain")]) == 0
    assert "predicted" not in capsys.readouterr().out
    assert "Predicted against achieved" not in (tmp_path / "plain" / "report.md").read_text()


def test_an_empty_sample_is_said_so_in_the_samples_table(mute_run, tmp_path):
    """The samples table shows a sample whose model ended the text at once as its prompt and the words saying so, and
    names the run's sample prompts (RUN/sample_prompts.json)."""
    run = tmp_path / "mute"
    shutil.copytree(mute_run[0], run)
    prompts = json.loads((run / "sample_prompts.json").read_text())["prompts"]
    write_report([run], out=tmp_path / "r")
    md = (tmp_path / "r" / "report.md").read_text()
    assert "Each continues the run's first sample prompt (its prompts: " + ", ".join(map(json.dumps, prompts)) in md
    samples = md.split("## Samples during training")[1].split("## ")[0]
    for step in (1, 2):
        assert re.search(rf"\| {step} \| [^|]+ \| [^|]+ \| {re.escape(prompts[0])} \(empty: the model ended the text "
                         r"at once\) \|", samples)
