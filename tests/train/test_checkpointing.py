"""Safe for days on a machine that can vanish: a checkpoint every train.ckpt_minutes of wall time, one boot
command that starts or resumes, a resume that falls back past a corrupt checkpoint, a disk too small for
the kept checkpoints refused before step 1, the best checkpoint kept and named, and the logs and report
mirrored with the checkpoints."""

import dataclasses
import os
import shutil
import signal
import subprocess
import sys
from collections import namedtuple
from pathlib import Path

import pytest
import safetensors.torch
import torch
import yaml

import burnout.core.checkpoint as core_checkpoint
import burnout.train.checkpointing as checkpointing
import burnout.train.recipe as recipe
from burnout.base.files import LAUNCHES_FILE, METRICS_FILE, PHASES_FILE, RUN_CONFIG_FILE
from burnout.core.checkpoint import Checkpoint, checkpoint_bytes, checkpoint_problem, list_checkpoints
from burnout.core.rng import rng_state
from burnout.errors import BurnoutError
from burnout.models import Transformer
from burnout.report.render import write_report
from burnout.runs import resume_training, start_training
from burnout.train.distributed import DistContext
from burnout.train.step import TrainStep

REPO = Path(__file__).resolve().parents[2]


def _quiet(line):
    pass


def _steps(run_dir):
    return [int(p.name.removeprefix("step_")) for p in list_checkpoints(run_dir)]


