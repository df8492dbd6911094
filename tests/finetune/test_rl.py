"""`burnout rl` (GRPO) on the training engine: the advantages and the loss of a hand-made group against a direct
computation, pass@k against counting, the rewards (gsm8k, exact, regex, a user's function, and one line for a
function that raises or returns a non-number), a short run of chat_run through the real command that logs the
reward, signal, KL, answer length and held-out pass@1/pass@k, a run stopped and resumed equal bitwise to the
uninterrupted one, the flat-groups warning, and a reward that fails mid-run leaving the run's checkpoints."""

import copy
import dataclasses
import itertools
import json
import math
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
import safetensors.torch
import torch
import torch.nn as nn

from burnout.cli import main
from burnout.config import ModelConfig, RLConfig
from burnout.core.checkpoint import list_checkpoints
from burnout.errors import BurnoutError
from burnout.finetune.objective import sequence_logprobs
from burnout.finetune.rl import (
    Answers,
    GRPOObjective,
    Task,
    answer_batch,
    exact_reward,
    group_advantages,
    grpo_loss,
    gsm8k_reward,
    load_reward,
    pass_at_k,
    read_tasks,
    regex_reward,
    sample_answers,
    score,
)
from burnout.models import Transformer
from burnout.runs import resume_training

RL_TRAIN = {"device": "cpu", "precision": "fp32", "batch_size": 2, "seq_len": 64, "max_steps": 4, "lr": 1e-3,
            "warmup_steps": 1, "log_interval": 1, "eval_interval": 2, "eval_batches": 1, "ckpt_interval": 2,
            "keep_last": 10}
# The reward: whether the answer says "is" (chat_run was taught "Paris is it is it."), which about half its answers do.
RL_ARGS = ["--reward", "regex:is", "rl.group_size=4", "rl.max_new_tokens=8", "rl.val_fraction=0.25",
           *(f"train.{key}={value}" for key, value in RL_TRAIN.items())]


def _metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _quiet(line):
    pass


@pytest.fixture(scope="module")
def tasks(tmp_path_factory) -> Path:
    """chat_run's questions ("Capital i?"), the answer it was taught as the reference."""
    path = tmp_path_factory.mktemp("rl_tasks") / "tasks.jsonl"
    path.write_text("".join(json.dumps({"question": f"Capital {i}?", "answer": "Paris is it."}) + "\n"
                             for i in range(16)))
    return path


@pytest.fixture(scope="module")
def rl_run(chat_run, tasks, tmp_path_factory) -> Path:
    """4 steps of GRPO through `burnout rl`, with a KL penalty; checkpoints at 2 and 4."""
    run = tmp_path_factory.mktemp("rl") / "run"
    assert main(["rl", str(chat_run), "--data", str(tasks), "--out", str(run), *RL_ARGS, "rl.kl_coef=0.1"]) == 0
    return run


# ----------------------------------------------------------------------------------------------
# The objective's arithmetic


def test_advantages_are_the_reward_minus_the_group_mean():
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0], [0.5, 1.0, 0.0, 0.5]])
    expected = [[r - sum(group) / len(group) for r in group] for group in rewards.tolist()]
    assert group_advantages(rewards).tolist() == expected


