"""The GPU table: device names map to the right entry, an unlisted GPU trains on a measured peak, and a
precision a card lacks is refused in one line. A CPU's peak: the best ever measured, never shrunk by a busy moment."""

import fcntl
import json
import threading

import pytest
import torch

from burnout.base.text import plural
from burnout.config import LogConfig, TrainConfig
from burnout.errors import BurnoutError
from burnout.train import hardware
from burnout.train.hardware import get_hardware, hardware_table, match_gpu
from burnout.train.metrics import StepLogger

# What torch.cuda.get_device_name() says on each card → the table entry it must find.
DEVICE_NAMES = {
    "Tesla T4": "t4",
    "Tesla V100-SXM2-16GB": "v100",
    "Tesla V100-PCIE-32GB": "v100-pcie",
    "NVIDIA A10G": "a10g",
    "NVIDIA A10": "a10",
    "NVIDIA L4": "l4",
    "NVIDIA L40S": "l40s",
    "NVIDIA GeForce RTX 3090": "rtx-3090",
    "NVIDIA GeForce RTX 4090": "rtx-4090",
    "NVIDIA RTX A6000": "rtx-a6000",
    "NVIDIA RTX 6000 Ada Generation": "rtx-6000-ada",
    "NVIDIA A100-SXM4-80GB": "a100-80gb",
    "NVIDIA A100 80GB PCIe": "a100-80gb",
    "NVIDIA A100-SXM4-40GB": "a100-40gb",
    "NVIDIA A100-PCIE-40GB": "a100-40gb",
    "NVIDIA H100 80GB HBM3": "h100",
    "NVIDIA H100 PCIe": "h100-pcie",
    "NVIDIA H100 NVL": "h100-nvl",
    "NVIDIA H200": "h200",
    "NVIDIA GH200 480GB": "gh200",
}
GPU = torch.device("cuda", 0)  # only a name here: nothing is allocated on it


