"""benchmarks/bench_shakespeare.py's nanoGPT side, against a stand-in checkout whose train.py logs as nanoGPT's does:
the CPU recipe of nanoGPT's README is what it runs, its data are written beside it, its last val loss is read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.bench_shakespeare import NANOGPT_CPU_RECIPE, nanogpt

FAKE_TRAIN = '''import json, os, sys
json.dump({"argv": sys.argv[1:], "cwd": os.getcwd()}, open(os.path.join(os.path.dirname(__file__), "called.json"), "w"))
for step, val in ((0, 4.1746), (250, 1.9874), (2000, 1.8857)):
    print(f"step {step}: train loss {val - 0.1:.4f}, val loss {val:.4f}")
    print(f"iter {step}: loss {val:.4f}, time 12.34ms, mfu 0.01%")
'''


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    (tmp_path / "nanoGPT" / "config").mkdir(parents=True)
    (tmp_path / "nanoGPT" / "train.py").write_text(FAKE_TRAIN)
    (tmp_path / "nanoGPT" / "config" / "train_shakespeare_char.py").write_text("")
    return tmp_path / "nanoGPT"


def test_nanogpt_runs_its_readmes_cpu_recipe_and_gives_its_last_val_loss(checkout, tmp_path):
    text = tmp_path / "input.txt"
    text.write_text("First Citizen:\nBefore we proceed any further, hear me speak.\n" * 50)
    wall, val = nanogpt(checkout, text)
    called = json.loads((checkout / "called.json").read_text())
    assert val == 1.8857 and wall > 0
    assert called["argv"][:-1] == ["config/train_shakespeare_char.py", *NANOGPT_CPU_RECIPE]
    out_dir = Path(called["argv"][-1].removeprefix("--out_dir="))
    assert called["argv"][-1].startswith("--out_dir=") and checkout not in out_dir.parents
    assert Path(called["cwd"]) == checkout
    assert {"--device=cpu", "--compile=False", "--max_iters=2000", "--n_layer=4", "--n_embd=128",
            "--block_size=64", "--batch_size=12", "--dropout=0.0"} <= set(NANOGPT_CPU_RECIPE)
    assert {p.name for p in (checkout / "data" / "shakespeare_char").iterdir()} == {"train.bin", "val.bin",
                                                                                       "meta.pkl"}


def test_a_folder_that_is_not_a_nanogpt_checkout_is_one_line(tmp_path):
    with pytest.raises(SystemExit) as done:
        nanogpt(tmp_path, tmp_path / "input.txt")
    assert "no train.py and config/train_shakespeare_char.py there" in str(done.value)


def test_a_train_py_that_prints_no_val_loss_is_one_line(checkout, tmp_path):
    (checkout / "train.py").write_text("import sys; sys.exit(3)\n")
    (checkout / "data" / "shakespeare_char").mkdir(parents=True)
    (checkout / "data" / "shakespeare_char" / "meta.pkl").write_bytes(b"")
    with pytest.raises(SystemExit) as done:
        nanogpt(checkout, tmp_path / "input.txt")
    assert str(done.value).startswith("nanoGPT's train.py failed (exit 3)")
