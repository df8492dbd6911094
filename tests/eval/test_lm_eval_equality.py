"""Proof that our scores are lm-evaluation-harness's: a trained checkpoint, exported to Hugging Face format,
is scored by lm-eval itself (model "hf", task configs over the local shared/data files, no network) and by
burnout.eval; per-example log-likelihoods and acc / acc_norm must agree.

The tiny model's 128-token window is shorter than many HellaSwag contexts, so left truncation is
compared too, and with it both of our scoring's cases: choices that share their context's computation,
and truncated ones that each get their own (burnout.eval.scoring.shared_prefix_groups).

The in-context-learning engine is compared the same way on the ICL files lm-eval can read with the same
template: zero-shot, since lm-eval draws few-shot examples its own way (llm-foundry's prompts are checked
string by string in tests/eval/test_icl.py). DCLM's settings for each (burnout.eval.icl.load_suite over
dclm_mmlu_and_lowvar.yaml) give the prompts; lm-eval gets the equivalent task config written below:
arc_challenge (DCLM's "\\nAnswer: " delimiter, stripped at the end of the prompt), copa (the query as is),
winogrande (schema: lm-eval's multiple-input mode, one context per option, the shared continuation scored)
and bigbench_operators (language modeling: the greedy exact match).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from burnout.core.checkpoint import list_checkpoints
from burnout.core.model_files import load_model
from burnout.eval.icl import load_suite
from burnout.eval.lm_eval_reference import LM_EVAL_TASKS, hf_model, write_task_configs
from burnout.eval.scoring import score_examples, score_items
from burnout.eval.tasks import DEFAULT_FILES, build_items, load_task, needs_prefix_space, read_records
from burnout.models.hf import save_hf

LIMIT = 16
# DCLM label → the lm-eval config body (after task / dataset lines) that reads its ICL file the same way.
ICL_CONFIGS = {
    "arc_challenge": 'output_type: multiple_choice\ndoc_to_text: "{{query}}\\nAnswer:"\ndoc_to_target: gold\n'
                     "doc_to_choice: choices\nmetric_list:\n  - metric: acc\n  - metric: acc_norm\n",
    "copa": 'output_type: multiple_choice\ndoc_to_text: "{{query}}"\ndoc_to_target: gold\ndoc_to_choice: choices\n'
            "metric_list:\n  - metric: acc\n  - metric: acc_norm\n",
    # doc_to_text naming an int field puts lm-eval in multiple-input mode: a context per option.
    "winogrande": "output_type: multiple_choice\ndoc_to_text: gold\ndoc_to_target: continuation\n"
                  "doc_to_choice: context_options\nmetric_list:\n  - metric: acc\n",
    "bigbench_operators": "output_type: loglikelihood\ndoc_to_text: \"{{context}}\"\n"
                          "doc_to_target: \"{{' ' + continuation}}\"\nmetric_list:\n  - metric: acc\n"
                          "    aggregation: mean\n    higher_is_better: true\n",
}


@pytest.fixture(scope="module")
def scored(trained_run, shared_data, tmp_path_factory):
    """lm-eval's results on the built-in and ICL configs, in one simple_evaluate run, and our model."""
    pytest.importorskip("lm_eval")
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    tmp_path = tmp_path_factory.mktemp("lm_eval")
    with pytest.MonkeyPatch.context() as mp:
        for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
            mp.setenv(var, "1")
        ckpt_path = list_checkpoints(trained_run)[-1]
        _, tokenizer, ckpt = load_model(ckpt_path, torch.device("cpu"))
        hf_dir = save_hf(ckpt.model, tmp_path / "hf", tokenizer_path=ckpt_path / "tokenizer.json")
        config_dir = write_task_configs(tmp_path / "tasks", shared_data)
        for label, body in ICL_CONFIGS.items():
            (config_dir / f"icl_{label}.yaml").write_text(
                f"task: burnout_icl_{label}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n"
                f"    test: {shared_data / 'icl' / (label + '.jsonl')}\ntest_split: test\n" + body)
        names = [*LM_EVAL_TASKS.values(), *(f"burnout_icl_{label}" for label in ICL_CONFIGS)]
        results = simple_evaluate(model=hf_model(hf_dir, batch_size=8), tasks=names, limit=LIMIT, log_samples=True,
                                  task_manager=TaskManager(include_path=str(config_dir), include_defaults=False))
    theirs = {name: (results["results"][name], sorted(results["samples"][name], key=lambda s: s["doc_id"]))
              for name in names}
    return ckpt.model, tokenizer, theirs


