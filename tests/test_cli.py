"""The `burnout` command line (burnout/cli.py): help for every command, overrides in every position,
and bad input answered with exit code 2 and exactly one `burnout: error:` line — no traceback.

The failing commands run as real subprocesses (`python -m burnout ...`), all started at once so the
suite pays for one interpreter start-up rather than one per case.
"""

from __future__ import annotations

import io
import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from burnout.cli import main

SUBCOMMANDS = {
    ("quickstart",): "usage: burnout quickstart",
    ("model", "info"): "usage: burnout model info",
    ("model", "list"): "usage: burnout model list",
    ("data", "prepare"): "usage: burnout data prepare",
    ("train",): "usage: burnout train",
    ("generate",): "usage: burnout generate",
    ("export",): "usage: burnout export",
    ("model",): "usage: burnout model",
    ("data",): "usage: burnout data",
}


def run_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "burnout", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=120)


@pytest.mark.parametrize("args", [("--help",), ("train", "--help"), ("model", "info", "--help")],
                         ids=["top", "train", "model-info"])
def test_help_subprocess(args):
    result = run_cli(*args)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"usage: burnout{' ' + ' '.join(args[:-1]) if len(args) > 1 else ''}")
    assert result.stderr == ""
    if args == ("--help",):
        for command in ("quickstart", "model", "data", "train", "generate", "export"):
            assert command in result.stdout


