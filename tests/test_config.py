"""Run configs (burnout/config.py): loading built-in and user YAML, presets, overrides, family
defaults, and one-line BurnoutErrors that name the offending key."""

from __future__ import annotations

import copy

import pytest
import yaml

from burnout.config import (
    ModelConfig,
    RunConfig,
    SourceConfig,
    load_model_preset,
    load_run_config,
    model_preset_names,
)
from burnout.errors import BurnoutError


def test_quickstart_by_name_resolves_llama_tiny_made_narrower():
    cfg = load_run_config("quickstart")
    assert isinstance(cfg, RunConfig)
    m = cfg.model
    assert (m.family, m.vocab_size, m.n_layer, m.d_model, m.n_head, m.n_kv_head, m.context_length) == (
        "llama", 4096, 4, 128, 4, 2, 256)
    assert m.bias is False and m.tie_embeddings is True
    assert m == load_model_preset("llama-tiny", {"d_model": 128, "n_head": 4, "n_kv_head": 2})
    assert cfg.train.lr == 1e-2 and cfg.train.batch_size == 8 and cfg.train.seq_len == 256
    assert [(s.name, s.kind, s.weight) for s in cfg.data.sources] == [
        ("docs", "stdlib_docs", 0.7), ("code", "stdlib_code", 0.3)]
    assert cfg.tokenizer.vocab_size == 4096


def test_overrides_apply():
    cfg = load_run_config("quickstart", ["train.lr=3e-4", "model.n_layer=2", "model.tie_embeddings=false",
                                         "train.seq_len=null"])
    assert cfg.train.lr == 3e-4 and isinstance(cfg.train.lr, float)  # "3e-4" is a string to YAML 1.1
    assert cfg.model.n_layer == 2 and cfg.model.tie_embeddings is False
    assert cfg.model.d_model == 128  # the rest of the quickstart's model stays
    assert cfg.train.seq_len is None and cfg.train.batch_size == 8


def test_later_override_wins_and_int_float_coercion():
    cfg = load_run_config("quickstart", ["train.batch_size=4", "train.batch_size=6.0", "train.lr=1"])
    assert cfg.train.batch_size == 6 and isinstance(cfg.train.batch_size, int)
    assert cfg.train.lr == 1.0 and isinstance(cfg.train.lr, float)


def test_model_string_form():
    cfg = load_run_config({"model": "llama-1b", "train": {"seq_len": 128}})
    m = cfg.model
    assert (m.d_model, m.n_layer, m.n_head, m.n_kv_head, m.ffn_hidden, m.rope_theta) == (
        2048, 16, 32, 8, 8192, 500000.0)
    # A dotted override on a string-form model keeps the preset.
    cfg = load_run_config({"model": "llama-1b", "train": {"seq_len": 128}}, ["model.n_layer=3"])
    assert cfg.model.n_layer == 3 and cfg.model.d_model == 2048


def test_model_dict_form(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("model:\n  preset: llama-1b\n  n_layer: 4\ntrain:\n  seq_len: 64\n")
    cfg = load_run_config(path)
    assert cfg.model.n_layer == 4 and cfg.model.n_kv_head == 8 and cfg.model.vocab_size == 32005
    assert cfg.train.seq_len == 64
    # Also accepted as a plain string path.
    assert load_run_config(str(path)) == cfg


def test_inline_model_without_preset():
    cfg = load_run_config({"model": {"family": "gpt2", "vocab_size": 100, "n_layer": 1, "d_model": 32,
                                     "n_head": 2, "context_length": 16}})
    assert cfg.model.ffn_hidden == 128 and cfg.model.bias is True and cfg.model.n_kv_head == 2


def test_load_run_config_does_not_mutate_the_callers_dict():
    raw = {"model": {"preset": "llama-tiny"}, "train": {"lr": 1e-3, "seq_len": 64}}
    before = copy.deepcopy(raw)
    cfg = load_run_config(raw, ["train.lr=2e-3", "model.n_layer=2"])
    assert cfg.train.lr == 2e-3 and cfg.model.n_layer == 2
    assert raw == before


def test_round_trip_through_yaml(tmp_path):
    cfg = load_run_config("quickstart", ["model.n_layer=3", "train.lr=5e-4"])
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg.to_dict()))
    assert load_run_config(path) == cfg


