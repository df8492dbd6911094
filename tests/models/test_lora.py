"""LoRA adapters (burnout/models/lora.py): only adapters train, a merge is exact, adapters round-trip through
their folder, disabling them gives the base model back, and an adapter exported in PEFT's layout gives our
logits in peft + transformers on the exported base model. Token rows (the embedding and untied head rows of
added tokens, trained beside the adapters): only they get a gradient, they count k × d, and they travel
through the adapter folder, a merge and a PEFT export (trainable_token_indices); frozen at the mean
embedding, such a token could never be the argmax.

Tiny random models in fp32 on the CPU; no network.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from burnout.config import ModelConfig
from burnout.errors import BurnoutError
from burnout.models.hf import save_hf
from burnout.models.lora import (
    ADAPTER_CONFIG,
    ADAPTER_WEIGHTS,
    PEFT_CONFIG,
    PEFT_WEIGHTS,
    LoRAConfig,
    LoRALinear,
    apply_lora,
    base_state_dict,
    disable_adapters,
    load_adapter,
    load_lora_state_dict,
    lora_layers,
    lora_state_dict,
    merge_lora,
    save_adapter,
    save_peft_adapter,
    train_token_rows,
    trainable_counts,
)
from burnout.models.transformer import Transformer

VOCAB = 97
CONTEXT = 32

CONFIGS = {
    "gpt2": ModelConfig(family="gpt2", vocab_size=VOCAB, n_layer=2, d_model=48, n_head=3, context_length=CONTEXT,
                        bias=True, tie_embeddings=True),
    "llama-gqa": ModelConfig(family="llama", vocab_size=VOCAB, n_layer=2, d_model=64, n_head=4, n_kv_head=2,
                             ffn_hidden=96, context_length=CONTEXT, tie_embeddings=False),
    "llama-gqa-bias-tied": ModelConfig(family="llama", vocab_size=VOCAB, n_layer=2, d_model=48, n_head=6, n_kv_head=2,
                                       ffn_hidden=80, context_length=CONTEXT, bias=True, tie_embeddings=True),
}
FAMILIES = ["gpt2", "llama-gqa"]


def make_base(name: str, seed: int = 0) -> Transformer:
    """A tiny model with non-trivial norms and biases (initialised ones are 1 and 0, which hide mistakes)."""
    torch.manual_seed(seed)
    model = Transformer(CONFIGS[name])
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if "norm" in pname:
                p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=g))
            elif pname.endswith("bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
    return model.eval()


def make_adapted(name: str, seed: int = 0, **lora) -> Transformer:
    """The base model `make_base(name, seed)` with adapters whose B is random, so they change the logits."""
    model = apply_lora(make_base(name, seed), LoRAConfig(**{"r": 4, "alpha": 8.0, **lora}))
    g = torch.Generator().manual_seed(seed + 2)
    with torch.no_grad():
        for layer in lora_layers(model).values():
            layer.lora_B.copy_(0.2 * torch.randn(layer.lora_B.shape, generator=g))
    return model.eval()


def tokens(seed: int = 0, batch: int = 2, length: int = 12) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("name", FAMILIES)
def test_only_the_adapters_get_gradients(name):
    model = apply_lora(make_base(name), LoRAConfig(r=4, alpha=8))
    model.train()
    x = tokens()
    model(x[:, :-1], targets=x[:, 1:]).backward()
    adapters = {k for k in dict(model.named_parameters()) if k.endswith((".lora_A", ".lora_B"))}
    assert adapters
    for pname, p in model.named_parameters():
        if pname in adapters:
            assert p.requires_grad and p.grad is not None, pname
        else:
            assert not p.requires_grad and p.grad is None, pname
    # B starts at zero, so it is A's gradient that is zero at first and B's that is not.
    assert all(layer.lora_B.grad.abs().sum() > 0 for layer in lora_layers(model).values())
    cfg = model.cfg
    per_block = sum(m.lora_A.numel() + m.lora_B.numel() for m in lora_layers(model).values()) // cfg.n_layer
    ins_outs = {"gpt2": [(48, 144), (48, 48), (48, 192), (192, 48)],
                "llama-gqa": [(64, 128), (64, 64), (64, 96), (64, 96), (96, 64)]}[name]
    assert per_block == sum(4 * (i + o) for i, o in ins_outs)
    counts = trainable_counts(model)
    assert counts.trainable == per_block * cfg.n_layer
    assert counts.total == sum(p.numel() for p in make_base(name).parameters()) + counts.trainable


@pytest.mark.parametrize("name", FAMILIES)
def test_a_fresh_adapter_keeps_the_base_model(name):
    base = make_base(name)
    model = apply_lora(make_base(name), LoRAConfig(r=4, alpha=8))
    x = tokens()
    assert torch.equal(model(x), base(x))  # B = 0
    # The base keys and tensors are untouched: a base checkpoint and save_hf see the same state dict.
    assert base_state_dict(model).keys() == base.state_dict().keys()
    assert all(torch.equal(v, base.state_dict()[k]) for k, v in base_state_dict(model).items())
    for layer in lora_layers(model).values():
        bound = 1 / layer.in_features**0.5  # kaiming-uniform with a=√5, like nn.Linear and peft
        assert layer.lora_A.abs().max() <= bound and layer.lora_A.abs().max() > 0.5 * bound


def test_a_base_checkpoint_loads_into_the_adapted_model():
    model = make_adapted("llama-gqa", seed=0)
    other = make_base("llama-gqa", seed=5)
    result = model.load_state_dict(other.state_dict(), strict=False)
    assert result.unexpected_keys == [] and sorted(result.missing_keys) == sorted(lora_state_dict(model))
    x = tokens()
    with disable_adapters(model):
        assert torch.equal(model(x), other(x))


@pytest.mark.parametrize("name, targets, layers", [
    ("gpt2", ("attn", "mlp"), ["attn.qkv", "attn.proj", "mlp.fc", "mlp.proj"]),
    ("gpt2", ("proj",), ["attn.proj", "mlp.proj"]),
    ("gpt2", ("attn.proj", "fc"), ["attn.proj", "mlp.fc"]),
    ("llama-gqa", ("attn", "mlp"), ["attn.qkv", "attn.proj", "mlp.gate", "mlp.up", "mlp.down"]),
    ("llama-gqa", "qkv,down", ["attn.qkv", "mlp.down"]),
    ("llama-gqa", ["mlp"], ["mlp.gate", "mlp.up", "mlp.down"]),
])
def test_targets_pick_the_layers_of_every_block(name, targets, layers):
    model = apply_lora(make_base(name), LoRAConfig(targets=targets))
    assert list(lora_layers(model)) == [f"blocks.{i}.{layer}" for i in range(2) for layer in layers]
    assert all(type(m) is nn.Linear for n, m in model.named_modules()
               if isinstance(m, nn.Linear) and n not in lora_layers(model))


def test_dropout_acts_on_the_adapter_path_only():
    torch.manual_seed(0)
    layer = LoRALinear(nn.Linear(8, 6), r=3, alpha=6.0, dropout=0.5).train()
    with torch.no_grad():
        layer.lora_B.normal_()
    x = torch.randn(4, 8)
    torch.manual_seed(1)
    y = layer(x)
    torch.manual_seed(1)
    expected = F.linear(x, layer.weight, layer.bias) + F.linear(F.linear(F.dropout(x, 0.5), layer.lora_A),
                                                                layer.lora_B) * 2.0
    torch.testing.assert_close(y, expected, rtol=0, atol=1e-6)


@pytest.mark.parametrize("name", FAMILIES)
def test_merge_folds_the_scaled_update_into_the_base_weights(name):
    model = make_adapted(name, r=4, alpha=12.0)
    before = {n: (m.weight.detach().clone(), m.lora_B.detach().clone(), m.lora_A.detach().clone())
              for n, m in lora_layers(model).items()}
    x = tokens()
    adapted_logits = model(x)
    merged = merge_lora(model)
    modules = dict(merged.named_modules())
    for n, (W, B, A) in before.items():
        assert type(modules[n]) is nn.Linear
        assert torch.equal(modules[n].weight, W + (B @ A) * (12.0 / 4))
    assert not lora_layers(merged) and not hasattr(merged, "lora_config")
    assert merged.state_dict().keys() == Transformer(CONFIGS[name]).state_dict().keys()
    assert all(p.requires_grad for p in merged.parameters())
    torch.testing.assert_close(merged(x), adapted_logits, rtol=0, atol=1e-5)


@pytest.mark.parametrize("name", FAMILIES)
def test_disable_adapters_gives_the_base_model(name):
    base, model = make_base(name), make_adapted(name)
    x = tokens()
    adapted = model(x)
    assert (adapted - base(x)).abs().max() > 1e-2
    with disable_adapters(model):
        assert torch.equal(model(x), base(x))
    assert torch.equal(model(x), adapted)
    with pytest.raises(RuntimeError), disable_adapters(model):
        raise RuntimeError("the reference model's forward failed")
    assert torch.equal(model(x), adapted)


@pytest.mark.parametrize("name", FAMILIES)
def test_adapters_round_trip_through_their_folder(name, tmp_path):
    model = make_adapted(name, r=2, alpha=5.0, dropout=0.1, targets=("qkv", "mlp"))
    save_adapter(model, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([ADAPTER_CONFIG, ADAPTER_WEIGHTS])
    from safetensors.torch import load_file

    assert load_file(str(tmp_path / ADAPTER_WEIGHTS)).keys() == lora_state_dict(model).keys()
    config = json.loads((tmp_path / ADAPTER_CONFIG).read_text())
    assert (config["r"], config["alpha"], config["dropout"], config["targets"]) == (2, 5.0, 0.1, ["qkv", "mlp"])
    # A small file: the adapters alone, not the base.
    base_bytes = sum(v.numel() * 4 for v in base_state_dict(model).values())
    assert (tmp_path / ADAPTER_WEIGHTS).stat().st_size < base_bytes / 10
    x = tokens()
    fresh = load_adapter(make_base(name), tmp_path).eval()
    assert torch.equal(fresh(x), model(x))
    again = load_adapter(apply_lora(make_base(name), LoRAConfig(r=2, alpha=5.0, targets=("qkv", "mlp"))),
                         tmp_path).eval()
    assert torch.equal(again(x), model(x))


def _peft_logits_and_modules(base_dir, adapter_dir, x):
    """The logits of peft's model on the HF base folder with the adapter folder, and the modules it adapted."""
    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    hf = transformers.AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32, attn_implementation="eager")
    model = peft.PeftModel.from_pretrained(hf, adapter_dir).eval()
    adapted = {n for n, m in model.named_modules() if isinstance(m, peft.tuners.lora.LoraLayer)}
    with torch.no_grad():
        return model(input_ids=x).logits, adapted


