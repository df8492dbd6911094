"""Shared fixtures for the whole test suite."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:  # the fixtures import burnout when used, so collecting a test imports no torch
    from burnout.config import RunConfig
    from burnout.train.loop import TrainResult

REPO_ROOT = Path(__file__).resolve().parent.parent


def pytest_configure(config):
    """Under CI=true a missing dev extra fails the suite: pytest.importorskip would otherwise skip the HF
    parity and lm-eval equality proofs without a word."""
    if os.environ.get("CI") == "true":
        pytest.importorskip = _import_or_fail


def _import_or_fail(modname: str, minversion: str | None = None, reason: str | None = None, **kwargs):
    import importlib

    try:
        module = importlib.import_module(modname)
    except ImportError as exc:
        pytest.fail(f"{modname} is missing under CI=true ({exc}); the dev extras install it: make .venv/.stamp-dev",
                    pytrace=False)
    if minversion is not None:
        from packaging.version import Version

        if Version(getattr(module, "__version__", "0")) < Version(minversion):
            pytest.fail(f"{modname} {module.__version__} is older than {minversion} under CI=true", pytrace=False)
    return module


@pytest.fixture(scope="session", autouse=True)
def private_cache(tmp_path_factory):
    """Training's CPU precision measurement (train/hardware.py) caches in a folder of the session's own, not
    the user's ~/.cache; subprocesses inherit it."""
    os.environ["BURNOUT_CACHE_DIR"] = str(tmp_path_factory.mktemp("burnout_cache"))


def _missing(message: str) -> None:
    """Something a test needs is absent: CI must have it, so there the test fails; elsewhere it skips."""
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)


class Chromium:
    """Headless Chromium through Playwright, for the tests that drive a page as a person would."""

    PATH = shutil.which("chromium") or "/usr/bin/chromium"
    # No sandbox: CI runs as root in a container; the rest keeps Chromium from calling home.
    ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--no-first-run"]
    ARTIFACTS = REPO_ROOT / "test-artifacts"

    def __init__(self, browser):
        self.browser = browser

    def new_page(self, width: int, height: int):
        return self.browser.new_page(viewport={"width": width, "height": height})

    def keep_screenshot(self, page, name: str) -> Path:
        """The whole page as test-artifacts/NAME, for a person to look at."""
        self.ARTIFACTS.mkdir(exist_ok=True)
        shot = self.ARTIFACTS / name
        page.screenshot(path=str(shot), full_page=True)
        print(f"screenshot: {shot}")
        assert shot.stat().st_size > 10_000, f"{shot} is {shot.stat().st_size} bytes: a blank page?"
        return shot


