"""Precision: what `auto` means on each GPU generation, the error for bf16 on a GPU without it, and that
evaluation, scoring and generation compute in the resolved precision (on CPU: fp32, as before).

No GPU is needed: a GPU's capability and name are faked (torch.device("cuda", 0) allocates nothing), and the
autocast paths run on CPU with the resolved precision forced to bf16, hooks recording where autocast was on.
"""

import os
import subprocess
import sys
import time

import pytest
import torch

from burnout.config import ModelConfig
from burnout.core.device import autocast, resolve_precision
from burnout.data.tokenizer import load_tokenizer
from burnout.errors import BurnoutError
from burnout.eval import evaluate, scoring
from burnout.generate import sampling
from burnout.models import Transformer

CPU = torch.device("cpu")
GPU = torch.device("cuda", 0)


@pytest.fixture
def gpu_with(monkeypatch):
    """Factory: make torch report a GPU of this compute capability and name."""

    def fake(capability: tuple[int, int], name: str = "Tesla T4"):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)

    return fake


@pytest.mark.parametrize("capability,expected", [((7, 0), "fp16"), ((7, 5), "fp16"), ((8, 0), "bf16"),
                                                 ((8, 9), "bf16"), ((9, 0), "bf16")])
def test_auto_is_bf16_from_ampere_and_fp16_before(gpu_with, capability, expected):
    gpu_with(capability)
    assert resolve_precision("auto", GPU) == expected


def test_auto_on_cpu_is_fp32_and_explicit_choices_stand(gpu_with):
    gpu_with((7, 5))
    assert resolve_precision("auto", CPU) == "fp32"
    assert resolve_precision("bf16", CPU) == "bf16"
    assert [resolve_precision(p, GPU) for p in ("fp16", "fp32")] == ["fp16", "fp32"]
    gpu_with((8, 6))
    assert resolve_precision("bf16", GPU) == "bf16"


def test_bf16_below_ampere_is_one_error_line(gpu_with):
    gpu_with((7, 5), "Tesla T4")
    with pytest.raises(BurnoutError) as err:
        resolve_precision("bf16", GPU)
    assert str(err.value) == ("train.precision=bf16: Tesla T4 has compute capability 7.5; bf16 needs 8.0 (Ampere) "
                              "or newer; use train.precision=fp16 or auto")


@pytest.mark.parametrize("device,capability,where", [
    (CPU, (9, 0), "this run's device (cpu)"), (GPU, (8, 6), "NVIDIA A10G")])
def test_fp8_without_fp8_tensor_cores_is_one_error_line(gpu_with, device, capability, where):
    gpu_with(capability, "NVIDIA A10G")
    with pytest.raises(BurnoutError) as err:
        resolve_precision("fp8", device)
    assert str(err.value) == (f"train.precision=fp8: {where} has no fp8 tensor cores (they begin with compute "
                              "capability 8.9: Ada, Hopper and newer); use train.precision=bf16 or auto")


def test_fp8_on_hopper_without_torchao_names_the_install(gpu_with, monkeypatch):
    gpu_with((9, 0), "NVIDIA H100 80GB HBM3")
    monkeypatch.setitem(sys.modules, "torchao.float8", None)  # import fails as if torchao were missing
    with pytest.raises(BurnoutError, match=r"needs torchao: pip install 'gpuburnout\[fp8\]'"):
        resolve_precision("fp8", GPU)
    monkeypatch.undo()
    gpu_with((9, 0), "NVIDIA H100 80GB HBM3")
    pytest.importorskip("torchao")
    assert resolve_precision("fp8", GPU) == "fp8"


def test_fp8_model_runs_its_blocks_linear_layers_in_float8_and_keeps_the_state_dict(tiny_run_config):
    float8 = pytest.importorskip("torchao.float8.float8_linear")
    from burnout.train.step import build_model

    plain = build_model(tiny_run_config(), CPU)
    model = build_model(tiny_run_config(precision="fp8"), CPU)
    converted = {name for name, m in model.named_modules() if isinstance(m, float8.Float8Linear)}
    linears = {name for name, m in plain.named_modules() if isinstance(m, torch.nn.Linear)}
    assert converted == {name for name in linears if name.startswith("blocks.")} and "lm_head" not in converted
    assert model.state_dict().keys() == plain.state_dict().keys()
    with autocast(CPU, "fp8"):  # an fp8 run's other layers run under bf16 autocast
        assert torch.get_autocast_dtype("cpu") == torch.bfloat16


@pytest.mark.parametrize("recipe,granularity", [("tensorwise", "TENSORWISE"), ("rowwise", "AXISWISE")])
def test_fp8_recipe_sets_the_scaling_of_every_converted_layer(tiny_run_config, recipe, granularity):
    float8 = pytest.importorskip("torchao.float8.float8_linear")
    from burnout.train.step import build_model

    model = build_model(tiny_run_config(precision="fp8", fp8_recipe=recipe), CPU)
    scalings = {m.config.cast_config_input.scaling_granularity.name
                for m in model.modules() if isinstance(m, float8.Float8Linear)}
    assert scalings == {granularity}


