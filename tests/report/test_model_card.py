"""burnout/report/model_card.py: `burnout export` writes README.md (FILE.md beside a FILE.gguf), a model card that
huggingface_hub parses and whose figures are the run's own: the exported step's scores and no other's, every data set
the model learned from (its pretraining text, its SFT data) with the license its publisher states where it is a known
public set (shared/data/SOURCES.md, read here on its own) and "unknown" otherwise, the precision that ran
(launches.jsonl), and no path of the machine it was trained on in any file of the export."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from huggingface_hub import ModelCard

from burnout.cli import main
from burnout.core.checkpoint import list_checkpoints
from burnout.data.shards import read_meta
from burnout.models.memory import param_counts

REPO_ROOT = Path(__file__).resolve().parents[2]
UNKNOWN = "unknown: check it before you publish"
PRECISION_RAN = "bf16"  # what the published runs' `auto` resolves to here (their trainer is told so)


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
    assert "## Intended use and limits" in body and "was not evaluated" not in body
    # The built-in corpus: Python's own docs and source, under Python's license.
    for name, source in meta["sources"]["per_source"].items():
        assert card_rows(body)[name] == ["pretraining", source["kind"], *card_rows(body)[name][2:3],
                                         f"{source['tokens']:,}", "PSF-2.0"]
    # Exported again: its own card rewritten; a README.md of the user's kept as it is.
    assert main(["export", str(run), "--to", str(tmp_path / "hf")]) == 0
    assert ModelCard.load(tmp_path / "hf" / "README.md").data.tags == card.data.tags
    (tmp_path / "hf" / "README.md").write_text("my notes\n")
    assert main(["export", str(run), "--to", str(tmp_path / "hf")]) == 0
    assert (tmp_path / "hf" / "README.md").read_text() == "my notes\n"


def test_the_card_of_an_older_checkpoint_shows_its_own_steps_scores_and_no_other(tiny_run, tmp_path):
    """Steps 6 (on its first 3 val windows) and 24 scored, step 12 not: step 6's card shows step 6's scores, and says
    on what, step 12's shows none (the newest's are another model's), and each card's figures are its own step's."""
    run = tmp_path / "run"
    shutil.copytree(tiny_run.run_dir, run)
    checkpoints = {int(p.name[5:]): p for p in list_checkpoints(run)}
    assert main(["eval", str(checkpoints[6]), "--tasks", "val", "--limit", "3"]) == 0
    assert main(["eval", str(checkpoints[24]), "--tasks", "val"]) == 0
    scores = {step: {metric: value for metric, value in json.loads(
        (run / "eval" / f"step_{step:07d}.json").read_text())["tasks"]["val"].items() if isinstance(value, float)}
        for step in (6, 24)}  # the loss, perplexity and bits per byte (the token count is the same)
    assert len(scores[6]) == 3 and not set(scores[6].values()) & set(scores[24].values())

    assert main(["export", str(checkpoints[6]), "--to", str(tmp_path / "hf6")]) == 0
    card = ModelCard.load(tmp_path / "hf6" / "README.md")
    [result] = card.data.eval_results
    assert result.metric_value == scores[6][result.metric_type]
    assert "Scores of step 6 (on the first 3 examples of each task: windows, for val):" in card.text
    for metric, value in scores[6].items():
        assert f"| val | {metric} | {value:.4f} |" in card.text
    for value in scores[24].values():
        assert f"{value:.4f}" not in card.text
    info = json.loads((checkpoints[6] / "info.json").read_text())
    assert f"| steps | {info['step']:,} |" in card.text and f"| val loss | {info['val_loss']:.4f} |" in card.text

    assert main(["export", str(checkpoints[12]), "--to", str(tmp_path / "hf12")]) == 0
    card = ModelCard.load(tmp_path / "hf12" / "README.md")
    assert card.data.eval_results is None
    assert "Step 12 was not evaluated" in card.text
    for value in [*scores[6].values(), *scores[24].values()]:
        assert f"{value:.4f}" not in card.text