@pytest.fixture
def chromium():
    """A running Chromium; without one the test skips, and fails under CI=true (.ci/run installs it)."""
    if not Path(Chromium.PATH).is_file():
        _missing(f"Chromium not found at {Chromium.PATH}; install it with `apt-get install -y chromium` (.ci/run does)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=Chromium.PATH, args=Chromium.ARGS)
        try:
            yield Chromium(browser)
        finally:
            browser.close()


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The shared data folder next to the repo (../shared/data); CI must have it, elsewhere tests skip."""
    path = REPO_ROOT.parent / "shared" / "data"
    if not path.is_dir():
        _missing(f"shared data folder {path} is missing")
    return path


@pytest.fixture(scope="session")
def chatml_gpt2(shared_data):
    """GPT-2's byte-level BPE with <|im_start|> and <|im_end|> added (ids 50257 and 50258)."""
    from burnout.core.chat_template import ensure_chat_tokens
    from burnout.data.tokenizer import gpt2_tokenizer

    tok = gpt2_tokenizer(shared_data / "gpt2_tokenizer" / "vocab.json", shared_data / "gpt2_tokenizer" / "merges.txt")
    return ensure_chat_tokens(tok)[0]


@pytest.fixture(scope="session")
def alpaca_chats(shared_data):
    """The conversations of the 5,000-record Alpaca file, as read."""
    from burnout.finetune.conversations import read_conversations

    return list(read_conversations(shared_data / "sft" / "alpaca_5000.json"))


@pytest.fixture(scope="session")
def chatml_bpe(alpaca_chats):
    """A 600-token byte-level BPE trained on Alpaca's messages, with the chat tokens."""
    from burnout.config import TokenizerConfig
    from burnout.core.chat_template import ensure_chat_tokens
    from burnout.data.tokenizer import train_tokenizer

    texts = [m["content"] for c in alpaca_chats[:1500] for m in c.messages]
    return ensure_chat_tokens(train_tokenizer(texts, TokenizerConfig(kind="bpe", vocab_size=600)))[0]


@pytest.fixture(scope="session")
def tiny_bpe_data(tmp_path_factory) -> Path:
    """A small prepared data folder, made once per session: 150k characters of the embedded corpus
    (Python's docs and stdlib source) and a 512-token byte-level BPE."""
    from burnout.config import DataConfig, TokenizerConfig
    from burnout.data.prepare import prepare_data

    out = tmp_path_factory.mktemp("tiny_bpe_data")
    prepare_data(DataConfig(max_chars=150_000), TokenizerConfig(kind="bpe", vocab_size=512), out)
    return out


TINY_MODEL = {"family": "llama", "vocab_size": 512, "n_layer": 2, "d_model": 64, "n_head": 4, "n_kv_head": 2,
              "context_length": 64, "ffn_multiple_of": 32}


@pytest.fixture(scope="session")
def tiny_run_config():
    """Factory: a validated RunConfig for a tiny llama on CPU; `overrides` are `dotted.key=value` strings."""
    from burnout.config import load_run_config

    def make(overrides=(), **train):
        raw = {
            "model": dict(TINY_MODEL),
            "data": {"max_chars": 150_000},
            "tokenizer": {"kind": "bpe", "vocab_size": 512},
            "train": {"device": "cpu", "precision": "fp32", "batch_size": 4, "seq_len": 32, "max_steps": 12,
                      "lr": 3e-3, "min_lr": 3e-4, "warmup_steps": 3, "log_interval": 2, "eval_interval": 4,
                      "eval_batches": 2, "ckpt_interval": 6, "keep_last": 10, **train},
        }
        return load_run_config(raw, list(overrides))

    return make


@pytest.fixture(scope="session")
def sampled_runs(tiny_run_config, tiny_bpe_data, tmp_path_factory) -> list[Path]:
    """Two 24-step runs of the tiny llama that differ only in learning rate (3e-3, 1e-3), each with a
    checkpoint and a logged sample every 8 steps: what reports and the playground read. Do not modify."""
    from burnout.runs import start_training

    root = tmp_path_factory.mktemp("sampled_runs")
    runs = []
    for name, lr in (("fast", 3e-3), ("slow", 1e-3)):
        cfg = tiny_run_config(max_steps=24, lr=lr, min_lr=lr / 10, eval_interval=8, ckpt_interval=8,
                              sample_prompt="The ", sample_tokens=16)
        start_training(cfg, root / name, data_dir=tiny_bpe_data, on_event=lambda line: None, progress=False)
        runs.append(root / name)
    return runs


RUN_STEPS = 24
CKPT_INTERVAL = 6  # tiny_run's


@dataclass
class TinyRun:
    cfg: RunConfig  # the config as passed to start_training
    run_dir: Path
    data_dir: Path
    result: TrainResult
    events: list[str]


@pytest.fixture(scope="session")
def tiny_run(tiny_run_config, tiny_bpe_data, tmp_path_factory) -> TinyRun:
    """24 steps of a 2-layer llama, batch 4 × accumulation 2 × 32 tokens, a checkpoint every 6 steps, all kept.

    Tests must not modify this folder: copy it first.
    """
    cfg = tiny_run_config(max_steps=RUN_STEPS, grad_accum=2, ckpt_interval=CKPT_INTERVAL, keep_last=100)
    run_dir = tmp_path_factory.mktemp("tiny_run") / "run"
    events: list[str] = []
    from burnout.runs import start_training

    result = start_training(cfg, run_dir, data_dir=tiny_bpe_data, on_event=events.append, progress=False)
    return TinyRun(cfg, run_dir, tiny_bpe_data, result, events)


@dataclass
class ChatCheckpoint:
    run_dir: Path  # a run folder with one checkpoint (step 10) of a chat model (its config has an sft section)
    answer: str  # what the model answers any message with, then <|im_end|>
    answer_ids: list[int]


CHAT_ANSWER = "Paris."


@pytest.fixture(scope="session")
def chat_checkpoint(tmp_path_factory) -> ChatCheckpoint:
    """A tiny llama rigged as a bigram model (attention and MLP outputs zeroed, so the last token alone picks
    the next) that answers any templated prompt with CHAT_ANSWER and then <|im_end|>; after <|im_end|> it
    would start the answer again, so only stopping at <|im_end|> ends it early. Do not modify."""
    import torch

    from burnout.config import TokenizerConfig, load_run_config
    from burnout.core.chat_template import IM_END, ensure_chat_tokens
    from burnout.core.checkpoint import save_checkpoint
    from burnout.data.tokenizer import train_tokenizer
    from burnout.models import Transformer

    texts = ["What is the capital of France? Paris. The capital of Italy is Rome. user assistant system\n"] * 20
    tok, _ = ensure_chat_tokens(train_tokenizer(texts, TokenizerConfig(kind="bpe", vocab_size=300)))
    answer_ids = tok.encode(CHAT_ANSWER, add_special_tokens=False).ids
    newline, end = tok.token_to_id("\n") or tok.encode("\n").ids[0], tok.token_to_id(IM_END)
    chain = [newline, *answer_ids, end]
    assert len(set(chain)) == len(chain), "the rig needs distinct tokens"
    cfg = load_run_config({
        "model": {"family": "llama", "vocab_size": tok.get_vocab_size(), "n_layer": 1, "d_model": 64, "n_head": 4,
                  "context_length": 64, "ffn_multiple_of": 32, "tie_embeddings": False},
        "sft": {"base": "runs/base", "source": "conversations.jsonl", "added_tokens": ["<|im_start|>", IM_END]},
    })
    torch.manual_seed(0)
    model = Transformer(cfg.model)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("attn.proj.weight", "mlp.down.weight")) or name == "lm_head.weight":
                p.zero_()
        unit = model.tok_emb.weight / model.tok_emb.weight.pow(2).mean(-1, keepdim=True).sqrt()  # RMS-normed
        for prev, nxt in [*zip(chain, chain[1:]), (end, chain[1])]:
            model.lm_head.weight[nxt] += 40 * unit[prev] / unit[prev].pow(2).sum()
    root = tmp_path_factory.mktemp("chat_checkpoint")
    tok.save(str(root / "tokenizer.json"))
    run_dir = root / "chat"
    save_checkpoint(run_dir, cfg, model, {"step": 10, "tokens": 640}, {"step": 10, "tokens": 640},
                    root / "tokenizer.json", keep_last=1)
    return ChatCheckpoint(run_dir, CHAT_ANSWER, answer_ids)


