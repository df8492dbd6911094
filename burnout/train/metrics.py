"""metrics.jsonl: one JSON object per logged step, the file every report and plot reads."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

METRICS_FILE = "metrics.jsonl"
# Keys that measure the machine rather than the training: they differ between a run and its exact replay.
TIMING_KEYS = ("elapsed_s", "tokens_per_s", "mfu", "eta_s", "dollars", "dollars_projected")


class MetricsLog:
    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / METRICS_FILE

    def truncate_after(self, step: int) -> None:
        """Forget records past `step`: a resumed run logs them again, identically."""
        if not self.path.exists():
            return
        kept = [line for line in self.path.read_text().splitlines() if line and json.loads(line)["step"] <= step]
        write_atomic(self.path, "".join(line + "\n" for line in kept))  # a kill here must not lose the log

    def write(self, record: dict) -> None:
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}
        with self.path.open("a") as f:
            f.write(json.dumps(clean) + "\n")


def write_atomic(path: Path, text: str) -> None:
    """Write `text` to a temporary name and rename it over `path`: a reader (or a crash) sees all or nothing."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def read_metrics(run_dir: Path) -> list[dict]:
    path = Path(run_dir) / METRICS_FILE
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class ExternalLoggers:
    """TensorBoard and Weights & Biases, each only when enabled in the config (and installed)."""

    def __init__(self, run_dir: Path, tensorboard: bool, wandb: bool, config: dict):
        from burnout.errors import BurnoutError

        self.tb = self.wandb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                raise BurnoutError("train.tensorboard: the tensorboard package is not installed; "
                                   "pip install tensorboard or set train.tensorboard=false") from None
            self.tb = SummaryWriter(log_dir=str(Path(run_dir) / "tensorboard"))
        if wandb:
            try:
                import wandb as wandb_module
            except ImportError:
                raise BurnoutError("train.wandb: the wandb package is not installed; "
                                   "pip install wandb or set train.wandb=false") from None
            # The run folder's name is the W&B id, so a resumed run continues the same W&B run.
            self.wandb = wandb_module.init(project="gpuburnout", name=Path(run_dir).name, id=Path(run_dir).name,
                                           dir=str(run_dir), config=config, resume="allow")

    def write(self, record: dict) -> None:
        numbers = {k: v for k, v in record.items() if isinstance(v, (int, float)) and k != "step"}
        if self.tb is not None:
            for key, value in numbers.items():
                self.tb.add_scalar(key, value, record["step"])
        if self.wandb is not None:
            self.wandb.log(numbers, step=record["step"])

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
        if self.wandb is not None:
            self.wandb.finish()
