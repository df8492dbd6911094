"""burnout/report/model_card.py: `burnout export` writes README.md, a model card that huggingface_hub parses and
whose figures are the run's own."""

import json
import shutil

import yaml
from huggingface_hub import ModelCard

from burnout.cli import main
from burnout.core.checkpoint import list_checkpoints
from burnout.data.shards import read_meta
from burnout.models.memory import param_counts


def test_the_export_carries_a_card_hugging_face_parses_with_the_runs_own_figures(tiny_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(tiny_run.run_dir, run)
    assert main(["eval", str(run), "--tasks", "val"]) == 0
    assert main(["export", str(run), "--to", str(tmp_path / "hf")]) == 0
    card = ModelCard.load(tmp_path / "hf" / "README.md")
    assert card.data.library_name == "transformers" and card.data.pipeline_tag == "text-generation"
    assert {"gpuburnout", "llama"} <= set(card.data.tags) and "chat" not in card.data.tags
    info = json.loads((list_checkpoints(run)[-1] / "info.json").read_text())
    scored = json.loads(next((run / "eval").glob("step_*.json")).read_text())["tasks"]["val"]
    [result] = card.data.eval_results
    assert result.dataset_name == "val" and result.metric_value == next(iter(scored.values()))
    body = card.text
    meta = read_meta(tiny_run.data_dir)
    for figure in (f"| parameters | {param_counts(tiny_run.cfg.model).total:,} |", f"| steps | {info['step']:,} |",
                   f"| tokens | {info['tokens']:,} |", f"| val loss | {info['val_loss']:.4f} |",
                   f"{meta['splits']['train']['tokens']:,} train and {meta['splits']['val']['tokens']:,} val tokens"):
        assert figure in body, figure
    assert "## Intended use and limits" in body and "Not evaluated" not in body
    # Exported again: its own card rewritten; a README.md of the user's kept as it is.
    assert main(["export", str(run), "--to", str(tmp_path / "hf")]) == 0
    assert ModelCard.load(tmp_path / "hf" / "README.md").data.tags == card.data.tags
    (tmp_path / "hf" / "README.md").write_text("my notes\n")
    assert main(["export", str(run), "--to", str(tmp_path / "hf")]) == 0
    assert (tmp_path / "hf" / "README.md").read_text() == "my notes\n"


def test_a_chat_models_card_says_what_it_started_from(chat_run, tmp_path):
    assert main(["export", str(chat_run), "--to", str(tmp_path / "hf")]) == 0
    card = ModelCard.load(tmp_path / "hf" / "README.md")
    assert {"chat", "chatml"} <= set(card.data.tags)
    base = yaml.safe_load((chat_run / "config.yaml").read_text())["sft"]["base"]
    assert f"## Started from\n\n`{base}`, fine-tuned with SFT." in card.text
    assert "Not evaluated" in card.text
