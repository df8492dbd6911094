"""`burnout plan --dollars/--hours` (burnout/train/optimal.py): the FLOPs a budget buys, the shape of least predicted
loss among the candidates (checked against every candidate), its hours and dollars as `burnout plan CONFIG` gives them
for the written config, the published fits labelled with the transfer warning, the data it reads against what is
prepared, and the written config carrying its prediction."""

from __future__ import annotations

import pytest
import yaml

from burnout.base.text import format_count
from burnout.cli import main
from burnout.config import PredictionConfig, load_run_config
from burnout.errors import BurnoutError
from burnout.models.info import model_info
from burnout.runs import continued_config, start_training
from burnout.train import optimal, scaling
from burnout.train.hardware import hardware_table


@pytest.fixture(scope="module")
def blog_budget() -> dict:
    """$175 on one A100 80GB: what the blog's 1B cost."""
    return optimal.budget_plan(optimal.prediction_source(None, None), "a100-80gb", dollars=175)


@pytest.mark.slow
def test_a_dollar_budget_buys_its_flops_and_the_least_predicted_loss(blog_budget):
    entry = hardware_table()["a100-80gb"]
    hours = 175 / entry["price_per_hour"]
    assert blog_budget["flops"] == pytest.approx(hours * 3600 * entry["peak_tflops"]["bf16"] * 1e12 * entry["mfu"])
    law, chosen, seq_len = scaling.PUBLISHED["besiroglu2024"], blog_budget["chosen"], 1024
    # Every candidate at the tokens the budget buys it predicts no less than the chosen one.
    for _, model in optimal.candidates(optimal.DEFAULT_VOCAB, seq_len):
        info = model_info(model, seq_len=seq_len)
        assert law.loss(info["params_total"], blog_budget["flops"] / info["flops_per_token"]) >= chosen["loss"] - 1e-12
    # Near the closed form's N (which counts 6·N FLOPs per token, where the shape's own count is a little more).
    n_closed, _ = law.optimal(blog_budget["flops"])
    assert 0.5 < chosen["params"] / n_closed < 1.5
    # The written config's own plan spends the budget: its tokens are the chosen ones rounded to whole steps.
    phases = blog_budget["planned"]["phases"]
    assert sum(p["dollars"] for p in phases) == pytest.approx(175, rel=0.01)
    assert sum(p["hours"] for p in phases) == pytest.approx(hours, rel=0.01)
    assert blog_budget["tokens"] == pytest.approx(chosen["tokens"], rel=0.01)


@pytest.mark.slow
def test_without_a_ladder_the_prediction_is_the_published_fits_with_the_warning(blog_budget):
    p = blog_budget["prediction"]
    values = [law.loss(p["params"], p["tokens"]) for law in scaling.PUBLISHED.values()]
    assert p["val_loss"] == pytest.approx(scaling.PUBLISHED["besiroglu2024"].loss(p["params"], p["tokens"]))
    assert (p["low"], p["high"]) == (pytest.approx(min(values)), pytest.approx(max(values)))
    text = optimal.format_budget_plan(blog_budget)
    assert "Besiroglu" in text and scaling.TRANSFER_WARNING in text
    assert "data: none named" in text


@pytest.mark.slow
def test_hours_and_dollars_buy_the_same_plan(blog_budget):
    hours = 175 / hardware_table()["a100-80gb"]["price_per_hour"]
    by_hours = optimal.budget_plan(optimal.prediction_source(None, None), "a100-80gb", hours=hours)
    assert by_hours["chosen"]["params"] == blog_budget["chosen"]["params"]
    assert by_hours["steps"] == blog_budget["steps"]


