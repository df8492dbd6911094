"""Checkpoints: one folder per kept step, written atomically, loadable without unpickling code.

    RUN/checkpoints/step_0000500/
        model.safetensors   weights (a tied matrix stored once)
        state.pt            optimizer (+ grad scaler), step, tokens seen, loader position, RNG states
                            (Python, NumPy, torch CPU and CUDA); read with weights_only=True
        config.yaml         the full resolved run config
        tokenizer.json      the tokenizer the model was trained with
        info.json           step, tokens, losses, wall time: what a person or a report reads
        sha256.json         the sha256 of each file above, written last

A checkpoint is written under a temporary name, fsynced and renamed, so a folder named step_* is
always complete; a crash mid-write leaves only a `.tmp-*` folder that the next save removes. The
sha256 of each file is recorded when it is saved and checked when it is loaded, because a volume can
damage a file after every write reported success. The last `keep_last` checkpoints survive pruning,
and so do the steps in `keep_steps` (milestones, phase ends, the best). A CheckpointMirror copies each
kept checkpoint, checked against its sha256, and the run's logs to a second folder (a mounted drive)
in a background thread.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import queue
import re
import shlex
import shutil
import threading
import warnings
import zipfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import safetensors.torch
import torch

from burnout.base.files import (
    CHECKPOINT_DIR,
    LAUNCHES_FILE,
    METRICS_FILE,
    REPORT_DIR,
    RUN_CONFIG_FILE,
    RUN_LOG_FILES,
    TOKENIZER_FILE,
    read_jsonl,
    sha256_file,
    write_atomic,
    write_atomic_with,
)
from burnout.base.folders import check_output_folder, folder_contents
from burnout.base.text import first_line
from burnout.base.values import is_finite_number, kind_of
from burnout.config import RunConfig, load_saved_config, saved_config_text
from burnout.core.device import lowbit_optim
from burnout.errors import BurnoutError, StorageError
from burnout.models import Transformer
from burnout.models.memory import param_counts, static_bytes
from burnout.models.size import check_weights_fit
from burnout.models.transformer import unwrapped

MANIFEST_FILE = "sha256.json"
INFO_FILE = "info.json"
# What every checkpoint folder holds besides MANIFEST_FILE (see the module docstring).
CHECKPOINT_FILES = ("model.safetensors", "state.pt", RUN_CONFIG_FILE, INFO_FILE, TOKENIZER_FILE)
_STEP_DIR = re.compile(r"^step_(\d+)$")
# Beside the tensors' bytes: safetensors' header, state.pt's zip entries and pickled RNG states, config,
# info and manifest; this leaves a margin over their measured size (docs/PERFORMANCE.md).
_OVERHEAD_BYTES = 256 * 1024
_OVERHEAD_PER_RANK = 32 * 1024  # each rank's RNG states under torchrun


@dataclass
class Checkpoint:
    path: Path
    config: RunConfig
    model: Transformer
    state: dict  # optimizer state, step, tokens, RNG states
    info: dict


def save_checkpoint(
    run_dir: Path, cfg: RunConfig, model: Transformer, state: dict, info: dict, tokenizer_path: Path,
    keep_last: int, keep_steps: Iterable[int] = (),
) -> Path:
    ckpt_root = Path(run_dir) / CHECKPOINT_DIR
    ckpt_root.mkdir(parents=True, exist_ok=True)
    for stale in ckpt_root.glob(".tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)
    final = ckpt_root / f"step_{info['step']:07d}"
    tmp = ckpt_root / f".tmp-{final.name}"
    model = unwrapped(model)
    try:
        tmp.mkdir()
        write_atomic_with(tmp / "model.safetensors", lambda path: safetensors.torch.save_model(model, str(path)))
        torch.save(state, tmp / "state.pt")
        write_atomic(tmp / RUN_CONFIG_FILE, saved_config_text(cfg, run_dir))
        write_atomic(tmp / "info.json", json.dumps(info, indent=2))
        shutil.copyfile(tokenizer_path, tmp / TOKENIZER_FILE)
        digests = {f.name: sha256_file(f) for f in sorted(tmp.iterdir())}
        write_atomic(tmp / MANIFEST_FILE, json.dumps(digests, indent=2))
        for f in tmp.iterdir():
            _fsync(f)
        _fsync(tmp)
    except (OSError, RuntimeError, safetensors.SafetensorError) as exc:  # a full disk, a quota, a lost mount
        shutil.rmtree(tmp, ignore_errors=True)
        previous = list_checkpoints(run_dir)
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else first_line(exc)
        raise StorageError(
            f"could not write checkpoint {final.name} into {ckpt_root} ({reason}); free disk space, then continue "
            f"with `burnout train --resume {run_dir}` from the previous checkpoint "
            f"{previous[-1].name + ', which is intact' if previous else '(none yet)'}") from None
    if final.exists():  # the same step saved again after a resume
        _remove(final)
    os.replace(tmp, final)
    _fsync(ckpt_root)
    keep_steps = set(keep_steps)
    for old in list_checkpoints(run_dir)[:-keep_last]:
        if _step_of(old) not in keep_steps:
            _remove(old)
    return final


def _remove(checkpoint: Path) -> None:
    """Rename a checkpoint out of the step_* names, then delete it: a crash mid-delete leaves a `.tmp-*`
    folder (removed by the next save), never a half-deleted step_* folder that looks complete."""
    doomed = checkpoint.with_name(f".tmp-delete-{checkpoint.name}")
    shutil.rmtree(doomed, ignore_errors=True)
    os.replace(checkpoint, doomed)
    shutil.rmtree(doomed)


def _step_of(path: Path) -> int:
    return int(_STEP_DIR.match(path.name).group(1))


class CheckpointMirror:
    """Copies checkpoints to `mirror_dir/checkpoints/` and the run's logs (RUN_LOG_FILES, the report) to
    `mirror_dir/` in a background thread, atomically (temp name, then rename), and prunes the mirror to the
    run's kept set, so losing the machine loses at most the checkpoint being copied. A copy that does not
    match the sha256 recorded at saving is removed, never renamed into place. The mirror is new, empty or this
    run's own (check_mirror); the logs go first, so that it names its run before it holds a checkpoint."""

    def __init__(self, run_dir: Path, mirror_dir: Path, on_error: Callable[[str], None]):
        check_mirror(run_dir, mirror_dir)
        self.run_dir, self.mirror_dir = Path(run_dir), Path(mirror_dir)
        self.root = self.mirror_dir / CHECKPOINT_DIR
        self.on_error = on_error
        self._queue: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._work, name="checkpoint-mirror", daemon=True)
        self._thread.start()

    def submit(self, checkpoint: Path, kept: list[Path]) -> None:
        self._queue.put((Path(checkpoint), {p.name for p in kept}))

    def close(self) -> None:
        """Copy the logs once more (they grew since the last checkpoint), and wait for every copy to finish."""
        self._queue.put((None, None))
        self._queue.put(None)
        self._thread.join()

    def _work(self) -> None:
        while (job := self._queue.get()) is not None:
            src, kept = job
            try:
                mirror_run_logs(self.run_dir, self.mirror_dir)
                if src is not None:
                    self._copy(src, kept)
            except (OSError, BurnoutError) as exc:  # a full, vanished or taken-over mirror must not stop training
                what = src.name if src is not None else "the run's logs"
                self.on_error(f"mirror: copying {what} to {self.mirror_dir} failed ({exc}); training goes on")

    def _copy(self, src: Path, kept: set[str]) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        tmp, final = self.root / f".tmp-{src.name}", self.root / src.name
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(src, tmp)
        problem = checkpoint_problem(tmp)
        if problem is not None:
            shutil.rmtree(tmp, ignore_errors=True)
            self.on_error(f"mirror: the copy of {src.name} in {self.root} is corrupt ({problem}); "
                          "removed, the mirror keeps its earlier checkpoints, training goes on")
            return
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        for old in self.root.iterdir():
            if _STEP_DIR.match(old.name) and old.name not in kept:
                shutil.rmtree(old, ignore_errors=True)


