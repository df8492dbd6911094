"""Supervised fine-tuning on the training engine (burnout/finetune/): the base's weights grown for the chat
tokens, loss on assistant tokens only (their gradient alone), exact per-token averaging, LoRA runs, adapters
merged into a plain checkpoint, bitwise resume after SIGKILL, and one clear line for bad input."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import safetensors.torch
import torch

from burnout.cli import main
from burnout.config import load_run_config, load_saved_config
from burnout.core.chat_template import IM_END, IM_START
from burnout.core.checkpoint import list_checkpoints
from burnout.core.model_files import load_model
from burnout.errors import BurnoutError
from burnout.eval.loss import evaluate_loss
from burnout.finetune.recipes import init_from_base, load_base
from burnout.finetune.tokenized import SFTBatches
from burnout.runs import resume_training, start_training
from burnout.train.metrics import StepLogger
from burnout.train.step import accumulate_gradients, build_model, target_weights

CPU = torch.device("cpu")
REPO = Path(__file__).resolve().parents[2]
SFT_TRAIN = {"device": "cpu", "precision": "fp32", "batch_size": 4, "seq_len": 64, "max_steps": 12, "lr": 3e-3,
             "min_lr": 3e-4, "warmup_steps": 2, "log_interval": 2, "eval_interval": 6, "eval_batches": 2,
             "ckpt_interval": 2, "keep_last": 20}


def _quiet(line):
    pass


@pytest.fixture(scope="module")
def base_run(tiny_run_config, tiny_bpe_data, tmp_path_factory) -> Path:
    """A tiny pretrained llama (512-token BPE, no chat tokens), 6 steps."""
    run = tmp_path_factory.mktemp("sft") / "base"
    start_training(tiny_run_config(max_steps=6), run, data_dir=tiny_bpe_data, on_event=_quiet, progress=False)
    return run


@pytest.fixture(scope="module")
def conversations(tmp_path_factory) -> Path:
    """40 short chats in the messages layout, a system turn in every other one."""
    path = tmp_path_factory.mktemp("chats") / "chats.jsonl"
    lines = []
    for i in range(40):
        messages = [{"role": "user", "content": f"What is {i} plus {i % 7}?"},
                    {"role": "assistant", "content": f"It is {i + i % 7}."}]
        if i % 2:
            messages.insert(0, {"role": "system", "content": "Answer briefly."})
        lines.append(json.dumps({"messages": messages}))
    path.write_text("\n".join(lines) + "\n")
    return path


def _sft_config(base: Path, data: Path, lora: dict | None = None, **train):
    raw = {"train": {**SFT_TRAIN, **train}, "sft": {"base": str(base), "source": str(data), "val_fraction": 0.1}}
    if lora is not None:
        raw["sft"]["lora"] = lora
    return load_run_config(raw)


@pytest.fixture(scope="module")
def full_run(base_run, conversations, tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("sft") / "full"
    events: list[str] = []
    start_training(_sft_config(base_run, conversations), run, on_event=events.append, progress=False)
    (run / "events.txt").write_text("\n".join(events))
    return run


@pytest.fixture(scope="module")
def lora_run(base_run, conversations, tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("sft") / "lora"
    events: list[str] = []
    start_training(_sft_config(base_run, conversations, lora={"r": 4, "alpha": 8, "targets": ["attn", "mlp"]}), run,
                   on_event=events.append, progress=False)
    (run / "events.txt").write_text("\n".join(events))
    return run


# ----------------------------------------------------------------------------------------------
# Full fine-tuning


def test_full_sft_adds_the_chat_tokens_grows_the_model_and_records_it(base_run, full_run):
    events = (full_run / "events.txt").read_text()
    assert f"added {IM_START}, {IM_END}" in events and "512 → 514" in events
    assert "trainable parameters" in events and "examples read" in events
    cfg = load_saved_config(full_run / "config.yaml")
    assert cfg.sft is not None and cfg.sft.added_tokens == [IM_START, IM_END]
    assert cfg.model.vocab_size == 514
    model, tokenizer, ckpt = load_model(full_run)
    assert ckpt.config.sft is not None  # a chat model
    assert tokenizer.token_to_id(IM_END) == 513 and model.cfg.vocab_size == 514
    metrics = [json.loads(line) for line in (full_run / "metrics.jsonl").read_text().splitlines()]
    assert metrics[-1]["step"] == 12 and metrics[-1]["val_loss"] < metrics[0]["train_loss"]


def test_step_0_of_a_fine_tune_is_the_base_with_its_new_rows_at_the_mean(base_run, full_run):
    base, _, _ = load_model(base_run)
    cfg = load_saved_config(full_run / "config.yaml")
    model = build_model(cfg, CPU)
    init_from_base(model, cfg)
    got, want = model.state_dict(), base.state_dict()
    for key, value in want.items():
        if key == "tok_emb.weight" or key == "lm_head.weight":
            assert torch.equal(got[key][:512], value)
            assert torch.equal(got[key][512], value.mean(0)) and torch.equal(got[key][513], value.mean(0))
        else:
            assert torch.equal(got[key], value), key


# ----------------------------------------------------------------------------------------------
# Loss masking


def test_targets_are_the_assistant_tokens_and_their_gradient_alone_flows(full_run):
    cfg = load_saved_config(full_run / "config.yaml")
    batches = SFTBatches(full_run / "data", "train", 4, 64, 0)
    _, tokenizer, _ = load_model(full_run)
    x, y = batches.get_batch(0)
    for row in range(len(x)):
        targets = tokenizer.decode([int(t) for t in y[row][y[row] != -1]], skip_special_tokens=False)
        assert targets.startswith("It is ") and targets.endswith(IM_END), targets  # the answer and its end
    model = build_model(cfg, CPU)
    hidden = {}

    def keep(module, args, out):  # the final norm's output: the only input of the head and the loss
        out.retain_grad()
        hidden["h"] = out

    model.norm.register_forward_hook(keep)
    model(x, y).backward()
    grad = hidden["h"].grad
    masked = y == -1
    assert masked.any() and (~masked).any()
    assert torch.count_nonzero(grad[masked]) == 0  # system, user, headers, padding: exactly zero
    assert torch.count_nonzero(grad[~masked].abs().sum(-1)) == int((~masked).sum())


class _MeanTarget(torch.nn.Module):
    """A 'model' whose loss is the mean of its targets, so a token-weighted mean is easy to know."""

    def forward(self, x, y):
        return y[y != -1].float().mean()


class _Loader:
    def __init__(self, batches):
        self.batches = batches

    def iter_eval_batches(self, n):
        return iter(self.batches[:n])

    def get_batch(self, i):
        return self.batches[i]


def _masked(values: list[list[int]]):
    y = torch.tensor(values)
    return torch.zeros_like(y), y


def test_val_loss_weighs_each_batch_by_its_targets():
    batches = [_masked([[1, -1, -1, -1]]), _masked([[3, 3, 3, -1]])]
    # targets 1, 3, 3, 3: per-target mean 2.5 (per-batch-element weighting would give 1·4 + 3·4 over 8 = 2)
    assert evaluate_loss(_MeanTarget(), _Loader(batches), 2, CPU) == pytest.approx(2.5)


def test_micro_batches_average_per_target_token(tiny_run_config):
    assert target_weights([_masked([[1, 2]])[1], _masked([[3, 4]])[1]]) is None  # pretraining: plain 1/A
    assert target_weights([_masked([[1, -1, -1]])[1], _masked([[1, 1, 1]])[1]]) == [0.25, 0.75]
    torch.manual_seed(0)
    model = build_model(tiny_run_config(), CPU)
    x = torch.randint(0, 512, (2, 16))
    y = x.roll(-1, 1).clone()
    y[0, :12] = -1  # 4 targets in row 0, 16 in row 1
    accumulate_gradients(model, _Loader([(x, y)]), 0, 1, CPU, "fp32")
    one_batch = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    accumulate_gradients(model, _Loader([(x[:1], y[:1]), (x[1:], y[1:])]), 0, 2, CPU, "fp32")
    for a, b in zip(one_batch, (p.grad for p in model.parameters())):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


def test_narrow_batches_count_the_positions_they_computed(tiny_run_config, tmp_path):
    """With sft.pad_to_longest a batch is narrower than seq_len: tokens/s and MFU count the positions the
    step computed, and the ETA comes from seconds per step, not from batch × seq_len over that rate."""
    model = build_model(tiny_run_config(), CPU)
    x = torch.randint(0, 512, (2, 16))
    _, positions = accumulate_gradients(model, _Loader([(x, x), (x[:1, :8], x[:1, :8])]), 0, 2, CPU, "fp32")
    assert positions == 2 * 16 + 8
    tc = tiny_run_config().train
    logger = StepLogger(tmp_path, tc, tokens_per_step=4 * 64, flops_per_token=6.0, peak_flops=1e3, price=None,
                        stop_at=10, bar=None, emit=_quiet)
    for seconds, computed in ((9.0, 256), (2.0, 100), (2.0, 60)):  # the first step is compile's, left out
        logger.count(seconds, computed)
    record = logger.record(3, 1.0, 1e-3, 1.0, elapsed=13.0, skipped=0)
    logger.close()
    assert record["tokens_per_s"] == 40.0 and record["mfu"] == pytest.approx(40 * 6.0 / 1e3)
    assert record["eta_s"] == 7 * 2.0


def test_compare_puts_the_base_beside_the_fine_tune_and_asks_the_chat_model_in_its_template(base_run, full_run,
                                                                                             tmp_path):
    from burnout.generate.chat import chat_replies
    from burnout.generate.sampling import generate_texts

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("What is 3 plus 3?\nThe \n")
    assert main(["compare", str(full_run), "--prompts", str(prompts), "--checkpoints", "12", "--max-new-tokens", "6",
                 "--device", "cpu"]) == 0
    saved = json.loads((full_run / "compare.json").read_text())
    assert [(r["checkpoint"], r["step"], r["chat"]) for r in saved["rows"]] == [("base", 6, False),
                                                                              ("step_0000012", 12, True)]
    model, tokenizer, _ = load_model(full_run / "checkpoints" / "step_0000012")
    assert saved["rows"][1]["continuations"] == chat_replies(model, tokenizer, saved["prompts"], 6, temperature=0.8,
                                                             top_k=50, seed=0)
    base, base_tokenizer, _ = load_model(base_run)
    texts = generate_texts(base, base_tokenizer, saved["prompts"], 6, temperature=0.8, top_k=50, seed=0)
    assert saved["rows"][0]["continuations"] == [t[len(p):] for p, t in zip(saved["prompts"], texts)]
    assert "| base | 6 |" in (full_run / "compare.md").read_text()


def test_the_report_says_what_a_fine_tune_started_from_and_what_its_loss_counts(base_run, lora_run):
    from burnout.report.render import run_blocks
    from burnout.report.runlog import load_run

    _, blocks = run_blocks(load_run(lora_run), log_scale=False)
    at = next(i for i, b in enumerate(blocks) if b.kind == "h2" and b.text == "Fine-tuning")
    about = dict(blocks[at + 1].rows)
    assert about["kind"] == "SFT, LoRA r=4 alpha=8 on attn, mlp (base frozen)"
    assert about["loss"] == "on assistant tokens only"
    assert about["tokens added to the base"] == "`<|im_start|>`, `<|im_end|>`"
    assert str(list_checkpoints(base_run)[-1].resolve()) in about["started from"]


# ----------------------------------------------------------------------------------------------
# LoRA


def test_lora_trains_the_adapters_and_the_added_rows_and_saves_them_beside_the_checkpoints(base_run, lora_run):
    """Base frozen but for the embedding rows of the chat tokens the run added (ids 512, 513): frozen at the
    mean, their logit could never win (tests/train/test_lora_new_tokens.py)."""
    events = (lora_run / "events.txt").read_text()
    line = next(e for e in events.splitlines() if e.startswith("trainable parameters"))
    assert "for full fine-tuning" in line
    final = safetensors.torch.load_file(list_checkpoints(lora_run)[-1] / "model.safetensors")
    assert any(k.endswith(".lora_B") for k in final)
    start = build_model(load_saved_config(lora_run / "config.yaml"), CPU)
    init_from_base(start, load_saved_config(lora_run / "config.yaml"))
    for key, value in start.state_dict().items():
        if key in ("tok_emb.weight", "lm_head.weight") and key in final:  # tied: saved under one name
            assert torch.equal(final[key][:512], value[:512]) and not torch.equal(final[key][512:], value[512:])
        elif key in final:
            trained = key.endswith((".lora_A", ".lora_B"))
            assert torch.equal(final[key], value) is not trained, key  # base frozen, adapters trained
    adapter = safetensors.torch.load_file(lora_run / "adapter" / "adapter.safetensors")
    assert adapter.keys() == {k for k in final if k.endswith((".lora_A", ".lora_B"))} | {"tok_emb.weight.rows"}
    assert json.loads((lora_run / "adapter" / "adapter_config.json").read_text())["r"] == 4


def test_lora_merge_writes_a_plain_chat_checkpoint_with_the_same_outputs(lora_run, tmp_path):
    assert main(["lora", "merge", str(lora_run), "--out", str(tmp_path / "merged")]) == 0
    lora_model, _, _ = load_model(lora_run)
    merged, tokenizer, ckpt = load_model(tmp_path / "merged")
    assert ckpt.config.sft is not None and ckpt.config.sft.lora is None
    assert not any("lora" in k for k in merged.state_dict())
    idx = torch.randint(0, 514, (2, 20))
    torch.testing.assert_close(merged(idx), lora_model(idx), rtol=1e-4, atol=1e-5)
    # a second merge into the same folder is refused, the first one intact
    before = (list_checkpoints(tmp_path / "merged")[-1] / "sha256.json").read_text()
    assert main(["lora", "merge", str(lora_run), "--out", str(tmp_path / "merged")]) == 2
    assert (list_checkpoints(tmp_path / "merged")[-1] / "sha256.json").read_text() == before


# ----------------------------------------------------------------------------------------------
# Resume after SIGKILL

_KILL_AT_CHECKPOINT = """
import os, signal, sys
def hook(event, args):
    if event == "os.rename" and str(args[1]).endswith("step_0000006"):
        os.kill(os.getpid(), signal.SIGKILL)
