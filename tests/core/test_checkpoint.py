"""Checkpoints: a faithful round trip, safe loading, pruning, crash leftovers, corrupt files, the sha256 of
each file checked on loading and mirroring, and the size a checkpoint will take."""

import json
import random
import re
import shutil
from pathlib import Path

import pytest
import safetensors.torch
import torch
import yaml

from burnout.cli import main
from burnout.config import load_run_config
from burnout.core.checkpoint import (
    MANIFEST_FILE,
    CheckpointMirror,
    checkpoint_bytes,
    checkpoint_problem,
    folder_bytes,
    list_checkpoints,
    load_checkpoint,
    resolve_checkpoint,
    save_checkpoint,
)
from burnout.errors import BurnoutError
from burnout.models import Transformer
from burnout.train.optim import make_optimizer


def _trained_state(cfg, seed=0):
    """A model after one optimizer step and the state dict the loop would checkpoint with it."""
    torch.manual_seed(seed)
    model = Transformer(cfg.model)
    optimizer = make_optimizer(model, cfg.train)
    x = torch.randint(0, cfg.model.vocab_size, (2, 16))
    model(x, x).backward()
    optimizer.step()
    state = {"optimizer": optimizer.state_dict(), "step": 7, "tokens": 7 * 128, "elapsed_s": 1.5,
             "python_rng": random.getstate(), "torch_rng": torch.get_rng_state()}
    return model, state


def _save(run_dir, cfg, model, state, step, tokenizer_path, keep_last=10):
    info = {"step": step, "tokens": step * 128, "train_loss": 5.0, "val_loss": 5.5, "elapsed_s": 1.5}
    return save_checkpoint(run_dir, cfg, model, state, info, tokenizer_path, keep_last)


@pytest.mark.parametrize("tie", [True, False])
def test_round_trip_keeps_weights_config_info_and_state(tiny_run_config, tiny_bpe_data, tmp_path, tie):
    cfg = tiny_run_config([f"model.tie_embeddings={str(tie).lower()}"])
    model, state = _trained_state(cfg)
    path = _save(tmp_path, cfg, model, state, 7, tiny_bpe_data / "tokenizer.json")
    assert path == tmp_path / "checkpoints" / "step_0000007"
    assert sorted(p.name for p in path.iterdir()) == [
        "config.yaml", "info.json", "model.safetensors", "sha256.json", "state.pt", "tokenizer.json"]
    assert (path / "tokenizer.json").read_bytes() == (tiny_bpe_data / "tokenizer.json").read_bytes()

    ckpt = load_checkpoint(path)
    assert ckpt.path == path and ckpt.config == cfg
    assert ckpt.info == {"step": 7, "tokens": 7 * 128, "train_loss": 5.0, "val_loss": 5.5, "elapsed_s": 1.5}
    ours, theirs = model.state_dict(), ckpt.model.state_dict()
    assert ours.keys() == theirs.keys()
    for key in ours:
        assert torch.equal(ours[key], theirs[key]), key
    loaded = ckpt.model
    assert (loaded.lm_head.weight is loaded.tok_emb.weight) == tie
    if tie:  # the matrix is stored once
        assert len(safetensors.torch.load_file(path / "model.safetensors")) == len(ours) - 1
    else:
        assert not torch.equal(loaded.lm_head.weight, loaded.tok_emb.weight)
    x = torch.randint(0, cfg.model.vocab_size, (1, 20))
    model.eval()
    assert torch.equal(model(x), loaded.eval()(x))

    # state.pt holds only plain data: it loads with weights_only=True, optimizer moments included.
    raw = torch.load(path / "state.pt", weights_only=True)
    assert ckpt.state.keys() == raw.keys() == state.keys()
    assert raw["step"] == 7 and raw["python_rng"] == state["python_rng"]
    assert torch.equal(raw["torch_rng"], state["torch_rng"])
    fresh = make_optimizer(Transformer(cfg.model), cfg.train)
    fresh.load_state_dict(raw["optimizer"])
    (saved,), (original,) = raw["optimizer"], state["optimizer"]  # one state dict per optimizer
    for key, value in original["state"].items():
        assert torch.equal(saved["state"][key]["exp_avg"], value["exp_avg"])


