"""train.tracker: the dashboard a run's records also stream to, through its library's own API, into the run folder.

    tensorboard   torch.utils.tensorboard's SummaryWriter          RUN/tracker/tensorboard/ (event files)
    wandb         Weights & Biases, offline (never the network)   RUN/tracker/wandb/wandb/offline-run-*/ (`wandb sync`)
    trackio       trackio's local store (no Space, no server)     RUN/tracker/trackio/ (`trackio show`)

metrics.jsonl stays the record: StepLogger (train/metrics.py) hands each record it writes there to the tracker, rank 0
alone, and nothing here is read back. Numbers are scalars by the record's step; text (the sample) is text; anything
else (a list) is its JSON. A resumed run continues the same tracker run on the same step axis: TensorBoard hides what
the stopped session logged past the checkpoint (purge_step); W&B (the id kept in RUN/tracker/wandb/run_id) and
trackio (the run folder's name) continue their run, keeping those records beside the resumed ones.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import io
import json
import os
import secrets
import sys
from collections.abc import Iterator
from pathlib import Path

from burnout.config import RunConfig
from burnout.errors import BurnoutError

TRACKER_DIR = "tracker"
# The tracker's name → the package that brings it (what `pip install` takes).
PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb", "trackio": "trackio"}
PROJECT = "gpuburnout"  # the W&B and trackio project a run's tracker run belongs to
# trackio uploads to a Space or a server when these are set: cleared while it starts, so it stays local.
_TRACKIO_REMOTE = ("TRACKIO_SPACE_ID", "TRACKIO_SERVER_URL", "TRACKIO_DATASET_ID", "TRACKIO_BUCKET_ID")


def _missing(name: str) -> BurnoutError:
    return BurnoutError(f"train.tracker={name}: the {PACKAGES[name]} package is not installed; pip install "
                        f"'gpuburnout[track]' (or pip install {PACKAGES[name]}), or drop --tracker / train.tracker")


def check_tracker(name: str | None, run_dir: Path | None = None) -> None:
    """Refuse, before anything is written, a tracker whose library is not installed, and (given the run folder) a
    trackio that this process imported with another store than the run's."""
    if name is None:
        return
    if importlib.util.find_spec(PACKAGES[name]) is None:
        raise _missing(name)
    if name == "trackio" and run_dir is not None and "trackio.utils" in sys.modules:
        _check_trackio_store(sys.modules["trackio.utils"], _folder(run_dir, name))


def _folder(run_dir: Path, name: str) -> Path:
    return Path(run_dir).absolute() / TRACKER_DIR / name


def _check_trackio_store(utils, folder: Path) -> None:
    """trackio reads its store's folder (TRACKIO_DIR) once, when first imported: refused where that was not `folder`."""
    store = Path(utils.TRACKIO_DIR)
    if store.resolve() != folder.resolve():
        raise BurnoutError(f"train.tracker=trackio: trackio was imported in this process already, with its store at "
                           f"{store}, and it reads that folder once; a run's store is its own ({folder}): train each "
                           "trackio run in a process of its own (burnout train ...)")