def check_mirror(run_dir: Path, mirror_dir: Path) -> None:
    """Refuse, in one line, a train.mirror_dir that is not new, empty or this run's mirror: one holding anything
    else, the mirror of another run (whose checkpoints pruning to this run's would delete), or the run folder.
    A mirror's run is told by the first launch in its copy of launches.jsonl (the same wherever the run folder
    is restored to); one that holds checkpoints but no logs cannot tell its run and is taken as this one's."""
    run = _first_launch(run_dir) or "a run not launched yet"

    def mirror_of(folder: Path) -> dict | None:
        if launch_log(folder):
            return {"kind": "mirror", "source": _first_launch(folder)}
        names = folder_contents(folder)
        if CHECKPOINT_DIR in names and all(name in (CHECKPOINT_DIR, REPORT_DIR, *RUN_LOG_FILES)
                                           or name.startswith(".tmp-") for name in names):
            return {"kind": "mirror", "source": run}
        return None

    check_output_folder(mirror_dir, "train.mirror_dir", "mirror", run, reads=[run_dir], recognise=mirror_of)


def launch_log(folder: Path) -> list[dict]:
    """The launches in `folder`'s launches.jsonl where it is a run's (every record a launch: its time, step, argv and
    versions, as train/provenance.py writes them); [] where there is none, or where a file of that name holds
    anything else: someone's own file, which no command takes for a run's log or appends to."""
    launches = read_jsonl(Path(folder) / LAUNCHES_FILE)
    fields = {"time", "step", "argv", "versions"}
    return launches if all(isinstance(launch, dict) and fields <= launch.keys() for launch in launches) else []