def test_a_chat_models_card_says_what_it_started_from(chat_run, tmp_path):
    assert main(["export", str(chat_run), "--to", str(tmp_path / "hf")]) == 0
    card = ModelCard.load(tmp_path / "hf" / "README.md")
    assert {"chat", "chatml"} <= set(card.data.tags)
    base = Path(yaml.safe_load((chat_run / "config.yaml").read_text())["sft"]["base"])
    step = json.loads((base / "info.json").read_text())["step"]
    assert f"## Started from\n\n`{base.parent.parent.name}` step {step}, fine-tuned with SFT." in card.text
    assert "Step 6 was not evaluated" in card.text


def test_a_card_says_what_of_the_models_history_could_not_be_read(chat_checkpoint, tmp_path):
    """chat_checkpoint names a base (runs/base) that is not there: the card says so, and that the data of that base,
    and so its license, is not listed."""
    assert main(["export", str(chat_checkpoint.run_dir), "--to", str(tmp_path / "hf")]) == 0
    text = ModelCard.load(tmp_path / "hf" / "README.md").text
    missing = "`base`, the model `chat` step 10 started from, and what it learned from"
    assert f"Not found when this card was written: {missing}." in text
    assert f"Not listed, since it could not be read: {missing}." in text
    assert f"| SFT | conversations.jsonl | conversations | conversations.jsonl | not recorded | {UNKNOWN} |" in text


def test_a_continued_run_of_a_grown_model_names_each_model_it_started_from_and_the_data_once(tiny_run, tmp_path):
    """tiny_run grown deeper (`burnout grow`), then trained on with --init-from on the same data: the card follows
    the child to the grown model and on to tiny_run's step 24, and names their data (one folder) once."""
    assert main(["grow", str(tiny_run.run_dir), "--out", str(tmp_path / "grown"), "model.n_layer=3"]) == 0
    config = tmp_path / "child.yaml"
    config.write_text(yaml.safe_dump({"train": {"device": "cpu", "precision": "fp32", "batch_size": 2, "seq_len": 32,
                                                "max_steps": 2, "warmup_steps": 1, "eval_interval": 2,
                                                "ckpt_interval": 2}}))
    assert main(["train", str(config), "--out", str(tmp_path / "child"), "--init-from", str(tmp_path / "grown"),
                 "--data", str(tiny_run.data_dir)]) == 0
    assert main(["export", str(tmp_path / "child"), "--to", str(tmp_path / "hf")]) == 0
    text = ModelCard.load(tmp_path / "hf" / "README.md").text
    parent_step = json.loads((list_checkpoints(tiny_run.run_dir)[-1] / "info.json").read_text())["step"]
    assert ("## Started from\n\n`grown` step 0, continued pretraining on the data above.\n\nWhich itself started "
            f"from `run` step {parent_step}.") in text
    meta = read_meta(tiny_run.data_dir)
    assert sorted(card_rows(text)) == sorted(meta["sources"]["per_source"])
    assert text.count("| pretraining |") == len(meta["sources"]["per_source"])


# ----------------------------------------------------------------------------------------------
# A card fit to publish: a base model pretrained on a known public text and a text of the user's, fine-tuned (SFT)
# on a known public set.


@dataclass
class Published:
    base: Path  # pretrained on Tiny Shakespeare and NOTES, its data prepared into base/data
    chat: Path  # base fine-tuned on Alpaca's 5,000-example file
    notes: Path  # the user's own text: no known license
    shakespeare: Path
    alpaca: Path


