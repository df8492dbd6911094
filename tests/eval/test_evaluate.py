"""`burnout eval`, `burnout compare`, export → import, task readers and bad input, on a real trained run."""

import bz2
import json
import math
import shutil

import pytest
import torch

from burnout.cli import main
from burnout.core.checkpoint import list_checkpoints, load_checkpoint
from burnout.core.model_files import load_model
from burnout.data.tokenizer import load_tokenizer
from burnout.errors import BurnoutError
from burnout.eval.degeneration import summarize
from burnout.eval.evaluate import evaluate_val, token_byte_lengths
from burnout.eval.tasks import DEFAULT_FILES, load_task
from burnout.runs import start_training
from burnout.train.metrics import read_metrics

CPU = torch.device("cpu")


@pytest.fixture
def run(trained_run, tmp_path):
    """A private copy of the trained run: these tests write into it."""
    return shutil.copytree(trained_run, tmp_path / "run")


def test_eval_all_checkpoints_in_one_command(run, shared_data, capsys):
    assert main(["eval", str(run), "--all-checkpoints", "--limit", "6", "--data-root", str(shared_data),
                 "--device", "cpu"]) == 0
    summary = json.loads((run / "eval" / "summary.json").read_text())["rows"]
    assert [r["step"] for r in summary] == [10, 20, 30]
    for row in summary:
        assert set(row["tasks"]) == {"val", "hellaswag", "arc_easy", "lambada"}
        assert row["tasks"]["hellaswag"]["examples"] == 6
        assert 0 <= row["tasks"]["arc_easy"]["acc_norm"] <= 1
        val = row["tasks"]["val"]
        assert val["perplexity"] == pytest.approx(math.exp(val["loss"]))
        assert (run / "eval" / f"step_{row['step']:07d}.json").is_file()
    # Training lowers the validation loss, and the table shows one row per step.
    assert summary[-1]["tasks"]["val"]["loss"] < summary[0]["tasks"]["val"]["loss"]
    table = (run / "eval" / "summary.md").read_text()
    assert "| step | tokens | val loss" in table and table.count("\n| 10 |") == 1
    assert "Settings (latest row): hellaswag: 0-shot, 6 items; arc_easy: 0-shot, 6 items" in table
    # Published scores beside ours, each model's row with its source: HellaSwag, ARC-Easy and LAMBADA columns.
    assert "| model | parameters | tokens | hellaswag reported | arc_easy acc | arc_easy acc_norm |" in table
    assert "| Pythia-160M | 162M | 300B |  | 0.4352 | 0.3965 |" in table and "160m_step143000.json" in table
    assert table in capsys.readouterr().out


def test_every_published_reference_names_its_source_and_settings():
    from burnout.eval.references import METRICS, load_references

    models = load_references()
    assert {m["name"] for m in models} >= {"Pythia-160M", "Pythia-410M", "Pythia-1B", "GPUburnout-1B"}
    for model in models:
        assert model["source"] and model["settings"] and model["parameters"] and model["tokens"], model["name"]
        for task, scores in model["scores"].items():
            assert scores and set(scores) <= set(METRICS), (model["name"], task)
            for metric, value in scores.items():
                assert value > 1 if metric == "perplexity" else 0 < value < 1, (model["name"], task, metric)


def test_val_loss_and_bits_per_byte_by_hand(trained_run, tiny_bpe_data):
    _, tokenizer, ckpt = load_model(list_checkpoints(trained_run)[-1], CPU)
    result = evaluate_val(ckpt.model, tokenizer, tiny_bpe_data, seq_len=32, limit=5)
    from burnout.data.loader import TokenLoader

    x, y = next(TokenLoader(tiny_bpe_data, "val", batch_size=5, seq_len=32, seed=0).iter_eval_batches(1))
    with torch.no_grad():
        nats = torch.nn.functional.cross_entropy(ckpt.model(x).flatten(0, 1).double(), y.flatten(), reduction="none")
    assert result["tokens"] == 160
    assert result["loss"] == pytest.approx(float(nats.mean()), rel=1e-5)
    # Bytes of the text the targets stand for: decode them (no <|endoftext|>) and count UTF-8 bytes.
    eot = tokenizer.token_to_id("<|endoftext|>")
    text_bytes = sum(len(tokenizer.decode(row.tolist()).encode()) for row in y)
    assert int(token_byte_lengths(tokenizer)[y.flatten()].sum()) == text_bytes
    text_nats = float(nats[y.flatten() != eot].sum())
    assert result["bits_per_byte"] == pytest.approx(text_nats / math.log(2) / text_bytes, rel=1e-5)


