"""LoRA: low-rank adapters trained beside the frozen weights of our Transformer (Hu et al., 2021).

A targeted linear layer gains a low-rank update that starts at zero (`LoRALinear`), so a fresh adapter leaves the
model's output unchanged and only the adapters (and the fine-tune's added tokens' rows: `train_token_rows`) train.
The base model's state-dict keys stay as they were, so a base checkpoint and `save_hf` read and write it as
before; `save_adapter` writes our own files, and `save_peft_adapter` PEFT's layout for the exported model, so the
adapters load in PEFT itself.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from burnout.base.files import write_atomic
from burnout.errors import BurnoutError
from burnout.models.hf import hf_linear_modules
from burnout.models.transformer import Transformer, unwrapped

ADAPTER_WEIGHTS = "adapter.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
PEFT_WEIGHTS = "adapter_model.safetensors"
PEFT_CONFIG = "adapter_config.json"
ADAPTER_FORMAT = "burnout-lora"

# The linear layers of one block, per family, as "group.leaf" under blocks.{i}.
LAYERS = {
    "gpt2": ("attn.qkv", "attn.proj", "mlp.fc", "mlp.proj"),
    "llama": ("attn.qkv", "attn.proj", "mlp.gate", "mlp.up", "mlp.down"),
}
DEFAULT_TARGETS = ("attn", "mlp")
_ALL_LAYERS = sorted({name for names in LAYERS.values() for name in names})
KNOWN_TARGETS = frozenset({"attn", "mlp", *_ALL_LAYERS, *(name.split(".")[1] for name in _ALL_LAYERS)})
# Hugging Face's names, which people bring from peft configs, and ours for the same layers.
_HF_TARGET_NAMES = {"q_proj": "qkv", "k_proj": "qkv", "v_proj": "qkv", "c_attn": "qkv", "o_proj": "attn.proj",
                    "c_proj": "attn.proj or mlp.proj", "c_fc": "fc", "gate_proj": "gate", "up_proj": "up",
                    "down_proj": "down"}


@dataclass
class LoRAConfig:
    """Rank, scale, dropout and target layers of the adapters; validated on construction (BurnoutError).

    Targets name the blocks' linear layers (LAYERS): by full name, by last part ("qkv", "proj" = both of GPT-2's
    proj layers, "fc", "gate", "up", "down"), or by group ("attn", "mlp": every linear layer in it, the default).
    A target applies to every block; the embeddings and the head get no adapters.
    """

    r: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    targets: tuple[str, ...] = field(default=DEFAULT_TARGETS)

    def __post_init__(self) -> None:
        # A YAML list, or "qkv,up" from a key=value override.
        if isinstance(self.targets, str):
            self.targets = tuple(t.strip() for t in self.targets.split(",") if t.strip())
        elif isinstance(self.targets, (list, tuple)):
            self.targets = tuple(self.targets)
        self.validate()

    @property
    def scaling(self) -> float:
        return self.alpha / self.r

    def validate(self) -> None:
        r, alpha, dropout = self.r, self.alpha, self.dropout
        if isinstance(r, bool) or not isinstance(r, int) or r < 1:
            raise BurnoutError(f"lora.r: must be a positive integer (the adapters' rank), got {r!r}; e.g. lora.r=8")
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha) or alpha <= 0:
            raise BurnoutError(f"lora.alpha: must be a positive number, got {alpha!r}; "
                               f"the usual choice is 2 × r, e.g. lora.alpha={2 * r if isinstance(r, int) else 16}")
        if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0 <= dropout < 1:
            raise BurnoutError(f"lora.dropout: must be in [0, 1), got {dropout!r}; e.g. lora.dropout=0.05")
        if not isinstance(self.targets, tuple) or not self.targets:
            raise BurnoutError(f"lora.targets: got {self.targets!r}; name the layers to adapt, "
                               f"e.g. lora.targets=[qkv, proj] (default: {', '.join(DEFAULT_TARGETS)})")
        for target in self.targets:
            if not isinstance(target, str) or target not in KNOWN_TARGETS:
                raise BurnoutError(f"lora.targets: {_unknown_target(target)}")

    def layers(self, family: str) -> tuple[str, ...]:
        """The block layers ("attn.qkv", …) of a `family` model that the targets name, in block order."""
        layers = LAYERS.get(family)
        if layers is None:
            raise BurnoutError(f"model.family: LoRA supports {' and '.join(LAYERS)}, not '{family}'")
        for target in self.targets:
            if not any(_matches(target, layer) for layer in layers):
                raise BurnoutError(f"lora.targets: '{target}' names no layer of this {family} model; "
                                   f"its layers are {', '.join(layers)}")
        return tuple(layer for layer in layers if any(_matches(t, layer) for t in self.targets))

    def to_dict(self) -> dict[str, Any]:
        return {"r": self.r, "alpha": self.alpha, "dropout": self.dropout, "targets": list(self.targets)}

    @classmethod
    def from_dict(cls, data: Any, where: str = "lora") -> LoRAConfig:
        """From a mapping with keys r, alpha, dropout, targets (any may be left out); `where` prefixes errors."""
        if not isinstance(data, dict):
            raise BurnoutError(f"{where}: expected a mapping with keys r, alpha, dropout, targets; got {data!r}")
        keys = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - keys)
        if unknown:
            raise BurnoutError(f"{where}: unknown key '{unknown[0]}'; the keys are {', '.join(sorted(keys))}")
        try:
            return cls(**data)
        except BurnoutError as exc:
            if where == "lora":
                raise
            raise BurnoutError(f"{where}: {exc}") from None


def _matches(target: str, layer: str) -> bool:
    group, leaf = layer.split(".")
    return target in (layer, group, leaf)


def _unknown_target(target: Any) -> str:
    if isinstance(target, str) and target in _HF_TARGET_NAMES:
        ours = _HF_TARGET_NAMES[target]
        fused = " (q, k and v are one fused layer here, attn.qkv)" if ours == "qkv" else ""
        return f"'{target}' is Hugging Face's name; here use {ours}{fused}"
    return (f"unknown layer {target!r}; choose from attn, mlp, qkv, proj, fc, gate, up, down "
            "(attn.proj / mlp.proj tell GPT-2's two proj layers apart)")


class LoRALinear(nn.Linear):
    """nn.Linear with a low-rank update beside its frozen weight; `weight`/`bias` are the base layer's own
    Parameters (shared, not copied), so state-dict keys and tied storage stay what they were:

        y = x Wᵀ + b + (alpha / r) · dropout(x) Aᵀ Bᵀ        A (r, in), B (out, r)

    with W and b frozen, A drawn kaiming-uniform (as nn.Linear draws its weights, and as peft does) and B zero.
    Dropout acts on the adapter's input only. The adapter adds two parameters beside the base's:

        blocks.{i}.attn.qkv.weight   (out, in)   the base weight, frozen
        blocks.{i}.attn.qkv.bias     (out,)      the base bias when the model has one, frozen
        blocks.{i}.attn.qkv.lora_A   (r, in)     trained
        blocks.{i}.attn.qkv.lora_B   (out, r)    trained
    """

    def __init__(self, base: nn.Linear, r: int, alpha: float, dropout: float = 0.0):
        # NOTE: nn.Module's __init__, not nn.Linear's, which would allocate and initialise a second weight.
        nn.Module.__init__(self)
        self.in_features, self.out_features = base.in_features, base.out_features
        self.register_parameter("weight", base.weight)
        self.register_parameter("bias", base.bias)
        self.r, self.alpha, self.scaling = r, alpha, alpha / r
        kind = {"device": base.weight.device, "dtype": base.weight.dtype}
        self.lora_A = nn.Parameter(torch.empty(r, self.in_features, **kind))  # (r, in)
        self.lora_B = nn.Parameter(torch.zeros(self.out_features, r, **kind))  # (out, r)
        # a=√5 gives U(±1/√in), nn.Linear's own init (and peft's for lora_A): the adapter's hidden r
        # features start at the scale of the layer's inputs, and B = 0 keeps the model's output unchanged.
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))
        self.lora_dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.adapter_enabled = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.linear(x, self.weight, self.bias)  # (..., out)
        if not self.adapter_enabled:
            return out
        # Two thin matmuls through the rank-r bottleneck: the (out, in) product B·A is never formed.
        hidden = F.linear(self.lora_dropout(x), self.lora_A)  # (..., r)
        return out + F.linear(hidden, self.lora_B) * self.scaling

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, r={self.r}, alpha={self.alpha}"


def _unwrap(model: nn.Module) -> Transformer:
    model = unwrapped(model)
    if not isinstance(model, Transformer):
        raise BurnoutError(f"LoRA applies to a GPUburnout Transformer, not a {type(model).__name__}")
    return model


def lora_layers(model: nn.Module) -> dict[str, LoRALinear]:
    """The adapted layers by module name ("blocks.0.attn.qkv"), in model order; empty when none."""
    return {name: m for name, m in _unwrap(model).named_modules() if isinstance(m, LoRALinear)}


def apply_lora(model: nn.Module, cfg: LoRAConfig, row_ids: Iterable[int] = ()) -> Transformer:
    """Wrap the targeted linear layers of `model` in LoRALinear (in place) and freeze every base parameter:
    afterwards only lora_A/lora_B have requires_grad, and the embedding rows of `row_ids` (tokens the
    fine-tune added; see `train_token_rows`). Returns the model; `trainable_counts` counts them."""
    model = _unwrap(model)
    if lora_layers(model):
        raise BurnoutError("the model already has LoRA adapters; merge them (burnout lora merge) before adding more")
    layers = cfg.layers(model.cfg.family)
    model.requires_grad_(False)
    for block in model.blocks:
        for layer in layers:
            group, leaf = layer.split(".")
            parent = getattr(block, group)
            setattr(parent, leaf, LoRALinear(getattr(parent, leaf), cfg.r, cfg.alpha, cfg.dropout))
    model.lora_config = cfg
    row_ids = list(row_ids)
    if row_ids:
        train_token_rows(model, row_ids)
    return model


# ----------------------------------------------------------------------------------------------
# Token rows: the embedding (and untied head) rows of added tokens, trained beside the adapters

ROWS_SUFFIX = ".rows"  # "tok_emb.weight.rows" (k, d) in adapter.safetensors


def _row_matrices(model: Transformer) -> dict[str, nn.Parameter]:
    """tok_emb.weight, and lm_head.weight when the head is untied (a tied head is the same Parameter)."""
    out = {"tok_emb.weight": model.tok_emb.weight}
    if model.lm_head.weight is not model.tok_emb.weight:
        out["lm_head.weight"] = model.lm_head.weight
    return out


def token_rows(model: nn.Module) -> tuple[int, ...]:
    """The token ids whose embedding rows train (sorted), or () when none do."""
    return getattr(_unwrap(model).tok_emb.weight, "token_rows", ())


def train_token_rows(model: nn.Module, ids: Iterable[int]) -> Transformer:
    """Let the rows `ids` of tok_emb.weight (and of an untied lm_head.weight) train, every other row frozen
    (in place): the matrix gets requires_grad, a gradient hook that zeroes the other rows' gradient, and a
    `token_rows` attribute (the sorted ids) by which make_optimizer keeps weight decay off it and
    trainable_counts counts k × d. Returns the model.

    Tokens added to the base for the fine-tune (the chat template's <|im_start|>/<|im_end|>) start at the mean
    embedding (models/resize.py), and a frozen row there is a dead token: its logit h·mean(E) is the mean of the
    other logits, never their maximum, so the model could never emit <|im_end|>. With no weight decay and a zero
    gradient AdamW moves nothing, so every other row stays bitwise the base's. The rows live in the weight itself:
    state-dict keys are unchanged, a checkpoint holds them, and a merge keeps them. PEFT calls this
    trainable_token_indices."""
    model = _unwrap(model)
    vocab = model.tok_emb.num_embeddings
    ids = sorted(set(ids))
    if not ids or any(isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < vocab for i in ids):
        raise BurnoutError(f"token rows {ids}: give the ids of the added tokens, each below the model's {vocab} rows")
    have = token_rows(model)
    if have:
        if have == tuple(ids):
            return model
        raise BurnoutError(f"the model already trains the embedding rows {list(have)}, not {ids}")
    for weight in _row_matrices(model).values():
        weight.requires_grad_(True)
        # NOTE: a hook on the leaf masks each gradient before it is accumulated (both uses of a tied matrix,
        # every micro-batch, before DDP's all-reduce).
        weight._token_rows_hook = weight.register_hook(_RowMask(vocab, ids, weight.device))
        weight.token_rows = tuple(ids)
    return model


class _RowMask:
    """Gradient hook: the gradient with every row but `ids` zeroed (masked_fill: exact zeros, NaN included)."""

    def __init__(self, vocab: int, ids: list[int], device: torch.device):
        frozen = torch.ones(vocab, 1, dtype=torch.bool, device=device)  # (V, 1)
        frozen[ids] = False
        self.frozen = {frozen.device: frozen}  # by device: a model moved after marking gets its own copy once

    def __call__(self, grad: torch.Tensor) -> torch.Tensor:
        frozen = self.frozen.get(grad.device)
        if frozen is None:
            frozen = self.frozen[grad.device] = next(iter(self.frozen.values())).to(grad.device)
        return grad.masked_fill(frozen, 0)


def _release_token_rows(model: Transformer) -> None:
    """Remove the gradient hooks and marks that train_token_rows put on the matrices."""
    for weight in _row_matrices(model).values():
        if hasattr(weight, "token_rows"):
            weight._token_rows_hook.remove()
            del weight._token_rows_hook, weight.token_rows


def token_rows_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The trained rows, "tok_emb.weight.rows" (k, d) and untied "lm_head.weight.rows", detached copies;
    {} when no rows train."""
    model = _unwrap(model)
    ids = list(token_rows(model))
    if not ids:
        return {}
    return {name + ROWS_SUFFIX: weight.detach()[ids].clone() for name, weight in _row_matrices(model).items()}


def load_token_rows(model: nn.Module, ids: list[int], sd: dict[str, torch.Tensor], where: str = "adapter") -> None:
    """Write the rows of `sd` (token_rows_state_dict's names) into the model's matrices at `ids` and let them
    train; the model must have a row for each id and the matrices the file has (tied or untied alike)."""
    model = _unwrap(model)
    matrices = _row_matrices(model)
    want = {name + ROWS_SUFFIX for name in matrices} if ids else set()
    if set(sd) != want:
        name = sorted(set(sd) ^ want)[0]
        what = "is missing" if name in want else "does not fit this model (tied or untied head, or no rows)"
        raise BurnoutError(f"{where}: token rows tensor '{name}' {what}; the adapter was made for another model")
    if not ids:
        return
    if max(ids) >= model.tok_emb.num_embeddings:
        raise BurnoutError(f"{where}: token rows {ids} reach past the model's {model.tok_emb.num_embeddings} rows; "
                           "load it into the base grown for the added tokens")
    for name, weight in matrices.items():
        if tuple(sd[name + ROWS_SUFFIX].shape) != (len(ids), weight.size(1)):
            raise BurnoutError(f"{where}: tensor '{name + ROWS_SUFFIX}' has shape {tuple(sd[name + ROWS_SUFFIX].shape)}"
                               f", not ({len(ids)}, {weight.size(1)}); the adapter was made for another model")
    train_token_rows(model, ids)
    with torch.no_grad():
        for name, weight in matrices.items():
            weight[ids] = sd[name + ROWS_SUFFIX].to(weight.device, weight.dtype)


@dataclass(frozen=True)
class TrainableCounts:
    trainable: int  # parameters that train: the adapters, and k × d for each matrix whose k token rows train
    total: int  # tied weights counted once
    optimized: int  # parameters the optimizer keeps state for: a matrix whose rows train counts whole

    @property
    def share(self) -> float:
        return self.trainable / self.total if self.total else 0.0

    @property
    def optimized_share(self) -> float:
        return self.optimized / self.total if self.total else 0.0


def trainable_counts(model: nn.Module) -> TrainableCounts:
    """What trains of `model` (a LoRA fine-tune: its adapters and token rows) against all its parameters."""
    params = list(_unwrap(model).parameters())  # deduplicated: a tied head is not counted twice
    trained = [p for p in params if p.requires_grad]
    # A matrix whose token rows train: k of its rows change, though the optimizer keeps state for all of them.
    changing = sum(len(p.token_rows) * p.size(1) if hasattr(p, "token_rows") else p.numel() for p in trained)
    return TrainableCounts(changing, sum(p.numel() for p in params), sum(p.numel() for p in trained))


@contextlib.contextmanager
def disable_adapters(model: nn.Module) -> Iterator[None]:
    """Run the base model inside the block: the adapters are skipped (not zeroed), so DPO's reference model
    is the same weights without a second copy. Restored on exit, exceptions included."""
    layers = list(lora_layers(model).values())
    before = [layer.adapter_enabled for layer in layers]
    for layer in layers:
        layer.adapter_enabled = False
    try:
        yield
    finally:
        for layer, enabled in zip(layers, before):
            layer.adapter_enabled = enabled


def _is_adapter_key(name: str) -> bool:
    return name.endswith((".lora_A", ".lora_B"))


def lora_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The adapter tensors alone (*.lora_A, *.lora_B), detached, under the model's own names."""
    return {k: v for k, v in _unwrap(model).state_dict().items() if _is_adapter_key(k)}


def base_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The state dict without the adapters: exactly the keys and tensors of the plain Transformer."""
    return {k: v for k, v in _unwrap(model).state_dict().items() if not _is_adapter_key(k)}


def load_lora_state_dict(model: nn.Module, sd: dict[str, torch.Tensor], where: str = "adapter") -> None:
    """Copy adapter tensors into the model's adapters; every adapter must be given, with its shape."""
    params = {k: p for k, p in _unwrap(model).named_parameters() if _is_adapter_key(k)}
    if not params:
        raise BurnoutError(f"{where}: the model has no LoRA adapters to load into; apply_lora first")
    extra = sorted(set(sd) - set(params))
    missing = sorted(set(params) - set(sd))
    if extra or missing:
        name, what = (extra[0], "is not an adapter of this model") if extra else (missing[0], "is missing")
        raise BurnoutError(f"{where}: tensor '{name}' {what}; the adapter was made for another model or targets")
    for name, param in params.items():
        if tuple(sd[name].shape) != tuple(param.shape):
            raise BurnoutError(f"{where}: tensor '{name}' has shape {tuple(sd[name].shape)}, the model's "
                               f"{tuple(param.shape)}; the adapter was made for another model or rank")
    with torch.no_grad():
        for name, param in params.items():
            param.copy_(sd[name])


def save_adapter(model: nn.Module, out_dir: str | Path) -> Path:
    """Write the adapters and any trained token rows to `out_dir`: adapter.safetensors (the lora_A/lora_B tensors
    under the model's names, and the trained rows as `tok_emb.weight.rows` (k, d), untied also
    `lm_head.weight.rows`), then adapter_config.json (r, alpha, dropout, targets, and the rows' ids as
    `token_rows`; written last)."""
    from safetensors.torch import save

    model = _unwrap(model)
    cfg = _config_of(model)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().cpu().contiguous() for k, v in {**lora_state_dict(model),
                                                               **token_rows_state_dict(model)}.items()}
    write_atomic(out_dir / ADAPTER_WEIGHTS, save(tensors, metadata={"format": "pt"}))
    config = {"format": ADAPTER_FORMAT, **cfg.to_dict(), "family": model.cfg.family,
              "layers": list(cfg.layers(model.cfg.family)), "token_rows": list(token_rows(model))}
    write_atomic(out_dir / ADAPTER_CONFIG, json.dumps(config, indent=2) + "\n")
    return out_dir