def step_log(folder: Path) -> bool:
    """Whether `folder`'s metrics.jsonl is a run's: records, every one a logged step (a whole-number step, and its
    tokens and elapsed_s), as train/metrics.py writes them; a file of that name holding anything else is not."""
    records = read_jsonl(Path(folder) / METRICS_FILE)

    def logged_step(record) -> bool:
        return (isinstance(record, dict) and type(record.get("step")) is int
                and all(is_finite_number(record.get(key)) for key in ("tokens", "elapsed_s")))

    return bool(records) and all(logged_step(record) for record in records)


def _first_launch(folder: Path) -> str | None:
    """The run whose launches.jsonl `folder` holds, named by its first launch (when, where, the command)."""
    launches = launch_log(folder)
    if not launches:
        return None
    first = launches[0]
    return f"the run first launched at {first.get('time')} in {first.get('cwd')} ({shlex.join(first.get('argv', []))})"


def mirror_run_logs(run_dir: Path, mirror_dir: Path) -> None:
    """Copy a run's logs (RUN_LOG_FILES and the report folder, where present) into `mirror_dir`, each under a
    temporary name and then renamed, so the mirror always holds whole files; refused in one line where
    `mirror_dir` is not this run's mirror (check_mirror)."""
    run_dir, mirror_dir = Path(run_dir), Path(mirror_dir)
    check_mirror(run_dir, mirror_dir)
    mirror_dir.mkdir(parents=True, exist_ok=True)
    for name in RUN_LOG_FILES:
        if (run_dir / name).is_file():
            tmp = mirror_dir / f".tmp-{name}"
            shutil.copyfile(run_dir / name, tmp)
            os.replace(tmp, mirror_dir / name)
    if (run_dir / REPORT_DIR).is_dir():
        tmp, final = mirror_dir / f".tmp-{REPORT_DIR}", mirror_dir / REPORT_DIR
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(run_dir / REPORT_DIR, tmp)
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)


def checkpoint_problem(path: Path) -> str | None:
    """What is wrong with a checkpoint folder's files against the sha256 recorded when it was saved (the
    first file that differs, or is missing), or None when every file matches. A checkpoint saved before
    the sha256 was recorded has no MANIFEST_FILE: its files are checked for what can be told without it."""
    path = Path(path)
    if not (path / MANIFEST_FILE).is_file():
        return _unrecorded_problem(path)
    try:
        recorded = json.loads((path / MANIFEST_FILE).read_text())
        if not isinstance(recorded, dict):
            raise ValueError("not a JSON object")
    except (OSError, ValueError) as exc:
        return f"{MANIFEST_FILE}, which records the files' sha256, is unreadable ({first_line(exc)})"
    for name, digest in recorded.items():
        try:
            if sha256_file(path / name) != digest:
                return f"{name} does not match the sha256 recorded when it was saved"
        except FileNotFoundError:
            return f"{name} is missing"
        except OSError as exc:
            return f"{name} cannot be read ({exc.strerror or first_line(exc)})"
    return None


