"""The in-context-learning engine: llm-foundry's prompts (hand-checked strings), few-shot sampling, the three
task types scored through the packed scorer, icl_tasks lists, one-off task files, DCLM's CORE, bad input."""

from __future__ import annotations

import json
import random
import shutil
from dataclasses import replace

import pytest
import torch

from burnout.cli import main
from burnout.core.checkpoint import list_checkpoints
from burnout.core.model_files import load_model
from burnout.eval.icl import core_score, load_suite, read_baselines, read_core_tasks
from burnout.eval.scoring import _groups, encode_requests, score_items, score_requests
from burnout.eval.tasks import IclTask, build_items, fewshot_indices, needs_prefix_space, read_records

CPU = torch.device("cpu")


@pytest.fixture
def run(trained_run, tmp_path):
    """A private copy of the trained run: these tests write into it."""
    return shutil.copytree(trained_run, tmp_path / "run")


@pytest.fixture(scope="module")
def model_and_tokenizer(trained_run):
    model, tokenizer, _ = load_model(list_checkpoints(trained_run)[-1], CPU)
    return model, tokenizer


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def error_of(capsys, argv) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("burnout: error: ") and "\n" not in err, err
    return err


MC_RECORDS = [
    {"query": "What is red?", "choices": ["apple", "sky"], "gold": 0},
    {"query": " What is blue? ", "choices": ["grass", "sky"], "gold": 1},
    {"query": "What is green?", "choices": ["grass", "coal"], "gold": 0},
    {"query": "What is black?", "choices": ["snow", "coal"], "gold": 1},
]
SCHEMA_RECORDS = [
    {"context_options": ["Ann gave Bo a gift because Ann", "Ann gave Bo a gift because Bo"],
     "continuation": "was generous.", "gold": 0},
    {"context_options": ["Cy thanked Di because Cy", "Cy thanked Di because Di"], "continuation": "  had helped. ",
     "gold": 1},
    {"context_options": ["Ed beat Flo since Ed", "Ed beat Flo since Flo"], "continuation": "was faster.", "gold": 0},
]
LM_RECORDS = [
    {"context": "2 + 2 =", "continuation": "4"},
    {"context": "3 + 3 = ", "continuation": " 6"},
    {"context": "1 + 0 =", "continuation": "1"},
]


def items_of(tmp_path, records, shots, prefix_space=True, **settings):
    task = IclTask(label="t", path=write_jsonl(tmp_path / "t.jsonl", records), **settings)
    return build_items(task, read_records(task), shots, prefix_space)


