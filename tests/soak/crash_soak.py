"""Crash soak: SIGKILL a real `burnout train` (data preparation included) at random points, resume, repeat.

Every round runs the real CLI (`burnout.cli.main`) in a fresh process forked from a server that has
already imported torch, so a round costs milliseconds to start, not seconds. A round is killed either
by itself at the k-th file operation of a chosen kind (Python audit events: open, rename, remove,
mkdir, rmtree, copyfile), immediately or a few milliseconds later, or by this process after a random
delay. Kinds: `prep` (anything under RUN/data), `ckpt-write` (inside a checkpoint's `.tmp-*` folder),
`ckpt` (anything under RUN/checkpoints, pruning included), `any` (anything under RUN) and `timed`.

After every kill it checks what a person could find on disk at that moment:
- every `checkpoints/step_*` folder loads, and its weights are bitwise those of the uninterrupted run
  at that step;
- every shard listed in the data manifest has its full size and its sha256, and equals the
  uninterrupted run's shard; a folder with meta.json passes `read_meta` and `verify_checksums`;
- config.yaml parses; every line of metrics.jsonl parses and equals the uninterrupted run's record for
  that step (timing keys aside);
- no process of the killed round (tokenizer workers included) outlives it.

At the end of each campaign (a run driven to completion through kills and resumes) the final weights,
the checkpoint set, the loss log (timing keys aside) and the token shards equal the uninterrupted run's.

Used by tests/soak/test_crash_soak.py (a short version in CI; BURNOUT_SOAK_KILLS=200 for a long one)
and runnable alone: `python tests/soak/crash_soak.py --kills 100 --seed 7 --work /tmp/soak`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing
import os
import random
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch  # noqa: F401
import torch._dynamo  # noqa: F401  (the first AdamW imports it: three seconds a round otherwise)
import yaml

import burnout.cli  # noqa: F401  (preloaded by the fork server: rounds start with everything imported)
import burnout.runs  # noqa: F401
from burnout.train.metrics import TIMING_KEYS

FS_EVENTS = {"open", "os.rename", "os.remove", "os.rmdir", "os.mkdir", "shutil.rmtree", "shutil.copyfile",
             "shutil.copytree", "os.truncate"}
KINDS = ("prep", "ckpt-write", "ckpt", "any")
ROUND_TIMEOUT_S = 300

TINY_MODEL = {"family": "llama", "vocab_size": 512, "n_layer": 2, "d_model": 64, "n_head": 4, "n_kv_head": 2,
              "context_length": 64, "ffn_multiple_of": 32}


def soak_config(steps: int, keep_last: int) -> dict:
    """A tiny llama trained on a 60k-character sample cut into 3,000-token shards (about ten of them)."""
    return {
        "model": dict(TINY_MODEL),
        "data": {"max_chars": 60_000, "shard_tokens": 3_000},
        "tokenizer": {"kind": "bpe", "vocab_size": 512},
        "train": {"device": "cpu", "precision": "fp32", "batch_size": 4, "seq_len": 32, "max_steps": steps,
                  "lr": 3e-3, "min_lr": 3e-4, "warmup_steps": 3, "log_interval": 2, "eval_interval": 8,
                  "eval_batches": 2, "ckpt_interval": 4, "keep_last": keep_last, "hardware": "cpu",
                  "sample_prompt": "The ", "sample_tokens": 8},
    }


# ----------------------------------------------------------------------------------------------
# The child: one round of the real CLI, optionally killing itself at a chosen file operation


def _kind_of(path: str, root: str) -> set[str]:
    if not (path + os.sep).startswith(root):
        return set()
    kinds = {"any"}
    rel = path[len(root):]
    if rel.startswith("data" + os.sep) or rel == "data":
        kinds.add("prep")
    if rel.startswith("checkpoints" + os.sep):
        kinds.add("ckpt")
        if rel.startswith(os.path.join("checkpoints", ".tmp-")):
            kinds.add("ckpt-write")
    return kinds


def _install_kill_hook(run_dir: str, kind: str | None, k: int, delay: float, record_path: str) -> dict:
    """An audit hook counting file operations under `run_dir` per kind; SIGKILL at the k-th of `kind`."""
    root = os.path.join(os.path.abspath(run_dir), "")
    counts = {name: 0 for name in KINDS}
    state = {"rmtree": None, "fired": False}

    def hook(event, args):
        if event not in FS_EVENTS or state["fired"] or not args:
            return
        try:
            path = os.fsdecode(args[0])
        except TypeError:  # a file descriptor
            return
        if event == "shutil.rmtree":
            state["rmtree"] = path
        if not os.path.isabs(path):
            # rmtree removes entries by name relative to the folder's descriptor
            base = state["rmtree"] if event in ("os.remove", "os.rmdir") and state["rmtree"] else os.getcwd()
            path = os.path.join(base, path)
        for name in _kind_of(path, root):
            counts[name] += 1
        if kind is not None and counts[kind] == k:
            state["fired"] = True
            with open(record_path, "a") as f:
                f.write(json.dumps({"kind": kind, "k": k, "delay": delay, "event": event, "path": path}) + "\n")
            if delay:
                threading.Timer(delay, os.kill, (os.getpid(), signal.SIGKILL)).start()
            else:
                os.kill(os.getpid(), signal.SIGKILL)

    sys.addaudithook(hook)
    return counts


def _child(argv: list[str], run_dir: str, log_path: str, kind: str | None, k: int, delay: float,
           record_path: str) -> None:
    os.setpgrp()  # the round and any encoding workers it starts share a group: nothing outlives it unseen
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    torch.set_num_threads(1)
    counts = _install_kill_hook(run_dir, kind, k, delay, record_path)
    code = burnout.cli.main(argv)
    if kind is None:
        with open(record_path, "w") as f:
            json.dump(counts, f)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


# ----------------------------------------------------------------------------------------------
# The parent


class Soak:
    def __init__(self, work: Path, kills: int, seed: int, steps: int = 40, keep_last: int = 2,
                 log=print) -> None:
        self.work = Path(work).resolve()
        self.kills_wanted = kills
        self.rng = random.Random(seed)
        self.steps = steps
        self.keep_last = keep_last
        self.log = log
        self.kills: list[dict] = []
        self.rounds = 0
        self.campaigns = 0
        self.ctx = multiprocessing.get_context("forkserver")
        self.ctx.set_forkserver_preload([__name__])
        self._start_fork_server()

    @staticmethod
    def _start_fork_server() -> None:
        """Start the fork server with this module importable (3.11's ignores the parent's sys.path)."""
        from multiprocessing import forkserver

        old = os.environ.get("PYTHONPATH")
        os.environ["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parent), *([old] if old else [])])
        try:
            forkserver.ensure_running()
        finally:
            if old is None:
                del os.environ["PYTHONPATH"]
            else:
                os.environ["PYTHONPATH"] = old

    # -- running rounds

    def _round(self, argv: list[str], run_dir: Path, kind: str | None = None, k: int = 0, delay: float = 0.0,
               after_s: float | None = None) -> tuple[int, dict | None]:
        self.rounds += 1
        log_path = self.work / "logs" / f"round-{self.rounds:04d}.log"
        record_path = self.work / "logs" / f"round-{self.rounds:04d}.json"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        proc = self.ctx.Process(target=_child, args=(argv, str(run_dir), str(log_path), kind, k, delay,
                                                     str(record_path)))
        start = time.monotonic()
        proc.start()
        if after_s is not None:
            proc.join(after_s)
            if proc.exitcode is None:
                os.kill(proc.pid, signal.SIGKILL)
                record_path.write_text(json.dumps({"kind": "timed", "after_s": round(after_s, 3)}) + "\n")
        proc.join(ROUND_TIMEOUT_S)
        if proc.exitcode is None:
            self._kill_group(proc.pid)
            proc.join(10)
            raise AssertionError(f"round {self.rounds} ({argv}) hung for {ROUND_TIMEOUT_S}s:\n{self._tail(log_path)}")
        if os.environ.get("SOAK_DEBUG"):
            self.log(f"round {self.rounds} {argv[1]} {kind} {k} {after_s}: "
                     f"{time.monotonic() - start:.2f}s exit {proc.exitcode}")
        leftover = self._reap_group(proc.pid)
        assert not leftover, f"round {self.rounds}: processes outlived the killed run: {leftover}"
        record = json.loads(record_path.read_text().splitlines()[-1]) if record_path.exists() else None
        if record is not None:
            record["seconds"] = round(time.monotonic() - start, 3)
        if proc.exitcode not in (0, -signal.SIGKILL):
            raise AssertionError(f"round {self.rounds} ({' '.join(argv)}) exited {proc.exitcode}:\n"
                                 f"{self._tail(log_path)}")
        return proc.exitcode, record

    @staticmethod
    def _tail(path: Path) -> str:
        return path.read_text(errors="replace")[-4000:] if path.exists() else "(no log)"

    @staticmethod
    def _kill_group(pgid: int) -> None:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def _reap_group(self, pgid: int) -> list[int]:
        """Processes left in the round's group: given 10 s to notice their parent is gone, then killed."""
        deadline = time.monotonic() + 10
        while True:
            members = [int(p) for p in os.listdir("/proc") if p.isdigit() and _pgid(int(p)) == pgid]
            if not members or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        if members:
            self._kill_group(pgid)
        return members

    # -- the soak

    def run(self) -> dict:
        self.work.mkdir(parents=True, exist_ok=True)
        self.config = self.work / "soak.yaml"
        self.config.write_text(yaml.safe_dump(soak_config(self.steps, self.keep_last)))
        ref_config = self.work / "reference.yaml"
        ref_config.write_text(yaml.safe_dump(soak_config(self.steps, keep_last=10_000)))
        self.ref = self.work / "reference"
        shutil.rmtree(self.ref, ignore_errors=True)
        t0 = time.monotonic()
        code, counts = self._round(["train", str(ref_config), "--out", str(self.ref)], self.ref)
        assert code == 0 and counts, (
            f"the uninterrupted run failed:\n{self._tail(self.work / 'logs' / 'round-0001.log')}")
        self.ref_seconds = time.monotonic() - t0
        self.counts = counts
        n_ckpts = self.steps // 4
        self.ref_metrics = {r["step"]: _untimed(r) for r in _read_jsonl(self.ref / "metrics.jsonl")}
        self.ref_ckpts = sorted(p.name for p in (self.ref / "checkpoints").iterdir() if p.name.startswith("step_"))
        self.log(f"reference: {self.ref_seconds:.1f}s, {len(self.ref_ckpts)} checkpoints, file operations {counts}")

        while len(self.kills) < self.kills_wanted:
            self.campaigns += 1
            assert self.campaigns <= 5 + self.kills_wanted, "the soak is not making progress"
            run = self.work / f"run-{self.campaigns}"
            shutil.rmtree(run, ignore_errors=True)
            while True:
                argv = (["train", "--resume", str(run)] if (run / "config.yaml").exists()
                        else ["train", str(self.config), "--out", str(run)])
                plan = self._plan(run, n_ckpts) if len(self.kills) < self.kills_wanted else {}
                code, record = self._round(argv, run, **plan)
                if code == 0:
                    break
                self.kills.append({**(record or {"kind": "timed"}), "campaign": self.campaigns, "argv": argv[1]})
                self.check_on_disk(run)
            self.check_final(run)
            self.log(f"campaign {self.campaigns}: finished after {len(self.kills)} kills in all")
        return {"kills": self.kills, "rounds": self.rounds, "campaigns": self.campaigns}

    def _plan(self, run: Path, n_ckpts: int) -> dict:
        """Where the next round dies: the first kills hit data preparation, then checkpoint writes, then anywhere."""
        done = {kind: sum(1 for kill in self.kills if kill.get("kind") == kind) for kind in (*KINDS, "timed")}
        delay = self.rng.choice([0.0, 0.0, self.rng.uniform(0.0005, 0.005)])
        prepared = (run / "data" / "meta.json").exists()
        if not prepared and done["prep"] < 2:
            return {"kind": "prep", "k": self.rng.randint(1, max(1, self.counts["prep"] // 3)), "delay": delay}
        per_ckpt_write = max(1, self.counts["ckpt-write"] // n_ckpts)
        per_ckpt = max(1, self.counts["ckpt"] // n_ckpts)
        if done["ckpt-write"] < 2:
            return {"kind": "ckpt-write", "k": self.rng.randint(1, 2 * per_ckpt_write), "delay": delay}
        if done["ckpt"] < 1:
            return {"kind": "ckpt", "k": self.rng.randint(1, 2 * per_ckpt), "delay": delay}
        roll = self.rng.random()
        if roll < 0.3:
            return {"kind": "ckpt-write", "k": self.rng.randint(1, 2 * per_ckpt_write), "delay": delay}
        if roll < 0.5:
            return {"kind": "ckpt", "k": self.rng.randint(1, 2 * per_ckpt), "delay": delay}
        if roll < 0.75:
            return {"kind": "any", "k": self.rng.randint(1, max(1, self.counts["any"] // 4)), "delay": delay}
        return {"after_s": self.rng.uniform(0.02, 1.0)}  # a round takes about a second

    # -- what must hold on disk

    def check_on_disk(self, run: Path) -> None:
        from burnout.config import load_run_config
        from burnout.core.checkpoint import list_checkpoints, load_checkpoint
        from burnout.data.shards import read_meta, verify_checksums

        where = f"after kill {len(self.kills)} ({self.kills[-1] if self.kills else 'none'})"
        data = run / "data"
        manifest_path = data / "manifest.json"
        if manifest_path.exists():
            manifest = json.loads(manifest_path.read_text())  # written atomically: never torn
            for _split, shards in manifest["shards"].items():
                for shard in shards:
                    blob = (data / shard["file"]).read_bytes()
                    assert len(blob) == 2 * shard["tokens"], f"{where}: {shard['file']} is half-written"
                    assert hashlib.sha256(blob).hexdigest() == shard["sha256"], f"{where}: {shard['file']} damaged"
                    assert blob == (self.ref / "data" / shard["file"]).read_bytes(), f"{where}: {shard['file']} differs"
        if (data / "meta.json").exists():
            read_meta(data)
            verify_checksums(data)
        if (run / "config.yaml").exists():
            load_run_config(run / "config.yaml")
        for record in _read_jsonl(run / "metrics.jsonl"):
            assert _untimed(record) == self.ref_metrics[record["step"]], f"{where}: metrics step {record['step']}"
        for ckpt in list_checkpoints(run):
            load_checkpoint(ckpt)  # raises on anything unreadable
            ours = (ckpt / "model.safetensors").read_bytes()
            assert ours == (self.ref / "checkpoints" / ckpt.name / "model.safetensors").read_bytes(), \
                f"{where}: {ckpt.name} has other weights than the uninterrupted run"

    def check_final(self, run: Path) -> None:
        from burnout.data.shards import verify_checksums

        self.check_on_disk(run)
        names = sorted(p.name for p in (run / "checkpoints").iterdir() if p.name.startswith("step_"))
        others = [p.name for p in (run / "checkpoints").iterdir() if not p.name.startswith("step_")]
        # A kill while pruning can leave a `.tmp-*` folder (the next save removes it): never a step_* one.
        assert all(name.startswith(".tmp-") for name in others), others
        # The last keep_last are there; a kill between the final save and its pruning can leave one older
        # checkpoint too (nothing is saved after it to prune it), which check_on_disk proved whole and exact.
        assert names[-self.keep_last:] == self.ref_ckpts[-self.keep_last:], f"checkpoints {names}"
        assert set(names) <= set(self.ref_ckpts) and len(names) <= self.keep_last + 1, f"checkpoints {names}"
        last = self.ref_ckpts[-1]
        assert (run / "checkpoints" / last / "model.safetensors").read_bytes() == \
            (self.ref / "checkpoints" / last / "model.safetensors").read_bytes(), "final weights differ"
        ours = [_untimed(r) for r in _read_jsonl(run / "metrics.jsonl")]
        assert ours == list(self.ref_metrics.values()), "the loss log differs from the uninterrupted run's"
        verify_checksums(run / "data")
        ref_files = sorted(p.name for p in (self.ref / "data").iterdir())
        assert sorted(p.name for p in (run / "data").iterdir()) == ref_files, "data folder holds other files"
        for name in ref_files:
            if name.endswith(".bin") or name == "tokenizer.json":
                assert (run / "data" / name).read_bytes() == (self.ref / "data" / name).read_bytes(), name


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except (ProcessLookupError, PermissionError):
        return None


def _read_jsonl(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _untimed(record: dict) -> dict:
    return {k: v for k, v in record.items() if k not in TIMING_KEYS}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--work", help="folder for the runs (default: a temporary one, removed after)")
    args = parser.parse_args()
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="burnout-soak-"))
    t0 = time.monotonic()
    summary = Soak(work, args.kills, args.seed, args.steps).run()
    kinds = {}
    for kill in summary["kills"]:
        kinds[kill["kind"]] = kinds.get(kill["kind"], 0) + 1
    print(f"{len(summary['kills'])} kills ({kinds}) in {summary['campaigns']} campaigns, {summary['rounds']} rounds, "
          f"{time.monotonic() - t0:.0f}s: every invariant held")
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import crash_soak  # the fork server imports the module by this name

    crash_soak.main()