def _unrecorded_problem(path: Path) -> str | None:
    """Of a checkpoint without MANIFEST_FILE: the first of its files that is missing or empty, or whose container
    (state.pt's zip, model.safetensors' header) is cut short; None when each looks whole. Reads the headers only."""
    for name in CHECKPOINT_FILES:
        file = path / name
        try:
            if file.stat().st_size == 0:
                return f"{name} is empty"
        except FileNotFoundError:
            return f"{name} is missing"
        except OSError as exc:
            return f"{name} cannot be read ({exc.strerror or first_line(exc)})"
    try:
        if not zipfile.is_zipfile(path / "state.pt"):
            return "state.pt is not a whole zip archive (cut short or damaged)"
        with safetensors.safe_open(path / "model.safetensors", "pt"):
            pass
    except (OSError, safetensors.SafetensorError) as exc:
        return f"model.safetensors is unreadable ({first_line(exc)})"
    return None


def checkpoint_bytes(cfg: RunConfig, tokenizer_path: Path, world_size: int = 1) -> int:
    """The bytes one checkpoint of `cfg`'s run takes, from the parameter counts: fp32 weights (a tied matrix
    once) and the optimizer's state (AdamW's two moments, Muon's momentum), the tokenizer, and an allowance
    for headers, RNG states and the small files."""
    static = static_bytes(param_counts(cfg.model), cfg.train.optim.optimizer)
    return (static["weights"] + static["optimizer"] + Path(tokenizer_path).stat().st_size + _OVERHEAD_BYTES
            + _OVERHEAD_PER_RANK * world_size)


def folder_bytes(path: Path) -> int:
    """The bytes of the files under `path` (0 when it does not exist)."""
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoint folders of a run, oldest first."""
    root = Path(run_dir) / CHECKPOINT_DIR
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := _STEP_DIR.match(p.name)) and p.is_dir()]
    return [p for _, p in sorted(found)]


def checkpoint_info(checkpoint: Path) -> dict:
    """A checkpoint's info.json (its step, tokens and losses), or a BurnoutError naming it when it is missing, cut
    short, not a JSON object or without a whole-number step: one damaged checkpoint, said in one line."""
    path = Path(checkpoint) / INFO_FILE
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        why = (exc.strerror or first_line(exc)) if isinstance(exc, OSError) else f"not JSON: {first_line(exc)}"
        raise BurnoutError(f"checkpoint {checkpoint}: {INFO_FILE} is unreadable ({why}); use another checkpoint of "
                           "the run (or its copy in train.mirror_dir)") from None
    step = info.get("step") if isinstance(info, dict) else None
    if not isinstance(step, int) or isinstance(step, bool):
        raise BurnoutError(f"checkpoint {checkpoint}: {INFO_FILE} holds no step (it holds {kind_of(info)}): it was "
                           "not written by burnout; use another checkpoint of the run")
    return info


def run_dir_of(checkpoint: Path) -> Path:
    """The run folder holding RUN/checkpoints/step_N, or the checkpoint folder itself when it stands alone."""
    return checkpoint.parent.parent if checkpoint.parent.name == CHECKPOINT_DIR else checkpoint


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint folder, or a run folder (→ its latest checkpoint), or a file of a checkpoint (→ its folder)."""
    path = Path(path)
    if path.is_file() and path.name in CHECKPOINT_FILES and (path.parent / "model.safetensors").is_file():
        path = path.parent
    if (path / "model.safetensors").is_file():
        return path
    if path.is_file():
        raise BurnoutError(f"'{path}' is a file; give a run folder or one of its checkpoints/step_* folders")
    if not path.exists():
        raise BurnoutError(f"checkpoint '{path}' does not exist; "
                           f"give a run folder or one of its checkpoints/step_* folders")
    found = list_checkpoints(path)
    if not found:
        raise BurnoutError(f"'{path}' holds no checkpoint (no model.safetensors, no checkpoints/step_*); train first")
    return found[-1]