def test_keep_last_prunes_the_oldest(tiny_run_config, tiny_bpe_data, tmp_path):
    cfg = tiny_run_config()
    model, state = _trained_state(cfg)
    for step in (10, 20, 30, 40, 50):
        _save(tmp_path, cfg, model, state, step, tiny_bpe_data / "tokenizer.json", keep_last=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_0000040", "step_0000050"]
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_0000040", "step_0000050"]
    # Ordered by step number, not by name length or creation order.
    _save(tmp_path, cfg, model, state, 9, tiny_bpe_data / "tokenizer.json", keep_last=5)
    _save(tmp_path, cfg, model, state, 100, tiny_bpe_data / "tokenizer.json", keep_last=5)
    assert [p.name for p in list_checkpoints(tmp_path)] == [
        "step_0000009", "step_0000040", "step_0000050", "step_0000100"]


def test_a_crash_leftover_is_never_listed_and_is_cleaned_by_the_next_save(tiny_run_config, tiny_bpe_data, tmp_path):
    cfg = tiny_run_config()
    model, state = _trained_state(cfg)
    first = _save(tmp_path, cfg, model, state, 10, tiny_bpe_data / "tokenizer.json")
    # A save of step 20 that died half way: a temp folder with a partial weights file.
    leftover = tmp_path / "checkpoints" / ".tmp-step_0000020"
    leftover.mkdir()
    (leftover / "model.safetensors").write_bytes(b"\x00" * 10)
    (tmp_path / "checkpoints" / "notes.txt").write_text("not a checkpoint")
    assert list_checkpoints(tmp_path) == [first]
    assert resolve_checkpoint(tmp_path) == first
    assert load_checkpoint(tmp_path).path == first

    second = _save(tmp_path, cfg, model, state, 30, tiny_bpe_data / "tokenizer.json")
    assert not leftover.exists()
    assert list_checkpoints(tmp_path) == [first, second]


def test_a_compiled_model_is_saved_under_the_plain_names(tiny_run_config, tiny_bpe_data, tmp_path):
    cfg = tiny_run_config()
    model, state = _trained_state(cfg)
    path = _save(tmp_path, cfg, torch.compile(model), state, 7, tiny_bpe_data / "tokenizer.json")
    assert safetensors.torch.load_file(path / "model.safetensors").keys() <= model.state_dict().keys()
    loaded = load_checkpoint(path).model.state_dict()
    assert all(torch.equal(value, loaded[key]) for key, value in model.state_dict().items())


def test_the_files_a_person_opens_read_in_order_and_indented(tiny_run_config, tiny_bpe_data, tmp_path):
    cfg = tiny_run_config()
    model, state = _trained_state(cfg)
    path = _save(tmp_path, cfg, model, state, 7, tiny_bpe_data / "tokenizer.json")
    config_text = (path / "config.yaml").read_text()
    assert list(yaml.safe_load(config_text)) == list(cfg.to_dict())  # model, data, train …: as written
    assert config_text == yaml.safe_dump(cfg.to_dict(), sort_keys=False)
    for name in ("info.json", MANIFEST_FILE):
        text = (path / name).read_text()
        assert text == json.dumps(json.loads(text), indent=2), name


@pytest.mark.parametrize("failure, reason", [
    (OSError(28, "No space left on device"), "No space left on device"),
    (RuntimeError("PytorchStreamWriter failed writing file data/3: file write failed\nmore"),
     "PytorchStreamWriter failed writing file data/3: file write failed"),
])
@pytest.mark.parametrize("earlier", [0, 3])
def test_a_failed_save_says_why_and_which_checkpoint_is_intact(tiny_run_config, tiny_bpe_data, tmp_path,
                                                               monkeypatch, failure, reason, earlier):
    from burnout.errors import StorageError

    cfg = tiny_run_config()
    model, state = _trained_state(cfg)
    previous = [_save(tmp_path, cfg, model, state, step, tiny_bpe_data / "tokenizer.json") for step in
                (10, 20, 30)[:earlier]]
    before = sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) if earlier else []

    def failing_save(*args, **kwargs):
        raise failure

    monkeypatch.setattr(torch, "save", failing_save)
    with pytest.raises(StorageError) as error:
        _save(tmp_path, cfg, model, state, 40, tiny_bpe_data / "tokenizer.json")
    intact = f"{previous[-1].name}, which is intact" if previous else "(none yet)"
    assert str(error.value) == (
        f"could not write checkpoint step_0000040 into {tmp_path / 'checkpoints'} ({reason}); free disk space, "
        f"then continue with `burnout train --resume {tmp_path}` from the previous checkpoint {intact}")
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == before  # no half-written folder


