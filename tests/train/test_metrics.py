"""The step records behind the printed tokens/s, MFU, ETA and dollars: each figure from the logged numbers."""

import pytest

from burnout.config import BudgetConfig, EvalConfig, LogConfig, TrainConfig
from burnout.train.metrics import StepLogger, read_metrics


class _Bar:
    disable = True

    def set_postfix(self, postfix):
        self.postfix = postfix


def _logger(run_dir, price=3.6, **budget) -> tuple[StepLogger, list[str]]:
    lines: list[str] = []
    tc = TrainConfig(log=LogConfig(log_interval=4), eval=EvalConfig(eval_interval=6), budget=BudgetConfig(**budget))
    return StepLogger(run_dir, tc, tokens_per_step=100, flops_per_token=6000.0, peak_flops=1.5e6, price=price,
                      stop_at=10, bar=_Bar(), emit=lines.append), lines


def test_a_record_derives_each_figure_from_the_steps_since_the_last(tmp_path):
    logger, lines = _logger(tmp_path)
    for seconds, positions in ((5.12345, 100), (1.5, 100), (2.55, 300)):  # the first step (compile's) is left out
        logger.count(seconds, positions)
    record = logger.record(3, 2.5, 1e-3, 0.75, elapsed=12.3456, skipped=1)
    elapsed, eta = 12.346, (10 - 3) * (4.05 / 2)  # steps left × the mean seconds of the two measured steps
    assert record == {"step": 3, "tokens": 300, "train_loss": 2.5, "lr": 1e-3, "grad_norm": 0.75,
                      "tokens_per_s": 400 / 4.05, "elapsed_s": elapsed, "skipped_steps": 1, "first_step_s": 5.123,
                      "mfu": 400 / 4.05 * 6000.0 / 1.5e6, "eta_s": 14.2, "dollars": elapsed / 3600 * 3.6,
                      "dollars_projected": (elapsed + eta) / 3600 * 3.6}
    logger.write(record)
    assert lines == ["step 3/10 loss 2.5000 lr 1.00e-03 99 tok/s mfu 39.5% eta 0m14s first step 5.1 s $0.01"]

    # Right after a record no step has been measured: no rate, so no MFU, ETA or projection; the first step's
    # seconds were logged once.
    again = logger.record(4, 2.4, 1e-3, 0.5, elapsed=13.0, skipped=1)
    assert again == {"step": 4, "tokens": 400, "train_loss": 2.4, "lr": 1e-3, "grad_norm": 0.5, "elapsed_s": 13.0,
                     "skipped_steps": 1, "dollars": 13.0 / 3600 * 3.6}
    logger.write(again)
    assert lines[1] == "step 4/10 loss 2.4000 lr 1.00e-03 $0.01"

    # The next window counts only its own steps.
    for seconds in (1.0, 3.0):
        logger.count(seconds, 50)
    third = logger.record(6, 2.3, 1e-3, 0.5, elapsed=17.0, skipped=1)
    assert (third["tokens_per_s"], third["eta_s"]) == (100 / 4.0, (10 - 6) * 2.0)
    logger.close()
    assert [r["step"] for r in read_metrics(tmp_path)] == [3, 4]


def test_a_time_budgets_eta_ends_at_the_budget_when_the_steps_are_slower_than_planned(tmp_path):
    logger, _ = _logger(tmp_path, max_minutes=1.0)
    for seconds in (5.0, 20.0, 20.0):  # 7 steps left at 20 s each would take 140 s; the budget has 60 - 12 left
        logger.count(seconds, 100)
    record = logger.record(3, 2.5, 1e-3, 0.75, elapsed=12.0, skipped=0)
    assert record["eta_s"] == 48.0
    assert record["dollars_projected"] == 60.0 / 3600 * 3.6


def test_only_rank_zero_prices_and_writes_and_no_price_means_no_dollars(tmp_path):
    for run_dir, price in ((None, 3.6), (tmp_path, None)):
        logger, lines = _logger(run_dir, price=price)
        for seconds in (5.0, 2.0, 2.0):
            logger.count(seconds, 100)
        record = logger.record(3, 2.5, 1e-3, 0.75, elapsed=9.0, skipped=0)
        assert record["tokens_per_s"] == 50.0
        assert not {"dollars", "dollars_projected"} & record.keys()
        assert ("mfu" in record) == (run_dir is not None)
        logger.write(record)
        logger.close()
        assert bool(lines) == (run_dir is not None)
    assert len(read_metrics(tmp_path)) == 1


def test_mfu_never_exceeds_one_steps_that_outrun_the_peak_measure_it_again(tmp_path):
    """A step cannot outrun the peak: where one does, the peak was measured in a busy moment. It is measured again,
    the higher kept (never lowered), three times a session at most; where the steps still outrun it, MFU is left
    out of the record and the line, said once, rather than logged above 1."""
    figures, lines = [10e9, 100e9, 150e9], []
    tc = TrainConfig(log=LogConfig(log_interval=1), eval=EvalConfig(eval_interval=100))
    logger = StepLogger(tmp_path, tc, tokens_per_step=100, flops_per_token=1e8, peak_flops=25e9, price=None,
                        stop_at=10, bar=_Bar(), emit=lines.append, measure_peak=lambda: figures.pop(0))
    logger.count(3.0, 100)  # the first step (compile's) is left out
    # Each window one step of 100 tokens: at 500, 200, 500, 2000, 2000, 100 tokens/s, i.e. 50, 20, 50, 200, 200 and
    # 10 GFLOP/s; the peak is 25, then measured at 10 (kept 25), 100 and 150 GFLOP/s.
    records = []
    for step, seconds in enumerate((0.2, 0.5, 0.2, 0.05, 0.05, 1.0), start=2):
        logger.count(seconds, 100)
        records.append(logger.record(step, 2.0, 1e-3, 0.5, elapsed=float(step), skipped=0))
        logger.write(records[-1])
    logger.close()
    assert [r.get("mfu") for r in records] == [None, pytest.approx(0.8), pytest.approx(0.5), None, None,
                                               pytest.approx(10 / 150)]
    assert figures == [] and all("tokens_per_s" in r for r in records)
    assert [line for line in lines if not line.startswith("step ")] == [
        "mfu left out from step 2: the steps ran 50.0 GFLOP/s, above the 25.0 GFLOP/s peak MFU is over (measured "
        "again: other work on this machine slowed the measurements)"]
    assert lines[1] == "step 2/10 loss 2.0000 lr 1.00e-03 500 tok/s eta 0m01s first step 3.0 s"
    assert "mfu" not in read_metrics(tmp_path)[0] and read_metrics(tmp_path)[1]["mfu"] == pytest.approx(0.8)


@pytest.mark.parametrize("step, final, due", [(4, False, True), (6, False, True), (8, False, True), (5, False, False),
                                              (5, True, True), (1, False, False)])
def test_a_record_is_due_at_each_log_interval_each_evaluation_and_the_last_step(tmp_path, step, final, due):
    logger, _ = _logger(tmp_path)
    assert logger.due(step, final) is due
    logger.close()
