"""train.tracker: each tracker's files, read back with its library's own reader, hold what metrics.jsonl holds, by step
and key; a resumed run continues the same tracker run; a missing library is one line before anything is written;
nothing reaches for the network."""

from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from burnout.cli import main
from burnout.runs import resume_training, start_training
from burnout.train.metrics import read_metrics

REPO_ROOT = Path(__file__).resolve().parents[2]
# What a run asks each tracker for beyond metrics.jsonl's keys, which the comparison leaves out: W&B's own
# bookkeeping (_step, _runtime, _timestamp) and trackio's (timestamp, its step column).
LIBRARY_KEYS = ("_", "timestamp")
# The network as the test environment offers it: a W&B server and a trackio Space that would be used if a tracker
# went online (the W&B one refuses at once: nothing listens on port 9), and Hugging Face offline.
NO_NETWORK = {"WANDB_BASE_URL": "http://127.0.0.1:9", "WANDB_API_KEY": "a" * 40, "WANDB_MODE": "online",
              "TRACKIO_SPACE_ID": "someone/somewhere", "HF_HUB_OFFLINE": "1"}


@pytest.fixture
def no_network(monkeypatch):
    """NO_NETWORK's environment, and every connection this process opens to an internet address refused and
    recorded (a tracker's local service socket, AF_UNIX, passes)."""
    for key, value in NO_NETWORK.items():
        monkeypatch.setenv(key, value)
    attempts = []
    connect = socket.socket.connect

    def guarded(self, address):
        if self.family in (socket.AF_INET, socket.AF_INET6):
            attempts.append(address)
            raise OSError(f"test: no network ({address})")
        return connect(self, address)

    monkeypatch.setattr(socket.socket, "connect", guarded)
    yield attempts
    assert not attempts, f"connections tried: {attempts}"


def _train(tiny_run_config, data: Path, run_dir: Path, *overrides: str, events: list | None = None, **train):
    cfg = tiny_run_config(list(overrides), sample_prompt="The ", sample_tokens=6, **train)
    start_training(cfg, run_dir, data_dir=data, on_event=(events.append if events is not None else lambda line: None),
                   progress=False)
    return read_metrics(run_dir)


def expected(records: list[dict]) -> tuple[dict, dict]:
    """metrics.jsonl's records as a tracker receives them: (step, key) → number, and (step, key) → text."""
    scalars = {(r["step"], k): v for r in records for k, v in r.items()
               if k != "step" and isinstance(v, (int, float))}
    texts = {(r["step"], k): v if isinstance(v, str) else json.dumps(v) for r in records for k, v in r.items()
             if k != "step" and (r["step"], k) not in scalars}
    return scalars, texts


def tensorboard_events(folder: Path) -> tuple[dict, dict]:
    """TensorBoard's own reader over the folder, the one its server loads runs with (plugin_event_accumulator, which
    purges a restarted writer's orphans of every kind): (step, tag) → scalar, and (step, tag) → text."""
    from tensorboard.backend.event_processing.plugin_event_accumulator import EventAccumulator
    from tensorboard.util import tensor_util

    events = EventAccumulator(str(folder), size_guidance={"tensors": 0})
    events.Reload()
    read = {"scalars": {}, "text": {}}
    for tag in events.Tags()["tensors"]:
        plugin = events.SummaryMetadata(tag).plugin_data.plugin_name
        for e in events.Tensors(tag):
            value = tensor_util.make_ndarray(e.tensor_proto).item()
            key = e.step, tag.removesuffix("/text_summary")
            assert key not in read[plugin], f"{key} logged twice"
            read[plugin][key] = value.decode() if plugin == "text" else value
    return read["scalars"], read["text"]


def assert_same(read: dict, logged: dict) -> None:
    """`read` (step, key) → value holds `logged`'s, no more, no less; the differences named when not."""
    missing, extra = sorted(logged.keys() - read.keys()), sorted(read.keys() - logged.keys())
    differ = {key: (read[key], logged[key]) for key in logged.keys() & read.keys() if read[key] != logged[key]}
    assert not (missing or extra or differ), f"missing {missing}, extra {extra}, differing {differ}"


def as_float32(scalars: dict) -> dict:
    """TensorBoard keeps a scalar as a 32-bit float."""
    import numpy as np

    return {key: float(np.float32(value)) for key, value in scalars.items()}