def test_a_save_that_cannot_make_its_folder_says_so(tiny_run_config, tiny_bpe_data, tmp_path, monkeypatch):
    from burnout.errors import StorageError

    cfg = tiny_run_config()
    model, state = _trained_state(cfg)
    real_mkdir = Path.mkdir

    def full_disk_mkdir(self, *args, **kwargs):
        if self.name.startswith(".tmp-step_"):
            raise OSError(28, "No space left on device")
        return real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", full_disk_mkdir)
    with pytest.raises(StorageError, match=r"^could not write checkpoint step_0000005 .*\(No space left on device\)"):
        _save(tmp_path, cfg, model, state, 5, tiny_bpe_data / "tokenizer.json")


def test_a_leftover_that_is_not_a_folder_does_not_stop_a_save(tiny_run_config, tiny_bpe_data, tmp_path):
    cfg = tiny_run_config()
    model, state = _trained_state(cfg)
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / ".tmp-notes").write_text("a file, where a save leaves folders")
    assert _save(tmp_path, cfg, model, state, 5, tiny_bpe_data / "tokenizer.json").name == "step_0000005"


def test_resolve_checkpoint(tiny_run_config, tiny_bpe_data, tmp_path):
    cfg = tiny_run_config()
    model, state = _trained_state(cfg)
    older = _save(tmp_path, cfg, model, state, 5, tiny_bpe_data / "tokenizer.json")
    latest = _save(tmp_path, cfg, model, state, 12, tiny_bpe_data / "tokenizer.json")
    assert resolve_checkpoint(tmp_path) == latest
    assert resolve_checkpoint(str(older)) == older
    assert list_checkpoints(tmp_path / "nowhere") == []
    with pytest.raises(BurnoutError, match="does not exist"):
        resolve_checkpoint(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(BurnoutError, match="holds no checkpoint"):
        resolve_checkpoint(tmp_path / "empty")


def test_the_loops_checkpoints_load_safely(tiny_run):
    """The state the training loop writes (RNG tuples, optimizer) loads with weights_only=True."""
    for path in list_checkpoints(tiny_run.run_dir):
        state = torch.load(path / "state.pt", map_location="cpu", weights_only=True)
        info = json.loads((path / "info.json").read_text())
        step = int(path.name.removeprefix("step_"))
        assert state["step"] == info["step"] == step
        assert state["tokens"] == info["tokens"] == step * 4 * 2 * 32
        assert {"optimizer", "python_rng", "torch_rng", "elapsed_s"} <= state.keys()
    ckpt = load_checkpoint(tiny_run.run_dir)
    assert ckpt.info["step"] == 24 and ckpt.config.model == tiny_run.cfg.model


@pytest.fixture
def saved(tiny_run_config, tiny_bpe_data, tmp_path):
    cfg = tiny_run_config()
    model, state = _trained_state(cfg)
    return _save(tmp_path, cfg, model, state, 3, tiny_bpe_data / "tokenizer.json")


@pytest.mark.parametrize("keep", [0, 7, 1000])
def test_truncated_weights_are_a_burnout_error(saved, keep):
    weights = saved / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:keep])
    with pytest.raises(BurnoutError) as refused:
        load_checkpoint(saved, verify=False)  # unchecked: what the loader itself says of the damage
    said = re.fullmatch(rf"checkpoint {re.escape(str(saved))} is unreadable: model\.safetensors \((\w+): (.+)\); "
                        "use another checkpoint of the run or train again", str(refused.value))
    assert said and said[1] == "SafetensorError" and said[2] != "None" and "\n" not in said[2]


