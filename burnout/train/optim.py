"""The run's optimizers: AdamW alone, AdamW with 8-bit moments (torchao), or Muon for the blocks' matrices
beside AdamW for the rest.

Muon (torch.optim.Muon: momentum, then each update orthogonalized by a Newton–Schulz iteration, here in
the step's matmul precision) is meant for the hidden 2-D weights only; embeddings, the output head, norms
and biases stay on AdamW, as in modded-nanogpt. `Optimizers` steps, zeroes, schedules and checkpoints the
pair as one optimizer.

A LoRA fine-tune that trains the embedding rows of added tokens (models/lora.py, `train_token_rows`) gives
AdamW the whole embedding matrix (and untied head) with every other row's gradient zeroed; it goes in the
group without weight decay, since decay would shrink the frozen rows too. With a zero gradient and no
decay, AdamW's update of a row is exactly zero (its moments stay 0, the step 0 / (0 + eps)), so those
rows stay bitwise the base's.

torchao's AdamW8bit (train.optimizer=adamw8bit) keeps each moment of a tensor of at least 4096 values as
uint8 codes with an fp32 scale per block of 256 (smaller tensors keep fp32 moments), and updates each tensor in
a function it torch.compiles, once per shape: the first step of a run compiles for a while. Its state dict holds
those quantized tensors, which torch.load(weights_only=True) reads once torchao is imported
(core/device.py:lowbit_optim).
"""

from __future__ import annotations

import torch
from torch.optim._muon import _adjust_lr

from burnout.config import TrainConfig
from burnout.core.device import compute_precision, lowbit_optim


class Optimizers:
    """Optimizers over disjoint parameters, used as one: step, zero_grad, state_dict, LR scaling.

    Each param group keeps the peak LR it was built with, so the schedule scales every group (AdamW's
    train.lr, Muon's train.muon_lr) by the same factor; a checkpoint's saved LRs never replace it.
    """

    def __init__(self, *optimizers: torch.optim.Optimizer):
        self.optimizers = optimizers
        self.peak_lrs = [float(group["lr"]) for group in self.param_groups]

    @property
    def param_groups(self) -> list[dict]:
        return [group for opt in self.optimizers for group in opt.param_groups]

    def scale_lr(self, factor: float) -> None:
        """Set every group's LR to `factor` × its peak LR (the schedule's value divided by train.lr)."""
        for group, peak in zip(self.param_groups, self.peak_lrs):
            if isinstance(group["lr"], torch.Tensor):  # torchao's AdamW8bit refuses a float LR
                group["lr"].fill_(peak * factor)
            else:
                group["lr"] = peak * factor

    def unscale(self, scaler: torch.amp.GradScaler) -> None:
        for opt in self.optimizers:
            scaler.unscale_(opt)

    def step(self, scaler: torch.amp.GradScaler | None = None) -> None:
        """One update; through `scaler` under fp16, which may skip it where gradients are not finite."""
        for opt in self.optimizers:
            if scaler is not None:
                scaler.step(opt)
            else:
                opt.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> list[dict]:
        return [opt.state_dict() for opt in self.optimizers]

    def load_state_dict(self, states: list[dict] | dict) -> None:
        # Checkpoints written before the optimizer choice existed hold AdamW's state dict alone.
        states = [states] if isinstance(states, dict) else states
        if len(states) != len(self.optimizers):
            raise ValueError(f"{len(states)} optimizer states for {len(self.optimizers)} optimizers")
        for opt, state in zip(self.optimizers, states):
            opt.load_state_dict(state)


