"""`burnout plan`: predicted hours, dollars and peak memory before a GPU is rented.

time = tokens × FLOPs per token / (peak FLOP/s × MFU × devices), FLOPs per token from
burnout.models.info (6·N for the matmuls plus attention), the peak and price from burnout/configs/hardware.yaml.
The MFU is an assumption the plan states; the run's metrics.jsonl later gives the measured one.

Memory per GPU at the configured micro-batch, line by line (each line says whether it is derived, measured or
assumed): fp32 weights, fp32 gradients and the optimizer's state (parameter counts × bytes); the activations
saved for backward, autocast's weight copies and backward's working memory, measured by tracing the model's
forward and backward on fake tensors (burnout/models/memory.py); under FSDP the sharded part divided by the
GPUs plus the unsharded blocks; and on CUDA an assumed constant and margin for what PyTorch's allocator does
not see. The verdict compares the total with the GPU's memory (`memory_gb` in hardware.yaml, read as GiB).

torchao's 8-bit AdamW states (train.optimizer=adamw8bit) count about 2 bytes per parameter instead of 8
(models/memory.py:adamw8bit_state_bytes). Under FSDP with train.cpu_offload the shards of the weights, gradients
and optimizer state are in CPU memory: the GPU holds the gathered blocks and the activations (the shards'
passing copies to the GPU, a block's at a time, are left to the allocator margin). What does not fit is fixed
by the smallest change set: one setting where one suffices, else checkpointing with AdamW's states in 8 bits,
else FSDP, and FSDP with CPU offload last.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import torch

from burnout.base.files import RUN_CONFIG_FILE
from burnout.base.text import format_count, format_duration
from burnout.config import CONFIG_DIR, RunConfig, load_run_config, model_preset_names
from burnout.core.device import compute_precision
from burnout.data.mix import preset_train_section
from burnout.data.prepare import CHINCHILLA_TOKENS_PER_PARAM
from burnout.errors import BurnoutError
from burnout.models.info import model_info
from burnout.models.memory import FP32, compiled_saved, measure_step, param_counts, static_bytes
from burnout.models.size import activations_floor, addressable, describe, machine_memory, refuse_unless_fits
from burnout.train.hardware import HARDWARE_FILE, Hardware, get_hardware, hardware_table
from burnout.train.schedule import total_steps

GIB = 2**30
# The MFU a plan assumes on a GPU that hardware.yaml records none for: within the 0.3–0.5 that GPU runs reach.
DEFAULT_MFU = 0.4
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
# Outside PyTorch's allocator, so torch.cuda.max_memory_allocated never shows it: the CUDA context with the
# cuBLAS/cuDNN handles and loaded kernels (0.5–1 GiB on recent drivers) and NCCL's buffers. Assumed.
CUDA_CONTEXT_BYTES = GIB
# The caching allocator rounds each block up and leaves gaps between them: an assumed 5 % of the peak.
ALLOCATOR_MARGIN = 0.05
# FSDP2 keeps the root module's parameters (embeddings, head, final norm) gathered through forward and backward,
# and gathers a block's while the next one's all-gather is already in flight: two blocks at once, each with its
# unsharded gradients in backward (burnout/train/distributed.py gathers in the autocast dtype, reduces in fp32).
FSDP_GATHERED_BLOCKS = 2
FSDP_SIZES = (2, 4, 8, 16, 32, 64)  # GPUs tried when FSDP is the fix
# A model trained from scratch on fewer than this share of CHINCHILLA_TOKENS_PER_PARAM (under 2 tokens per parameter)
# is "far below" what its size needs: by Hoffmann et al.'s fitted loss (approach 3), a compute-optimal model reaches
# the loss such a run ends at with 47–76% of its compute (10B down to 10M parameters), so a quarter to a half of the
# spend buys nothing; at 5 tokens per parameter it is 65–92% (docs/USAGE.md, "What a run will spend").
FAR_BELOW_SHARE = 0.1
# What a fix's settings cost in speed, said beside it; "not measured" until a GPU has measured it.
SPEED_COSTS = {
    "train.activation_checkpointing=true": "checkpointing runs each block's forward again in backward, about a "
                                           "third more FLOPs, not measured",
    "train.optimizer=adamw8bit": "8-bit AdamW not measured",
    "train.cpu_offload=true": "CPU offload steps the optimizer on the CPU and sends every block's weights and "
                              "gradients over PCIe each step, not measured",
}
LINES = {  # key: (label, how the figure is known)
    "weights": ("weights, fp32", "derived"),
    "gradients": ("gradients, fp32", "derived"),
    "optimizer": ("optimizer state", "derived"),
    "activations": ("activations kept for backward", "measured"),
    "weight_copies": ("autocast weight copies", "measured"),
    "working": ("working memory at the peak", "measured"),
    "fsdp_unsharded": ("FSDP gathered weights + grads", "derived"),
    "overhead": ("CUDA context + allocator", "assumed"),
}


def plan_config(target: str, overrides: list[str] = ()) -> RunConfig:
    """What `burnout plan TARGET` plans: a run folder's config.yaml, a model preset with the train settings
    `burnout train --model` gives it, or a run config (a built-in name or a YAML file); then `overrides`."""
    path = Path(target)
    if path.is_dir():
        if not (path / RUN_CONFIG_FILE).is_file():
            raise BurnoutError(f"'{target}' is a folder without a {RUN_CONFIG_FILE}, so not a run folder; "
                               f"{_plan_targets()}")
        return load_run_config(path / RUN_CONFIG_FILE, overrides)
    if path.is_file() or (CONFIG_DIR / f"{target}.yaml").is_file():
        return load_run_config(target, overrides, on_note=print)
    if target in model_preset_names():
        return load_run_config({"model": target, "train": preset_train_section()}, overrides)
    raise BurnoutError(f"'{target}' is neither a run config, a model preset nor a run folder; {_plan_targets()}")


def _plan_targets() -> str:
    """What `burnout plan` takes, each kind with its names."""
    configs = sorted(p.stem for p in CONFIG_DIR.glob("*.yaml") if p != HARDWARE_FILE)
    presets = ", ".join(model_preset_names())
    return f"give a run config ({', '.join(configs)}, or a YAML file), a model preset ({presets}) or a run folder"


def planned_mfu(mfu: float | None, hw: Hardware) -> tuple[float, str]:
    """(the MFU a plan runs at, where it comes from): `mfu` when given, else the one hardware.yaml records as measured
    on that GPU, else DEFAULT_MFU (assumed)."""
    if mfu is not None:
        return mfu, "given"
    if hw.mfu is not None:
        return hw.mfu, hw.mfu_note
    return DEFAULT_MFU, "assumed"


def plan_run(cfg: RunConfig, hardware: str, mfu: float | None = None, price_per_hour: float | None = None,
             devices: int = 1, precision: str | None = None) -> dict:
    """Per-phase steps, tokens, FLOPs, hours and dollars (one phase 'run' when the config has none), the run's
    tokens per parameter, and the peak memory per device with its verdict (memory_plan). `mfu`: given, else the one
    hardware.yaml records as measured on that GPU, else DEFAULT_MFU (assumed).

    train.max_epochs is not applied: the plan does not read the data, so it knows no epoch length.
    """
    if mfu is not None and not 0 < mfu <= 1:
        raise BurnoutError(f"--mfu {mfu}: model FLOPs utilization must lie in (0, 1]; 0.3–0.5 is typical for GPUs")
    if devices < 1:
        raise BurnoutError(f"--gpus {devices}: must be at least 1")
    tc = cfg.train
    if precision is None:
        # What `precision: auto` would pick there: fp32 on a CPU; bf16 on a GPU with bf16 tensor cores, else fp16.
        precision = tc.precision if tc.precision != "auto" else auto_precision(hardware)
    hw = get_hardware(hardware, precision, price_per_hour if price_per_hour is not None else tc.budget.price_per_hour)
    mfu, mfu_note = planned_mfu(mfu, hw)
    seq_len = tc.seq_len or cfg.model.context_length
    info = model_info(cfg.model, seq_len=seq_len, precision="bf16" if precision != "fp32" else "fp32")
    fpt = info["flops_per_token"]
    tokens_per_step = tc.batch_size * tc.grad_accum * seq_len * devices
    end = total_steps(dataclasses.replace(tc, max_epochs=None), tokens_per_step, 0)
    phases = [(p.name, p.steps, p.budget) for p in tc.phases if p.steps <= end] or [("run", end, None)]
    rate = hw.peak_flops * mfu * devices  # FLOP/s the run sustains
    rows, previous = [], 0
    for name, steps, budget in phases:
        tokens = (steps - previous) * tokens_per_step
        hours = tokens * fpt / rate / 3600
        dollars = hours * hw.price_per_hour * devices if hw.price_per_hour is not None else None
        rows.append({"phase": name, "from_step": previous, "to_step": steps, "tokens": tokens, "flops": tokens * fpt,
                     "hours": hours, "dollars": dollars, "budget": budget})
        previous = steps
    return {"hardware": hw.key, "hardware_name": hw.name, "precision": precision, "peak_flops": hw.peak_flops,
            "mfu": mfu, "mfu_note": mfu_note, "devices": devices, "price_per_hour": hw.price_per_hour,
            "price_note": hw.price_note, "params": info["params_total"], "flops_per_token": fpt, "seq_len": seq_len,
            "tokens_per_step": tokens_per_step, "tokens_per_s": rate / fpt, "phases": rows,
            "tokens_per_parameter": sum(r["tokens"] for r in rows) / info["params_total"],
            "fine_tune": cfg.fine_tune is not None, "from_scratch": cfg.fine_tune is None and not tc.init_from,
            "memory": memory_plan(cfg, hw.key, precision, devices)}


def auto_precision(hardware: str) -> str:
    """What `precision: auto` picks on `hardware`: fp32 on a CPU; bf16 on a GPU with bf16 tensor cores, else fp16."""
    if hardware == "cpu":
        return "fp32"
    return "bf16" if _has_bf16(hardware) else "fp16"


def _has_bf16(hardware: str) -> bool:
    """Whether a table GPU has bf16 tensor cores (it lists a bf16 peak). An unknown name counts as having
    them; get_hardware then refuses it with the list of names."""
    return "bf16" in hardware_table().get(hardware, {}).get("peak_tflops", {"bf16": None})


def format_plan(plan: dict) -> str:
    """The plan as a person reads it: parameters, tokens and FLOPs in K/M/B, time in seconds to days, dollars to the
    cent (a smaller cost shown as under a cent, never $0.00)."""
    price = plan["price_per_hour"]
    # A given --mfu is the user's assumption, as the default one is; a measured one says where it was measured.
    mfu = (f"assumed MFU {plan['mfu']:.0%}" if plan["mfu_note"] in ("assumed", "given")
           else f"MFU {plan['mfu']:.1%} ({plan['mfu_note']})")
    lines = [
        f"{format_count(plan['params'])} parameters, {format_count(plan['flops_per_token'])} FLOPs/token (train, seq "
        f"{plan['seq_len']}), {plan['tokens_per_step']:,} tokens/step",
        f"{plan['devices']} × {plan['hardware_name']}: peak {plan['peak_flops'] / 1e12:,.1f} TFLOP/s "
        f"({plan['precision']}), {mfu} → {plan['tokens_per_s']:,.0f} tokens/s"
        + (f", ${price:.2f}/device-hour"
           + (f" ({plan['price_note']})" if plan["price_note"] not in ("table", "given") else "")
           if price is not None else ", no price"),
        "",
        f"{'phase':<21}{'steps':>16}{'tokens':>10}{'time':>10}{'dollars':>10}{'budget':>10}",
    ]
    total_h = total_d = 0.0
    for r in plan["phases"]:
        total_h += r["hours"]
        total_d += r["dollars"] or 0.0
        lines.append(f"{r['phase']:<21}{r['from_step']:>7,}→{r['to_step']:>8,}{format_count(r['tokens']):>10}"
                     f"{_time(r['hours']):>10}{_money(r['dollars']):>10}{_money(r['budget']):>10}"
                     + ("  over budget" if r["budget"] is not None and r["dollars"] is not None
                        and r["dollars"] > r["budget"] else ""))
    tokens = sum(r["tokens"] for r in plan["phases"])
    lines.append(f"{'total':<21}{'':>16}{format_count(tokens):>10}"
                 f"{_time(total_h):>10}{_money(total_d if price is not None else None):>10}"
                 f"{_money(sum(r['budget'] or 0 for r in plan['phases']) or None):>10}")
    if not plan["fine_tune"]:  # a fine-tune's base is what the rule is about (budget.spend_lines)
        words, warning = tokens_per_parameter_note(tokens, plan["params"], plan["from_scratch"])
        lines += [f"{format_count(tokens)} tokens for {format_count(plan['params'])} parameters: {words}",
                  *([warning] if warning else [])]
    return "\n".join(lines) + "\n\n" + format_memory(plan["memory"], plan["hardware_name"])


def _time(hours: float) -> str:
    """'40 s', '4 min', '5.2 h', '3.8 days'."""
    seconds = hours * 3600
    if seconds < 59.5:
        return f"{seconds:.0f} s"
    if seconds < 3570:
        return f"{seconds / 60:.0f} min"
    return f"{hours:.1f} h" if hours < 47.95 else f"{hours / 24:.1f} days"


def _money(value: float | None) -> str:
    if value is None:
        return "-"
    return "<$0.01" if 0 < value < 0.005 else f"${value:,.2f}"


def cost_words(seconds: float, price: float | None) -> str:
    """'4m40s', or '120h42m, $175.00' at `price` dollars an hour: what a run's plan says its steps cost."""
    return format_duration(seconds) + (f", {_money(seconds / 3600 * price)}" if price is not None else "")