def wandb_records(path: Path):
    """The records of an offline run's .wandb file, parsed with W&B's own protobuf (wandb_internal_pb2.Record): the
    file is W&B's 7-byte header, then LevelDB's log format, 32 KiB blocks of chunks each behind a 7-byte header
    (checksum, length, type: 1 full, 2 first, 3 middle, 4 last)."""
    from wandb.proto.wandb_internal_pb2 import Record

    data = path.read_bytes()
    assert data[:4] == b":W&B", data[:7]
    pos, pending = 7, b""
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:  # a block's tail too short for a header is padding
            pos += 32768 - pos % 32768
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        pending += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = Record()
            record.ParseFromString(pending)
            yield record
            pending = b""


def wandb_history(folder: Path) -> dict:
    """(step, key) → value of every history record of the offline runs in `folder`."""
    history = {}
    for path in sorted(folder.glob("wandb/offline-run-*/run-*.wandb")):
        for record in wandb_records(path):
            if record.WhichOneof("record_type") == "history":
                for item in record.history.item:
                    key = item.key or "/".join(item.nested_key)
                    if not key.startswith(LIBRARY_KEYS):
                        assert (record.history.step.num, key) not in history, f"{key} logged twice"
                        history[record.history.step.num, key] = json.loads(item.value_json)
    return history


def test_tensorboard_holds_metrics_jsonl_evals_and_samples(tiny_run_config, tiny_bpe_data, shared_data, tmp_path,
                                                          no_network):
    run = tmp_path / "run"
    events: list[str] = []
    records = _train(tiny_run_config, tiny_bpe_data, run, "train.tracker=tensorboard", "model.context_length=128",
                     "train.eval_tasks=[hellaswag]", "train.eval_task_items=4", f"train.eval_data_root={shared_data}",
                     events=events, max_steps=8)
    scalars, texts = expected(records)
    assert {"train_loss", "lr", "tokens_per_s", "mfu", "val_loss", "eval/hellaswag/acc_norm"} <= {k for _, k in scalars}
    assert {k for _, k in texts} == {"sample", "sample_prompt"}
    folder = run / "tracker" / "tensorboard"
    read_scalars, read_texts = tensorboard_events(folder)
    assert_same(read_scalars, as_float32(scalars))
    assert_same(read_texts, texts)
    assert f"tracker: TensorBoard events in {folder.absolute()}" in "\n".join(events)


def test_a_resumed_run_continues_its_tensorboard_run_on_the_same_steps(tiny_run_config, tiny_bpe_data, tmp_path):
    """The run stopped after step 12 with records past its step-6 checkpoint's; the resume logs steps 7-12 again, and
    without samples (train.sample_tokens=0): the events read back are metrics.jsonl's, once each, what the stopped
    session logged past step 6 purged, its samples of steps 8 and 12 too."""
    run = tmp_path / "run"
    first = _train(tiny_run_config, tiny_bpe_data, run, "train.tracker=tensorboard", max_steps=12)
    assert [r["step"] for r in first if "sample" in r] == [4, 8, 12]
    import shutil

    shutil.rmtree(run / "checkpoints" / "step_0000012")  # killed after logging step 12, before its checkpoint
    resume_training(run, ["train.sample_tokens=0"], on_event=lambda line: None, progress=False)
    records = read_metrics(run)
    assert [r["step"] for r in records] == [2, 4, 6, 8, 10, 12]
    assert [r["step"] for r in records if "sample" in r] == [4]
    scalars, texts = expected(records)
    read_scalars, read_texts = tensorboard_events(run / "tracker" / "tensorboard")
    assert_same(read_scalars, as_float32(scalars))
    assert_same(read_texts, texts)
    assert len(list((run / "tracker" / "tensorboard").glob("events.out.tfevents.*"))) == 2  # one per session


