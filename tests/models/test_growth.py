"""Model growth: the grown model's outputs are the original's (both families; depth, width, GQA), a training step
moves what is new, and `burnout grow` writes a run that generate, eval, export, plan and --init-from read."""

import dataclasses
import json
import shutil

import pytest
import torch

from burnout.cli import main
from burnout.config import ModelConfig, OptimConfig, TrainConfig
from burnout.errors import BurnoutError
from burnout.models import Transformer
from burnout.models.growth import grow_state_dict, grown_model_config
from burnout.train.optim import make_optimizer

BASE = {"vocab_size": 96, "n_layer": 2, "d_model": 32, "n_head": 4, "context_length": 16, "ffn_multiple_of": 16}


def _trained_like(family: str, tied: bool, **shape) -> Transformer:
    """A model whose every weight (biases and norms' gains too) is away from its init, as training leaves it."""
    torch.manual_seed(0)
    model = Transformer(ModelConfig(family=family, tie_embeddings=tied, **{**BASE, **shape}))
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.05)
    return model.eval()


def _grown(model: Transformer, **changes) -> Transformer:
    new = grown_model_config(model.cfg, changes)
    grown = Transformer(new)
    grown.load_state_dict(grow_state_dict(model.cfg, model.state_dict(), new))
    return grown.eval()


# (family, tied embeddings, the original's shape beyond BASE, the changes)
SHAPES = [
    ("llama", True, {"n_kv_head": 2}, {"n_layer": 4}),  # depth only: one new block after each
    ("gpt2", False, {}, {"n_layer": 5}),  # depth only, three new blocks over two old ones
    ("llama", False, {"n_kv_head": 2}, {"n_layer": 3, "d_model": 64}),  # depth and width, GQA groups of 2 kept
    ("gpt2", True, {}, {"n_layer": 4, "d_model": 96}),  # tied: the stream scaled by 1/3, norm_eps by 1/9
    ("llama", True, {"n_kv_head": 2}, {"d_model": 64, "n_kv_head": 2}),  # GQA groups of 2 become groups of 4
    ("llama", True, {"n_kv_head": 1}, {"n_kv_head": 4}),  # one key/value head copied to four: GQA → MHA
    ("llama", False, {"n_kv_head": 2}, {"d_model": 64, "ffn_hidden": 200}),  # new MLP units beyond the width's
]


@pytest.mark.parametrize(("family", "tied", "shape", "changes"), SHAPES,
                         ids=[f"{f}-{'tied' if t else 'untied'}-{'-'.join(f'{k}{v}' for k, v in c.items())}"
                              for f, t, _, c in SHAPES])
def test_grown_logits_and_loss_equal_the_originals(family, tied, shape, changes):
    model = _trained_like(family, tied, **shape)
    grown = _grown(model, **changes)
    assert all(getattr(grown.cfg, key) == value for key, value in changes.items())
    idx, targets = torch.randint(0, 96, (2, 16)), torch.randint(0, 96, (2, 16))
    with torch.no_grad():
        assert (grown(idx) - model(idx)).abs().max() < 1e-5
        assert abs(float(grown(idx, targets)) - float(model(idx, targets))) < 1e-5


def test_a_training_step_moves_every_weight_of_the_new_blocks():
    model = _trained_like("llama", True, n_kv_head=2)
    grown = _grown(model, n_layer=4).train()  # new blocks at 1 and 3, each after the old block it copies
    before = {name: p.detach().clone() for name, p in grown.named_parameters()}
    # No decay: only gradients move them.
    optimizer = make_optimizer(grown, TrainConfig(optim=OptimConfig(lr=1e-3, weight_decay=0.0)))
    idx = torch.randint(0, 96, (4, 16))
    for _ in range(2):  # the output projections move first; the weights behind them from the second step
        grown(idx[:, :-1], idx[:, 1:]).backward()
        optimizer.step()
        optimizer.zero_grad()
    for name, param in grown.named_parameters():
        if name.startswith(("blocks.1.", "blocks.3.")):
            assert not torch.equal(param, before[name]), f"{name} did not move"


def test_copies_of_a_channel_part_at_the_first_step():
    model = _trained_like("llama", True, n_kv_head=2)
    grown = _grown(model, d_model=64).train()
    embedding = grown.tok_emb.weight
    assert torch.equal(embedding[:, :32], embedding[:, 32:])  # the stream starts as two copies of the old one
    optimizer = make_optimizer(grown, TrainConfig(optim=OptimConfig(lr=1e-3, weight_decay=0.0)))
    idx = torch.randint(0, 96, (4, 16))
    grown(idx[:, :-1], idx[:, 1:]).backward()
    optimizer.step()
    assert not torch.equal(embedding[:, :32], embedding[:, 32:])


@pytest.mark.parametrize(("shape", "changes", "fragment"), [
    ({}, {"d_model": 48}, "model.d_model: 48 is not a whole multiple of 32"),
    ({}, {"d_model": 64, "n_head": 4}, "heads grow but keep their width (RoPE ties it), so give model.n_head=8"),
    ({}, {"n_layer": 1}, "n_layer 2 → 1 is smaller"),
    ({}, {"d_model": 16}, "d_model 32 → 16 is smaller"),
    ({}, {"n_layer": 2}, "is the same; give larger values, e.g. model.n_layer=4"),
    ({}, {"n_layer": 4, "vocab_size": 128}, "model.vocab_size: 128 differs from the model's 96"),
    ({}, {"n_layer": 4, "family": "gpt2"}, "model.family: gpt2 differs from the model's llama"),
    ({}, {"n_layer": 4, "context_length": 32}, "model.context_length: 32 differs from the model's 16"),
    ({"d_model": 48, "n_head": 6, "n_kv_head": 2}, {"n_kv_head": 3},
     "2 key/value heads of 3 query heads each need 4 groups of 2, and 3 were given"),
])
def test_shapes_that_cannot_grow_exactly_are_refused(shape, changes, fragment):
    old = ModelConfig(family="llama", **{**BASE, **shape}).resolved()
    with pytest.raises(BurnoutError) as refused:
        grown_model_config(old, changes)
    assert fragment in str(refused.value)


