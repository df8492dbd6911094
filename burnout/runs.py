"""Which recipe a run config runs, and `burnout train` as a function: start a run, resume one, or (on a machine
that can vanish) whichever of the two a run folder calls for. The path to the loop:

    train             the command: its options as arguments, checked, then one of
    start_training    a new run of the recipe its config asks for (recipe_for) → train/run.py: start_run
    resume_training   `--resume RUN`: any run, from its newest good checkpoint → train/run.py: resume_run
    start_or_resume   `--resume-if-exists`: the one of the two the run folder calls for
    recipe_for        a config with an rl section runs RL, one with a dpo section DPO, one with an sft section SFT
                      (burnout/finetune/), any other pretraining (burnout/train/recipe.py)

train/run.py then locks the folder, has the recipe prepare the data, and runs `Trainer(...).fit()` (train/loop.py).
"""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Callable, Sequence
from pathlib import Path

from burnout.base.files import RUN_CONFIG_FILE
from burnout.base.text import needs_package
from burnout.config import OptimConfig, RunConfig, load_run_config, read_saved_config, with_budget
from burnout.core.checkpoint import holds_run
from burnout.data.mix import data_run_config
from burnout.errors import BurnoutError
from burnout.finetune.recipes import DPO, SFT
from burnout.finetune.rl import RL
from burnout.generate.prompts import suggested_prompt
from burnout.train import run
from burnout.train.loop import TrainResult
from burnout.train.recipe import Pretraining, Recipe, parent_checkpoint


def recipe_for(cfg: RunConfig) -> Recipe:
    if cfg.rl is not None:
        return RL(cfg.rl)
    if cfg.dpo is not None:
        return DPO(cfg.dpo)
    if cfg.sft is not None:
        return SFT()
    return Pretraining()


def start_training(cfg: RunConfig, run_dir: Path, data_dir: Path | None = None,
                   on_event: Callable[[str], None] = print, progress: bool | None = None,
                   auto_batch: bool = False) -> TrainResult:
    """Train a new run of `cfg` in `run_dir`; pretraining data from `data_dir`, else data.prepared_dir, else
    prepared into RUN/data; a fine-tune prepares its own source."""
    return run.start_run(cfg, run_dir, recipe_for(cfg), data_dir, on_event, progress, auto_batch)


def resume_training(run_dir: Path, overrides: Sequence[str] = (), on_event: Callable[[str], None] = print,
                    progress: bool | None = None) -> TrainResult:
    return run.resume_run(run_dir, recipe_for, list(overrides), on_event, progress)


def start_or_resume(cfg: RunConfig, run_dir: Path, overrides: Sequence[str] = (), data_dir: Path | None = None,
                    on_event: Callable[[str], None] = print, progress: bool | None = None,
                    auto_batch: bool = False) -> TrainResult:
    """`burnout train CONFIG --out RUN --resume-if-exists`: resume RUN as `--resume RUN` would (its own
    config.yaml, these overrides) when training has started there, else start it. One command that is right
    on every boot of a machine that can vanish."""
    if not holds_run(run_dir):
        return start_training(cfg, run_dir, data_dir, on_event, progress, auto_batch)
    if os.environ.get("RANK", "0") == "0":
        on_event(f"{run_dir} already holds a run: resuming it (its config.yaml and the overrides given; "
                 "CONFIG, --data and --auto-batch apply to a new run only)")
    return resume_training(run_dir, overrides, on_event, progress)


def train(config: str | Path | None = None, out: str | Path | None = None, resume: str | Path | None = None,
          data: str | Path | None = None, model: str | None = None, auto_batch: bool = False,
          resume_if_exists: bool = False, overrides: Sequence[str] = (), minutes: float | None = None,
          init_from: str | Path | None = None, dollars: float | None = None) -> TrainResult:
    """`burnout train`: CONFIG --out RUN [--data DIR], or --data DIR --model PRESET --out RUN (a preset on a
    prepared folder, no config file), or --resume RUN; `overrides` are KEY=VALUE strings; `minutes` or `dollars`
    is the budget (train.max_minutes, train.max_dollars). `init_from` (train.init_from) starts the new run from that
    run's or checkpoint's weights; with no CONFIG and no --model its config is the parent's, changed by `overrides`."""
    overrides = with_budget(list(overrides), minutes, dollars)
    # --init-from is train.init_from, set before the config is checked (train.init_optimizer=carry needs it); a JSON
    # string, which YAML reads as a string whatever the path looks like. Not among the overrides a resume gets.
    settings = [*overrides, f"train.init_from={json.dumps(str(init_from))}"] if init_from else list(overrides)
    if resume and resume_if_exists:
        raise BurnoutError("--resume-if-exists goes with CONFIG --out RUN (it decides to resume); drop one of them")
    if resume and init_from:
        raise BurnoutError(f"--init-from starts a new run; --resume {resume} continues from its own checkpoints (its "
                           "config.yaml keeps the train.init_from it started with); drop --init-from")
    if resume:
        if config or out or data or model:
            raise BurnoutError("--resume RUN takes no CONFIG, --out, --data or --model: the run folder holds them")
        if auto_batch:
            raise BurnoutError("--auto-batch applies to a new run; a resumed run keeps its batch shape")
        return resume_training(Path(resume), overrides)
    if model:
        if config:
            raise BurnoutError(f"--model trains a preset on --data without a config; drop '{config}' or --model "
                               "(a config names its model in its model section)")
        if not data or not out:
            raise BurnoutError("--model PRESET needs --data DIR (a prepared folder) and --out RUN")
        cfg = data_run_config(Path(data), model, settings)
    elif init_from and out and not config:
        cfg = continued_config(init_from, settings)
    else:
        if not config or not out:
            raise BurnoutError("train needs a CONFIG and --out RUN_DIR, or --data DIR --model PRESET --out RUN_DIR, "
                               "or --init-from RUN --out RUN_DIR (or --resume RUN_DIR)")
        # A CONFIG in the layout before train's sections is read, each old key said once (rank 0 says it).
        cfg = load_run_config(config, settings, on_note=print if os.environ.get("RANK", "0") == "0" else None)
    data_dir = Path(data) if data else None
    if resume_if_exists:
        return start_or_resume(cfg, Path(out), overrides, data_dir=data_dir, auto_batch=auto_batch)
    return start_training(cfg, Path(out), data_dir=data_dir, auto_batch=auto_batch)


