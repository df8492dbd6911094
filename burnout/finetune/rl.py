"""Reinforcement learning with verifiable rewards (`burnout rl`): GRPO on questions whose answers can be checked.

Per question the policy samples a group of answers, a reward scores each (gsm8k, exact, regex:PATTERN or a function of
the user's), and the policy moves toward those above their group's mean; the RL recipe runs it on the Trainer like any
run (checkpoints, exact resume: each answer is seeded from the run's seed, the batch and its row), with pass@1 and
pass@k on held-out questions. Why on-policy without PPO's ratio, why no division by the group's spread, and what a
run with nothing to learn is told: docs/FINETUNING.md.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import math
import numbers
import os
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
from tokenizers import Tokenizer

from burnout.base.files import TOKENIZER_FILE, write_atomic
from burnout.base.text import first_line
from burnout.base.values import kind_of
from burnout.config import RLConfig, RunConfig, TrainConfig
from burnout.core.chat_template import IM_END, encode_prompt, message_text
from burnout.core.checkpoint import Checkpoint
from burnout.core.device import resolve_device
from burnout.core.model_files import load_model
from burnout.data.shards import META_FILE
from burnout.data.tokenizer import load_tokenizer
from burnout.errors import BurnoutError
from burnout.finetune.conversations import iter_records
from burnout.finetune.objective import AgainstReference, StepMetrics, adapted, eval_mode, sequence_logprobs
from burnout.finetune.recipes import FineTune, from_chat_model, load_base
from burnout.finetune.tokenized import RowBatches, held_out_split, read_sft_meta
from burnout.generate.sampling import generate_batch
from burnout.models import Transformer
from burnout.models.cpu_paths import forget_packed_weights
from burnout.train.distributed import whole_weights
from burnout.train.recipe import Say

TASKS_FILE = "tasks.jsonl"
TASKS_FORMAT = "rl-tasks-1"
METRIC_KEYS = ("loss", "reward", "signal", "kl", "answer_length")
QUESTION_KEYS = ("question", "prompt", "problem")
ANSWER_KEYS = ("answer", "reference", "solution")
# An answer counts as solved (pass@k) when its reward reaches the built-in rewards' full marks.
SOLVED = 1.0
# The largest reward (in size) a reward function may give. Rewards become float32 advantages times summed log-probs:
# past about 1e7 a reward's units are lost to rounding, past 3.4e38 it is inf and every loss NaN; a reward's scale
# buys nothing (Adam divides it out), so a value this large is a bug in the function (a count, a sentinel).
MAX_REWARD = 1e6
# Below this share of groups with any signal, the step is "mostly flat" and the log says so, at most once in
# FLAT_WARNING_EVERY steps: a run near the threshold would otherwise say it every few steps.
FLAT_SHARE = 0.5
FLAT_WARNING_EVERY = 50
_FINAL_NUMBER = re.compile(r"####\s*([-+]?[\d,]*\.?\d+)")
_TRAIN_STREAM, _EVAL_STREAM = 0, 1
# RUN/EXAMPLES_FILE: the first EXAMPLES held-out questions answered by the starting model and by the run's latest
# checkpoint (one answer each, sampled as in training, seeded as the evaluation's first answers), for the report.
EXAMPLES_FILE, EXAMPLES = "rl_examples.json", 3


# ----------------------------------------------------------------------------------------------
# Tasks


@dataclass(frozen=True)
class Task:
    prompt: str
    reference: str


def read_tasks(source: str | Path, split: str = "train", subset: str | None = None, data_files: str | None = None,
               max_examples: int | None = None) -> list[Task]:
    """The tasks of a question/answer file (the first `max_examples`); one line for a record without a question or
    without an answer."""
    tasks = []
    for where, record in iter_records(source, split, subset, data_files):
        if max_examples is not None and len(tasks) >= max_examples:
            break
        tasks.append(_task(record, where))
    if not tasks:
        raise BurnoutError(f"rl data '{source}' holds no records; give a file of question/answer records")
    return tasks


def _task(record: dict, where: str) -> Task:
    key = next((key for key in QUESTION_KEYS if key in record), None)
    if key is None:
        raise BurnoutError(f"{where} has no question: a task needs a {' or '.join(QUESTION_KEYS)} field (it has "
                           f"{', '.join(map(str, record))})")
    prompt = message_text(record[key], f"{where}: question")
    if not prompt.strip():
        raise BurnoutError(f"{where} has an empty question: the model would be asked nothing and scored on its answer "
                           "to the chat template alone; write the question in or remove the record")
    answer = next((record[key] for key in ANSWER_KEYS if not _blank(record.get(key))), None)
    if answer is None:
        raise BurnoutError(f"{where} has no answer: the reward checks each sampled answer against the record's "
                           f"{' or '.join(ANSWER_KEYS)} field (e.g. \"... #### 42\"); add one or remove the record")
    reference = str(answer) if isinstance(answer, numbers.Number) else message_text(answer, f"{where}: answer")
    return Task(prompt, reference)


def _blank(value) -> bool:
    return value is None or (isinstance(value, str) and not value.strip())


# ----------------------------------------------------------------------------------------------
# Rewards


def final_number(text: str) -> Decimal | None:
    """The number after the last `####` of `text` (thousands commas dropped), or None."""
    found = _FINAL_NUMBER.findall(text)
    try:
        return Decimal(found[-1].replace(",", "")) if found else None
    except InvalidOperation:
        return None


def gsm8k_reward(prompt: str, answer: str, reference: str) -> float:
    """1.0 when the answer's final `#### n` equals the reference's (as numbers: 81 = 81.0), else 0.0."""
    got = final_number(answer)
    return float(got is not None and got == final_number(reference))


def exact_reward(prompt: str, answer: str, reference: str) -> float:
    """1.0 when the answer is the reference, outer spaces aside."""
    return float(answer.strip() == reference.strip())


def regex_reward(pattern: str) -> Callable[[str, str, str], float]:
    """1.0 when `pattern`'s first match (its group 1 if it has groups) is found in the answer and is the same in
    the reference."""
    try:
        compiled = re.compile(pattern)
    except re.error as exc:
        raise BurnoutError(f"rl.reward regex:{pattern}: not a regular expression ({exc}); fix the pattern") from None

    def first_match(text: str) -> str | None:
        match = compiled.search(text)
        return None if match is None else match.group(1 if compiled.groups else 0)

    def reward(prompt: str, answer: str, reference: str) -> float:
        got = first_match(answer)
        return float(got is not None and got == first_match(reference))

    return reward


BUILT_IN_REWARDS = {"gsm8k": gsm8k_reward, "exact": exact_reward}


def load_reward(spec: str) -> Callable[[str, str, str], float]:
    """The reward rl.reward names: gsm8k, exact, regex:PATTERN, or module:function (a module importable from the
    current folder or the installed packages)."""
    if spec in BUILT_IN_REWARDS:
        return BUILT_IN_REWARDS[spec]
    if spec.startswith("regex:"):
        return regex_reward(spec.removeprefix("regex:"))
    module_name, _, name = spec.partition(":")
    if not (module_name and name and all(part.isidentifier() for part in (*module_name.split("."), name))):
        raise BurnoutError(f"rl.reward: '{spec}' is none of gsm8k, exact, regex:PATTERN or module:function (a Python "
                           "function of yours, function(prompt, answer, reference) -> float)")
    if os.getcwd() not in sys.path:  # a module in the folder the command runs from, as `python -m` finds it
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise BurnoutError(f"rl.reward {spec}: no module '{exc.name}' in the current folder or the installed "
                           "packages; run from the folder holding it, or install it") from None
    except Exception as exc:  # the user's module failed while it was imported
        raise BurnoutError(f"rl.reward {spec}: importing {module_name} raised {type(exc).__name__}: "
                           f"{first_line(exc)}; fix the module") from None
    except SystemExit as exc:  # the module's top level called sys.exit (a script's `main()` run on import)
        raise BurnoutError(f"rl.reward {spec}: importing {module_name} called sys.exit("
                           f"{'' if exc.code is None else repr(exc.code)[:60]}); guard its script part with "
                           "`if __name__ == \"__main__\":`") from None
    function = getattr(module, name, None)
    if not callable(function):
        raise BurnoutError(f"rl.reward {spec}: {module_name} has no function '{name}'; define "
                           f"{name}(prompt, answer, reference) -> float there")
    return function


def score(reward: Callable, spec: str, task: Task, answer: str) -> float:
    """reward(prompt, answer, reference) as a float; one line naming the answer and its question if the function
    raises, calls sys.exit, or gives anything but a number within ±MAX_REWARD."""
    where = f"for the answer {answer[:60]!r} to {task.prompt[:60]!r}"
    try:
        value = reward(task.prompt, answer, task.reference)
    except Exception as exc:  # the user's function: whatever it raises is theirs to fix
        raise BurnoutError(f"rl.reward {spec} raised {type(exc).__name__}: {first_line(exc, 120)} {where}; make it "
                           "return a number for any answer (0.0 for one it cannot read)") from None
    except SystemExit as exc:  # sys.exit() would end the run without a word, with exit status 0 if it gave none
        raise BurnoutError(f"rl.reward {spec} called sys.exit({'' if exc.code is None else repr(exc.code)[:60]}) "
                           f"{where}; a reward function must return a number (0.0 for an answer it cannot read), "
                           "not exit") from None
    shown = repr(value) if len(repr(value)) <= 40 else f"{repr(value)[:20]}... ({len(repr(value))} characters)"
    # NOTE: compared as it is, not as a float: float() of an int past 1.8e308 raises.
    if not isinstance(value, numbers.Real) or value != value or abs(value) == math.inf:
        raise BurnoutError(f"rl.reward {spec} returned {shown} ({kind_of(value)}) {where}; it must return a finite "
                           "number (e.g. 1.0 right, 0.0 wrong)")
    if abs(value) > MAX_REWARD:
        raise BurnoutError(f"rl.reward {spec} returned {shown} {where}: beyond ±{MAX_REWARD:g}, where the float32 "
                           "advantages and loss lose their precision or overflow (every loss NaN); return a score on "
                           "a small scale (e.g. 1.0 right, 0.0 wrong)")
    return float(value)


# ----------------------------------------------------------------------------------------------
# GRPO


def group_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """(P, G) rewards, a group of G answers per question → each answer's advantage: its reward minus its group's
    mean. Not divided by the group's standard deviation, as GRPO's paper does: with 0/1 rewards that scales a
    question most when its group is nearly all right or all wrong (a small std), weighting questions by how settled
    they are rather than by what is left to learn (Dr. GRPO, Liu et al. 2025, drops it for this; nanochat too)."""
    return rewards - rewards.mean(dim=1, keepdim=True)


def differing_groups(rewards: torch.Tensor) -> torch.Tensor:
    """(P, G) rewards → (P,) whether a question's answers got rewards that differ: the groups with any signal (in
    an all-equal group every advantage is 0)."""
    return rewards.amax(dim=1) != rewards.amin(dim=1)


def grpo_loss(logprobs: torch.Tensor, advantages: torch.Tensor, answer_tokens: int) -> torch.Tensor:
    """−mean over the answer tokens of advantage × log π: `logprobs` (N,) each answer's summed token log-probs,
    `advantages` (N,) its advantage, shared by its tokens. On-policy (one update per sampling), so no ratio and
    no clipping."""
    return -(advantages * logprobs).sum() / max(answer_tokens, 1)


def pass_at_k(n: int, correct: int, k: int) -> float:
    """The unbiased estimate of pass@k from n samples of which `correct` are right (Chen et al. 2021):
    1 − C(n − c, k) / C(n, k)."""
    if n - correct < k:
        return 1.0
    return 1.0 - math.comb(n - correct, k) / math.comb(n, k)


def sample_seed(*key: int) -> int:
    """A generator seed that is a function of `key` alone (the run's seed, a stream, the batch or question, the row)."""
    return int(np.random.SeedSequence([int(k) for k in key]).generate_state(1)[0])


@dataclass
class Answers:
    """A group of answers per question, row-major (question p's are rows p·G … p·G + G − 1)."""
    prompts: list[list[int]]  # one per question
    ids: list[list[int]]  # one per answer, without <|im_end|>
    stopped: list[bool]  # the answer ended with <|im_end|> (not cut by max_new_tokens)
    texts: list[str]


def sample_answers(policy: Transformer, tokenizer: Tokenizer, tasks: Sequence[Task], section: RLConfig,
                   seeds: Sequence[int]) -> Answers:
    """rl.group_size answers to each task, answer i sampled with seeds[i], all in one left-padded batch."""
    group = section.group_size
    prompts = [encode_prompt(tokenizer, [{"role": "user", "content": task.prompt}]) for task in tasks]
    rows = [prompt for prompt in prompts for _ in range(group)]
    end = tokenizer.token_to_id(IM_END)
    ids = generate_batch(policy, rows, section.max_new_tokens, pad=True, stop_id=end, temperature=section.temperature,
                         top_k=section.top_k, seed=list(seeds))
    forget_packed_weights(policy)  # the weights change at every step: their packed copies would only take memory
    budget = min(section.max_new_tokens, policy.cfg.context_length - max(map(len, rows)))
    return Answers(prompts, ids, [len(answer) < budget for answer in ids], [tokenizer.decode(a) for a in ids])


def answer_batch(answers: Answers, group: int, end_id: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, y) of the answers as training rows: prompt + answer (+ <|im_end|> where it stopped), targets the answer's
    tokens and its <|im_end|>, -1 elsewhere."""
    rows, starts = [], []
    for number, ids in enumerate(answers.ids):
        prompt = answers.prompts[number // group]
        rows.append(prompt + ids + ([end_id] if answers.stopped[number] else []))
        starts.append(len(prompt))
    width = max(len(row) for row in rows) - 1
    x = torch.zeros(len(rows), width, dtype=torch.long)
    y = torch.full((len(rows), width), -1, dtype=torch.long)
    for r, (row, start) in enumerate(zip(rows, starts)):
        x[r, : len(row) - 1] = torch.tensor(row[:-1])
        y[r, start - 1 : len(row) - 1] = torch.tensor(row[start:])
    return x.to(device), y.to(device)


class GRPOObjective(StepMetrics, AgainstReference, nn.Module):
    """`objective(x, y)` → the GRPO loss of a TaskBatches batch (x: the questions' numbers, y: the batch number,
    what the sampling is seeded from), for TrainStep to run like a model.

    The KL reference (rl.kl_coef > 0 only): with LoRA adapters the policy with them switched off (fresh unless
    `resumed`), otherwise a frozen copy of `policy` as it is now, so build the objective before loading a resumed
    run's weights. `micro_batches` is train.grad_accum (StepMetrics)."""

    loss_per_row = True  # a mean over the answer tokens of its own micro-batch: micro-batches weigh equally
    metric_keys = METRIC_KEYS

    def __init__(self, policy: nn.Module, tokenizer: Tokenizer, tasks: Sequence[Task], reward: Callable,
                 section: RLConfig, seed: int, micro_batches: int = 1, resumed: bool = False):
        super().__init__()
        self.policy = policy
        self.tokenizer, self.tasks, self.reward, self.section, self.seed = tokenizer, list(tasks), reward, section, seed
        self.end_id = tokenizer.token_to_id(IM_END)
        self._start_metrics(micro_batches)
        if section.kl_coef > 0:
            self._hold_reference(policy, None, adapted(policy), resumed,
                                 "rl.kl_coef with LoRA: the model's adapters are already trained, so switching them "
                                 "off would not give the starting policy as the reference; merge them first "
                                 "(burnout lora merge) and start with fresh adapters")

    def forward(self, x: torch.Tensor | None = None, y: torch.Tensor | None = None, held_out: Sequence[Task] = (),
                batch_size: int = 1):
        """The loss of a TaskBatches batch; with `held_out` (and no batch), instead pass_rates of those questions,
        `batch_size` at a time. Evaluation goes through the call, as training does, for FSDP's root module to gather
        the weights outside the blocks."""
        if held_out:
            with whole_weights(self.policy):
                return pass_rates(self.policy, self.tokenizer, held_out, self.reward, self.section, self.seed,
                                  batch_size)
        loss, metrics = self.group_loss([int(n) for n in x[:, 0].tolist()], int(y[0, 0]))
        if torch.is_grad_enabled():
            self._record(metrics)
        return loss

    @torch.compiler.disable
    def group_loss(self, numbers: list[int], batch: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The loss and metrics of train questions `numbers`, sampled with seeds of (seed, batch, row)."""
        group, tasks = self.section.group_size, [self.tasks[n] for n in numbers]
        seeds = [sample_seed(self.seed, _TRAIN_STREAM, batch, row) for row in range(len(tasks) * group)]
        with whole_weights(self.policy):  # under FSDP: each rank decodes as many tokens as its own answers take
            answers = sample_answers(self.policy, self.tokenizer, tasks, self.section, seeds)
        rewards = torch.tensor([score(self.reward, self.section.reward, tasks[n // group], text)
                                for n, text in enumerate(answers.texts)]).view(len(tasks), group)
        return self.answers_loss(answers, rewards)

    def answers_loss(self, answers: Answers, rewards: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The loss and metrics of sampled `answers` (rl.group_size a question) with their (P, G) `rewards`: each
        answer's reward less rl.kl_coef × its KL estimate (log π − log π_ref summed over its tokens, a constant),
        its advantage that less its group's mean, and the loss −Σ advantage × log π over the answer tokens divided by
        their count, so that neither the prompt's length nor the padding changes the step."""
        group, device = self.section.group_size, self.policy.lm_head.weight.device
        x, y = answer_batch(answers, group, self.end_id, device)
        # What tokens/s and MFU count: the sampled answers trained on (the sampling itself is not counted).
        self.positions_built = x.numel()
        logprobs = sequence_logprobs(self.policy, x, y)
        rewards = rewards.to(device)
        shaped, kl = rewards, torch.full((), math.nan, device=device)
        if self.section.kl_coef > 0:
            log_ratio = logprobs.detach() - self.reference_logprobs(x, y)  # each answer's KL estimate (k1)
            shaped, kl = rewards - self.section.kl_coef * log_ratio.view_as(rewards), log_ratio.mean()
        loss = grpo_loss(logprobs, group_advantages(shaped).flatten(), int((y != -1).sum()))
        lengths = torch.tensor([float(len(ids)) for ids in answers.ids], device=device)
        signal = differing_groups(rewards).float().mean()
        return loss, {"loss": loss.detach(), "reward": rewards.mean(), "signal": signal, "kl": kl,
                      "answer_length": lengths.mean()}


def pass_rates(policy: Transformer, tokenizer: Tokenizer, tasks: Sequence[Task], reward: Callable,
               section: RLConfig, seed: int, batch_size: int) -> dict[str, float]:
    """Over `tasks`: rl.group_size answers sampled for each (seeded by the task's place in the list, the same at
    every evaluation), pass@1 and pass@k (k = group size) from the answers whose reward reaches SOLVED, and the
    mean reward."""
    group, solved, rewards = section.group_size, [], []
    for start in range(0, len(tasks), batch_size):
        chunk = tasks[start : start + batch_size]
        seeds = [sample_seed(seed, _EVAL_STREAM, start + row // group, row % group)
                 for row in range(len(chunk) * group)]
        answers = sample_answers(policy, tokenizer, chunk, section, seeds)
        scores = [score(reward, section.reward, chunk[n // group], text) for n, text in enumerate(answers.texts)]
        rewards += scores
        solved += [sum(value >= SOLVED for value in scores[p * group : (p + 1) * group]) for p in range(len(chunk))]
    if not tasks:
        return {}
    return {"pass@1": sum(pass_at_k(group, c, 1) for c in solved) / len(solved),
            "pass@k": sum(pass_at_k(group, c, group) for c in solved) / len(solved),
            "reward": sum(rewards) / len(rewards)}


def example_answers(policy: Transformer, tokenizer: Tokenizer, tasks: Sequence[Task], section: RLConfig,
                    seed: int) -> list[str]:
    """One answer to each task, sampled as training samples, seeded as the evaluation's first answer to it."""
    seeds = [sample_seed(seed, _EVAL_STREAM, number, 0) for number in range(len(tasks))]
    return sample_answers(policy, tokenizer, tasks, dataclasses.replace(section, group_size=1), seeds).texts


# ----------------------------------------------------------------------------------------------
# The recipe


class TaskBatches(RowBatches):
    """Batch i of the train questions: x (B, 1) their numbers, y (B, 1) the batch number i (the sampling's seed);
    a pure function of (seed, i), an epoch a pass over the questions in a seeded order.

    Under torchrun each rank reads batches of its own numbers (train/step.py: batch_index), so it samples other
    questions than the others do, each question's whole group on one rank. That is what GRPO wants: an advantage
    compares the answers of one question, so no rank needs another's rewards (DDP averages the gradients, the
    objective its metrics), and W ranks learn from W times the questions a step. The same questions on every rank
    would either repeat the same answers or split each group across ranks, whose rewards must then be gathered."""

    def __init__(self, count: int, batch_size: int, seed: int, where: str) -> None:
        super().__init__(batch_size, 1, seed, np.arange(count), False, where)

    def get_batch(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        numbers = torch.from_numpy(self.examples_of(index)).view(-1, 1)
        return numbers, torch.full_like(numbers, index)


@dataclass
class Probe:
    """What the base answered before training (probe_base): `questions` train questions over `batches` train batches,
    rl.group_size answers each, `differing` of them with rewards that differ; every answer's reward; one answer."""
    questions: int
    batches: int
    differing: int
    rewards: list[float]
    example: tuple[str, str]  # (a question, the first answer to it)


def probe_base(policy: Transformer, tokenizer: Tokenizer, tasks: Sequence[Task], batches: TaskBatches,
               reward: Callable, section: RLConfig, seed: int, limit: int) -> Probe:
    """The questions of the first train batches answered by `policy` as the first steps sample them (the same rows,
    the same seeds), a batch at a time (no more memory than a step's sampling), until a question's answers get
    rewards that differ or `limit` questions are answered."""
    group, answered, batch, differing, rewards, example = section.group_size, 0, 0, 0, [], ("", "")
    with torch.no_grad(), eval_mode(policy):
        while answered < limit and not differing:
            chunk = [tasks[n] for n in batches.examples_of(batch)[: limit - answered]]
            seeds = [sample_seed(seed, _TRAIN_STREAM, batch, row) for row in range(len(chunk) * group)]
            answers = sample_answers(policy, tokenizer, chunk, section, seeds)
            scores = [score(reward, section.reward, chunk[n // group], text) for n, text in enumerate(answers.texts)]
            differing += int(differing_groups(torch.tensor(scores).view(len(chunk), group)).sum())
            example = example if batch else (chunk[0].prompt, answers.texts[0])
            rewards += scores
            answered, batch = answered + len(chunk), batch + 1
    return Probe(answered, batch, differing, rewards, example)


def _fitting_tasks(tasks: list[Task], lengths: list[int], context: int, section: RLConfig, say: Say) -> list[Task]:
    """The tasks whose templated question (`lengths` tokens) leaves room in the model's `context` for an answer (its
    answers get the room left, up to rl.max_new_tokens); the others, which cannot be sampled, dropped with a line;
    none left is refused in one line."""
    kept = [task for task, n in zip(tasks, lengths) if n < context]
    if not kept:
        raise BurnoutError(f"'{section.source}': every question fills the model's context ({context:,} tokens), "
                           f"leaving no room for an answer (the shortest is {min(lengths):,} tokens); give shorter "
                           "questions, or a model of a longer context")
    if len(kept) < len(tasks):
        say(f"{len(tasks) - len(kept):,} of {len(tasks):,} questions dropped: each fills the model's {context:,}-token "
            "context, leaving no room for an answer")
    return kept


class NothingToLearn(BurnoutError):
    """The refusal of an RL run whose base gets the same reward for every answer of every question probed (the line of
    nothing_to_learn): a command that runs RL as one stage of several (`burnout speedrun`) skips the stage on it."""


def nothing_to_learn(probe: Probe, section: RLConfig) -> str:
    """The refusal of a run whose probe found no question with answers of differing rewards: what was sampled, what
    they all got, and what would give GRPO something to learn."""
    values = sorted(set(probe.rewards))
    got = (f"all {len(probe.rewards)} answers got the reward {values[0]:g}" if len(values) == 1 else
           f"each question's answers got one reward between them ({', '.join(f'{v:g}' for v in values[:4])})")
    if values[0] >= SOLVED:
        fix = "give harder questions"
    elif values[-1] < SOLVED:
        fix = "SFT it first on answers written like the references (burnout sft), or give easier questions"
    else:
        fix = "give questions it gets right only sometimes"
    question, answer = probe.example
    return (f"rl.base {section.base}: nothing to learn: before training it answered {probe.questions} train "
            f"question(s) {section.group_size} times each (the first {probe.batches} batch(es), sampled as training "
            f"samples them) and {got}, e.g. {answer[:60]!r} to {question[:60]!r}; GRPO learns only from a question "
            f"whose answers' rewards differ (here every advantage, and every step's loss, would be 0): {fix}, raise "
            "rl.group_size or rl.temperature, or use a reward that gives partial credit (rl.probe_questions=0 trains "
            "anyway)")


def read_prepared_tasks(data_dir: Path) -> dict[str, list[Task]]:
    """{"train": [...], "val": [...]} of a folder _prepare_data wrote."""
    read_sft_meta(data_dir, TASKS_FORMAT)  # a meta.json cut short or of another kind: one line
    splits: dict[str, list[Task]] = {"train": [], "val": []}
    for line in (Path(data_dir) / TASKS_FILE).read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        splits[record["split"]].append(Task(record["prompt"], record["reference"]))
    return splits


class RL(FineTune):
    """GRPO from rl.base (a chat model) on the questions of rl.source: see the module docstring."""

    what = "questions and answers"
    val_of = "held-out questions: 1 − pass@1"

    def __init__(self, section: RLConfig) -> None:
        self.reward = load_reward(section.reward)  # an unknown reward is refused before anything is written
        self.kl_coef = section.kl_coef
        self.warned_at: int | None = None  # the step of the last flat-groups warning
        self._objective: GRPOObjective | None = None

    def section(self, cfg: RunConfig) -> RLConfig:
        return cfg.rl

    def finish(self, cfg: RunConfig, run_dir: Path, checkpoint: Path) -> list[str]:
        """Also RUN/EXAMPLES_FILE, where the starting model is still there to answer."""
        lines = super().finish(cfg, run_dir, checkpoint)
        tasks = read_prepared_tasks(Path(cfg.data.prepared_dir))["val"][:EXAMPLES]
        if not tasks or not Path(cfg.rl.base).exists():
            return lines
        answers = {}
        for when, source in (("before", cfg.rl.base), ("after", checkpoint)):
            model, tokenizer, _ = load_model(source)
            texts = example_answers(model, tokenizer, tasks, cfg.rl, cfg.train.seed)
            answers[when] = [{"answer": text, "reward": score(self.reward, cfg.rl.reward, task, text)}
                             for task, text in zip(tasks, texts)]
        examples = [{"question": task.prompt, "reference": task.reference, "before": before, "after": after}
                    for task, before, after in zip(tasks, answers["before"], answers["after"])]
        write_atomic(run_dir / EXAMPLES_FILE, json.dumps(examples, indent=1, ensure_ascii=False))
        return [*lines, f"answers to {len(tasks)} held-out questions before and after: {run_dir / EXAMPLES_FILE}"]

    def run_config(self, cfg: RunConfig, base: Transformer, base_ckpt: Checkpoint, added: list[str],
                   data_dir: Path) -> RunConfig:
        return from_chat_model(cfg, base, base_ckpt, data_dir, "rl")

    def _prepare_data(self, cfg: RunConfig, tokenizer: Tokenizer, data_dir: Path, say: Say) -> dict:
        """The tasks read, checked (a gsm8k reward needs a `#### n` in every reference), split and written to
        `data_dir` with the tokenizer, meta.json last."""
        section = cfg.rl
        say(f"reading {self.what} from {section.source} into {data_dir}")
        tasks = read_tasks(section.source, section.split, section.subset, section.data_files, section.max_examples)
        lengths = [len(encode_prompt(tokenizer, [{"role": "user", "content": task.prompt}],
                                     f"'{section.source}' record {number}: its question"))
                   for number, task in enumerate(tasks, start=1)]  # each is encoded at every step: refused now
        tasks = _fitting_tasks(tasks, lengths, cfg.model.context_length, section, say)
        if section.reward == "gsm8k":
            for number, task in enumerate(tasks, start=1):
                if final_number(task.reference) is None:
                    raise BurnoutError(f"'{section.source}' record {number}: its answer has no final '#### number' "
                                       "for the gsm8k reward to compare; end it with one (#### 42) or choose another "
                                       "reward (--reward exact, regex:PATTERN or module:function)")
        held_out = held_out_split(len(tasks), section.val_fraction, cfg.data.seed)
        data_dir.mkdir(parents=True, exist_ok=True)
        write_atomic(data_dir / TASKS_FILE, "".join(
            json.dumps({"prompt": task.prompt, "reference": task.reference,
                        "split": "val" if out else "train"}) + "\n" for task, out in zip(tasks, held_out)))
        tokenizer.save(str(data_dir / TOKENIZER_FILE))
        meta = {"format": TASKS_FORMAT, "source": section.source, "vocab_size": tokenizer.get_vocab_size(),
                "splits": {"train": {"examples": int((~held_out).sum())}, "val": {"examples": int(held_out.sum())}}}
        write_atomic(data_dir / META_FILE, json.dumps(meta, indent=2))
        say(f"{meta['splits']['train']['examples']:,} train questions, {meta['splits']['val']['examples']:,} held out")
        return meta

    def check_prepared(self, cfg: RunConfig, data_dir: Path, say: Say) -> None:
        """The base answers rl.probe_questions train questions first, on the run's device (probe_base), and a run in
        which none got answers of differing rewards is refused: it would train every step at loss 0. Rank 0 alone
        under torchrun (the others wait for it at their first collective; its refusal ends them)."""
        section = cfg.rl
        if section.probe_questions == 0 or int(os.environ.get("RANK", "0")) != 0:
            return
        tasks = read_prepared_tasks(data_dir)["train"]
        policy, tokenizer, _, _ = load_base(section.base)
        batches = TaskBatches(len(tasks), cfg.train.batch_size, cfg.train.seed, f"'{data_dir}' train questions")
        probe = probe_base(policy.to(resolve_device(cfg.train.device)), tokenizer, tasks, batches, self.reward,
                           section, cfg.train.seed, min(section.probe_questions, len(tasks)))
        if not probe.differing:
            raise NothingToLearn(nothing_to_learn(probe, section))
        say(f"before training: the base answered {probe.questions} train question(s) {section.group_size} times "
            f"each; {probe.differing} of them got answers whose rewards differ (mean reward "
            f"{sum(probe.rewards) / len(probe.rewards):.3g}): something to learn")

    def data_meta(self, cfg: RunConfig, data_dir: Path, seq_len: int) -> dict:
        """meta.json with `splits.train.tokens` = questions × seq_len, so train.max_epochs counts passes over them."""
        meta = read_sft_meta(data_dir, TASKS_FORMAT)
        meta["splits"]["train"]["tokens"] = meta["splits"]["train"]["examples"] * seq_len
        return meta

    def loaders(self, cfg: RunConfig, data_dir: Path, seq_len: int) -> dict:
        tasks = read_prepared_tasks(data_dir)
        return {"train": TaskBatches(len(tasks["train"]), cfg.train.batch_size, cfg.train.seed,
                                     f"'{data_dir}' train questions"),
                "val": tasks["val"]}

    def init_weights(self, model: torch.nn.Module, cfg: RunConfig, resuming: bool, say: Say) -> None:
        """The base's weights even when resuming: they are the KL reference, which the objective copies before
        the run's own weights load."""
        super().init_weights(model, cfg, resuming=False, say=say)

    def objective(self, model: torch.nn.Module, cfg: RunConfig, resumed: bool) -> torch.nn.Module:
        data_dir = Path(cfg.data.prepared_dir)
        self._objective = GRPOObjective(model, load_tokenizer(data_dir / TOKENIZER_FILE),
                                        read_prepared_tasks(data_dir)["train"], self.reward, cfg.rl, cfg.train.seed,
                                        cfg.train.grad_accum, resumed=resumed)
        return self._objective

    def evaluate(self, objective: torch.nn.Module, loader, tc: TrainConfig, device: torch.device,
                 precision: str) -> dict:
        """pass@1, pass@k and the mean reward of the first eval_batches × batch_size held-out questions as val_*;
        val_loss is 1 − pass@1 (what train.keep_best keeps the lowest of)."""
        held_out = loader[: tc.eval.eval_batches * tc.batch_size]
        if not held_out:
            return {"val_loss": math.nan}
        rates = objective(held_out=held_out, batch_size=tc.batch_size)
        return {"val_loss": 1.0 - rates["pass@1"], **{f"val_{key}": value for key, value in rates.items()}}

    def flops_per_token(self, flops: dict) -> float:
        # The KL reference's forward, where there is one; the sampling's decoding is not counted.
        return flops["flops_per_token"] + (flops["forward_flops_per_token"] if self.kl_coef > 0 else 0.0)

    def after_step(self, step: int, loss: float) -> str | None:
        """A warning when most groups of the step had all-equal rewards (at most one in FLAT_WARNING_EVERY steps)."""
        signal = (self._objective.last_metrics if self._objective is not None else {}).get("signal", 1.0)
        recently = self.warned_at is not None and step - self.warned_at < FLAT_WARNING_EVERY
        if signal >= FLAT_SHARE or recently:
            return None
        self.warned_at = step
        return (f"warning: step {step}: {1 - signal:.0%} of the groups got all-equal rewards, and all-equal rewards "
                "teach nothing (every advantage is 0); give questions this model gets right only sometimes (all "
                "wrong: easier ones, or more SFT; all right: harder ones), raise rl.group_size or rl.temperature, or "
                "use a reward that gives partial credit")