@pytest.fixture(scope="module")
def published(shared_data, tiny_run_config, tmp_path_factory) -> Published:
    from burnout.config import load_run_config
    from burnout.runs import start_training

    root = tmp_path_factory.mktemp("published")
    notes = root / "my_notes.txt"
    notes.write_text("".join(f"Note {i}: the kettle boiled at {i} minutes past seven.\n\n" for i in range(400)))
    shakespeare, alpaca = shared_data / "tinyshakespeare" / "input.txt", shared_data / "sft" / "alpaca_5000.json"
    sources = [{"name": "plays", "kind": "text", "path": str(shakespeare), "split_by": "paragraph", "weight": 0.7},
               {"name": "notes", "kind": "text", "path": str(notes), "split_by": "paragraph", "weight": 0.3}]
    base_cfg = tiny_run_config(["train.precision=auto"], max_steps=8, eval_interval=8, ckpt_interval=8)
    base_cfg.data = load_run_config({"data": {"sources": sources, "max_chars": 60_000}}).data
    chat_cfg = load_run_config({
        "sft": {"base": str(root / "base"), "source": str(alpaca), "max_examples": 48},
        "train": {"device": "cpu", "precision": "auto", "batch_size": 4, "seq_len": 64, "max_steps": 4, "lr": 3e-3,
                  "warmup_steps": 1, "eval_interval": 4, "ckpt_interval": 4}})
    with pytest.MonkeyPatch.context() as patch:  # `auto` resolves to bf16 here, whatever this CPU measures
        patch.setattr("burnout.train.loop.training_precision", lambda name, device, say: PRECISION_RAN)
        start_training(base_cfg, root / "base", on_event=lambda line: None, progress=False)
        start_training(chat_cfg, root / "chat", on_event=lambda line: None, progress=False)
    assert main(["data", "audit", str(root / "base" / "data")]) == 0  # its summary goes on the card
    return Published(root / "base", root / "chat", notes, shakespeare, alpaca)


def licenses_in_sources_md(shared_data: Path) -> dict[str, str]:
    """sha256 → the license cell of shared/data/SOURCES.md's tables."""
    found = {}
    for line in (shared_data / "SOURCES.md").read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 7 and re.fullmatch(r"[0-9a-f]{64}", cells[-1]):
            found[cells[-1]] = cells[-4]
    return found


def same_license(card_license: str, stated: str) -> bool:
    """Whether the card's license is the one SOURCES.md states (its words before any note in brackets)."""
    words = lambda text: re.sub(r"[^a-z0-9.]+", " ", text.lower()).strip()  # noqa: E731
    return words(card_license.split(" (")[0]) in words(stated)


