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
from burnout.eval.degeneration import summarize
from burnout.eval.evaluate import evaluate_val, token_byte_lengths
from burnout.eval.tasks import DEFAULT_FILES, load_task

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
    assert table in capsys.readouterr().out


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
    assert saved["settings"]["temperature"] == 0.0 and saved["settings"]["seed"] == 0
    table = (run / "compare.md").read_text()
    assert "## def f(x):" in table and table.count("| step_0000010 | 10 |") == 3  # the summary, then each prompt
    for row in saved["rows"]:
        assert row["degeneration"] == summarize(row["continuations"])
        assert (f"| {row['checkpoint']} | {row['step']} | {row['degeneration']['degenerate']} of 2 | "
                f"{row['degeneration']['mean_distinct_3']:.2f} |  |") in table
    # Greedy and seeded: the same command gives the same table.
    main(["compare", str(run), "--prompts", str(prompts), "--checkpoints", "10", "30", "--max-new-tokens", "8",
          "--device", "cpu"])
    assert (run / "compare.md").read_text() == table


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
    assert "batch size must be at least 1, not 0" in error_of(
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
