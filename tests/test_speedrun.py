"""`burnout speedrun`: the whole journey in one command, through the real `burnout` command in subprocesses (the
README's laptop run, at a budget and corpus cut down for CI): the plan said and written before anything is spent,
every stage an ordinary run folder, the report card from those folders' files (and `burnout report DIR` writing the
same card again), a rerun that does nothing twice, and a speedrun killed in several stages that ends with the same
card and weights as one never killed."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from burnout.core.checkpoint import list_checkpoints
from burnout.generate.sampling import shown

REPO = Path(__file__).resolve().parent.parent
# A minute of this machine on a tenth of the offline corpus with a 512-token BPE: every stage runs, in about two
# minutes of a busy 2-core machine. What is asserted holds at any budget: nothing here depends on the machine's speed.
BUDGET = ["--minutes", "1", "data.max_chars=150000", "tokenizer.vocab_size=512"]


def burnout(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    # cwd: the repo, so that the eval stage finds the benchmark files under ../shared/data as `burnout eval` does.
    proc = subprocess.run([sys.executable, "-m", "burnout", *args], capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=900)
    if check:
        assert proc.returncode == 0, f"burnout {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    return proc


def tables(card: str) -> dict[str, list[list[str]]]:
    """The card's Markdown tables by the heading above them: each row's cells (the header row first)."""
    found, heading = {}, None
    for line in card.splitlines():
        if line.startswith("## "):
            heading = line[3:]
        elif line.startswith("|") and not line.startswith("|---"):
            found.setdefault(heading, []).append([cell.strip() for cell in line.strip("|").split(" | ")])
    return found


def column(table: list[list[str]], name: str) -> list[str]:
    i = table[0].index(name)
    return [row[i] for row in table[1:]]


@pytest.fixture(scope="module")
def chat_data(shared_data) -> Path:
    return shared_data / "sft" / "alpaca_5000.json"


@pytest.fixture(scope="module")
def speedrun(tmp_path_factory, chat_data):
    """One uninterrupted speedrun with SFT: its folder and the command's output."""
    out = tmp_path_factory.mktemp("speedrun") / "sr"
    proc = burnout("speedrun", "--out", str(out), "--chat-data", str(chat_data), *BUDGET)
    return out, proc.stdout


@pytest.mark.slow
def test_the_plan_is_said_and_written_before_anything_is_spent(speedrun):
    out, stdout = speedrun
    plan = json.loads((out / "plan.json").read_text())
    shares = plan["stages"]
    assert abs(sum(s["share"] for s in shares.values()) - 1) < 1e-9
    assert shares["rl"] == {"share": 0.0, "minutes": 0.0, "skipped": "no --rl-data given"}
    assert shares["sft"]["share"] > 0 and shares["pretrain"]["share"] > shares["sft"]["share"]
    assert abs(sum(s["minutes"] for s in shares.values()) - 1.0) < 1e-9  # --minutes 1 over the stages
    before = stdout.split("[1/6] data")[0]
    for name, share in shares.items():
        assert f"{name:<9}{share['share']:>4.0%}  {share['minutes']:6.2f} min" in before
    # The pretraining plan (the planner's shape, steps and prediction) is said before pretraining spends, and its
    # steps are the ones the run trained; SFT trained the steps planned for it.
    assert stdout.index("predicted val loss") < stdout.index("step 10/")
    pretrain = plan["pretrain"]
    assert _last_step(out / "pretrain") == pretrain["steps"] and pretrain["steps"] >= 100
    assert _last_step(out / "sft") == plan["sft"]["steps"]
    assert plan["sft"]["steps"] == int(shares["sft"]["minutes"] * 60 / pretrain["step_seconds"])


def _last_step(run: Path) -> int:
    return json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])["step"]