# ------------------------------------------------------------------------------------------------
# Rejections: a BurnoutError naming the key.


def rejects(overrides, *fragments, source="quickstart"):
    with pytest.raises(BurnoutError) as exc:
        load_run_config(source, overrides)
    message = str(exc.value)
    for fragment in fragments:
        assert fragment in message, message
    assert "\n" not in message
    return message


def test_unknown_key_with_suggestion():
    rejects(["train.lrr=1"], "config.train.lrr: unknown key", "did you mean 'lr'?")
    rejects(["model.n_layers=2"], "config.model.n_layers", "did you mean 'n_layer'?")


def test_unknown_key_without_close_match_lists_known_keys():
    msg = rejects(["train.learnig_rate=1"], "config.train.learnig_rate: unknown key", "known keys:")
    assert "lr" in msg.split("known keys:")[1].split(", ")
    rejects(["optimizer.lr=1"], "config.optimizer: unknown key")


@pytest.mark.parametrize("override,key,expected", [
    ("train.batch_size=abc", "config.train.batch_size", "expected int, got 'abc'"),
    ("train.batch_size=2.5", "config.train.batch_size", "expected int"),
    ("model.tie_embeddings=3", "config.model.tie_embeddings", "expected bool, got 3"),
    ("model.vocab_size=true", "config.model.vocab_size", "expected int, got True"),
    ("train.lr=fast", "config.train.lr", "expected float"),
    ("train.sample_prompt=5", "config.train.sample_prompt", "expected str"),
    ("model.family=bert", "config.model.family", "'bert' is not one of 'gpt2', 'llama'"),
    ("train.precision=fp4", "config.train.precision", "is not one of"),
    ("tokenizer.special_tokens=abc", "config.tokenizer.special_tokens", "expected a list"),
    ("train=5", "config.train", "expected a mapping"),
])
def test_wrong_types(override, key, expected):
    rejects([override], key, expected)


def test_impossible_shapes():
    rejects(["model.n_head=7"], "model.n_head", "do not divide d_model=128")
    rejects(["model.n_kv_head=3"], "model.n_kv_head", "do not divide n_head=4")
    # The quickstart's model has d_model 128: 64 heads of dim 2 are fine, 128 heads of dim 1 are not (RoPE pairs).
    assert load_run_config("quickstart", ["model.n_head=64", "model.n_kv_head=8"]).model.head_dim == 2
    rejects(["model.n_head=128", "model.n_kv_head=8"], "model.n_head", "even head dimension")


def test_odd_head_dim_rejected_for_llama_only():
    rejects(["model.d_model=24", "model.n_head=8", "model.n_kv_head=8"], "model.n_head", "RoPE", "= 3")
    gpt2 = {"model": {"family": "gpt2", "vocab_size": 50, "n_layer": 1, "d_model": 24, "n_head": 8,
                      "context_length": 16}}
    assert load_run_config(gpt2).model.head_dim == 3
    with pytest.raises(BurnoutError, match="model.n_kv_head"):
        load_run_config({"model": {**gpt2["model"], "n_kv_head": 4}})


@pytest.mark.parametrize("override,key", [
    ("model.n_layer=0", "model.n_layer"),
    ("model.d_model=-8", "model.d_model"),
    ("model.vocab_size=0", "model.vocab_size"),
    ("model.n_kv_head=0", "model.n_kv_head"),
    ("model.ffn_hidden=-1", "model.ffn_hidden"),
    ("model.ffn_multiple_of=0", "model.ffn_multiple_of"),  # a llama's FFN width is rounded up to it: a division
    ("train.batch_size=0", "train.batch_size"),
    ("train.max_steps=-5", "train.max_steps"),
    ("train.seq_len=0", "train.seq_len"),
    ("train.lr=0", "train.lr"),
    ("train.warmup_steps=-1", "train.warmup_steps"),
    ("data.max_chars=0", "data.max_chars"),
    ("tokenizer.vocab_size=0", "tokenizer.vocab_size"),
    ("model.dropout=1.0", "model.dropout"),
    ("data.val_fraction=0", "data.val_fraction"),
    ("train.min_lr=1.0", "train.min_lr"),
    ("train.muon_lr=0", "train.muon_lr"),
    ("train.muon_momentum=1.0", "train.muon_momentum"),
])
def test_non_positive_sizes(override, key):
    rejects([override], key)