def test_wandb_offline_run_holds_metrics_jsonl_and_a_resume_continues_its_id(tiny_run_config, tiny_bpe_data, tmp_path,
                                                                           no_network):
    run = tmp_path / "run"
    records = _train(tiny_run_config, tiny_bpe_data, run, "train.tracker=wandb", max_steps=8)
    folder = run / "tracker" / "wandb"
    scalars, texts = expected(records)
    assert_same(wandb_history(folder), {**scalars, **texts})
    run_id = (folder / "run_id").read_text().strip()
    first = [p.name for p in folder.glob("wandb/offline-run-*")]
    assert first and all(name.endswith(f"-{run_id}") for name in first)
    # Its service started without its crash reports (W&B's own log of the start says so).
    assert '"disable-analytics":true' in next(folder.glob("wandb/offline-run-*/logs/debug-core.log")).read_text()
    # Resumed to step 12 (train.max_steps raised): the same W&B run id, its history now metrics.jsonl's.
    resume_training(run, ["train.max_steps=12"], on_event=lambda line: None, progress=False)
    assert all(p.name.endswith(f"-{run_id}") for p in folder.glob("wandb/offline-run-*"))
    scalars, texts = expected(read_metrics(run))
    assert_same(wandb_history(folder), {**scalars, **texts})


@pytest.mark.slow  # two torchrun ranks start
def test_under_torchrun_only_rank_0_writes_the_tracker(tiny_run_config, tiny_bpe_data, tmp_path):
    """Two gloo ranks: one TensorBoard writer (rank 0's), holding what its metrics.jsonl holds."""
    cfg = tiny_run_config(sample_prompt="The ", sample_tokens=6, max_steps=6)
    config = tmp_path / "run.yaml"
    config.write_text(json.dumps(cfg.to_dict()))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                           str(port), "-m", "burnout", "train", str(config), "--out", str(run), "--data",
                           str(tiny_bpe_data), "--tracker", "tensorboard"], capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO_ROOT)}, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    folder = run / "tracker" / "tensorboard"
    assert len(list(folder.glob("events.out.tfevents.*"))) == 1
    scalars, texts = expected(read_metrics(run))
    read_scalars, read_texts = tensorboard_events(folder)
    assert_same(read_scalars, as_float32(scalars))
    assert_same(read_texts, texts)


def _read_trackio(store: Path, run_name: str) -> list[dict]:
    """trackio's own reader (SQLiteStorage.get_logs) over the store, in a process of its own: trackio reads its
    store's folder (TRACKIO_DIR) once, at import."""
    code = ("import json, sys; from trackio.sqlite_storage import SQLiteStorage; "
            "print(json.dumps(SQLiteStorage.get_logs('gpuburnout', sys.argv[1]), default=str))")
    out = subprocess.run([sys.executable, "-c", code, run_name], capture_output=True, text=True, check=True,
                         env={**os.environ, "TRACKIO_DIR": str(store)}, timeout=300)
    return json.loads(out.stdout.splitlines()[-1])