@pytest.mark.slow
def test_every_stage_is_an_ordinary_folder_that_other_commands_use(speedrun, tmp_path):
    out, stdout = speedrun
    for stage in ("data", "pretrain", "sft", "eval", "export"):
        assert json.loads((out / "stages" / f"{stage}.json").read_text())["seconds"] > 0
    assert not (out / "stages" / "rl.json").exists() and not (out / "rl").exists()
    assert "[4/6] rl: skipped (no --rl-data given)" in stdout
    # The chat model answers, and other commands take the runs as they are.
    chat = subprocess.run([sys.executable, "-m", "burnout", "chat", str(out / "sft"), "--max-new-tokens", "20"],
                          input="Name a color.\n", capture_output=True, text=True, cwd=REPO, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert chat.returncode == 0, chat.stderr
    burnout("report", str(out / "sft"))
    assert (out / "sft" / "report" / "report.html").is_file()
    # The Hugging Face export is the chat model's, which transformers loads with its template; the GGUF file is one.
    transformers = pytest.importorskip("transformers")
    tokenizer = transformers.AutoTokenizer.from_pretrained(out / "hf")
    model = transformers.AutoModelForCausalLM.from_pretrained(out / "hf")
    assert "<|im_start|>assistant" in tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}],
                                                                     tokenize=False, add_generation_prompt=True)
    assert model.config.vocab_size == 514  # the BPE's 512 and the two chat tokens SFT added
    assert (out / "model.gguf").read_bytes()[:4] == b"GGUF"
    assert f"chat:         burnout chat {out / 'sft'}" in stdout
    assert f"serve:        burnout serve {out / 'sft'}" in stdout
    assert f"llama.cpp:    llama-cli -m {out / 'model.gguf'}" in stdout


@pytest.mark.slow
def test_the_card_is_made_from_the_run_folders_files(speedrun, shared_data):
    out, _ = speedrun
    card = tables((out / "report.md").read_text())
    stages = card["Stages"]
    assert column(stages, "stage") == ["data", "pretrain", "sft", "rl", "eval", "export"]
    assert column(stages, "status") == ["done", "done", "done", "skipped: no --rl-data given", "done", "done"]
    plan = json.loads((out / "plan.json").read_text())
    meta = json.loads((out / "data" / "meta.json").read_text())
    last = {run: json.loads((out / run / "metrics.jsonl").read_text().splitlines()[-1]) for run in ("pretrain", "sft")}
    assert column(stages, "tokens")[:3] == [f"{meta['splits']['train']['tokens']:,}", f"{plan['pretrain']['tokens']:,}",
                                            f"{last['sft']['tokens']:,}"]
    assert column(stages, "loss")[1:3] == [f"val {last['pretrain']['val_loss']:.4f}",
                                           f"val {last['sft']['val_loss']:.4f} (assistant tokens)"]
    assert column(stages, "minutes")[1] == f"{last['pretrain']['elapsed_s'] / 60:.4f}"
    # Scores: the eval stage's own file, each benchmark present under ../shared/data beside its chance level.
    evaluated = json.loads(sorted((out / "pretrain" / "eval").glob("step_*.json"))[-1].read_text())["tasks"]
    scores = {(row[1], row[2]): row for row in card["Scores"][1:]}
    assert scores["val", "bits_per_byte"][3] == f"{evaluated['val']['bits_per_byte']:.4f}"
    for task in ("hellaswag", "arc_easy"):
        assert scores[task, "acc"][3] == f"{evaluated[task]['acc']:.4f}"
        assert scores[task, "acc"][4] == f"{evaluated[task]['chance']:.4f}"
    assert evaluated["hellaswag"]["chance"] == 0.25 and evaluated["hellaswag"]["examples"] == 20
    text = (out / "report.md").read_text()
    assert "Pythia-160M" in text  # the published scores beside ours
    predicted = {row[0]: row for row in card["Predicted against achieved"]}
    assert predicted["pretraining val loss"][2] == f"{last['pretrain']['val_loss']:.4f}"
    # A laptop's model is far below the published fits' range and no ladder was run: no figure, said so.
    assert plan["pretrain"]["prediction"]["val_loss"] is None
    assert predicted["pretraining val loss"][1].startswith("none: the published fits were measured on 70M–16B")
    # The samples: the chat model's answers to compare's prompts, from its compare.json.
    compare = json.loads((out / "sft" / "compare.json").read_text())
    samples = [row for row in card["Samples"][1:] if row[0] == "sft"]
    assert [row[3] for row in samples] == [shown(answer).replace("\n", " ").strip()  # a table cell is stripped
                                           for answer in compare["rows"][-1]["continuations"]]
    assert "## The data" in text and "audit of prepared" in text
    assert "## Machine and versions" in text