def tokens_per_parameter_note(tokens: float, params: int, from_scratch: bool = True) -> tuple[str, str | None]:
    """(a run's `tokens` per parameter of its `params` in words, a warning line where a model trained `from_scratch`
    gets far fewer than its size needs: under FAR_BELOW_SHARE of CHINCHILLA_TOKENS_PER_PARAM, else None). A continued
    run is told its ratio alone: its parent's tokens count too, and the plan does not know them."""
    ratio = tokens / params
    words = f"{ratio:.3g} tokens per parameter"
    if not from_scratch:
        return words + " (this run's; its parent trained on its own)", None
    far = FAR_BELOW_SHARE * CHINCHILLA_TOKENS_PER_PARAM
    if ratio >= far:
        return words, None
    return words, (f"warning: {format_count(tokens)} tokens for {format_count(params)} parameters: {ratio:.3g} tokens "
                   f"per parameter, far below the ~{CHINCHILLA_TOKENS_PER_PARAM} at which a model of this size makes "
                   f"the most of its compute (Hoffmann et al. 2022); under {far:g}, the same compute on a smaller "
                   "model trained on more tokens reaches a lower loss (docs/USAGE.md): train longer, or a smaller "
                   "model")


@dataclasses.dataclass(frozen=True)
class Variant:
    compiled: bool
    checkpointing: bool

    @property
    def name(self) -> str:
        return ("compiled" if self.compiled else "eager") + (" + ckpt" if self.checkpointing else "")