def test_prompts_are_llm_foundrys(tmp_path):
    # Multiple choice, 2-shot, every setting: the seed-1234 draws give items 0 and 1 the examples [2, 3]
    # and [0, 2]. Fields are stripped, the item's own part rstripped, each answer gets a space before it.
    mc = items_of(tmp_path, MC_RECORDS, 2, type="multiple_choice", prompt_string="Answer the questions.",
                  continuation_delimiter="\nAnswer: ", example_delimiter="\n\n", prelimiter="Question: ")
    assert mc[0].requests == (
        ("Answer the questions.\n\nQuestion: What is green?\nAnswer: grass\n\nQuestion: What is black?\nAnswer: coal"
         "\n\nQuestion: What is red?\nAnswer:", " apple"),
        ("Answer the questions.\n\nQuestion: What is green?\nAnswer: grass\n\nQuestion: What is black?\nAnswer: coal"
         "\n\nQuestion: What is red?\nAnswer:", " sky"),
    )
    assert mc[1].requests[1] == (
        "Answer the questions.\n\nQuestion: What is red?\nAnswer: apple\n\nQuestion: What is green?\nAnswer: grass"
        "\n\nQuestion: What is blue?\nAnswer:", " sky")
    assert (mc[1].gold, mc[1].choices) == (1, ("grass", "sky"))
    # Zero-shot with no prompt string: no delimiter before the first (only) example.
    zero = items_of(tmp_path, MC_RECORDS, 0, type="multiple_choice", continuation_delimiter="\nAnswer: ",
                    prelimiter="Question: ")
    assert zero[1].requests[0] == ("Question: What is blue?\nAnswer:", " grass")

    # Schema: a few-shot example is the gold option, the full delimiter and the continuation; the item's
    # options follow the example delimiter and end in the rstripped delimiter; zero-shot has no delimiter.
    schema = items_of(tmp_path, SCHEMA_RECORDS, 1, type="schema", continuation_delimiter=" -> ")
    assert schema[0].requests == (
        ("Cy thanked Di because Di -> had helped.\nAnn gave Bo a gift because Ann ->", " was generous."),
        ("Cy thanked Di because Di -> had helped.\nAnn gave Bo a gift because Bo ->", " was generous."),
    )
    assert schema[1].requests[0] == ("Ann gave Bo a gift because Ann -> was generous.\nCy thanked Di because Cy ->",
                                     " had helped.")
    zero = items_of(tmp_path, SCHEMA_RECORDS, 0, type="schema", continuation_delimiter=" -> ")
    assert zero[1].requests == (("Cy thanked Di because Cy", " had helped."),
                                ("Cy thanked Di because Di", " had helped."))

    # Language modeling: few-shot answers as written (no space added), the item's answer after a space
    # when the tokenizer needs one (GPT-2-style BPE) and as written when it does not (a char tokenizer).
    lm = items_of(tmp_path, LM_RECORDS, 2, type="language_modeling")
    assert lm[0].requests == (("3 + 3 = 6\n1 + 0 = 1\n2 + 2 =", " 4"),)
    assert lm[1].requests == (("2 + 2 = 4\n1 + 0 = 1\n3 + 3 =", " 6"),)
    chars = items_of(tmp_path, LM_RECORDS, 0, prefix_space=False, type="language_modeling")
    assert chars[1].requests == (("3 + 3 =", "6"),)


def test_fewshot_never_includes_the_item(tmp_path):
    records = [{"query": f"q{i:02d}", "choices": ["a", "b"], "gold": 0} for i in range(40)]
    for shots in (39, 5):  # all the others (the item is always drawn and removed), and a few
        for item in items_of(tmp_path, records, shots, type="multiple_choice"):
            context = item.requests[0][0]
            examples = context.split("\n")[:-1]
            assert context.endswith(f"q{item.index:02d}") and len(examples) == shots
            assert f"q{item.index:02d}" not in "\n".join(examples)
            assert len(set(examples)) == shots
    # The replacement path: the item was among the first draw, another index took its place.
    replaced = 0
    for seed in range(200):
        first = set(random.Random(seed).sample(range(10), 3))
        chosen = fewshot_indices(10, 3, 4, random.Random(seed))
        assert len(chosen) == 3 and 4 not in chosen
        replaced += 4 in first
    assert replaced > 0
    # Prompts do not depend on the limit: few-shot draws run in record order over the whole file.
    task = IclTask(label="t", type="multiple_choice", path=write_jsonl(tmp_path / "t.jsonl", records))
    assert build_items(task, read_records(task), 5, True, limit=7) == build_items(task, read_records(task), 5, True)[:7]


def test_core_is_dclms_centered_mean(shared_data):
    icl = shared_data / "icl"
    baselines = read_baselines(icl / "dclm_eval_meta_data.csv")
    # The CSV's baselines are percentages.
    assert (baselines["arc_easy"], baselines["copa"], baselines["winogrande"], baselines["lambada_openai"],
            baselines["commonsense_qa"]) == (0.25, 0.5, 0.5, 0.0, 0.2)
    core_tasks = read_core_tasks(icl / "dclm_additional_aggregation.json")
    assert len(core_tasks) == 22 and "hellaswag_zeroshot" in core_tasks and "mmlu_fewshot" not in core_tasks
    accuracies = {"arc_easy": 0.5, "copa": 0.75, "winogrande": 0.5, "lambada_openai": 0.3, "commonsense_qa": 0.1,
                  "mmlu_fewshot": 0.9}  # not a core task: left out
    core = core_score(accuracies, baselines, core_tasks)
    expected = ((0.5 - 0.25) / 0.75 + (0.75 - 0.5) / 0.5 + 0.0 + 0.3 + (0.1 - 0.2) / 0.8) / 5
    assert core["score"] == pytest.approx(expected, abs=1e-12)
    assert core["tasks"] == 5 and core["of"] == 22
    assert sorted(core["missing"]) == sorted(set(core_tasks) - set(accuracies))


