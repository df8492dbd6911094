"""`burnout plan`: predicted hours and dollars per phase before a GPU is rented.

time = tokens × FLOPs per token / (peak FLOP/s × MFU × devices), FLOPs per token from
burnout.models.info (6·N for the matmuls plus attention), the peak and price from burnout/configs/hardware.yaml.
The MFU is an assumption the plan states; the run's metrics.jsonl later gives the measured one.
"""

from __future__ import annotations

import dataclasses

from burnout.config import RunConfig
from burnout.errors import BurnoutError
from burnout.models.info import model_info
from burnout.train.hardware import get_hardware
from burnout.train.schedule import total_steps


def plan_run(cfg: RunConfig, hardware: str, mfu: float = 0.4, price_per_hour: float | None = None,
             devices: int = 1, precision: str | None = None) -> dict:
    """Per-phase steps, tokens, FLOPs, hours and dollars (one phase 'run' when the config has none).

    train.max_epochs is not applied: the plan does not read the data, so it knows no epoch length.
    """
    if not 0 < mfu <= 1:
        raise BurnoutError(f"--mfu {mfu}: model FLOPs utilization must lie in (0, 1]; 0.3–0.5 is typical for GPUs")
    if devices < 1:
        raise BurnoutError(f"--gpus {devices}: must be at least 1")
    tc = cfg.train
    if precision is None:
        # What the run would use on this hardware: bf16 on a GPU, fp32 on a CPU unless the config says otherwise.
        precision = tc.precision if tc.precision != "auto" else ("fp32" if hardware == "cpu" else "bf16")
    hw = get_hardware(hardware, precision, price_per_hour if price_per_hour is not None else tc.price_per_hour)
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
            "mfu": mfu, "devices": devices, "price_per_hour": hw.price_per_hour, "price_note": hw.price_note,
            "params": info["params_total"], "flops_per_token": fpt, "seq_len": seq_len,
            "tokens_per_step": tokens_per_step, "tokens_per_s": rate / fpt, "phases": rows}


def format_plan(plan: dict) -> str:
    price = plan["price_per_hour"]
    lines = [
        f"{plan['params'] / 1e9:.2f}B parameters, {plan['flops_per_token'] / 1e9:.2f} GFLOPs/token (train, seq "
        f"{plan['seq_len']}), {plan['tokens_per_step']:,} tokens/step",
        f"{plan['devices']} × {plan['hardware_name']}: peak {plan['peak_flops'] / 1e12:,.1f} TFLOP/s "
        f"({plan['precision']}), assumed MFU {plan['mfu']:.0%} → {plan['tokens_per_s']:,.0f} tokens/s"
        + (f", ${price:.2f}/device-hour"
           + (f" ({plan['price_note']})" if plan["price_note"] not in ("table", "given") else "")
           if price is not None else ", no price"),
        "",
        f"{'phase':<21}{'steps':>16}{'tokens':>10}{'hours':>10}{'dollars':>10}{'budget':>10}",
    ]
    total_h = total_d = 0.0
    for r in plan["phases"]:
        total_h += r["hours"]
        total_d += r["dollars"] or 0.0
        lines.append(f"{r['phase']:<21}{r['from_step']:>7,}→{r['to_step']:>8,}{r['tokens'] / 1e9:>9.2f}B"
                     f"{r['hours']:>10.1f}{_money(r['dollars']):>10}{_money(r['budget']):>10}"
                     + ("  over budget" if r["budget"] is not None and r["dollars"] is not None
                        and r["dollars"] > r["budget"] else ""))
    lines.append(f"{'total':<21}{'':>16}{sum(r['tokens'] for r in plan['phases']) / 1e9:>9.2f}B{total_h:>10.1f}"
                 f"{_money(total_d if price is not None else None):>10}"
                 f"{_money(sum(r['budget'] or 0 for r in plan['phases']) or None):>10}")
    return "\n".join(lines)


def _money(value: float | None) -> str:
    return "-" if value is None else f"${value:,.2f}"