VARIANTS = (Variant(False, False), Variant(True, False), Variant(False, True), Variant(True, True))


def memory_target(hardware: str) -> str:
    """What burnout.models.memory traces for: the CPU, or a CUDA GPU with or without flash attention. bf16
    tensor cores and PyTorch's flash kernel both begin with Ampere, so an entry without a bf16 peak predates it."""
    if hardware == "cpu":
        return "cpu"
    return "cuda" if _has_bf16(hardware) else "cuda-pre-ampere"


def predict_memory(cfg: RunConfig, precision: str, target: str, devices: int, batch_size: int,
                   variant: Variant) -> dict[str, int]:
    """Peak bytes per GPU of a training step at micro-batch `batch_size`, line by line (LINES), and the total.

    A compiled run keeps what torch.compile's partitioner saves (models.memory.compiled_saved) with eager's
    working memory, an upper bound for inductor's fused kernels (benchmarks/bench_memory.py; docs/PERFORMANCE.md);
    under activation checkpointing the checkpoint decides what is kept (each block's input), compiled or not, so
    both checkpointed variants are eager's.
    """
    tc = cfg.train
    # fp8 is predicted as bf16: its linear layers keep fp8 casts for backward where bf16 keeps bf16 ones,
    # so this is an upper bound.
    precision = compute_precision(precision)
    seq_len = tc.seq_len or cfg.model.context_length
    counts = param_counts(cfg.model)
    fsdp = devices > 1 and tc.perf.distributed == "fsdp"
    lines = static_memory(cfg, devices)
    step = measure_step(cfg.model, batch_size, seq_len, precision, variant.checkpointing, target)
    acts, copies = step.saved, step.weight_copies
    if variant.compiled and not variant.checkpointing:
        acts, copies = compiled_saved(cfg.model, batch_size, seq_len, precision, target)
    lines.update(activations=acts, weight_copies=copies, working=step.working)
    if fsdp:
        # The gathered weights are already in the autocast dtype: autocast copies nothing, and a block's weights
        # kept for backward are gathered again then. Per gathered parameter: the weight and its gradient in
        # that dtype, and the gradient's fp32 copy for the reduce-scatter when that dtype is not fp32.
        low = DTYPE_BYTES[precision]
        per_param = 2 * low + (FP32 if low != FP32 else 0)
        lines["weight_copies"] = 0
        lines["fsdp_unsharded"] = per_param * (counts.outside_blocks + FSDP_GATHERED_BLOCKS * counts.per_block)
    if target != "cpu":
        lines["overhead"] = CUDA_CONTEXT_BYTES + round(ALLOCATOR_MARGIN * sum(lines.values()))
    return {**lines, "total": sum(lines.values())}


