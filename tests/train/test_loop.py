"""The training loop: loss goes down, metrics.jsonl and config.yaml are right, resume is exact, bad
requests are refused, and the optimizer/schedule pieces do what they claim."""

import copy
import dataclasses
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import safetensors.torch
import torch

from burnout.config import OptimConfig, TrainConfig, load_run_config
from burnout.core.checkpoint import list_checkpoints
from burnout.data.loader import TokenLoader
from burnout.errors import BurnoutError
from burnout.models import Transformer
from burnout.runs import resume_training, start_training
from burnout.train.metrics import TIMING_KEYS, read_metrics
from burnout.train.optim import make_optimizer
from burnout.train.schedule import lr_at
from burnout.train.step import accumulate_gradients

CPU = torch.device("cpu")


def _quiet(line):
    pass


# ----------------------------------------------------------------------------------------------
# A whole run


def test_loss_falls_and_beats_a_uniform_guess(tiny_run):
    records = read_metrics(tiny_run.run_dir)
    first, last = records[0]["train_loss"], records[-1]["train_loss"]
    vocab = tiny_run.cfg.model.vocab_size
    # An untrained model scores about ln(vocab) = 6.24; 24 steps at lr 3e-3 get well below that.
    assert first > math.log(vocab) - 0.5
    assert last < first - 0.5, (first, last)
    assert tiny_run.result.val_loss < math.log(vocab) - 0.5
    assert tiny_run.result.step == tiny_run.cfg.train.max_steps
    assert tiny_run.result.train_loss == records[-1]["train_loss"]
    assert tiny_run.result.val_loss == records[-1]["val_loss"]


def test_metrics_has_one_record_per_logged_step(tiny_run):
    tc = tiny_run.cfg.train
    records = read_metrics(tiny_run.run_dir)
    assert [r["step"] for r in records] == list(range(tc.log_interval, tc.max_steps + 1, tc.log_interval))
    tokens_per_step = tc.batch_size * tc.grad_accum * tc.seq_len
    assert tokens_per_step == 4 * 2 * 32
    for r in records:
        assert {"step", "tokens", "train_loss", "lr", "grad_norm", "tokens_per_s", "elapsed_s"} <= r.keys()
        assert r["tokens"] == r["step"] * tokens_per_step
        # The lr logged at step s is the one its update used: lr_at(s - 1).
        assert r["lr"] == pytest.approx(lr_at(r["step"] - 1, tc))
        assert math.isfinite(r["train_loss"]) and r["grad_norm"] > 0 and r["tokens_per_s"] > 0
        is_eval = r["step"] % tc.eval_interval == 0 or r["step"] == tc.max_steps
        assert ("val_loss" in r) == is_eval, r
        if is_eval:
            assert 0 < r["val_loss"] < 7
    elapsed = [r["elapsed_s"] for r in records]
    assert elapsed == sorted(elapsed)


def test_config_yaml_is_the_resolved_config_with_the_data_folder(tiny_run):
    saved = load_run_config(tiny_run.run_dir / "config.yaml")
    assert saved.data.prepared_dir == str(tiny_run.data_dir.resolve())
    expected = dataclasses.replace(
        tiny_run.cfg, data=dataclasses.replace(tiny_run.cfg.data, prepared_dir=str(tiny_run.data_dir.resolve()))
    )
    assert saved == expected
    # Every family-dependent default is explicit in the file.
    assert saved.model.n_kv_head == 2 and saved.model.bias is False and saved.model.ffn_hidden is not None


def test_checkpoints_at_every_interval_and_the_end(tiny_run):
    steps = [int(p.name.removeprefix("step_")) for p in list_checkpoints(tiny_run.run_dir)]
    assert steps == [6, 12, 18, 24]
    assert tiny_run.result.checkpoint == list_checkpoints(tiny_run.run_dir)[-1]
    info = json.loads((tiny_run.result.checkpoint / "info.json").read_text())
    assert info["step"] == 24 and info["tokens"] == 24 * 4 * 2 * 32
    assert any("saved" in line for line in tiny_run.events)


# ----------------------------------------------------------------------------------------------
# Resume


def _metrics_without_timing(run_dir: Path) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if k not in TIMING_KEYS} for line in lines]