def test_optimizer_choice():
    assert load_run_config("quickstart").train.optimizer == "muon"  # measured the better at its 3 minutes
    muon = load_run_config("quickstart", ["train.muon_lr=0.03", "train.muon_momentum=0.95"]).train
    assert (muon.optimizer, muon.muon_lr, muon.muon_momentum) == ("muon", 0.03, 0.95)
    assert load_run_config("quickstart", ["train.optimizer=adamw"]).train.optimizer == "adamw"
    rejects(["train.optimizer=sgd"], "config.train.optimizer", "'sgd' is not one of 'adamw', 'muon'")
    rejects(["train.optimizer=muon", "train.distributed=fsdp"], "train.optimizer", "FSDP")


def test_seq_len_beyond_context():
    rejects(["train.seq_len=257"], "train.seq_len", "257", "context_length=256")
    assert load_run_config("quickstart", ["train.seq_len=512", "model.context_length=512"]).train.seq_len == 512


def test_unknown_preset():
    rejects(["model=nope"], "model.preset", "unknown preset 'nope'", "llama-tiny")
    with pytest.raises(BurnoutError, match="unknown preset 'gpt3'"):
        load_model_preset("gpt3")


def test_missing_config_file(tmp_path):
    missing = tmp_path / "nope.yaml"
    with pytest.raises(BurnoutError, match="nope.yaml' not found"):
        load_run_config(missing)
    with pytest.raises(BurnoutError, match="'no-such-builtin' not found"):
        load_run_config("no-such-builtin")