@pytest.mark.parametrize("command", list(SUBCOMMANDS), ids=[" ".join(c) for c in SUBCOMMANDS])
def test_help_in_process(command, capsys):
    with pytest.raises(SystemExit) as exc:
        main([*command, "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(SUBCOMMANDS[command])
    assert "-h, --help" in out


def test_no_command_is_one_line_naming_help(capsys):
    assert main([]) == 2
    assert capsys.readouterr().err == ("burnout: error: the following arguments are required: COMMAND "
                                       "(see 'burnout --help')\n")


# ------------------------------------------------------------------------------------------------
# Bad input through the real CLI


EXISTING_LOG = '{"step": 10, "tokens": 5120, "train_loss": 3.5, "elapsed_s": 1.5}\n'


@pytest.fixture(scope="module")
def failures(tmp_path_factory):
    """Start every failing command at once; return {case: (CompletedProcess-like, paths)}."""
    root = tmp_path_factory.mktemp("cli")
    existing = root / "existing-run"
    existing.mkdir()
    (existing / "metrics.jsonl").write_text(EXISTING_LOG)  # a step as the loop logs it: a run's, not a file of yours
    cases = {
        "unknown-preset": ["model", "info", "nope"],
        "typo-key": ["train", "quickstart", "--out", str(root / "typo"), "train.lrr=1"],
        "typo-key-flag": ["train", "quickstart", "--out", str(root / "typo2"), "--train.lrr", "1"],
        "wrong-type": ["train", "quickstart", "--out", str(root / "type"), "train.batch_size=abc"],
        "bad-shape": ["train", "quickstart", "--out", str(root / "shape"), "model.n_head=7"],
        "missing-config": ["train", str(root / "missing.yaml"), "--out", str(root / "missing")],
        "missing-config-prepare": ["data", "prepare", str(root / "missing.yaml"), "--out", str(root / "d")],
        "missing-checkpoint": ["generate", str(root / "no-such-run"), "--prompt", "hello"],
        "existing-run": ["train", "quickstart", "--out", str(existing)],
        "generate-unknown-option": ["generate", str(root / "no-such-run"), "--prompt", "x", "--tempreature", "1"],
        "info-bad-override": ["model", "info", "llama-tiny", "--json", "n_head=7"],
    }
    procs = {
        name: subprocess.Popen([sys.executable, "-m", "burnout", *args], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, cwd=root)
        for name, args in cases.items()
    }
    results = {}
    for name, proc in procs.items():
        try:
            out, err = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        results[name] = (proc.returncode, out, err)
    return root, results


@pytest.mark.slow
@pytest.mark.parametrize("case,fragments", [
    ("unknown-preset", ["unknown preset 'nope'", "llama-tiny"]),
    ("typo-key", ["config.train.lrr: unknown key", "did you mean 'lr'?"]),
    ("typo-key-flag", ["config.train.lrr: unknown key", "did you mean 'lr'?"]),
    ("wrong-type", ["config.train.batch_size", "expected int, got 'abc'"]),
    ("bad-shape", ["model.n_head", "7 heads do not divide d_model=128"]),
    ("missing-config", ["missing.yaml' not found"]),
    ("missing-config-prepare", ["missing.yaml' not found"]),
    ("missing-checkpoint", ["no-such-run' does not exist"]),
    ("existing-run", ["existing-run already holds a run", "--resume"]),
    ("generate-unknown-option", ["unexpected argument '--tempreature'"]),
    ("info-bad-override", ["model.n_head"]),
])
def test_bad_input_is_one_line_exit_2(failures, case, fragments):
    root, results = failures
    code, out, err = results[case]
    assert code == 2, (out, err)
    assert "Traceback" not in err and "Traceback" not in out
    lines = err.splitlines()
    assert len(lines) == 1 and err.endswith("\n"), err
    assert lines[0].startswith("burnout: error: "), err
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    assert out == ""


@pytest.mark.slow  # the failures fixture starts eleven commands
def test_failed_train_creates_no_run_folder(failures):
    root, _ = failures
    for name in ("typo", "typo2", "type", "shape", "missing"):
        assert not (root / name).exists(), name
    assert not (root / "d").exists()


@pytest.mark.slow  # the failures fixture starts eleven commands
def test_existing_run_is_left_untouched(failures):
    root, _ = failures
    existing = root / "existing-run"
    assert (existing / "metrics.jsonl").read_text() == EXISTING_LOG
    # Refused before anything was written: no data was prepared into it, no checkpoint folder made.
    assert sorted(p.name for p in existing.iterdir()) == ["metrics.jsonl"]


# ------------------------------------------------------------------------------------------------
# In-process: argument handling


def test_override_after_options_is_applied(capsys):
    """`key=value` after an option still counts as an override (argparse leaves it among the unknowns)."""
    assert main(["model", "info", "llama-tiny", "--json", "model.n_layer=2"]) == 0
    assert json.loads(capsys.readouterr().out)["config"]["n_layer"] == 2
    assert main(["model", "info", "llama-tiny", "--n_layer", "3", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["config"]["n_layer"] == 3


@pytest.mark.parametrize("argv,message", [
    (["model", "info", "llama-tiny", "stray"], "override 'stray' is not of the form"),
    (["model", "info", "llama-tiny", "--json", "stray"], "unexpected argument 'stray'"),
    (["model", "info", "llama-tiny", "--n_layer"], "option '--n_layer' needs a value"),
    (["model", "list", "--verbose"], "unexpected argument '--verbose'"),
    (["train", "quickstart"], "train needs a CONFIG and --out RUN_DIR"),
    (["train", "quickstart", "--resume", "somewhere"], "--resume RUN takes no CONFIG"),
    (["model", "info", "llama-tiny", "n_layer"], "override 'n_layer' is not of the form"),
])
def test_argument_errors(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("burnout: error: ") and message in err and err.count("\n") == 1


def test_model_list(capsys):
    assert main(["model", "list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == sorted(line.split()[0] for line in lines)
    rows = {line.split()[0]: line.split()[1:] for line in lines}
    assert rows["llama-3b"] == ["llama", "3,122,969,600", "params"]
    assert rows["gpt2-124m"] == ["gpt2", "124,439,808", "params"]
    assert rows["shakespeare-char"] == ["gpt2", "421,504", "params"]


# ------------------------------------------------------------------------------------------------
# An internal error: one line, the trace kept in a file


def _broken_model_info(*args, **kwargs):
    raise RuntimeError("unexpected state\nsecond line of the message")


def test_an_internal_error_is_one_line_naming_the_saved_trace(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("BURNOUT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr("burnout.models.info.model_info", _broken_model_info)
    assert main(["model", "list"]) == 1
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1 and "Traceback" not in captured.err, captured.err
    prefix = "burnout: internal error: RuntimeError: unexpected state; the full trace is in "
    assert lines[0].startswith(prefix) and lines[0].endswith("; please report it"), lines[0]
    saved = Path(lines[0].removeprefix(prefix).removesuffix("; please report it"))
    assert saved.parent == tmp_path / "cache" / "errors"
    trace = saved.read_text()
    assert trace.startswith("burnout model list\nTraceback (most recent call last):")
    assert "_broken_model_info" in trace and "second line of the message" in trace


def test_an_internal_error_prints_the_trace_when_it_cannot_be_saved(monkeypatch, tmp_path, capsys):
    (tmp_path / "not-a-folder").write_text("")
    monkeypatch.setenv("BURNOUT_CACHE_DIR", str(tmp_path / "not-a-folder"))
    monkeypatch.setattr("burnout.models.info.model_info", _broken_model_info)
    assert main(["model", "list"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("Traceback (most recent call last):") and "_broken_model_info" in err
    assert err.splitlines()[-1].startswith("burnout: internal error: RuntimeError: unexpected state; the full trace is "
                                           f"above (it could not be saved in {tmp_path / 'not-a-folder' / 'errors'}")


# -- What each command says to do next, and that it runs

TINY_TRAIN = ["model.n_layer=1", "model.d_model=64", "model.n_head=4", "model.n_kv_head=2", "model.context_length=64",
              "train.device=cpu", "train.precision=fp32", "train.batch_size=2", "train.seq_len=32",
              "train.max_steps=2", "train.eval_interval=2", "train.ckpt_interval=2", "train.eval_batches=1",
              "train.warmup_steps=1", "train.sample_tokens=0"]
FINE_TUNE = ["train.device=cpu", "train.precision=fp32", "train.batch_size=2", "train.seq_len=64", "train.max_steps=2",
             "train.eval_interval=2", "train.ckpt_interval=2", "train.eval_batches=1", "train.warmup_steps=1"]


def next_steps(out: str) -> dict[str, list[str]]:
    """The `next:` block a command printed last: {label: the command's words}, a note in parentheses left out."""
    assert "next:\n" in out, out[-2000:]
    block = out.rsplit("next:\n", 1)[1].splitlines()
    steps = {}
    for line in block:
        assert line.startswith("  ") and ":" in line, block
        label, command = line.strip().split(":", 1)
        steps[label] = shlex.split(command.split("   (")[0])
    return steps


def run_step(words: list[str], *extra: str, replace: dict[str, str] | None = None) -> int:
    """A printed next step run through the real command, its placeholders filled."""
    assert words[0] == "burnout", words
    return main([(replace or {}).get(word, word) for word in words[1:]] + list(extra))


def test_prepare_and_train_end_with_next_steps_that_run(tmp_path, monkeypatch, capsys):
    """Each command's last lines say what to do with what it made; each command said is run as printed (a
    placeholder filled, tiny settings added) and ends with its own next steps."""
    monkeypatch.chdir(tmp_path)  # the printed runs/NAME and hf/NAME land here
    text = tmp_path / "stories.txt"
    text.write_text("\n\n".join(f"Story {i}. " + "The cat sat on the mat and looked at the sun. " * 20
                                for i in range(40)))
    assert main(["data", "prepare", str(text), "--out", "data/stories", "--tokenizer", "bpe:300"]) == 0
    steps = next_steps(capsys.readouterr().out)
    assert list(steps) == ["train", "inspect", "audit"]
    assert steps["train"][:6] == ["burnout", "train", "--data", "data/stories", "--model", "llama-tiny"]
    assert run_step(steps["inspect"]) == 0
    assert run_step(steps["train"], *TINY_TRAIN) == 0
    run = Path("runs/stories")
    out = capsys.readouterr().out
    steps = next_steps(out)
    assert out.rsplit("next:\n", 1)[0].splitlines()[-1].startswith("done: step 2")  # after the run's last line
    assert list(steps) == ["generate", "eval", "report", "export", "chat model", "playground"]
    assert steps["playground"] == ["burnout", "playground", str(run)]
    assert steps["chat model"][:2] == ["burnout", "sft"] and str(run) in steps["chat model"]
    # The prompt to continue is the run's first sample prompt, words of its own val split (RUN/sample_prompts.json).
    prompt = steps["generate"][steps["generate"].index("--prompt") + 1]
    assert prompt == json.loads((run / "sample_prompts.json").read_text())["prompts"][0]
    assert prompt in text.read_text() and len(prompt.split()) > 1
    assert run_step(steps["generate"], "--max-new-tokens", "4") == 0
    assert capsys.readouterr().out.startswith(prompt)
    assert run_step(steps["eval"]) == 0
    eval_steps = next_steps(capsys.readouterr().out)
    assert eval_steps == {"report": ["burnout", "report", str(run)]}
    assert run_step(steps["export"]) == 0
    assert steps["export"][-2:] == ["--to", "hf/stories"] and Path("hf/stories/model.safetensors").is_file()
    load = next_steps(capsys.readouterr().out)["transformers"]
    assert load[:2] == ["python", "-c"] and '"hf/stories"' in load[2] and f"({json.dumps(prompt)}," in load[2]
    assert run_step(steps["report"]) == 0
    assert next_steps(capsys.readouterr().out) == {"compare": ["burnout", "compare", str(run)]}  # eval is done


def test_sft_and_dpo_end_with_a_chat_models_next_steps_that_run(tiny_run_config, tiny_bpe_data, tmp_path, monkeypatch,
                                                               capsys):
    from burnout.runs import start_training

    base = tmp_path / "base"
    start_training(tiny_run_config(max_steps=2), base, data_dir=tiny_bpe_data, on_event=lambda line: None,
                   progress=False)
    chats, pairs = tmp_path / "chats.jsonl", tmp_path / "pairs.jsonl"
    chats.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"What is {i} plus 1?"},
                                                      {"role": "assistant", "content": f"It is {i + 1}."}]}) + "\n"
                             for i in range(20)))
    pairs.write_text("".join(json.dumps({"prompt": f"What is {i} plus 1?", "chosen": f"It is {i + 1}.",
                                         "rejected": f"{i + 1} is it."}) + "\n" for i in range(20)))
    assert main(["sft", str(base), "--data", str(chats), "--out", str(tmp_path / "chat"), *FINE_TUNE]) == 0
    steps = next_steps(capsys.readouterr().out)
    assert list(steps) == ["chat", "eval", "report", "export", "preferences", "playground"]
    monkeypatch.setattr("sys.stdin", io.StringIO("What is 3 plus 1?\n"))
    assert run_step(steps["chat"], "--max-new-tokens", "4") == 0
    assert "bot> " in capsys.readouterr().out  # it answered the question on stdin
    assert run_step(steps["preferences"], *FINE_TUNE, replace={"PAIRS.jsonl": str(pairs)}) == 0
    steps = next_steps(capsys.readouterr().out)
    assert list(steps) == ["chat", "eval", "report", "export", "preferences", "playground"]
    assert steps["chat"] == ["burnout", "chat", f"{tmp_path / 'chat'}-dpo"]
    monkeypatch.chdir(tmp_path)
    assert run_step(steps["export"]) == 0
    load = next_steps(capsys.readouterr().out)["transformers"][2]
    assert "'role': 'user'" not in load and '"role": "user"' in load  # the pipeline asked to chat


# ------------------------------------------------------------------------------------------------
# sft, dpo and rl: one unit (burnout/cli.py: FINE_TUNE_COMMANDS), each command's options as they were

_OUT = ("--out", "RUN", "run folder to create")
_BUDGET = [("--minutes", "N", "time budget: plan the steps that fit in N minutes, the LR schedule ending there"),
           ("--dollars", "D", "dollar budget: the minutes D dollars buy at the GPU's price per hour, planned as "
                              "--minutes")]
_TRACKER = [("--tracker", "NAME", "also stream the records of metrics.jsonl to tensorboard, wandb, trackio (W&B "
                                  "offline, trackio local) in RUN/tracker/; none: metrics.jsonl alone (train.tracker)")]


def _shared(section: str) -> list[tuple]:
    return [("--config", None, f"a run config YAML whose train (and {section}) sections apply"),
            ("--lora", None, f"train LoRA adapters ({section}.lora.r=… etc. to shape them)")]


FINE_TUNE_OPTIONS = {
    "sft": [("base", "BASE_RUN_OR_CKPT", "the model to fine-tune"),
            ("--data", "SOURCE", "conversations: a .json/.jsonl/.parquet file, folder or glob, or hf:NAME"), _OUT,
            *_shared("sft"), ("--layout", None, "messages, sharegpt, alpaca, qa, oasst (default: auto)"), *_BUDGET,
            *_TRACKER, ("overrides", "KEY=VALUE", None)],
    "dpo": [("base", "SFT_RUN_OR_CKPT", "the chat model to tune (policy and reference)"),
            ("--data", "PAIRS", "preference pairs: a .json/.jsonl/.parquet file, folder or glob, or hf:NAME"), _OUT,
            *_shared("dpo"), ("--beta", None, "DPO's β (default 0.1)"), *_BUDGET, *_TRACKER,
            ("overrides", "KEY=VALUE", None)],
    "rl": [("base", "CHAT_RUN_OR_CKPT", "the chat model to tune"),
           ("--data", "TASKS", "questions and answers: a .json/.jsonl/.parquet file, folder or glob, or hf:NAME"),
           _OUT, ("--reward", "REWARD", "gsm8k (the final '#### n' matches; default), exact, regex:PATTERN, or "
                                        "module:function (your function(prompt, answer, reference) -> float)"),
           *_shared("rl"), *_BUDGET, *_TRACKER,
           ("overrides", "KEY=VALUE", "e.g. rl.group_size=8 rl.max_new_tokens=128 rl.temperature=1.0 rl.kl_coef=0 "
                                      "train.lr=…")],
}


@pytest.mark.parametrize("name", list(FINE_TUNE_OPTIONS))
def test_each_fine_tuning_command_has_its_options_in_their_order_with_their_help(name):
    from burnout.cli import build_parser

    sub = next(a for a in build_parser()._actions if a.choices and name in a.choices).choices[name]
    options = [((a.option_strings or [a.dest])[-1], a.metavar, a.help) for a in sub._actions if a.dest != "help"]
    assert options == FINE_TUNE_OPTIONS[name]


@pytest.mark.parametrize("name, flag, value, given", [("sft", "--layout", "alpaca", "alpaca"),
                                                      ("dpo", "--beta", "0.5", 0.5),
                                                      ("rl", "--reward", "exact", "exact")])
def test_each_fine_tuning_command_hands_every_option_to_its_function(name, flag, value, given, monkeypatch, capsys):
    from burnout.errors import BurnoutError
    from burnout.finetune import commands

    calls = []

    def record(*args, **kwargs):
        calls.append((args, kwargs))
        raise BurnoutError("recorded")

    monkeypatch.setattr(commands, name, record)
    assert main([name, "BASE", "--data", "DATA", "--out", "OUT", "train.lr=1", "--config", "c.yaml", "--lora", flag,
                 value, "--minutes", "5", "--dollars", "2", "--train.seed", "3"]) == 2
    assert calls == [(("BASE", "DATA", "OUT", "c.yaml", True, given, ["train.lr=1", "train.seed=3"]),
                      {"minutes": 5.0, "dollars": 2.0})]
    assert main([name, "BASE", "--data", "DATA", "--out", "OUT"]) == 2
    assert calls[1] == (("BASE", "DATA", "OUT", None, False, None, []), {"minutes": None, "dollars": None})


def test_generate_says_an_empty_continuation_on_stderr_and_prints_the_text_as_it_is(mute_run, tmp_path, capsys):
    """A model that ends the text at once: stdout holds the prompt (and the JSON of --prompts-file) as generated, and
    stderr says the continuation is empty rather than leaving nothing to see."""
    run = str(mute_run[0])
    assert main(["generate", run, "--prompt", "The ", "--max-new-tokens", "5"]) == 0
    out, err = capsys.readouterr()
    assert out == "The \n" and err == "(empty: the model ended the text at once)\n"
    assert main(["generate", run, "--prompt", "The ", "--stop", "x"]) == 0
    assert capsys.readouterr().err == "(empty: the model ended the text, or began a stop sequence, at once)\n"
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("The \nTwo words\n")
    assert main(["generate", run, "--prompts-file", str(prompts)]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out) == [{"prompt": "The ", "text": "The "}, {"prompt": "Two words", "text": "Two words"}]
    assert err.splitlines() == ["prompt 1: (empty: the model ended the text at once)",
                                "prompt 2: (empty: the model ended the text at once)"]
