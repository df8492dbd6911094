"""Proof that our scores are lm-evaluation-harness's: a trained checkpoint, exported to Hugging Face format,
is scored by lm-eval itself (model "hf", task configs over the local shared/data files, no network) and by
burnout.eval; per-example log-likelihoods and acc / acc_norm must agree.

The tiny model's 128-token window is shorter than many HellaSwag contexts, so left truncation is
compared too.
"""

from __future__ import annotations

import textwrap

import pytest
import torch

from burnout.eval.evaluate import load_for_eval
from burnout.eval.scoring import score_examples
from burnout.eval.tasks import DEFAULT_FILES, load_task
from burnout.models.hf import save_hf
from burnout.train.checkpoint import list_checkpoints

LIMIT = 16
TASK_NAMES = {"hellaswag": "burnout_hellaswag", "arc_easy": "burnout_arc_easy", "lambada": "burnout_lambada"}


def write_task_configs(folder, shared_data) -> None:
    """lm-eval task YAMLs over the very files our loaders read. HellaSwag's 6-line text records become
    docs in process_docs, through lm-eval's own hellaswag `preprocess`."""
    folder.mkdir()
    (folder / "hellaswag_lines.py").write_text(textwrap.dedent("""
        import datasets
        from lm_eval.tasks.hellaswag.utils import preprocess

        def process_docs(dataset):
            lines = dataset.data.column("text").to_pylist()
            docs = []
            for i in range(0, len(lines) - len(lines) % 6, 6):
                ctx, label, *endings = lines[i : i + 6]
                docs.append({"query": preprocess(ctx), "choices": [preprocess(e) for e in endings],
                             "gold": int(label)})
            return datasets.Dataset.from_list(docs)
    """))
    (folder / "hellaswag.yaml").write_text(textwrap.dedent(f"""
        task: {TASK_NAMES["hellaswag"]}
        dataset_path: text
        dataset_kwargs:
          data_files:
            validation: {shared_data / DEFAULT_FILES["hellaswag"]}
        output_type: multiple_choice
        validation_split: validation
        process_docs: !function hellaswag_lines.process_docs
        doc_to_text: "{{{{query}}}}"
        doc_to_target: gold
        doc_to_choice: choices
        metric_list:
          - metric: acc
          - metric: acc_norm
    """))
    (folder / "arc_easy.yaml").write_text(textwrap.dedent(f"""
        task: {TASK_NAMES["arc_easy"]}
        dataset_path: json
        dataset_kwargs:
          data_files:
            test: {shared_data / DEFAULT_FILES["arc_easy"]}
        output_type: multiple_choice
        test_split: test
        doc_to_text: "{{{{query}}}}\\nAnswer:"
        doc_to_target: gold
        doc_to_choice: choices
        metric_list:
          - metric: acc
          - metric: acc_norm
    """))
    (folder / "lambada.yaml").write_text(textwrap.dedent(f"""
        task: {TASK_NAMES["lambada"]}
        dataset_path: json
        dataset_kwargs:
          data_files:
            test: {shared_data / DEFAULT_FILES["lambada"]}
        output_type: loglikelihood
        test_split: test
        doc_to_text: "{{{{context}}}}"
        doc_to_target: "{{{{' ' + continuation}}}}"
        metric_list:
          - metric: perplexity
            aggregation: perplexity
            higher_is_better: false
          - metric: acc
            aggregation: mean
            higher_is_better: true
    """))


def test_scores_equal_lm_evaluation_harness(trained_run, shared_data, tmp_path, monkeypatch):
    pytest.importorskip("lm_eval")
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.setenv(var, "1")
    ckpt_path = list_checkpoints(trained_run)[-1]
    ckpt, tokenizer = load_for_eval(ckpt_path, torch.device("cpu"))
    hf_dir = save_hf(ckpt.model, tmp_path / "hf", tokenizer_path=ckpt_path / "tokenizer.json")
    write_task_configs(tmp_path / "tasks", shared_data)

    results = simple_evaluate(
        model="hf",
        # Our tokenizers have no BOS; lm-eval must not add one either.
        model_args=f"pretrained={hf_dir},dtype=float32,add_bos_token=False",
        tasks=list(TASK_NAMES.values()),
        task_manager=TaskManager(include_path=str(tmp_path / "tasks"), include_defaults=False),
        limit=LIMIT,
        log_samples=True,
        device="cpu",
        batch_size=8,
    )

    truncated = 0
    for task, name in TASK_NAMES.items():
        examples = load_task(task, shared_data / DEFAULT_FILES[task], LIMIT)
        metrics, ours = score_examples(ckpt.model, tokenizer, task, examples, batch_size=5)
        theirs = sorted(results["samples"][name], key=lambda s: s["doc_id"])
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
                window = ckpt.model.cfg.context_length
                truncated += len(tokenizer.encode(mine["context"] + " " + mine["choices"][0]).ids) > window + 1
        their_metrics = results["results"][name]
        for key in ("acc", "acc_norm", "perplexity"):
            if key in metrics:
                assert metrics[key] == pytest.approx(their_metrics[f"{key},none"], rel=1e-6), (task, key)
    assert truncated > 0, "no context was long enough to exercise left truncation"
