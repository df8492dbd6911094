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


# Compute capability from which a GPU has bf16 tensor cores (Ampere). Below it torch still accepts bf16
# (torch.cuda.is_bf16_supported() counts emulation) but runs it without tensor cores or flash attention.
BF16_CAPABILITY = (8, 0)
LOW_PRECISION_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def resolve_precision(name: str, device: torch.device) -> str:
    """The precision `name` (auto, fp32, bf16, fp16) means on `device`.

    auto: bf16 autocast on GPUs with bf16 tensor cores; fp16 (training adds a grad scaler) on older ones;
    fp32 on CPU until a measurement shows bf16 pays off. bf16 asked for on an older GPU is an error.
    """
    if device.type != "cuda":
        return "fp32" if name == "auto" else name
    capability = torch.cuda.get_device_capability(device)
    if name == "auto":
        return "bf16" if capability >= BF16_CAPABILITY else "fp16"
    if name == "bf16" and capability < BF16_CAPABILITY:
        raise BurnoutError(
            f"train.precision=bf16: {torch.cuda.get_device_name(device)} has compute capability "
            f"{capability[0]}.{capability[1]}; bf16 needs 8.0 (Ampere) or newer; use train.precision=fp16 or auto"
        )
    return name


def autocast(device: torch.device, precision: str):
    """Autocast to bf16 or fp16 on `device`; nothing for fp32."""
    if precision in LOW_PRECISION_DTYPES:
        return torch.autocast(device_type=device.type, dtype=LOW_PRECISION_DTYPES[precision])
    return contextlib.nullcontext()


def configure_backends(device: torch.device) -> None:
    """TF32 tensor cores for the fp32 matmuls and convolutions left outside autocast (Ampere and later)."""
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