@pytest.mark.parametrize("name, targets, hf_modules_per_block", [
    ("llama-gqa", ("attn", "mlp"), 7),  # q, k, v, o, gate, up, down
    ("llama-gqa-bias-tied", ("qkv", "down"), 4),
    ("gpt2", ("attn", "mlp"), 4),  # c_attn, attn.c_proj, c_fc, mlp.c_proj
    ("gpt2", ("attn.proj",), 1),  # attn.c_proj, not mlp.c_proj
])
def test_a_peft_export_gives_our_logits_in_peft(name, targets, hf_modules_per_block, tmp_path):
    model = make_adapted(name, r=4, alpha=16.0, targets=targets)
    x = tokens(length=16)
    with torch.no_grad():
        ours = model(x)
        with disable_adapters(model):
            assert (ours - model(x)).abs().max() > 1e-2  # the adapters matter, so equality below means something
    save_hf(model, tmp_path / "base")  # the base weights: the adapters stay out of model.safetensors
    save_peft_adapter(model, tmp_path / "adapter")
    assert sorted(p.name for p in (tmp_path / "adapter").iterdir()) == sorted([PEFT_CONFIG, PEFT_WEIGHTS])
    theirs, adapted = _peft_logits_and_modules(tmp_path / "base", tmp_path / "adapter", x)
    torch.testing.assert_close(theirs, ours, rtol=0, atol=1e-4)
    # peft adapted exactly the modules in the file: a target matching more would add adapters that, B being
    # zero, the logits above cannot see.
    from safetensors.torch import load_file

    in_file = {k.removesuffix(".lora_A.weight") for k in load_file(str(tmp_path / "adapter" / PEFT_WEIGHTS))
               if k.endswith(".lora_A.weight")}
    assert adapted == in_file and len(in_file) == 2 * hf_modules_per_block