@dataclass
class FineTuneData:
    chats: Path  # 40 conversations in the messages layout, answers of different lengths
    pairs: Path  # 40 preference pairs: chosen a sentence, rejected its words reversed


@pytest.fixture(scope="session")
def fine_tune_data(tmp_path_factory) -> FineTuneData:
    """SFT and DPO data short enough for chat_checkpoint's 64-token context, and whose target counts differ
    from batch to batch (what a compiled fine-tune must not recompile for)."""
    import json

    root = tmp_path_factory.mktemp("fine_tune_data")
    chats, pairs = root / "chats.jsonl", root / "pairs.jsonl"
    chats.write_text("".join(json.dumps({"messages": [
        {"role": "user", "content": f"Capital {i}?"},
        {"role": "assistant", "content": "Paris" + " is it" * (i % 4) + "."}]}) + "\n" for i in range(40)))
    pairs.write_text("".join(json.dumps({
        "prompt": f"Capital {i}?", "chosen": "It is Paris" + " yes" * (i % 3) + ".",
        "rejected": " ".join(reversed(("It is Paris" + " yes" * (i % 3) + ".").split()))}) + "\n" for i in range(40)))
    return FineTuneData(chats, pairs)


@pytest.fixture(scope="session")
def chat_run(tiny_run, fine_tune_data, tmp_path_factory) -> Path:
    """tiny_run fine-tuned for 6 steps on fine_tune_data.chats: a trained chat model, for DPO to start from
    (unlike chat_checkpoint's rig, whose 40× logits turn rounding into visible loss differences). Do not modify."""
    from burnout.config import load_run_config
    from burnout.runs import start_training

    run = tmp_path_factory.mktemp("chat_run") / "run"
    train = {"device": "cpu", "precision": "fp32", "batch_size": 4, "seq_len": 64, "max_steps": 6, "lr": 3e-3,
             "warmup_steps": 2, "eval_interval": 6, "ckpt_interval": 6}
    cfg = load_run_config({"sft": {"base": str(tiny_run.run_dir), "source": str(fine_tune_data.chats)}, "train": train})
    start_training(cfg, run, on_event=lambda line: None, progress=False)
    return run


