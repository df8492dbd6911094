"""Parity with Hugging Face transformers: our models exported by save_hf give the same logits and greedy
continuations in GPT2LMHeadModel / LlamaForCausalLM, and HF checkpoints load back into ours via load_hf.

Everything runs in fp32 on the CPU with tiny random models and fixed seeds; no network.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from burnout.config import ModelConfig
from burnout.errors import BurnoutError
from burnout.models.hf import from_hf_state_dict, hf_config_dict, load_hf, save_hf, to_hf_state_dict
from burnout.models.transformer import Transformer

transformers = pytest.importorskip("transformers")

ATOL = 1e-4
VOCAB = 211
CONTEXT = 64


def gpt2_cfg(**kw) -> ModelConfig:
    base = dict(family="gpt2", vocab_size=VOCAB, n_layer=2, d_model=48, n_head=3, context_length=CONTEXT)
    return ModelConfig(**{**base, **kw})


def llama_cfg(**kw) -> ModelConfig:
    base = dict(family="llama", vocab_size=VOCAB, n_layer=2, d_model=64, n_head=4, ffn_hidden=96,
                context_length=CONTEXT)
    return ModelConfig(**{**base, **kw})


CASES = {
    # gpt2: 3 heads of dim 16, bias on/off, tied/untied, explicit ffn
    "gpt2-bias-tied": gpt2_cfg(bias=True, tie_embeddings=True),
    "gpt2-nobias-untied": gpt2_cfg(bias=False, tie_embeddings=False, ffn_hidden=80, n_layer=3),
    "gpt2-nobias-tied-ffn": gpt2_cfg(bias=False, tie_embeddings=True, ffn_hidden=72, d_model=96, n_head=6,
                                     norm_eps=1e-6),
    # llama: GQA ratio 1, 2, 3 and MQA; tied/untied; bias on/off; odd layer counts; big theta
    "llama-mha-untied": llama_cfg(n_kv_head=4, tie_embeddings=False, n_layer=3),
    "llama-gqa2-tied-bias": llama_cfg(n_kv_head=2, tie_embeddings=True, bias=True),
    "llama-gqa3-theta": llama_cfg(d_model=96, n_head=6, n_kv_head=2, ffn_hidden=160, rope_theta=500000.0,
                                  n_layer=3, tie_embeddings=False, norm_eps=1e-6),
    "llama-mqa-bias-untied": llama_cfg(d_model=96, n_head=6, n_kv_head=1, bias=True, tie_embeddings=False,
                                       n_layer=1, rope_theta=500000.0),
}


def perturb_(model: torch.nn.Module, seed: int) -> None:
    """Make norms and biases non-trivial, and sharpen the logits so that greedy choices are clear-cut."""
    g = torch.Generator().manual_seed(seed + 1000)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            if "norm" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.3 * noise)
            elif name.endswith("bias"):
                p.copy_(0.1 * noise)
        final = model.norm.weight if hasattr(model, "norm") else None
        if final is not None:
            final.mul_(8.0)


def make_model(cfg: ModelConfig, seed: int) -> Transformer:
    torch.manual_seed(seed)
    model = Transformer(cfg)
    perturb_(model, seed)
    return model.eval()


def tokens(seed: int, batch: int, length: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def our_greedy(model: Transformer, prompt: torch.Tensor, n_new: int) -> torch.Tensor:
    cache = model.new_cache(prompt.size(0), prompt.size(1) + n_new)
    logits = model(prompt, cache=cache)
    out = [prompt]
    for _ in range(n_new):
        nxt = logits[:, -1].argmax(dim=-1, keepdim=True)
        out.append(nxt)
        logits = model(nxt, cache=cache)
    return torch.cat(out, dim=1)


@torch.no_grad()
def our_greedy_nocache(model: Transformer, prompt: torch.Tensor, n_new: int) -> torch.Tensor:
    seq = prompt
    for _ in range(n_new):
        seq = torch.cat([seq, model(seq)[:, -1].argmax(dim=-1, keepdim=True)], dim=1)
    return seq


def load_hf_model(path: Path, attn: str):
    model = transformers.AutoModelForCausalLM.from_pretrained(path, attn_implementation=attn, dtype=torch.float32)
    return model.eval()


# ----------------------------------------------------------------------------------------------
# ours → HF


@pytest.mark.parametrize("name", list(CASES))
def test_export_matches_transformers(name, tmp_path):
    cfg = CASES[name]
    seed = sum(map(ord, name))
    model = make_model(cfg, seed)
    save_hf(model, tmp_path)

    hf_cfg = transformers.AutoConfig.from_pretrained(tmp_path)
    assert hf_cfg.model_type == cfg.family
    assert hf_cfg.tie_word_embeddings == cfg.tie_embeddings
    if cfg.family == "llama":
        assert hf_cfg.rope_parameters["rope_theta"] == cfg.rope_theta
        assert hf_cfg.num_key_value_heads == cfg.resolved().n_kv_head

    x = tokens(seed, batch=3, length=CONTEXT - 4)
    prompt = tokens(seed + 1, batch=2, length=8)
    with torch.no_grad():
        ours = model(x)
    ours_greedy = our_greedy(model, prompt, 20)
    assert torch.equal(ours_greedy, our_greedy_nocache(model, prompt, 20))
    assert ours.std() > 0.5  # logits are far from uniform, so greedy ties are not a concern

    for attn in ("eager", "sdpa"):
        hf = load_hf_model(tmp_path, attn)
        if cfg.tie_embeddings:
            assert hf.lm_head.weight.data_ptr() == hf.get_input_embeddings().weight.data_ptr()
        with torch.no_grad():
            theirs = hf(x).logits
        diff = (theirs - ours).abs().max().item()
        assert diff < ATOL, f"{name} / {attn}: max |logit diff| = {diff:.2e}"
        generated = hf.generate(prompt, do_sample=False, max_new_tokens=20, min_new_tokens=20,
                                pad_token_id=0, eos_token_id=None)
        assert torch.equal(generated, ours_greedy), f"{name} / {attn}: greedy continuations differ"


@pytest.mark.parametrize("name", list(CASES))
def test_round_trip_through_hf_format(name, tmp_path):
    cfg = CASES[name]
    seed = sum(map(ord, name)) + 7
    model = make_model(cfg, seed)
    save_hf(model, tmp_path)
    back = load_hf(tmp_path)
    assert not back.training

    ours, theirs = model.state_dict(), back.state_dict()
    for key, value in ours.items():
        assert torch.equal(value, theirs[key]), key
    # A gpt2 model without biases comes back with bias=True and every bias exactly zero.
    for key in theirs.keys() - ours.keys():
        assert cfg.family == "gpt2" and key.endswith(".bias") and not theirs[key].any(), key
    if cfg.tie_embeddings:
        assert back.lm_head.weight is back.tok_emb.weight

    x = tokens(seed, batch=2, length=CONTEXT)
    with torch.no_grad():
        torch.testing.assert_close(back(x), model(x), atol=1e-6, rtol=0)
    # And the direct, in-memory mapping inverts too.
    direct = from_hf_state_dict(back.cfg, to_hf_state_dict(model))
    for key, value in ours.items():
        assert torch.equal(value, direct[key]), key


def test_safetensors_file_layout(tmp_path):
    from safetensors import safe_open

    model = make_model(CASES["gpt2-nobias-untied"], 3)
    save_hf(model, tmp_path)
    with safe_open(tmp_path / "model.safetensors", framework="pt") as f:
        assert f.metadata() == {"format": "pt"}
        keys = set(f.keys())
        assert f.get_tensor("transformer.h.0.attn.c_attn.weight").shape == (48, 3 * 48)  # Conv1D: (in, out)
        assert not f.get_tensor("transformer.h.0.attn.c_attn.bias").any()
    assert "lm_head.weight" in keys and "transformer.wpe.weight" in keys

    tied = make_model(CASES["llama-gqa2-tied-bias"], 3)
    save_hf(tied, tmp_path / "tied")
    with safe_open(tmp_path / "tied" / "model.safetensors", framework="pt") as f:
        assert "lm_head.weight" not in set(f.keys())
        assert f.get_tensor("model.layers.0.self_attn.k_proj.weight").shape == (2 * 16, 64)
    config = json.loads((tmp_path / "tied" / "config.json").read_text())
    assert config == hf_config_dict(tied.cfg)


# ----------------------------------------------------------------------------------------------
# HF → ours


def _perturb_hf_(model, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            if ("ln" in name or "norm" in name) and name.endswith("weight"):
                p.copy_(1.0 + 0.3 * noise)
            elif name.endswith("bias"):
                p.copy_(0.1 * noise)


HF_NATIVE = {
    "gpt2-tied": lambda: transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=VOCAB, n_positions=CONTEXT, n_embd=48, n_layer=3, n_head=3, layer_norm_epsilon=1e-5)),
    "gpt2-untied-inner": lambda: transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=VOCAB, n_positions=CONTEXT, n_embd=64, n_layer=1, n_head=4, n_inner=100,
        activation_function="gelu_new", tie_word_embeddings=False)),
    "llama-gqa-untied": lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=96, intermediate_size=144, num_hidden_layers=3, num_attention_heads=6,
        num_key_value_heads=2, max_position_embeddings=CONTEXT, rope_theta=500000.0, rms_norm_eps=1e-5,
        tie_word_embeddings=False)),
    # attention_bias without mlp_bias: ours uses bias=True with zero MLP biases.
    "llama-mqa-tied-attnbias": lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=80, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=1, max_position_embeddings=CONTEXT, tie_word_embeddings=True, attention_bias=True)),
}


@pytest.mark.parametrize("name", list(HF_NATIVE))
def test_load_native_transformers_checkpoint(name, tmp_path):
    torch.manual_seed(sum(map(ord, name)))
    hf = HF_NATIVE[name]().eval()
    _perturb_hf_(hf, 11)
    # Shard the llama checkpoints to exercise model.safetensors.index.json.
    shard = "40KB" if name.startswith("llama") else "50GB"
    hf.save_pretrained(tmp_path, max_shard_size=shard)
    if name.startswith("llama"):
        assert (tmp_path / "model.safetensors.index.json").is_file()

    ours = load_hf(tmp_path)
    assert ours.cfg.family == hf.config.model_type
    assert ours.cfg.tie_embeddings == hf.config.tie_word_embeddings
    x = tokens(5, batch=2, length=CONTEXT - 1)
    with torch.no_grad():
        diff = (ours(x) - hf(x).logits).abs().max().item()
    assert diff < ATOL, f"{name}: max |logit diff| = {diff:.2e}"


# ----------------------------------------------------------------------------------------------
# Tokenizer, errors, no transformers needed


def _tiny_tokenizer(path: Path) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB - 1, special_tokens=["<|endoftext|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["hello world, the quick brown fox"] * 20, trainer=trainer)
    tok.add_special_tokens(["<|endoftext|>"])
    tok.save(str(path))
    return path


def test_tokenizer_travels_with_the_model(tmp_path):
    tok_path = _tiny_tokenizer(tmp_path / "tokenizer.json")
    from tokenizers import Tokenizer

    raw = Tokenizer.from_file(str(tok_path))
    model = make_model(CASES["gpt2-bias-tied"], 1)
    out = save_hf(model, tmp_path / "export", tokenizer_path=tok_path)

    hf_tok = transformers.AutoTokenizer.from_pretrained(out)
    assert isinstance(hf_tok, transformers.PreTrainedTokenizerFast)
    assert hf_tok.eos_token == "<|endoftext|>"
    eot = raw.token_to_id("<|endoftext|>")
    assert hf_tok.eos_token_id == eot
    text = "hello fox<|endoftext|>quick"
    assert hf_tok(text)["input_ids"] == raw.encode(text).ids
    assert hf_tok.decode(raw.encode(text).ids) == text
    assert transformers.AutoConfig.from_pretrained(out).eos_token_id == eot
    assert transformers.GenerationConfig.from_pretrained(out).eos_token_id == eot


def test_unsupported_or_incomplete_folders_raise(tmp_path):
    (tmp_path / "bert").mkdir()
    (tmp_path / "bert" / "config.json").write_text(json.dumps({"model_type": "bert", "hidden_size": 64}))
    with pytest.raises(BurnoutError, match="model_type 'bert' is not supported"):
        load_hf(tmp_path / "bert")

    with pytest.raises(BurnoutError, match="no config.json"):
        load_hf(tmp_path)

    model = make_model(CASES["llama-mha-untied"], 2)
    save_hf(model, tmp_path / "noweights")
    (tmp_path / "noweights" / "model.safetensors").unlink()
    with pytest.raises(BurnoutError, match="model.safetensors"):
        load_hf(tmp_path / "noweights")

    save_hf(model, tmp_path / "bad")
    config = json.loads((tmp_path / "bad" / "config.json").read_text())
    config["rope_parameters"] = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0}
    (tmp_path / "bad" / "config.json").write_text(json.dumps(config))
    with pytest.raises(BurnoutError, match="rope_type 'yarn'"):
        load_hf(tmp_path / "bad")


@pytest.mark.slow
def test_export_and_import_do_not_need_transformers(tmp_path):
    script = f"""