class Muon(torch.optim.Muon):
    """torch.optim.Muon with the Newton–Schulz iteration in `orthogonalize_dtype`. PyTorch's runs it in bf16
    whatever the device, and a CPU without bf16 matrix instructions emulates bf16 matmuls, far slower than fp32
    (docs/PERFORMANCE.md). In bf16 it updates bitwise as torch.optim.Muon does (tests/train/test_optim.py); its
    state dict is the same."""

    def __init__(self, params, orthogonalize_dtype: torch.dtype = torch.bfloat16, **kwargs):
        super().__init__(params, **kwargs)
        self.orthogonalize_dtype = orthogonalize_dtype

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params, grads, buffers = [], [], []
            self._init_group(group, params, grads, buffers)
            for param, grad, buf in zip(params, grads, buffers):
                buf.lerp_(grad, 1 - group["momentum"])
                update = grad.lerp(buf, group["momentum"]) if group["nesterov"] else buf
                update = orthogonalize(update, self.orthogonalize_dtype, group["ns_coefficients"], group["ns_steps"],
                                       group["eps"])
                param.mul_(1 - group["lr"] * group["weight_decay"])
                param.add_(update, alpha=-_adjust_lr(group["lr"], group["adjust_lr_fn"], param.shape))
        return loss


def orthogonalize(matrix: torch.Tensor, dtype: torch.dtype, coefficients: tuple[float, float, float], steps: int,
                  eps: float) -> torch.Tensor:
    """Muon's quintic Newton–Schulz iteration (Keller Jordan's coefficients), in `dtype`: roughly U·Vᵀ of
    `matrix`'s SVD, its singular values pushed into about [0.5, 1.5]. The same operations in the same order
    as torch.optim.Muon's."""
    a, b, c = coefficients
    x = matrix.to(dtype)
    wide = x.size(0) <= x.size(1)
    x = x if wide else x.T  # (rows ≤ columns): the Gram matrix is the smaller one
    x = x.div(x.norm().clamp(min=eps))  # spectral norm ≤ Frobenius norm ≤ 1
    for _ in range(steps):
        gram = x @ x.T
        x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x if wide else x.T


def hidden_matrices(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The 2-D weights inside the transformer blocks (attention and MLP projections): Muon's share. Never the
    embedding or head, so never a matrix whose token rows train (Muon's orthogonalized update moves every row)."""
    inner = getattr(model, "module", model)  # DDP wraps the model; FSDP2 shards it in place
    return [p for p in inner.blocks.parameters() if p.requires_grad and p.dim() == 2]


def _trains_rows(param: torch.Tensor) -> bool:
    """Whether only some rows of `param` train (lora.train_token_rows marks it with their ids)."""
    return bool(getattr(param, "token_rows", ()))


def make_optimizer(model: torch.nn.Module, cfg: TrainConfig, precision: str = "fp32") -> Optimizers:
    """AdamW with weight decay on matrices only (not on norms' gains or biases, nor on a matrix of which only
    some token rows train); under train.optimizer=muon, Muon takes the blocks' matrices and AdamW keeps
    embeddings, head, norms, biases. Muon orthogonalizes in bf16 when the step computes in bf16 (bf16 or fp8, where
    bf16 matmuls are fast: a GPU from Ampere on, a CPU measured so), else in fp32."""
    optim = cfg.optim
    muon_params = hidden_matrices(model) if optim.optimizer == "muon" else []
    on_muon = {id(p) for p in muon_params}
    params = [p for p in model.parameters() if p.requires_grad and id(p) not in on_muon]
    decays = [p.dim() >= 2 and not _trains_rows(p) for p in params]
    groups = [
        {"params": [p for p, decay in zip(params, decays) if decay], "weight_decay": optim.weight_decay},
        {"params": [p for p, decay in zip(params, decays) if not decay], "weight_decay": 0.0},
    ]
    if optim.optimizer == "adamw8bit":
        return Optimizers(lowbit_optim().AdamW8bit(groups, lr=optim.lr, betas=(optim.beta1, optim.beta2)))
    # Fused (one kernel over all tensors) on every device: on the CPU it updates as foreach does
    # (tests/train/test_compile.py) and faster than the per-tensor loop PyTorch picks there by default
    # (docs/PERFORMANCE.md).
    adamw = torch.optim.AdamW(groups, lr=optim.lr, betas=(optim.beta1, optim.beta2), fused=True)
    if not muon_params:
        return Optimizers(adamw)
    orthogonalize_dtype = torch.bfloat16 if compute_precision(precision) == "bf16" else torch.float32
    muon = Muon(muon_params, orthogonalize_dtype=orthogonalize_dtype, lr=optim.muon_lr, momentum=optim.muon_momentum,
                weight_decay=optim.weight_decay)
    return Optimizers(muon, adamw)