sys.addaudithook(hook)
from burnout.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_a_lora_sft_run_killed_mid_way_resumes_to_the_same_weights_bitwise(base_run, conversations, tmp_path):
    args = ["sft", str(base_run), "--data", str(conversations), "--lora", "sft.lora.dropout=0.1",
            "sft.val_fraction=0.1", *(f"train.{k}={v}" for k, v in SFT_TRAIN.items())]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    killed = tmp_path / "killed"
    proc = subprocess.run([sys.executable, "-c", _KILL_AT_CHECKPOINT, *args, "--out", str(killed)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert [p.name for p in list_checkpoints(killed)] == ["step_0000002", "step_0000004"]
    result = resume_training(killed, [], on_event=_quiet, progress=False)
    assert result.step == 12
    whole = tmp_path / "whole"
    proc = subprocess.run([sys.executable, "-m", "burnout", *args, "--out", str(whole)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    a = safetensors.torch.load_file(list_checkpoints(whole)[-1] / "model.safetensors")
    b = safetensors.torch.load_file(list_checkpoints(killed)[-1] / "model.safetensors")
    assert a.keys() == b.keys() and any(k.endswith("lora_A") for k in a)
    for key in a:
        assert torch.equal(a[key], b[key]), key
    assert (whole / "adapter" / "adapter.safetensors").read_bytes() == \
        (killed / "adapter" / "adapter.safetensors").read_bytes()


# ----------------------------------------------------------------------------------------------
# Bad input: one line, exit code 2, nothing overwritten


def _error_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith("burnout: error:") and "\n" not in err, err
    return err


def test_an_unknown_layout_is_one_line(base_run, conversations, tmp_path, capsys):
    assert main(["sft", str(base_run), "--data", str(conversations), "--out", str(tmp_path / "r"),
                 "--layout", "chatty"]) == 2
    assert "layout 'chatty'" in _error_line(capsys)
    assert not list_checkpoints(tmp_path / "r")


def test_a_conversation_without_an_assistant_turn_is_one_line(base_run, tmp_path, capsys):
    data = tmp_path / "bad.jsonl"
    data.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
    assert main(["sft", str(base_run), "--data", str(data), "--out", str(tmp_path / "r")]) == 2
    assert "assistant" in _error_line(capsys)


def test_out_that_holds_a_run_is_refused_and_left_alone(base_run, full_run, conversations, capsys):
    before = {p: p.read_bytes() for p in full_run.rglob("*") if p.is_file()}
    assert main(["sft", str(base_run), "--data", str(conversations), "--out", str(full_run)]) == 2
    assert "already holds a run" in _error_line(capsys)
    assert {p: p.read_bytes() for p in full_run.rglob("*") if p.is_file()} == before


def test_a_base_whose_tokenizer_cannot_be_extended_is_one_line(tiny_run_config, conversations, tmp_path, capsys):
    from burnout.config import TokenizerConfig
    from burnout.core.checkpoint import save_checkpoint
    from burnout.data.tokenizer import train_tokenizer
    from burnout.models import Transformer

    tok_path = tmp_path / "tokenizer.json"
    train_tokenizer(["abc de <|endoftext|>"], TokenizerConfig(kind="char")).save(str(tok_path))
    cfg = tiny_run_config()
    save_checkpoint(tmp_path / "charbase", cfg, Transformer(cfg.model), {"step": 0}, {"step": 0}, tok_path, 1)
    assert main(["sft", str(tmp_path / "charbase"), "--data", str(conversations), "--out", str(tmp_path / "r")]) == 2
    assert "cannot be extended" in _error_line(capsys)
    assert not (tmp_path / "r").exists()


def test_load_base_refuses_a_missing_base(tmp_path):
    with pytest.raises(BurnoutError, match="does not exist"):
        load_base(tmp_path / "nope")