def _flip_byte(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 1
    path.write_bytes(bytes(data))


def _assert_same_weights(a, b):
    a, b = (safetensors.torch.load_file(p / "model.safetensors") for p in (a, b))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _count_steps(monkeypatch) -> list[int]:
    """Record the step number of every training step run from now on (the loop's, which ask for the stop flags; not
    the steps a run times for its plan on a throwaway copy of the model)."""
    ran, real = [], TrainStep.__call__

    def counted(self, loader, step, *args, **kwargs):
        if kwargs.get("flags") is not None:
            ran.append(step)
        return real(self, loader, step, *args, **kwargs)

    monkeypatch.setattr(TrainStep, "__call__", counted)
    return ran


# ----------------------------------------------------------------------------------------------
# train.ckpt_minutes


@pytest.mark.parametrize("minutes, saved", [(1, [3, 6, 9, 10]), (None, [10])])
def test_ckpt_minutes_saves_by_wall_clock_as_well_as_by_steps(tiny_run_config, tiny_bpe_data, tmp_path, monkeypatch,
                                                              minutes, saved):
    """Each step takes 25 s of a fake clock: one minute has passed at every third step since the last save."""
    now = [0.0]
    monkeypatch.setattr(checkpointing, "clock", lambda: now[0])
    real = TrainStep.__call__

    def slow_step(self, *args, **kwargs):
        now[0] += 25
        return real(self, *args, **kwargs)

    monkeypatch.setattr(TrainStep, "__call__", slow_step)
    cfg = tiny_run_config(max_steps=10, ckpt_interval=100, ckpt_minutes=minutes)
    start_training(cfg, tmp_path / "run", data_dir=tiny_bpe_data, on_event=_quiet, progress=False)
    assert _steps(tmp_path / "run") == saved


# ----------------------------------------------------------------------------------------------
# One boot command: starts the run, and after a preemption resumes it


@pytest.mark.slow
def test_the_same_command_starts_then_resumes_after_sigterm(tiny_run, tmp_path):
    """A spot machine's boot script: SIGTERM (the preemption notice) saves and exits with 130; the same
    command on the next boot resumes, and the run ends with the weights of a run never stopped."""
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(tiny_run.cfg.to_dict()))
    run = tmp_path / "run"
    boot = [sys.executable, "-m", "burnout", "train", str(config), "--out", str(run), "--data",
            str(tiny_run.data_dir), "--resume-if-exists"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
    first = subprocess.Popen(boot, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    for line in first.stdout:
        if line.startswith("step 2/"):
            first.send_signal(signal.SIGTERM)
    assert first.wait(timeout=300) == 130, first.stderr.read()[-3000:]
    stopped_at = _steps(run)[-1]
    assert 2 <= stopped_at < 24

    second = subprocess.run(boot, capture_output=True, text=True, env=env, timeout=300)
    assert second.returncode == 0, second.stderr[-3000:]
    assert f"{run} already holds a run: resuming it" in second.stdout
    assert f"resumed from {run / 'checkpoints' / f'step_{stopped_at:07d}'}" in second.stdout
    _assert_same_weights(run / "checkpoints/step_0000024", tiny_run.run_dir / "checkpoints/step_0000024")


def _sigint_as_in_a_terminal() -> None:
    """In the command's process before it starts: SIGINT's default action, as a terminal's Ctrl-C finds it. A suite
    run as a shell's background job ignores SIGINT and its children would inherit that, waiting on forever."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.slow
def test_ctrl_c_through_the_command_saves_and_exits_130(tiny_run, tmp_path):
    """Ctrl-C during training: the step ends, a checkpoint is saved, exit 130 as an interrupted process."""
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(tiny_run.cfg.to_dict()))
    run = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
    command = subprocess.Popen([sys.executable, "-m", "burnout", "train", str(config), "--out", str(run), "--data",
                                str(tiny_run.data_dir)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=env, preexec_fn=_sigint_as_in_a_terminal)
    lines = []
    for line in command.stdout:
        lines.append(line)
        if line.startswith("step 2/"):
            command.send_signal(signal.SIGINT)
    err = command.stderr.read()
    assert command.wait(timeout=300) == 130, err[-3000:]
    # The run's summary, then the "next:" lines (resume first).
    summary = [i for i, line in enumerate(lines) if line.startswith("stopped by signal: step ")]
    assert "Traceback" not in err and len(summary) == 1, (lines, err[-3000:])
    assert any(f"--resume {run}" in line for line in lines[summary[0] + 1:]), lines
    assert 2 <= _steps(run)[-1] < 24


@pytest.mark.slow
def test_ctrl_c_outside_training_is_one_line_and_exit_130(tiny_run):
    """Ctrl-C anywhere else (here while `burnout chat` waits for a line): one line, exit 130, no traceback. Waiting
    for input, not streaming: the tiny model's continuations end at <|endoftext|> within milliseconds, so a signal
    sent during one could arrive after the command had ended."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
    command = subprocess.Popen([sys.executable, "-m", "burnout", "chat", str(tiny_run.run_dir)], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                               preexec_fn=_sigint_as_in_a_terminal)
    shown = ""
    while not shown.endswith("\n> "):  # the session's first line, then its prompt
        char = command.stdout.read(1)
        assert char, shown
        shown += char
    command.send_signal(signal.SIGINT)
    err = command.stderr.read()
    assert command.wait(timeout=120) == 130 and err == "burnout: interrupted\n", err[-3000:]


# ----------------------------------------------------------------------------------------------
# A corrupt checkpoint: resume falls back to the newest good one and says which it skipped


def test_resume_falls_back_past_a_corrupt_checkpoint_and_says_which(tiny_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(tiny_run.run_dir, run)
    _flip_byte(run / "checkpoints/step_0000024/model.safetensors")
    events = []
    result = resume_training(run, [], on_event=events.append, progress=False)
    assert [line for line in events if "skipping" in line] == [
        "--resume: skipping checkpoint step_0000024: model.safetensors does not match the sha256 recorded when it "
        "was saved; trying the one before it"]
    assert f"resumed from {run / 'checkpoints/step_0000018'} at step 18" in events
    assert result.step == 24 and checkpoint_problem(run / "checkpoints/step_0000024") is None
    _assert_same_weights(run / "checkpoints/step_0000024", tiny_run.run_dir / "checkpoints/step_0000024")


def test_resume_falls_back_past_an_empty_state_of_a_checkpoint_saved_without_sha256(tiny_run, tmp_path):
    """Older runs saved no sha256.json: an emptied state.pt (a disk that lost it) once failed the resume with
    EOFError. It is found from the files themselves and skipped like a sha256 mismatch, in one line."""
    run = tmp_path / "run"
    shutil.copytree(tiny_run.run_dir, run)
    for checkpoint in list_checkpoints(run):
        (checkpoint / "sha256.json").unlink()
    (run / "checkpoints/step_0000024/state.pt").write_bytes(b"")
    events = []
    result = resume_training(run, [], on_event=events.append, progress=False)
    assert [line for line in events if "skipping" in line] == [
        "--resume: skipping checkpoint step_0000024: state.pt is empty; trying the one before it"]
    assert f"resumed from {run / 'checkpoints/step_0000018'} at step 18" in events
    assert result.step == 24
    _assert_same_weights(run / "checkpoints/step_0000024", tiny_run.run_dir / "checkpoints/step_0000024")


def test_resume_with_no_good_checkpoint_is_one_line(tiny_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(tiny_run.run_dir, run)
    for path in list_checkpoints(run):
        _flip_byte(path / "state.pt")
    with pytest.raises(BurnoutError) as refused:
        resume_training(run, [], on_event=_quiet, progress=False)
    assert str(refused.value) == (
        f"--resume: no checkpoint in {run / 'checkpoints'} matches its recorded sha256 (the newest, step_0000024: "
        "state.pt does not match the sha256 recorded when it was saved); copy a good one back from "
        "train.mirror_dir, or move the run folder away and train again")


def test_a_resume_hashes_the_checkpoint_once(tiny_run, tmp_path, monkeypatch):
    """Hashing reads every byte (gigabytes at 1B parameters): the checkpoint resume_point chose is not
    hashed again when it is loaded."""
    run = tmp_path / "run"
    shutil.copytree(tiny_run.run_dir, run)
    hashed, real = [], core_checkpoint.checkpoint_problem

    def counted(path):
        hashed.append(Path(path).name)
        return real(path)

    monkeypatch.setattr(core_checkpoint, "checkpoint_problem", counted)
    monkeypatch.setattr(checkpointing, "checkpoint_problem", counted)
    resume_training(run, ["train.max_steps=25"], on_event=_quiet, progress=False)
    assert hashed == ["step_0000024"]


def test_resume_refuses_another_model_or_tokenizer_in_one_line(tiny_run, tmp_path):
    checkpoint = tiny_run.run_dir / "checkpoints/step_0000024"
    tokenizer = checkpoint / "tokenizer.json"
    other = dataclasses.replace(tiny_run.cfg, model=dataclasses.replace(tiny_run.cfg.model, n_layer=3))
    with pytest.raises(BurnoutError) as refused:
        checkpointing.load_for_resume(checkpoint, other, tokenizer, DistContext())
    assert str(refused.value) == f"--resume: the model in {checkpoint} differs from this config's model section"
    changed = tmp_path / "tokenizer.json"
    changed.write_bytes(tokenizer.read_bytes() + b" ")
    with pytest.raises(BurnoutError) as refused:
        checkpointing.load_for_resume(checkpoint, tiny_run.cfg, changed, DistContext())
    assert str(refused.value) == (f"--resume: {changed} is not the tokenizer {checkpoint} was trained with; "
                                  "point data.prepared_dir at the run's original data")


@pytest.mark.parametrize("rank, world, scaler_saved, scaler_here", [
    (1, 2, True, True),  # rank 1 of 2 takes rank 1's generators; an fp16 run's scaler comes back
    (2, 3, False, True),  # a rank the checkpoint has no generators for keeps its own; no saved scaler, none set
    (0, 1, True, False),  # a saved scaler and a run without one (fp16 → bf16 on resume): nothing to put it in
])
def test_restore_puts_back_the_scaler_and_each_ranks_own_generators(tiny_run_config, tiny_bpe_data, tmp_path,
                                                                     rank, world, scaler_saved, scaler_here):
    """What the CPU resume tests cannot reach: fp16's grad scaler runs on GPUs only, and rank i > 0 exists only
    under torchrun. The checkpoint holds each rank's generators (rank 1's from seed 101) and a scaler at 2^10."""
    cfg = tiny_run_config()
    model = Transformer(cfg.model)
    train_step = TrainStep(model, cfg.train, torch.device("cpu"), "fp32", end_of_run=12)
    train_step.scaler = torch.amp.GradScaler("cpu") if scaler_here else None  # init scale 2^16
    ranks = []
    for seed in (100, 101):
        torch.manual_seed(seed)
        ranks.append(rng_state(torch.device("cpu")))
    state = {"optimizer": train_step.optimizer.state_dict(), **ranks[0], "rng_by_rank": ranks}
    if scaler_saved:
        state["scaler"] = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10).state_dict()
    checkpointer = checkpointing.Checkpointer(tmp_path / "run", cfg, model, train_step, DistContext(),
                                              tiny_bpe_data / "tokenizer.json", 128, _quiet, step=0, end_of_run=12)
    checkpointer.dist = DistContext(rank=rank, world_size=world)  # after __init__: its space check broadcasts
    torch.manual_seed(7)
    checkpointer.restore(Checkpoint(tmp_path / "step_0000006", cfg, model, state, {}))
    drawn = torch.rand(4)
    torch.manual_seed({0: 100, 1: 101, 2: 7}[rank])
    assert torch.equal(drawn, torch.rand(4))
    if scaler_here:
        assert train_step.scaler.get_scale() == (2.0 ** 10 if scaler_saved else 2.0 ** 16)


# ----------------------------------------------------------------------------------------------
# Disk: the kept checkpoints must fit, or the run is refused before step 1


def _free_space(monkeypatch, free: int, under: Path) -> None:
    """shutil.disk_usage reports `free` bytes for any path under `under` (the real figures elsewhere)."""
    real = shutil.disk_usage
    usage = namedtuple("usage", "total used free")

    def fake(path):
        if Path(path).resolve().is_relative_to(under.resolve()):
            return usage(free * 2, free, free)
        return real(path)

    monkeypatch.setattr(shutil, "disk_usage", fake)


def test_a_disk_too_small_for_the_kept_checkpoints_is_refused_before_step_1(tiny_run_config, tiny_bpe_data, tmp_path,
                                                                            monkeypatch):
    cfg = tiny_run_config(["train.milestones=[4]"], max_steps=6, keep_last=2, keep_best=True)
    # keep_last 2, one being written, the milestone at 4, the best
    need = 5 * checkpoint_bytes(cfg, tiny_bpe_data / "tokenizer.json")
    ran = _count_steps(monkeypatch)
    run = tmp_path / "run"
    _free_space(monkeypatch, need - 1, tmp_path)
    with pytest.raises(BurnoutError) as refused:
        start_training(cfg, run, data_dir=tiny_bpe_data, on_event=_quiet, progress=False)
    message = str(refused.value)
    assert message.startswith(f"not enough disk space in {run} (--out): the checkpoints this run keeps need ")
    assert "(5 × " in message and "1 milestones and phase ends ahead, the best (train.keep_best)" in message
    assert "lower train.keep_last" in message and "\n" not in message
    assert ran == [] and not run.exists()

    _free_space(monkeypatch, need, tmp_path)
    assert start_training(cfg, run, data_dir=tiny_bpe_data, on_event=_quiet, progress=False).step == 6
    assert ran == [0, 1, 2, 3, 4, 5]


def test_a_mirror_too_small_is_refused_and_a_resume_overwrites_nothing(tiny_run, tmp_path, monkeypatch):
    run = tmp_path / "run"
    shutil.copytree(tiny_run.run_dir, run)
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    ran = _count_steps(monkeypatch)
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    _free_space(monkeypatch, 10**6, mirror)
    with pytest.raises(BurnoutError, match=rf"not enough disk space in {mirror} \(train.mirror_dir\)"):
        resume_training(run, ["train.max_steps=30", f"train.mirror_dir={mirror}"], on_event=_quiet, progress=False)
    assert ran == [] and list(mirror.iterdir()) == []
    after = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    assert after == before  # resumes.jsonl too: a refused resume leaves no trace


# ----------------------------------------------------------------------------------------------
# train.keep_best, and the logs and report in the mirror


@pytest.mark.parametrize("keep_best, kept", [(True, [6, 12]), (False, [12])])
def test_keep_best_keeps_and_names_the_lowest_val_loss(tiny_run_config, tiny_bpe_data, tmp_path, monkeypatch,
                                                       keep_best, kept):
    """Val losses 5.0, 4.0, 4.5, 4.8 at the checkpoints of steps 3, 6, 9, 12, and keep_last 1: step 6 is the
    best, kept past pruning, in the log and the report."""
    losses = iter([5.0, 4.0, 4.5, 4.8])
    monkeypatch.setattr(recipe, "evaluate_loss", lambda *args: next(losses))
    # No evaluation falls on a checkpoint by the intervals: keep_best evaluates each checkpoint itself.
    cfg = tiny_run_config(max_steps=12, ckpt_interval=3, eval_interval=100, keep_last=1,
                          keep_best=keep_best, mirror_dir=str(tmp_path / "mirror"))
    run, events = tmp_path / "run", []
    start_training(cfg, run, data_dir=tiny_bpe_data, on_event=events.append, progress=False)
    assert _steps(run) == kept
    assert _steps(tmp_path / "mirror") == kept
    if not keep_best:
        return
    assert any(line.startswith("step 6: saved") and line.endswith("(the best val loss so far, 4.0000: kept by "
                                                                  "train.keep_best)") for line in events), events
    assert not any(line.startswith(("step 9: saved", "step 12: saved")) and "best val" in line for line in events)
    _, written = write_report([run])
    report = (run / "report" / "report.md").read_text()
    assert "| best checkpoint | step_0000006, val loss 4.0000 (kept by train.keep_best) |" in report, report
    assert "| step_0000006 (best) |" in report


def test_the_mirror_holds_the_logs_and_the_report(tiny_run_config, tiny_bpe_data, tmp_path):
    """The phase summary is written after the session's last checkpoint; the mirror has it all the same."""
    mirror = tmp_path / "mirror"
    cfg = tiny_run_config(["train.phases=[{name: first, steps: 6}]"], max_steps=12, mirror_dir=str(mirror))
    run = tmp_path / "run"
    result = start_training(cfg, run, data_dir=tiny_bpe_data, on_event=_quiet, progress=False)
    assert result.stop_reason == "phase"
    for name in (METRICS_FILE, LAUNCHES_FILE, PHASES_FILE, RUN_CONFIG_FILE):
        assert (mirror / name).read_bytes() == (run / name).read_bytes(), name
    assert _steps(mirror) == _steps(run) == [6]

    _, written = write_report([run])
    assert mirror / "report" in written
    assert (mirror / "report" / "report.html").read_bytes() == (run / "report" / "report.html").read_bytes()