def test_the_data_line_counts_passes(tiny_bpe_data):
    source = optimal.prediction_source(None, tiny_bpe_data)
    have = source["train_tokens"]
    line = optimal.data_line(source, have * 17)
    assert f"you have {format_count(have)} train tokens in {tiny_bpe_data.absolute()}" in line
    assert f"this plan reads {format_count(have * 17)}: 17.0 passes" in line
    # The fresh tokens 17 passes are worth, by the formula's hand computation (16 repeats, R* = 15.39), and the warning.
    fresh = have + have * 15.39 * (1 - 2.718281828459045 ** (-16 / 15.39))
    assert f"worth {format_count(fresh)} fresh ones" in line and "learnt by heart" in line
    two = optimal.data_line(source, have * 2)
    assert "fresh ones" in two and "learnt by heart" not in two
    assert "fresh" not in optimal.data_line(source, have // 2)


def test_a_plan_that_repeats_its_data_is_predicted_the_loss_of_the_fresh_tokens_and_leans_to_a_larger_model():
    law, vocab, seq_len, step = scaling.PUBLISHED["besiroglu2024"], 32000, 1024, 32 * 1024
    flops = 1e19
    plentiful = optimal.choose_shape(law, flops, vocab, seq_len, step, "1e19 FLOPs")
    scarce = optimal.choose_shape(law, flops, vocab, seq_len, step, "1e19 FLOPs", unique=plentiful["tokens"] / 20)
    assert scarce["params"] > plentiful["params"]  # fewer fresh tokens: the compute goes to parameters
    assert scarce["loss"] > plentiful["loss"]
    source = {**optimal.prediction_source(None, None), "train_tokens": 1e10}
    p = optimal.predict_loss(source, 10**9, 10**11)  # ten passes, worth 78B fresh tokens
    assert p["val_loss"] == pytest.approx(float(law.loss(1e9, scaling.fresh_tokens(1e11, 1e10))))
    assert p["val_loss"] > float(law.loss(1e9, 1e11))


@pytest.mark.slow
def test_a_written_config_trains_with_its_prediction(tiny_bpe_data, tmp_path, capsys):
    path = tmp_path / "planned.yaml"
    assert main(["plan", "--hours", "0.001", "--gpu", "t4", "--data", str(tiny_bpe_data), "--write-config",
                 str(path)]) == 0
    out = capsys.readouterr().out
    assert f"wrote {path}" in out and "this plan reads" in out
    # A model this small, on data this small, is far below what the published fits were measured on: no figure, and
    # no prediction section for the run to be held to (test_the_published_fits_predict_only_inside_their_range).
    assert "predicted val loss: none: the published fits were measured on 70M–16B parameters" in out
    cfg = load_run_config(str(path))
    assert cfg.prediction is None and yaml.safe_load(path.read_text())["prediction"] is None
    assert cfg.data.prepared_dir == str(tiny_bpe_data.resolve())
    assert cfg.model.vocab_size == optimal.prediction_source(None, tiny_bpe_data)["vocab"]
    run = tmp_path / "run"
    assert main(["train", str(path), "--out", str(run), "train.max_steps=2"]) == 0


@pytest.mark.slow
def test_the_config_plan_is_as_it_was(capsys):
    assert main(["plan", "llama-tiny", "--gpu", "h100"]) == 0
    out = capsys.readouterr().out
    assert "1 × NVIDIA H100 80GB SXM" in out and "peak memory per device" in out and "predicted val loss" not in out



def test_a_written_config_never_replaces_a_file_and_needs_data(tiny_bpe_data, tmp_path):
    mine = tmp_path / "mine.yaml"
    mine.write_text("mine: true\n")
    with pytest.raises(BurnoutError, match="a file or folder is there already"):
        optimal.check_config_path(mine, optimal.prediction_source(None, tiny_bpe_data))
    with pytest.raises(BurnoutError, match="the run config trains on prepared data"):
        optimal.check_config_path(tmp_path / "new.yaml", optimal.prediction_source(None, None))
    assert mine.read_text() == "mine: true\n"


def test_the_prediction_stays_with_the_run_it_was_made_for(tiny_run_config, tiny_bpe_data, tmp_path):
    """A run grown from a planned run (`burnout grow`), or continued from it with its config (`--init-from`), is
    another run: the prediction, which was for the parent's N and D, is not carried over."""
    cfg = tiny_run_config(max_steps=4, ckpt_interval=4, eval_interval=4)
    cfg.prediction = PredictionConfig(val_loss=6.0, low=5.5, high=6.5, level=0.9, source="ladder", params=1000,
                                      tokens=2000)
    parent = tmp_path / "parent"
    start_training(cfg, parent, data_dir=tiny_bpe_data, on_event=lambda line: None, progress=False)
    assert yaml.safe_load((parent / "config.yaml").read_text())["prediction"]["val_loss"] == 6.0
    assert continued_config(parent, []).prediction is None
    assert main(["grow", str(parent), "--out", str(tmp_path / "grown"), "model.n_layer=3"]) == 0
    assert yaml.safe_load((tmp_path / "grown" / "config.yaml").read_text())["prediction"] is None


def test_the_published_fits_predict_only_inside_their_range():
    source = optimal.prediction_source(None, None)
    inside = optimal.predict_loss(source, 10**9, 2 * 10**10)
    assert inside["val_loss"] == pytest.approx(float(scaling.PUBLISHED["besiroglu2024"].loss(1e9, 2e10)))
    for n, d in ((315_600, 1_058_816), (10**9, 10**9), (10**11, 10**12)):  # too small a model; too few tokens; too big
        p = optimal.predict_loss(source, n, d)
        assert (p["val_loss"], p["low"], p["high"]) == (None, None, None)
        said = optimal.prediction_words(p)
        assert said.startswith("none: the published fits were measured on 70M–16B parameters and 5B–500B tokens")
        assert f"{format_count(n)} parameters × {format_count(d)} tokens lie outside them" in said
    # Tokens read again count as the fresh ones they are worth: 100B read from 100M distinct ones are worth 1.64B
    # (below the fits' 5B), read from 1B distinct ones 16.4B (inside).
    assert optimal.predict_loss({**source, "train_tokens": 10**8}, 10**9, 10**11)["val_loss"] is None
    assert optimal.predict_loss({**source, "train_tokens": 10**9}, 10**9, 10**11)["val_loss"] is not None