def _copy_run(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_resume_reproduces_the_uninterrupted_run_bitwise(tiny_run, tmp_path):
    run_b = _copy_run(tiny_run.run_dir, tmp_path / "b")
    # A crash after step 12: the later checkpoints never happened, but metrics.jsonl kept its lines.
    for step in (18, 24):
        shutil.rmtree(run_b / "checkpoints" / f"step_{step:07d}")
    events: list[str] = []
    result = resume_training(run_b, [], on_event=events.append, progress=False)
    assert any("resumed" in line and "step 12" in line for line in events)
    assert result.step == 24

    for step in (18, 24):
        name = f"checkpoints/step_{step:07d}/model.safetensors"
        a = safetensors.torch.load_file(tiny_run.run_dir / name)
        b = safetensors.torch.load_file(run_b / name)
        assert a.keys() == b.keys()
        for key in a:
            assert torch.equal(a[key], b[key]), key
    assert _metrics_without_timing(run_b) == _metrics_without_timing(tiny_run.run_dir)


def test_resume_of_a_finished_run_does_nothing(tiny_run, tmp_path):
    run_b = _copy_run(tiny_run.run_dir, tmp_path / "b")
    before = (run_b / "metrics.jsonl").read_bytes()
    result = resume_training(run_b, [], on_event=_quiet, progress=False)
    assert result.step == 24 and result.checkpoint == run_b / "checkpoints" / "step_0000024"
    assert (run_b / "metrics.jsonl").read_bytes() == before


def test_refuses_to_train_into_a_folder_that_holds_a_run(tiny_run):
    before = (tiny_run.run_dir / "metrics.jsonl").read_bytes()
    with pytest.raises(BurnoutError, match="already holds a run"):
        start_training(tiny_run.cfg, tiny_run.run_dir, data_dir=tiny_run.data_dir, on_event=_quiet, progress=False)
    assert (tiny_run.run_dir / "metrics.jsonl").read_bytes() == before


def test_refuses_to_resume_without_a_config_and_restarts_without_a_checkpoint(tiny_run, tmp_path):
    with pytest.raises(BurnoutError, match="config.yaml"):
        resume_training(tmp_path, [], on_event=_quiet, progress=False)
    # A run killed before its first checkpoint: --resume starts it again from step 0.
    (tmp_path / "config.yaml").write_bytes((tiny_run.run_dir / "config.yaml").read_bytes())
    (tmp_path / "metrics.jsonl").write_text('{"step": 2, "tokens": 256, "train_loss": 9.0, "elapsed_s": 0.5}\n')
    events = []
    result = resume_training(tmp_path, ["train.max_steps=2"], on_event=events.append, progress=False)
    assert any("no checkpoint yet: starting it again from step 0" in line for line in events)
    assert result.step == 2 and [r["step"] for r in read_metrics(tmp_path)] == [2]
    assert read_metrics(tmp_path)[0]["train_loss"] != 9.0


@pytest.mark.parametrize("override, key", [
    ("model.n_layer=3", "model"),
    ("train.batch_size=8", "train.batch_size"),
    ("train.grad_accum=1", "train.grad_accum"),
    ("train.seed=1", "train.seed"),
    ("train.seq_len=16", "train.seq_len"),
    ("data.max_chars=1000", "data"),
    # The override syntax accepts leading dashes and whole sections; the check must see through both.
    ("--train.batch_size=8", "train.batch_size"),
    ("train={batch_size: 8, max_steps: 30}", "train.batch_size"),
    ("model={preset: llama-tiny}", "model"),
    ("train.optimizer=muon", "train.optimizer"),
])
def test_resume_refuses_overrides_that_change_model_or_batches(tiny_run, tmp_path, override, key):
    run_b = _copy_run(tiny_run.run_dir, tmp_path / "b")
    shutil.rmtree(run_b / "checkpoints" / "step_0000024")
    before = {name: (run_b / name).read_bytes() for name in ("metrics.jsonl", "config.yaml")}
    with pytest.raises(BurnoutError, match=f"'{key}' cannot change"):
        resume_training(run_b, [override], on_event=_quiet, progress=False)
    assert {name: (run_b / name).read_bytes() for name in before} == before
    assert not (run_b / "checkpoints" / "step_0000024").exists()


def test_resume_accepts_a_longer_run(tiny_run, tmp_path):
    run_b = _copy_run(tiny_run.run_dir, tmp_path / "b")
    result = resume_training(run_b, ["train.max_steps=26"], on_event=_quiet, progress=False)
    assert result.step == 26
    steps = [r["step"] for r in read_metrics(run_b)]
    assert steps == list(range(2, 27, 2))
    assert load_run_config(run_b / "config.yaml").train.max_steps == 26


# ----------------------------------------------------------------------------------------------
# Pieces


def test_lr_schedule_warmup_then_cosine_to_min_lr():
    tc = TrainConfig(max_steps=100, optim=OptimConfig(lr=1e-3, min_lr=1e-4, warmup_steps=10))
    for step in range(10):
        assert lr_at(step, tc) == pytest.approx(1e-3 * (step + 1) / 10)
    assert lr_at(9, tc) == pytest.approx(1e-3)
    assert lr_at(10, tc) == pytest.approx(1e-3)
    assert lr_at(55, tc) == pytest.approx((1e-3 + 1e-4) / 2)  # half way through the decay
    assert lr_at(100, tc) == pytest.approx(1e-4)
    assert lr_at(150, tc) == pytest.approx(1e-4)  # flat past max_steps
    after = [lr_at(s, tc) for s in range(10, 101)]
    assert all(a > b for a, b in zip(after, after[1:]))
    no_warmup = TrainConfig(max_steps=10, optim=OptimConfig(lr=1e-3, min_lr=0.0, warmup_steps=0))
    assert lr_at(0, no_warmup) == pytest.approx(1e-3)
    assert lr_at(10, no_warmup) == pytest.approx(0.0)


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_weight_decay_on_matrices_only(tiny_run_config, family):
    over = ["model.family=gpt2", "model.n_kv_head=null"] if family == "gpt2" else []
    cfg = tiny_run_config(over, weight_decay=0.1)
    model = Transformer(cfg.model)
    decayed, plain = make_optimizer(model, cfg.train).param_groups
    assert decayed["weight_decay"] == 0.1 and plain["weight_decay"] == 0.0
    ids = {name: id(p) for name, p in model.named_parameters()}  # tied weights listed once
    decayed_ids = {id(p) for p in decayed["params"]}
    plain_ids = {id(p) for p in plain["params"]}
    assert len(decayed["params"]) + len(plain["params"]) == len(ids) == len(decayed_ids | plain_ids)
    for name, pid in ids.items():
        is_norm_or_bias = name.endswith("bias") or "norm" in name
        assert (pid in plain_ids) == is_norm_or_bias, name
    assert id(model.tok_emb.weight) in decayed_ids
    assert any(name.endswith("bias") for name in ids) == (family == "gpt2")


def test_gradient_accumulation_equals_one_big_batch(tiny_run_config, tiny_bpe_data):
    cfg = tiny_run_config()
    loader = TokenLoader(tiny_bpe_data, "train", batch_size=4, seq_len=32, seed=0)
    torch.manual_seed(0)
    model = Transformer(cfg.model)
    twin = copy.deepcopy(model)

    loss, positions = accumulate_gradients(model, loader, step=3, grad_accum=2, device=CPU, precision="fp32")
    # Step 3 with accumulation 2 is micro-batches 6 and 7.
    (x0, y0), (x1, y1) = loader.get_batch(6), loader.get_batch(7)
    big_loss = twin(torch.cat([x0, x1]), torch.cat([y0, y1]))
    big_loss.backward()

    assert loss.item() == pytest.approx(big_loss.item(), rel=1e-5)
    assert positions == x0.numel() + x1.numel()
    for (name, p), q in zip(model.named_parameters(), twin.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6, msg=name)


def test_evaluations_happen_at_their_interval_even_between_log_lines(tiny_run_config, tiny_bpe_data, tmp_path):
    cfg = tiny_run_config(max_steps=9, log_interval=4, eval_interval=3, ckpt_interval=9)
    start_training(cfg, tmp_path / "run", data_dir=tiny_bpe_data, on_event=lambda line: None, progress=False)
    records = read_metrics(tmp_path / "run")
    assert [r["step"] for r in records] == [3, 4, 6, 8, 9]
    assert [r["step"] for r in records if "val_loss" in r] == [3, 6, 9]


# ----------------------------------------------------------------------------------------------
# Muon beside AdamW


@pytest.mark.parametrize("family, tie", [("llama", True), ("llama", False), ("gpt2", True)])
def test_muon_takes_the_blocks_matrices_and_adamw_the_rest(tiny_run_config, family, tie):
    over = [f"model.tie_embeddings={str(tie).lower()}"]
    over += ["model.family=gpt2", "model.n_kv_head=null"] if family == "gpt2" else []
    cfg = tiny_run_config(over, optimizer="muon", muon_lr=0.05, weight_decay=0.1)
    model = Transformer(cfg.model)
    muon, adamw = make_optimizer(model, cfg.train).optimizers
    assert isinstance(muon, torch.optim.Muon) and isinstance(adamw, torch.optim.AdamW)
    (matrices,) = muon.param_groups
    decayed, plain = adamw.param_groups
    assert (matrices["lr"], decayed["lr"], plain["lr"]) == (0.05, cfg.train.lr, cfg.train.lr)
    assert (matrices["weight_decay"], decayed["weight_decay"], plain["weight_decay"]) == (0.1, 0.1, 0.0)
    group_of = {}
    for group_name, group in (("muon", matrices), ("decayed", decayed), ("plain", plain)):
        for p in group["params"]:
            assert id(p) not in group_of, group_name  # each parameter in one group only
            group_of[id(p)] = group_name
    named = dict(model.named_parameters())  # tied weights listed once
    assert len(group_of) == len(named)
    by_group = {g: {name for name, p in named.items() if group_of[id(p)] == g} for g in ("muon", "decayed", "plain")}
    projections = ("attn.qkv", "attn.proj", "mlp.fc", "mlp.proj") if family == "gpt2" else (
        "attn.qkv", "attn.proj", "mlp.gate", "mlp.up", "mlp.down")
    assert by_group["muon"] == {f"blocks.{i}.{m}.weight" for i in range(cfg.model.n_layer) for m in projections}
    assert by_group["decayed"] == ({"tok_emb.weight"} | ({"lm_head.weight"} if not tie else set())
                                   | ({"pos_emb.weight"} if family == "gpt2" else set()))
    assert all(name.endswith("bias") or "norm" in name for name in by_group["plain"])


def test_the_schedule_scales_each_optimizers_own_peak_lr(tiny_run_config):
    cfg = tiny_run_config(optimizer="muon", lr=3e-3, muon_lr=0.05, warmup_steps=4)
    optimizer = make_optimizer(Transformer(cfg.model), cfg.train)
    optimizer.scale_lr(lr_at(0, cfg.train) / cfg.train.lr)  # a quarter of the way up the warmup
    assert [g["lr"] for g in optimizer.param_groups] == pytest.approx([0.05 / 4, 3e-3 / 4, 3e-3 / 4])
    # A checkpoint's LRs (whatever the schedule had set) do not replace the peaks the config gives.
    fresh = make_optimizer(Transformer(cfg.model), cfg.train)
    fresh.load_state_dict(optimizer.state_dict())
    fresh.scale_lr(1.0)
    assert [g["lr"] for g in fresh.param_groups] == pytest.approx([0.05, 3e-3, 3e-3])


def test_an_adamw_state_saved_before_the_optimizer_choice_still_loads(tiny_run_config):
    cfg = tiny_run_config()
    model = Transformer(cfg.model)
    params = list(model.parameters())  # the groups the loop's AdamW has always had
    old = torch.optim.AdamW([{"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.train.weight_decay},
                             {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}], lr=cfg.train.lr)
    x = torch.randint(0, cfg.model.vocab_size, (2, 16))
    model(x, x).backward()
    old.step()
    fresh = make_optimizer(model, cfg.train)
    fresh.load_state_dict(old.state_dict())  # a single dict, as checkpoints held it
    (adamw,) = fresh.optimizers
    assert torch.equal(adamw.state[model.tok_emb.weight]["exp_avg"], old.state[model.tok_emb.weight]["exp_avg"])


@pytest.fixture(scope="module")
def muon_run(tiny_run_config, tiny_bpe_data, tmp_path_factory) -> Path:
    """24 steps of the tiny llama with Muon, checkpoints at 12 and 24."""
    cfg = tiny_run_config(optimizer="muon", muon_lr=0.05, max_steps=24, ckpt_interval=12)
    run_dir = tmp_path_factory.mktemp("muon_run") / "run"
    start_training(cfg, run_dir, data_dir=tiny_bpe_data, on_event=_quiet, progress=False)
    return run_dir


def test_muon_lowers_the_loss(muon_run):
    records = read_metrics(muon_run)
    assert records[-1]["step"] == 24
    assert records[-1]["train_loss"] < records[0]["train_loss"] - 0.5, records
    assert records[-1]["val_loss"] < math.log(512) - 0.5


def _resumes_bitwise_after_step_12(run_dir: Path, tmp_path: Path) -> Path:
    """A copy of the 24-step `run_dir` that crashed after step 12, resumed: the same weights and metrics."""
    run_b = _copy_run(run_dir, tmp_path / "b")
    shutil.rmtree(run_b / "checkpoints" / "step_0000024")  # a crash after step 12
    result = resume_training(run_b, [], on_event=_quiet, progress=False)
    assert result.step == 24
    name = "checkpoints/step_0000024/model.safetensors"
    a, b = safetensors.torch.load_file(run_dir / name), safetensors.torch.load_file(run_b / name)
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key
    assert _metrics_without_timing(run_b) == _metrics_without_timing(run_dir)
    return run_b


def test_a_muon_run_resumes_bitwise(muon_run, tmp_path):
    run_b = _resumes_bitwise_after_step_12(muon_run, tmp_path)
    muon_state, adamw_state = torch.load(run_b / "checkpoints/step_0000024/state.pt", weights_only=True)["optimizer"]
    assert all("momentum_buffer" in s for s in muon_state["state"].values())
    assert all("exp_avg" in s for s in adamw_state["state"].values())


@pytest.fixture(scope="module")
def adamw8bit_run(tiny_run_config, tiny_bpe_data, tmp_path_factory) -> Path:
    """24 steps of the tiny llama with torchao's 8-bit AdamW, checkpoints at 12 and 24."""
    cfg = tiny_run_config(optimizer="adamw8bit", max_steps=24, ckpt_interval=12)
    run_dir = tmp_path_factory.mktemp("adamw8bit_run") / "run"
    start_training(cfg, run_dir, data_dir=tiny_bpe_data, on_event=_quiet, progress=False)
    return run_dir


@pytest.mark.slow
def test_an_adamw8bit_run_follows_the_schedule_and_resumes_bitwise(adamw8bit_run, tmp_path):
    records = read_metrics(adamw8bit_run)
    tc = load_run_config(adamw8bit_run / "config.yaml").train
    assert [r["lr"] for r in records] == pytest.approx([lr_at(r["step"] - 1, tc) for r in records])
    assert records[-1]["train_loss"] < records[0]["train_loss"] - 0.5, records
    _resumes_bitwise_after_step_12(adamw8bit_run, tmp_path)


@pytest.mark.slow
def test_an_adamw8bit_checkpoint_loads_in_a_new_process(adamw8bit_run):
    """state.pt holds torchao's quantized moments, which torch.load(weights_only=True) builds only once torchao is
    imported: a command that loads the checkpoint in a fresh interpreter reads it."""
    (adamw,) = torch.load(adamw8bit_run / "checkpoints/step_0000024/state.pt", weights_only=True)["optimizer"]
    assert {type(s["exp_avg"]).__name__ for s in adamw["state"].values()} == {"OptimState8bit", "Tensor"}
    proc = subprocess.run([sys.executable, "-m", "burnout", "generate", str(adamw8bit_run), "--prompt", "The ",
                           "--max-new-tokens", "4"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.mark.slow
def test_muon_under_fp16_steps_through_the_grad_scaler(tiny_run_config, tiny_bpe_data, tmp_path):
    cfg = tiny_run_config(optimizer="muon", precision="fp16", max_steps=4, ckpt_interval=4)
    result = start_training(cfg, tmp_path / "run", data_dir=tiny_bpe_data, on_event=_quiet, progress=False)
    assert result.step == 4 and math.isfinite(result.val_loss)
    assert "scaler" in torch.load(result.checkpoint / "state.pt", weights_only=True)


def test_the_packed_weights_of_a_sample_are_freed_before_training_goes_on(tiny_run_config, tiny_bpe_data, tmp_path,
                                                                          monkeypatch):
    """A sample's generation may keep packed copies of the weights (burnout/models/cpu_paths.py: linear), as much
    memory again as the model's linear layers; the loop frees them after each sample (red without that line)."""
    from burnout.models.cpu_paths import forget_packed_weights
    from burnout.train import loop

    freed = []
    monkeypatch.setattr(loop, "forget_packed_weights", lambda model: (freed.append(model),
                                                                     forget_packed_weights(model)))
    cfg = tiny_run_config(max_steps=4, eval_interval=2, sample_prompt="The ", sample_tokens=4)
    start_training(cfg, tmp_path / "run", data_dir=tiny_bpe_data, on_event=lambda line: None, progress=False)
    samples = [r["step"] for r in read_metrics(tmp_path / "run") if "sample" in r]
    assert samples == [2, 4] and len(freed) == 2 and all(isinstance(m, Transformer) for m in freed)


def test_without_a_sample_prompt_a_run_samples_words_of_its_val_split_recorded_and_kept_on_resume(
        tiny_run_config, tiny_bpe_data, tmp_path):
    """No train.sample_prompt: the run's prompts are drawn from its own val split (seeded), recorded in
    RUN/sample_prompts.json, said in a line, and the first is what each evaluation samples; a resume reads the record
    (here changed by hand) rather than drawing again."""
    from burnout.base.files import SAMPLE_PROMPTS_FILE
    from burnout.data.tokenizer import load_tokenizer
    from burnout.generate.prompts import RUN_PROMPTS, data_prompts, sample_prompts, write_sample_prompts

    cfg = tiny_run_config(max_steps=4, eval_interval=2, sample_tokens=8)
    run, events = tmp_path / "run", []
    start_training(cfg, run, data_dir=tiny_bpe_data, on_event=events.append, progress=False)
    drawn = data_prompts(tiny_bpe_data, cfg.train.seed, load_tokenizer(tiny_bpe_data / "tokenizer.json"),
                         cfg.model.context_length)
    assert len(drawn) == RUN_PROMPTS
    record = json.loads((run / SAMPLE_PROMPTS_FILE).read_text())
    assert record == {"prompts": drawn, "from": "the val split's documents"}
    assert sample_prompts(run) == drawn
    assert f"sample prompts, from the val split's documents ({SAMPLE_PROMPTS_FILE}): " \
           + ", ".join(map(json.dumps, drawn)) in events
    samples = [r for r in read_metrics(run) if "sample" in r]
    assert [r["step"] for r in samples] == [2, 4]
    assert all(r["sample_prompt"] == drawn[0] and r["sample"].startswith(drawn[0]) for r in samples)
    lines = [e for e in events if e.startswith("step 2 sample: ")]
    assert lines == [f"step 2 sample: {json.dumps(samples[0]['sample'])}"]

    write_sample_prompts(run, ["Hand written words to go on"], "the val split's documents")
    resume_training(run, ["train.max_steps=6"], on_event=_quiet, progress=False)
    last = [r for r in read_metrics(run) if "sample" in r][-1]
    assert last["step"] == 6 and last["sample"].startswith("Hand written words to go on")


def test_an_empty_sample_is_said_so_in_its_line(mute_run):
    """A model that ends the text at once: each sample's line says so after its prompt, the record keeps the text."""
    from burnout.generate.prompts import sample_prompts

    run, events = mute_run
    prompt = sample_prompts(run)[0]
    records = [r for r in read_metrics(run) if "sample" in r]
    assert [(r["step"], r["sample"]) for r in records] == [(1, prompt), (2, prompt)]
    for step in (1, 2):
        assert f"step {step} sample: {json.dumps(prompt)} (empty: the model ended the text at once)" in events