import sys
sys.modules["transformers"] = None  # any import of transformers now fails
import torch
from burnout.config import ModelConfig
from burnout.models.transformer import Transformer
from burnout.models.hf import save_hf, load_hf
m = Transformer(ModelConfig(family="llama", vocab_size=50, n_layer=1, d_model=32, n_head=2, ffn_hidden=48,
                            context_length=16)).eval()
save_hf(m, {str(tmp_path)!r})
back = load_hf({str(tmp_path)!r})
x = torch.randint(0, 50, (1, 8))
assert torch.equal(back(x), m(x))
"""
    subprocess.run([sys.executable, "-c", script], check=True, cwd=Path(__file__).resolve().parents[2])


def test_gpt2_checkpoint_without_transformer_prefix(tmp_path):
    """The original GPT-2 checkpoints were saved from GPT2Model: 'h.0.attn...' rather than 'transformer.h.0...'."""
    from safetensors.torch import load_file, save_file

    model = make_model(CASES["gpt2-bias-tied"], 9)
    save_hf(model, tmp_path)
    sd = load_file(str(tmp_path / "model.safetensors"))
    save_file({k.removeprefix("transformer."): v for k, v in sd.items()}, str(tmp_path / "model.safetensors"),
              metadata={"format": "pt"})
    back = load_hf(tmp_path)
    for key, value in model.state_dict().items():
        assert torch.equal(value, back.state_dict()[key]), key