def test_compare_writes_the_same_prompts_at_each_checkpoint(run, tmp_path, capsys):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("def f(x):\nThe \n")
    assert main(["compare", str(run), "--prompts", str(prompts), "--checkpoints", "10", "30",
                 "--max-new-tokens", "8", "--device", "cpu"]) == 0
    saved = json.loads((run / "compare.json").read_text())
    assert [r["step"] for r in saved["rows"]] == [10, 30]
    assert saved["prompts"] == ["def f(x):", "The "]
    # Sampled as the blog compared checkpoints (greedy hides progress behind loops), with a fixed seed.
    assert (saved["settings"]["temperature"], saved["settings"]["top_k"], saved["settings"]["seed"]) == (0.8, 50, 0)
    table = (run / "compare.md").read_text()
    assert "## def f(x):" in table and table.count("| step_0000010 | 10 |") == 3  # the summary, then each prompt
    for row in saved["rows"]:
        assert row["degeneration"] == summarize(row["continuations"])
        assert (f"| {row['checkpoint']} | {row['step']} | {row['degeneration']['degenerate']} of 2 | "
                f"{row['degeneration']['mean_distinct_3']:.2f} |  |") in table
    # Seeded: the same command gives the same table.
    main(["compare", str(run), "--prompts", str(prompts), "--checkpoints", "10", "30", "--max-new-tokens", "8",
          "--device", "cpu"])
    assert (run / "compare.md").read_text() == table


def test_compare_takes_a_base_runs_own_sample_prompts_and_says_an_empty_answer(mute_run, tmp_path):
    """Without --prompts a base model's run is compared on its recorded sample prompts (words of its val split); an
    answer its model ended at once is said as such in compare.md, and kept as generated in compare.json."""
    run = shutil.copytree(mute_run[0], tmp_path / "mute")
    prompts = json.loads((run / "sample_prompts.json").read_text())["prompts"]
    assert main(["compare", str(run), "--max-new-tokens", "4", "--device", "cpu"]) == 0
    saved = json.loads((run / "compare.json").read_text())
    assert saved["prompts"] == prompts and len(prompts) == 3
    assert all(row["continuations"] == ["", "", ""] for row in saved["rows"])
    table = (run / "compare.md").read_text()
    for row in saved["rows"]:
        assert f"| {row['checkpoint']} | {row['step']} | {row['tokens'] or ''} | (empty: the model ended the text " \
               "at once) |" in table


def test_export_then_import_round_trip(trained_run, tmp_path):
    transformers = pytest.importorskip("transformers")
    ckpt_path = list_checkpoints(trained_run)[-1]
    assert main(["export", str(ckpt_path), "--to", str(tmp_path / "hf")]) == 0
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32).eval()
    hf_tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    ours = load_checkpoint(ckpt_path).model.eval()
    ids = torch.tensor([hf_tok("def main():\n    return 1")["input_ids"]])
    assert ids.tolist()[0] == load_tokenizer(ckpt_path).encode("def main():\n    return 1").ids
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, ours(ids), atol=1e-4, rtol=0)

    assert main(["import", str(tmp_path / "hf"), "--to", str(tmp_path / "back")]) == 0
    back = load_checkpoint(tmp_path / "back")
    assert back.info["step"] == 0
    for key, value in ours.state_dict().items():
        assert torch.equal(back.model.state_dict()[key], value), key
    assert (back.path / "tokenizer.json").read_text() == (ckpt_path / "tokenizer.json").read_text()
    # The imported checkpoint works with the other commands.
    assert main(["generate", str(tmp_path / "back"), "--prompt", "def ", "--max-new-tokens", "4",
                 "--temperature", "0", "--device", "cpu"]) == 0