def test_truncated_state_is_a_burnout_error(saved):
    state = saved / "state.pt"
    state.write_bytes(state.read_bytes()[:100])
    with pytest.raises(BurnoutError, match="unreadable"):
        load_checkpoint(saved)


def test_missing_weights_file_is_a_burnout_error(saved):
    (saved / "model.safetensors").unlink()
    with pytest.raises(BurnoutError):
        load_checkpoint(saved)  # now neither a checkpoint nor a run folder
    with pytest.raises(BurnoutError):
        load_checkpoint(saved.parent.parent)


@pytest.mark.parametrize("change, why", [
    pytest.param({"n_layer": 3}, "missing ['blocks.2.attn.proj.weight', 'blocks.2.attn.qkv.weight', "
                                 "'blocks.2.mlp.down.weight'], unexpected []", id="a-layer-more"),
    pytest.param({"n_layer": 1}, "missing [], unexpected ['blocks.1.attn.proj.weight', 'blocks.1.attn.qkv.weight', "
                                 "'blocks.1.mlp.down.weight']", id="a-layer-less"),
    # Loading these failed with torch's "Error(s) in loading state_dict for Transformer:" and nothing more.
    pytest.param({"vocab_size": 600}, "lm_head.weight is [512, 64] in model.safetensors and [600, 64] in "
                                      "config.yaml", id="vocabulary"),
    pytest.param({"d_model": 128}, "blocks.0.attn.proj.weight is [64, 64] in model.safetensors and [128, 128] in "
                                   "config.yaml", id="width"),
])
def test_weights_that_do_not_fit_the_config_say_which_tensor(saved, change, why):
    raw = yaml.safe_load((saved / "config.yaml").read_text())
    raw["model"].update(change)
    (saved / "config.yaml").write_text(yaml.safe_dump(raw))
    with pytest.raises(BurnoutError) as refused:
        load_checkpoint(saved, verify=False)
    assert str(refused.value) == f"checkpoint {saved} does not match its config: {why}"


# ----------------------------------------------------------------------------------------------
# Integrity: each file's sha256 recorded when saved, checked when loaded and after mirroring