def _val_loss(run, capsys) -> float:
    assert main(["eval", str(run), "--tasks", "val"]) == 0
    capsys.readouterr()
    return json.loads(next((run / "eval").glob("step_*.json")).read_text())["tasks"]["val"]["loss"]


@pytest.mark.slow
def test_grow_writes_a_run_that_generate_eval_export_and_plan_read(tiny_run, tmp_path, capsys):
    parent, grown = tmp_path / "parent", tmp_path / "grown"
    shutil.copytree(tiny_run.run_dir, parent)  # eval writes into the run it evaluates
    assert main(["grow", str(parent), "--out", str(grown), "model.n_layer=4", "model.d_model=128"]) == 0
    assert "n_layer 2 → 4, d_model 64 → 128" in capsys.readouterr().out
    info = json.loads((grown / "checkpoints" / "step_0000000" / "info.json").read_text())
    assert info["grown_from"]["run"] == str(parent.resolve()) and info["grown_from"]["step"] == 24
    assert info["grown_from"]["after"]["n_head"] == 8 and info["grown_from"]["before"]["n_layer"] == 2
    greedy = ["--prompt", "def ", "--temperature", "0", "--max-new-tokens", "16"]
    assert main(["generate", str(parent), *greedy]) == 0
    from_parent = capsys.readouterr().out
    assert main(["generate", str(grown), *greedy]) == 0
    assert capsys.readouterr().out == from_parent
    assert abs(_val_loss(grown, capsys) - _val_loss(parent, capsys)) < 1e-5
    assert main(["export", str(grown), "--to", str(tmp_path / "hf")]) == 0
    exported = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert (exported["num_hidden_layers"], exported["hidden_size"]) == (4, 128)
    assert main(["plan", str(grown), "--gpu", "rtx-4090"]) == 0


def test_training_a_grown_model_starts_from_the_originals_loss(tiny_run, tmp_path, capsys):
    grown = tmp_path / "grown"
    assert main(["grow", str(tiny_run.run_dir), "--out", str(grown), "model.n_layer=3", "model.d_model=128"]) == 0
    first_step = ["train.max_steps=1", "train.log_interval=1", "train.warmup_steps=0"]
    losses = []
    for start in (tiny_run.run_dir, grown):  # the same config, seed and data: the same first batch
        out = tmp_path / f"from-{start.name}"
        assert main(["train", "--init-from", str(start), "--out", str(out), *first_step]) == 0
        losses.append(json.loads((out / "metrics.jsonl").read_text().splitlines()[0])["train_loss"])
    capsys.readouterr()
    assert abs(losses[0] - losses[1]) < 1e-5


def test_grow_says_how_large_the_grown_model_is_before_building_it(tiny_run, tmp_path, capsys):
    from safetensors import safe_open

    from burnout.base.text import format_bytes, format_count

    grown = tmp_path / "grown"
    assert main(["grow", str(tiny_run.run_dir), "--out", str(grown), "model.n_layer=3"]) == 0
    first, second = capsys.readouterr().out.splitlines()[:2]
    with safe_open(grown / "checkpoints" / "step_0000000" / "model.safetensors", "pt") as f:
        n = sum(f.get_slice(name).get_shape()[0] * (f.get_slice(name).get_shape()[1:] or [1])[0] for name in f.keys())
    assert first.startswith(f"growing into {format_count(n)} parameters: n_layer 3, d_model 64, vocab_size 512: "
                            f"{format_bytes(4 * n)} in fp32 (")
    assert "of memory available" in first and f"the disk of {grown.absolute()} has " in first
    assert second.startswith("grew ")


@pytest.mark.parametrize("short", ["memory", "disk"])
def test_a_grown_model_this_machine_cannot_hold_or_write_is_refused_before_a_weight_is_made(tiny_run, tmp_path,
                                                                                           monkeypatch, capsys, short):
    from burnout.core import model_files
    from burnout.models import size

    def no_weights(*args, **kwargs):
        raise AssertionError("weights were grown before the size was checked")

    monkeypatch.setattr(model_files, "grow_state_dict", no_weights)
    need = 4 * size.parameter_count(dataclasses.replace(tiny_run.cfg.model, n_layer=40))
    room = (need - 1, "there is 1 byte too little")
    monkeypatch.setattr(size, "machine_memory", lambda: room if short == "memory" else None)
    monkeypatch.setattr(model_files, "free_disk", lambda folder: room if short == "disk" else (2 * need, "ample"))
    grown = tmp_path / "grown"
    assert main(["grow", str(tiny_run.run_dir), "--out", str(grown), "model.n_layer=40"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("burnout: error: model.n_layer=40: the grown model"), err
    assert ("the grown model's checkpoint needs" in err[0]) == (short == "disk")
    assert "for its fp32 weights and there is 1 byte too little; " in err[0] and "grow it less (its parent" in err[0]
    assert not grown.exists()