@pytest.mark.slow
def test_report_writes_the_same_card_again_and_a_rerun_trains_nothing(speedrun, chat_data):
    out, _ = speedrun
    card, page = (out / "report.md").read_bytes(), (out / "report.html").read_bytes()
    (out / "report.md").unlink()
    (out / "report.html").unlink()
    proc = burnout("report", str(out))
    assert proc.stdout.splitlines() == [f"wrote {out / 'report.md'}", f"wrote {out / 'report.html'}"]
    assert (out / "report.md").read_bytes() == card and (out / "report.html").read_bytes() == page
    launches = (out / "pretrain" / "launches.jsonl").read_text()
    again = burnout("speedrun", "--out", str(out), "--chat-data", str(chat_data), *BUDGET)
    for number, stage in enumerate(("data", "pretrain", "sft"), 1):
        assert f"[{number}/6] {stage}: done already" in again.stdout
    assert (out / "pretrain" / "launches.jsonl").read_text() == launches
    assert (out / "report.md").read_bytes() == card


def _wait_for(path_of, proc: subprocess.Popen, what: str) -> None:
    deadline = time.monotonic() + 600
    while not path_of():
        assert proc.poll() is None, f"the speedrun ended before {what}:\n{proc.stdout.read()}"
        assert time.monotonic() < deadline, f"no {what} after 10 minutes"
        time.sleep(0.05)