def card_rows(text: str) -> dict[str, list[str]]:
    """The Training data table's rows by source name: [stage, kind, from, tokens, license]."""
    section = text.split("## Training data", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 6 and cells[0] not in ("stage", "---"):
            rows[cells[1]] = [cells[0], *cells[2:]]
    return rows


@pytest.mark.slow
def test_the_card_names_every_data_set_with_its_license_and_the_precision_that_ran(published, shared_data, tmp_path):
    assert main(["export", str(published.chat), "--to", str(tmp_path / "hf")]) == 0
    card = ModelCard.load(tmp_path / "hf" / "README.md")
    rows = card_rows(card.text)
    stated = licenses_in_sources_md(shared_data)
    sha = {path: hashlib.sha256(path.read_bytes()).hexdigest() for path in (published.shakespeare, published.alpaca)}

    # The pretraining text: each source of the base's data folder, by its name, kind, file name and tokens.
    meta = json.loads((published.base / "data" / "meta.json").read_text())
    paths = {s["name"]: Path(s["path"]) for s in meta["data_config"]["sources"]}
    for name, source in meta["sources"]["per_source"].items():
        stage, kind, origin, tokens, _ = rows[name]
        assert (stage, kind, tokens) == ("pretraining", source["kind"], f"{source['tokens']:,}")
        assert origin.startswith(paths[name].name), origin
    assert same_license(rows["plays"][-1], stated[sha[published.shakespeare]]), rows["plays"]
    assert rows["notes"][-1] == UNKNOWN
    # The SFT data: Alpaca's file, the tokens of its prepared examples, its license as its publisher states it.
    sft_meta = json.loads((published.chat / "data" / "meta.json").read_text())
    stage, kind, origin, tokens, license_ = rows[published.alpaca.name]
    sft_tokens = sum(split["tokens"] for split in sft_meta["splits"].values())
    assert (stage, kind, tokens) == ("SFT", "conversations", f"{sft_tokens:,}")
    assert same_license(license_, stated[sha[published.alpaca]]) and "CC BY-NC 4.0" in license_
    assert "check its license before you publish" in card.text  # the notes'

    # The precision each run's launches recorded, not the `auto` of its config.
    for run in (published.chat, published.base):
        [launch] = [json.loads(line) for line in (run / "launches.jsonl").read_text().splitlines()]
        assert yaml.safe_load((run / "config.yaml").read_text())["train"]["precision"] == "auto"
        assert launch["precision"] == PRECISION_RAN
    assert f"| precision | {PRECISION_RAN} |" in card.text
    base_step = json.loads((list_checkpoints(published.base)[-1] / "info.json").read_text())["step"]
    assert f"## Started from\n\n`base` step {base_step}, fine-tuned with SFT." in card.text


def test_no_file_of_an_export_names_a_path_of_the_machine(published, shared_data, tmp_path, tmp_path_factory):
    """Every file of a Hugging Face export (its hidden owner record too) and of a GGUF export with its card: not one
    path of the machine, though the run's config, data and fine-tune source are all named by absolute paths."""
    gguf = pytest.importorskip("gguf")
    config = yaml.safe_load((published.chat / "config.yaml").read_text())
    assert Path(config["sft"]["base"]).is_absolute() and Path(config["sft"]["source"]).is_absolute()
    assert main(["export", str(published.chat), "--to", str(tmp_path / "hf")]) == 0
    assert main(["export", str(published.chat), "--to", str(tmp_path / "chat.gguf")]) == 0
    machine = {str(tmp_path_factory.getbasetemp()), str(shared_data.resolve()), str(REPO_ROOT), os.getcwd(),
               str(Path.home()) + os.sep, "pytest-of-"}
    exported = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert {p.name for p in exported} >= {".burnout.json", "README.md", "config.json", "chat.gguf", "chat.md"}
    for path in exported:
        data = path.read_bytes()
        assert not [m for m in machine if m.encode() in data], (path, [m for m in machine if m.encode() in data])

    # The GGUF file carries the card's facts under llama.cpp's general.* keys, and its card beside it says the same.
    fields = {k: f.contents() for k, f in gguf.GGUFReader(tmp_path / "chat.gguf").fields.items()}
    hf_card, gguf_card = (tmp_path / "hf" / "README.md").read_text(), (tmp_path / "chat.md").read_text()
    rows = card_rows(hf_card)
    assert card_rows(gguf_card) == rows
    assert fields["general.dataset.count"] == len(rows)
    described = [fields[f"general.dataset.{i}.description"] for i in range(len(rows))]
    for (stage, kind, origin, tokens, license_), description in zip(rows.values(), described, strict=True):
        assert description.startswith(f"{stage} data, {kind} from {origin.split(' (')[0]}, {tokens} tokens")
        assert description.endswith(f"; license: {license_}")
        assert f"license: {license_}" in fields["general.description"]
    assert fields["general.base_model.0.name"].startswith("base step ")
    assert "## Licenses" in gguf_card and "llama-cli -m chat.gguf" in gguf_card
    assert "## Data audit" in hf_card and "## Data audit" in gguf_card


def test_a_hugging_face_data_set_is_known_by_its_id_in_any_case_and_any_other_is_unknown(tmp_path):
    """known_data.yaml's Hugging Face ids (read here on their own) name their license whatever the case they are
    written in; an id not there, and a file not found, are unknown."""
    from burnout.report.model_card import KNOWN_DATA_FILE, fine_tune_set, pretraining_sets

    known = {entry["name"]: entry["license"] for entry in yaml.safe_load(KNOWN_DATA_FILE.read_text())["hf"]}
    dataset = "HuggingFaceFW/fineweb-edu"
    sources = [{"name": "web", "kind": "hf", "dataset": dataset.upper(), "subset": "sample-10BT"},
               {"name": "mine", "kind": "hf", "dataset": "someone/own-set"},
               {"name": "gone", "kind": "jsonl", "path": str(tmp_path / "gone" / "file.jsonl")}]
    meta = {"data_config": {"sources": sources},
            "sources": {"per_source": {s["name"]: {"kind": s["kind"], "tokens": 10} for s in sources}}}
    web, mine, gone = pretraining_sets(meta, [])
    assert (web.license, web.hf_id) == (known[dataset], dataset.upper())
    assert web.origin == f"hf:{dataset.upper()} (sample-10BT)"
    assert mine.license == UNKNOWN and gone.license == UNKNOWN and gone.origin == "file.jsonl"
    sft = fine_tune_set("SFT", "conversations", "hf:Tatsu-Lab/Alpaca", {"splits": {"train": {"tokens": 5}}}, [])
    assert sft.license == known["tatsu-lab/alpaca"] and sft.tokens == 5