def static_memory(cfg: RunConfig, devices: int) -> dict[str, int]:
    """Weights, gradients and optimizer state per GPU (LINES), divided among the GPUs under FSDP (none on the GPU
    when FSDP offloads them: offloaded_memory): what a step holds at every micro-batch and in every variant."""
    offloaded = offloaded_memory(cfg, devices)
    return {key: 0 if offloaded else n for key, n in _static_per_process(cfg, devices).items()}


def offloaded_memory(cfg: RunConfig, devices: int) -> int:
    """Bytes of CPU memory per process that hold FSDP's offloaded shards (train.cpu_offload); 0 without it."""
    if not (devices > 1 and cfg.train.perf.distributed == "fsdp" and cfg.train.perf.cpu_offload):
        return 0
    return sum(_static_per_process(cfg, devices).values())


def _static_per_process(cfg: RunConfig, devices: int) -> dict[str, int]:
    fsdp = devices > 1 and cfg.train.perf.distributed == "fsdp"
    # DDP keeps a whole replica; its gradient buckets are the gradients (gradient_as_bucket_view=True).
    return {key: -(-n // devices) if fsdp else n
            for key, n in static_bytes(param_counts(cfg.model), cfg.train.optim.optimizer).items()}


def largest_fitting(seqs_per_step: int, start: int, fits: Callable[[int], bool], start_fits: bool) -> int | None:
    """The largest divisor of `seqs_per_step` (sequences per step per GPU, kept through grad_accum as
    --auto-batch does) for which `fits` holds: a binary search above `start` if it fits, below it if not,
    since memory grows with the micro-batch. The divisors come from the number's factors (sympy, which torch
    requires), so a count of any size costs no more than its factoring."""
    import sympy

    divisors = sympy.divisors(seqs_per_step)
    candidates = [d for d in divisors if d > start] if start_fits else [d for d in divisors if d < start]
    best = start if start_fits else None
    lo, hi = 0, len(candidates) - 1
    while lo <= hi:
        mid = (lo + hi) // 2
        if fits(candidates[mid]):
            best, lo = candidates[mid], mid + 1
        else:
            hi = mid - 1
    return best


def largest_fitting_batch(cfg: RunConfig, precision: str, target: str, devices: int, capacity: int,
                          variant: Variant, start_fits: bool) -> int | None:
    """largest_fitting for `variant` on `devices` GPUs of `capacity` bytes each, from the configured micro-batch;
    None without tracing a micro-batch when the static memory alone exceeds the GPU."""
    if not start_fits and sum(static_memory(cfg, devices).values()) > capacity:
        return None
    tc = cfg.train
    return largest_fitting(tc.batch_size * tc.grad_accum, tc.batch_size, lambda b: predict_memory(
        cfg, precision, target, devices, b, variant)["total"] <= capacity, start_fits)


def memory_fixes(cfg: RunConfig, precision: str, target: str, devices: int, capacity: int,
                 largest: int | None) -> list[tuple[str, int]]:
    """Changes that make a plan fit, each with its predicted total: checkpointing, compiling, a smaller
    micro-batch (checkpointed if need be), AdamW's states in 8 bits (checkpointed if need be), FSDP over more GPUs,
    else FSDP with CPU offload."""
    tc = cfg.train
    b, seqs = tc.batch_size, tc.batch_size * tc.grad_accum
    configured = Variant(tc.perf.compile, tc.perf.activation_checkpointing)
    found = []

    def consider(change: str, cfg_: RunConfig, gpus: int, batch: int, variant: Variant) -> bool:
        total = predict_memory(cfg_, precision, target, gpus, batch, variant)["total"]
        if total <= capacity:
            found.append((change, total))
        return total <= capacity

    # No change on these GPUs fits when their static memory alone does not: their traces are skipped.
    same_gpus = sum(static_memory(cfg, devices).values()) <= capacity
    if same_gpus and not tc.perf.activation_checkpointing:
        consider("train.activation_checkpointing=true", cfg, devices, b, Variant(tc.perf.compile, True))
    if same_gpus and not tc.perf.compile:
        consider("train.compile=true", cfg, devices, b, Variant(True, tc.perf.activation_checkpointing))
    if largest is not None:
        consider(f"train.batch_size={largest} train.grad_accum={seqs // largest}", cfg, devices, largest, configured)
    elif not tc.perf.activation_checkpointing:
        _checkpointed_smaller_batch(consider, cfg, precision, target, devices, capacity, "")
    if tc.optim.optimizer == "adamw":  # the same updates from quantized moments; Muon's settings would not carry over
        lowbit = dataclasses.replace(cfg, train=dataclasses.replace(
            tc, optim=dataclasses.replace(tc.optim, optimizer="adamw8bit")))
        if sum(static_memory(lowbit, devices).values()) <= capacity:
            consider("train.optimizer=adamw8bit", lowbit, devices, b, configured)
            if not found and not tc.perf.activation_checkpointing:  # none fits alone: both, a smaller batch if need be
                if not consider("train.activation_checkpointing=true train.optimizer=adamw8bit", lowbit, devices, b,
                                Variant(tc.perf.compile, True)):
                    _checkpointed_smaller_batch(consider, lowbit, precision, target, devices, capacity,
                                                "train.optimizer=adamw8bit ")
    if tc.optim.optimizer == "adamw" and target != "cpu":  # the config refuses Muon and adamw8bit under FSDP
        fsdp = dataclasses.replace(cfg, train=dataclasses.replace(
            tc, perf=dataclasses.replace(tc.perf, distributed="fsdp")))
        more = [n for n in FSDP_SIZES if n > devices or (n == devices and tc.perf.distributed != "fsdp")]
        if not _fewest_gpus(consider, fsdp, more, b, configured, "train.distributed=fsdp") and not tc.perf.cpu_offload:
            offload = dataclasses.replace(fsdp, train=dataclasses.replace(
                fsdp.train, perf=dataclasses.replace(fsdp.train.perf, cpu_offload=True)))
            _fewest_gpus(consider, offload, [n for n in FSDP_SIZES if n >= devices], b, configured,
                         "train.distributed=fsdp train.cpu_offload=true")
    return found


def _checkpointed_smaller_batch(consider: Callable[..., bool], cfg: RunConfig, precision: str, target: str,
                                devices: int, capacity: int, change: str) -> None:
    """Activation checkpointing at the largest micro-batch below the configured one that fits, with `change`
    (settings already made in `cfg`, each followed by a space)."""
    tc = cfg.train
    ckpt = Variant(tc.perf.compile, True)
    smaller = largest_fitting_batch(cfg, precision, target, devices, capacity, ckpt, start_fits=False)
    if smaller is not None:
        consider(f"train.activation_checkpointing=true {change}train.batch_size={smaller} "
                 f"train.grad_accum={tc.batch_size * tc.grad_accum // smaller}", cfg, devices, smaller, ckpt)


def _fewest_gpus(consider: Callable[..., bool], cfg: RunConfig, sizes: list[int], batch: int, variant: Variant,
                 settings: str) -> bool:
    """Whether `cfg` fits on one of `sizes` GPUs; the fewest that fit are the fix."""
    for n in sizes:
        if consider(f"--gpus {n} {settings}", cfg, n, batch, variant):
            return True
    return False


def memory_plan(cfg: RunConfig, hardware: str, precision: str, devices: int) -> dict:
    """The memory table (every variant at the configured micro-batch), the verdict against the GPU's memory,
    the largest micro-batch that fits and, when the plan does not fit, what would make it fit."""
    tc = cfg.train
    target = memory_target(hardware)
    entry = hardware_table().get(hardware, {})
    capacity = round(entry["memory_gb"] * GIB) if "memory_gb" in entry else None
    configured = Variant(tc.perf.compile, tc.perf.activation_checkpointing)
    total = predict_memory(cfg, precision, target, devices, tc.batch_size, configured)["total"]
    fits = largest = None
    fixes: list[tuple[str, int]] = []
    if capacity is not None:  # else the CPU: no fixed budget
        fits = total <= capacity
        largest = largest_fitting_batch(cfg, precision, target, devices, capacity, configured, fits)
        if not fits:
            fixes = memory_fixes(cfg, precision, target, devices, capacity, largest)
            if not fixes:  # refused before the other variants are traced
                raise BurnoutError(_impossible(cfg, hardware, entry, total, capacity))
    variants = {v.name: predict_memory(cfg, precision, target, devices, tc.batch_size, v) for v in VARIANTS}
    return {"target": target, "capacity_bytes": capacity, "micro_batch": tc.batch_size, "grad_accum": tc.grad_accum,
            "seq_len": tc.seq_len or cfg.model.context_length, "precision": precision, "devices": devices,
            "distributed": tc.perf.distributed if devices > 1 else None, "optimizer": tc.optim.optimizer,
            "offloaded_bytes": offloaded_memory(cfg, devices), "configured": configured.name, "variants": variants,
            "fits": fits, "largest_micro_batch": largest, "fixes": fixes}


def _impossible(cfg: RunConfig, hardware: str, entry: dict, total: int, capacity: int) -> str:
    tc = cfg.train
    return (f"train.batch_size: {tc.batch_size} × {tc.seq_len or cfg.model.context_length} tokens needs "
            f"{total / GIB:.1f} GiB per GPU and {hardware} ({entry['name']}) has {capacity / GIB:.0f} GiB; not even "
            f"micro-batch 1 with activation checkpointing fits, nor FSDP over {FSDP_SIZES[-1]} GPUs: choose a GPU "
            "with more memory, a shorter train.seq_len or a smaller model")


def check_fits(cfg: RunConfig, device: torch.device, world_size: int, precision: str,
               memory_bytes: int | None = None, target: str | None = None) -> None:
    """Refuse, before anything is allocated, a CUDA run whose predicted peak exceeds the GPU's memory.

    `memory_bytes` and `target` default to what the device reports (total memory; flash attention from
    compute capability 8.0). Off CUDA there is no fixed budget; train.memory_check=false skips the check.
    """
    tc = cfg.train
    if device.type != "cuda" or not tc.perf.memory_check:
        return
    if memory_bytes is None:
        memory_bytes = torch.cuda.get_device_properties(device).total_memory
    if target is None:
        target = "cuda" if torch.cuda.get_device_capability(device) >= (8, 0) else "cuda-pre-ampere"
    variant = Variant(tc.perf.compile, tc.perf.activation_checkpointing)
    total = predict_memory(cfg, precision, target, world_size, tc.batch_size, variant)["total"]
    if total <= memory_bytes:
        return
    largest = largest_fitting_batch(cfg, precision, target, world_size, memory_bytes, variant, start_fits=False)
    fixes = memory_fixes(cfg, precision, target, world_size, memory_bytes, largest)
    fix = f"try {fixes[0][0]} ({fixes[0][1] / GIB:.1f} GiB)" if fixes else \
        "not even micro-batch 1 with activation checkpointing fits: use a smaller model or a shorter train.seq_len"
    raise BurnoutError(f"predicted peak {total / GIB:.1f} GiB per GPU at micro-batch {tc.batch_size} ({variant.name}) "
                       f"exceeds the GPU's {memory_bytes / GIB:.1f} GiB; {fix}, or set train.memory_check=false "
                       "to start anyway")


def device_memory(device: torch.device) -> tuple[int, str] | None:
    """(bytes, in words) a run on `device` has: a CUDA GPU's memory, as check_fits counts it; else this process's
    share of the machine's (models/size.py: machine_memory)."""
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return props.total_memory, f"the GPU ({props.name}) has {props.total_memory / GIB:.1f} GiB"
    return machine_memory()


def check_memory_floor(cfg: RunConfig, device: torch.device, world_size: int = 1, micro_batch: int | None = None,
                       room: tuple[int, str] | None = None) -> None:
    """Refuse, before data are prepared or a model is built, a run that cannot fit `device` (its memory: `room`) at
    `micro_batch` (default: train.batch_size) even at the least: its weights, gradients and optimizer state per
    process, and the floor of its activations (models/size.py), on every device and whatever the variant.
    train.memory_check=false skips it, as it does check_fits."""
    tc = cfg.train
    if not tc.perf.memory_check:
        return
    room = room or device_memory(device)
    seq_len, batch = tc.seq_len or cfg.model.context_length, micro_batch or tc.batch_size
    addressable(cfg.model, batch, seq_len)
    static = sum(static_memory(cfg, world_size).values())
    if room is None or static + activations_floor(cfg.model, batch, seq_len) <= room[0]:
        return
    fits_one = static + activations_floor(cfg.model, 1, seq_len) <= room[0]
    most = (room[0] - static) // activations_floor(cfg.model, 1, seq_len) if fits_one else 0
    fix = (f"lower train.batch_size to {most:,} or less (raise train.grad_accum to keep the tokens per step)"
           if fits_one else "choose a smaller model or a shorter train.seq_len" if static <= room[0]
           else "choose a smaller model (model.n_layer, model.d_model)")
    refuse_unless_fits(f"a training step at micro-batch {batch:,} × {seq_len:,} tokens ({describe(cfg.model)})",
                       [("weights, gradients and optimizer state", static), ("activations, at least",
                        activations_floor(cfg.model, batch, seq_len))], room,
                       f"{fix}; or set train.memory_check=false to start anyway")


def format_memory(memory: dict, hardware_name: str) -> str:
    """The memory table (GiB per GPU; the configured variant starred), the verdict and what would fit."""
    m, names = memory, list(memory["variants"])
    setup = f"{m['devices']} GPUs, {m['distributed'].upper()}" if m["distributed"] else "1 device"
    setup += " + CPU offload" if m["offloaded_bytes"] else ""
    lines = [f"peak memory per device at micro-batch {m['micro_batch']} × {m['seq_len']} tokens, {m['precision']}"
             f"{'' if m['precision'] == 'fp32' else ' autocast'}, {m['optimizer']}, {setup} (GiB)",
             f"{'':<32}{'':<10}" + "".join(f"{name + ('*' if name == m['configured'] else ''):>16}" for name in names)]
    for key, (label, how) in LINES.items():
        if key in m["variants"][names[0]]:
            lines.append(f"{label:<32}{how:<10}" + "".join(f"{m['variants'][n][key] / GIB:>16.2f}" for n in names))
    lines.append(f"{'total':<42}" + "".join(f"{m['variants'][n]['total'] / GIB:>16.2f}" for n in names))
    lines.append("derived: parameter counts × bytes; measured: the model's forward and backward traced on fake tensors "
                 "(compiled: what torch.compile's partitioner keeps, with eager's working memory); assumed: "
                 f"{CUDA_CONTEXT_BYTES / GIB:g} GiB CUDA context + {ALLOCATOR_MARGIN:.0%} allocator margin")
    if m["offloaded_bytes"]:
        lines.append(f"train.cpu_offload: the weights', gradients' and optimizer state's shards, "
                     f"{m['offloaded_bytes'] / GIB:.2f} GiB per process, are in CPU memory, not counted above")
    total = m["variants"][m["configured"]]["total"]
    if m["capacity_bytes"] is None:
        lines.append(f"{m['configured']}: {total / GIB:.1f} GiB; a CPU has no fixed memory budget to check it against")
        return "\n".join(lines)
    capacity = m["capacity_bytes"]
    verdict = (f"fits, {(capacity - total) / GIB:.1f} GiB ({(capacity - total) / capacity:.0%}) to spare" if m["fits"]
               else f"does not fit, {(total - capacity) / GIB:.1f} GiB over")
    lines.append(f"{m['configured']} (configured): {total / GIB:.1f} of {capacity / GIB:.0f} GiB on the "
                 f"{hardware_name}: {verdict}")
    seqs = m["micro_batch"] * m["grad_accum"]
    largest = m["largest_micro_batch"]
    lines.append(f"largest micro-batch that fits: {largest} × accumulation {seqs // largest} (same tokens per step)"
                 if largest else "largest micro-batch that fits: none at this setting")
    for change, fix_total in m["fixes"]:
        costs = [SPEED_COSTS[setting] for setting in change.split() if setting in SPEED_COSTS]
        lines.append(f"  fits with {change}: {fix_total / GIB:.1f} GiB"
                     + (f" (speed: {'; '.join(costs)})" if costs else ""))
    return "\n".join(lines)
