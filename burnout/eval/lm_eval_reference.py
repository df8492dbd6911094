"""lm-evaluation-harness itself, run on a model exported with burnout.models.hf.save_hf over the very files
burnout.eval.tasks reads: the reference that our scores must equal (tests/eval/test_lm_eval_equality.py)
and the baseline that our scoring speed is measured against (benchmarks/bench_eval.py).

Needs the optional lm-eval package (0.4.x) and no network: the task configs below read local files, and
HellaSwag's 6-line text records become docs through lm-eval's own hellaswag `preprocess`.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

from burnout.base.files import write_atomic
from burnout.base.text import install_extra
from burnout.errors import BurnoutError
from burnout.eval.tasks import DEFAULT_FILES

# Our task → the lm-eval task name the configs register (distinct from lm-eval's built-in tasks).
LM_EVAL_TASKS = {"hellaswag": "burnout_hellaswag", "arc_easy": "burnout_arc_easy", "lambada": "burnout_lambada"}


def write_task_configs(folder: str | Path, data_root: str | Path) -> Path:
    """lm-eval task YAMLs over DEFAULT_FILES under `data_root`, written into `folder` (returned)."""
    folder, data_root = Path(folder), Path(data_root)
    folder.mkdir(parents=True, exist_ok=True)
    files = {
        "hellaswag_lines.py": """
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
        """,
        "hellaswag.yaml": _task_yaml("hellaswag", "text", "validation", data_root, "multiple_choice", "{{query}}",
                                     "process_docs: !function hellaswag_lines.process_docs"),
        "arc_easy.yaml": _task_yaml("arc_easy", "json", "test", data_root, "multiple_choice", "{{query}}\\nAnswer:"),
        "lambada.yaml": _task_yaml("lambada", "json", "test", data_root, "loglikelihood", "{{context}}",
                                   "doc_to_target: \"{{' ' + continuation}}\""),
    }
    for name, text in files.items():
        write_atomic(folder / name, textwrap.dedent(text).lstrip())
    return folder


def _task_yaml(task: str, loader: str, split: str, data_root: Path, output_type: str, doc_to_text: str,
               extra: str = "") -> str:
    """One lm-eval task config: `loader` (an HF datasets builder) reads our file for `task` as `split`."""
    if output_type == "multiple_choice":  # lm-eval picks the choice of highest log-likelihood
        extra += "\ndoc_to_target: gold\ndoc_to_choice: choices\nmetric_list:\n  - metric: acc\n  - metric: acc_norm"
    else:  # LAMBADA: the last word's log-likelihood, as perplexity and greedy accuracy
        extra += ("\nmetric_list:\n  - metric: perplexity\n    aggregation: perplexity\n    higher_is_better: false"
                  "\n  - metric: acc\n    aggregation: mean\n    higher_is_better: true")
    return (f"task: {LM_EVAL_TASKS[task]}\ndataset_path: {loader}\ndataset_kwargs:\n  data_files:\n"
            f"    {split}: {data_root / DEFAULT_FILES[task]}\noutput_type: {output_type}\n{split}_split: {split}\n"
            f'doc_to_text: "{doc_to_text}"\n' + extra.lstrip("\n") + "\n")


def hf_model(hf_dir: str | Path, batch_size: int, device: str = "cpu"):
    """lm-eval's Hugging Face causal-LM backend ("hf") on an exported folder, in fp32."""
    try:
        from lm_eval.models.huggingface import HFLM
    except ImportError:
        raise BurnoutError(f"lm-evaluation-harness is not installed; {install_extra('dev')}") from None
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