def test_the_loss_is_minus_the_mean_over_answer_tokens_of_advantage_times_log_prob():
    """Two questions, two answers each, through answer_batch and the model's own log-softmax token by token."""
    torch.manual_seed(0)
    model = Transformer(ModelConfig(family="llama", vocab_size=50, n_layer=1, d_model=32, n_head=2,
                                    context_length=32).resolved())
    end = 49
    answers = Answers(prompts=[[1, 2, 3], [4, 5]], ids=[[6, 7], [8], [9, 10, 11], [12]],
                      stopped=[True, False, True, True], texts=["", "", "", ""])
    advantages = torch.tensor([0.5, -0.5, 0.25, -0.25])
    x, y = answer_batch(answers, 2, end, torch.device("cpu"))
    loss = grpo_loss(sequence_logprobs(model, x, y), advantages, int((y != -1).sum()))
    total, tokens = 0.0, 0
    for number, ids in enumerate(answers.ids):
        prompt = answers.prompts[number // 2]
        targets = ids + ([end] if answers.stopped[number] else [])
        row = torch.tensor([prompt + targets])
        logprobs = model(row).log_softmax(-1)[0]
        for t, token in enumerate(targets):
            total += advantages[number].item() * logprobs[len(prompt) - 1 + t, token].item()
            tokens += 1
    assert tokens == 2 + 1 + 1 + 3 + 1 + 1 + 1
    assert loss.item() == pytest.approx(-total / tokens, rel=1e-5)


def _chat_tokenizer():
    from burnout.config import TokenizerConfig
    from burnout.core.chat_template import ensure_chat_tokens
    from burnout.data.tokenizer import train_tokenizer

    return ensure_chat_tokens(train_tokenizer(["Paris is it. Capital of France?"] * 20,
                                              TokenizerConfig(kind="bpe", vocab_size=300)))[0]


def _objective(policy: Transformer, tokenizer, group: int, kl_coef: float) -> GRPOObjective:
    section = RLConfig(base="chat", source="tasks.jsonl", group_size=group, kl_coef=kl_coef)
    return GRPOObjective(policy, tokenizer, [], exact_reward, section, seed=0)


# Two questions, three answers each: prompts of 3 and 7 tokens (so rows are padded), answers of 1 to 4 tokens, some
# cut by max_new_tokens (no <|im_end|> to learn), rewards with a flat group's worth of ties in the second.
GROUP = Answers(prompts=[[5, 6, 7], [8, 9, 10, 11, 12, 13, 14]], ids=[[20, 21], [22], [23, 24, 25, 26], [27, 28], [29],
                                                                     [30, 31, 32]],
                stopped=[True, False, True, True, True, False], texts=[""] * 6)
REWARDS = [[1.0, 0.0, 0.0], [0.5, 0.5, 1.0]]


def _by_hand(model: nn.Module, answers: Answers, group: int, end: int) -> tuple[list, list[int]]:
    """Each answer's summed log-prob of its targets (its tokens, then <|im_end|> where it stopped), each answer run
    alone, unpadded, through the model's log-softmax; and its number of targets."""
    logprobs, counts = [], []
    for number, ids in enumerate(answers.ids):
        prompt = answers.prompts[number // group]
        targets = ids + ([end] if answers.stopped[number] else [])
        row = torch.tensor([prompt + targets])
        table = model(row).log_softmax(-1)[0]
        logprobs.append(sum(table[len(prompt) - 1 + t, token] for t, token in enumerate(targets)))
        counts.append(len(targets))
    return logprobs, counts


def test_the_grpo_loss_of_a_fixed_group_equals_a_hand_computation_kl_mask_and_normalisation():
    """The loss GRPOObjective trains on, against the formula worked out answer by answer: shaped reward
    r − β·(log π − log π_ref) (the KL penalty holds the policy near its start: an answer the policy likes more than
    the reference is worth less), advantage = shaped − its group's mean, loss = −Σ advantage·log π / (answer tokens),
    where only the answers' tokens and their <|im_end|> count: not the prompt, not the padding. The advantage is a
    constant: the gradient is −Σ advantage·∇log π / tokens."""
    torch.manual_seed(0)
    tokenizer = _chat_tokenizer()
    policy = Transformer(ModelConfig(family="llama", vocab_size=tokenizer.get_vocab_size(), n_layer=1, d_model=32,
                                     n_head=2, context_length=32).resolved())
    beta, group, end = 0.5, 3, tokenizer.token_to_id("<|im_end|>")
    objective = _objective(policy, tokenizer, group, beta)  # its reference: a copy of the policy as it is now
    start = copy.deepcopy(policy)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(torch.randn_like(p) * 0.3)  # the policy has moved: log π − log π_ref differs from answer to answer
    loss, metrics = objective.answers_loss(GROUP, torch.tensor(REWARDS))
    loss.backward()
    got = {name: p.grad.clone() for name, p in policy.named_parameters()}
    policy.zero_grad()

    logprobs, counts = _by_hand(policy, GROUP, group, end)
    with torch.no_grad():
        reference, _ = _by_hand(start, GROUP, group, end)
    shaped = [r - beta * (lp.item() - ref.item())
              for r, lp, ref in zip(sum(REWARDS, []), logprobs, reference)]
    advantages = [value - sum(shaped[q * group : (q + 1) * group]) / group
                  for q in range(2) for value in shaped[q * group : (q + 1) * group]]
    assert counts == [3, 1, 5, 3, 2, 3]
    hand = -sum(a * lp for a, lp in zip(advantages, logprobs)) / sum(counts)
    assert loss.item() == pytest.approx(hand.item(), rel=1e-5)
    assert metrics["kl"].item() == pytest.approx(sum(lp.item() - ref.item() for lp, ref in zip(logprobs, reference))
                                                 / 6, rel=1e-5)
    hand.backward()
    for name, p in policy.named_parameters():
        torch.testing.assert_close(got[name], p.grad, rtol=1e-4, atol=1e-6, msg=name)


def test_the_grpo_step_does_not_change_with_the_prompts_length():
    """A model whose output at a position depends on that position's token alone (attention and MLP outputs zeroed,
    no position embedding): the same answers after a 2-token and a 20-token prompt ending in the same token have the
    same log-probs, so the loss, and the gradient of the head that scores them, must be the same."""
    torch.manual_seed(0)
    tokenizer = _chat_tokenizer()
    model = Transformer(ModelConfig(family="llama", vocab_size=tokenizer.get_vocab_size(), n_layer=1, d_model=32,
                                    n_head=2, context_length=64).resolved())
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("attn.proj.weight", "mlp.down.weight")):
                p.zero_()
    objective = _objective(model, tokenizer, 2, 0.0)
    results = []
    for prompt in ([9, 12], [40 + i for i in range(18)] + [9, 12]):
        answers = Answers(prompts=[prompt], ids=[[20, 21, 22], [23]], stopped=[True, False], texts=["", ""])
        model.zero_grad()
        loss, _ = objective.answers_loss(answers, torch.tensor([[1.0, 0.0]]))
        loss.backward()
        results.append((loss.item(), model.lm_head.weight.grad.clone()))
    (short, short_grad), (long, long_grad) = results
    assert short != 0 and long == pytest.approx(short, rel=1e-6)
    torch.testing.assert_close(long_grad, short_grad)


@pytest.mark.parametrize("n,correct,k", [(4, 0, 1), (4, 1, 1), (4, 1, 2), (5, 2, 3), (8, 3, 8), (6, 5, 2)])
def test_pass_at_k_is_the_share_of_k_subsets_holding_a_right_answer(n, correct, k):
    samples = [True] * correct + [False] * (n - correct)
    subsets = list(itertools.combinations(samples, k))
    assert pass_at_k(n, correct, k) == pytest.approx(sum(any(s) for s in subsets) / len(subsets))


# ----------------------------------------------------------------------------------------------
# Rewards


def test_the_gsm8k_reward_compares_the_final_numbers():
    reference = "Natalia sold 48/2 = 24 clips in May.\n#### 1,024"
    assert gsm8k_reward("q", "so 1000 + 24\n#### 1024", reference) == 1.0
    assert gsm8k_reward("q", "#### 7 then #### 1024.0", reference) == 1.0  # the last one counts, as a number
    assert gsm8k_reward("q", "#### 1023", reference) == 0.0
    assert gsm8k_reward("q", "1024", reference) == 0.0  # no '####': nothing to check


def test_the_exact_and_regex_rewards():
    assert exact_reward("q", " Paris.\n", "Paris.") == 1.0 and exact_reward("q", "Paris", "Paris.") == 0.0
    answer_is = regex_reward(r"(?:answer|result) is (\w+)")
    assert answer_is("q", "well, the result is Rome!", "the answer is Rome") == 1.0  # group 1 compared, not the match
    assert answer_is("q", "answer is Paris", "answer is Rome") == 0.0
    assert answer_is("q", "Rome", "answer is Rome") == 0.0  # no match in the answer: nothing to compare
    with pytest.raises(BurnoutError, match="not a regular expression"):
        regex_reward("(")


def test_a_user_reward_function_is_imported_from_the_current_folder(tmp_path, monkeypatch):
    (tmp_path / "my_rewards.py").write_text("def length(prompt, answer, reference):\n"
                                            "    return len(answer) / len(reference)\n"
                                            "def broken(prompt, answer, reference):\n"
                                            "    return int(answer)\n"
                                            "def words(prompt, answer, reference):\n"
                                            "    return answer.split()\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.path", list(os.sys.path))
    task = Task("Capital?", "Paris.")
    assert score(load_reward("my_rewards:length"), "my_rewards:length", task, "Rome") == pytest.approx(4 / 6)
    with pytest.raises(BurnoutError) as raised:
        score(load_reward("my_rewards:broken"), "my_rewards:broken", task, "Rome")
    assert "\n" not in str(raised.value) and "raised ValueError" in str(raised.value) and "'Rome'" in str(raised.value)
    with pytest.raises(BurnoutError) as returned:
        score(load_reward("my_rewards:words"), "my_rewards:words", task, "Rome")
    assert "returned ['Rome'] (list)" in str(returned.value) and "finite number" in str(returned.value)
    with pytest.raises(BurnoutError, match="has no function 'missing'"):
        load_reward("my_rewards:missing")
    with pytest.raises(BurnoutError, match="no module 'not_there'"):
        load_reward("not_there:f")


def test_a_reward_that_exits_or_returns_a_non_finite_or_absurd_number_is_one_line_naming_question_and_value(
        tmp_path, monkeypatch):
    """sys.exit inside the function (which would end `burnout rl` without a word, exit status 0) and values that would
    make every loss NaN (inf, NaN, 1e308, an int past float's range) or swamp it (beyond ±MAX_REWARD) are refused
    with the function, the answer, its question and the value; any real number within the bound is a reward."""
    from fractions import Fraction

    from burnout.finetune.rl import MAX_REWARD

    (tmp_path / "odd_rewards.py").write_text("import sys\n"
                                             "def quits(prompt, answer, reference):\n"
                                             "    sys.exit(3)\n"
                                             "def quits_quietly(prompt, answer, reference):\n"
                                             "    sys.exit()\n")
    (tmp_path / "exits_on_import.py").write_text("import sys\nsys.exit('usage: exits_on_import FILE')\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.path", list(os.sys.path))
    task = Task("Capital of France?", "Paris.")
    for name, code in (("quits", "sys.exit(3)"), ("quits_quietly", "sys.exit()")):
        with pytest.raises(BurnoutError) as exited:
            score(load_reward(f"odd_rewards:{name}"), f"odd_rewards:{name}", task, "Rome")
        assert str(exited.value).startswith(f"rl.reward odd_rewards:{name} called {code} for the answer 'Rome' to "
                                            "'Capital of France?'"), str(exited.value)
    with pytest.raises(BurnoutError, match=r"importing exits_on_import called sys.exit\('usage"):
        load_reward("exits_on_import:f")
    for value, shown, why in ((math.inf, "inf", "finite number"), (math.nan, "nan", "finite number"),
                              (1e308, "1e+308", "beyond ±1e+06"), (-1e7, "-10000000.0", "beyond ±1e+06"),
                              (10**400, "10000000000000000000... (401 characters)", "beyond ±1e+06")):
        with pytest.raises(BurnoutError) as refused:
            score(lambda p, a, r, value=value: value, "mine:f", task, "Rome")
        message = str(refused.value)
        assert message.startswith(f"rl.reward mine:f returned {shown}") and why in message, message
        assert "for the answer 'Rome' to 'Capital of France?'" in message and "\n" not in message, message
    for value in (True, Fraction(1, 2), MAX_REWARD, -MAX_REWARD, 0):
        assert score(lambda p, a, r, value=value: value, "mine:f", task, "Rome") == float(value)


@pytest.mark.parametrize("record,problem", [({"question": "", "answer": "#### 2"}, "has an empty question"),
                                            ({"question": " \n", "answer": "#### 2"}, "has an empty question"),
                                            ({"question": None, "answer": "#### 2"}, "has an empty question"),
                                            ({"question": "1 + 1?", "answer": "  "}, "has no answer")])
def test_a_task_with_an_empty_question_or_answer_is_refused_naming_its_file_and_record(tmp_path, record, problem):
    path = tmp_path / "tasks.jsonl"
    path.write_text(json.dumps({"question": "2 + 2?", "answer": "#### 4"}) + "\n" + json.dumps(record) + "\n")
    with pytest.raises(BurnoutError) as refused:
        read_tasks(path)
    assert str(refused.value).startswith(f"'{path}' record 2 {problem}"), str(refused.value)


# ----------------------------------------------------------------------------------------------
# Runs


def test_a_run_logs_reward_signal_kl_and_answer_length_and_held_out_pass_rates(rl_run, chat_run):
    metrics = _metrics(rl_run)
    assert [r["step"] for r in metrics] == [1, 2, 3, 4]
    for record in metrics:
        assert 0 <= record["reward"] <= 1 and 0 <= record["signal"] <= 1, record
        assert 0 < record["answer_length"] <= 8 and math.isfinite(record["kl"]), record
    assert metrics[0]["kl"] == 0.0  # step 1 samples from the starting policy itself
    assert any(record["signal"] > 0 for record in metrics)  # some groups were not flat: the test learns something
    evals = [r for r in metrics if "val_loss" in r]
    assert [r["step"] for r in evals] == [2, 4]
    for record in evals:
        assert 0 <= record["val_pass@1"] <= record["val_pass@k"] <= 1
        assert record["val_loss"] == pytest.approx(1 - record["val_pass@1"])
    assert [p.name for p in list_checkpoints(rl_run)] == ["step_0000002", "step_0000004"]
    final = safetensors.torch.load_file(list_checkpoints(rl_run)[-1] / "model.safetensors")
    start = safetensors.torch.load_file(list_checkpoints(chat_run)[-1] / "model.safetensors")
    assert not any(key.startswith("policy.") for key in final)
    assert any(not torch.equal(final[key], start[key]) for key in start)  # the policy moved


def _stopped_at_step_2(chat_run, tasks, stopped, *args: str):
    """The 4-step run of `args`, stopped after its first phase (step 2)."""
    assert main(["rl", str(chat_run), "--data", str(tasks), "--out", str(stopped), *RL_ARGS, *args,
                 "train.phases=[{name: a, steps: 2}, {name: b, steps: 4}]"]) == 0
    return stopped


def _assert_resumed_equals(whole, stopped) -> None:
    """`stopped`, resumed to step 4, ends with `whole`'s weights bitwise and logged its metrics."""
    assert resume_training(stopped, [], on_event=_quiet, progress=False).step == 4
    a = safetensors.torch.load_file(list_checkpoints(whole)[-1] / "model.safetensors")
    b = safetensors.torch.load_file(list_checkpoints(stopped)[-1] / "model.safetensors")
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key
    keys = ("train_loss", "reward", "signal", "kl", "answer_length")
    assert [[r[k] for k in keys] for r in _metrics(stopped)] == [[r[k] for k in keys] for r in _metrics(whole)]


def test_a_run_stopped_and_resumed_equals_the_uninterrupted_one_bitwise(rl_run, chat_run, tasks, tmp_path):
    stopped = _stopped_at_step_2(chat_run, tasks, tmp_path / "stopped", "rl.kl_coef=0.1")
    assert [p.name for p in list_checkpoints(stopped)] == ["step_0000002"]
    _assert_resumed_equals(rl_run, stopped)


def test_mostly_flat_groups_are_said_once_in_the_log(chat_run, tasks, tmp_path, capsys):
    """A reward no answer can earn: every group all-equal, one warning line for the stretch."""
    assert main(["rl", str(chat_run), "--data", str(tasks), "--out", str(tmp_path / "flat"), *RL_ARGS,
                 "--reward", "regex:never-said", "train.max_steps=3", "train.eval_interval=10",
                 "rl.probe_questions=0"]) == 0  # past the check before training, which would refuse this run
    out = capsys.readouterr().out
    warnings = [line for line in out.splitlines() if "all-equal rewards teach nothing" in line]
    assert len(warnings) == 1 and warnings[0].startswith("warning: step 1: 100% of the groups"), out
    assert all(r["signal"] == 0 and r["reward"] == 0 for r in _metrics(tmp_path / "flat"))


@pytest.mark.parametrize("reward,fix", [("regex:never-said", "SFT it first"), ("regex:^", "give harder questions")],
                         ids=["all-wrong", "all-right"])
def test_a_run_in_which_no_group_can_differ_is_refused_before_training(chat_run, tasks, tmp_path, capsys, reward,
                                                                       fix):
    """A reward no answer earns (or every answer earns): the base answers rl.probe_questions = 8 of the 12 train
    questions (4 batches of 2, 4 answers each) and the run is refused in one line saying so, before a step, leaving
    no run folder behind."""
    run = tmp_path / "run"
    assert main(["rl", str(chat_run), "--data", str(tasks), "--out", str(run), *RL_ARGS, "--reward", reward]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert "\n" not in err and err.startswith(f"burnout: error: rl.base {list_checkpoints(chat_run)[-1].resolve()}: "
                                               "nothing to learn"), err
    assert "answered 8 train question(s) 4 times each (the first 4 batch(es)" in err, err
    assert f"all 32 answers got the reward {0 if reward == 'regex:never-said' else 1}" in err and fix in err, err
    assert "rl.group_size" in err and "rl.probe_questions=0" in err, err
    assert not run.exists() and "step 1" not in captured.out


def test_the_check_before_training_samples_what_step_1_samples(chat_run, tasks, tmp_path, capsys):
    """The base's answers to the first batch's questions are step 1's (the same rows, seeds and policy): the mean
    reward the check says is the one step 1 logs; it stops at the first batch with a group that differs."""
    run = tmp_path / "run"
    assert main(["rl", str(chat_run), "--data", str(tasks), "--out", str(run), *RL_ARGS, "train.max_steps=1"]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("before training:"))
    assert line.startswith("before training: the base answered 2 train question(s) 4 times each; "), line
    said = float(line.split("(mean reward ")[1].split(")")[0])
    assert said == pytest.approx(_metrics(run)[0]["reward"], abs=5e-4), line  # said to 3 significant digits


def test_a_time_budget_covers_the_probe_before_training(chat_run, tasks, tmp_path, monkeypatch, capsys):
    """`--minutes 1` at train.step_seconds=1, and the base's probe (rl.probe_questions) takes 20 s of the command's
    clock (each step 1 s): the budget plans the 40 steps the other 40 s hold, not 60, and config.yaml keeps the 20 s
    for a resume's plan (red when the budget counts from the first step, leaving the probe out)."""
    from types import SimpleNamespace

    from burnout.config import load_saved_config
    from burnout.finetune import rl
    from burnout.train import loop
    from burnout.train.step import TrainStep

    now, real, real_step = [0.0], rl.probe_base, TrainStep.__call__
    monkeypatch.setattr(loop, "time", SimpleNamespace(perf_counter=lambda: now[0]))

    def one_second_step(*args, **kwargs):
        now[0] += 1.0
        return real_step(*args, **kwargs)

    monkeypatch.setattr(TrainStep, "__call__", one_second_step)

    def slow_probe(*args, **kwargs):
        now[0] += 20.0
        return real(*args, **kwargs)

    monkeypatch.setattr(rl, "probe_base", slow_probe)
    run = tmp_path / "run"
    assert main(["rl", str(chat_run), "--data", str(tasks), "--out", str(run), *RL_ARGS, "--minutes", "1",
                 "train.step_seconds=1"]) == 0
    assert "budget 1 min: train.step_seconds 1 s/step → 40 steps would fit; the run ends at step 4 first" in \
        capsys.readouterr().out
    assert load_saved_config(run / "config.yaml").train.startup_seconds == 20.0


def test_a_reward_that_fails_mid_run_is_one_line_and_the_run_keeps_its_checkpoint(chat_run, tasks, tmp_path,
                                                                                  monkeypatch, capsys):
    """The function raises from its 17th call on: step 3's scoring (2 questions × 4 answers a step)."""
    (tmp_path / "late_failure.py").write_text("calls = 0\n"
                                              "def reward(prompt, answer, reference):\n"
                                              "    global calls\n"
                                              "    calls += 1\n"
                                              "    if calls > 16:\n"
                                              "        raise KeyError('scores')\n"
                                              "    return 0.0\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.path", list(os.sys.path))
    run = tmp_path / "run"
    # train.step_seconds: no step timed for the plan before training, whose answers would be scored too.
    code = main(["rl", str(chat_run), "--data", str(tasks), "--out", str(run), *RL_ARGS,
                 "--reward", "late_failure:reward", "train.eval_interval=10", "rl.probe_questions=0",
                 "train.step_seconds=1"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("burnout: error: rl.reward late_failure:reward raised KeyError"), err
    assert "\n" not in err and "Traceback" not in err
    assert [p.name for p in list_checkpoints(run)] == ["step_0000002"]


@pytest.mark.parametrize("body,start", [("    sys.exit(0)\n", "called sys.exit(0) for the answer"),
                                        ("    return 1e308 if 'is' in answer else 0.0\n",
                                         "returned 1e+308 for the answer")], ids=["sys-exit", "1e308"])
def test_a_reward_that_exits_or_overflows_in_training_ends_the_run_in_one_line(chat_run, tasks, tmp_path, monkeypatch,
                                                                               capsys, body, start):
    """Past the check before training (rl.probe_questions=0), step 1's scoring: before, sys.exit(0) ended the run
    without a word and exit status 0, and 1e308 made every loss NaN and the run still ended `done:`."""
    module = f"bad_reward_{len(body)}"  # a module name of its own: an imported module stays in sys.modules
    (tmp_path / f"{module}.py").write_text(f"import sys\ndef reward(prompt, answer, reference):\n{body}")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.path", list(os.sys.path))
    code = main(["rl", str(chat_run), "--data", str(tasks), "--out", str(tmp_path / "run"), *RL_ARGS,
                 "--reward", f"{module}:reward", "rl.probe_questions=0"])
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert code == 2 and err.startswith(f"burnout: error: rl.reward {module}:reward {start}"), (code, err)
    assert "\n" not in err and "Traceback" not in err and "done:" not in captured.out


@pytest.mark.slow
def test_resuming_a_fine_tune_killed_before_training_names_the_command_that_started_it(chat_run, tasks, tmp_path,
                                                                                        monkeypatch, capsys):
    """`burnout rl` killed (SIGKILL) while its data are prepared and checked, before any step: `burnout train --resume`
    refuses, naming that `burnout rl` command (not `burnout train CONFIG`), and that command, run again, trains."""
    (tmp_path / "blocker.py").write_text("import os, time\n"
                                         "def reward(prompt, answer, reference):\n"
                                         "    if os.path.exists('block'):\n"
                                         "        open('ready', 'w').close()\n"
                                         "        time.sleep(600)\n"
                                         "    return float('is' in answer)\n")
    (tmp_path / "block").touch()
    run = tmp_path / "run"
    argv = ["rl", str(chat_run), "--data", str(tasks), "--out", str(run), *RL_ARGS, "--reward", "blocker:reward"]
    proc = subprocess.Popen([sys.executable, "-m", "burnout", *argv], cwd=tmp_path, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        for _ in range(3000):  # the reward is first called in the check before training, the data written
            if (tmp_path / "ready").exists() or proc.poll() is not None:
                break
            time.sleep(0.1)
        assert (tmp_path / "ready").exists(), proc.communicate(timeout=60)[1][-2000:]
    finally:
        proc.kill()
        proc.communicate(timeout=60)
    (tmp_path / "block").unlink()
    assert (run / "data").is_dir() and not list_checkpoints(run)
    assert main(["train", "--resume", str(run)]) == 2
    err = capsys.readouterr().err.strip()
    command = err.split("run the command that started it again (")[1].split("), which prepares them again")[0]
    assert shlex.split(command) == ["burnout", *argv], err
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.path", list(os.sys.path))
    assert main(shlex.split(command)[1:]) == 0
    assert [p.name for p in list_checkpoints(run)] == ["step_0000002", "step_0000004"]


def test_an_rl_run_started_again_into_its_folder_is_told_the_command_that_resumes_it(rl_run, chat_run, tasks,
                                                                                        capsys):
    """`burnout rl` has no --resume: the refusal names `burnout train --resume RUN`, which resumes any run."""
    assert main(["rl", str(chat_run), "--data", str(tasks), "--out", str(rl_run), *RL_ARGS]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"burnout: error: run folder {rl_run} already holds a run; resume it with `burnout train "
                          f"--resume {rl_run}`"), err


@pytest.mark.parametrize("command", ["sft", "dpo", "rl"])
def test_a_fine_tune_interrupted_while_preparing_leaves_nothing_and_resume_names_no_wrong_command(
        chat_run, fine_tune_data, tasks, tmp_path, monkeypatch, capsys, command):
    """Ctrl-C (KeyboardInterrupt) while a fine-tune prepares its data: the half-made data/ goes with the folder the
    command made (a fine-tune prepares from the start every time), and `--resume` of it says so without claiming a
    `burnout train` started it."""
    from burnout.finetune import recipes, rl

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    for recipe in (recipes.FineTune, rl.RL):  # once the data are written
        monkeypatch.setattr(recipe, "check_prepared", interrupted)
    run = tmp_path / "run"
    data = {"sft": fine_tune_data.chats, "dpo": fine_tune_data.pairs, "rl": tasks}[command]
    extra = ["--reward", "regex:is"] if command == "rl" else []
    assert main([command, str(chat_run), "--data", str(data), "--out", str(run), *extra, "train.device=cpu",
                 "train.max_steps=1"]) == 130
    assert not run.exists()
    capsys.readouterr()
    assert main(["train", "--resume", str(run)]) == 2
    assert capsys.readouterr().err.strip() == (f"burnout: error: --resume {run}: no such folder; give the --out of the "
                                               "command that started the run (burnout train, sft, dpo or rl)")


def test_an_rl_run_exports_with_a_model_card_that_says_how_it_was_tuned(rl_run, chat_run, tmp_path):
    assert main(["export", str(rl_run), "--to", str(tmp_path / "hf")]) == 0
    card = (tmp_path / "hf" / "README.md").read_text()
    base = list_checkpoints(chat_run)[-1]
    step = json.loads((base / "info.json").read_text())["step"]
    assert f"## Started from\n\n`{chat_run.name}` step {step}, fine-tuned with RL (GRPO)." in card
    assert "| RL (GRPO) |" in card and str(base.resolve()) not in card


def test_tokens_per_second_counts_the_sampled_answers_trained_on(rl_run):
    """The step's loader gives question numbers (B, 1); what it computes is the (B × group, T) batch of answers it
    samples, and tokens/s and MFU count those positions."""
    from burnout.config import load_saved_config
    from burnout.core.model_files import load_model
    from burnout.runs import recipe_for
    from burnout.train.step import accumulate_gradients

    cfg = load_saved_config(rl_run / "config.yaml")
    recipe = recipe_for(cfg)
    model, _, _ = load_model(rl_run)
    objective = recipe.objective(model, cfg, resumed=True)
    loader = recipe.loaders(cfg, Path(cfg.data.prepared_dir), cfg.train.seq_len)["train"]
    _, positions = accumulate_gradients(objective, loader, 0, 1, torch.device("cpu"), "fp32")
    rows = cfg.train.batch_size * cfg.rl.group_size
    assert positions == objective.positions_built and positions >= rows * 2, positions


def test_the_report_has_an_rl_section_with_the_reward_and_pass_rates_of_the_log(rl_run, chat_run):
    from burnout.report.render import run_blocks
    from burnout.report.runlog import load_run

    _, blocks = run_blocks(load_run(rl_run), log_scale=False)
    at = next(i for i, b in enumerate(blocks) if b.kind == "h2" and b.text == "Fine-tuning")
    about = dict(blocks[at + 1].rows)
    assert about["kind"] == "RL (GRPO), full fine-tuning"
    assert "4 answers sampled per question" in about["loss"] and "regex:is reward" in about["loss"]
    assert "KL to the start × 0.1" in about["loss"]
    assert blocks[at + 2].kind == "image" and blocks[at + 2].png.startswith(b"\x89PNG")
    metrics = _metrics(rl_run)

    def first_last(key):
        values = [r[key] for r in metrics if isinstance(r.get(key), float) and math.isfinite(r[key])]
        return [values[0], values[-1]]

    assert blocks[at + 3].rows == [["mean reward (train answers)", *first_last("reward")],
                                   ["groups with signal", *first_last("signal")],
                                   ["held-out pass@1", *first_last("val_pass@1")],
                                   ["held-out pass@4", *first_last("val_pass@k")]]


def test_held_out_pass_rates_do_not_depend_on_the_batch_size(rl_run, chat_run):
    """The held-out questions scored 1 at a time and 4 at a time (train.batch_size × train.eval_batches the same 4
    questions): each question's answers are seeded by its place among the held-out questions, not in its batch, so
    pass@1, pass@k and the reward are the same."""
    from burnout.config import load_saved_config
    from burnout.core.model_files import load_model
    from burnout.finetune.rl import read_prepared_tasks
    from burnout.runs import recipe_for

    cfg = load_saved_config(rl_run / "config.yaml")
    recipe = recipe_for(cfg)
    model, _, _ = load_model(chat_run)
    objective = recipe.objective(model, cfg, resumed=False)
    held_out = read_prepared_tasks(Path(cfg.data.prepared_dir))["val"]
    assert len(held_out) == 4
    def scored(size: int, batches: int) -> dict:
        train = dataclasses.replace(cfg.train, batch_size=size,
                                    eval=dataclasses.replace(cfg.train.eval, eval_batches=batches))
        return recipe.evaluate(objective, held_out, train, torch.device("cpu"), "fp32")

    scores = [scored(size, n) for size, n in ((1, 4), (4, 1), (3, 2))]
    assert 0 < scores[0]["val_pass@1"] < 1, scores  # answers that differ: seeds that differ would show
    assert scores[1] == scores[0] and scores[2] == scores[0], scores


def test_the_run_answers_held_out_questions_before_and_after_and_the_report_shows_them(rl_run, chat_run):
    from burnout.config import load_saved_config
    from burnout.core.model_files import load_model
    from burnout.finetune.rl import EXAMPLES_FILE, example_answers, read_prepared_tasks
    from burnout.report.render import run_blocks
    from burnout.report.runlog import load_run

    cfg = load_saved_config(rl_run / "config.yaml")
    examples = json.loads((rl_run / EXAMPLES_FILE).read_text(encoding="utf-8"))
    tasks = read_prepared_tasks(Path(cfg.data.prepared_dir))["val"][:3]
    assert [e["question"] for e in examples] == [t.prompt for t in tasks]
    for when, source in (("before", list_checkpoints(chat_run)[-1]), ("after", list_checkpoints(rl_run)[-1])):
        model, tokenizer, _ = load_model(source)
        texts = example_answers(model, tokenizer, tasks, cfg.rl, cfg.train.seed)
        assert [e[when]["answer"] for e in examples] == texts, when
        assert [e[when]["reward"] for e in examples] == [float("is" in text) for text in texts], when
    _, blocks = run_blocks(load_run(rl_run), log_scale=False)
    at = next(i for i, b in enumerate(blocks) if b.kind == "h2" and b.text == "Fine-tuning")
    assert blocks[at + 4].rows == [[e["question"], f"{e['before']['answer']} (reward {e['before']['reward']:g})",
                                    f"{e['after']['answer']} (reward {e['after']['reward']:g})"] for e in examples]


def test_the_report_of_a_run_whose_held_out_answers_were_cut_short_says_so_and_is_written(rl_run, tmp_path):
    """examples.json cut short or edited once failed `burnout report`."""
    import shutil

    from burnout.finetune.rl import EXAMPLES_FILE
    from burnout.report.render import run_blocks
    from burnout.report.runlog import load_run

    run = tmp_path / "run"
    shutil.copytree(rl_run, run)
    os.truncate(run / EXAMPLES_FILE, 20)
    _, blocks = run_blocks(load_run(run), log_scale=False)
    said = [b.text for b in blocks if b.kind == "p" and EXAMPLES_FILE in (b.text or "")]
    assert len(said) == 1 and said[0].startswith(f"`{run / EXAMPLES_FILE}` cannot be read (JSONDecodeError: "), said
    assert "the held-out answers are left out" in said[0]


# ----------------------------------------------------------------------------------------------
# LoRA


LORA_ARGS = ["--lora", "rl.lora.r=4", "rl.lora.alpha=8", "rl.kl_coef=0.1", "train.lr=1e-2"]


@pytest.fixture(scope="module")
def lora_rl_run(chat_run, tasks, tmp_path_factory) -> Path:
    """4 steps of GRPO with LoRA adapters and a KL penalty (its reference: the model with the adapters off)."""
    run = tmp_path_factory.mktemp("rl_lora") / "run"
    assert main(["rl", str(chat_run), "--data", str(tasks), "--out", str(run), *RL_ARGS, *LORA_ARGS]) == 0
    return run


def test_a_lora_run_trains_the_adapters_alone_and_its_kl_is_to_the_model_with_them_off(lora_rl_run, chat_run):
    """The base weights come out bitwise as they went in. The KL reference is the starting model: the trained
    policy with its adapters off gives chat_run's log-probabilities, and its own differ. The logged KL is 0 at
    step 1 (fresh adapters, B = 0: the policy is the reference) and not after (k1, log π − log π_ref on the sampled
    answers, is unbiased but can be negative on one batch)."""
    from burnout.config import load_saved_config
    from burnout.core.model_files import load_model
    from burnout.runs import recipe_for

    final = safetensors.torch.load_file(list_checkpoints(lora_rl_run)[-1] / "model.safetensors")
    start = safetensors.torch.load_file(list_checkpoints(chat_run)[-1] / "model.safetensors")
    adapters = {key for key in final if key.endswith((".lora_A", ".lora_B"))}
    assert adapters and final.keys() - adapters == start.keys()
    for key in start:
        assert torch.equal(final[key], start[key]), key
    assert any(key.endswith(".lora_B") and final[key].any() for key in adapters)  # the adapters learned
    cfg = load_saved_config(lora_rl_run / "config.yaml")
    policy, _, _ = load_model(lora_rl_run)
    objective = recipe_for(cfg).objective(policy, cfg, resumed=True)
    loader = recipe_for(cfg).loaders(cfg, Path(cfg.data.prepared_dir), cfg.train.seq_len)["train"]
    numbers, batch = loader.get_batch(0)
    answers = sample_answers(policy, objective.tokenizer, [objective.tasks[int(n)] for n in numbers[:, 0]],
                             cfg.rl, list(range(len(numbers) * cfg.rl.group_size)))
    x, y = answer_batch(answers, cfg.rl.group_size, objective.end_id, torch.device("cpu"))
    start_model, _, _ = load_model(chat_run)
    with torch.no_grad():
        assert torch.equal(objective.reference_logprobs(x, y), sequence_logprobs(start_model, x, y))
        assert not torch.allclose(sequence_logprobs(policy, x, y), sequence_logprobs(start_model, x, y))
    kls = [r["kl"] for r in _metrics(lora_rl_run)]
    assert kls[0] == 0.0 and all(kl != 0 for kl in kls[1:]), kls
    assert (lora_rl_run / "adapter" / "adapter.safetensors").is_file()


def test_a_lora_run_stopped_and_resumed_equals_the_uninterrupted_one_bitwise(lora_rl_run, chat_run, tasks, tmp_path):
    _assert_resumed_equals(lora_rl_run, _stopped_at_step_2(chat_run, tasks, tmp_path / "stopped", *LORA_ARGS))


def test_lora_merge_of_an_rl_run_writes_a_plain_chat_checkpoint_with_the_same_outputs(lora_rl_run, tmp_path):
    from burnout.core.model_files import load_model

    assert main(["lora", "merge", str(lora_rl_run), "--out", str(tmp_path / "merged")]) == 0
    lora_model, _, _ = load_model(lora_rl_run)
    merged, _, ckpt = load_model(tmp_path / "merged")
    assert ckpt.config.rl is not None and ckpt.config.rl.lora is None
    assert not any("lora" in key for key in merged.state_dict())
    idx = torch.randint(0, merged.cfg.vocab_size, (2, 20))
    torch.testing.assert_close(merged(idx), lora_model(idx), rtol=1e-4, atol=1e-5)


def test_questions_that_leave_no_room_for_an_answer_are_dropped_with_a_line():
    """A question whose templated prompt fills the model's context cannot be sampled: it is dropped when the data are
    prepared, said in a line; with none left, one line says why. Sampled, it failed the run at its batch (`burnout
    speedrun`'s RL stage on GSM8K with a 256-token context)."""
    from burnout.finetune.rl import Task, _fitting_tasks

    tasks = [Task(f"q{i}", "#### 1") for i in range(4)]
    section = RLConfig(base="runs/chat", source="tasks.jsonl")
    said = []
    kept = _fitting_tasks(tasks, [50, 255, 256, 10], 256, section, said.append)
    assert kept == [tasks[0], tasks[1], tasks[3]]  # 255 leaves one token for an answer; 256 none
    assert said == ["1 of 4 questions dropped: each fills the model's 256-token context, leaving no room for an answer"]
    with pytest.raises(BurnoutError, match=r"^'tasks.jsonl': every question fills the model's context \(256 tokens\), "
                                           r"leaving no room for an answer \(the shortest is 256 tokens\)"):
        _fitting_tasks(tasks[:2], [256, 300], 256, section, said.append)