def _read_adapter_json(adapter_dir: str | Path) -> tuple[LoRAConfig, list[int]]:
    """(the LoRAConfig, the trained token rows' ids) of an adapter folder written by `save_adapter`."""
    path = Path(adapter_dir) / ADAPTER_CONFIG
    if not path.is_file():
        raise BurnoutError(f"'{adapter_dir}' holds no {ADAPTER_CONFIG}; give a folder written by save_adapter")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise BurnoutError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(data, dict) or data.get("format") != ADAPTER_FORMAT:
        raise BurnoutError(f"{path}: not a GPUburnout adapter (format '{ADAPTER_FORMAT}'); "
                           "a PEFT adapter loads with peft, not here")
    ids = data.get("token_rows", [])  # absent from adapters written before token rows trained
    if not isinstance(ids, list) or any(isinstance(i, bool) or not isinstance(i, int) for i in ids):
        raise BurnoutError(f"{path}: token_rows must be a list of token ids, got {ids!r}")
    cfg = LoRAConfig.from_dict({k: data[k] for k in ("r", "alpha", "dropout", "targets") if k in data}, str(path))
    return cfg, ids


def load_adapter(model: nn.Module, adapter_dir: str | Path) -> Transformer:
    """Load an adapter folder into `model` (in place): adapters are added first when the model has none,
    otherwise the model's must have the folder's rank, alpha and layers; trained token rows are written into
    the embedding (and untied head) of the model, which must be the base grown for those tokens, and train
    from then on. Returns the model."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    model = _unwrap(model)
    cfg, ids = _read_adapter_json(adapter_dir)
    if not lora_layers(model):
        apply_lora(model, cfg)
    else:
        # Alpha too: the same A and B under another scale would be another model. Dropout only acts in
        # training, so the model's own setting stands.
        have, family = _config_of(model), model.cfg.family
        if (have.r, have.alpha, have.layers(family)) != (cfg.r, cfg.alpha, cfg.layers(family)):
            raise BurnoutError(f"'{adapter_dir}': adapter of rank {cfg.r}, alpha {cfg.alpha} on "
                               f"{', '.join(cfg.targets)}, but the model's adapters have rank {have.r}, alpha "
                               f"{have.alpha} on {', '.join(have.targets)}; load it into a model without adapters")
    weights = Path(adapter_dir) / ADAPTER_WEIGHTS
    try:
        sd = load_file(str(weights))
    except (OSError, SafetensorError) as exc:
        raise BurnoutError(f"{weights}: cannot read the adapter weights ({exc})") from None
    rows = {k: sd.pop(k) for k in list(sd) if k.endswith(ROWS_SUFFIX)}
    load_lora_state_dict(model, sd, str(weights))
    load_token_rows(model, ids, rows, str(weights))
    return model


def _config_of(model: Transformer) -> LoRAConfig:
    cfg = getattr(model, "lora_config", None)
    if cfg is None or not lora_layers(model):
        raise BurnoutError("the model has no LoRA adapters; apply_lora (or load_adapter) first")
    return cfg


def merge_lora(model: nn.Module) -> Transformer:
    """Fold each adapter into its base weight, W ← W + (alpha/r)·B·A, and put plain nn.Linear layers back
    (in place). Trained token rows are in the embedding (and head) already and stay; their gradient hook goes.
    Returns the model as a plain Transformer, every parameter trainable as when built."""
    model = _unwrap(model)
    for name, layer in lora_layers(model).items():
        with torch.no_grad():
            # Summed in fp32 whatever the weights' dtype, so a bf16 model rounds once, not per term.
            delta = (layer.lora_B.float() @ layer.lora_A.float()) * layer.scaling  # (out, in)
            layer.weight.copy_((layer.weight.float() + delta).to(layer.weight.dtype))
        # On the meta device: the plain layer allocates nothing before it takes the merged Parameters.
        plain = nn.Linear(layer.in_features, layer.out_features, bias=layer.bias is not None, device="meta")
        plain.weight = layer.weight
        plain.bias = layer.bias
        parent_name, _, leaf = name.rpartition(".")
        setattr(model.get_submodule(parent_name), leaf, plain)
    if hasattr(model, "lora_config"):
        del model.lora_config
    _release_token_rows(model)
    model.requires_grad_(True)
    return model


# The HF modules holding our row matrices (burnout/models/hf.py's names), where peft puts a token adapter.
_HF_ROW_MODULES = {"gpt2": {"tok_emb.weight": "transformer.wte", "lm_head.weight": "lm_head"},
                   "llama": {"tok_emb.weight": "model.embed_tokens", "lm_head.weight": "lm_head"}}


def peft_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The adapters under PEFT's key names for the HF model `save_hf` writes (*.lora_A.weight (r, in),
    *.lora_B.weight (out, r)), fresh contiguous CPU tensors; llama's fused qkv split into q/k/v. Trained token
    rows: *.token_adapter.trainable_tokens_delta (k, d) of the embedding (and untied head), the rows' values."""
    model = _unwrap(model)
    hf_modules = hf_linear_modules(model.cfg)
    out: dict[str, torch.Tensor] = {}
    for name, layer in lora_layers(model).items():
        parts = hf_modules[name]
        A = layer.lora_A.detach().cpu()  # (r, in)
        # Each part reads the same input, so it shares A and takes its own rows of B (and so of B·A).
        B_parts = layer.lora_B.detach().cpu().split([rows for _, rows in parts], dim=0)  # (rows_k, r) each
        for (hf_name, _), B in zip(parts, B_parts):
            # NOTE: GPT-2's Conv1D stores its weight transposed, but PEFT keeps lora_A/lora_B in nn.Linear's
            # (out, in) layout there too (fan_in_fan_out only transposes the merged delta): no transpose.
            out[f"base_model.model.{hf_name}.lora_A.weight"] = A.contiguous().clone()
            out[f"base_model.model.{hf_name}.lora_B.weight"] = B.contiguous().clone()
    ids = list(token_rows(model))
    for name, weight in (_row_matrices(model) if ids else {}).items():
        hf_name = _HF_ROW_MODULES[model.cfg.family][name]
        out[f"base_model.model.{hf_name}.token_adapter.trainable_tokens_delta"] = weight.detach().cpu()[ids].clone()
    return out


