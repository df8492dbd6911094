"""A wheel install works outside the repository: the presets (burnout/configs/) ship as package data and
every subpackage is in the wheel. Builds the wheel offline, installs it into a folder with --target and
runs `burnout model list` and a 2-step `burnout train quickstart` from a cwd outside the checkout, with
that folder first on PYTHONPATH (ahead of the venv's editable install of this repo)."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

try:
    import tomllib
except ImportError:  # Python 3.10: the TOML reader pytest itself uses there
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[1]

# The quickstart config shrunk to a few seconds on a CPU (its data mix and model, smaller).
TINY = ["train.max_steps=2", "train.device=cpu", "train.precision=fp32", "train.batch_size=4", "train.seq_len=64",
        "data.max_chars=150000", "tokenizer.vocab_size=512", "model.n_layer=2", "model.d_model=64",
        "model.n_head=4", "model.n_kv_head=2", "model.context_length=64"]


def run(args: list[str], cwd: Path, env: dict | None = None, timeout: float = 120) -> str:
    proc = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def is_under(path: str | Path, folder: Path) -> bool:
    return Path(path).resolve().is_relative_to(folder.resolve())


@pytest.mark.slow
def test_wheel_install_runs_outside_the_repo(tmp_path):
    # Build from a copy of what the wheel is made of, so that setuptools' build/ and *.egg-info land in
    # tmp_path, not the checkout (and a stale build/lib there cannot slip files into the wheel).
    src = tmp_path / "src"
    shutil.copytree(REPO / "burnout", src / "burnout", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, src / name)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--quiet"]
    wheels = tmp_path / "wheels"
    # Offline: setuptools comes from the venv (dev extras), nothing is downloaded.
    run([*pip, "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", str(wheels), str(src)], tmp_path)
    (wheel,) = wheels.glob("gpuburnout-*.whl")
    target = tmp_path / "site"
    run([*pip, "install", "--no-deps", "--no-index", "--target", str(target), str(wheel)], tmp_path)

    outside = tmp_path / "cwd"
    outside.mkdir()
    assert not is_under(outside, REPO) and not is_under(target, REPO)
    env = {**os.environ, "PYTHONPATH": str(target), "PYTHONUNBUFFERED": "1"}
    env.pop("PYTHONHOME", None)

    where = run([sys.executable, "-c", "import burnout, burnout.config as c; print(burnout.__file__); "
                 "print(c.CONFIG_DIR)"], outside, env).splitlines()
    assert len(where) == 2 and all(is_under(p, target) for p in where), where

    listing = run([sys.executable, "-m", "burnout", "model", "list"], outside, env)
    for preset in ("llama-1b", "llama-tiny", "gpt2-124m", "shakespeare-fast"):
        assert preset in listing, listing

    out = tmp_path / "run"
    trained = run([sys.executable, "-m", "burnout", "train", "quickstart", "--out", str(out), *TINY], outside, env,
                  timeout=300)
    checkpoints = sorted((out / "checkpoints").glob("step_*"))
    assert checkpoints and (checkpoints[-1] / "model.safetensors").is_file(), trained
    assert checkpoints[-1].name.endswith("2"), checkpoints
    assert list(outside.iterdir()) == []  # nothing written to the cwd


@pytest.mark.slow
def test_a_missing_dev_extra_fails_under_ci_and_skips_elsewhere(tmp_path):
    """The equality proofs importorskip transformers, peft, lm_eval and trl: under CI=true a missing one must
    fail the suite (tests/conftest.py), not skip it."""
    (tmp_path / "test_probe.py").write_text('import pytest\n\n\ndef test_needs_an_extra():\n'
                                           '    pytest.importorskip("no_such_dev_extra")\n')
    runs = {}
    for ci in ("true", "false"):
        runs[ci] = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "conftest",
                                   "test_probe.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                                  env={**os.environ, "CI": ci, "PYTHONPATH": str(REPO / "tests")})
    assert runs["true"].returncode != 0 and "no_such_dev_extra is missing under CI=true" in runs["true"].stdout
    assert runs["false"].returncode == 0 and "1 skipped" in runs["false"].stdout


# What the README's commands import beyond the base install: a line of the README, and the module it needs.
README_NEEDS = {"burnout data audit": "datasketch", "burnout playground": "gradio", "from transformers": "transformers"}


def test_make_demo_installs_what_the_readme_runs():
    """`make demo`, the README's set-up command, installs the optional dependencies of every command the README's
    first hour runs: one command, not one error at a time."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    for line in README_NEEDS:
        assert line in readme, f"the README no longer runs {line!r}: update README_NEEDS"
    dry_run = run(["make", "--dry-run", "--always-make", "demo"], REPO)
    installs = [line for line in dry_run.splitlines() if "pip install" in line and " -e " in line]
    assert len(installs) == 1, dry_run
    extras = re.search(r"\.\[([\w,-]+)\]", installs[0])
    assert extras, f"make demo installs no extras: {installs[0]}"
    optional = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    installed = {re.match(r"[\w-]+", requirement).group() for extra in extras.group(1).split(",")
                 for requirement in optional[extra]}
    for line, module in README_NEEDS.items():
        assert module in installed, f"the README's {line!r} needs {module}, which make demo does not install"