def _library(name: str, module: str):
    """`module` of tracker `name`'s library, imported; its absence said as check_tracker says it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise _missing(name) from None


class Tracker:
    """One tracker run: `log` takes a metrics.jsonl record, `close` ends the run (flushing what it holds); `line`
    says where it writes and how to look at it."""

    line = ""

    def log(self, record: dict) -> None:
        step = record["step"]
        scalars = {k: v for k, v in record.items() if k != "step" and isinstance(v, (int, float))}
        texts = {k: v if isinstance(v, str) else json.dumps(v) for k, v in record.items()
                 if k != "step" and k not in scalars}
        self.write(step, scalars, texts)

    def write(self, step: int, scalars: dict[str, float], texts: dict[str, str]) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class TensorBoard(Tracker):
    def __init__(self, folder: Path, resumed_at: int | None):
        tensorboard = _library("tensorboard", "torch.utils.tensorboard")
        # Each session opens with a restart marker (purge_step: TensorBoard takes a run's first as its start): a
        # resumed one's hides the events the stopped session logged past resumed_at, which it logs again, as it
        # does in metrics.jsonl.
        self.writer = tensorboard.SummaryWriter(log_dir=str(folder), purge_step=0 if resumed_at is None else
                                                resumed_at + 1)
        self.line = f"tracker: TensorBoard events in {folder} (see them: tensorboard --logdir {folder})"

    def write(self, step: int, scalars: dict[str, float], texts: dict[str, str]) -> None:
        for key, value in scalars.items():
            self.writer.add_scalar(key, value, step)
        for key, value in texts.items():
            self.writer.add_text(key, value, step)
        self.writer.flush()  # a dashboard watching the folder sees each record as it comes

    def close(self) -> None:
        self.writer.close()


class WeightsAndBiases(Tracker):
    def __init__(self, folder: Path, run_name: str, config: dict):
        wandb = _library("wandb", "wandb")
        id_file = folder / "run_id"
        if id_file.is_file():
            run_id = id_file.read_text().strip()
        else:
            run_id = secrets.token_hex(8)  # W&B's ids are lowercase letters and digits
            folder.mkdir(parents=True, exist_ok=True)
            id_file.write_text(run_id + "\n")
        # Offline: the run is written to folder/wandb/offline-run-*/ alone; `wandb sync` uploads it when you choose.
        # No console capture (the run's own lines stay as they are), no system sampling, machine or git metadata.
        settings = wandb.Settings(mode="offline", console="off", silent=True, x_disable_stats=True,
                                  x_disable_meta=True, x_disable_machine_info=True, disable_git=True,
                                  x_save_requirements=False)
        with _environment(WANDB_ERROR_REPORTING="false"):  # nor its service's crash reports (read as it starts)
            self.run = wandb.init(project=PROJECT, name=run_name, id=run_id, dir=str(folder), config=config,
                                  resume="allow", settings=settings)
        self.line = (f"tracker: W&B offline run {run_id} in {Path(self.run.dir).parent} (nothing leaves this "
                     f"machine; upload it when you choose: wandb sync {folder}/wandb/offline-run-*)")

    def write(self, step: int, scalars: dict[str, float], texts: dict[str, str]) -> None:
        self.run.log({**scalars, **texts}, step=step)

    def close(self) -> None:
        self.run.finish()


class Trackio(Tracker):
    def __init__(self, folder: Path, run_name: str, config: dict):
        with _environment(TRACKIO_DIR=str(folder), **dict.fromkeys(_TRACKIO_REMOTE)):
            trackio = _library("trackio", "trackio")
            _check_trackio_store(trackio.utils, folder)
            with contextlib.redirect_stdout(io.StringIO()):  # its lines name its default store, not this one
                self.run = trackio.init(project=PROJECT, name=run_name, config=config, resume="allow", embed=False,
                                        auto_log_gpu=False, auto_log_cpu=False)
        self.trackio = trackio
        self.line = (f"tracker: trackio run {run_name} in {folder} (see it: TRACKIO_DIR={folder} trackio show "
                     f"--project {PROJECT})")

    def write(self, step: int, scalars: dict[str, float], texts: dict[str, str]) -> None:
        self.run.log({**scalars, **texts}, step=step)

    def close(self) -> None:
        with contextlib.redirect_stdout(io.StringIO()):
            self.trackio.finish()  # the run it started, which its exit hook then leaves alone


@contextlib.contextmanager
def _environment(**values: str | None) -> Iterator[None]:
    """os.environ with `values` set (None: unset) inside the block, as it was after it."""
    before = {key: os.environ.get(key) for key in values}

    def put(settings: dict[str, str | None]) -> None:
        for key, value in settings.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value

    put(values)
    try:
        yield
    finally:
        put(before)


def open_tracker(cfg: RunConfig, run_dir: Path, resumed_at: int | None) -> Tracker | None:
    """The tracker run of the run in `run_dir` (None without train.tracker), in RUN/tracker/NAME; `resumed_at`: the
    step a resumed session starts from (None for a new run)."""
    name = cfg.train.log.tracker
    if name is None:
        return None
    folder = _folder(run_dir, name)
    if name == "tensorboard":
        return TensorBoard(folder, resumed_at)
    folder.mkdir(parents=True, exist_ok=True)
    if name == "wandb":
        return WeightsAndBiases(folder, Path(run_dir).name, cfg.to_dict())
    return Trackio(folder, Path(run_dir).name, cfg.to_dict())