def _peft_token_indices(model: Transformer) -> list[int] | dict[str, list[int]] | None:
    """PEFT's trainable_token_indices: the ids (the input embedding, a tied head following it), or untied
    {embedding module: ids, "lm_head": ids}; None when no rows train."""
    ids = list(token_rows(model))
    matrices = _row_matrices(model)
    if not ids or len(matrices) == 1:
        return ids or None
    names = _HF_ROW_MODULES[model.cfg.family]
    return {names[name].rsplit(".", 1)[-1]: ids for name in matrices}


def save_peft_adapter(model: nn.Module, out_dir: str | Path, base_model_name_or_path: str | None = None) -> Path:
    """Write the adapters (and trained token rows) as a PEFT LoRA folder (adapter_config.json +
    adapter_model.safetensors) for the HF model `burnout.models.hf.save_hf` exports from the same base, grown
    for the added tokens: `PeftModel.from_pretrained(hf_model, out_dir)` then gives our adapted model's logits.

    Our fused llama qkv becomes q_proj, k_proj and v_proj sharing lora_A and each taking its rows of lora_B (exact:
    row j of B·A is row j of B times A); the rows become trainable_token_indices with their
    `token_adapter.trainable_tokens_delta` tensors (which, despite the name, hold the rows' values: peft writes them
    over the base's rows). One difference that only training sees: our fused qkv draws one dropout mask for q, k
    and v, PEFT one per projection."""
    from safetensors.torch import save

    model = _unwrap(model)
    cfg = _config_of(model)
    tensors = peft_state_dict(model)
    hf_modules = hf_linear_modules(model.cfg)
    # "model.layers.3.self_attn.q_proj" → "self_attn.q_proj": PEFT matches a target against the end of a
    # module's name, and the group keeps GPT-2's attn.c_proj apart from mlp.c_proj.
    targets = sorted({hf_name.split(".", 3)[3] for name in lora_layers(model) for hf_name, _ in hf_modules[name]})
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model_name_or_path,
        "r": cfg.r,
        "lora_alpha": cfg.alpha,
        "lora_dropout": cfg.dropout,
        "target_modules": targets,
        "fan_in_fan_out": model.cfg.family == "gpt2",  # GPT-2's Conv1D weights are (in, out)
        "bias": "none",
        "use_rslora": False,
        "use_dora": False,
        "init_lora_weights": True,
        "modules_to_save": None,
        "trainable_token_indices": _peft_token_indices(model),
        "inference_mode": True,
    }
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(out_dir / PEFT_WEIGHTS, save(tensors, metadata={"format": "pt"}))
    write_atomic(out_dir / PEFT_CONFIG, json.dumps(config, indent=2) + "\n")
    return out_dir