def test_trackio_local_store_holds_metrics_jsonl(tiny_run_config, tiny_bpe_data, tmp_path):
    """Through the command line, as a person runs it (trackio's store is chosen once per process), with a trackio
    Space named in the environment, which the run does not use: the store is the run folder's."""
    cfg = tiny_run_config(sample_prompt="The ", sample_tokens=6, max_steps=6)
    config = tmp_path / "run.yaml"
    config.write_text(json.dumps({**cfg.to_dict(), "data": {"prepared_dir": str(tiny_bpe_data)}}))
    run = tmp_path / "run"
    # HF_HOME: where trackio's default store would be, were the run's not chosen (and not the user's).
    env = {**os.environ, **NO_NETWORK, "PYTHONPATH": str(REPO_ROOT), "HF_HOME": str(tmp_path / "hf_home")}
    done = subprocess.run([sys.executable, "-m", "burnout", "train", str(config), "--out", str(run), "--tracker",
                           "trackio"], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    store = run / "tracker" / "trackio"
    assert f"tracker: trackio run run in {store}" in done.stdout
    logged = {(r["step"], k): v for r in _read_trackio(store, "run") for k, v in r.items()
              if not k.startswith(LIBRARY_KEYS) and k != "step"}
    scalars, texts = expected(read_metrics(run))
    assert_same(logged, {**scalars, **texts})
    assert not (tmp_path / "hf_home").exists()


def test_trackio_imported_with_another_store_is_one_line_before_anything_is_written(tiny_run_config, tiny_bpe_data,
                                                                                    tmp_path, monkeypatch):
    """trackio chooses its store once per process: a run in a process that imported it with another is refused."""
    from burnout.errors import BurnoutError

    monkeypatch.setenv("TRACKIO_DIR", str(tmp_path / "elsewhere"))
    import trackio  # noqa: F401  (its store is chosen now, unless an earlier import chose it)

    run = tmp_path / "run"
    with pytest.raises(BurnoutError, match=r"trackio was imported in this process already, with its store at .*; "
                                           r"a run's store is its own .*: train each trackio run in a process of"):
        _train(tiny_run_config, tiny_bpe_data, run, "train.tracker=trackio")
    assert not run.exists() and not (tmp_path / "elsewhere").exists()
    from burnout.train.trackers import open_tracker  # as the Trainer opens it, for a caller of the Trainer itself

    with pytest.raises(BurnoutError, match="trackio was imported in this process already"):
        open_tracker(tiny_run_config(["train.tracker=trackio"]), run, None)
    assert not (tmp_path / "elsewhere").exists()


@pytest.mark.parametrize("tracker, package", [("tensorboard", "tensorboard"), ("wandb", "wandb"),
                                              ("trackio", "trackio")])
def test_a_missing_library_is_one_line_naming_the_extra_and_nothing_is_written(tracker, package, tiny_bpe_data,
                                                                               tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, package, None)  # `import package` fails as it does where it is not installed
    run = tmp_path / "run"
    assert main(["train", "--data", str(tiny_bpe_data), "--model", "llama-tiny", "--out", str(run), "--tracker",
                 tracker]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"burnout: error: train.tracker={tracker}: the {package} package is not installed; pip install "
                   f"'gpuburnout[track]' (or pip install {package}), or drop --tracker / train.tracker"]
    assert not run.exists()
    assert main(["quickstart", "--out", str(tmp_path / "quickstart"), "--tracker", tracker]) == 2
    assert capsys.readouterr().err.strip().splitlines() == err
    assert not (tmp_path / "quickstart").exists()


def test_tracker_flag_is_train_tracker_on_every_training_command(monkeypatch):
    """--tracker NAME is the override train.tracker=NAME (none: null), last, on train, sft, dpo, rl and quickstart."""
    from burnout import quickstart, runs
    from burnout.errors import BurnoutError
    from burnout.finetune import commands

    given = []

    def record(*args, **kwargs):
        given.append(next(a for a in [*args, *kwargs.values()] if isinstance(a, list)))
        raise BurnoutError("recorded")

    for module, name in ((runs, "train"), (commands, "sft"), (commands, "dpo"), (commands, "rl"),
                         (quickstart, "quickstart")):
        monkeypatch.setattr(module, name, record)
    fine_tune = ["BASE", "--data", "D", "--out", "O"]
    for argv in (["train", "C", "--out", "O"], ["sft", *fine_tune], ["dpo", *fine_tune], ["rl", *fine_tune],
                 ["quickstart"]):
        assert main([*argv, "train.lr=1", "--tracker", "wandb"]) == 2
        assert given.pop() == ["train.lr=1", "train.tracker=wandb"], argv
        assert main([*argv, "--tracker", "none"]) == 2
        assert given.pop() == ["train.tracker=null"], argv


def test_configs_saved_with_the_old_switches_read_as_train_tracker(tiny_run_config):
    from burnout.config import load_run_config
    from burnout.errors import BurnoutError

    raw = tiny_run_config().to_dict()
    del raw["train"]["log"]["tracker"]
    for switches, tracker in (({"tensorboard": False, "wandb": False}, None), ({"tensorboard": True}, "tensorboard"),
                              ({"wandb": True, "tensorboard": False}, "wandb")):
        saved = {**raw, "train": {**raw["train"], "log": {**raw["train"]["log"], **switches}}}
        assert load_run_config(saved).train.log.tracker == tracker
    flat = {**raw, "train": {**raw["train"], "wandb": True}}
    assert load_run_config(flat).train.tracker == "wandb"
    both = {**raw, "train": {**raw["train"], "log": {"tensorboard": True, "wandb": True}}}
    with pytest.raises(BurnoutError, match="tensorboard and wandb are both on; a run streams to one tracker"):
        load_run_config(both)
    two = {**raw, "train": {**raw["train"], "log": {"wandb": True, "tracker": "trackio"}}}
    with pytest.raises(BurnoutError, match="wandb: true and tracker: trackio name two trackers"):
        load_run_config(two)
