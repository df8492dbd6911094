"""lm-evaluation-harness itself, run on a model exported with burnout.models.hf.save_hf over the very files
burnout.eval.tasks reads: the reference that our scores must equal (tests/eval/test_lm_eval_equality.py)
and the baseline that our scoring speed is measured against (benchmarks/bench_eval.py).

Needs the optional lm-eval package (0.4.x) and no network: the task configs below read local files, and
HellaSwag's 6-line text records become docs through lm-eval's own hellaswag `preprocess`.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

from burnout.errors import BurnoutError
from burnout.eval.tasks import DEFAULT_FILES

# Our task → the lm-eval task name the configs register (distinct from lm-eval's built-in tasks).
LM_EVAL_TASKS = {"hellaswag": "burnout_hellaswag", "arc_easy": "burnout_arc_easy", "lambada": "burnout_lambada"}


def write_task_configs(folder: str | Path, data_root: str | Path) -> Path:
    """lm-eval task YAMLs over DEFAULT_FILES under `data_root`, written into `folder` (returned)."""
    folder, data_root = Path(folder), Path(data_root)
    folder.mkdir(parents=True, exist_ok=True)
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
        task: {LM_EVAL_TASKS["hellaswag"]}
        dataset_path: text
        dataset_kwargs:
          data_files:
            validation: {data_root / DEFAULT_FILES["hellaswag"]}
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
        task: {LM_EVAL_TASKS["arc_easy"]}
        dataset_path: json
        dataset_kwargs:
          data_files:
            test: {data_root / DEFAULT_FILES["arc_easy"]}
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
        task: {LM_EVAL_TASKS["lambada"]}
        dataset_path: json
        dataset_kwargs:
          data_files:
            test: {data_root / DEFAULT_FILES["lambada"]}
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
    return folder


def hf_model(hf_dir: str | Path, batch_size: int, device: str = "cpu"):
    """lm-eval's Hugging Face causal-LM backend ("hf") on an exported folder, in fp32."""
    try:
        from lm_eval.models.huggingface import HFLM
    except ImportError:
        raise BurnoutError("lm-evaluation-harness is not installed; pip install lm-eval") from None
    # Our tokenizers have no BOS; lm-eval must not add one either.
    return HFLM(pretrained=str(hf_dir), dtype="float32", add_bos_token=False, batch_size=batch_size, device=device)


def run_lm_eval(lm, tasks: list[str], config_dir: str | Path, limit: int | None) -> dict[str, tuple[dict, list[dict]]]:
    """{task: (lm-eval's metrics, keyed like "acc,none"; its per-example samples in document order)} for the
    first `limit` examples of each task, scored by `lm` (e.g. `hf_model`) with the configs in `config_dir`."""
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    names = [LM_EVAL_TASKS[t] for t in tasks]
    results = simple_evaluate(
        model=lm,
        tasks=names,
        task_manager=TaskManager(include_path=str(config_dir), include_defaults=False),
        limit=limit,
        log_samples=True,
    )
    return {
        task: (results["results"][name], sorted(results["samples"][name], key=lambda s: s["doc_id"]))
        for task, name in zip(tasks, names)
    }