@pytest.mark.slow
def test_a_speedrun_killed_in_each_stage_ends_as_one_never_killed(speedrun, chat_data, tmp_path):
    """Killed (SIGKILL) at a random moment of the data stage, after pretraining's and SFT's first checkpoints and
    in the eval stage, the same command continues each time; given the uninterrupted speedrun's plan (its steps
    come from a measured step, which differs between two measurements) it ends with the same weights and the same
    card, the minutes (measured) aside."""
    whole, _ = speedrun
    out = tmp_path / "sr"
    out.mkdir()
    for name in ("plan.json", ".burnout.json"):
        shutil.copy(whole / name, out / name)
    args = [sys.executable, "-m", "burnout", "speedrun", "--out", str(out), "--chat-data", str(chat_data), *BUDGET]
    rng = random.Random(0)
    kill_points = [(lambda: (out / "data").is_dir(), "the data stage", rng.uniform(0, 2)),
                   (lambda: list_checkpoints(out / "pretrain"), "a pretraining checkpoint", rng.uniform(0, 0.5)),
                   (lambda: list_checkpoints(out / "sft"), "an SFT checkpoint", rng.uniform(0, 0.5)),
                   (lambda: (out / "stages" / "sft.json").is_file(), "the eval stage", rng.uniform(0, 1))]
    for ready, what, delay in kill_points:
        proc = subprocess.Popen(args, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        _wait_for(ready, proc, what)
        time.sleep(delay)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
    proc = burnout("speedrun", "--out", str(out), "--chat-data", str(chat_data), *BUDGET)
    for run in ("pretrain", "sft"):  # each was resumed (a launch a session), not started again
        assert len((out / run / "launches.jsonl").read_text().splitlines()) >= 2, run
    for run in ("pretrain", "sft"):
        a, b = list_checkpoints(whole / run)[-1], list_checkpoints(out / run)[-1]
        assert a.name == b.name
        assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes(), run
    mine, theirs = tables((out / "report.md").read_text()), tables((whole / "report.md").read_text())
    assert mine.keys() == theirs.keys()
    for heading in mine:
        if heading == "Stages":
            drop = [i for i, name in enumerate(mine[heading][0]) if name in ("minutes", "$")]
            assert [[c for i, c in enumerate(r) if i not in drop] for r in mine[heading]] == \
                [[c for i, c in enumerate(r) if i not in drop] for r in theirs[heading]]
        elif heading == "Predicted against achieved":
            assert mine[heading][:2] == theirs[heading][:2]  # the val loss predicted and reached
        elif heading != "Machine and versions":  # its command lines differ (another --out)
            assert mine[heading] == theirs[heading], heading


@pytest.mark.slow
def test_a_budget_too_small_for_the_planner_is_one_line(tmp_path):
    proc = burnout("speedrun", "--out", str(tmp_path / "sr"), "--minutes", "0.002", "data.max_chars=20000",
                   "tokenizer.vocab_size=300", check=False)
    errors = [line for line in proc.stderr.splitlines() if "error" in line or "Traceback" in line]
    assert proc.returncode == 2 and errors == proc.stderr.splitlines()[-1:], proc.stderr  # after the data's progress
    # The planner's line, for pretraining's share of the budget (0.82 of it without SFT or RL).
    assert errors[0].startswith(f"burnout: error: {0.002 * 0.82:g} minutes of this machine buys")
    assert "too few for the smallest model" in errors[0] and "give a budget" in errors[0]
    assert not list((tmp_path / "sr").glob("pretrain"))


def test_another_command_into_a_speedrun_folder_is_refused(tmp_path):
    out = tmp_path / "sr"
    out.mkdir()
    (out / ".burnout.json").write_text(json.dumps({"kind": "speedrun", "source": "--minutes=5"}))
    (out / "plan.json").write_text("{}\n")
    proc = burnout("speedrun", "--out", str(out), "--minutes", "3", check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip() == (f"burnout: error: --out {out} holds a speedrun of --minutes=5, not of --minutes=3; "
                                   "choose another folder")
    assert sorted(p.name for p in out.iterdir()) == [".burnout.json", "plan.json"]


def test_dollars_on_a_machine_without_the_gpu_is_refused_before_anything_is_spent(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the refusal is for one without")
    proc = burnout("speedrun", "--out", str(tmp_path / "sr"), "--dollars", "2", "--gpu", "h100", check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("burnout: error: --dollars 2 --gpu h100: this machine has no GPU, and the plan is "
                                   "for h100's speed; run the speedrun on that GPU, or give --minutes N for this "
                                   "machine")
    assert not (tmp_path / "sr").exists()


@pytest.mark.slow
def test_rl_with_nothing_to_learn_is_skipped_with_the_probes_reason(speedrun, shared_data, tmp_path):
    """RL needs a 10-minute budget (its share at least RL_MIN_MINUTES), too long for the suite: its stage is run here
    on a copy of the speedrun, on GSM8K's questions (those that leave room for an answer in the model's 256-token
    context), which a chat model this small answers wrongly every time."""
    from burnout.report.card import write_card
    from burnout.speedrun import _rl_stage

    whole, _ = speedrun
    out = tmp_path / "sr"
    shutil.copytree(whole, out)
    plan = json.loads((out / "plan.json").read_text())
    plan["command"]["rl_data"] = str(shared_data / "gsm8k" / "test.jsonl")
    plan["stages"]["rl"] = {"share": 0.2, "minutes": 0.2, "skipped": None}
    said = []
    plan = _rl_stage(out, plan, said.append)
    reason = plan["stages"]["rl"]["skipped"]
    assert reason.startswith("rl.base ") and ": nothing to learn: before training it answered 8 train" in reason
    assert json.loads((out / "plan.json").read_text())["stages"]["rl"]["skipped"] == reason
    assert said == [f"      skipped: {reason}"]
    assert not (out / "rl").exists()  # the refused run's folder goes with it
    write_card(out)
    stages = tables((out / "report.md").read_text())["Stages"]
    assert stages[4][0] == "rl" and stages[4][1].startswith("skipped: rl.base ") and "nothing to learn" in stages[4][1]


@pytest.mark.slow
def test_killed_between_a_stage_and_its_marker_it_goes_on(speedrun, chat_data, tmp_path):
    """Every stage finished, none marked (as after a kill at each stage's last moment): the same command goes on
    through each, reusing its data and resuming each finished run, and ends with the same models and card."""
    whole, _ = speedrun
    out = tmp_path / "sr"
    shutil.copytree(whole, out)
    shutil.rmtree(out / "stages")
    weights = {run: (list_checkpoints(out / run)[-1] / "model.safetensors").read_bytes() for run in ("pretrain", "sft")}
    proc = burnout("speedrun", "--out", str(out), "--chat-data", str(chat_data), *BUDGET)
    assert f"reusing {out / 'data'}" in proc.stdout
    for run in ("pretrain", "sft"):
        assert f"{out / run} already holds a run: resuming it" in proc.stdout
        assert (list_checkpoints(out / run)[-1] / "model.safetensors").read_bytes() == weights[run]
    mine, theirs = tables((out / "report.md").read_text()), tables((whole / "report.md").read_text())
    assert column(mine["Stages"], "status") == column(theirs["Stages"], "status")
    assert column(mine["Stages"], "tokens") == column(theirs["Stages"], "tokens")
    assert mine["Scores"] == theirs["Scores"] and mine["Samples"] == theirs["Samples"]