def test_bad_input_gives_one_error_line(run, tmp_path, shared_data, capsys):
    def error_of(argv):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("burnout: error: ") and "\n" not in err
        return err

    assert "unknown task 'mmlu'" in error_of(["eval", str(run), "--tasks", "val,mmlu"])
    assert "argument --batch-size: '0' must be at least 1" in error_of(
        ["eval", str(run), "--tasks", "arc_easy", "--data-root", str(shared_data), "--batch-size", "0",
         "--device", "cpu"])
    assert "does not exist" in error_of(["eval", str(run), "--tasks", "arc_easy", "--data-root", str(tmp_path)])
    assert "prompt is" in error_of(["generate", str(run), "--prompt", "x " * 200, "--device", "cpu"])
    assert "not in" in error_of(["compare", str(run), "--checkpoints", "7"])
    assert "no tokenizer.json" in error_of(["import", str(tmp_path), "--to", str(tmp_path / "x")])
    # A checkpoint whose tokenizer (same size, other settings) is not the one its val data was made with.
    tok_path = run / "checkpoints" / "step_0000030" / "tokenizer.json"
    tok_json = json.loads(tok_path.read_text())
    tok_json["pre_tokenizer"]["add_prefix_space"] = True
    tok_path.write_text(json.dumps(tok_json))
    (tok_path.parent / "sha256.json").unlink()  # put together by hand: no sha256 record names the changed file
    assert "another tokenizer" in error_of(["eval", str(run), "--tasks", "val", "--limit", "2"])
    # ... and one with more tokens than the model has embeddings.
    other = load_tokenizer(tok_path)
    other.add_tokens(["zzz-extra-token"])
    other.save(str(tok_path))
    assert "not the one the model was trained with" in error_of(
        ["eval", str(run), "--tasks", "arc_easy", "--data-root", str(shared_data)])


def test_task_readers_accept_the_original_formats(tmp_path, shared_data):
    hs = tmp_path / "hellaswag.jsonl"
    hs.write_text(json.dumps({"activity_label": "Roof shingle removal", "ctx_a": "A man is sitting on a roof.",
                              "ctx_b": "he", "endings": ["is using wrap [title] to wrap.", "b", "c", "d"],
                              "label": "3"}) + "\n")
    (ex,) = load_task("hellaswag", hs)
    assert ex.context == "Roof shingle removal: A man is sitting on a roof. He"
    assert ex.choices[0] == "is using wrap. to wrap." and ex.gold == 3
    assert ex.continuations[1] == " b"

    txt = tmp_path / "hs.txt.bz2"
    with bz2.open(shared_data / DEFAULT_FILES["hellaswag"], "rt") as f:
        head = [next(f) for _ in range(12)]
    txt.write_bytes(bz2.compress("".join(head).encode()))
    first, second = load_task("hellaswag", txt)
    assert first.context == "Roof shingle removal: A man is sitting on a roof. he" and first.gold == 3
    assert len(second.choices) == 4

    arc = tmp_path / "arc.jsonl"
    arc.write_text(
        json.dumps({"question": {"stem": "Which is a gas?", "choices": [{"text": "ice", "label": "A"},
                                                                        {"text": "steam", "label": "B"}]},
                    "answerKey": "B"}) + "\n"
        + json.dumps({"question": "Which is hot?", "choices": {"text": ["sun", "snow"], "label": ["1", "2"]},
                      "answerKey": "1"}) + "\n")
    a, b = load_task("arc_easy", arc)
    assert (a.context, a.choices, a.gold) == ("Question: Which is a gas?\nAnswer:", ("ice", "steam"), 1)
    assert (b.context, b.gold) == ("Question: Which is hot?\nAnswer:", 0)
    local = load_task("arc_easy", shared_data / DEFAULT_FILES["arc_easy"], limit=3)
    assert len(local) == 3 and local[0].context.startswith("Question: ") and local[0].context.endswith("\nAnswer:")

    lam = tmp_path / "lambada.jsonl"
    lam.write_text(json.dumps({"text": "he said hello to his friend Bob"}) + "\n")
    (ex,) = load_task("lambada", lam)
    assert (ex.context, ex.continuations) == ("he said hello to his friend", [" Bob"])
    assert len(load_task("lambada", shared_data / DEFAULT_FILES["lambada"])) == 5153


