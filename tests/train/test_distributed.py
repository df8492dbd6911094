"""torchrun on the CPU (gloo): DDP, FSDP2 and two nodes equal one process with the same global batch, a
killed FSDP run resumes bitwise, fine-tunes (SFT, DPO, LoRA DPO) shard under FSDP as DDP runs them, RL under DDP
and FSDP equals one process and resumes bitwise, ranks agree on the auto-batch, and the README's command prepares
its data once; in this process (a gloo group of one), how the model is wrapped, compiled and saved."""

import dataclasses
import datetime
import functools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
import safetensors.torch
import torch
import torch.distributed as dist
import yaml

from burnout.base.files import write_atomic
from burnout.config import ModelConfig, load_run_config
from burnout.core.checkpoint import list_checkpoints, load_checkpoint, save_checkpoint
from burnout.core.device import autocast
from burnout.errors import BurnoutError
from burnout.models import Transformer
from burnout.train import recipe
from burnout.train.checkpointing import load_for_resume, module_from_state
from burnout.train.distributed import DDP_BUCKET_MB, DistContext, init_distributed, wrap_model
from burnout.train.metrics import TIMING_KEYS, read_metrics
from burnout.train.probe import RandomBatches
from burnout.train.recipe import PREPARE_FAILED_FILE, prepare_on_rank_0
from burnout.train.schedule import lr_at
from burnout.train.step import TrainStep

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CPU = torch.device("cpu")
TINY = {"family": "llama", "vocab_size": 512, "n_layer": 2, "d_model": 64, "n_head": 4, "n_kv_head": 2,
        "context_length": 64, "ffn_multiple_of": 32}


def _env():
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": REPO}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun(args, cwd, timeout=300):
    """`torchrun --nproc_per_node 2 ARGS` on a free port."""
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                           str(_free_port()), *map(str, args)], env=_env(), capture_output=True, text=True,
                          timeout=timeout, cwd=cwd)


def _config(tmp_path, cfg, name, **train):
    """`cfg` (a RunConfig) as a YAML file, with train.* changed."""
    raw = cfg.to_dict()
    raw["train"].update(train)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _weights(checkpoint):
    return safetensors.torch.load_file(checkpoint / "model.safetensors")


def _without_timing(records):
    return [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in records]


def _assert_matches(run, reference):
    """Same checkpoints and tokens; per logged step the losses within 1e-5 (relative), and the final weights
    within 1e-5 + 1e-4 × |w| (observed: ~1e-7; the reduction order is all that differs)."""
    assert [p.name for p in list_checkpoints(run)] == [p.name for p in list_checkpoints(reference)]
    ours, theirs = read_metrics(run), read_metrics(reference)
    assert [r["tokens"] for r in ours] == [r["tokens"] for r in theirs]  # the same global batch
    for a, b in zip(ours, theirs):
        assert a.keys() == b.keys()
        assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-5), a["step"]
        if "val_loss" in b:
            assert a["val_loss"] == pytest.approx(b["val_loss"], rel=1e-5), a["step"]
    a, b = _weights(list_checkpoints(run)[-1]), _weights(list_checkpoints(reference)[-1])
    assert a.keys() == b.keys()  # a tied matrix stored once, as one process stores it
    for key in b:
        torch.testing.assert_close(a[key], b[key], rtol=1e-4, atol=1e-5, msg=key)


# ----------------------------------------------------------------------------------------------
# 2 ranks on gloo equal 1 process: DDP, FSDP, two nodes


@pytest.mark.slow
@pytest.mark.parametrize("strategy, cpu_offload", [("ddp", False), ("fsdp", False), ("fsdp", True)],
                         ids=["ddp", "fsdp", "fsdp-cpu-offload"])
