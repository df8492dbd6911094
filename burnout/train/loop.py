"""The training loop: AdamW, warmup + cosine, gradient accumulation and clipping, periodic
validation, samples and atomic checkpoints, with every logged step appended to metrics.jsonl.
"""

from __future__ import annotations

import json
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import yaml
from tqdm import tqdm

from burnout.config import RunConfig, TrainConfig
from burnout.data.loader import TokenLoader, check_compatible
from burnout.data.prepare import read_meta
from burnout.data.tokenizer import load_tokenizer
from burnout.errors import BurnoutError
from burnout.eval.loss import evaluate_loss
from burnout.generate.sampling import generate_text
from burnout.models import Transformer
from burnout.train.checkpoint import list_checkpoints, load_checkpoint, save_checkpoint
from burnout.train.device import autocast, resolve_device, resolve_precision
from burnout.train.metrics import MetricsLog
from burnout.train.schedule import lr_at


@dataclass
class TrainResult:
    run_dir: Path
    checkpoint: Path
    step: int
    tokens: int
    train_loss: float
    val_loss: float
    elapsed_s: float
    tokens_per_s: float


def make_optimizer(model: Transformer, cfg: TrainConfig, device: torch.device) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only (not on norms' gains or biases)."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), fused=device.type == "cuda")


def accumulate_gradients(model, loader: TokenLoader, step: int, grad_accum: int, device: torch.device,
                         precision: str) -> torch.Tensor:
    """Forward and backward over one optimizer step's micro-batches; returns the step's mean loss."""
    loss_sum = torch.zeros((), device=device)
    for micro in range(grad_accum):
        # The batch is a pure function of the global micro-step, so a resumed run sees the same data.
        x, y = loader.get_batch(step * grad_accum + micro)
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        with autocast(device, precision):
            loss = model(x, y) / grad_accum
        loss.backward()
        loss_sum += loss.detach()
    return loss_sum


def measure_step_seconds(cfg: RunConfig, data_dir: Path, steps: int = 3) -> float:
    """Median wall time of a training step for this config, after one warm-up step (weights discarded)."""
    tc = cfg.train
    device = resolve_device(tc.device)
    precision = resolve_precision(tc.precision, device)
    loader = TokenLoader(data_dir, "train", tc.batch_size, tc.seq_len or cfg.model.context_length, tc.seed)
    model = Transformer(cfg.model).to(device)
    optimizer = make_optimizer(model, tc, device)
    times = []
    for step in range(steps + 1):
        t0 = time.perf_counter()
        accumulate_gradients(model, loader, step, tc.grad_accum, device, precision).item()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
    return sorted(times[1:])[len(times[1:]) // 2]


def train(
    cfg: RunConfig,
    run_dir: Path,
    data_dir: Path,
    resume: bool = False,
    progress: bool | None = None,
    on_event: Callable[[str], None] | None = None,
) -> TrainResult:
    """Train `cfg.model` on the prepared tokens in `data_dir`, writing everything to `run_dir`.

    `on_event` receives human-readable lines (evaluations, samples, checkpoints) as they happen.
    """
    run_dir, data_dir = Path(run_dir), Path(data_dir)
    tc = cfg.train
    if not resume and (list_checkpoints(run_dir) or (run_dir / "metrics.jsonl").exists()):
        raise BurnoutError(
            f"run folder {run_dir} already holds a run; resume it with --resume or choose a new --out"
        )
    if resume and not list_checkpoints(run_dir):
        raise BurnoutError(f"nothing to resume in {run_dir}: it holds no checkpoint")
    run_dir.mkdir(parents=True, exist_ok=True)
    device = resolve_device(tc.device)
    precision = resolve_precision(tc.precision, device)
    seq_len = tc.seq_len or cfg.model.context_length
    meta = read_meta(data_dir)
    check_compatible(meta, cfg.model.vocab_size)
    loaders = {
        split: TokenLoader(data_dir, split, tc.batch_size, seq_len, tc.seed) for split in ("train", "val")
    }
    tokenizer_path = data_dir / "tokenizer.json"
    tokenizer = load_tokenizer(tokenizer_path)
    emit = on_event or (lambda line: None)

    random.seed(tc.seed)
    torch.manual_seed(tc.seed)
    model = Transformer(cfg.model).to(device)
    optimizer = make_optimizer(model, tc, device)
    metrics = MetricsLog(run_dir)
    step, elapsed_before = 0, 0.0
    if resume:
        ckpt = load_checkpoint(list_checkpoints(run_dir)[-1], device)
        if ckpt.config.model != cfg.model:
            raise BurnoutError(f"--resume: the model in {ckpt.path} differs from this config's model section")
        model.load_state_dict(ckpt.model.state_dict())
        optimizer.load_state_dict(ckpt.state["optimizer"])
        step, elapsed_before = ckpt.state["step"], ckpt.state["elapsed_s"]
        random.setstate(ckpt.state["python_rng"])
        torch.set_rng_state(ckpt.state["torch_rng"])
        if device.type == "cuda" and "cuda_rng" in ckpt.state:
            torch.cuda.set_rng_state(ckpt.state["cuda_rng"], device)
        metrics.truncate_after(step)
        emit(f"resumed from {ckpt.path} at step {step}")
    (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
    step_model = torch.compile(model) if tc.compile else model

    tokens_per_step = tc.batch_size * tc.grad_accum * seq_len
    show_bar = sys.stderr.isatty() if progress is None else progress
    bar = tqdm(total=tc.max_steps, initial=step, disable=not show_bar, unit="step", dynamic_ncols=True)
    emit_line = bar.write if show_bar else emit

    def checkpoint(train_loss: float, val_loss: float) -> Path:
        state = {
            "optimizer": optimizer.state_dict(),
            "step": step,
            "tokens": step * tokens_per_step,
            "elapsed_s": elapsed,
            "python_rng": random.getstate(),
            "torch_rng": torch.get_rng_state(),
        }
        if device.type == "cuda":
            state["cuda_rng"] = torch.cuda.get_rng_state(device)
        info = {"step": step, "tokens": step * tokens_per_step, "train_loss": train_loss, "val_loss": val_loss,
                "elapsed_s": elapsed}
        path = save_checkpoint(run_dir, cfg, model, state, info, tokenizer_path, tc.keep_last)
        emit_line(f"step {step}: saved {path}")
        return path

    model.train()
    train_time, train_tokens = 0.0, 0  # since the last log line, for tokens/s
    loss_value = val_loss = float("nan")
    ckpt_path = None
    t_start = time.perf_counter()
    elapsed = elapsed_before
    while step < tc.max_steps:
        t0 = time.perf_counter()
        lr = lr_at(step, tc)
        for group in optimizer.param_groups:
            group["lr"] = lr
        loss_sum = accumulate_gradients(step_model, loaders["train"], step, tc.grad_accum, device, precision)
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), tc.grad_clip or float("inf"))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        step_time = time.perf_counter() - t0
        train_time += step_time
        train_tokens += tokens_per_step
        elapsed = elapsed_before + time.perf_counter() - t_start
        bar.update(1)

        is_last = step == tc.max_steps
        if step % tc.log_interval == 0 or is_last:
            loss_value = loss_sum.item()
            record = {"step": step, "tokens": step * tokens_per_step, "train_loss": loss_value, "lr": lr,
                      "grad_norm": grad_norm.item(), "tokens_per_s": train_tokens / train_time,
                      "elapsed_s": round(elapsed, 3)}
            train_time, train_tokens = 0.0, 0
            if step % tc.eval_interval == 0 or is_last:
                val_loss = evaluate_loss(model, loaders["val"], tc.eval_batches, device, precision)
                record["val_loss"] = val_loss
                if tc.sample_prompt and tc.sample_tokens:
                    sample = generate_text(model, tokenizer, tc.sample_prompt, tc.sample_tokens,
                                           temperature=0.8, top_k=50, seed=tc.seed)
                    record["sample"] = sample
                    emit_line(f"step {step} sample: {json.dumps(sample)[:300]}")
            metrics.write(record)
            bar.set_postfix(loss=f"{loss_value:.3f}", tok_s=f"{record['tokens_per_s']:.0f}")
            line = f"step {step}/{tc.max_steps} loss {loss_value:.4f} lr {lr:.2e} {record['tokens_per_s']:.0f} tok/s"
            if "val_loss" in record:
                line += f" val {val_loss:.4f}"
            if not show_bar or "val_loss" in record:
                emit_line(line)
        if step % tc.ckpt_interval == 0 or is_last:
            ckpt_path = checkpoint(loss_value, val_loss)
    bar.close()
    if ckpt_path is None:  # resumed at the end: nothing left to do
        ckpt_path = list_checkpoints(run_dir)[-1]
        info = json.loads((ckpt_path / "info.json").read_text())
        loss_value, val_loss = info["train_loss"], info["val_loss"]
    tokens_per_s = step * tokens_per_step / elapsed if elapsed else 0.0
    return TrainResult(run_dir, ckpt_path, step, step * tokens_per_step, loss_value, val_loss, elapsed, tokens_per_s)
