"""Peak throughput and price of the hardware a run uses: the denominators of MFU and the cost columns.

GPUs come from burnout/configs/hardware.yaml (editable), matched on the name torch reports. A CPU has no
datasheet figure that means much, and a GPU missing from the table has none at hand, so their peak is
measured: the best of a few large matrix multiplies in the run's precision. A CPU's is the best ever measured on
it, kept in the user's cache folder and only ever raised, so that a measurement slowed by other work cannot make
every later MFU too large (docs/PERFORMANCE.md, "How the CPU peak is obtained").
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from burnout.base.files import user_cache_dir, write_atomic
from burnout.base.text import plural
from burnout.base.values import is_finite_number
from burnout.config import CONFIG_DIR, read_yaml
from burnout.core.device import compute_precision, cpu_instructions, cpu_model, resolve_precision
from burnout.errors import BurnoutError

HARDWARE_FILE = CONFIG_DIR / "hardware.yaml"
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass
class Hardware:
    key: str
    name: str
    peak_flops: float  # per device, in the run's precision
    price_per_hour: float | None  # dollars per device-hour
    price_note: str  # how the price was arrived at, for reports
    # The MFU a training run reached on it, measured (hardware.yaml's `mfu`, with its source), for `burnout plan`.
    mfu: float | None = None
    mfu_note: str = ""
    # The peak measured again, for a step that outran it: a CPU's (a GPU's would need memory the run holds).
    measure_again: Callable[[], float] | None = None


def hardware_table(path: Path = HARDWARE_FILE) -> dict[str, dict]:
    return read_yaml(path)


def get_hardware(key: str, precision: str, price_per_hour: float | None = None,
                 device: torch.device | None = None, say: Callable[[str], None] | None = None) -> Hardware:
    """`key` is a table entry, `cpu`, or `auto` (the GPU torch sees on `device`, else the CPU).

    A GPU that the table does not list still trains: its peak is measured now, and `say` hears so.
    """
    table = hardware_table()
    # An fp8 run's MFU is over the dense bf16 peak, the usual convention (its model FLOPs are the same).
    precision = "fp32" if precision == "auto" else compute_precision(precision)
    if key == "auto":
        key = match_gpu(table, torch.cuda.get_device_name(device)) if _is_gpu(device) else "cpu"
    if key is None:
        gpu = torch.cuda.get_device_name(device)
        hw = Hardware("measured", gpu, measure_gpu_peak(device, precision), None, "")
        if say is not None:
            say(f"hardware: '{gpu}' is not in {HARDWARE_FILE}, so MFU is over a {precision} matmul peak measured "
                f"now ({hw.peak_flops / 1e12:,.1f} TFLOP/s)"
                + ("" if price_per_hour is not None else " and no price is known (set train.price_per_hour)"))
    elif key == "cpu":
        hw = Hardware("cpu", f"CPU ({plural(torch.get_num_threads(), 'thread')})", cpu_peak(precision), None, "",
                      measure_again=functools.partial(cpu_peak, precision, measure_again=True))
    else:
        hw = _table_hardware(table, key, precision)
    if price_per_hour is not None:
        hw.price_per_hour, hw.price_note = price_per_hour, "given"
    return hw


def hardware_price(key: str, given: float | None, device: torch.device | None) -> tuple[float | None, str]:
    """(the price per device-hour of a run on `device` with train.hardware `key`: `given` (train.price_per_hour), else
    the table's; None where none is known, what the run's hardware is), without measuring any peak."""
    if given is not None:
        return given, "train.price_per_hour"
    table = hardware_table()
    if key == "auto":
        key = match_gpu(table, torch.cuda.get_device_name(device)) if _is_gpu(device) else "cpu"
        if key is None:
            return None, f"the GPU '{torch.cuda.get_device_name(device)}', which {HARDWARE_FILE} does not list"
    if key == "cpu":
        return None, "a CPU"
    entry = _table_entry(table, key)
    return _table_price(entry)[0], f"hardware '{key}' ({entry['name']})"


def _table_hardware(table: dict[str, dict], key: str, precision: str) -> Hardware:
    entry = _table_entry(table, key)
    peaks = entry["peak_tflops"]
    if precision not in peaks:
        # A card without bf16 tensor cores (T4, V100) lists no bf16 peak: bf16 would run emulated there.
        raise BurnoutError(f"hardware '{key}' ({entry['name']}) has no {precision} peak in {HARDWARE_FILE}; "
                           f"use {' or '.join(peaks)} (train.precision, or burnout plan --precision)")
    return Hardware(key, entry["name"], float(peaks[precision]) * 1e12, *_table_price(entry), entry.get("mfu"),
                    entry.get("mfu_note", ""))


def _table_entry(table: dict[str, dict], key: str) -> dict:
    if key not in table:
        raise BurnoutError(f"hardware '{key}' is not in {HARDWARE_FILE}; choose one of: cpu, "
                           f"{', '.join(table)} (or add an entry there)")
    return table[key]


def _table_price(entry: dict) -> tuple[float | None, str]:
    """(An entry's price per device-hour, how it was arrived at): its price_per_hour, or compute units' price."""
    if entry.get("price_per_hour") is None and "units_per_hour" in entry:
        return (entry["units_per_hour"] * entry["dollars_per_unit"],
                f"{entry['units_per_hour']:g} units/h × ${entry['dollars_per_unit']:g}/unit")
    return entry.get("price_per_hour"), "table"


def match_gpu(table: dict[str, dict], name: str) -> str | None:
    """The entry for a GPU named `name` (as torch.cuda.get_device_name says it), or None if none matches.

    Each entry's `match` strings are looked for as whole words, longest first: "NVIDIA H100 PCIe" must find
    the PCIe entry, not the SXM one that "H100" alone names.
    """
    patterns = sorted(((m, key) for key, entry in table.items() for m in entry.get("match") or []),
                      key=lambda pattern: -len(pattern[0]))
    for pattern, key in patterns:
        if re.search(rf"\b{re.escape(pattern)}\b", name):
            return key
    return None


def detect(table: dict[str, dict], device: torch.device | None) -> str:
    """The table entry of the GPU on `device` ('cpu' off a GPU); a GPU the table does not list is an error."""
    if not _is_gpu(device):
        return "cpu"
    name = torch.cuda.get_device_name(device)
    key = match_gpu(table, name)
    if key is None:
        raise BurnoutError(f"GPU '{name}' is not in {HARDWARE_FILE}; add it there with its datasheet peak")
    return key


def _is_gpu(device: torch.device | None) -> bool:
    return device is not None and device.type == "cuda"


# (CPU key, precision) → the peak this process's MFU is over: read and measured once, raised by later measurements,
# and otherwise fixed, so that runs in one process share one denominator.
_PROCESS_PEAKS: dict[tuple[str, str], float] = {}


def cpu_peak(precision: str, measure_again: bool = False) -> float:
    """The CPU's matmul peak in `precision` that MFU divides by: the best `measure_cpu_peak` ever gave on this CPU
    (model, instructions, torch version, threads), kept in the precision cache and only ever raised. A process
    measures once (`measure_again`: once more, for a step that outran the peak) and raises the kept best with its
    figure; a figure that other work slowed leaves the best as it was."""
    known = _PROCESS_PEAKS.get((_cpu_key(), precision))
    if known is not None and not measure_again:
        return known
    measured = measure_cpu_peak(precision)
    with _cache_entry() as entry:
        return _raise_best(entry, precision, measured)


def _raise_best(entry: dict, precision: str, flops: float) -> float:
    """The best `precision` peak of a cache entry and of this process, raised to the measured `flops` where that beats
    it (FLOP/s; the entry keeps GFLOP/s). The figures that decided `precision: auto` are measurements too (an entry
    older than best_gflops has only them); a figure that is not a number counts as none."""
    best = entry.get("best_gflops") if isinstance(entry.get("best_gflops"), dict) else {}
    kept = [x for x in (best.get(precision), entry.get(f"{precision}_gflops")) if is_finite_number(x)]
    best[precision] = max([flops / 1e9, *kept])
    entry["best_gflops"] = best
    key = (_cpu_key(), precision)
    _PROCESS_PEAKS[key] = max(best[precision] * 1e9, _PROCESS_PEAKS.get(key, 0.0))
    return _PROCESS_PEAKS[key]


def _cpu_key() -> str:
    """What a CPU measurement holds for: the precision cache's key."""
    return f"{cpu_model()} | {cpu_instructions()} | torch {torch.__version__} | {torch.get_num_threads()} threads"


# A size whose best multiply takes longer than this is the one measured: larger would take too long where the
# CPU emulates the precision (fp16 on most, bf16 without bf16 instructions).
CPU_PEAK_SIZE_LIMIT_S = 0.02


def measure_cpu_peak(precision: str, max_size: int = 2048, repeats: int = 6) -> float:
    """Best observed FLOP/s of a square matrix multiply on the CPU, in the given precision: large and warmed,
    so that no GEMM of a model outruns it (gpt2-134m's 768 x 3072 GEMMs outran one 1024² multiply timed alone,
    which overstated its MFU: docs/PERFORMANCE.md). The size doubles from 256 while the best of three multiplies
    takes under CPU_PEAK_SIZE_LIMIT_S, up to max_size: one multiply that other work held up does not stop the
    growth, and a precision the CPU emulates stays small instead of taking minutes."""
    dtype = DTYPES[precision]
    # A private generator: this runs after a resume restored the run's RNG states, and must not move them.
    g = torch.Generator().manual_seed(0)
    size = 256
    while True:
        a = torch.randn(size, size, dtype=dtype, generator=g)
        b = torch.randn(size, size, dtype=dtype, generator=g)
        # At the size kept, also the warm-up: kernel selection, the operands brought into cache.
        if size >= max_size or _best_seconds(a, b, 3) >= CPU_PEAK_SIZE_LIMIT_S:
            break
        size *= 2
    return 2 * size**3 / _best_seconds(a, b, repeats)


def _best_seconds(a: torch.Tensor, b: torch.Tensor, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - t0)
    return best


# On a CPU, bf16 beats fp32 only where the CPU has bf16 matrix instructions (AVX-512 BF16, AMX); elsewhere bf16
# is emulated and slower (docs/PERFORMANCE.md). So training's `auto` measures on the running machine, once per CPU
# model, torch version and thread count, and picks bf16 when it is at least this much faster.
CPU_BF16_MIN_SPEEDUP = 1.2
PRECISION_CACHE_FILE = "cpu_precision.json"


def training_precision(name: str, device: torch.device, say: Callable[[str], None] = print) -> str:
    """`resolve_precision`, except that `auto` on a CPU is what a measurement on this machine found faster,
    bf16 autocast or fp32, said in one line with the figures that decided it. (Evaluation and generation
    stay fp32 on a CPU: their scores must equal lm-eval's.)"""
    if name != "auto" or device.type != "cpu":
        return resolve_precision(name, device)
    entry, cached = cpu_precision_entry()
    say(f"precision auto on this CPU ({entry['cpu']}, {entry['instructions']}, {plural(entry['threads'], 'thread')}): "
        f"{entry['choice']}; a matmul peak of {entry['bf16_gflops']:.3g} GFLOP/s in bf16 vs "
        f"{entry['fp32_gflops']:.3g} in fp32 "
        f"({'measured earlier' if cached else 'measured now'}, cached in {precision_cache_path()}; "
        "train.precision=fp32 or bf16 overrides)")
    return entry["choice"]


def precision_cache_path() -> Path:
    """cpu_precision.json in the user's cache folder (user_cache_dir)."""
    return user_cache_dir() / PRECISION_CACHE_FILE


def cpu_precision_entry() -> tuple[dict, bool]:
    """(this machine's entry: the choice and both throughputs, whether it came from the cache); measured with
    `measure_cpu_peak` (about a second) when the cache has none. The choice, once made, stays: the throughputs
    kept with it are the ones that decided it (the peaks MFU divides by are `cpu_peak`'s)."""
    with _cache_entry() as entry:
        if entry.get("choice") in ("fp32", "bf16"):
            return dict(entry), True
        rates = {precision: measure_cpu_peak(precision) / 1e9 for precision in ("fp32", "bf16")}
        entry.update(choice="bf16" if rates["bf16"] >= CPU_BF16_MIN_SPEEDUP * rates["fp32"] else "fp32",
                     fp32_gflops=rates["fp32"], bf16_gflops=rates["bf16"], cpu=cpu_model(),
                     instructions=cpu_instructions(), threads=torch.get_num_threads(),
                     measured_at=time.strftime("%Y-%m-%d %H:%M:%S"))
        for precision, rate in rates.items():
            _raise_best(entry, precision, rate * 1e9)
        return dict(entry), False


@contextlib.contextmanager
def _cache_entry() -> Iterator[dict]:
    """This machine's entry of the precision cache (keyed by CPU model, instructions, torch version and threads),
    written back when the block changed it, under an flock that other burnout processes wait for: two raising a
    peak at once keep the higher. A home that cannot be written keeps nothing: the next process measures again."""
    path, key = precision_cache_path(), _cpu_key()
    with contextlib.ExitStack() as stack:
        with contextlib.suppress(OSError):
            path.parent.mkdir(parents=True, exist_ok=True)
            fcntl.flock(stack.enter_context(open(path.with_name(path.name + ".lock"), "a")), fcntl.LOCK_EX)
        try:
            cache = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            cache = {}
        cache = cache if isinstance(cache, dict) else {}
        entry = cache.get(key) if isinstance(cache.get(key), dict) else {}
        before = json.dumps(entry, sort_keys=True)
        yield entry
        if json.dumps(entry, sort_keys=True) != before:
            cache[key] = entry
            with contextlib.suppress(OSError):
                write_atomic(path, json.dumps(cache, indent=2) + "\n")


def measure_gpu_peak(device: torch.device, precision: str, size: int = 8192, repeats: int = 10) -> float:
    """Best observed FLOP/s of a size×size matrix multiply on the GPU `device`, in the given precision
    (fp32 on TF32 tensor cores once configure_backends allowed them, as training runs it)."""
    dtype = DTYPES[precision]
    g = torch.Generator(device=device).manual_seed(0)  # leaves the run's CUDA RNG state where it is
    a = torch.randn(size, size, device=device, dtype=dtype, generator=g)
    b = torch.randn(size, size, device=device, dtype=dtype, generator=g)
    torch.mm(a, b)  # first call pays for cuBLAS's setup and kernel selection
    torch.cuda.synchronize(device)
    best = float("inf")
    for _ in range(repeats):
        # The launch returns at once: only the synchronize makes the interval cover the multiply.
        t0 = time.perf_counter()
        torch.mm(a, b)
        torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - t0)
    return 2 * size**3 / best
