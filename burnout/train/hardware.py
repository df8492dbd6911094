"""Peak throughput and price of the hardware a run uses: the denominators of MFU and the cost columns.

GPUs come from burnout/configs/hardware.yaml (editable). A CPU has no datasheet figure that means much, so its
peak is measured: the best of a few large matrix multiplies in the run's precision.
"""

from __future__ import annotations

import functools
import re
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from burnout.config import CONFIG_DIR, read_yaml
from burnout.errors import BurnoutError

HARDWARE_FILE = CONFIG_DIR / "hardware.yaml"


@dataclass
class Hardware:
    key: str
    name: str
    peak_flops: float  # per device, in the run's precision
    price_per_hour: float | None  # dollars per device-hour
    price_note: str  # how the price was arrived at, for reports


def hardware_table(path: Path = HARDWARE_FILE) -> dict[str, dict]:
    return read_yaml(path)


def get_hardware(key: str, precision: str, price_per_hour: float | None = None,
                 device: torch.device | None = None) -> Hardware:
    """`key` is a table entry, `cpu`, or `auto` (the GPU torch sees on `device`, else the CPU)."""
    table = hardware_table()
    if key == "auto":
        key = detect(table, device)
    precision = "fp32" if precision == "auto" else precision
    if key == "cpu":
        hw = Hardware("cpu", f"CPU ({torch.get_num_threads()} threads)", measure_cpu_peak(precision), None, "")
    else:
        if key not in table:
            raise BurnoutError(f"hardware '{key}' is not in {HARDWARE_FILE}; choose one of: cpu, "
                               f"{', '.join(table)} (or add an entry there)")
        entry = table[key]
        price, note = entry.get("price_per_hour"), "table"
        if price is None and "units_per_hour" in entry:
            price = entry["units_per_hour"] * entry["dollars_per_unit"]
            note = f"{entry['units_per_hour']:g} units/h × ${entry['dollars_per_unit']:g}/unit"
        hw = Hardware(key, entry["name"], float(entry["peak_tflops"][precision]) * 1e12, price, note)
    if price_per_hour is not None:
        hw.price_per_hour, hw.price_note = price_per_hour, "given"
    return hw


def detect(table: dict[str, dict], device: torch.device | None) -> str:
    if device is None or device.type != "cuda":
        return "cpu"
    name = torch.cuda.get_device_name(device)
    for key, entry in table.items():
        if any(re.search(rf"\b{re.escape(m)}\b", name) for m in entry.get("match", [])):
            return key
    raise BurnoutError(f"train.hardware: GPU '{name}' is not in {HARDWARE_FILE}; add it there or set "
                       "train.hardware to the closest entry")


@functools.cache
def measure_cpu_peak(precision: str, size: int = 1024, repeats: int = 5) -> float:
    """Best observed FLOP/s of a size×size matrix multiply on the CPU, in the given precision."""
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    a = torch.randn(size, size, dtype=dtype)
    b = torch.randn(size, size, dtype=dtype)
    torch.mm(a, b)  # first call pays for kernel selection
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - t0)
    return 2 * size**3 / best