BAD_CONFIGS = [
    ({"r": 0}, r"^lora\.r: must be a positive integer"),
    ({"r": 2.5}, r"^lora\.r: must be a positive integer"),
    ({"alpha": 0}, r"^lora\.alpha: must be a positive number"),
    ({"alpha": float("nan")}, r"^lora\.alpha: must be a positive number"),
    ({"dropout": 1.0}, r"^lora\.dropout: must be in \[0, 1\)"),
    ({"targets": ()}, r"^lora\.targets: got \(\); name the layers to adapt"),
    ({"targets": ("qkv", "lm_head")}, r"^lora\.targets: unknown layer 'lm_head'; choose from"),
    ({"targets": ("q_proj",)}, r"^lora\.targets: 'q_proj' is Hugging Face's name; here use qkv \(q, k and v"),
    ({"targets": ("c_proj",)}, r"^lora\.targets: 'c_proj' is Hugging Face's name; here use attn\.proj or mlp\.proj$"),
]


@pytest.mark.parametrize("kwargs, message", BAD_CONFIGS)
def test_a_bad_config_is_one_line(kwargs, message):
    with pytest.raises(BurnoutError, match=message) as exc:
        LoRAConfig(**kwargs)
    assert "\n" not in str(exc.value)


def test_bad_uses_are_one_line(tmp_path):
    errors = []
    with pytest.raises(BurnoutError, match=r"^lora\.targets: 'gate' names no layer of this gpt2 model") as exc:
        apply_lora(make_base("gpt2"), LoRAConfig(targets=("gate",)))
    errors.append(exc)
    with pytest.raises(BurnoutError, match=r"^lora: unknown key 'rank'; the keys are") as exc:
        LoRAConfig.from_dict({"rank": 8})
    errors.append(exc)
    with pytest.raises(BurnoutError, match=r"already has LoRA adapters") as exc:
        apply_lora(make_adapted("gpt2"), LoRAConfig())
    errors.append(exc)
    model = make_adapted("llama-gqa")
    sd = lora_state_dict(model)
    with pytest.raises(BurnoutError, match=r"^adapter: tensor 'blocks\.0\.attn\.qkv\.lora_A' is missing") as exc:
        load_lora_state_dict(model, {k: v for k, v in sd.items() if k != "blocks.0.attn.qkv.lora_A"})
    errors.append(exc)
    save_adapter(make_adapted("llama-gqa", r=2), tmp_path / "r2")
    with pytest.raises(BurnoutError, match=r"adapter of rank 2, alpha 8.0 on attn, mlp, but the model's adapters "
                                           r"have rank 4, alpha 8.0 on attn, mlp") as exc:
        load_adapter(model, tmp_path / "r2")
    errors.append(exc)
    save_adapter(make_adapted("llama-gqa", alpha=3.0), tmp_path / "alpha3")
    with pytest.raises(BurnoutError, match=r"adapter of rank 4, alpha 3.0 on attn, mlp, but") as exc:
        load_adapter(model, tmp_path / "alpha3")
    errors.append(exc)
    with pytest.raises(BurnoutError, match=r"holds no adapter_config\.json") as exc:
        load_adapter(make_base("llama-gqa"), tmp_path)
    errors.append(exc)
    assert all("\n" not in str(e.value) for e in errors)