def _flip_byte(path):
    """Change one bit in the middle of a file, as a failing volume might, keeping its size."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 1
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("name", ["model.safetensors", "state.pt", "config.yaml", "tokenizer.json", "info.json"])
def test_a_changed_byte_in_any_file_is_named_when_loaded(saved, name):
    assert checkpoint_problem(saved) is None
    _flip_byte(saved / name)
    assert checkpoint_problem(saved) == f"{name} does not match the sha256 recorded when it was saved"
    with pytest.raises(BurnoutError) as refused:
        load_checkpoint(saved)
    assert str(refused.value) == (f"checkpoint {saved} is unreadable: {name} does not match the sha256 recorded when "
                                  "it was saved; use another checkpoint of the run (or its copy in train.mirror_dir) "
                                  "or train again")


def test_a_missing_or_unreadable_file_or_a_damaged_manifest_is_named(saved):
    (saved / "info.json").unlink()
    assert checkpoint_problem(saved) == "info.json is missing"
    (saved / "info.json").mkdir()  # what the OS says, without the errno and path around it
    assert checkpoint_problem(saved) == "info.json cannot be read (Is a directory)"
    unreadable = f"{MANIFEST_FILE}, which records the files' sha256, is unreadable"
    (saved / MANIFEST_FILE).write_text("{not json")
    with pytest.raises(ValueError) as parse_error:
        json.loads("{not json")
    assert checkpoint_problem(saved) == f"{unreadable} ({parse_error.value})"
    (saved / MANIFEST_FILE).write_text('["model.safetensors"]')
    assert checkpoint_problem(saved) == f"{unreadable} (not a JSON object)"


def test_a_checkpoint_saved_before_manifests_loads_unchecked(saved):
    (saved / MANIFEST_FILE).unlink()
    assert checkpoint_problem(saved) is None
    assert load_checkpoint(saved).info["step"] == 3


@pytest.mark.parametrize("damage, problem", [
    (lambda ckpt: (ckpt / "state.pt").write_bytes(b""), "state.pt is empty"),
    (lambda ckpt: (ckpt / "state.pt").write_bytes((ckpt / "state.pt").read_bytes()[:1000]),
     "state.pt is not a whole zip archive (cut short or damaged)"),
    (lambda ckpt: (ckpt / "model.safetensors").write_bytes((ckpt / "model.safetensors").read_bytes()[:1000]),
     "model.safetensors is unreadable ("),
    (lambda ckpt: (ckpt / "info.json").unlink(), "info.json is missing"),
], ids=["state-emptied", "state-cut-short", "weights-cut-short", "info-missing"])
def test_a_checkpoint_saved_before_manifests_is_checked_by_its_files(saved, damage, problem):
    """Without sha256.json what can be told from the files is checked (their headers, not their bytes): an emptied
    state.pt once loaded as far as torch.load's EOFError, a traceback."""
    (saved / MANIFEST_FILE).unlink()
    damage(saved)
    assert checkpoint_problem(saved).startswith(problem)
    with pytest.raises(BurnoutError) as refused:
        load_checkpoint(saved)
    assert str(refused.value).startswith(f"checkpoint {saved} is unreadable: {problem}")


def test_a_file_of_a_checkpoint_stands_for_its_folder(saved, capsys):
    """`generate RUN/checkpoints/step_N/model.safetensors` once said the file "holds no checkpoint"."""
    assert resolve_checkpoint(saved / "model.safetensors") == saved
    argv = ["generate", "--prompt", "The ", "--max-new-tokens", "4", "--seed", "0"]
    assert main([argv[0], str(saved), *argv[1:]]) == 0
    by_folder = capsys.readouterr().out
    assert main([argv[0], str(saved / "model.safetensors"), *argv[1:]]) == 0
    assert capsys.readouterr().out == by_folder
    (saved.parent / "notes.txt").write_text("not a checkpoint file")
    with pytest.raises(BurnoutError) as refused:
        resolve_checkpoint(saved.parent / "notes.txt")
    assert str(refused.value) == (f"'{saved.parent / 'notes.txt'}' is a file; give a run folder or one of its "
                                  "checkpoints/step_* folders")


def test_the_mirror_never_keeps_a_copy_that_differs_from_the_checkpoint(saved, tmp_path, monkeypatch):
    """A copy damaged on its way to the mirror is removed, named in one line, and never takes a step_* name;
    an intact copy is kept."""
    real_copytree = shutil.copytree

    def damaging_copytree(src, dst, **kwargs):
        real_copytree(src, dst, **kwargs)
        _flip_byte(Path(dst) / "state.pt")

    errors = []
    monkeypatch.setattr(shutil, "copytree", damaging_copytree)
    mirror = CheckpointMirror(tmp_path, tmp_path / "mirror", errors.append)
    mirror.submit(saved, [saved])
    mirror.close()
    assert len(errors) == 1 and "copy of step_0000003" in errors[0] and "state.pt does not match" in errors[0]
    assert list((tmp_path / "mirror" / "checkpoints").iterdir()) == []

    monkeypatch.setattr(shutil, "copytree", real_copytree)
    mirror = CheckpointMirror(tmp_path, tmp_path / "mirror", errors.append)
    mirror.submit(saved, [saved])
    mirror.close()
    assert len(errors) == 1 and load_checkpoint(tmp_path / "mirror").path.name == "step_0000003"