def test_invalid_yaml(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("train:\n  lr: [1, 2\n  batch_size: 3\n")
    with pytest.raises(BurnoutError) as exc:
        load_run_config(path)
    assert str(path) in str(exc.value) and "not valid YAML" in str(exc.value)
    path.write_text("- just\n- a list\n")
    with pytest.raises(BurnoutError, match="expected a mapping"):
        load_run_config(path)
    for empty in ("", "# comments only\n", "---\n"):  # read as {}, every section would be the defaults: refused
        path.write_text(empty)
        with pytest.raises(BurnoutError, match=f"^{path} is empty \\(no YAML in it, or only comments\\)"):
            load_run_config(path)


def with_sources(*sources):
    return {"model": "llama-tiny", "data": {"sources": list(sources)}}


def test_data_source_rejections():
    with pytest.raises(BurnoutError, match=r"data.sources: the weights sum to zero"):
        load_run_config(with_sources({"name": "a", "kind": "stdlib_docs", "weight": 0},
                                     {"name": "b", "kind": "stdlib_code", "weight": 0.0}))
    with pytest.raises(BurnoutError, match=r"data.sources: the list is empty"):
        load_run_config(with_sources())
    with pytest.raises(BurnoutError, match=r"data.sources\[1\].path: a 'text' source needs a path"):
        load_run_config(with_sources({"name": "a", "kind": "stdlib_docs"}, {"name": "b", "kind": "text"}))
    with pytest.raises(BurnoutError, match=r"data.sources\[0\].weight"):
        load_run_config(with_sources({"name": "a", "kind": "stdlib_docs", "weight": -1}))
    with pytest.raises(BurnoutError, match=r"unique"):
        load_run_config(with_sources({"name": "a", "kind": "stdlib_docs"}, {"name": "a", "kind": "stdlib_code"}))
    with pytest.raises(BurnoutError, match=r"config.data.sources\[0\].kind"):
        load_run_config(with_sources({"name": "a", "kind": "no_such_kind", "path": "x"}))
    with pytest.raises(BurnoutError, match=r"config.data.sources\[0\].*'name'"):
        load_run_config(with_sources({"kind": "stdlib_docs"}))
    ok = load_run_config(with_sources({"name": "mine", "kind": "jsonl", "path": "/x/*.jsonl", "weight": 2}))
    assert ok.data.sources == [SourceConfig(name="mine", kind="jsonl", weight=2.0, path="/x/*.jsonl")]


def test_malformed_overrides():
    rejects(["train.lr"], "override 'train.lr'", "section.key=value")
    rejects(["=3"], "override '=3'")
    rejects(["train.lr.x=1"], "'lr' is not a section")


# ------------------------------------------------------------------------------------------------
# Family defaults


def test_llama_ffn_defaults_round_up_to_256():
    assert ModelConfig(family="llama", d_model=256, n_head=8).resolved().ffn_hidden == 768  # 682.7 → 768
    assert ModelConfig(family="llama", d_model=2048, n_head=16).resolved().ffn_hidden == 5632  # 5461.3 → 5632
    assert ModelConfig(family="llama", d_model=768, n_head=12).resolved().ffn_hidden == 2048  # exactly 2048
    assert ModelConfig(family="llama", d_model=768, n_head=12, ffn_multiple_of=64).resolved().ffn_hidden == 2048
    assert ModelConfig(family="llama", d_model=100, n_head=2, ffn_multiple_of=10).resolved().ffn_hidden == 270
    assert ModelConfig(family="llama", d_model=2048, n_head=16, ffn_hidden=1000).resolved().ffn_hidden == 1000


def test_family_defaults():
    gpt2 = ModelConfig(family="gpt2", d_model=256, n_head=8).resolved()
    llama = ModelConfig(family="llama", d_model=256, n_head=8).resolved()
    assert gpt2.bias is True and llama.bias is False
    assert gpt2.ffn_hidden == 1024
    assert gpt2.n_kv_head == 8 and llama.n_kv_head == 8
    assert ModelConfig(family="llama", d_model=256, n_head=8, n_kv_head=2).resolved().n_kv_head == 2
    assert ModelConfig(family="gpt2", d_model=256, n_head=8, bias=False).resolved().bias is False
    assert ModelConfig(family="llama", d_model=256, n_head=8, bias=True).resolved().bias is True


def test_resolved_returns_a_copy():
    raw = ModelConfig(family="llama", d_model=256, n_head=8)
    resolved = raw.resolved()
    assert raw.n_kv_head is None and raw.ffn_hidden is None and raw.bias is None
    assert resolved is not raw and resolved.resolved() == resolved


def test_presets_all_load():
    names = model_preset_names()
    assert {"gpt2-124m", "llama-1b", "llama-tiny", "shakespeare-char"} <= set(names)
    for name in names:
        cfg = load_model_preset(name)
        assert cfg.n_kv_head is not None and cfg.ffn_hidden is not None and cfg.bias is not None


@pytest.mark.parametrize("written, read", [("1e3", 1000), ("1.0e+3", 1000), ("2.5e1", 25), ("1_000", 1000),
                                           (str(2**63 - 1), 2**63 - 1), (f"{2**63 - 1}.0e0", 2**63 - 1)])
def test_a_whole_number_written_as_a_float_is_read_exactly(written, read):
    """YAML 1.1 reads 1e3 (no dot, no sign in the exponent) as text and 1.0e+3 as a float; either is the number
    it spells, read exactly (not through a float: 2^63 - 1 is not a float)."""
    assert load_run_config("quickstart", [f"train.max_steps={written}"]).train.max_steps == read


@pytest.mark.parametrize("written", [str(2**63), "1e19", "-1e20", "1e999999999", "9" * 5000])
def test_a_whole_number_beyond_int64_is_refused_when_the_config_loads(written):
    with pytest.raises(BurnoutError) as refused:
        load_run_config("quickstart", [f"train.max_steps={written}"])
    assert str(refused.value).startswith("config.train.max_steps: ") and \
        "is beyond the largest whole number a setting may hold (9,223,372,036,854,775,807" in str(refused.value)


@pytest.mark.parametrize("key, named, why", [("on", "true", "an unquoted on, yes or true"),
                                             ("no", "false", "an unquoted off, no or false"),
                                             ("4", "4", "it as a number"), ("2.5", "2.5", "it as a number"),
                                             ("~", "null", "an unquoted ~ or null"),
                                             ("2024-01-01", "2024-01-01", "it as a date")])
def test_a_yaml_key_that_is_not_text_is_named_as_yaml_read_it(tmp_path, key, named, why):
    (tmp_path / "run.yaml").write_text(f"model: {{preset: llama-tiny}}\ntrain:\n  lr: 0.001\n  {key}: 1\n")
    with pytest.raises(BurnoutError) as refused:
        load_run_config(tmp_path / "run.yaml")
    assert str(refused.value).startswith(f"config.train.{named}: unknown key (YAML reads {why}")
    assert "quote a key to keep it text); known keys: " in str(refused.value)