def load_checkpoint(path: str | Path, device: torch.device | str = "cpu", verify: bool = True) -> Checkpoint:
    """A checkpoint folder (or a run folder's latest), checked against its recorded sha256 unless `verify` is
    false (a caller that has checked it already)."""
    path = resolve_checkpoint(path)
    if verify and (problem := checkpoint_problem(path)) is not None:
        raise BurnoutError(f"checkpoint {path} is unreadable: {problem}; use another checkpoint of the run "
                           "(or its copy in train.mirror_dir) or train again")
    cfg = load_saved_config(path / RUN_CONFIG_FILE)
    check_weights_fit(cfg.model, f"checkpoint {path}", f"load it on a machine with more memory (or check its "
                      f"{RUN_CONFIG_FILE}'s model section)")
    model = model_for(cfg)
    name = "model.safetensors"
    try:
        if wrong := _wrong_shape(model, path / name):  # a BurnoutError: the except below lets it through
            raise BurnoutError(f"checkpoint {path} does not match its config: {wrong}")
        missing, unexpected = safetensors.torch.load_model(model, str(path / name), strict=False)
        name = "state.pt"
        state = {}
        # A start point (`burnout grow`'s) may hold no training state: its sha256.json then lists no state.pt.
        if (path / name).exists() or not (path / MANIFEST_FILE).is_file():
            # Tensors and plain containers only: a pickle that would build any other object is refused, unrun.
            if cfg.train.optim.optimizer == "adamw8bit":
                lowbit_optim()  # allows torchao's quantized moments, tensors of its own class
            with warnings.catch_warnings():  # torch warns about foreign pickle protocols before refusing them
                warnings.simplefilter("ignore", UserWarning)
                state = torch.load(path / name, map_location="cpu", weights_only=True)
        name = "info.json"
        info = json.loads((path / name).read_text())
    except (OSError, EOFError, RuntimeError, ValueError, json.JSONDecodeError, safetensors.SafetensorError,
            pickle.UnpicklingError) as exc:
        reason = first_line(str(exc))
        if isinstance(exc, pickle.UnpicklingError):
            reason = "it holds objects other than tensors, which are never unpickled"
        raise BurnoutError(f"checkpoint {path} is unreadable: {name} ({type(exc).__name__}: {reason}); "
                           "use another checkpoint of the run or train again") from None
    if missing or unexpected:
        raise BurnoutError(f"checkpoint {path} does not match its config: missing {sorted(missing)[:3]}, "
                           f"unexpected {sorted(unexpected)[:3]}")
    return Checkpoint(path=path, config=cfg, model=model.to(device), state=state, info=info)


def model_for(cfg: RunConfig) -> Transformer:
    """A new model of the shape a run config's checkpoints hold: the Transformer, with LoRA adapters (base
    weights frozen, plus lora_A/lora_B) when the run trains them. Built on the current default device."""
    model = Transformer(cfg.model)
    if cfg.adapters is not None:
        from burnout.models.lora import LoRAConfig, apply_lora

        key, adapters = cfg.adapters
        apply_lora(model, LoRAConfig.from_dict(dataclasses.asdict(adapters), key))
    return model


def holds_run(run_dir: Path) -> bool:
    """Whether training has started in `run_dir`: it logged a step or saved a checkpoint."""
    return bool(list_checkpoints(run_dir)) or (Path(run_dir) / METRICS_FILE).exists()


def _wrong_shape(model: Transformer, weights: Path) -> str | None:
    """The first tensor whose shape in the file differs from the model's, read from the file's header alone.
    Loading such a file fails with torch's "Error(s) in loading state_dict for Transformer:", a first line that
    names nothing."""
    expected = {name: list(tensor.shape) for name, tensor in model.state_dict().items()}
    with safetensors.safe_open(weights, "pt") as f:
        for name in f.keys():
            shape = list(f.get_slice(name).get_shape())
            if name in expected and shape != expected[name]:
                return f"{name} is {shape} in {weights.name} and {expected[name]} in config.yaml"
    return None


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
