"""Where and in what precision a run computes."""

from __future__ import annotations

import contextlib
import platform
from pathlib import Path

import torch

from burnout.errors import BurnoutError


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise BurnoutError(f"train.device: '{name}' is not a device; use auto, cpu, cuda or cuda:N") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise BurnoutError("train.device: CUDA was asked for but this machine has none; use train.device=cpu")
    return device


def describe_device(device: torch.device) -> str:
    """What the steps run on: the GPU's name, or the CPU's model and thread count."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{_cpu_model()}, {torch.get_num_threads()} threads"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:  # not Linux
        pass
    return platform.processor() or platform.machine() or "CPU"


def resolve_precision(name: str, device: torch.device) -> str:
    """bf16 autocast where the GPU supports it; fp32 on CPU until a measurement shows bf16 pays off."""
    if name == "auto":
        return "bf16" if device.type == "cuda" and torch.cuda.is_bf16_supported() else "fp32"
    return name


def autocast(device: torch.device, precision: str):
    if precision in ("bf16", "fp16"):
        dtype = torch.bfloat16 if precision == "bf16" else torch.float16
        return torch.autocast(device_type=device.type, dtype=dtype)
    return contextlib.nullcontext()


def configure_backends(device: torch.device) -> None:
    """TF32 tensor cores for the fp32 matmuls and convolutions left outside autocast (Ampere and later)."""
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
