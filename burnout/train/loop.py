"""The training loop. `Trainer.__init__` sets a run up (data, model, optimizer, resume, logging);
`Trainer.fit` repeats the training step and asks each component whether it is due:

    train_step     burnout/train/step.py          forward/backward, clipping, skipped non-finite updates
    logger         burnout/train/metrics.py       metrics.jsonl (and train.tracker's), tokens/s, MFU, ETA, $
    validator      below                          val loss and a sample
    checkpointer   burnout/train/checkpointing.py atomic checkpoints, pruning, mirror, resume
    stop           burnout/train/stopping.py      phase end, steps/tokens/epochs, time budget, SIGTERM/SIGINT
    budget         burnout/train/budget.py        a time or dollar budget: its plan, each step's LR by the clock

What differs between kinds of run (pretraining, fine-tuning) is the run's recipe's (burnout/train/recipe.py):
its data, loaders, initial weights, objective, FLOPs and validation metrics. Under torchrun (DDP or FSDP2)
every rank runs this loop; only rank 0 writes.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from burnout.base.files import (
    AUDIT_DIR,
    AUDIT_JSON,
    RESUMES_FILE,
    RUN_CONFIG_FILE,
    SAMPLE_PROMPTS_FILE,
    TOKENIZER_FILE,
    append_jsonl,
    write_atomic,
)
from burnout.config import RunConfig, TrainConfig, saved_config_text
from burnout.core.checkpoint import holds_run, list_checkpoints
from burnout.core.device import configure_backends
from burnout.core.rng import seed_everything
from burnout.data.loader import Prefetcher, check_compatible
from burnout.data.tokenizer import encode_text, load_tokenizer
from burnout.errors import BurnoutError
from burnout.eval.degeneration import degeneration, read_suspicious
from burnout.generate.prompts import choose_sample_prompts, write_sample_prompts
from burnout.generate.sampling import generate_text, shown
from burnout.models.cpu_paths import forget_packed_weights
from burnout.models.info import flops_per_token, matmul_parameters
from burnout.models.transformer import unwrapped
from burnout.train.budget import settle_budget, spend_lines
from burnout.train.checkpointing import Checkpointer, load_for_resume, resume_point
from burnout.train.distributed import (
    DistContext,
    from_main,
    min_across_ranks,
    wrap_model,
)
from burnout.train.hardware import get_hardware, training_precision
from burnout.train.metrics import MetricsLog, StepLogger
from burnout.train.phases import current_phase, phase_summary
from burnout.train.plan import check_fits, check_memory_floor
from burnout.train.probe import largest_micro_batch, memory_probe, oom_message
from burnout.train.provenance import record_launch
from burnout.train.recipe import Recipe
from burnout.train.schedule import total_steps
from burnout.train.step import StepResult, TrainStep, batch_indices
from burnout.train.stopping import StopConditions
from burnout.train.trackers import open_tracker


@dataclass
class TrainResult:
    run_dir: Path
    checkpoint: Path
    step: int
    tokens: int
    train_loss: float
    val_loss: float
    elapsed_s: float
    tokens_per_s: float
    # done (the run's last step), phase (a phase ended; --resume continues), time (the time budget's last step),
    # signal (SIGTERM / SIGINT: checkpoint saved, --resume continues)
    stop_reason: str = "done"
    phase: str | None = None
    skipped_steps: int = 0
    val_of: str = ""  # what val_loss is over, when not the val split's every token (the recipe's val_of)

    def summary(self) -> str:
        """The one line a command prints when the run stops."""
        word = {"done": "done", "phase": f"phase '{self.phase}' done", "time": "time budget spent",
                "signal": "stopped by signal"}[self.stop_reason]
        over = f" ({self.val_of})" if self.val_of else ""
        return (f"{word}: step {self.step}, {self.tokens:,} tokens, train loss {self.train_loss:.4f}, "
                f"val loss {self.val_loss:.4f}{over}, {self.tokens_per_s:,.0f} tokens/s; checkpoint {self.checkpoint}")


def refuse_existing_run(run_dir: Path) -> None:
    if holds_run(run_dir):
        raise BurnoutError(f"run folder {run_dir} already holds a run; resume it with `burnout train --resume "
                           f"{run_dir}` (whichever command started it; `burnout train CONFIG` also takes "
                           "--resume-if-exists) or choose a new --out")


def _past_the_end(run_dir: Path, step: int, end: int, tc: TrainConfig) -> str:
    """The refusal of a resume whose limits now end the run before the step its checkpoint is at."""
    limits = [f"train.max_steps={tc.max_steps}"] + [f"train.{key}={getattr(tc, key)}" for key in
                                                     ("max_tokens", "max_epochs") if getattr(tc, key) is not None]
    if tc.budget.max_minutes is not None and tc.budget.step_seconds is not None:
        limits.append(f"train.max_minutes={tc.budget.max_minutes:g} (at train.step_seconds={tc.budget.step_seconds:g})")
    which = limits[0] if len(limits) == 1 else f"the earliest of {', '.join(limits)}"
    return (f"--resume: {run_dir} is at step {step}, past step {end}, where {which} now ends it; to train on, "
            f"give a limit past step {step} (config.yaml is left as it was)")


def _silent(line: str) -> None:
    pass


def clock() -> float:
    """The clock a run's time is counted on, from its command's start (train/run.py) to its last step: elapsed_s,
    a time budget, the session's start-up. One seam for the tests' fake clocks (loop.time)."""
    return time.perf_counter()


def check_sample_prompt(cfg: RunConfig, tokenizer_path: Path) -> None:
    """Refuse, before the first step, a train.sample_prompt the run could not sample at its first evaluation: one of
    characters its tokenizer cannot encode (a char tokenizer knows only its corpus's), or too long for the context."""
    tc = cfg.train
    if not (tc.eval.sample_prompt and tc.eval.sample_tokens):
        return
    ids = encode_text(load_tokenizer(tokenizer_path), tc.eval.sample_prompt, "train.sample_prompt",
                      fix="set train.sample_prompt to a few words of the training text, or train.sample_tokens=0 "
                          "for no sample")
    if len(ids) >= cfg.model.context_length:
        raise BurnoutError(f"train.sample_prompt is {len(ids)} tokens but model.context_length is "
                           f"{cfg.model.context_length}, which leaves no room to sample; shorten it")


class Validator:
    """Due every train.eval_interval steps and at a session's last step: the recipe's validation metrics over
    train.eval_batches val batches (val_loss, and any val_* it adds), train.eval_tasks' benchmarks
    (eval/TASK/METRIC, eval/core) and, given a `prompt` (the run's first sample prompt), a sample with its
    repetition (1 − distinct-3) and the suspicious strings it holds (those of DATA/audit/audit.json, when the data
    were audited); an empty one is said so in its line. FSDP's
    shards must all take part in a forward; a DDP replica on rank 0 evaluates alone."""

    def __init__(self, cfg: RunConfig, recipe: Recipe, loader, model: torch.nn.Module, objective: torch.nn.Module,
                 train_step: TrainStep, tokenizer_path: Path, dist: DistContext, emit: Callable[[str], None],
                 suspicious: list[str] | None = None, prompt: str = ""):
        fsdp = cfg.train.perf.distributed == "fsdp"
        self.tc, self.recipe, self.loader, self.train_step, self.emit = cfg.train, recipe, loader, train_step, emit
        self.suspicious = suspicious or []  # strings a sample should not contain (from the data's audit)
        self.prompt = prompt  # what each sample continues: the run's first sample prompt ("": no sample)
        # FSDP2 shards in place: the wrapped module is the one whose forward gathers the weights.
        self.model = train_step.model if fsdp else model
        self.objective = train_step.model if fsdp else objective
        self.runs_here = dist.is_main or (dist.enabled and fsdp)
        self.tokenizer = load_tokenizer(tokenizer_path) if self.runs_here else None
        self.tasks = None  # train.eval_tasks resolved and read now: a missing file fails before step 1
        if self.tc.eval.eval_tasks and self.runs_here:
            from burnout.eval.evaluate import check_plan_encodes, plan_tasks

            self.tasks = plan_tasks(self.tc.eval.eval_tasks, self.tc.eval.eval_data_root)
            check_plan_encodes(self.tokenizer, self.tasks, self.tc.eval.eval_task_items, "train.eval_tasks: ")
            for line in self.tasks.lines:
                emit(line)
        self.last_loss = math.nan
        self.last_step: int | None = None  # the step whose weights last_loss was measured on

    def due(self, step: int, final: bool) -> bool:
        return step % self.tc.eval.eval_interval == 0 or final

    def run(self, step: int, record: dict) -> None:
        """Adds val_loss (and sample) to `record`."""
        ts = self.train_step
        if self.runs_here:
            record.update(self.recipe.evaluate(self.objective, self.loader, self.tc, ts.device, ts.precision))
            self.last_loss, self.last_step = record["val_loss"], step
            if self.tasks is not None:
                scores = self._task_scores()
                record.update(scores)
                self.emit(f"step {step} eval: " + ", ".join(f"{k.removeprefix('eval/')} {v:.4f}"
                                                            for k, v in scores.items()))
            prompt, tokens = self.prompt, self.tc.eval.sample_tokens
            if prompt and tokens:
                sample = generate_text(self.model, self.tokenizer, prompt, tokens, temperature=0.8, top_k=50,
                                       seed=self.tc.seed)
                forget_packed_weights(self.model)  # its packed copies (see linear) would sit in memory while it trains
                record["sample"], record["sample_prompt"] = sample, prompt
                scores = degeneration(sample, self.suspicious)
                record["sample_repetition"] = scores["repetition"]
                if self.suspicious:
                    record["sample_suspicious"] = scores["suspicious"]
                empty = f" {shown('')}" if sample == prompt else ""
                self.emit(f"step {step} sample: {json.dumps(sample)[:300]}{empty}")
        ts.model.train()

    def _task_scores(self) -> dict[str, float]:
        from burnout.eval.evaluate import score_plan

        self.model.eval()
        results, core = score_plan(self.model, self.tokenizer, self.tasks, self.tc.eval.eval_task_items,
                                   data_root=self.tc.eval.eval_data_root, progress=False)
        scores = {f"eval/{key}/{name}": value for key, metrics in results.items() for name, value in metrics.items()
                  if isinstance(value, float) and name not in ("examples", "truncated")}
        if core is not None:
            scores["eval/core"] = core["score"]
        return scores


class Trainer:
    """Trains `cfg.model` with `recipe` on the prepared data in `data_dir`, writing everything to `run_dir`, on this
    rank of `dist` (train/run.py starts or resumes it: `Trainer(...).fit()`).

    `fit` stops at the end of the current phase (or the run), at the time budget's last step (train.max_minutes),
    or on SIGTERM/SIGINT, always with a checkpoint. `on_event` receives human-readable lines as they happen
    (rank 0 only). `auto_batch` replaces train.batch_size by the largest micro-batch that fits and keeps the tokens
    per step through train.grad_accum. `resumed_with`: a resume's changed settings, appended to resumes.jsonl
    once the run has accepted them (a refused resume leaves no trace). `started`: the clock() reading when the
    command started (default: now), from which the session's time counts, its start-up included."""

    def __init__(self, cfg: RunConfig, run_dir: Path, data_dir: Path, recipe: Recipe, dist: DistContext,
                 device: torch.device, *, resume: bool = False, progress: bool | None = None,
                 on_event: Callable[[str], None] | None = None, auto_batch: bool = False,
                 resumed_with: dict | None = None, started: float | None = None):
        self.started = clock() if started is None else started
        if not resume:
            refuse_existing_run(run_dir)
        self.run_dir, self.data_dir, self.recipe, self.dist, self.device = run_dir, data_dir, recipe, dist, device
        self.progress = progress
        self.emit = (on_event or _silent) if dist.is_main else _silent
        # A run killed before its first checkpoint has nothing to load: resuming it starts it again from step 0.
        from_scratch = resume and not list_checkpoints(run_dir)
        if from_scratch:
            self.emit(f"{run_dir} holds no checkpoint yet: starting it again from step 0")
        self.precision = training_precision(cfg.train.precision, device, self.emit)
        if cfg.train.precision == "auto" and device.type == "cpu":  # each rank measured: bf16 only if all found it
            self.precision = "bf16" if min_across_ranks(int(self.precision == "bf16"), dist, device) else "fp32"
        configure_backends(device, cfg.train.perf.deterministic)
        self.seq_len = cfg.train.seq_len or cfg.model.context_length
        meta = recipe.data_meta(cfg, data_dir, self.seq_len)
        check_compatible(meta, cfg.model.vocab_size)
        check_sample_prompt(cfg, data_dir / TOKENIZER_FILE)  # sampled at each evaluation: refused now, not then
        # The user's prompt, else words of the run's own data (its recipe's), drawn at its start and recorded.
        self.sample_prompts, self.prompts_from = choose_sample_prompts(
            cfg, run_dir, lambda: recipe.sample_prompts(cfg, data_dir, self.emit))
        if self.sample_prompts and self.prompts_from != "train.sample_prompt":
            self.emit(f"sample prompts, from {self.prompts_from} ({SAMPLE_PROMPTS_FILE}): "
                      + ", ".join(map(json.dumps, self.sample_prompts)))
        # Before any model is built (--auto-batch builds one to probe): what cannot fit even at the least.
        check_memory_floor(cfg, device, dist.world_size, 1 if auto_batch and not resume else None)
        if auto_batch and not resume:
            cfg = self._auto_batch(cfg)
        self.cfg, self.tc = cfg, cfg.train
        if not (auto_batch and not resume):  # --auto-batch has just measured what fits on this very GPU
            # On every rank: the prediction is deterministic, so all ranks refuse together.
            check_fits(cfg, device, dist.world_size, self.precision)
        self.tokens_per_step = self.tc.batch_size * self.tc.grad_accum * self.seq_len * dist.world_size
        self.cfg, self.budget, step_time = settle_budget(self.cfg, data_dir, recipe, device, self.precision, dist,
                                                         spent=lambda: clock() - self.started, resumed=resume)
        self.tc = self.cfg.train
        self.end_of_run = total_steps(self.tc, self.tokens_per_step, meta["splits"]["train"]["tokens"])
        self._setup_model(resume and not from_scratch)
        if self.budget is not None:
            self.emit(self.budget.plan_line(self.end_of_run, self.elapsed_before))
        self._setup_logging(resume, resumed_with)
        if self.step < self.stop_at:  # what this session is about to spend, before its first step
            for line in spend_lines(self.cfg, step_time, self.step, self.stop_at, self.end_of_run,
                                    self.tokens_per_step, meta["splits"]["train"]["tokens"], self.price):
                self.emit(line)

    def _auto_batch(self, cfg: RunConfig) -> RunConfig:
        tc = cfg.train
        seqs = tc.batch_size * tc.grad_accum
        b = largest_micro_batch(seqs, memory_probe(cfg, self.device, self.precision, self.seq_len,
                                                   self.recipe.build_model))
        # Each rank probed its own device; all must run one shape, or their collectives stop pairing up.
        b = min_across_ranks(b, self.dist, self.device)
        if b != tc.batch_size:
            self.emit(f"auto-batch: micro-batch {b} × accumulation {seqs // b} (was {tc.batch_size} × {tc.grad_accum})")
        return dataclasses.replace(cfg, train=dataclasses.replace(tc, batch_size=b, grad_accum=seqs // b))

    def _setup_model(self, from_checkpoint: bool) -> None:
        """Loaders, model, optimizer and checkpointer; on resume, everything the last checkpoint holds."""
        tc, cfg, recipe, tokenizer_path = self.tc, self.cfg, self.recipe, self.data_dir / TOKENIZER_FILE
        # Rank 0's stream, indexed per rank by the train step; validation is rank 0's alone.
        self.loaders = recipe.loaders(cfg, self.data_dir, self.seq_len)
        seed_everything(tc.seed)
        model = recipe.build_model(cfg, self.device)  # the same weights on every rank: FSDP shards them as built
        recipe.init_weights(model, cfg, from_checkpoint, self.emit)
        if self.dist.enabled:  # then each rank its own dropout masks (one process keeps its usual stream)
            torch.manual_seed(tc.seed + self.dist.rank)
        self.flops_per_token = recipe.flops_per_token(flops_per_token(cfg.model, self.seq_len,
                                                                      matmul_parameters(model)))
        self.step, self.elapsed_before, self.skipped, self.bad_in_row = 0, 0.0, 0, 0
        ckpt = None
        if from_checkpoint:
            ckpt = load_for_resume(resume_point(self.run_dir, self.dist, self.emit), cfg, tokenizer_path, self.dist)
        # Built before a resumed run's weights load: an objective may keep the starting weights (a reference).
        objective = recipe.objective(model, cfg, resumed=ckpt is not None)
        if ckpt is not None:
            model.load_state_dict(ckpt.model.state_dict())
            self.step, self.elapsed_before = ckpt.state["step"], ckpt.state["elapsed_s"]
            self.skipped = ckpt.state.get("skipped_steps", 0)
            if self.budget is not None:  # before config.yaml is rewritten with the lowered limit
                self.budget.check_resume(self.run_dir, self.elapsed_before, self.step, self.end_of_run)
            if self.step > self.end_of_run:
                raise BurnoutError(_past_the_end(self.run_dir, self.step, self.end_of_run, tc))
        self.elapsed = self.elapsed_before
        perf = tc.perf
        wrapped = wrap_model(objective, self.dist, perf.distributed, self.device, self.precision, perf.cpu_offload)
        self.train_step = TrainStep(wrapped, tc, self.device, self.precision, self.end_of_run, self.dist)
        if ckpt is None:
            recipe.init_optimizer(self.train_step, cfg, self.dist, self.emit)
        # Before anything in the run folder is written: a disk too small for the kept checkpoints is refused here.
        self.checkpointer = Checkpointer(self.run_dir, cfg, model, self.train_step, self.dist, tokenizer_path,
                                         self.tokens_per_step, self._say, self.step, self.end_of_run)
        self.resumed_from = ckpt.path if ckpt is not None else None
        if ckpt is not None:
            self.checkpointer.restore(ckpt)
            self.emit(f"resumed from {ckpt.path} at step {self.step}")
        # `burnout data audit DATA` leaves DATA/audit/audit.json: its suspicious strings are looked for in samples.
        audit = self.data_dir / AUDIT_DIR / AUDIT_JSON
        suspicious = read_suspicious(audit) if audit.is_file() else []
        self.validator = Validator(cfg, recipe, self.loaders["val"], model, objective, self.train_step,
                                   tokenizer_path, self.dist, self._say, suspicious, self.sample_prompts[0]
                                   if self.sample_prompts else "")

    def _setup_logging(self, resume: bool, resumed_with: dict | None) -> None:
        """The phase this session runs to, the progress bar, and on rank 0 the run folder's logs."""
        tc, dist = self.tc, self.dist
        self.phase = current_phase(tc, self.step)
        self.stop_at = min(self.phase.steps, self.end_of_run) if self.phase else self.end_of_run
        hw = (get_hardware(tc.budget.hardware, self.precision, tc.budget.price_per_hour, self.device, say=self.emit)
              if dist.is_main else None)
        self.price = hw.price_per_hour * dist.world_size if hw and hw.price_per_hour is not None else None
        if dist.is_main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            if resume:
                MetricsLog(self.run_dir).truncate_after(self.step)
            if resumed_with:
                append_jsonl(self.run_dir / RESUMES_FILE, resumed_with)
            write_atomic(self.run_dir / RUN_CONFIG_FILE, saved_config_text(self.cfg, self.run_dir))
            write_sample_prompts(self.run_dir, self.sample_prompts, self.prompts_from)
            record_launch(self.run_dir, self.step, self.device, dist.world_size, self.data_dir, self.recipe.lineage,
                          precision=self.precision)
        show_bar = dist.is_main and (sys.stderr.isatty() if self.progress is None else self.progress)
        self.bar = tqdm(total=self.stop_at, initial=self.step, disable=not show_bar, unit="step", dynamic_ncols=True)
        measure_again = hw.measure_again if hw else None
        tracker = open_tracker(self.cfg, self.run_dir, self.step if resume else None) if dist.is_main else None
        if tracker is not None:
            self.emit(tracker.line)
        self.logger = StepLogger(self.run_dir if dist.is_main else None, tc, self.tokens_per_step, self.flops_per_token,
                                 hw.peak_flops * dist.world_size if hw else None, self.price, self.stop_at, self.bar,
                                 self._say, measure_peak=measure_again and (lambda: measure_again() * dist.world_size),
                                 tracker=tracker)
        if self.phase is not None:
            self.emit(f"phase '{self.phase.name}': steps {self.step} → {self.stop_at}"
                      + (f", budget ${self.phase.budget:,.2f}" if self.phase.budget is not None else ""))

    def _say(self, line: str) -> None:
        """A line printed above the progress bar when it shows, else handed to on_event."""
        (self.bar.write if not self.bar.disable else self.emit)(line)

    def fit(self) -> TrainResult:
        ckpt_path, result = None, None
        # The session's time counts from its command's start: its start-up is in elapsed_s, and in a time budget
        # (whose first step every rank places alike: rank 0's start-up).
        t_start = self.started
        budget = (self.budget.session(self.end_of_run, from_main(self.elapsed_before + clock() - t_start, self.dist))
                  if self.budget is not None else None)
        stop = StopConditions(self.stop_at, self.end_of_run, budget)
        batches = Prefetcher(self.loaders["train"], batch_indices(self.step, self.tc.grad_accum, self.dist),
                             pin=self.device.type == "cuda")

        def flags() -> list[float]:  # agreed across ranks on the train step's own all-reduce
            return [*stop.local_flags(), self.checkpointer.time_due()]

        try:
            with stop:
                while self.step < self.stop_at:
                    t0 = clock()
                    if budget is not None:
                        budget.step_starts(self.elapsed_before + t0 - t_start)
                    try:
                        result = self.train_step(batches, self.step, flags=flags,
                                                 schedule_step=budget.schedule_step(self.step) if budget else None)
                    except torch.OutOfMemoryError:
                        raise BurnoutError(oom_message(self.tc, self.seq_len)) from None
                    self._count_skipped(result)
                    self.step += 1
                    if note := self.recipe.after_step(self.step, result.loss):
                        self._say(note)
                    seconds = clock() - t0
                    self.logger.count(seconds, result.positions)
                    if budget is not None:
                        budget.step_took(seconds)
                    self.elapsed = self.elapsed_before + clock() - t_start
                    self.bar.update(1)
                    final = stop.final(self.step, result.flag_means[:2])
                    save = self.checkpointer.due(self.step, final, result.flags[2])
                    # train.keep_best compares checkpoints by a val loss measured on their own weights.
                    evaluate = self.validator.due(self.step, final) or (save and self.tc.checkpoint.keep_best)
                    if self.logger.due(self.step, final) or evaluate:
                        record = self.logger.record(self.step, result.loss, result.lr, result.grad_norm,
                                                    self.elapsed, self.skipped)
                        record.update(self._step_metrics())
                        if evaluate:
                            self.validator.run(self.step, record)
                        self.logger.write(record)
                    if save:
                        ckpt_path = self.checkpointer.save(self.step, self.elapsed, self.skipped, result.loss,
                                                           self.validator.last_loss, self.validator.last_step)
                    if final:
                        break
            # Inside the try: the phase summary it writes is among the logs the mirror copies on closing.
            if budget is not None and result is not None:
                self._say(self.budget.end_line(self.elapsed, self.step, self.end_of_run, result.lr))
            return self._finish(ckpt_path, result.loss if result else math.nan, stop.reason)
        finally:
            batches.close()
            self.bar.close()
            self.checkpointer.close()
            self.logger.close()

    def _step_metrics(self) -> dict:
        """What the objective reports of its last step beside the loss (its `last_metrics`, if it has them; a
        fine-tune's objective averages them over the ranks)."""
        metrics = getattr(unwrapped(self.train_step.model), "last_metrics", None) or {}
        return {key: value for key, value in metrics.items() if key != "loss"}

    def _count_skipped(self, result: StepResult) -> None:
        """A step whose loss or gradient was not finite made no update; too many in a row stop the run."""
        if result.applied:
            self.bad_in_row = 0
            return
        self.bad_in_row += 1
        self.skipped += 1
        self._say(f"step {self.step + 1}: loss {result.loss} / grad norm {result.grad_norm}: not finite, "
                  f"update skipped ({self.bad_in_row} in a row)")
        if self.bad_in_row >= self.tc.optim.max_bad_steps:
            last = list_checkpoints(self.run_dir)
            raise BurnoutError(
                f"the loss was not finite for {self.bad_in_row} steps in a row (up to step {self.step + 1}); "
                f"stopped, the last good checkpoint {last[-1] if last else '(none yet)'} is intact; "
                "resume with a lower train.lr or longer train.warmup_steps")

    def _finish(self, ckpt_path: Path | None, train_loss: float, stop_reason: str) -> TrainResult:
        val_loss = self.validator.last_loss
        if ckpt_path is None:  # resumed at the end: nothing left to do
            ckpt_path = self.resumed_from
            info = json.loads((ckpt_path / "info.json").read_text())
            train_loss, val_loss = info["train_loss"], info["val_loss"]
        step, phase = self.step, self.phase
        if self.dist.is_main:
            for line in self.recipe.finish(self.cfg, self.run_dir, ckpt_path):
                self._say(line)
        if stop_reason == "signal":
            self._say(f"stopped by signal at step {step}; checkpoint {ckpt_path}; "
                      f"continue with: burnout train --resume {self.run_dir}")
        elif phase is not None and step == phase.steps and self.dist.is_main:
            for line in phase_summary(self.run_dir, self.tc, phase, self.tokens_per_step, self.price):
                self._say(line)
        tokens = step * self.tokens_per_step
        tokens_per_s = tokens / self.elapsed if self.elapsed else 0.0
        return TrainResult(self.run_dir, ckpt_path, step, tokens, train_loss, val_loss, self.elapsed, tokens_per_s,
                           stop_reason, phase.name if phase else None, self.skipped, self.recipe.val_of)
