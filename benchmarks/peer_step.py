"""The peer of benchmarks/bench_gpu.py: transformers' own model of a preset's shape, trained a step at a time with
the settings our step trains with there, so that ours / peer compares the code, not the recipe.

    python -m benchmarks.peer_step SHAPE BATCH SEQ [--accum 1] [--steps 10] [--eager] [--device cuda|cpu]
                                   [--precision bf16|fp32]

The model is LlamaForCausalLM or GPT2LMHeadModel built from the Hugging Face config that `burnout export` writes
for the preset (burnout/models/hf.py), so its weights have our model's names and shapes; SDPA attention, random
initial weights. A step, as `TrainStep` runs ours: each of --accum micro-batches of random tokens through the model
under autocast (bf16 unless --precision fp32) with the tokens as their own labels, backward, the gradients clipped
at train.grad_clip, one host sync reading the loss and the norm, then fused AdamW at train.lr and betas with weight
decay on the matrices only; the forward compiled with torch.compile unless --eager. Prints one JSON line: tokens/s
at the median of --steps steps after two warm-up steps, ms/step, the first step's seconds (compile included), the
peak memory on a GPU, the parameters, the last loss. `--device cpu --eager --precision fp32` at a tiny preset
checks it anywhere.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from benchmarks.bench_gpu import GIB, run_config
from burnout.config import model_preset_names


def peer_model(shape: str) -> torch.nn.Module:
    """transformers' model of the preset `shape`, in fp32, on the current default device."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from burnout.config import load_model_preset
    from burnout.models.hf import hf_config_dict

    hf = hf_config_dict(load_model_preset(shape))
    config = AutoConfig.for_model(hf.pop("model_type"), **hf)
    return AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=torch.float32)


def peer_optimizer(model: torch.nn.Module, train) -> torch.optim.AdamW:
    """Fused AdamW at the run config's learning rate and betas, weight decay on the matrices only (as ours)."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": train.optim.weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=train.optim.lr, betas=(train.optim.beta1, train.optim.beta2), fused=True)


def peer_step(shape: str, batch: int, seq: int, accum: int, steps: int, compiled: bool, device: torch.device,
              precision: str) -> dict:
    from burnout.core.device import configure_backends

    train = run_config(shape, batch, seq, precision, compiled, device=device.type).train
    configure_backends(device)
    torch.manual_seed(0)
    with device:
        model = peer_model(shape).train()
    optimizer = peer_optimizer(model, train)
    forward = torch.compile(model) if compiled else model
    vocab = model.config.vocab_size
    tokens = torch.randint(0, vocab, (accum, batch, seq), device=device)

    def step() -> float:
        loss_sum = torch.zeros((), device=device)
        for micro in tokens:
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
                loss = forward(input_ids=micro, labels=micro).loss / accum
            loss.backward()
            loss_sum += loss.detach()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), train.optim.grad_clip)
        loss_value, _ = torch.stack([loss_sum, norm.to(loss_sum.dtype)]).tolist()  # one host sync, as ours
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss_value

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    start = time.perf_counter()
    step()
    first = time.perf_counter() - start
    step()
    times, loss = [], float("nan")
    for _ in range(steps):
        start = time.perf_counter()
        loss = step()  # ends in the host sync
        times.append(time.perf_counter() - start)
    median = statistics.median(times)
    return {"who": "peer", "shape": shape, "batch": batch, "seq": seq, "accum": accum, "compiled": compiled,
            "precision": precision, "tokens_per_s": accum * batch * seq / median, "ms_per_step": 1000 * median,
            "first_step_s": first, "params": sum(p.numel() for p in model.parameters()), "loss": loss,
            "peak_gib": torch.cuda.max_memory_allocated(device) / GIB if device.type == "cuda" else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("shape", choices=model_preset_names(), help="a model preset")
    parser.add_argument("batch", type=int)
    parser.add_argument("seq", type=int)
    parser.add_argument("--accum", type=int, default=1, help="micro-batches a step (default 1)")
    parser.add_argument("--steps", type=int, default=10, help="timed steps after two warm-up ones (default 10)")
    parser.add_argument("--eager", action="store_true", help="no torch.compile")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--precision", default="bf16", choices=["bf16", "fp32"])
    args = parser.parse_args()
    for flag, value in (("batch", args.batch), ("seq", args.seq), ("--accum", args.accum), ("--steps", args.steps)):
        if value < 1:
            parser.error(f"{flag} must be at least 1, not {value}")
    print(json.dumps(peer_step(args.shape, args.batch, args.seq, args.accum, args.steps, not args.eager,
                               torch.device(args.device), args.precision)))


if __name__ == "__main__":
    main()
