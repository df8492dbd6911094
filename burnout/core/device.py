"""Where and in what precision a run computes."""

from __future__ import annotations

import contextlib
import os
import platform
from pathlib import Path

import torch

from burnout.base.machine import idle_cores_at_start
from burnout.base.text import install_extra, plural
from burnout.errors import BurnoutError


def resolve_device(name: str, setting: str = "train.device") -> torch.device:
    """The device `name` (auto, cpu, cuda, cuda:N) asks for; a refusal names `setting`, where the user gave it (a
    config key, or a command's --device). On the CPU, torch's threads are first set to the cores other programs
    leave idle (use_idle_cores)."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(name)
    except RuntimeError:
        raise BurnoutError(f"{setting}: '{name}' is not a device; use auto, cpu, cuda or cuda:N") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        cpu = f"{setting}=cpu" if "." in setting else f"{setting} cpu"  # a config key, or a flag
        raise BurnoutError(f"{setting}: CUDA was asked for but this machine has none; use {cpu}")
    if device.type == "cpu":
        use_idle_cores()
    return device


_threads_chosen = False


def use_idle_cores() -> None:
    """Once per process, torch's CPU threads set to the cores other programs left idle when it started
    (idle_cores_at_start): every core torch would use on an idle machine, fewer beside busy programs, at
    least one. torch's threads meet at every parallel region, and a spinning thread whose core another program holds
    stalls the others; a step beside busy programs is faster on fewer threads (docs/PERFORMANCE.md, "The
    quickstart"). Threads that wait passively (base/machine.py's spare_busy_cores, or OMP_WAIT_POLICY=passive) keep
    one per core, as does OMP_NUM_THREADS, when set. The weights a step computes came out the same on 1 and 2
    threads, so an exact resume does not depend on the choice."""
    global _threads_chosen
    if _threads_chosen or "OMP_NUM_THREADS" in os.environ or _waits_passively():
        return
    _threads_chosen = True
    idle = idle_cores_at_start()
    if idle is not None:
        torch.set_num_threads(max(1, min(torch.get_num_threads(), round(idle))))


def _waits_passively() -> bool:
    return os.environ.get("OMP_WAIT_POLICY", "").lower() == "passive"


def describe_device(device: torch.device) -> str:
    """What the steps run on: the GPU's name, or the CPU's model and thread count."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{cpu_model()}, {plural(torch.get_num_threads(), 'thread')}"


def cpu_model() -> str:
    """The CPU's model name (Linux: /proc/cpuinfo), for the logs and benchmarks that quote it."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:  # not Linux
        pass
    return platform.processor() or platform.machine() or "CPU"


def cpu_instructions() -> str:
    """The vector instructions PyTorch uses on this CPU and the bf16 ones it has: a CPU's name alone does not set
    its bf16 speed ("AMD EPYC" named both a Zen 4 with AVX-512 BF16, where bf16 beats fp32, and an AVX2 one that
    emulates bf16 far slower; docs/PERFORMANCE.md), and a cache shared between machines must not hand one's choice
    to the other."""
    try:
        flags = set(next(line for line in Path("/proc/cpuinfo").read_text().splitlines()
                         if line.startswith("flags")).split(":", 1)[1].split())
    except (OSError, StopIteration):  # not Linux
        flags = set()
    bf16 = sorted(flags & {"avx512_bf16", "amx_bf16"})
    return " ".join([torch.backends.cpu.get_cpu_capability(), *bf16])


# Compute capability from which a GPU has bf16 tensor cores (Ampere). Below it torch still accepts bf16
# (torch.cuda.is_bf16_supported() counts emulation) but runs it without tensor cores or flash attention.
BF16_CAPABILITY = (8, 0)
# FP8 tensor cores (torch._scaled_mm) begin with Ada (8.9) and Hopper (9.0).
FP8_CAPABILITY = (8, 9)
LOW_PRECISION_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def compute_precision(precision: str) -> str:
    """The precision everything but fp8's linear layers runs in: an fp8 run's attention, norms, loss and
    weight gathers are bf16 autocast, and its MFU and memory are counted as bf16's."""
    return "bf16" if precision == "fp8" else precision


def resolve_precision(name: str, device: torch.device) -> str:
    """The precision `name` (auto, fp32, bf16, fp16, fp8) means on `device`.

    auto: bf16 autocast on GPUs with bf16 tensor cores; fp16 (training adds a grad scaler) on older ones;
    fp32 on CPU until a measurement shows bf16 pays off. bf16 asked for on an older GPU is an error, and
    so is fp8 anywhere but a GPU with fp8 tensor cores (auto never picks fp8).
    """
    if name == "fp8":
        check_fp8(device)
        return name
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


def check_fp8(device: torch.device) -> None:
    """fp8 training needs fp8 tensor cores and torchao (an optional dependency)."""
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"this run's device ({device})"
    if device.type != "cuda" or torch.cuda.get_device_capability(device) < FP8_CAPABILITY:
        raise BurnoutError(f"train.precision=fp8: {where} has no fp8 tensor cores (they begin with compute "
                           "capability 8.9: Ada, Hopper and newer); use train.precision=bf16 or auto")
    try:
        import torchao.float8  # noqa: F401
    except ImportError:
        raise BurnoutError(f"train.precision=fp8 needs torchao: {install_extra('fp8')}") from None


def lowbit_optim():
    """torchao.optim (train.optimizer=adamw8bit), or a one-line error saying how to install it. Importing it also
    adds its quantized state tensors to torch.load's weights_only allowlist, so a state.pt holding them loads."""
    try:
        import torchao.optim
    except ImportError:
        raise BurnoutError(f"train.optimizer=adamw8bit needs torchao: {install_extra('adamw8bit')}") from None
    return torchao.optim


def to_float8_training(model: torch.nn.Module, scaling: str) -> torch.nn.Module:
    """Swap the transformer blocks' linear layers for torchao's Float8Linear (fp8 inputs, weights and output
    gradients, scaled by their absolute max per tensor or per row: `scaling`, train.fp8_recipe). The output head
    stays bf16: its logits feed the loss directly, and a vocabulary such as 32,005 is no multiple of 16, which fp8
    GEMMs need. The state dict is unchanged, so checkpoints load into a plain model."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    def in_blocks(module: torch.nn.Module, name: str) -> bool:
        # The type itself: a LoRA layer (an nn.Linear subclass) would lose its adapters in the swap.
        return (name.startswith("blocks.") and type(module) is torch.nn.Linear
                and module.in_features % 16 == 0 and module.out_features % 16 == 0)

    config = Float8LinearConfig.from_recipe_name(scaling)
    return convert_to_float8_training(model, config=config, module_filter_fn=in_blocks)


def autocast(device: torch.device, precision: str):
    """Autocast to bf16 or fp16 on `device` (bf16 for fp8, whose linear layers cast for themselves);
    nothing for fp32."""
    dtype = LOW_PRECISION_DTYPES.get(compute_precision(precision))
    if dtype is not None:
        return torch.autocast(device_type=device.type, dtype=dtype)
    return contextlib.nullcontext()


def configure_backends(device: torch.device, deterministic: bool = False) -> None:
    """TF32 tensor cores for the fp32 matmuls and convolutions left outside autocast (Ampere and later).

    deterministic (train.deterministic): kernels that give the same bits on every run, so a resumed GPU run
    equals the uninterrupted one bitwise; flash attention's backward then accumulates in a fixed order, and
    an operation with no such kernel is an error that names it."""
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    if deterministic:
        # cuBLAS reads this when its handle is made, at the run's first matmul (after this call).
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