def test_two_ranks_match_one_process_with_the_same_global_batch(tiny_run, tmp_path, strategy, cpu_offload):
    """2 gloo ranks × batch 4 × accumulation 1 = tiny_run's 1 process × batch 4 × accumulation 2; with FSDP's
    shards offloaded too (on a CPU they stay where they are, but the run goes through FSDP's offload path)."""
    config = _config(tmp_path, tiny_run.cfg, strategy, grad_accum=1, distributed=strategy, cpu_offload=cpu_offload)
    run = tmp_path / strategy
    proc = _torchrun(["-m", "burnout", "train", config, "--out", run, "--data", tiny_run.data_dir], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    _assert_matches(run, tiny_run.run_dir)


@pytest.mark.slow
def test_two_nodes_train_together_and_match_one_process(tiny_run, tmp_path):
    """Two launchers, one process each, meet at 127.0.0.1 as two machines would (each is local rank 0)."""
    config = _config(tmp_path, tiny_run.cfg, "nodes", grad_accum=1)
    run, port = tmp_path / "nodes", str(_free_port())
    nodes = [subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node_rank", str(node), "--nproc_per_node",
         "1", "--master_addr", "127.0.0.1", "--master_port", port, "-m", "burnout", "train", str(config), "--out",
         str(run), "--data", str(tiny_run.data_dir)],
        env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=tmp_path) for node in (0, 1)]
    for node in nodes:
        _, err = node.communicate(timeout=300)
        assert node.returncode == 0, err[-3000:]
    _assert_matches(run, tiny_run.run_dir)


# ----------------------------------------------------------------------------------------------
# FSDP: killed mid-run, resumed bitwise (dropout on: each rank's own generators come back)

KILLER = """
    import os, signal, sys
    from burnout.config import load_run_config
    from burnout.runs import start_training

    def on_event(line):  # rank 0's lines
        if line.startswith("step 10/"):  # past the checkpoint at 8: the launcher, then this rank (rank 1
            os.kill(os.getppid(), signal.SIGKILL)  # then fails in its next collective, writing nothing)
            os.kill(os.getpid(), signal.SIGKILL)

    start_training(load_run_config(sys.argv[1]), sys.argv[2], data_dir=sys.argv[3], on_event=on_event, progress=False)
"""