@pytest.mark.slow
def test_scores_equal_lm_evaluation_harness(scored, shared_data):
    model, tokenizer, theirs_by_name = scored
    truncated = 0
    for task, name in LM_EVAL_TASKS.items():
        their_metrics, theirs = theirs_by_name[name]
        examples = load_task(task, shared_data / DEFAULT_FILES[task], LIMIT)
        metrics, ours = score_examples(model, tokenizer, task, examples, batch_size=5)
        assert len(ours) == len(theirs) == LIMIT
        for mine, their in zip(ours, theirs):
            # One (loglikelihood, is_greedy) per continuation, in choice order.
            their_lls = [float(r[0]) for r in their["filtered_resps"]]
            assert mine["loglikelihoods"] == pytest.approx(their_lls, abs=1e-4), (task, their["doc_id"])
            assert their["arguments"][0][0] == mine["context"]
            if task == "lambada":
                assert mine["greedy"][0] == bool(their["filtered_resps"][0][1])
                assert float(mine["greedy"][0]) == their["acc"]
            else:
                assert float(mine["pred"] == mine["gold"]) == their["acc"], (task, their["doc_id"])
                assert float(mine["pred_norm"] == mine["gold"]) == their["acc_norm"], (task, their["doc_id"])
                window = model.cfg.context_length
                truncated += len(tokenizer.encode(mine["context"] + " " + mine["choices"][0]).ids) > window + 1
        for key in ("acc", "acc_norm", "perplexity"):
            if key in metrics:
                assert metrics[key] == pytest.approx(their_metrics[f"{key},none"], rel=1e-6), (task, key)
    assert truncated > 0, "no context was long enough to exercise left truncation"


@pytest.mark.slow  # the module's `scored` fixture takes seconds
def test_icl_engine_equals_lm_evaluation_harness(scored, shared_data):
    model, tokenizer, theirs_by_name = scored
    suite = {t.label: t for t in load_suite(shared_data / "icl" / "dclm_mmlu_and_lowvar.yaml", shared_data).tasks}
    seen_types = set()
    for label in ICL_CONFIGS:
        their_metrics, theirs = theirs_by_name[f"burnout_icl_{label}"]
        task = replace(suite[label], num_fewshot=(0,))
        items = build_items(task, read_records(task), 0, needs_prefix_space(tokenizer), LIMIT)
        metrics, ours = score_items(model, tokenizer, task.type, items, batch_size=5)
        assert len(ours) == len(theirs) == LIMIT
        for item, mine, their in zip(items, ours, theirs):
            # The same requests, strings and all: our prompt construction gives lm-eval's template.
            assert [tuple(a) for a in their["arguments"]] == list(item.requests), (label, their["doc_id"])
            their_lls = [float(r[0]) for r in their["filtered_resps"]]
            assert mine["loglikelihoods"] == pytest.approx(their_lls, abs=1e-4), (label, their["doc_id"])
            if task.type == "language_modeling":
                assert float(mine["greedy"][0]) == their["acc"] == float(their["filtered_resps"][0][1])
            else:
                assert float(mine["pred"] == mine["gold"]) == their["acc"], (label, their["doc_id"])
            if task.type == "multiple_choice":
                assert float(mine["pred_norm"] == mine["gold"]) == their["acc_norm"], (label, their["doc_id"])
        for key in ("acc", "acc_norm") if task.type == "multiple_choice" else ("acc",):
            assert metrics[key] == pytest.approx(their_metrics[f"{key},none"], rel=1e-9), (label, key)
        seen_types.add(task.type)
    assert seen_types == {"multiple_choice", "schema", "language_modeling"}

