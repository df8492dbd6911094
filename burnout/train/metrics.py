"""metrics.jsonl: one JSON object per logged step, the file every report and plot reads."""

from __future__ import annotations

import json
import math
from pathlib import Path

METRICS_FILE = "metrics.jsonl"


class MetricsLog:
    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / METRICS_FILE

    def truncate_after(self, step: int) -> None:
        """Forget records past `step`: a resumed run logs them again, identically."""
        if not self.path.exists():
            return
        kept = [line for line in self.path.read_text().splitlines() if line and json.loads(line)["step"] <= step]
        self.path.write_text("".join(line + "\n" for line in kept))

    def write(self, record: dict) -> None:
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}
        with self.path.open("a") as f:
            f.write(json.dumps(clean) + "\n")


def read_metrics(run_dir: Path) -> list[dict]:
    path = Path(run_dir) / METRICS_FILE
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