def test_a_mirror_is_one_runs_another_run_is_refused_it_and_its_own_resume_goes_on(tiny_run_config, tiny_bpe_data,
                                                                                    tmp_path, capsys):
    """Another run mirrored into the same train.mirror_dir would prune the first run's checkpoints there to its own
    and overwrite its logs: it is refused in one line before its first step; the run the mirror is of resumes."""
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(tiny_run_config(max_steps=2, ckpt_interval=2).to_dict()))
    mirror = tmp_path / "mirror"

    def train(run):
        return ["train", str(config), "--out", str(run), "--data", str(tiny_bpe_data), f"train.mirror_dir={mirror}"]

    assert main(train(tmp_path / "a")) == 0
    mirrored = {p: p.read_bytes() for p in mirror.rglob("*") if p.is_file()}
    capsys.readouterr()
    assert main(train(tmp_path / "b")) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"burnout: error: train.mirror_dir {mirror} holds a mirror of the run first launched at ")
    assert "not of a run not launched yet; choose another folder" in err and len(err.splitlines()) == 1
    assert {p: p.read_bytes() for p in mirror.rglob("*") if p.is_file()} == mirrored
    assert not (tmp_path / "b").exists()
    assert main(["train", "--resume", str(tmp_path / "a"), "train.max_steps=4"]) == 0
    assert [p.name for p in list_checkpoints(mirror)] == ["step_0000002", "step_0000004"]


# ----------------------------------------------------------------------------------------------
# Size, for the disk check before step 1


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_checkpoint_bytes_covers_a_saved_checkpoint_closely(tiny_run_config, tiny_bpe_data, tmp_path, optimizer):
    cfg = tiny_run_config(optimizer=optimizer)
    model, state = _trained_state(cfg)
    path = _save(tmp_path, cfg, model, state, 7, tiny_bpe_data / "tokenizer.json")
    actual = folder_bytes(path)
    predicted = checkpoint_bytes(cfg, tiny_bpe_data / "tokenizer.json")
    assert actual <= predicted <= actual + 300_000, (actual, predicted)


def test_a_checkpoint_whose_model_this_machine_cannot_hold_is_refused_before_it_is_built(saved, monkeypatch):
    """Its config.yaml asks for 40 layers and this process has room for less: one line naming the checkpoint,
    before a module is built (building it first would end in "does not match its config", or in a killed process
    for a model of a billion layers)."""
    from burnout.models import size

    raw = yaml.safe_load((saved / "config.yaml").read_text())
    raw["model"]["n_layer"] = 40
    (saved / "config.yaml").write_text(yaml.safe_dump(raw))
    deep = load_run_config(saved / "config.yaml").model
    monkeypatch.setattr(size, "machine_memory", lambda: (size.weights_bytes(deep) - 1, "there is less"))
    with pytest.raises(BurnoutError) as refused:
        load_checkpoint(saved, verify=False)
    assert str(refused.value).startswith(f"checkpoint {saved}, ") and "parameters: n_layer 40, d_model 64" in \
        str(refused.value) and str(refused.value).endswith("and there is less; load it on a machine with more memory "
                                                           "(or check its config.yaml's model section)")
    raw["model"]["vocab_size"] = 10**18  # a whole number a setting may hold, its embedding past any address space
    (saved / "config.yaml").write_text(yaml.safe_dump(raw))
    with pytest.raises(BurnoutError, match=f"^checkpoint {saved}: model.vocab_size 1,000,000,000,000,000,000: "):
        load_checkpoint(saved, verify=False)
