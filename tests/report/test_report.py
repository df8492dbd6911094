"""`burnout report` on real training runs: the files, the plots and the numbers in the tables."""

import base64
import io
import json
import re
import shlex
import shutil

import pytest
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
    assert rows[0].startswith("| smoke | 0–12 | 1,536 |") and rows[0].endswith("| 0.2500 | 0.5000 | – | 0.1200 |")
    assert (rows[1].startswith("| proof (in progress) | 12–24 | 1,536 |")
            and rows[1].endswith("| 0.2500 | – | 0.1200 | 0.1200 |"))
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
    assert "| last MFU | 0.2500 |" in md and "5.06" not in md and "6.53" not in md