@pytest.mark.parametrize("precision,dtype", [("bf16", torch.bfloat16), ("fp16", torch.float16)])
def test_autocast_enters_the_precision(precision, dtype):
    with autocast(CPU, precision):
        assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == dtype
    with autocast(CPU, "fp32"):
        assert not torch.is_autocast_enabled("cpu")


# ----------------------------------------------------------------------------------------------
# Evaluation, scoring and generation run in resolve_precision("auto", their device)


def tiny_model() -> Transformer:
    torch.manual_seed(0)
    return Transformer(ModelConfig(family="llama", vocab_size=512, n_layer=2, d_model=64, n_head=4, n_kv_head=2,
                                   context_length=64, ffn_multiple_of=32)).eval()


def record_autocast(model: Transformer) -> list[tuple[str, int, torch.dtype | None, torch.dtype]]:
    """(module, tokens per row or rows, autocast dtype or None, input dtype) at each call of the first block
    and of the LM head."""
    calls = []

    def hook(name):
        def record(module, args):
            x = args[0]
            autocast_dtype = torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else None
            calls.append((name, x.size(-2), autocast_dtype, x.dtype))
        return record

    model.blocks[0].register_forward_pre_hook(hook("block"))
    model.lm_head.register_forward_pre_hook(hook("head"))
    return calls


@pytest.fixture
def force_bf16(monkeypatch):
    """Once called: each module resolves 'auto' to bf16 (what a GPU would say); returns what they asked for
    and which devices they configured."""
    asked, configured = [], []

    def fake(name, device):
        asked.append((name, device))
        return "bf16"

    def apply():
        for module in (evaluate, scoring, sampling):
            monkeypatch.setattr(module, "resolve_precision", fake)
            monkeypatch.setattr(module, "configure_backends", configured.append)
        return asked, configured

    return apply


def test_val_loss_runs_in_the_resolved_precision(tiny_bpe_data, force_bf16):
    tokenizer, model = load_tokenizer(tiny_bpe_data), tiny_model()
    fp32 = evaluate.evaluate_val(model, tokenizer, tiny_bpe_data, seq_len=32, limit=4)
    asked, configured = force_bf16()
    calls = record_autocast(model)
    bf16 = evaluate.evaluate_val(model, tokenizer, tiny_bpe_data, seq_len=32, limit=4)
    assert (asked, configured) == ([("auto", CPU)], [CPU])
    assert calls and all(autocast_dtype == torch.bfloat16 for _, _, autocast_dtype, _ in calls)
    assert bf16["loss"] == pytest.approx(fp32["loss"], rel=1e-2) and bf16["tokens"] == fp32["tokens"]


def test_val_loss_on_cpu_stays_fp32(tiny_bpe_data):
    model = tiny_model()
    calls = record_autocast(model)
    evaluate.evaluate_val(model, load_tokenizer(tiny_bpe_data), tiny_bpe_data, seq_len=32, limit=4)
    assert calls and all(autocast_dtype is None for _, _, autocast_dtype, _ in calls)


REQUESTS = [("def main():\n    return", " 1"), ("def main():\n    return", " None"), ("import os", "\nimport sys")]


def test_scoring_runs_the_layers_in_the_resolved_precision_and_the_head_in_fp32(tiny_bpe_data, force_bf16):
    tokenizer, model = load_tokenizer(tiny_bpe_data), tiny_model()
    fp32 = scoring.loglikelihoods(model, tokenizer, REQUESTS)
    asked, configured = force_bf16()
    calls = record_autocast(model)
    bf16 = scoring.loglikelihoods(model, tokenizer, REQUESTS)
    assert (asked, configured) == ([("auto", CPU)], [CPU])
    assert [(name, autocast_dtype) for name, _, autocast_dtype, _ in calls] == [("block", torch.bfloat16),
                                                                                ("head", None)]
    assert calls[1][3] == torch.float32  # the head reads fp32 hidden states, so its logits are fp32
    for (ll_bf16, _), (ll_fp32, _) in zip(bf16, fp32):
        assert ll_bf16 == pytest.approx(ll_fp32, abs=0.05)


def test_scoring_on_cpu_stays_fp32(tiny_bpe_data):
    model = tiny_model()
    calls = record_autocast(model)
    scoring.loglikelihoods(model, load_tokenizer(tiny_bpe_data), REQUESTS)
    assert calls and all(autocast_dtype is None for _, _, autocast_dtype, _ in calls)