# A run continued with its parent's config (`burnout train --init-from RUN --out NEW`, what `burnout grow` suggests)
# re-warms to its parent's peak LRs times this, with a fresh optimizer. Measured on grown models (docs/USAGE.md,
# "Continued pretraining"): at the parent's own peak (1) a continuation a third as long as the parent ended worse
# than the parent; at 0.3 none did, and each was within 0.03 nats of the best of 1, 0.3 and 0.1.
CONTINUED_LR_SCALE = 0.3
_SCALED_LRS = ("lr", "muon_lr", "min_lr")


def continued_config(init_from: str | Path, settings: Sequence[str]) -> RunConfig:
    """The config of a continued run with no CONFIG of its own: its parent's (parent_run_config) with the peak LRs
    lowered (CONTINUED_LR_SCALE), then `settings`; a line says the LRs it lowered that `settings` left."""
    raw = parent_run_config(init_from)
    cfg = load_run_config(raw, settings)
    optim = cfg.train.optim
    peaks = ("lr", "muon_lr") if optim.optimizer == "muon" else ("lr",)
    lowered = [f"train.{key} {getattr(optim, key):.3g}" for key in peaks
               if getattr(optim, key) == raw["train"]["optim"][key]]
    if lowered and os.environ.get("RANK", "0") == "0":
        print(f"{' and '.join(lowered)}: the parent's × {CONTINUED_LR_SCALE:g}, the peak a run continued with its "
              "parent's config re-warms to (docs/USAGE.md, \"Continued pretraining\"); train.lr=... sets another")
    return cfg


def parent_run_config(init_from: str | Path) -> dict:
    """The config a continued run with no CONFIG of its own starts from: its parent checkpoint's, as pretraining
    (no fine-tune section; no prediction, which was the parent's), without the parent's measured train.step_seconds
    and train.startup_seconds (a time budget measures its own), and with its peak LRs (train.lr, train.muon_lr;
    train.min_lr with them) × CONTINUED_LR_SCALE."""
    raw = read_saved_config(parent_checkpoint(str(init_from), print) / RUN_CONFIG_FILE)
    for section in ("sft", "dpo", "rl", "prediction"):
        raw.pop(section, None)
    train = raw.setdefault("train", {})
    for measured in ("step_seconds", "startup_seconds"):
        train.setdefault("budget", {}).pop(measured, None)
    optim, defaults = train.setdefault("optim", {}), OptimConfig()
    for key in _SCALED_LRS:
        optim[key] = optim.get(key, getattr(defaults, key)) * CONTINUED_LR_SCALE
    return raw


def trained_run_steps(run_dir: str | Path, chat: bool, *, stop_reason: str = "done",
                      export_to: str | Path | None = None, report: Path | None = None) -> list[tuple[str, str]]:
    """What to do with a run that training (quickstart, train, sft, dpo) made, as next_steps' rows: a chat model is
    talked to and tuned with DPO, a base model continues its first sample prompt (generate/prompts.py's
    suggested_prompt) and is fine-tuned to chat; both are evaluated, reported (`report`: the page already written),
    exported (to `export_to`, default hf/RUN's name) and served. A run stopped at a phase's end or by a signal (its
    TrainResult's `stop_reason`) is resumed first."""
    run = shlex.quote(str(run_dir))
    rows = [("resume", f"burnout train --resume {run}")] if stop_reason in ("phase", "signal") else []
    if chat:
        rows.append(("chat", f"burnout chat {run}"))
    else:
        rows.append(("generate", f"burnout generate {run} --prompt {shlex.quote(suggested_prompt(run_dir))}"))
    rows += [("eval", f"burnout eval {run} --tasks val"),
             ("report", f"{report}   (loss curves, tables, samples; Markdown beside it)" if report is not None
              else f"burnout report {run}"),
             ("export", f"burnout export {run} --to {shlex.quote(str(export_to or Path('hf', Path(run_dir).name)))}")]
    if chat:
        rows.append(("preferences", f"burnout dpo {run} --data PAIRS.jsonl --out {shlex.quote(f'{run_dir}-dpo')}"))
    else:
        rows.append(("chat model",
                     f"burnout sft {run} --data CONVERSATIONS.json --out {shlex.quote(f'{run_dir}-chat')}"))
    rows.append(("playground", needs_package(f"burnout playground {run}", "gradio", "playground",
                                             "then open http://127.0.0.1:7860")))
    return rows
