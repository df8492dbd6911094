"""Starting and resuming runs: find or prepare the data, then hand over to the training loop."""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable
from pathlib import Path

from burnout.common import RESUMES_FILE, RUN_CONFIG_FILE, append_jsonl, first_line, write_atomic
from burnout.config import RunConfig, load_run_config
from burnout.data.prepare import prepare_data
from burnout.data.shards import META_FILE, read_meta
from burnout.errors import BurnoutError
from burnout.train.loop import TrainResult, holds_run, refuse_existing_run, train

# Changing these mid-run would change which tokens the resumed run sees (or, for the optimizer, which
# state the checkpoint must hold).
_RESUME_FIXED = ("model", "data", "tokenizer", "sft", "dpo", "train.seed", "train.batch_size", "train.grad_accum",
                 "train.seq_len", "train.optimizer")

# Under torchrun, rank 0 writes its error here (in the run folder) when preparing the data fails, so that
# the ranks waiting for the data stop with it.
PREPARE_FAILED_FILE = ".prepare-failed"
WAIT_POLL_S = 1.0


def start_training(cfg: RunConfig, run_dir: Path, data_dir: Path | None = None,
                   on_event: Callable[[str], None] = print, progress: bool | None = None,
                   auto_batch: bool = False) -> TrainResult:
    """Train a new run. Data: `data_dir`, else `data.prepared_dir`, else prepared into RUN/data. A config with an
    `sft` section fine-tunes sft.base on sft.source instead, one with a `dpo` section runs DPO from dpo.base on
    dpo.source (train/finetune.py)."""
    refuse_existing_run(run_dir)  # before preparing data into a folder that holds another run
    if cfg.fine_tune is not None:
        if data_dir is not None:
            raise BurnoutError("--data: a fine-tune prepares its source into RUN/data itself; drop --data")
        from burnout.train.finetune import start_dpo, start_sft

        return (start_dpo if cfg.dpo is not None else start_sft)(cfg, Path(run_dir), on_event, progress, auto_batch)
    data_dir = data_dir or (Path(cfg.data.prepared_dir) if cfg.data.prepared_dir else None)
    if data_dir is None:
        data_dir = Path(run_dir) / "data"
        if not (data_dir / META_FILE).exists():
            prepare_on_rank_0(cfg, data_dir, on_event, progress, int(os.environ.get("RANK", "0")),
                              int(os.environ.get("WORLD_SIZE", "1")))
    read_meta(data_dir)
    # Recorded so that `--resume` and the saved config find the same tokens.
    cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, prepared_dir=str(Path(data_dir).resolve())))
    return train(cfg, run_dir, data_dir, resume=False, progress=progress, on_event=on_event, auto_batch=auto_batch)


def prepare_on_rank_0(cfg: RunConfig, data_dir: Path, on_event: Callable[[str], None], progress: bool | None,
                      rank: int, world_size: int) -> None:
    """Prepare the data into RUN/data. Under torchrun rank 0 prepares (two ranks writing the same shards
    collide) and the others wait for its meta.json, written last. They poll the folder rather than wait in
    a collective: no process group exists yet, and a large prepare outlasts any collective's timeout.
    Several nodes must therefore share the run folder (as --resume needs them to)."""
    failed = data_dir.parent / PREPARE_FAILED_FILE
    if rank == 0:
        on_event(f"preparing data into {data_dir}")
        failed.unlink(missing_ok=True)
        try:
            prepare_data(cfg.data, cfg.tokenizer, data_dir, progress=progress is not False)
        except Exception as exc:
            if world_size > 1:
                failed.parent.mkdir(parents=True, exist_ok=True)
                write_atomic(failed, first_line(exc))
            raise
        return
    # A failure file already there is an earlier launch's; rank 0's is a new file (written atomically). Should
    # rank 0 fail before this line, torchrun still stops this rank when rank 0 exits.
    earlier = _identity(failed)
    while not (data_dir / META_FILE).exists():
        if _identity(failed) not in (None, earlier):
            raise BurnoutError(f"rank {rank}: rank 0 failed to prepare the data into {data_dir}: "
                               f"{failed.read_text()}")
        time.sleep(WAIT_POLL_S)


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        stat = path.stat()
    except FileNotFoundError:
        return None
    return stat.st_ino, stat.st_mtime_ns


def resume_training(run_dir: Path, overrides: list[str] = (), on_event: Callable[[str], None] = print,
                    progress: bool | None = None) -> TrainResult:
    config_path = Path(run_dir) / RUN_CONFIG_FILE
    if not config_path.is_file():
        raise BurnoutError(f"--resume {run_dir}: no config.yaml there; is it a run folder made by `burnout train`?")
    saved = load_run_config(config_path)
    cfg = load_run_config(config_path, overrides)
    # Compare values rather than override keys: `--train.batch_size=8` or `train={...}` change them too.
    for key in _RESUME_FIXED:
        if _field(cfg, key) != _field(saved, key):
            raise BurnoutError(f"--resume: '{key}' cannot change in a running run; start a new run instead")
    before = _flat(saved.to_dict())
    changed = {k: v for k, v in _flat(cfg.to_dict()).items() if before.get(k) != v}
    if changed and os.environ.get("RANK", "0") == "0":  # the safe overrides (LR, phases, logging), recorded
        append_jsonl(Path(run_dir) / RESUMES_FILE, {"time": time.strftime("%Y-%m-%dT%H:%M:%S"),
                                                    "overrides": list(overrides), "changed": changed})
    return train(cfg, run_dir, Path(cfg.data.prepared_dir), resume=True, progress=progress, on_event=on_event)


def start_or_resume(cfg: RunConfig, run_dir: Path, overrides: list[str] = (), data_dir: Path | None = None,
                    on_event: Callable[[str], None] = print, progress: bool | None = None,
                    auto_batch: bool = False) -> TrainResult:
    """`burnout train CONFIG --out RUN --resume-if-exists`: resume RUN as `--resume RUN` would (its own
    config.yaml, these overrides) when training has started there, else start it. One command that is right
    on every boot of a machine that can vanish."""
    if not holds_run(run_dir):
        return start_training(cfg, run_dir, data_dir, on_event, progress, auto_batch)
    if os.environ.get("RANK", "0") == "0":
        on_event(f"{run_dir} already holds a run: resuming it (its config.yaml and the overrides given; "
                 "CONFIG, --data and --auto-batch apply to a new run only)")
    return resume_training(run_dir, overrides, on_event, progress)


def _flat(raw: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in raw.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _field(cfg: RunConfig, dotted: str):
    for part in dotted.split("."):
        cfg = getattr(cfg, part)
    return cfg
