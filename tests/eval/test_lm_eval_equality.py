"""Proof that our scores are lm-evaluation-harness's: a trained checkpoint, exported to Hugging Face format,
is scored by lm-eval itself (model "hf", task configs over the local shared/data files, no network) and by
burnout.eval; per-example log-likelihoods and acc / acc_norm must agree.

The tiny model's 128-token window is shorter than many HellaSwag contexts, so left truncation is
compared too, and with it both of our scoring's cases: choices that share their context's computation,
and truncated ones that each get their own (burnout.eval.scoring.shared_prefix_groups).
"""

from __future__ import annotations

import pytest
import torch

from burnout.core.checkpoint import list_checkpoints
from burnout.core.model_files import load_model
from burnout.eval.harness import LM_EVAL_TASKS, hf_model, run_lm_eval, write_task_configs
from burnout.eval.scoring import score_examples
from burnout.eval.tasks import DEFAULT_FILES, load_task
from burnout.models.hf import save_hf

LIMIT = 16


def test_scores_equal_lm_evaluation_harness(trained_run, shared_data, tmp_path, monkeypatch):
    pytest.importorskip("lm_eval")
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.setenv(var, "1")
    ckpt_path = list_checkpoints(trained_run)[-1]
    _, tokenizer, ckpt = load_model(ckpt_path, torch.device("cpu"))
    hf_dir = save_hf(ckpt.model, tmp_path / "hf", tokenizer_path=ckpt_path / "tokenizer.json")
    config_dir = write_task_configs(tmp_path / "tasks", shared_data)
    theirs_by_task = run_lm_eval(hf_model(hf_dir, batch_size=8), list(LM_EVAL_TASKS), config_dir, LIMIT)

    truncated = 0
    for task, (their_metrics, theirs) in theirs_by_task.items():
        examples = load_task(task, shared_data / DEFAULT_FILES[task], LIMIT)
        metrics, ours = score_examples(ckpt.model, tokenizer, task, examples, batch_size=5)
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
        for key in ("acc", "acc_norm", "perplexity"):
            if key in metrics:
                assert metrics[key] == pytest.approx(their_metrics[f"{key},none"], rel=1e-6), (task, key)
    assert truncated > 0, "no context was long enough to exercise left truncation"