@pytest.fixture(autouse=True)
def a_machine_of_its_own(monkeypatch, tmp_path):
    """Each test on a CPU measured by no one yet: an empty precision cache, and a process that has not measured
    (a fake measurement kept for the process, or in the session's cache, would reach the tests after these)."""
    monkeypatch.setenv("BURNOUT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(hardware, "_PROCESS_PEAKS", {})


@pytest.mark.parametrize("name", DEVICE_NAMES)
def test_device_names_find_their_entry(name):
    assert match_gpu(hardware_table(), name) == DEVICE_NAMES[name]


def test_every_entry_has_its_datasheet_figures():
    for key, entry in hardware_table().items():
        peaks = entry["peak_tflops"]
        assert {"fp16", "fp32"} <= set(peaks) and entry["memory_gb"] > 0, key
        assert peaks["fp16"] >= peaks["fp32"] and peaks.get("bf16", peaks["fp16"]) == peaks["fp16"], key
        assert entry.get("price_per_hour") or entry.get("units_per_hour"), key


def test_the_longest_match_wins_whatever_the_table_order():
    table = {"sxm": {"match": ["H100"]}, "pcie": {"match": ["H100 PCIe"]}}
    assert match_gpu(table, "NVIDIA H100 PCIe") == "pcie"
    assert match_gpu(dict(reversed(table.items())), "NVIDIA H100 PCIe") == "pcie"
    assert match_gpu(table, "NVIDIA H100 80GB HBM3") == "sxm"


def test_pcie_and_sxm_h100_have_their_own_peaks(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 PCIe")
    pcie = get_hardware("auto", "bf16", device=GPU)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    sxm = get_hardware("auto", "bf16", device=GPU)
    assert (pcie.key, pcie.peak_flops) == ("h100-pcie", 756e12)
    assert (sxm.key, sxm.peak_flops) == ("h100", 989e12)


def test_whole_words_only():
    table = hardware_table()
    assert match_gpu(table, "NVIDIA A10G") == "a10g"  # not the A10
    assert match_gpu(table, "NVIDIA L40") is None  # neither the L4 nor the L40S
    assert match_gpu(table, "Quadro RTX 6000") is None  # Turing, not the Ada card


def test_an_unlisted_gpu_trains_on_a_measured_peak_and_says_so(monkeypatch):
    measured = []
    asked = []  # the device each name is asked of: the run's own, on a machine with several GPUs
    monkeypatch.setattr(torch.cuda, "get_device_name",
                        lambda device=None: asked.append(device) or "NVIDIA GeForce RTX 5090")
    monkeypatch.setattr(hardware, "measure_gpu_peak",
                        lambda device, precision: measured.append((device, precision)) or 209.5e12)
    lines = []
    hw = get_hardware("auto", "bf16", device=GPU, say=lines.append)
    assert measured == [(GPU, "bf16")] and asked == [GPU, GPU]
    assert (hw.key, hw.name, hw.peak_flops, hw.price_per_hour, hw.price_note) == (
        "measured", "NVIDIA GeForce RTX 5090", 209.5e12, None, "")
    said = (f"hardware: 'NVIDIA GeForce RTX 5090' is not in {hardware.HARDWARE_FILE}, so MFU is over a bf16 matmul "
            "peak measured now (209.5 TFLOP/s)")
    assert lines == [said + " and no price is known (set train.price_per_hour)"]
    hw = get_hardware("auto", "bf16", price_per_hour=0.9, device=GPU, say=lines.append)
    assert hw.price_per_hour == 0.9 and lines[1:] == [said]


def test_a_listed_gpu_is_not_measured(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla T4")
    monkeypatch.setattr(hardware, "measure_gpu_peak", lambda device, precision: pytest.fail("measured"))
    lines = []
    hw = get_hardware("auto", "fp16", device=GPU, say=lines.append)
    assert (hw.key, hw.peak_flops, hw.price_per_hour, lines) == ("t4", 65e12, 0.35, [])


def test_bf16_on_a_card_without_it_is_one_error_line():
    with pytest.raises(BurnoutError) as err:
        get_hardware("t4", "bf16")
    message = str(err.value)
    assert "'t4' (NVIDIA T4) has no bf16 peak" in message and "fp16 or fp32" in message and "\n" not in message
    assert get_hardware("t4", "fp32").peak_flops == 8.1e12


def test_the_price_comes_from_the_table_in_dollars_or_compute_units_or_from_the_user():
    a100 = get_hardware("a100-40gb", "bf16")
    assert (a100.price_per_hour, a100.price_note, a100.peak_flops) == (1.19, "table", 312e12)
    assert a100.name == hardware_table()["a100-40gb"]["name"]
    assert get_hardware("a100-40gb", "auto").peak_flops == 156e12  # auto precision's MFU is over fp32's peak
    colab = get_hardware("colab-a100", "bf16")
    assert colab.price_per_hour == pytest.approx(8 * 0.1) and colab.price_note == "8 units/h × $0.1/unit"
    given = get_hardware("colab-a100", "bf16", price_per_hour=2.5)
    assert (given.price_per_hour, given.price_note) == (2.5, "given")
    units_and_dollars = {"x": {"name": "X", "peak_tflops": {"fp32": 1}, "price_per_hour": 3.0,
                               "units_per_hour": 8, "dollars_per_unit": 0.1}}
    assert hardware._table_hardware(units_and_dollars, "x", "fp32").price_per_hour == 3.0  # a dollar price wins


def test_unknown_names_and_cpu_keep_working():
    with pytest.raises(BurnoutError) as err:
        get_hardware("tpu-v9", "bf16")
    entries = ", ".join(hardware_table())
    assert str(err.value) == (f"hardware 'tpu-v9' is not in {hardware.HARDWARE_FILE}; choose one of: cpu, {entries} "
                              "(or add an entry there)")
    assert get_hardware("auto", "fp32").key == "cpu"  # no device: the CPU, measured


def test_the_cpu_entry_is_named_by_its_threads_and_has_no_price(monkeypatch):
    monkeypatch.setattr(hardware, "measure_cpu_peak", lambda precision: {"fp32": 1.5e11, "bf16": 4e11}[precision])
    cpu = get_hardware("cpu", "bf16")
    assert (cpu.key, cpu.name, cpu.peak_flops, cpu.price_per_hour, cpu.price_note) == (
        "cpu", f"CPU ({plural(torch.get_num_threads(), 'thread')})", 4e11, None, "")


def test_detect_names_the_entry_and_refuses_an_unlisted_gpu(monkeypatch):
    """bench's datasheet column: a listed GPU's entry, else an error it turns into 'no datasheet figure'."""
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 NVL")
    assert hardware.detect(hardware_table(), GPU) == "h100-nvl"
    assert hardware.detect(hardware_table(), torch.device("cpu")) == "cpu"
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA B200")
    with pytest.raises(BurnoutError, match="'NVIDIA B200' is not in"):
        hardware.detect(hardware_table(), GPU)


def test_the_gpu_measurement_waits_for_each_multiply(monkeypatch):
    """A CUDA launch returns at once: each timed multiply must end in a synchronize, or the peak is the
    launch rate. (Run on CPU tensors, with the synchronize recorded instead of called.)"""
    synced = []
    monkeypatch.setattr(torch.cuda, "synchronize", synced.append)
    cpu = torch.device("cpu")
    peak = hardware.measure_gpu_peak(cpu, "fp32", size=64, repeats=3)
    assert synced == [cpu] * 4 and peak > 0  # after the warm-up multiply, then after each timed one


# ----------------------------------------------------------------------------------------------
# precision: auto on a CPU, measured once per machine


def _peaks(monkeypatch, fp32: float, bf16: float) -> list[str]:
    measured: list[str] = []

    def fake_peak(precision, *args, **kwargs):
        measured.append(precision)
        return {"fp32": fp32, "bf16": bf16}[precision] * 1e9

    monkeypatch.setattr(hardware, "measure_cpu_peak", fake_peak)
    return measured


def test_auto_on_a_cpu_measures_once_then_reads_the_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("BURNOUT_CACHE_DIR", str(tmp_path))
    measured = _peaks(monkeypatch, fp32=160, bf16=400)
    lines: list[str] = []
    assert hardware.training_precision("auto", torch.device("cpu"), lines.append) == "bf16"
    assert measured == ["fp32", "bf16"]
    assert "bf16; a matmul peak of 400 GFLOP/s in bf16 vs 160 in fp32 (measured now" in lines[0]
    assert str(tmp_path / "cpu_precision.json") in lines[0]
    entry = next(iter(json.loads((tmp_path / "cpu_precision.json").read_text()).values()))
    assert entry["choice"] == "bf16" and entry["bf16_gflops"] == 400
    # Another process on this machine: no measurement, the cached figures said again.
    measured.clear()
    assert hardware.training_precision("auto", torch.device("cpu"), lines.append) == "bf16"
    assert measured == [] and "(measured earlier" in lines[1]


def test_cpus_of_one_name_but_other_instructions_are_measured_apart(monkeypatch, tmp_path):
    """"AMD EPYC" named a Zen 4 with AVX-512 BF16 and an AVX2 CPU that emulates bf16: a cache shared between them
    (one home directory on both) must not hand the first one's bf16 to the second."""
    monkeypatch.setenv("BURNOUT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(hardware, "cpu_model", lambda: "AMD EPYC")
    monkeypatch.setattr(hardware, "cpu_instructions", lambda: "AVX512 avx512_bf16")
    measured = _peaks(monkeypatch, fp32=98, bf16=418)
    lines: list[str] = []
    assert hardware.training_precision("auto", torch.device("cpu"), lines.append) == "bf16"
    assert "(AMD EPYC, AVX512 avx512_bf16, " in lines[0]
    monkeypatch.setattr(hardware, "cpu_instructions", lambda: "AVX2")
    measured = _peaks(monkeypatch, fp32=181, bf16=1.4)
    assert hardware.training_precision("auto", torch.device("cpu"), lines.append) == "fp32"
    assert measured == ["fp32", "bf16"] and "(AMD EPYC, AVX2, " in lines[1]
    assert len(json.loads((tmp_path / "cpu_precision.json").read_text())) == 2


@pytest.mark.parametrize(("fp32", "bf16", "choice"), [(160, 400, "bf16"), (160, 180, "fp32"), (160, 90, "fp32")])
def test_bf16_only_where_it_is_clearly_faster(monkeypatch, tmp_path, fp32, bf16, choice):
    monkeypatch.setenv("BURNOUT_CACHE_DIR", str(tmp_path))
    _peaks(monkeypatch, fp32, bf16)
    assert hardware.training_precision("auto", torch.device("cpu"), lambda line: None) == choice


def test_an_explicit_precision_or_a_gpu_measures_nothing_and_a_bad_cache_is_measured_again(monkeypatch, tmp_path):
    monkeypatch.setenv("BURNOUT_CACHE_DIR", str(tmp_path))
    measured = _peaks(monkeypatch, fp32=160, bf16=400)
    assert hardware.training_precision("fp32", torch.device("cpu")) == "fp32"
    assert hardware.training_precision("bf16", torch.device("cpu")) == "bf16"
    assert measured == [] and not (tmp_path / "cpu_precision.json").exists()
    (tmp_path / "cpu_precision.json").write_text("{not json")
    assert hardware.training_precision("auto", torch.device("cpu"), lambda line: None) == "bf16"
    assert measured == ["fp32", "bf16"] and json.loads((tmp_path / "cpu_precision.json").read_text())


def test_a_run_with_auto_precision_trains_in_the_measured_one_and_says_why(tiny_run_config, tiny_bpe_data, tmp_path,
                                                                          monkeypatch):
    from burnout.runs import start_training
    from burnout.train import loop

    monkeypatch.setenv("BURNOUT_CACHE_DIR", str(tmp_path / "cache"))
    _peaks(monkeypatch, fp32=160, bf16=400)
    steps, real_step = [], loop.TrainStep

    def spy(*args, **kwargs):
        steps.append(args[3])  # TrainStep(model, train config, device, precision, ...)
        return real_step(*args, **kwargs)

    monkeypatch.setattr(loop, "TrainStep", spy)
    events: list[str] = []
    start_training(tiny_run_config(precision="auto", max_steps=2), tmp_path / "run", data_dir=tiny_bpe_data,
                   on_event=events.append, progress=False)
    assert any(e.startswith("precision auto on this CPU") and ": bf16;" in e for e in events)
    assert steps == ["bf16"]  # what the train step computes in


class _FakeCpu:
    """torch.mm and the clock of a CPU that multiplies n×n matrices at `top` FLOP/s × n/2048 where `grows` (small
    multiplies use a real CPU worse), at `top` alike where not, and whose first multiply of each size waits
    `first_wait_s` more (kernel selection, waking threads, cold caches; or another process holding the CPU)."""

    def __init__(self, monkeypatch, top: float, grows: bool, first_wait_s: float):
        self.top, self.grows, self.first_wait_s, self.now, self.sizes = top, grows, first_wait_s, 0.0, []
        monkeypatch.setattr(torch, "mm", self.mm)
        monkeypatch.setattr(hardware.time, "perf_counter", lambda: self.now)

    def mm(self, a, b):
        n = a.shape[0]
        rate = self.top * n / 2048 if self.grows else self.top
        self.now += 2 * n**3 / rate + (self.first_wait_s if n not in self.sizes else 0.0)
        self.sizes.append(n)


def test_the_cpu_peak_is_a_large_warm_multiply_that_a_held_up_one_cannot_keep_small(monkeypatch):
    """A model's large GEMMs run near a CPU's best: its peak must be measured on a large multiply, warm (gpt2-134m's
    768 x 3072 GEMMs outran one 1024² multiply timed alone: docs/PERFORMANCE.md). Here the first multiply of each
    size waits 30 ms: a single multiply deciding the size stopped at 256² (50 GFLOP/s where the CPU gives 400) and
    printed MFUs eight times too large; the best of three goes on to 2048². A precision the CPU emulates (1 GFLOP/s)
    stays at 256², measured in well under a second instead of minutes."""
    fast = _FakeCpu(monkeypatch, top=400e9, grows=True, first_wait_s=0.03)
    assert hardware.measure_cpu_peak("fp32") == pytest.approx(400e9)
    assert max(fast.sizes) == 2048
    emulated = _FakeCpu(monkeypatch, top=1e9, grows=False, first_wait_s=0.0)
    assert hardware.measure_cpu_peak("fp16") == pytest.approx(1e9)
    assert set(emulated.sizes) == {256} and emulated.now < 1


def _kept_best(precision: str) -> float:
    (entry,) = json.loads(hardware.precision_cache_path().read_text()).values()
    return entry["best_gflops"][precision]


def test_a_busy_moment_cannot_shrink_the_cpu_peak_nor_lift_mfu_over_one(tmp_path, monkeypatch):
    """MFU on a CPU is over the best peak ever measured on it, kept in the precision cache and only ever raised.
    A first process measured in a busy moment (5 GFLOP/s where the CPU gives 100): its steps at 50 GFLOP/s outran
    that, so it measured again and logged MFU 0.5, not 10. A later process's busy measurement (3) leaves the kept
    best at 100; a quiet one (120) raises it."""
    figures = [5e9, 100e9, 3e9, 120e9]
    monkeypatch.setattr(hardware, "measure_cpu_peak", lambda precision: figures.pop(0))
    hw = get_hardware("cpu", "fp32")
    assert (hw.peak_flops, _kept_best("fp32")) == (5e9, 5)

    class Bar:
        disable = True

        def set_postfix(self, postfix):
            pass

    lines = []
    logger = StepLogger(tmp_path, TrainConfig(log=LogConfig(log_interval=2)), tokens_per_step=1000, flops_per_token=1e6,
                        peak_flops=hw.peak_flops, price=None, stop_at=10, bar=Bar(), emit=lines.append,
                        measure_peak=hw.measure_again)
    for seconds in (1.0, 0.02):  # the first step (compile's) is left out: the second ran 50 GFLOP/s
        logger.count(seconds, 1000)
    record = logger.record(2, 5.0, 1e-3, 1.0, elapsed=1.02, skipped=0)
    logger.close()
    assert record["mfu"] == pytest.approx(0.5) and _kept_best("fp32") == 100 and lines == []
    # The rest of this process's runs are over the raised peak, without measuring again.
    assert get_hardware("cpu", "fp32").peak_flops == 100e9 and len(figures) == 2
    peaks = []
    for _ in range(2):  # two more processes
        hardware._PROCESS_PEAKS.clear()
        peaks.append((get_hardware("cpu", "fp32").peak_flops, _kept_best("fp32")))
    assert peaks == [(100e9, 100), (120e9, 120)] and figures == []


def test_the_figures_that_chose_auto_precision_count_among_the_measurements(monkeypatch):
    """A cache written before peaks were kept holds only the figures that decided precision auto: a busy
    measurement now (30 GFLOP/s) does not undercut the 90 measured then."""
    path = hardware.precision_cache_path()
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({hardware._cpu_key(): {"choice": "fp32", "fp32_gflops": 90.0, "bf16_gflops": 2.0}}))
    monkeypatch.setattr(hardware, "measure_cpu_peak", lambda precision: 30e9)
    assert get_hardware("cpu", "fp32").peak_flops == 90e9 and _kept_best("fp32") == 90


def test_where_the_cache_cannot_be_kept_the_process_peak_still_only_rises(monkeypatch, tmp_path):
    """A cache folder that cannot be made (here under a file) keeps nothing, and training goes on: its process's
    peak, measured again in a busy moment, stays at its best."""
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("BURNOUT_CACHE_DIR", str(tmp_path / "a-file" / "cache"))
    figures = [100e9, 5e9]
    monkeypatch.setattr(hardware, "measure_cpu_peak", lambda precision: figures.pop(0))
    hw = get_hardware("cpu", "fp32")
    assert (hw.peak_flops, hw.measure_again(), figures) == (100e9, 100e9, [])


def test_two_processes_raising_the_peak_at_once_keep_the_higher(monkeypatch):
    """The cache is read, raised and written under an flock: while another process holds it (here the test, which
    raises the best to 80 meanwhile), a run that measured 50 waits, then reads 80 and keeps it."""
    monkeypatch.setattr(hardware, "measure_cpu_peak", lambda precision: 50e9)
    path = hardware.precision_cache_path()
    path.parent.mkdir(parents=True)
    peaks = []
    with open(path.with_name(path.name + ".lock"), "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        run = threading.Thread(target=lambda: peaks.append(get_hardware("cpu", "fp32").peak_flops))
        run.start()
        run.join(timeout=0.5)
        assert run.is_alive() and not path.exists()  # waiting, nothing written
        path.write_text(json.dumps({hardware._cpu_key(): {"best_gflops": {"fp32": 80.0}}}))
    run.join(timeout=30)
    assert peaks == [80e9] and _kept_best("fp32") == 80


def test_a_run_whose_cpu_peak_was_measured_busy_measures_it_again_and_logs_no_mfu_over_one(
        tiny_run_config, tiny_bpe_data, tmp_path, monkeypatch):
    """Through the loop: a first measurement no step stays under (1 FLOP/s) is measured again at the first record,
    and every MFU the run logs is over the new figure (a PFLOP/s: far under 1)."""
    from burnout.runs import start_training
    from burnout.train.metrics import read_metrics

    figures = [1.0, 1e15]
    monkeypatch.setattr(hardware, "measure_cpu_peak", lambda precision: figures.pop(0))
    cfg = tiny_run_config(max_steps=6, log_interval=2, eval_interval=6, hardware="cpu")
    start_training(cfg, tmp_path / "run", data_dir=tiny_bpe_data, on_event=lambda line: None, progress=False)
    mfu = [r.get("mfu") for r in read_metrics(tmp_path / "run") if "tokens_per_s" in r]
    assert figures == [] and len(mfu) == 3 and all(0 < m < 1e-3 for m in mfu), mfu


def test_the_price_a_dollar_budget_buys_its_minutes_at():
    """hardware_price, what --dollars divides by: train.price_per_hour when given, else the table entry's price (a
    price in compute units at its dollars per unit), and none for a CPU, said as such (red when the table's price,
    or the compute units', is not read)."""
    cpu = torch.device("cpu")
    assert hardware.hardware_price("auto", None, cpu) == (None, "a CPU")
    assert hardware.hardware_price("auto", 0.42, cpu) == (0.42, "train.price_per_hour")
    table = hardware_table()
    for key, entry in table.items():
        price, what = hardware.hardware_price(key, None, cpu)
        listed = entry.get("price_per_hour")
        assert price == (listed if listed is not None else entry["units_per_hour"] * entry["dollars_per_unit"]), key
        assert price > 0 and what == f"hardware '{key}' ({entry['name']})"
    assert any("units_per_hour" in entry for entry in table.values())
    with pytest.raises(BurnoutError, match="hardware 'no-such-gpu' is not in"):
        hardware.hardware_price("no-such-gpu", None, cpu)