# ----------------------------------------------------------------------------------------------
# Token rows: the embedding (and untied head) rows of added tokens train beside the adapters

ROWS = [5, 95, 96]  # as if the fine-tune had added three tokens: ids 95, 96 past the base, and 5 inside it
ROW_NAMES = ["gpt2", "llama-gqa", "llama-gqa-bias-tied"]  # tied, untied, tied


def make_with_rows(name: str, seed: int = 0, **lora) -> Transformer:
    """make_adapted with the ROWS of the embedding (and untied head) training and set to random values, as
    training would leave them."""
    model = train_token_rows(make_adapted(name, seed, **lora), ROWS)
    g = torch.Generator().manual_seed(seed + 3)
    with torch.no_grad():
        for weight in {id(p): p for p in (model.tok_emb.weight, model.lm_head.weight)}.values():
            weight[ROWS] = 0.5 * torch.randn(len(ROWS), weight.size(1), generator=g)
    return model


def _row_weights(model):
    return {"tok_emb.weight": model.tok_emb.weight, "lm_head.weight": model.lm_head.weight}


@pytest.mark.parametrize("name", ROW_NAMES)
def test_token_rows_get_the_gradient_and_every_other_row_none(name):
    model = apply_lora(make_base(name), LoRAConfig(r=4, alpha=8), row_ids=ROWS).train()
    x = tokens(length=16)
    x[:, ::3], x[:, 1::5], x[:, 2::7] = 96, 5, 95  # the added tokens as inputs (and targets)
    model(x[:, :-1], targets=x[:, 1:]).backward()
    tied = name != "llama-gqa"
    for key, weight in _row_weights(model).items():
        assert weight.requires_grad and weight.token_rows == tuple(ROWS), key
        others = torch.ones(VOCAB, dtype=torch.bool)
        others[ROWS] = False
        assert torch.count_nonzero(weight.grad[others]) == 0, key  # exact zeros, not small numbers
        assert (weight.grad[ROWS].abs().sum(dim=1) > 0).all(), key
    assert (model.tok_emb.weight is model.lm_head.weight) is tied
    # Every other base parameter stays frozen.
    matrices = {id(w) for w in _row_weights(model).values()}
    for pname, p in model.named_parameters():
        if not pname.endswith((".lora_A", ".lora_B")) and id(p) not in matrices:
            assert not p.requires_grad and p.grad is None, pname