@pytest.mark.slow
def test_eval_tasks_during_training_equal_burnout_eval_of_the_checkpoint(tiny_run_config, tiny_bpe_data,
                                                                         shared_data, tmp_path, capsys):
    """train.eval_tasks scores at each evaluation what `burnout eval --limit N` scores on that step's
    checkpoint, logs it as eval/TASK/METRIC, prints it, and the report plots it against tokens."""
    cfg = tiny_run_config(["model.context_length=128", "train.eval_tasks=[hellaswag, arc_easy]",
                           "train.eval_task_items=8", f"train.eval_data_root={shared_data}"],
                          max_steps=8, eval_interval=4, ckpt_interval=4)
    run = tmp_path / "run"
    events: list[str] = []
    start_training(cfg, run, data_dir=tiny_bpe_data, on_event=events.append, progress=False)
    logged = [r for r in read_metrics(run) if "eval/hellaswag/acc_norm" in r]
    assert [r["step"] for r in logged] == [4, 8]
    for record in logged:
        assert main(["eval", str(run / "checkpoints" / f"step_{record['step']:07d}"), "--tasks",
                     "hellaswag,arc_easy", "--limit", "8", "--data-root", str(shared_data), "--device", "cpu"]) == 0
        scored = json.loads((run / "eval" / f"step_{record['step']:07d}.json").read_text())["tasks"]
        for task in ("hellaswag", "arc_easy"):
            for metric in ("acc", "acc_norm", "acc_per_token"):
                assert record[f"eval/{task}/{metric}"] == scored[task][metric], (task, metric)
            assert scored[task]["examples"] == 8
    line = next(e for e in events if e.startswith("step 8 eval: "))
    assert f"hellaswag/acc_norm {logged[-1]['eval/hellaswag/acc_norm']:.4f}" in line
    capsys.readouterr()
    assert main(["report", str(run), "--md"]) == 0
    report = (run / "report" / "report.md").read_text()
    assert "train.eval_tasks, the first 8 items of each" in report
    assert "Published scores of public models at comparable sizes" in report and "| Pythia-1B | 1.01B |" in report
    assert (run / "report" / "benchmarks_during_training.png").stat().st_size > 5_000


def test_eval_tasks_refuse_val_fsdp_and_a_missing_file(tiny_run_config, tiny_bpe_data, tmp_path):
    with pytest.raises(BurnoutError, match="val is measured at every evaluation already"):
        tiny_run_config(["train.eval_tasks=[val]"])
    with pytest.raises(BurnoutError, match="not supported under train.distributed=fsdp"):
        tiny_run_config(["train.eval_tasks=[hellaswag]"], distributed="fsdp")
    cfg = tiny_run_config(["train.eval_tasks=[hellaswag]", f"train.eval_data_root={tmp_path}"], max_steps=2)
    with pytest.raises(BurnoutError, match="hellaswag"):
        start_training(cfg, tmp_path / "run", data_dir=tiny_bpe_data, on_event=lambda _: None, progress=False)
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_each_task_shows_a_progress_bar_that_counts_its_items(trained_run, shared_data, capsys, monkeypatch):
    from tqdm import tqdm

    from burnout.eval import evaluate

    closed = {}

    class Recording(tqdm):
        def close(self):
            closed[self.desc.removesuffix(": ")] = (self.n, self.total)
            super().close()

    monkeypatch.setattr(evaluate, "tqdm", Recording)
    model, tokenizer, _ = load_model(trained_run, CPU)
    evaluate.score_plan(model, tokenizer, evaluate.plan_tasks(["arc_easy", "hellaswag"], shared_data), limit=5,
                        progress=True)
    assert closed == {"arc_easy": (5, 5), "hellaswag": (5, 5)}  # items, not their 4 choices' requests
    assert "hellaswag:   0%|          | 0/5" in capsys.readouterr().err


def test_eval_says_each_tasks_chance_level_beside_its_accuracy(run, shared_data, tmp_path, capsys):
    """The chance level is the accuracy of a uniform guess, from the task's own items: the mean of 1 / choices
    (ARC-Easy's four: 0.25; a task of two- and three-choice items: 5/12). A language-modelling task has none."""
    mine = tmp_path / "mine.jsonl"
    mine.write_text("".join(json.dumps({"query": f"Is {i} even?", "choices": ["yes", "no", "maybe"][:2 + i % 2],
                                        "gold": i % 2}) + "\n" for i in range(4)))
    assert main(["eval", str(run), "--tasks", "arc_easy,lambada", "--limit", "6", "--data-root", str(shared_data),
                 "--task", f"mine={mine}", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    arc = [json.loads(line) for line in (shared_data / "arc" / "arc_easy_test.jsonl").read_text().splitlines()[:6]]
    expected = {"arc_easy": sum(1 / len(r["choices"]) for r in arc) / len(arc), "mine": (1 / 2 + 1 / 3) / 2}
    record = json.loads((run / "eval" / "step_0000030.json").read_text())
    for task, chance in expected.items():
        assert record["tasks"][task]["chance"] == pytest.approx(chance)
        acc = record["tasks"][task]["acc"]
        assert f"step 30: {task} acc {acc:.4f} (chance {chance:.4f})," in out
    lambada_line = out.split("step 30: lambada")[1].splitlines()[0]
    assert "chance" not in record["tasks"]["lambada"] and "(chance" not in lambada_line
    assert f"Chance level, the acc of a uniform guess among each item's choices: arc_easy {expected['arc_easy']:.4f}, "\
           f"mine {expected['mine']:.4f}\n" in out