@pytest.mark.slow
def test_fsdp_killed_mid_run_then_resumed_is_bitwise_identical(tiny_run_config, tiny_bpe_data, tmp_path):
    # Dropout on: the masks depend on every rank's generator being restored, and on nothing after the
    # restore drawing from it (the CPU peak behind MFU is measured then, with a private generator).
    cfg = tiny_run_config(["model.dropout=0.1"], distributed="fsdp", ckpt_interval=4)
    config = _config(tmp_path, cfg, "fsdp")
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    proc = _torchrun(["-m", "burnout", "train", config, "--out", whole, "--data", tiny_bpe_data], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = torch.load(list_checkpoints(whole)[-1] / "state.pt", weights_only=True)["rng_by_rank"]
    assert not torch.equal(ranks[0]["torch_rng"], ranks[1]["torch_rng"])  # each rank its own dropout masks

    (tmp_path / "killer.py").write_text(textwrap.dedent(KILLER))
    proc = _torchrun(["killer.py", config, killed, tiny_bpe_data], tmp_path)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    assert [p.name for p in list_checkpoints(killed)] == ["step_0000004", "step_0000008"]
    assert read_metrics(killed)[-1]["step"] == 10

    proc = _torchrun(["-m", "burnout", "train", "--resume", killed], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [p.name for p in list_checkpoints(killed)] == [p.name for p in list_checkpoints(whole)]
    a, b = _weights(list_checkpoints(killed)[-1]), _weights(list_checkpoints(whole)[-1])
    assert a.keys() == b.keys() and all(torch.equal(a[key], b[key]) for key in a)
    assert _without_timing(read_metrics(killed)) == _without_timing(read_metrics(whole))


# ----------------------------------------------------------------------------------------------
# Fine-tunes under FSDP

FINE_TUNE = {"device": "cpu", "precision": "fp32", "batch_size": 2, "seq_len": 64, "max_steps": 6, "lr": 1e-3,
             "min_lr": 1e-4, "warmup_steps": 2, "log_interval": 1, "eval_interval": 3, "eval_batches": 2,
             "ckpt_interval": 3, "keep_last": 10}


@pytest.mark.slow
@pytest.mark.parametrize("stage", ["sft", "dpo", "dpo-lora", "dpo-packed"])
def test_fine_tunes_shard_under_fsdp_as_ddp_runs_them(tiny_run, chat_run, fine_tune_data, tmp_path, stage):
    """On 2 gloo ranks FSDP's losses, held-out metrics and weights are DDP's. DPO shards its objective, the
    policy inside it: the gathered weights are saved under the policy's names, held-out pairs go through the
    root module (whose hook gathers the embedding and head), packed pairs' positions through it too, and a run
    resumed under FSDP is bitwise the whole one. (A LoRA SFT that trains added tokens' rows is refused under FSDP:
    test_lora_new_tokens.)"""
    kind = stage.split("-")[0]
    base, source = (tiny_run.run_dir, fine_tune_data.chats) if kind == "sft" else (chat_run, fine_tune_data.pairs)
    section = {"base": str(base), "source": str(source), "val_fraction": 0.25}
    if stage.endswith("lora"):
        section["lora"] = {"r": 4, "alpha": 8}
    if stage.endswith("packed"):
        section["packing"] = True
    for strategy in ("ddp", "fsdp"):
        config = tmp_path / f"{strategy}.yaml"
        config.write_text(yaml.safe_dump({kind: section, "train": {**FINE_TUNE, "distributed": strategy}}))
        proc = _torchrun(["-m", "burnout", "train", config, "--out", tmp_path / strategy], tmp_path)
        assert proc.returncode == 0, proc.stderr[-3000:]
    _assert_matches(tmp_path / "fsdp", tmp_path / "ddp")
    if kind == "dpo":
        held_out = [r for r in read_metrics(tmp_path / "ddp") if "val_margin" in r]
        assert [r["step"] for r in held_out] == [3, 6]
        for a, b in zip(read_metrics(tmp_path / "fsdp")[2::3], held_out, strict=True):
            assert a["val_margin"] == pytest.approx(b["val_margin"], rel=1e-5, abs=1e-7)
            assert a["val_accuracy"] == b["val_accuracy"]
    if stage == "dpo":
        resumed = tmp_path / "resumed"
        shutil.copytree(tmp_path / "fsdp", resumed)
        shutil.rmtree(list_checkpoints(resumed)[-1])
        proc = _torchrun(["-m", "burnout", "train", "--resume", resumed], tmp_path)
        assert proc.returncode == 0, proc.stderr[-3000:]
        a, b = _weights(list_checkpoints(resumed)[-1]), _weights(list_checkpoints(tmp_path / "fsdp")[-1])
        assert a.keys() == b.keys() and all(torch.equal(a[key], b[key]) for key in a)


RL_METRICS = ("reward", "signal", "kl", "answer_length")


@pytest.mark.slow
@pytest.mark.parametrize("strategy, lora", [("ddp", False), ("fsdp", False), ("fsdp", True)],
                         ids=["ddp", "fsdp", "fsdp-lora"])
def test_rl_on_two_ranks_equals_one_process_accumulating_the_same_questions_and_resumes_bitwise(chat_run, tmp_path,
                                                                                                strategy, lora):
    """GRPO on 2 gloo ranks × 2 questions a step = 1 process × 2 micro-batches of 2: each rank samples its own
    questions, whole groups (batch (s·W + r)·A + m, as for any recipe), and the reward, signal, KL and answer length
    logged are every rank's mean, as one process's are its micro-batches'. Under FSDP each rank samples from the
    weights gathered whole (its own number of decoding forwards), and evaluates through the root module; with LoRA
    its KL reference is the sharded policy with the adapters off. Resumed under torchrun, the run ends bitwise as the
    whole one."""
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({"question": f"Capital {i}?", "answer": "Paris is it."}) + "\n"
                             for i in range(16)))
    args = ["rl", chat_run, "--data", tasks, "--reward", "regex:is", "rl.group_size=4", "rl.max_new_tokens=8",
            "rl.val_fraction=0.25", "rl.kl_coef=0.1", *(f"train.{key}={value}" for key, value in FINE_TUNE.items()),
            *(["--lora", "rl.lora.r=4"] if lora else [])]
    from burnout.cli import main

    assert main([*map(str, args), "--out", str(tmp_path / "one"), "train.grad_accum=2"]) == 0
    run = tmp_path / strategy
    proc = _torchrun(["-m", "burnout", *args, "--out", run, f"train.distributed={strategy}"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    _assert_matches(run, tmp_path / "one")
    for a, b in zip(read_metrics(run), read_metrics(tmp_path / "one"), strict=True):
        for key in RL_METRICS:
            assert a[key] == pytest.approx(b[key], rel=1e-5, abs=1e-6), (a["step"], key)
        assert a.get("val_pass@1") == b.get("val_pass@1")
    assert any(r["signal"] > 0 for r in read_metrics(tmp_path / "one"))  # the groups taught something

    resumed = tmp_path / "resumed"
    shutil.copytree(run, resumed)
    shutil.rmtree(list_checkpoints(resumed)[-1])
    proc = _torchrun(["-m", "burnout", "train", "--resume", resumed], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    a, b = _weights(list_checkpoints(resumed)[-1]), _weights(list_checkpoints(run)[-1])
    assert a.keys() == b.keys() and all(torch.equal(a[key], b[key]) for key in a)
    assert _without_timing(read_metrics(resumed)) == _without_timing(read_metrics(run))


# ----------------------------------------------------------------------------------------------
# Auto-batch: every rank runs the smallest micro-batch any rank found

AUTO_BATCH = """
    import os, sys
    import burnout.train.loop
    from burnout.cli import main

    largest = 8 if os.environ["RANK"] == "0" else 2  # rank 1's device is the smaller one
    burnout.train.loop.memory_probe = lambda cfg, device, precision, seq_len, build: lambda b: b <= largest
    sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_ranks_agree_on_the_smallest_auto_batch(tiny_run_config, tiny_bpe_data, tmp_path):
    (tmp_path / "auto.py").write_text(textwrap.dedent(AUTO_BATCH))
    config = _config(tmp_path, tiny_run_config(batch_size=1, grad_accum=8, max_steps=1), "auto")
    run = tmp_path / "run"
    proc = _torchrun(["auto.py", "train", config, "--out", run, "--data", tiny_bpe_data, "--auto-batch"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "auto-batch: micro-batch 2 × accumulation 4 (was 1 × 8)" in proc.stdout
    saved = load_run_config(run / "config.yaml").train
    assert (saved.batch_size, saved.grad_accum) == (2, 4)


# ----------------------------------------------------------------------------------------------
# train.ckpt_minutes: a checkpoint one rank finds due is saved by all, at the same step

CLOCKS = """
    import itertools, os, sys
    import burnout.train.checkpointing
    from burnout.cli import main

    # Rank 1's clock runs 100 s per reading and rank 0's stands still: only rank 1 finds a minute passed.
    ticks = itertools.count(step=100) if os.environ["RANK"] == "1" else itertools.repeat(0)
    burnout.train.checkpointing.clock = lambda: next(ticks)
    sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_ranks_agree_on_a_checkpoint_only_one_rank_found_due(tiny_run_config, tiny_bpe_data, tmp_path):
    """Rank 1 alone raises the time flag at every step; it rides the step's all-reduce, so both ranks save
    together (a rank saving alone would wait forever in the checkpoint's collectives)."""
    (tmp_path / "clocks.py").write_text(textwrap.dedent(CLOCKS))
    config = _config(tmp_path, tiny_run_config(max_steps=4, ckpt_interval=100, ckpt_minutes=1), "clocks")
    run = tmp_path / "run"
    # Ranks that disagree hang in their collectives: 2 minutes, where the run takes seconds, tells that apart.
    proc = _torchrun(["clocks.py", "train", config, "--out", run, "--data", tiny_bpe_data], tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [p.name for p in list_checkpoints(run)] == [f"step_000000{s}" for s in (1, 2, 3, 4)]


# ----------------------------------------------------------------------------------------------
# A time budget: ranks whose clocks disagree agree on the plan, each step's LR and the last step

BUDGET_CLOCKS = """
    import itertools, os, sys
    from types import SimpleNamespace
    import burnout.train.loop, burnout.train.probe
    from burnout.cli import main

    # Each reading of the clock moves it: by 1 s on rank 1 and 0.5 s on rank 0, which thinks itself twice as fast.
    tick = 1.0 if os.environ["RANK"] == "1" else 0.5
    for module in (burnout.train.loop, burnout.train.probe):
        ticks = itertools.count(step=tick)
        module.time = SimpleNamespace(perf_counter=lambda ticks=ticks: next(ticks))

    # Each rank's place of each step on the LR schedule, for the test to compare.
    import burnout.train.budget
    placed = burnout.train.budget.TimeBudget.schedule_step

    def recorded(self, step):
        position = placed(self, step)
        with open(f"positions-{os.environ['RANK']}.txt", "a") as out:
            out.write(f"{position!r}\\n")
        return position

    burnout.train.budget.TimeBudget.schedule_step = recorded
    sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_ranks_agree_on_a_time_budget_their_clocks_disagree_on(tiny_run_config, tiny_bpe_data, tmp_path):
    """Rank 1 times a step at 1 s, rank 0 at 0.5 s: the slower plans the minute's 59 steps for both (what rank 0's
    start-up left). Training, their
    clocks run at 3 s and 1.5 s a step: each step's predicted share of the budget rides the step's all-reduce, so
    both place each step alike and stop at the same one, with the final LR (ranks that disagreed would hang in
    their collectives, or stop apart)."""
    (tmp_path / "clocks.py").write_text(textwrap.dedent(BUDGET_CLOCKS))
    config = _config(tmp_path, tiny_run_config(max_steps=1000, log_interval=1, eval_interval=1000,
                                               ckpt_interval=1000), "budget")
    run = tmp_path / "run"
    proc = _torchrun(["clocks.py", "train", config, "--out", run, "--data", tiny_bpe_data, "--minutes", "1"], tmp_path,
                     timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    tc = load_run_config(run / "config.yaml").train
    # The minute less the start-up rank 0's clock read (a tick or two: its clock moves at each reading) plans 59.
    assert 0 < tc.startup_seconds < 1 and "measured 1 s/step → planning 59 steps" in proc.stdout
    lrs = [record["lr"] for record in read_metrics(run)]
    # The ranks' mean clock, 2.25 s a step, spends the minute in about 27 steps.
    assert 20 < len(lrs) < 59 and lrs[-1] == lr_at(58, tc, 59) < lrs[-2]
    # Every step sits at one place on both ranks, the first too, though their clocks read different start-ups.
    positions = [(tmp_path / f"positions-{rank}.txt").read_text().splitlines() for rank in (0, 1)]
    assert positions[0] == positions[1] and len(positions[0]) == len(lrs)


# ----------------------------------------------------------------------------------------------
# The README's command on a fresh folder: rank 0 prepares the data, the other ranks wait for it

QUICK = ["train.max_steps=2", "data.max_chars=40000", "tokenizer.vocab_size=300", "model.n_layer=1",
         "model.d_model=32", "model.n_head=2", "model.n_kv_head=1", "train.batch_size=2", "train.seq_len=32",
         "train.eval_batches=1", "train.sample_tokens=4", "train.device=cpu"]


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_the_readme_torchrun_command_prepares_the_data_once(tmp_path, strategy):
    run = tmp_path / "runs" / "ddp"
    # The quickstart trains with Muon, which FSDP's sharded matrices cannot run: AdamW there.
    optimizer = ["train.optimizer=adamw"] if strategy == "fsdp" else []
    proc = _torchrun(["-m", "burnout", "train", "quickstart", "--out", run, *QUICK, f"train.distributed={strategy}",
                      *optimizer], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("preparing data into") == 1
    assert (run / "data" / "meta.json").is_file() and list_checkpoints(run)[-1].name == "step_0000002"


def test_a_waiting_rank_stops_with_rank_0s_error_not_an_earlier_launchs(tiny_run_config, tmp_path, monkeypatch):
    monkeypatch.setattr("burnout.train.recipe.WAIT_POLL_S", 0.01)
    run = tmp_path / "run"
    run.mkdir()
    write_atomic(run / PREPARE_FAILED_FILE, "an earlier launch's error")
    cfg = tiny_run_config(["data.sources=[{name: notes, kind: text, path: missing.txt}]"])
    waited, real_identity, looked = [], recipe._identity, threading.Event()

    def identity(path):  # rank 1's first look at the failure file: the earlier launch's, which it must ignore
        seen = real_identity(path)
        looked.set()
        return seen

    monkeypatch.setattr(recipe, "_identity", identity)

    def rank_1():
        try:
            prepare_on_rank_0(cfg, run / "data", waited.append, False, rank=1, world_size=2)
        except BurnoutError as exc:
            waited.append(str(exc))

    waiter = threading.Thread(target=rank_1, daemon=True)
    waiter.start()
    assert looked.wait(timeout=30)  # rank 1 has seen the earlier launch's file, however slow the machine
    with pytest.raises(BurnoutError) as info:
        prepare_on_rank_0(cfg, run / "data", lambda line: None, False, rank=0, world_size=2)
    waiter.join(timeout=30)
    assert (run / PREPARE_FAILED_FILE).read_text() == str(info.value)
    assert waited == [f"rank 1: rank 0 failed to prepare the data into {run / 'data'}: {info.value}"]


# ----------------------------------------------------------------------------------------------
# In this process: a gloo group of one, in which DDP and FSDP2 wrap, run and compile as on many ranks


@pytest.fixture(scope="module")
def two_ranks():
    """The context wrap_model gets under torchrun (it wraps only for more than one rank), inside a real
    one-process gloo group."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
    yield DistContext(rank=0, world_size=2)
    dist.destroy_process_group()


def test_ddp_keeps_gradients_in_its_buckets_and_leaves_buffers_alone(two_ranks):
    model = Transformer(ModelConfig(**TINY))
    ddp = wrap_model(model, two_ranks, "ddp", CPU, "fp32")
    x = torch.randint(0, 512, (2, 16))
    ddp(x, x).backward()
    # The tiny model fits DDP's first bucket: every gradient is a view of that one bucket, no copy beside it.
    assert len({p.grad.untyped_storage().data_ptr() for p in model.parameters()}) == 1
    assert ddp.bucket_bytes_cap == DDP_BUCKET_MB * 2**20
    assert not ddp.will_sync_module_buffers()  # RoPE's tables are not re-sent before each forward


@pytest.mark.parametrize("precision, compute", [("bf16", torch.bfloat16), ("fp16", torch.float16),
                                                ("fp32", torch.float32)])
def test_fsdp_gathers_and_computes_in_the_run_precision_and_reduces_in_fp32(two_ranks, precision, compute):
    from torch.distributed.fsdp import MixedPrecisionPolicy

    model = Transformer(ModelConfig(**TINY))
    seen = []
    model.blocks[0].attn.qkv.register_forward_pre_hook(lambda module, args: seen.append(module.weight.dtype))
    wrap_model(model, two_ranks, "fsdp", CPU, precision)
    x = torch.randint(0, 512, (2, 16))
    with autocast(CPU, precision):  # as the train step runs it
        model(x, x).backward()
    assert seen == [compute]
    low = compute if precision != "fp32" else None
    assert model.blocks[0]._get_fsdp_state()._mp_policy == MixedPrecisionPolicy(
        param_dtype=low, reduce_dtype=torch.float32 if low else None)
    assert model.blocks[0].attn.qkv.weight.grad.dtype == torch.float32  # the fp32 shards stay the master weights


def test_fsdp_cpu_offload_puts_every_sharded_module_under_the_offload_policy(two_ranks, tiny_run_config):
    from torch.distributed.fsdp import CPUOffloadPolicy

    cfg = tiny_run_config(distributed="fsdp", cpu_offload=True)
    model = wrap_model(Transformer(cfg.model), two_ranks, "fsdp", CPU, "fp32", cpu_offload=True)
    for module in (*model.blocks, model):
        # Pinned pages only where there is a GPU to copy them to.
        assert module._get_fsdp_state()._fsdp_param_group.offload_policy == CPUOffloadPolicy(pin_memory=False)
    step = TrainStep(model, cfg.train, CPU, "fp32", end_of_run=2)
    before = next(model.parameters()).full_tensor().clone()
    result = step(RandomBatches(512, 2, 16, CPU), 0)
    assert result.applied and not torch.equal(next(model.parameters()).full_tensor(), before)


@pytest.fixture
def fresh_dynamo():
    """No compiled code from other tests in, none of this one's (guarded on its modules) left for them."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.slow
@pytest.mark.parametrize("strategy, graphs", [
    # DDPOptimizer cuts the graph at DDP's buckets: its 1 MB first one (the tied head), then the 51 MB
    # rest in one (25 MB buckets made 3 graphs).
    ("ddp", 2),
    # FSDP2's hooks break the graph at each block: one graph every block reuses, and one for the head.
    ("fsdp", 2),
])
def test_compiled_graphs(two_ranks, tiny_run_config, monkeypatch, fresh_dynamo, strategy, graphs):
    compiled = []

    def count(gm, example_inputs):  # a backend that records each graph it is handed and runs it as it is
        compiled.append(gm)
        return gm.forward

    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend=count))
    cfg = tiny_run_config(["model.d_model=768", "model.n_head=12", "model.n_kv_head=4"], compile=True,
                          distributed=strategy)
    model = wrap_model(Transformer(cfg.model), two_ranks, strategy, CPU, "fp32")
    step = TrainStep(model, cfg.train, CPU, "fp32", end_of_run=2)
    for i in range(2):  # the second step runs what the first compiled
        step(RandomBatches(512, 1, 8, CPU), i)
    assert len(compiled) == graphs


def test_fsdp_checkpoints_borrow_the_gathered_tensors_and_keep_the_tie(tiny_run_config, tiny_bpe_data, tmp_path):
    cfg = tiny_run_config()
    model = Transformer(cfg.model)
    gathered = {name: t.clone() for name, t in model.state_dict().items()}  # one tensor per name, as FSDP's
    module = module_from_state(cfg, gathered)
    params = dict(module.named_parameters(remove_duplicate=False))
    assert all(params[name].data_ptr() == gathered[name].data_ptr() for name in params)  # no copy, no init
    assert params["lm_head.weight"].data_ptr() == params["tok_emb.weight"].data_ptr()

    info = {"step": 1, "tokens": 0, "train_loss": 0.0, "val_loss": 0.0, "elapsed_s": 0.0}
    path, plain = (save_checkpoint(tmp_path / name, cfg, m, {}, info, tiny_bpe_data / "tokenizer.json", keep_last=1)
                   for name, m in (("borrowed", module), ("plain", model)))
    assert _weights(path).keys() == _weights(plain).keys()  # the tied matrix stored once
    x = torch.randint(0, 512, (1, 64))
    # RoPE's tables, never saved, are computed again on load: the loaded model is the trained one.
    assert torch.equal(load_checkpoint(path).model(x), model(x))


def test_ranks_wait_half_an_hour_for_rank_0(monkeypatch):
    """Long enough for rank 0 to evaluate and write the 1B's 12.5 GB checkpoint on a slow disk (NCCL's own
    default is 10 minutes)."""
    joined = []
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", lambda **kwargs: joined.append(kwargs))
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    ctx, _ = init_distributed(CPU)
    assert (ctx.rank, ctx.world_size) == (1, 2)
    assert joined == [{"backend": "gloo", "device_id": None, "timeout": datetime.timedelta(minutes=30)}]


@pytest.mark.parametrize("strategy, rank, mapped", [("ddp", 1, False), ("fsdp", 0, False), ("fsdp", 1, True)])
def test_on_resume_fsdps_other_ranks_map_the_optimizer_state_instead_of_reading_it(tiny_run, strategy, rank, mapped):
    """A DDP rank needs the whole optimizer state, FSDP's rank 0 sends the shards: the other FSDP ranks map
    state.pt, and the pages of the optimizer's moments are never read."""
    train = tiny_run.cfg.train
    cfg = dataclasses.replace(tiny_run.cfg, train=dataclasses.replace(
        train, perf=dataclasses.replace(train.perf, distributed=strategy)))
    ckpt = load_for_resume(tiny_run.run_dir, cfg, tiny_run.data_dir / "tokenizer.json", DistContext(rank, 2))
    assert ckpt.state["step"] == 24
    assert (os.path.realpath(ckpt.path / "state.pt") in Path("/proc/self/maps").read_text()) == mapped
