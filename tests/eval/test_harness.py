"""Proof that `burnout eval --harness` gives lm-evaluation-harness's own numbers: a checkpoint is run through
lm-eval twice, once as BurnoutLM (our scorer and KV-cache generator on our model object) and once exported
(burnout.core.model_files.export_hf) and loaded by lm-eval's "hf" backend, on local task YAMLs of all three
request types (no network), with the same limit and batch size:

    multiple_choice         ARC-Easy from shared/data/arc (loglikelihood requests); and a variant whose prompt
                            ends in "Answer: " before an empty target delimiter (the space moves onto each choice)
    loglikelihood_rolling   WikiText-2 raw lines, the longer ones over several rolling windows
    generate_until          GSM8K: lm-eval's gsm8k.yaml over shared/data/gsm8k (few-shot from train.jsonl, its
                            stop sequences and both answer filters), max_gen_toks lowered to fit the tiny model's
                            128-token window, so every prompt is cut on the left; and a 0-shot variant with
                            other stop sequences, whose prompts have several lengths

on the tiny trained checkpoint (tests/eval/conftest.py's trained_run). Its greedy answer to any prompt is a
run of newlines, so the generation tasks also run on a second checkpoint of the same shape and tokenizer with
random weights (untied head, weights x5), whose greedy text changes token by token, half UTF-8 characters
included. Metrics must be identical, every log-likelihood within 1e-4, every generated string identical.
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
import sys
import textwrap
from types import SimpleNamespace

import pytest
import torch

from burnout.cli import main
from burnout.core.checkpoint import list_checkpoints
from burnout.core.model_files import export_hf, load_model
from burnout.generate.sampling import generate_batch

LIMIT = 10
BATCH = 4
MAX_GEN = 24
SPACED = "bl_arc_easy_spaced"  # a context ending in a space, as lm-eval's own tasks with target_delimiter ""
SCORED = ["bl_arc_easy", SPACED, "bl_wikitext", "bl_gsm8k"]  # on the trained checkpoint
GENERATED = ["bl_gsm8k", "bl_gsm8k_line"]  # on both
LINE_STOPS, LINE_GEN = ["\n", "ext", "Question:"], 16  # bl_gsm8k_line's stop sequences (text the random model writes)


def write_task_yamls(folder, data):
    gsm8k = f"""
        task: bl_gsm8k
        dataset_path: json
        dataset_kwargs:
          data_files:
            train: {data / "gsm8k" / "train.jsonl"}
            test: {data / "gsm8k" / "test.jsonl"}
        output_type: generate_until
        training_split: train
        fewshot_split: train
        test_split: test
        doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
        doc_to_target: "{{{{answer}}}}"
        metric_list:
          - metric: exact_match
            aggregation: mean
            higher_is_better: true
            ignore_case: true
            ignore_punctuation: false
            regexes_to_ignore: [",", "\\\\$", "(?s).*#### ", "\\\\.$"]
        generation_kwargs:
          until: ["Question:", "</s>", "<|im_end|>"]
          do_sample: false
          temperature: 0.0
          max_gen_toks: {MAX_GEN}
        repeats: 1
        num_fewshot: 3
        filter_list:
          - name: "strict-match"
            filter:
              - function: "regex"
                regex_pattern: "#### (\\\\-?[0-9\\\\.\\\\,]+)"
              - function: "take_first"
          - name: "flexible-extract"
            filter:
              - function: "regex"
                group_select: -1
                regex_pattern: "(-?[$0-9.,]{{2,}})|(-?[0-9]+)"
              - function: "take_first"
        """
    files = {
        "arc_easy.yaml": f"""
            task: bl_arc_easy
            dataset_path: json
            dataset_kwargs:
              data_files:
                test: {data / "arc" / "arc_easy_test.jsonl"}
            output_type: multiple_choice
            test_split: test
            doc_to_text: "{{{{query}}}}\\nAnswer:"
            doc_to_target: gold
            doc_to_choice: choices
            metric_list:
              - metric: acc
              - metric: acc_norm
            """,
        "arc_easy_spaced.yaml": f"""
            include: arc_easy.yaml
            task: {SPACED}
            doc_to_text: "{{{{query}}}}\\nAnswer: "
            target_delimiter: ""
            """,
        "gsm8k.yaml": gsm8k,
        "gsm8k_line.yaml": f"""
            include: gsm8k.yaml
            task: bl_gsm8k_line
            num_fewshot: 0
            generation_kwargs:
              until: {json.dumps(LINE_STOPS)}
              do_sample: false
              max_gen_toks: {LINE_GEN}
            """,
        "wikitext.yaml": f"""
            task: bl_wikitext
            dataset_path: text
            dataset_kwargs:
              data_files:
                test: {data / "wikitext2" / "wiki.test.raw"}
            output_type: loglikelihood_rolling
            test_split: test
            doc_to_text: ""
            doc_to_target: "{{{{text}}}}"
            metric_list:
              - metric: word_perplexity
              - metric: byte_perplexity
              - metric: bits_per_byte
            """,
    }
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(textwrap.dedent(text).lstrip(), encoding="utf-8")
    return folder


def run_both(run_dir, tasks, configs, hf_dir):
    """(lm-eval's HF backend's results on the exported folder, ours on the run's latest checkpoint)."""
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    from burnout.eval.harness import run_harness

    export_hf(list_checkpoints(run_dir)[-1], hf_dir)
    # lm-eval's HF backend in fp32, without a BOS token (our tokenizers have none)
    hf = HFLM(pretrained=str(hf_dir), dtype="float32", add_bos_token=False, batch_size=BATCH, device="cpu")
    theirs = simple_evaluate(model=hf, tasks=tasks, limit=LIMIT,
                             task_manager=TaskManager(include_path=str(configs), include_defaults=False))
    (ours,) = run_harness(run_dir, ",".join(tasks), include=[configs], limit=LIMIT, batch_size=BATCH, device="cpu",
                          include_defaults=False, log_samples=True, say=lambda _: None)
    return theirs, ours


def random_run(trained_run, root):
    """A run folder with one checkpoint of trained_run's model shape and tokenizer, random weights."""
    from burnout.config import load_run_config
    from burnout.core.checkpoint import save_checkpoint
    from burnout.models import Transformer

    _, _, ckpt = load_model(list_checkpoints(trained_run)[-1])
    cfg = load_run_config({"model": {**dataclasses.asdict(ckpt.model.cfg), "tie_embeddings": False}})
    torch.manual_seed(0)
    model = Transformer(cfg.model)
    with torch.no_grad():  # larger weights: logits that depend on the context, top-2 gaps far above rounding
        for name, p in model.named_parameters():
            if p.dim() == 2 and "emb" not in name:
                p.mul_(5)
    save_checkpoint(root / "random", cfg, model, {"step": 0, "tokens": 0}, {"step": 0, "tokens": 0},
                    ckpt.path / "tokenizer.json", keep_last=1)
    return root / "random"


@pytest.fixture(scope="module")
def runs(trained_run, shared_data, tmp_path_factory):
    """trained / random: (lm-eval HF's results, ours) on the trained run (a copy: run_dir) and the random one."""
    pytest.importorskip("lm_eval")
    root = tmp_path_factory.mktemp("harness")
    threads = torch.get_num_threads()
    with pytest.MonkeyPatch.context() as mp:
        for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
            mp.setenv(var, "1")
        # Time only: lm-eval's environment report runs a dozen subprocesses per evaluation, and a 64-wide model
        # gains nothing from a second thread (on a busy 2-core machine its OpenMP waits cost 100x).
        mp.setattr("lm_eval.evaluator.add_env_info", lambda storage: None)
        torch.set_num_threads(1)
        try:
            configs = write_task_yamls(root / "tasks", shared_data)
            run_dir = root / "run"  # results land in RUN/eval: a copy, as trained_run is shared
            shutil.copytree(trained_run, run_dir)
            random_dir = random_run(trained_run, root)
            return SimpleNamespace(trained=run_both(run_dir, SCORED, configs, root / "hf_trained"),
                                   random=run_both(random_dir, GENERATED, configs, root / "hf_random"),
                                   run_dir=run_dir, random_dir=random_dir)
        finally:
            torch.set_num_threads(threads)


def _samples(results, task):
    """A task's logged samples in document order, one per (document, filter)."""
    return sorted(results["samples"][task], key=lambda s: (s["doc_id"], s["filter"]))


@pytest.mark.slow
def test_metrics_identical_to_lm_eval_hf(runs):
    for which, tasks in (("trained", SCORED), ("random", GENERATED)):
        theirs, ours = getattr(runs, which)
        for task in tasks:
            mine, their = ours["results"][task], theirs["results"][task]
            assert mine.keys() == their.keys(), (which, task)
            for key, value in their.items():
                if task == "bl_wikitext" and isinstance(value, float):  # perplexities of summed log-likelihoods
                    assert mine[key] == pytest.approx(value, rel=1e-6), (which, task, key)
                elif isinstance(value, float) and math.isnan(value):
                    assert math.isnan(mine[key]), (which, task, key)
                else:
                    assert mine[key] == value, (which, task, key)
            assert ours["n-samples"][task] == theirs["n-samples"][task]


@pytest.mark.slow  # the module's `runs` fixture takes seconds
def test_loglikelihoods_within_1e4_of_lm_eval_hf(runs):
    theirs, ours = runs.trained
    for task in ("bl_arc_easy", "bl_wikitext"):
        mine, their = _samples(ours, task), _samples(theirs, task)
        assert len(mine) == len(their) == LIMIT
        for m, t in zip(mine, their):
            assert m["arguments"] == t["arguments"], (task, t["doc_id"])
            if task == "bl_arc_easy":  # one (loglikelihood, greedy) per choice
                lls, their_lls = [r[0][0] for r in m["resps"]], [r[0][0] for r in t["resps"]]
                assert lls == pytest.approx(their_lls, abs=1e-4), t["doc_id"]
                assert [r[0][1] for r in m["resps"]] == [r[0][1] for r in t["resps"]], t["doc_id"]
            else:  # a whole line's log-likelihood: a sum over up to ~1,000 tokens, so relative
                assert m["resps"][0][0] == pytest.approx(t["resps"][0][0], rel=1e-6, abs=1e-4), t["doc_id"]
    windows = [len(s["doc"]["text"]) for s in _samples(ours, "bl_wikitext")]
    assert max(windows) > 3 * 128, "no line long enough for several rolling windows"


@pytest.mark.slow  # the module's `runs` fixture takes seconds
def test_a_context_ending_in_a_space_scores_as_lm_eval_hf(runs):
    """"Answer: " before each choice with no delimiter: TemplateLM._encode_pair moves the space onto the choice,
    and our log-likelihoods are its HF backend's within 1e-4 (red when the space stays with the context)."""
    theirs, ours = runs.trained
    mine, their = _samples(ours, SPACED), _samples(theirs, SPACED)
    assert len(mine) == len(their) == LIMIT
    for m, t in zip(mine, their):
        assert m["arguments"] == t["arguments"], t["doc_id"]
        assert all(ctx.endswith("\nAnswer: ") and not choice[:1].isspace() for ctx, choice in m["arguments"])
        lls, their_lls = [r[0][0] for r in m["resps"]], [r[0][0] for r in t["resps"]]
        assert lls == pytest.approx(their_lls, abs=1e-4), t["doc_id"]


def test_pairs_are_split_as_template_lm_splits_them(trained_run):
    """A context's trailing whitespace (spaces, a tab, a newline) moves onto the continuation: our batched
    encode_pairs gives TemplateLM._encode_pair's ids on the same tokenizer (red when it stays with the context)."""
    pytest.importorskip("lm_eval")
    from lm_eval.api.model import TemplateLM

    from burnout.eval.harness import BurnoutLM

    lm = BurnoutLM.from_checkpoint(trained_run)
    pairs = [("Question: 2 + 2?\nAnswer: ", "4"), ("Answer:  \t", "four"), ("Answer:\n", " 4"), ("Answer:", " 4"),
             ("Answer: ", " 4")]
    assert lm.encode_pairs(pairs) == [TemplateLM._encode_pair(lm, context, choice) for context, choice in pairs]


@pytest.mark.slow  # the module's `runs` fixture takes seconds
def test_generations_identical_to_lm_eval_hf(runs):
    texts = []
    for which in ("trained", "random"):
        theirs, ours = getattr(runs, which)
        for task in [t for t in GENERATED if t in ours["samples"]]:
            mine, their = _samples(ours, task), _samples(theirs, task)
            assert len(mine) == len(their) == 2 * LIMIT  # one per answer filter
            for m, t in zip(mine, their):
                assert m["arguments"] == t["arguments"], (which, task, t["doc_id"])
                assert m["resps"] == t["resps"], (which, task, t["doc_id"])
                assert m["filtered_resps"] == t["filtered_resps"], (which, task, t["doc_id"])
                texts.append((which, task, m["resps"][0][0]))
    random_gsm8k = {text for which, task, text in texts if which == "random" and task == "bl_gsm8k"}
    assert len(random_gsm8k) >= LIMIT // 2, f"too few distinct generations to compare: {random_gsm8k}"

    model, tokenizer, _ = load_model(runs.random_dir)
    few_shot = [len(tokenizer.encode(s["arguments"][0][0]).ids) for s in _samples(runs.random[1], "bl_gsm8k")]
    assert min(few_shot) > 128 - MAX_GEN, "a few-shot prompt fits: left truncation is not exercised"
    line = _samples(runs.random[1], "bl_gsm8k_line")[::2]  # one per document
    ids = [tokenizer.encode(s["arguments"][0][0]).ids[-(128 - LINE_GEN):] for s in line]
    assert len({len(i) for i in ids}) > 1, "the 0-shot prompts should have several lengths"
    # The stop sequences did cut: decoding the same prompts without them gives texts that hold one.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as in `runs`
    try:
        new_ids = generate_batch(model, ids, LINE_GEN, temperature=0, stop_id=tokenizer.token_to_id("<|endoftext|>"))
    finally:
        torch.set_num_threads(threads)
    full = [tokenizer.decode(new) for new in new_ids]
    cut = [s["resps"][0][0] for s in line]
    assert sum(c != f for c, f in zip(cut, full)) >= 2, (cut, full)
    for c, f in zip(cut, full):
        assert c == min((f.split(stop)[0] for stop in LINE_STOPS), key=len)


@pytest.mark.slow  # the module's `runs` fixture takes seconds
def test_results_file(runs):
    run_dir, (_, ours) = runs.run_dir, runs.trained
    saved = json.loads((run_dir / "eval" / f"harness_{list_checkpoints(run_dir)[-1].name}.json").read_text())
    assert saved["step"] == 30 and saved["limit"] == LIMIT and "samples" not in saved
    assert saved["results"]["bl_arc_easy"] == ours["results"]["bl_arc_easy"]


@pytest.fixture
def custom_tasks_only(shared_data, tmp_path, monkeypatch):
    """The task YAMLs' folder; lm-eval offline, and its TaskManager without the 10,000+ built-in task YAMLs,
    whose indexing takes seconds (what --harness does with a name is the same either way)."""
    pytest.importorskip("lm_eval")
    import lm_eval.tasks

    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.setenv(var, "1")
    monkeypatch.setattr("lm_eval.evaluator.add_env_info", lambda storage: None)
    manager = lm_eval.tasks.TaskManager
    monkeypatch.setattr(lm_eval.tasks, "TaskManager", lambda include_path=None, include_defaults=True, **kw:
                        manager(include_path=include_path, include_defaults=False, **kw))
    return write_task_yamls(tmp_path / "tasks", shared_data)


@pytest.mark.slow  # the module's `runs` fixture takes seconds
def test_cli_prints_lm_evals_table(runs, custom_tasks_only, tmp_path, capsys):
    """`burnout eval RUN --harness TASK --harness-include DIR`: lm-eval's table on stdout, the file written."""
    run_dir = runs.run_dir
    ckpt = list_checkpoints(run_dir)[-1]
    code = main(["eval", str(ckpt), "--harness", "bl_arc_easy", "--harness-include", str(custom_tasks_only),
                 "--limit", "3", "--device", "cpu", "--batch-size", "4"])
    out = capsys.readouterr().out
    assert code in (0, None)
    assert "|bl_arc_easy|" in out.replace(" ", "") and "acc_norm" in out, out
    saved = json.loads((run_dir / "eval" / f"harness_{ckpt.name}.json").read_text())
    assert saved["limit"] == 3 and saved["results"]["bl_arc_easy"]["acc,none"] in (0, 1 / 3, 2 / 3, 1)


@pytest.mark.slow  # the module's `runs` fixture takes seconds
def test_unknown_task_is_one_error_line(runs, custom_tasks_only, capsys):
    run_dir = runs.run_dir
    assert main(["eval", str(run_dir), "--harness", "bl_arc_easyy", "--harness-include", str(custom_tasks_only)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("burnout: error: unknown lm-eval task 'bl_arc_easyy'; did you mean "
                                               "bl_arc_easy"), err


def test_without_lm_eval_is_one_error_line(trained_run, capsys, monkeypatch):
    """Checked before anything is loaded or written (so trained_run itself is safe to name)."""
    for name in [m for m in sys.modules if m == "lm_eval" or m.startswith("lm_eval.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "lm_eval", None)  # import lm_eval → ImportError
    assert main(["eval", str(trained_run), "--harness", "arc_easy"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("burnout: error: --harness needs lm-evaluation-harness"), err
    assert "pip install 'gpuburnout[dev]'" in err[0] and "lm-eval" in err[0]


def test_a_chat_checkpoint_stops_at_im_end(chat_checkpoint):
    """A chat model's answer ends at <|im_end|>, as its export's generation_config says; a base model's
    only at <|endoftext|>, so the rigged model (chat_checkpoint) would answer again and again."""
    pytest.importorskip("lm_eval")
    from lm_eval.api.instance import Instance

    from burnout.core.chat_template import encode_prompt
    from burnout.eval.harness import BurnoutLM

    lm = BurnoutLM.from_checkpoint(chat_checkpoint.run_dir)
    ids = encode_prompt(lm._tokenizer, [{"role": "user", "content": "What is the capital of France?"}])
    prompt = lm._tokenizer.decode(ids, skip_special_tokens=False)
    assert lm.tok_encode(prompt) == ids
    request = Instance("generate_until", doc={}, arguments=(prompt, {"until": ["Question:"], "max_gen_toks": 12}),
                       idx=0)
    assert lm.generate_until([request], disable_tqdm=True) == [chat_checkpoint.answer]
    as_base = BurnoutLM(lm.model, lm._tokenizer)
    assert as_base.generate_until([request], disable_tqdm=True)[0].startswith(chat_checkpoint.answer * 2)