@pytest.mark.parametrize("name", ROW_NAMES)
def test_token_rows_count_k_times_d_as_trainable_and_the_whole_matrix_in_optimizer_state(name):
    base = make_base(name)
    model = apply_lora(make_base(name), LoRAConfig(r=4, alpha=8), row_ids=ROWS)
    adapters = sum(v.numel() for v in lora_state_dict(model).values())
    matrices = 1 if name != "llama-gqa" else 2  # an untied head's rows train too
    d = model.cfg.d_model
    counts = trainable_counts(model)
    assert counts.trainable == adapters + matrices * len(ROWS) * d
    assert counts.optimized == adapters + matrices * VOCAB * d
    assert counts.total == sum(p.numel() for p in base.parameters()) + adapters
    plain = trainable_counts(apply_lora(make_base(name), LoRAConfig(r=4, alpha=8)))
    assert plain.trainable == plain.optimized == adapters


@pytest.mark.parametrize("name", ROW_NAMES)
def test_token_rows_round_trip_through_the_adapter_folder(name, tmp_path):
    model = make_with_rows(name).eval()
    save_adapter(model, tmp_path)
    from safetensors.torch import load_file

    tensors = load_file(str(tmp_path / ADAPTER_WEIGHTS))
    row_keys = {"tok_emb.weight.rows"} | ({"lm_head.weight.rows"} if name == "llama-gqa" else set())
    assert tensors.keys() == set(lora_state_dict(model)) | row_keys
    assert json.loads((tmp_path / ADAPTER_CONFIG).read_text())["token_rows"] == ROWS
    for key in row_keys:
        assert torch.equal(tensors[key], _row_weights(model)[key.removesuffix(".rows")][ROWS])
    x = tokens()
    x[:, ::2] = 96
    base = make_base(name).eval()
    assert (base(x) - model(x)).abs().max() > 1e-2
    fresh = load_adapter(make_base(name), tmp_path).eval()  # the base, with its own (mean) rows
    assert torch.equal(fresh(x), model(x))
    assert fresh.tok_emb.weight.token_rows == tuple(ROWS) and fresh.tok_emb.weight.requires_grad
    # every other row is the base's, untouched by the load
    others = [i for i in range(VOCAB) if i not in ROWS]
    for key, weight in _row_weights(fresh).items():
        assert torch.equal(weight[others], _row_weights(base)[key][others]), key


@pytest.mark.parametrize("name", ROW_NAMES)
def test_a_merge_keeps_the_trained_rows_and_drops_their_gradient_mask(name):
    model = make_with_rows(name).train()
    rows = {k: w.detach()[ROWS].clone() for k, w in _row_weights(model).items()}
    x = tokens()
    x[:, ::2] = 96
    with torch.no_grad():
        adapted = model.eval()(x)
    merged = merge_lora(model)
    for key, weight in _row_weights(merged).items():
        assert torch.equal(weight.detach()[ROWS], rows[key]), key
    assert not hasattr(merged.tok_emb.weight, "token_rows") and not hasattr(merged.lm_head.weight, "token_rows")
    torch.testing.assert_close(merged(x), adapted, rtol=0, atol=1e-5)
    merged.train()(x[:, :-1], targets=x[:, 1:]).backward()  # a plain model: every row gets its gradient
    others = [i for i in range(VOCAB) if i not in ROWS]
    assert torch.count_nonzero(merged.lm_head.weight.grad[others]) > 0