def test_generation_runs_the_prompt_in_the_resolved_precision_and_one_token_steps_in_fp32(force_bf16):
    model = tiny_model()
    asked, configured = force_bf16()
    calls = record_autocast(model)
    tokens = list(sampling.stream_tokens(model, [3, 14, 15, 9, 26], 4, temperature=0))
    assert len(tokens) == 4 and (asked, configured) == ([("auto", CPU)], [CPU])
    blocks = [(tokens_per_row, autocast_dtype) for name, tokens_per_row, autocast_dtype, _ in calls if name == "block"]
    assert blocks == [(5, torch.bfloat16), (1, None), (1, None), (1, None)]


def test_generation_on_cpu_stays_fp32():
    model = tiny_model()
    calls = record_autocast(model)
    list(sampling.stream_tokens(model, [3, 14, 15], 2, temperature=0))
    assert calls and all(autocast_dtype is None for _, _, autocast_dtype, _ in calls)


@pytest.mark.parametrize("argv", [["generate", "{run}", "--prompt", "The ", "--device", "cuda"],
                                  ["eval", "{run}", "--tasks", "val", "--device", "cuda:1"]], ids=["generate", "eval"])
def test_cuda_on_a_machine_without_it_names_the_flag_it_came_from(argv, sampled_runs, monkeypatch, capsys):
    """generate's --device once answered "use train.device=cpu", a setting generate does not have."""
    from burnout.cli import main

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main([str(sampled_runs[0]) if a == "{run}" else a for a in argv]) == 2
    assert capsys.readouterr().err == ("burnout: error: --device: CUDA was asked for but this machine has none; use "
                                       "--device cpu\n")


def test_a_run_config_asking_for_cuda_names_train_device(monkeypatch):
    from burnout.core.device import resolve_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(BurnoutError) as refused:
        resolve_device("cuda")
    assert str(refused.value) == "train.device: CUDA was asked for but this machine has none; use train.device=cpu"


_THREADS = ("import torch; from burnout.core.device import resolve_device; resolve_device('cpu'); "
            "print(torch.get_num_threads())")


def _threads_chosen(env: dict) -> int:
    done = subprocess.run([sys.executable, "-c", _THREADS], capture_output=True, text=True, env=env, timeout=120,
                          check=True)
    return int(done.stdout)


# A command run by `burnout`'s own main, then the threads its CPU work gets and how they wait.
_COMMAND_THREADS = ("import os, sys; from burnout.cli import main; main(sys.argv[1:]); import torch; "
                    "from burnout.core.device import resolve_device; resolve_device('cpu'); "
                    "print(os.environ.get('OMP_WAIT_POLICY'), torch.get_num_threads())")


def _command_threads(env: dict, *argv: str) -> str:
    done = subprocess.run([sys.executable, "-c", _COMMAND_THREADS, *argv], capture_output=True, text=True, env=env,
                          timeout=120, check=True)
    return done.stdout.strip().splitlines()[-1]


@pytest.mark.slow
def test_beside_programs_busy_on_every_core_the_cpu_work_runs_on_one_thread_or_waits_passively():
    """Busy processes on every core leave none idle. Where torch loaded first, one thread: a thread per core would
    spin waiting on the others. A command that computes sets OpenMP's passive wait before torch loads, and keeps a
    thread per core, each taking its share of a busy core (red when main does not call common.spare_busy_cores for
    it, or use_idle_cores cuts passive threads to one); a command that does not compute leaves the wait alone."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY")}
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count())]
    try:
        time.sleep(0.5)  # scheduled and spinning before the measurement
        assert _threads_chosen(env) == 1
        every_core = subprocess.run([sys.executable, "-c", "import torch; print(torch.get_num_threads())"], env=env,
                                    capture_output=True, text=True, timeout=120, check=True).stdout.strip()
        assert _command_threads(env, "generate", "no-such-run", "--prompt", "x") == f"PASSIVE {every_core}"
        assert _command_threads(env, "model", "list") == "None 1"
        # OMP_NUM_THREADS, set, decides.
        assert _threads_chosen({**env, "OMP_NUM_THREADS": "2"}) == 2
        assert _command_threads({**env, "OMP_NUM_THREADS": "2"}, "generate", "no-such-run", "--prompt", "x") == "None 2"
    finally:
        for proc in busy:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("idle, policy", [(2.0, "None"), (0.6, "None"), (0.3, "PASSIVE")])
def test_the_passive_wait_is_for_a_machine_whose_every_core_is_busy(idle, policy):
    """A core left idle keeps the faster spinning wait (red when the passive wait is set whatever the load)."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY")}
    code = (f"import os; from burnout.base import machine; machine.idle_cores_at_start = lambda: {idle}; "
            "machine.spare_busy_cores(); print(os.environ.get('OMP_WAIT_POLICY'))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60, check=True)
    assert done.stdout.strip() == policy
