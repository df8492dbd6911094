"""End to end through the command line: quickstart (twice), generate, export, and load in transformers."""

import json
import math
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from burnout.cli import main
from burnout.core.checkpoint import list_checkpoints, load_checkpoint
from burnout.train.schedule import budget_steps

# The quickstart's own data and training settings, shrunk so that the whole file runs in well under a minute.
SMALL = ["data.max_chars=150000", "tokenizer.vocab_size=512", "model.n_layer=2", "model.d_model=64",
         "model.n_head=4", "model.n_kv_head=2", "model.context_length=64", "train.seq_len=64"]


def burnout(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run([sys.executable, "-m", "burnout", *args], capture_output=True, text=True, env=env,
                          timeout=300)
    assert proc.returncode == 0, f"burnout {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    return proc


def snapshot(folder: Path) -> dict[str, tuple[bytes, int]]:
    return {str(p.relative_to(folder)): (p.read_bytes(), p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.slow
def test_quickstart_generate_export(tmp_path, monkeypatch, capsys):
    out = tmp_path / "qs"
    # The plan's step count comes from a measured step time (test_minutes_set_the_planned_steps checks how): here
    # that measurement says 6 s, so 5 minutes plan a fixed ~40 steps, which a busy machine also finishes well within
    # the training's 4m15s. The learning asserted below is then that of the whole plan, however slow the steps are.
    monkeypatch.setattr("burnout.quickstart.measure_step_seconds", lambda cfg, data_dir: 6.0)
    assert main(["quickstart", "--out", str(out), "--minutes", "5", *SMALL]) == 0
    first = capsys.readouterr()
    run = out / "run"
    assert f"run folder:   {run}" in first.out
    assert "[4/4] done" in first.out
    # It ends with the report and the command that opens the playground.
    assert f"report:       {run / 'report' / 'report.html'}" in first.out
    assert (run / "report" / "report.md").is_file() and (run / "report" / "loss_vs_tokens.png").is_file()
    assert f"playground:   burnout playground {run}" in first.out
    # Learning to be seen: each of the run's sample prompts (words of its val split: the quickstart gives none) at
    # every kept checkpoint, sampled with a fixed seed, also in compare.md, which the report shows.
    table = first.out.split("same prompt, different checkpoint")[1].split("run folder:")[0]
    steps = [int(p.name.removeprefix("step_")) for p in list_checkpoints(run)]
    assert len(steps) >= 2
    prompts = json.loads((run / "sample_prompts.json").read_text())
    assert prompts["from"] == "the val split's documents" and len(prompts["prompts"]) == 3
    assert f"generate:     burnout generate {run} --prompt {shlex.quote(prompts['prompts'][0])}" in first.out
    for prompt in prompts["prompts"]:
        block = table.split(f"--- {prompt!r} ---\n")[1].split("---")[0]
        assert [int(line.split(":")[0].split()[-1]) for line in block.strip().splitlines()] == steps
    assert "temperature=0.8, top_k=50" in (run / "compare.md").read_text()
    assert "No `compare.md` yet" not in (run / "report" / "report.md").read_text()

    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(records) >= 2
    # The run trained every planned step (not stopped early by its minutes); over them the loss has clearly fallen
    # and left ln(512) = 6.24, a uniform guess.
    planned = int(first.out.split("→ up to ")[1].split()[0])
    assert planned >= 20 and records[-1]["step"] == planned
    assert records[-1]["train_loss"] < records[0]["train_loss"] - 0.2
    assert records[-1]["val_loss"] < math.log(512) - 0.3
    checkpoints = list_checkpoints(run)
    assert checkpoints and int(checkpoints[-1].name.removeprefix("step_")) == records[-1]["step"]

    data_before, run_before = snapshot(out / "data"), snapshot(run)
    # The second run only has to show where it goes: a budget of a few steps will do.
    second = burnout("quickstart", "--out", str(out), "--minutes", "0.01", *SMALL)
    assert f"reusing {out / 'data'}" in second.stdout
    assert f"run folder:   {out / 'run-2'}" in second.stdout
    assert list_checkpoints(out / "run-2") and (out / "run-2" / "metrics.jsonl").is_file()
    assert snapshot(out / "data") == data_before
    assert snapshot(run) == run_before

    generated = burnout("generate", str(run), "--prompt", "The ", "--max-new-tokens", "20", "--seed", "1")
    assert generated.stdout.startswith("The ")
    assert len(generated.stdout.strip()) > len("The")
    again = burnout("generate", str(run), "--prompt", "The ", "--max-new-tokens", "20", "--seed", "1")
    assert again.stdout == generated.stdout

    hf_dir = out / "hf"
    burnout("export", str(run), "--to", str(hf_dir))
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        assert (hf_dir / name).is_file(), name

    from transformers import AutoModelForCausalLM

    ours = load_checkpoint(run).model.eval()
    theirs = AutoModelForCausalLM.from_pretrained(hf_dir).eval()
    ids = torch.randint(0, ours.cfg.vocab_size, (2, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(theirs(ids).logits, ours(ids), rtol=1e-4, atol=1e-4)


def test_minutes_set_the_planned_steps(tiny_bpe_data, tmp_path, monkeypatch, capsys):
    """With the step time measured as 50 ms, 2 minutes plan four times the steps of half a minute: the steps that
    fit the training's share of --minutes, which is the run's time budget, so the clock ends the run if its steps
    are slower (red when the step count ignores --minutes, or when the budget is not the training's share). Nothing
    is trained: Ctrl-C as the training starts."""
    step_seconds, plans = 0.05, []

    def start_run(cfg, run_dir, recipe, data_dir):
        plans.append(cfg.train)
        raise KeyboardInterrupt

    monkeypatch.setattr("burnout.quickstart.measure_step_seconds", lambda cfg, data_dir: step_seconds)
    monkeypatch.setattr("burnout.quickstart.start_run", start_run)
    out = tmp_path / "qs"
    out.mkdir()
    (out / "data").symlink_to(tiny_bpe_data, target_is_directory=True)  # prepared data is reused, not made
    for minutes in (0.5, 2.0):
        assert main(["quickstart", "--out", str(out), "--minutes", str(minutes), *SMALL]) == 130
        plan = plans[-1]
        assert 0.75 * minutes <= plan.max_minutes < minutes  # the rest is for the samples after it
        assert plan.max_steps == budget_steps(plan.max_minutes, step_seconds), (minutes, plan.max_steps)
        assert plan.step_seconds == step_seconds  # the run plans with this measurement instead of timing steps again
        assert f"→ up to {plan.max_steps} steps in " in capsys.readouterr().out
    short, long = (plan.max_steps for plan in plans)
    assert abs(long - 4 * short) <= 4


def test_its_data_parted_by_an_older_split_rule_is_prepared_again(tiny_bpe_data, tmp_path, monkeypatch, capsys):
    """The quickstart's own data folder, parted into train and val by an older rule (no split_rule in its
    meta.json), is prepared again over itself rather than reused (red when it is reused as it is). Nothing is
    prepared: Ctrl-C as the preparation starts."""
    import shutil

    prepared = []

    def prepare_data(data_cfg, tok_cfg, out_dir, progress, overwrite=False):
        prepared.append((Path(out_dir), overwrite))
        raise KeyboardInterrupt

    monkeypatch.setattr("burnout.quickstart.prepare_data", prepare_data)
    out = tmp_path / "qs"
    shutil.copytree(tiny_bpe_data, out / "data")
    meta = json.loads((out / "data" / "meta.json").read_text())
    del meta["split_rule"]
    (out / "data" / "meta.json").write_text(json.dumps(meta))
    assert main(["quickstart", "--out", str(out), *SMALL]) == 130
    assert prepared == [(out / "data", True)]
    assert "data: reusing" not in capsys.readouterr().out