@pytest.mark.slow
def test_every_shared_icl_file_scores_through_the_engine(run, shared_data, capsys):
    yaml_path = shared_data / "icl" / "dclm_mmlu_and_lowvar.yaml"
    assert main(["eval", str(run), "--tasks", f"icl:{yaml_path}", "--limit", "2", "--data-root", str(shared_data),
                 "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    record = json.loads((run / "eval" / "step_0000030.json").read_text())
    tasks = record["tasks"]
    used = {m["file"] for m in tasks.values()}
    for path in (shared_data / "icl").glob("*.jsonl"):  # every ICL file of the shared folder was scored
        assert str(path) in used, path.name
    assert {m["type"] for m in tasks.values()} == {"multiple_choice", "schema", "language_modeling"}
    for key, metrics in tasks.items():
        assert metrics["examples"] == 2 and 0.0 <= metrics["acc"] <= 1.0, key
    assert tasks["arc_challenge"]["num_fewshot"] == 10 and tasks["winogrande"]["num_fewshot"] == 0
    assert tasks["arc_challenge"]["first_prompt"]["context"].count("\nAnswer: ") == 10
    # Missing files are listed, not fatal.
    assert "jeopardy (local_data/world_knowledge/jeopardy_all.jsonl)" in out
    # CORE: DCLM's centered accuracy over the core tasks scored, stored and printed.
    core = record["core"]
    baselines = read_baselines(shared_data / "icl" / "dclm_eval_meta_data.csv")
    metric = {"multiple_choice": "acc_per_token", "schema": "acc", "language_modeling": "acc"}
    centered = {t: (tasks[t][metric[tasks[t]["type"]]] - baselines[t]) / (1 - baselines[t]) for t in core["centered"]}
    assert core["centered"] == pytest.approx(centered)
    assert core["score"] == pytest.approx(sum(centered.values()) / len(centered))
    assert core["tasks"] == 12 and "jeopardy" in core["missing"] and "mmlu_fewshot" not in core["centered"]
    assert f"CORE {core['score']:.4f}" in out
    summary = (run / "eval" / "summary.md").read_text()
    assert summary.splitlines()[0].endswith("| CORE |") and f"{core['score']:.4f} |" in summary
    assert json.loads((run / "eval" / "summary.json").read_text())["rows"][0]["core"] == core


def test_schema_options_share_a_row_and_score_as_if_alone(model_and_tokenizer, shared_data):
    model, tokenizer = model_and_tokenizer
    (task,) = [t for t in load_suite(shared_data / "icl" / "dclm_mmlu_and_lowvar.yaml", shared_data).tasks
               if t.label == "winogrande"]
    # 1-shot: in the 128-token window some items are cut on the left, some are not.
    items = build_items(task, read_records(task), 1, needs_prefix_space(tokenizer), limit=12)
    requests = [r for it in items for r in it.requests]
    owner = [k for k, it in enumerate(items) for _ in it.requests]
    # And an item whose options are prefixes of each other: the shared prefix must stop where the shorter
    # option's continuation is first predicted.
    requests += [("The cat sat", " on the mat."), ("The cat sat on", " the mat."), ("The cat sat on the", " mat.")]
    owner += [len(items)] * 3
    window = model.cfg.context_length
    got = score_requests(model, tokenizer, requests, batch_size=3, items=owner)
    encoded = encode_requests(tokenizer, requests, tokenizer.token_to_id("<|endoftext|>"))
    with torch.no_grad():
        for (ctx, cont), score in zip(encoded, got):
            inp = (ctx + cont)[-(window + 1):][:-1]
            logprobs = model(torch.tensor([inp]))[0, -len(cont):].float().log_softmax(-1)
            target = torch.tensor(cont)
            assert score.loglikelihood == pytest.approx(float(logprobs.gather(1, target[:, None]).sum()), abs=1e-4)
            assert score.greedy == bool((logprobs.argmax(-1) == target).all())
            assert score.tokens == len(cont) and score.truncated == (len(ctx) + len(cont) > window + 1)
    # The options of an item shared a row: a branch holds the end of its context as well as the continuation.
    groups = _groups(encoded, window, owner)
    assert len(groups) < len(requests)
    assert any(len(branch) >= len(targets) for _, members in groups for _, branch, targets in members)
    assert any(s.truncated for s in got) and not all(s.truncated for s in got)
    metrics, _ = score_items(model, tokenizer, "schema", items, batch_size=3)
    assert set(metrics) == {"acc", "examples", "truncated"} and metrics["examples"] == 12


def test_categories_are_scored_apart(run, tmp_path, capsys):
    # Categories of unequal size and opposite answers: the mean of their scores is not the pooled score.
    records = [{"query": f"{cat} question {i}", "choices": ["yes", "no"], "gold": int(cat == "zoo"), "category": cat}
               for cat, n in (("zoo", 5), ("art", 3)) for i in range(n)]
    data = write_jsonl(tmp_path / "cats.jsonl", records)
    suite = tmp_path / "suite.yaml"
    suite.write_text(f"icl_tasks:\n- label: cats\n  dataset_uri: {data}\n  num_fewshot: [0, 2]\n"
                     "  icl_task_type: multiple_choice\n  has_categories: true\n"
                     "- label: gone\n  dataset_uri: local_data/nowhere.jsonl\n  num_fewshot: [1]\n"
                     "  icl_task_type: language_modeling\n")
    assert main(["eval", str(run), "--tasks", f"icl:{suite}", "--data-root", str(tmp_path), "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "1 of 2 tasks have no data file and are not scored: gone (local_data/nowhere.jsonl)" in out
    tasks = json.loads((run / "eval" / "step_0000030.json").read_text())["tasks"]
    assert set(tasks) == {"cats/0-shot", "cats/2-shot"}
    two = tasks["cats/2-shot"]
    assert set(two["categories"]) == {"art", "zoo"} and two["examples"] == 8
    art, zoo = two["categories"]["art"], two["categories"]["zoo"]
    assert (art["examples"], zoo["examples"]) == (3, 5)
    for key in ("acc", "acc_norm", "acc_per_token"):
        assert two[key] == pytest.approx((art[key] + zoo[key]) / 2), key
    assert any((art[k] * 3 + zoo[k] * 5) / 8 != pytest.approx(two[k]) for k in ("acc", "acc_norm", "acc_per_token"))
    # Few-shot examples come from the item's own category (categories in sorted order: art first).
    assert two["first_prompt"]["context"].count("art question") == 3 and "zoo" not in two["first_prompt"]["context"]


def test_one_off_task_is_scored_as_written(run, tmp_path, capsys):
    data = write_jsonl(tmp_path / "mine.jsonl", [{"query": f"Q: {w}?\nA:", "choices": ["yes", "no"], "gold": 0}
                                                  for w in ("sun", "moon", "star")])
    assert main(["eval", str(run), "--task", f"mine={data}", "--shots", "1", "--continuation-delimiter", "\\n",
                 "--device", "cpu"]) == 0
    record = json.loads((run / "eval" / "step_0000030.json").read_text())
    assert set(record["tasks"]) == {"mine"}  # no built-in task or val when only --task is given
    mine = record["tasks"]["mine"]
    assert mine["type"] == "multiple_choice" and mine["num_fewshot"] == 1  # the type from the first record
    # Nothing added: the query as written, the typed delimiter (\n) between it and the answer, rstripped.
    assert mine["first_prompt"] == {"context": "Q: moon?\nA:\nyes\nQ: sun?\nA:", "continuation": " yes"}
    capsys.readouterr()
    # A user file read through a built-in task gets that task's template, and the command says so.
    assert main(["eval", str(run), "--tasks", "arc_easy", "--task-file", f"arc_easy={data}", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert f"arc_easy: {data} is read with arc_easy's template (context \"{{query}}\\nAnswer:\"" in out


def test_bad_icl_input_is_one_error_line(run, tmp_path, capsys):
    mc = [{"query": f"q{i}", "choices": ["a", "b"], "gold": 0} for i in range(3)]
    good = write_jsonl(tmp_path / "good.jsonl", mc)
    assert "unknown task type 'multiple_choices'" in error_of(
        capsys, ["eval", str(run), "--task", f"t={good}", "--type", "multiple_choices"])
    suite = tmp_path / "suite.yaml"
    suite.write_text(f"icl_tasks:\n- label: t\n  dataset_uri: {good}\n  num_fewshot: [0]\n  icl_task_type: ranking\n")
    assert "task 't': unknown task type 'ranking'" in error_of(capsys, ["eval", str(run), "--tasks", f"icl:{suite}"])
    no_gold = write_jsonl(tmp_path / "no_gold.jsonl", [mc[0], {"query": "q", "choices": ["a", "b"]}])
    assert "no_gold.jsonl line 2: the record has no 'gold'" in error_of(
        capsys, ["eval", str(run), "--task", f"t={no_gold}", "--type", "multiple_choice", "--device", "cpu"])
    bad_gold = write_jsonl(tmp_path / "bad_gold.jsonl", [*mc, {"query": "q", "choices": ["a", "b"], "gold": 2}])
    assert "bad_gold.jsonl line 4: gold 2 is out of range for its 2 choices" in error_of(
        capsys, ["eval", str(run), "--task", f"t={bad_gold}", "--device", "cpu"])
    assert "3-shot needs more examples than" in error_of(
        capsys, ["eval", str(run), "--task", f"t={good}", "--shots", "3", "--device", "cpu"])
    long = write_jsonl(tmp_path / "long.jsonl", [{"context": "Say it all:", "continuation": "word " * 200}])
    err = error_of(capsys, ["eval", str(run), "--task", f"t={long}", "--device", "cpu"])
    assert "task 't' item 0 (long.jsonl line 1): the continuation is 400 tokens and the prompt 7" in err
    assert "model's context of 128 tokens" in err
    assert "'arc_easy' is a built-in task" in error_of(capsys, ["eval", str(run), "--task", f"arc_easy={good}"])
    assert "--shots applies to --task" in error_of(capsys, ["eval", str(run), "--shots", "5"])


def test_builtin_tasks_keep_lm_evals_templates(tmp_path, shared_data):
    """The built-in tasks are engine entries whose settings give lm-eval's strings, unlike the ICL defaults:
    nothing stripped (lambada's one continuation with a newline keeps it, as lm-eval scores it)."""
    from burnout.eval.tasks import DEFAULT_FILES, builtin_task, load_task

    lambada = load_task("lambada", shared_data / DEFAULT_FILES["lambada"])
    assert lambada[4462].continuations == [" \n\nrecorder"]
    arc = builtin_task("arc_easy", shared_data / DEFAULT_FILES["arc_easy"])
    dclm = replace(arc, continuation_delimiter="\nAnswer: ", strip_dataset=True, target_delimiter=None, reader=None)
    ours, theirs = (build_items(t, read_records(t), 0, True, limit=3) for t in (arc, dclm))
    assert [it.requests for it in ours] == [it.requests for it in theirs]  # the same where the data is clean
    assert ours[0].requests[0][0].endswith("\nAnswer:") and ours[0].requests[0][1].startswith(" ")
    # lm-eval's target delimiter whatever the tokenizer; llm-foundry's rule adds no space for a char tokenizer.
    char_ours, char_theirs = (build_items(t, read_records(t), 0, False, limit=1)[0].requests[0] for t in (arc, dclm))
    assert char_ours[1] == " " + char_theirs[1]
