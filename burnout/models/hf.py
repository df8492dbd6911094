"""Hugging Face format: export our models as GPT2LMHeadModel / LlamaForCausalLM folders, and load them back.

An exported folder (`save_hf`) loads with `AutoModelForCausalLM.from_pretrained(folder)` and
`AutoTokenizer.from_pretrained(folder)` without any GPUburnout code, and `load_hf` goes the other way
(`burnout.core.model_files.import_hf` writes the result as a checkpoint): a model trained here joins the tools
everyone uses. Neither needs `transformers` installed: both are plain JSON + safetensors. The names, ours → HF:
`to_hf_state_dict`.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch

from burnout.base.files import EOT_TOKEN, TOKENIZER_FILE, tokenizer_file, write_atomic, write_atomic_with
from burnout.config import ModelConfig
from burnout.errors import BurnoutError
from burnout.models.size import check_weights_fit
from burnout.models.transformer import Transformer, unwrapped

SUPPORTED_MODEL_TYPES = ("gpt2", "llama")
WEIGHTS_NAME = "model.safetensors"
WEIGHTS_INDEX_NAME = "model.safetensors.index.json"

_DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


# ----------------------------------------------------------------------------------------------
# Config


def hf_config_dict(
    cfg: ModelConfig,
    eos_token_id: int | None = None,
    bos_token_id: int | None = None,
    dtype: torch.dtype = torch.float32,
) -> dict[str, Any]:
    """The config.json of the HF model (GPT2LMHeadModel or LlamaForCausalLM) equivalent to `cfg`."""
    cfg = cfg.resolved()
    dtype_name = _DTYPE_NAMES.get(dtype, "float32")
    if cfg.family == "gpt2":
        out: dict[str, Any] = {
            "architectures": ["GPT2LMHeadModel"],
            "model_type": "gpt2",
            "vocab_size": cfg.vocab_size,
            "n_positions": cfg.context_length,
            "n_ctx": cfg.context_length,
            "n_embd": cfg.d_model,
            "n_layer": cfg.n_layer,
            "n_head": cfg.n_head,
            "n_inner": cfg.ffn_hidden,
            "activation_function": "gelu_new",
            "layer_norm_epsilon": cfg.norm_eps,
            "resid_pdrop": 0.0,
            "embd_pdrop": 0.0,
            "attn_pdrop": 0.0,
            "scale_attn_weights": True,
            "scale_attn_by_inverse_layer_idx": False,
            "reorder_and_upcast_attn": False,
            "initializer_range": 0.02,
            "tie_word_embeddings": cfg.tie_embeddings,
            "use_cache": True,
        }
    elif cfg.family == "llama":
        out = {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "vocab_size": cfg.vocab_size,
            "hidden_size": cfg.d_model,
            "intermediate_size": cfg.ffn_hidden,
            "num_hidden_layers": cfg.n_layer,
            "num_attention_heads": cfg.n_head,
            "num_key_value_heads": cfg.n_kv_head,
            "head_dim": cfg.head_dim,
            "max_position_embeddings": cfg.context_length,
            # transformers >= 5 reads `rope_parameters`; 4.x reads the top-level `rope_theta`.
            "rope_theta": cfg.rope_theta,
            "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
            "rope_scaling": None,
            "rms_norm_eps": cfg.norm_eps,
            "hidden_act": "silu",
            "attention_bias": cfg.bias,
            "mlp_bias": cfg.bias,
            "attention_dropout": 0.0,
            "initializer_range": 0.02,
            "tie_word_embeddings": cfg.tie_embeddings,
            "pretraining_tp": 1,
            "use_cache": True,
        }
    else:
        raise BurnoutError(f"model.family: cannot export family '{cfg.family}' to Hugging Face format")
    # transformers >= 5 reads `dtype`; 4.x reads `torch_dtype`.
    out["dtype"] = dtype_name
    out["torch_dtype"] = dtype_name
    out["bos_token_id"] = bos_token_id
    out["eos_token_id"] = eos_token_id
    return out


def model_config_from_hf(hf: dict[str, Any]) -> ModelConfig:
    """Our ModelConfig for an HF config.json dict (gpt2 or llama); BurnoutError if it cannot be represented."""
    model_type = hf.get("model_type")
    if model_type == "gpt2":
        act = hf.get("activation_function", "gelu_new")
        if act not in ("gelu_new", "gelu_pytorch_tanh", "gelu_fast"):
            raise BurnoutError(f"HF gpt2 config: activation_function '{act}' is not supported; "
                               f"only tanh-GELU (gelu_new)")
        if hf.get("scale_attn_by_inverse_layer_idx", False) or not hf.get("scale_attn_weights", True):
            raise BurnoutError("HF gpt2 config: non-standard attention scaling is not supported")
        if hf.get("add_cross_attention", False):
            raise BurnoutError("HF gpt2 config: cross-attention is not supported")
        d_model = _get(hf, "n_embd", "hidden_size")
        cfg = ModelConfig(
            family="gpt2",
            vocab_size=_get(hf, "vocab_size"),
            n_layer=_get(hf, "n_layer", "num_hidden_layers"),
            d_model=d_model,
            n_head=_get(hf, "n_head", "num_attention_heads"),
            ffn_hidden=hf.get("n_inner") or 4 * d_model,
            context_length=_get(hf, "n_positions", "n_ctx", "max_position_embeddings"),
            norm_eps=float(hf.get("layer_norm_epsilon", 1e-5)),
            bias=True,  # HF's GPT-2 always has biases
            tie_embeddings=bool(hf.get("tie_word_embeddings", True)),
            dropout=0.0,
        )
    elif model_type == "llama":
        act = hf.get("hidden_act", "silu")
        if act not in ("silu", "swish"):
            raise BurnoutError(f"HF llama config: hidden_act '{act}' is not supported; only silu (SwiGLU)")
        rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type != "default":
            raise BurnoutError(f"HF llama config: rope_type '{rope_type}' is not supported; only default RoPE")
        theta = rope.get("rope_theta", hf.get("rope_theta", 10000.0))
        d_model = _get(hf, "hidden_size")
        n_head = _get(hf, "num_attention_heads")
        head_dim = hf.get("head_dim") or d_model // n_head
        if head_dim * n_head != d_model:
            raise BurnoutError(
                f"HF llama config: head_dim={head_dim} × num_attention_heads={n_head} != hidden_size={d_model}; "
                "only head_dim = hidden_size / num_attention_heads is supported"
            )
        cfg = ModelConfig(
            family="llama",
            vocab_size=_get(hf, "vocab_size"),
            n_layer=_get(hf, "num_hidden_layers"),
            d_model=d_model,
            n_head=n_head,
            n_kv_head=hf.get("num_key_value_heads") or n_head,
            ffn_hidden=_get(hf, "intermediate_size"),
            context_length=_get(hf, "max_position_embeddings"),
            rope_theta=float(theta),
            norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            # Ours has one switch; a missing half (attention or MLP biases) is filled with zeros on load.
            bias=bool(hf.get("attention_bias", False) or hf.get("mlp_bias", False)),
            tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
            dropout=0.0,
        )
    else:
        raise BurnoutError(
            f"HF model_type '{model_type}' is not supported; GPUburnout loads {' and '.join(SUPPORTED_MODEL_TYPES)}"
        )
    return cfg.resolved()


def _get(hf: dict[str, Any], *keys: str) -> Any:
    for key in keys:
        if hf.get(key) is not None:
            return hf[key]
    raise BurnoutError(f"HF config.json: missing '{keys[0]}'")


# ----------------------------------------------------------------------------------------------
# Weights


def _layer_pairs(cfg: ModelConfig, i: int) -> list[tuple[str, str, bool]]:
    """(our name, HF name, transpose) for the one-to-one tensors of layer i (biases included)."""
    if cfg.family == "gpt2":
        ours, hf = f"blocks.{i}.", f"transformer.h.{i}."
        pairs = [
            ("norm_attn.weight", "ln_1.weight", False),
            ("norm_attn.bias", "ln_1.bias", False),
            ("attn.qkv.weight", "attn.c_attn.weight", True),
            ("attn.qkv.bias", "attn.c_attn.bias", False),
            ("attn.proj.weight", "attn.c_proj.weight", True),
            ("attn.proj.bias", "attn.c_proj.bias", False),
            ("norm_mlp.weight", "ln_2.weight", False),
            ("norm_mlp.bias", "ln_2.bias", False),
            ("mlp.fc.weight", "mlp.c_fc.weight", True),
            ("mlp.fc.bias", "mlp.c_fc.bias", False),
            ("mlp.proj.weight", "mlp.c_proj.weight", True),
            ("mlp.proj.bias", "mlp.c_proj.bias", False),
        ]
    else:
        ours, hf = f"blocks.{i}.", f"model.layers.{i}."
        pairs = [
            ("norm_attn.weight", "input_layernorm.weight", False),
            ("attn.proj.weight", "self_attn.o_proj.weight", False),
            ("attn.proj.bias", "self_attn.o_proj.bias", False),
            ("norm_mlp.weight", "post_attention_layernorm.weight", False),
            ("mlp.gate.weight", "mlp.gate_proj.weight", False),
            ("mlp.gate.bias", "mlp.gate_proj.bias", False),
            ("mlp.up.weight", "mlp.up_proj.weight", False),
            ("mlp.up.bias", "mlp.up_proj.bias", False),
            ("mlp.down.weight", "mlp.down_proj.weight", False),
            ("mlp.down.bias", "mlp.down_proj.bias", False),
        ]
    return [(ours + a, hf + b, t) for a, b, t in pairs]


def _global_pairs(cfg: ModelConfig) -> list[tuple[str, str]]:
    if cfg.family == "gpt2":
        return [
            ("tok_emb.weight", "transformer.wte.weight"),
            ("pos_emb.weight", "transformer.wpe.weight"),
            ("norm.weight", "transformer.ln_f.weight"),
            ("norm.bias", "transformer.ln_f.bias"),
        ]
    return [("tok_emb.weight", "model.embed_tokens.weight"), ("norm.weight", "model.norm.weight")]


def to_hf_state_dict(model: Transformer) -> dict[str, torch.Tensor]:
    """Our weights under HF names and layouts: fresh, contiguous tensors ready for safetensors. Per layer i:

        gpt2                                            llama
        tok_emb.weight      transformer.wte.weight      model.embed_tokens.weight
        pos_emb.weight      transformer.wpe.weight      (RoPE, no weights)
        blocks.i.norm_attn  transformer.h.i.ln_1        model.layers.i.input_layernorm
        blocks.i.attn.qkv   transformer.h.i.attn.c_attn model.layers.i.self_attn.{q,k,v}_proj (split)
        blocks.i.attn.proj  transformer.h.i.attn.c_proj model.layers.i.self_attn.o_proj
        blocks.i.norm_mlp   transformer.h.i.ln_2        model.layers.i.post_attention_layernorm
        blocks.i.mlp.fc     transformer.h.i.mlp.c_fc    -
        blocks.i.mlp.proj   transformer.h.i.mlp.c_proj  -
        blocks.i.mlp.gate   -                           model.layers.i.mlp.gate_proj
        blocks.i.mlp.up     -                           model.layers.i.mlp.up_proj
        blocks.i.mlp.down   -                           model.layers.i.mlp.down_proj
        norm                transformer.ln_f            model.norm
        lm_head.weight      lm_head.weight              lm_head.weight

    GPT-2 stores its linear layers as Conv1D, whose weights are (in, out): the transpose of ours. HF's GPT-2
    always has biases, so a gpt2 model trained with bias=False exports zero biases (same logits) and imports back
    with bias=True. Our RoPE already uses HF's rotate-half layout, so LLaMA's q/k need no permutation. Tied
    embeddings: lm_head.weight is left out of the file and HF ties it on load.
    """
    model = unwrapped(model)
    cfg = model.cfg
    ours = {k: v.detach() for k, v in model.state_dict().items()}
    out: dict[str, torch.Tensor] = {}

    def put(hf_name: str, tensor: torch.Tensor) -> None:
        out[hf_name] = tensor.detach().cpu().contiguous().clone()

    def zeros_like_bias(n: int, ref: torch.Tensor) -> torch.Tensor:
        return torch.zeros(n, dtype=ref.dtype)

    for our_name, hf_name in _global_pairs(cfg):
        if our_name in ours:
            put(hf_name, ours[our_name])
        elif our_name.endswith(".bias"):  # gpt2 LayerNorm without bias: HF's has one, zero is equivalent
            put(hf_name, zeros_like_bias(cfg.d_model, ours["tok_emb.weight"]))
    for i in range(cfg.n_layer):
        for our_name, hf_name, transpose in _layer_pairs(cfg, i):
            if our_name in ours:
                t = ours[our_name]
                put(hf_name, t.t() if transpose else t)
            elif cfg.family == "gpt2":
                # HF's GPT-2 always has biases; the bias of a layer has the size of its output.
                weight = ours[our_name[: -len("bias")] + "weight"]
                n = weight.shape[0] if weight.dim() == 2 else weight.shape[-1]
                put(hf_name, zeros_like_bias(n, weight))
        H, K, D = cfg.n_head, cfg.n_kv_head, cfg.head_dim
        qkv_w = ours[f"blocks.{i}.attn.qkv.weight"]
        if cfg.family == "llama":
            prefix = f"model.layers.{i}.self_attn."
            for name, part in zip(("q_proj", "k_proj", "v_proj"), qkv_w.split([H * D, K * D, K * D], dim=0)):
                put(prefix + name + ".weight", part)
            qkv_b = ours.get(f"blocks.{i}.attn.qkv.bias")
            if qkv_b is not None:
                for name, part in zip(("q_proj", "k_proj", "v_proj"), qkv_b.split([H * D, K * D, K * D])):
                    put(prefix + name + ".bias", part)
    if not cfg.tie_embeddings:
        put("lm_head.weight", ours["lm_head.weight"])
    return out


def from_hf_state_dict(cfg: ModelConfig, sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """HF-named weights → our names and layouts, for `Transformer(cfg).load_state_dict`.

    Raises BurnoutError naming the first missing or mis-shaped tensor. Biases our model has but the
    checkpoint lacks (e.g. a llama with attention_bias but no mlp_bias) are filled with zeros.
    """
    cfg = cfg.resolved()
    expected = _our_shapes(cfg)
    if cfg.family == "gpt2" and "transformer.wte.weight" not in sd and "wte.weight" in sd:
        # Checkpoints saved from a bare GPT2Model (e.g. the original openai-community/gpt2) lack the prefix.
        sd = {(k if k == "lm_head.weight" else "transformer." + k): v for k, v in sd.items()}
    out: dict[str, torch.Tensor] = {}

    def take(hf_name: str, our_name: str, transpose: bool = False) -> None:
        if our_name not in expected:
            return  # e.g. a bias the HF checkpoint has but our bias=False model does not
        if hf_name not in sd:
            if our_name.endswith(".bias"):
                out[our_name] = torch.zeros(expected[our_name])
                return
            raise BurnoutError(f"HF checkpoint: missing tensor '{hf_name}'")
        t = sd[hf_name]
        t = t.t() if transpose else t
        if tuple(t.shape) != tuple(expected[our_name]):
            raise BurnoutError(
                f"HF checkpoint: tensor '{hf_name}' has shape {tuple(sd[hf_name].shape)}, "
                f"expected {tuple(expected[our_name]) if not transpose else tuple(expected[our_name])[::-1]}"
            )
        out[our_name] = t.contiguous()

    for our_name, hf_name in _global_pairs(cfg):
        take(hf_name, our_name)
    for i in range(cfg.n_layer):
        for our_name, hf_name, transpose in _layer_pairs(cfg, i):
            take(hf_name, our_name, transpose)
        if cfg.family == "gpt2":
            continue
        prefix = f"model.layers.{i}.self_attn."
        H, K, D = cfg.n_head, cfg.n_kv_head, cfg.head_dim
        for kind, sizes in (("weight", (H * D, K * D, K * D)), ("bias", (H * D, K * D, K * D))):
            our_name = f"blocks.{i}.attn.qkv.{kind}"
            if our_name not in expected:
                continue
            parts = []
            for proj, size in zip(("q_proj", "k_proj", "v_proj"), sizes):
                name = f"{prefix}{proj}.{kind}"
                if name not in sd:
                    if kind == "bias":
                        parts.append(torch.zeros(size))
                        continue
                    raise BurnoutError(f"HF checkpoint: missing tensor '{name}'")
                want = (size, cfg.d_model) if kind == "weight" else (size,)
                if tuple(sd[name].shape) != want:
                    raise BurnoutError(f"HF checkpoint: tensor '{name}' has shape {tuple(sd[name].shape)}, "
                                       f"expected {want}")
                parts.append(sd[name])
            dtype = sd[f"{prefix}q_proj.weight"].dtype
            out[our_name] = torch.cat([p.to(dtype) for p in parts], dim=0)
    if cfg.tie_embeddings:
        out["lm_head.weight"] = out["tok_emb.weight"]
    else:
        take("lm_head.weight", "lm_head.weight")
    return out


def _our_shapes(cfg: ModelConfig) -> dict[str, torch.Size]:
    with torch.device("meta"):
        model = Transformer(cfg)
    return {k: v.shape for k, v in model.state_dict().items()}


# ----------------------------------------------------------------------------------------------
# Folders


def save_hf(
    model: Transformer,
    out_dir: str | Path,
    tokenizer_path: str | Path | None = None,
    eos_token_id: int | None = None,
    bos_token_id: int | None = None,
    chat_template: str | None = None,
    chat_tokens: tuple[str, str] | None = None,
) -> Path:
    """Write `model` as a Hugging Face folder: config.json, model.safetensors and, when a tokenizer is given,
    tokenizer.json + tokenizer_config.json + special_tokens_map.json.

    `tokenizer_path` is a tokenizer.json or a folder holding one. When the tokenizer has
    `<|endoftext|>` it becomes the eos token (and eos_token_id, unless one is given).

    A chat model gives its Jinja `chat_template` (written into tokenizer_config.json, for
    `apply_chat_template`) and `chat_tokens`, the special tokens that open and end a turn (ChatML's
    <|im_start|>, <|im_end|>; the tokenizer must hold both): the end of turn becomes the tokenizer's eos
    token and the first of generation_config.json's eos_token_id list, so `generate` stops there.
    """
    from safetensors.torch import save_file

    model = unwrapped(model)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    special: dict[str, str] = {}
    tokenizer_src = None
    if tokenizer_path is not None:
        tokenizer_src = tokenizer_file(tokenizer_path)
        try:
            tok_json = json.loads(tokenizer_src.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise BurnoutError(f"tokenizer file '{tokenizer_src}' is not valid JSON ({exc})") from None
        added = {t.get("content"): t.get("id") for t in tok_json.get("added_tokens", []) or []}
        if EOT_TOKEN in added:
            special = {"eos_token": EOT_TOKEN, "bos_token": EOT_TOKEN}
            if eos_token_id is None:
                eos_token_id = added[EOT_TOKEN]
            if bos_token_id is None:
                bos_token_id = added[EOT_TOKEN]
        if chat_tokens is not None:
            missing = [t for t in chat_tokens if added.get(t) is None]
            if missing:
                raise BurnoutError(f"tokenizer file '{tokenizer_src}' has no {' or '.join(missing)} token; "
                                   "a chat model's tokenizer needs its chat tokens")
            special = {**special, "eos_token": chat_tokens[1], "additional_special_tokens": list(chat_tokens)}
            end_of_turn = added[chat_tokens[1]]
    elif chat_tokens is not None:
        raise BurnoutError("a chat model's export needs its tokenizer (tokenizer_path)")

    dtype = model.tok_emb.weight.dtype
    config = hf_config_dict(model.cfg, eos_token_id=eos_token_id, bos_token_id=bos_token_id, dtype=dtype)
    write_atomic_with(out_dir / WEIGHTS_NAME,
                      lambda path: save_file(to_hf_state_dict(model), str(path), metadata={"format": "pt"}))
    _write_json(out_dir / "config.json", config)
    generation = {"_from_model_config": True}
    if bos_token_id is not None:
        generation["bos_token_id"] = bos_token_id
    if eos_token_id is not None:
        generation["eos_token_id"] = eos_token_id
    if chat_tokens is not None:  # a chat model's answer ends at the end of its turn
        generation["eos_token_id"] = [end_of_turn, *([] if eos_token_id in (None, end_of_turn) else [eos_token_id])]
    _write_json(out_dir / "generation_config.json", generation)

    if tokenizer_src is not None:
        shutil.copyfile(tokenizer_src, out_dir / TOKENIZER_FILE)
        _write_json(
            out_dir / "tokenizer_config.json",
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "model_max_length": model.cfg.context_length,
                "clean_up_tokenization_spaces": False,
                **special,
                **({"chat_template": chat_template} if chat_template is not None else {}),
            },
        )
        _write_json(out_dir / "special_tokens_map.json", special)
    return out_dir


def load_hf_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """Every tensor of the HF folder at `path`: model.safetensors, or the shards its index names."""
    from safetensors.torch import load_file

    path = Path(path)
    single, index = path / WEIGHTS_NAME, path / WEIGHTS_INDEX_NAME
    if single.is_file():
        return load_file(str(single))
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        except (OSError, ValueError, KeyError) as exc:
            raise BurnoutError(f"{index}: not a valid safetensors index ({exc})") from None
        sd: dict[str, torch.Tensor] = {}
        for shard in sorted(set(weight_map.values())):
            if not (path / shard).is_file():
                raise BurnoutError(f"{index}: names shard '{shard}', which is missing from {path}")
            sd.update(load_file(str(path / shard)))
        return sd
    raise BurnoutError(
        f"'{path}' holds no {WEIGHTS_NAME} or {WEIGHTS_INDEX_NAME}; save the model with safetensors "
        "(save_pretrained(..., safe_serialization=True))"
    )


def load_hf(path: str | Path, dtype: torch.dtype | None = None) -> Transformer:
    """Our Transformer from a Hugging Face GPT-2 or LLaMA folder (config.json + safetensors weights).

    The model comes back in eval mode on the CPU, in `dtype` (default: the checkpoint's dtype).
    """
    path = Path(path)
    if not path.is_dir():
        raise BurnoutError(f"'{path}' is not a folder; give the folder of a Hugging Face model")
    config_path = path / "config.json"
    if not config_path.is_file():
        raise BurnoutError(f"'{path}' has no config.json; it is not a Hugging Face model folder")
    try:
        hf = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise BurnoutError(f"{config_path}: not valid JSON ({exc})") from None
    cfg = model_config_from_hf(hf)
    check_weights_fit(cfg, str(config_path), "import it on a machine with more memory")
    ours = from_hf_state_dict(cfg, load_hf_state_dict(path))
    model = Transformer(cfg)
    model.to(dtype or ours["tok_emb.weight"].dtype)
    model.load_state_dict(ours, strict=True)
    return model.eval()


def _write_json(path: Path, data: dict[str, Any]) -> None:
    write_atomic(path, json.dumps(data, indent=2, sort_keys=False) + "\n")


# ----------------------------------------------------------------------------------------------
# Linear layers by module (LoRA adapters in PEFT's layout: burnout/models/lora.py)


def hf_linear_modules(cfg: ModelConfig) -> dict[str, list[tuple[str, int]]]:
    """Each linear layer of our blocks ("blocks.3.attn.qkv") → the HF module(s) holding it, each with the
    number of our output rows it takes, in order: one module, or for llama's fused qkv the q_proj, k_proj
    and v_proj its rows split into. GPT-2's modules are Conv1D (weights stored transposed)."""
    cfg = cfg.resolved()
    shapes = _our_shapes(cfg)
    out: dict[str, list[tuple[str, int]]] = {}
    for i in range(cfg.n_layer):
        for our_name, hf_name, _ in _layer_pairs(cfg, i):
            if our_name.endswith(".weight") and ".norm" not in our_name:
                out[our_name[: -len(".weight")]] = [(hf_name[: -len(".weight")], shapes[our_name][0])]
        if cfg.family == "llama":
            H, K, D = cfg.n_head, cfg.n_kv_head, cfg.head_dim
            prefix = f"model.layers.{i}.self_attn."
            out[f"blocks.{i}.attn.qkv"] = [(prefix + "q_proj", H * D), (prefix + "k_proj", K * D),
                                           (prefix + "v_proj", K * D)]
    return out