@pytest.mark.parametrize("name", ROW_NAMES)
def test_a_peft_export_with_trained_rows_gives_our_logits_in_peft(name, tmp_path):
    model = make_with_rows(name, r=4, alpha=16.0)
    x = tokens(length=16)
    x[:, ::3] = 96  # the added tokens as inputs, and (below) their logits in every row
    x[:, 1::4] = 5
    with torch.no_grad():
        ours = model(x)
    base = make_base(name)  # what save_hf exports of the grown base: the rows as they were before training
    save_hf(base, tmp_path / "base")
    save_peft_adapter(model, tmp_path / "adapter")
    config = json.loads((tmp_path / "adapter" / PEFT_CONFIG).read_text())
    untied = name == "llama-gqa"
    assert config["trainable_token_indices"] == ({"embed_tokens": ROWS, "lm_head": ROWS} if untied else ROWS)
    theirs, _ = _peft_logits_and_modules(tmp_path / "base", tmp_path / "adapter", x)
    torch.testing.assert_close(theirs, ours, rtol=0, atol=1e-4)
    # Without the rows peft's model is another one: the rows, not the adapters alone, give the match.
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(tmp_path / "adapter" / PEFT_WEIGHTS))
    delta = [k for k in tensors if k.endswith(".token_adapter.trainable_tokens_delta")]
    assert len(delta) == (2 if untied else 1)
    save_file({k: v for k, v in tensors.items() if k not in delta}, str(tmp_path / "adapter" / PEFT_WEIGHTS))
    (tmp_path / "adapter" / PEFT_CONFIG).write_text(json.dumps({**config, "trainable_token_indices": None}))
    without, _ = _peft_logits_and_modules(tmp_path / "base", tmp_path / "adapter", x)
    assert (without - ours).abs().max() > 1e-2


@pytest.mark.parametrize("name", ["llama-gqa", "llama-gqa-bias-tied"])
def test_a_row_frozen_at_the_mean_embedding_is_never_the_argmax(name):
    """Why the rows must train: a new token's row at the mean of the others (models/resize.py) has the mean of
    the other logits as its logit, which is never their maximum, so a frozen row could never be emitted."""
    from burnout.models.resize import grow_vocab

    model = make_base(name)
    new = grow_vocab(model, VOCAB + 2)
    hidden = torch.randn(4096, model.cfg.d_model, generator=torch.Generator().manual_seed(0)) * 3
    with torch.no_grad():
        logits = model.lm_head(hidden)  # (N, V + 2)
    assert not torch.isin(logits.argmax(dim=-1), torch.tensor(new)).any()
    torch.testing.assert_close(logits[:, new[0]], logits[:, :VOCAB].mean(dim=-1), rtol=0, atol=1e-5)


def test_bad_token_rows_are_one_line(tmp_path):
    errors = []
    with pytest.raises(BurnoutError, match=r"^token rows \[5, 97\]: give the ids of the added tokens, each below "
                                           r"the model's 97 rows") as exc:
        apply_lora(make_base("gpt2"), LoRAConfig(), row_ids=[97, 5])
    errors.append(exc)
    model = make_with_rows("llama-gqa")
    with pytest.raises(BurnoutError, match=r"already trains the embedding rows \[5, 95, 96\], not \[3\]") as exc:
        train_token_rows(model, [3])
    errors.append(exc)
    save_adapter(model, tmp_path / "untied")
    with pytest.raises(BurnoutError, match=r"token rows tensor 'lm_head\.weight\.rows' does not fit this model") as exc:
        load_adapter(Transformer(dataclasses.replace(CONFIGS["llama-gqa"], tie_embeddings=True)), tmp_path / "untied")
    errors.append(exc)
    small = Transformer(dataclasses.replace(CONFIGS["llama-gqa"], vocab_size=90))
    with pytest.raises(BurnoutError, match=r"token rows \[5, 95, 96\] reach past the model's 90 rows; load it into "
                                           r"the base grown") as exc:
        load_adapter(small, tmp_path / "untied")
    errors.append(exc)
    assert all("\n" not in str(e.value) for e in errors)