@pytest.fixture(scope="session")
def export_label():
    """How an export (its OWNER_FILE, a GGUF file's burnout.source) names the checkpoint it was written from: the run's
    and the checkpoint's folder names and the sha256 of its weights, no path of the machine (an export is published)."""
    import hashlib

    def label(checkpoint: Path) -> str:
        digest = hashlib.sha256((checkpoint / "model.safetensors").read_bytes()).hexdigest()
        return f"{checkpoint.parent.parent.name}/{checkpoint.name} (weights sha256 {digest[:16]})"
    return label


@pytest.fixture(scope="session")
def mute_run(tiny_run_config, tiny_bpe_data, tmp_path_factory) -> tuple[Path, list[str]]:
    """(run folder, its lines) of a 2-step run, no train.sample_prompt, a sample of 8 tokens at each step, whose model
    ends every text at once: it starts (train.init_from, LR 1e-6) from weights set by hand, every token embedded as
    ones and <|endoftext|> as twos, the blocks writing nothing, so the tied head gives <|endoftext|> a logit of 128
    against 64 for every other token, whatever the prompt. Do not modify."""
    import torch

    from burnout.core.checkpoint import save_checkpoint
    from burnout.data.tokenizer import load_tokenizer
    from burnout.models import Transformer
    from burnout.runs import start_training

    root = tmp_path_factory.mktemp("mute_run")
    cfg = tiny_run_config(max_steps=2)
    model = Transformer(cfg.model)
    eot = load_tokenizer(tiny_bpe_data / "tokenizer.json").token_to_id("<|endoftext|>")
    with torch.no_grad():
        for name, weight in model.named_parameters():
            if name.endswith(("attn.proj.weight", "mlp.down.weight")):
                weight.zero_()
        model.tok_emb.weight.fill_(1.0)
        model.tok_emb.weight[eot] = 2.0
    start = save_checkpoint(root / "start", cfg, model, {}, {"step": 0, "tokens": 0}, tiny_bpe_data / "tokenizer.json",
                            keep_last=1)
    events: list[str] = []
    cfg = tiny_run_config(max_steps=2, eval_interval=1, sample_tokens=8, lr=1e-6, min_lr=0.0, warmup_steps=0,
                          init_from=str(start))
    start_training(cfg, root / "run", data_dir=tiny_bpe_data, on_event=events.append, progress=False)
    return root / "run", events
