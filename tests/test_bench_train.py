"""benchmarks/bench_train.py's nanoGPT side: the reader of its train.py's log and the writer of its Shakespeare-char
data (what its data/shakespeare_char/prepare.py writes, from a local file)."""

from __future__ import annotations

import pickle

import numpy as np

from benchmarks.bench_train import parse_nanogpt_log, write_nanogpt_char_data


def test_nanogpt_log_gives_each_iterations_seconds_and_skips_its_other_lines():
    # As train.py prints them: its evaluation line, a warning, then one line per iteration.
    seconds = {0: 5.41483, 1: 2.53424, 12: 0.00931}
    log = "\n".join(
        ["step 0: train loss 4.2840, val loss 4.2704",
         "  scaler = torch.cuda.amp.GradScaler(enabled=(dtype == 'float16'))"]
        + [f"iter {i}: loss {4.2 - i / 10:.4f}, time {s * 1000:.2f}ms, mfu {-100.0 if i < 5 else 0.01:.2f}%"
           for i, s in seconds.items()])
    assert parse_nanogpt_log(log) == {i: round(s * 1000, 2) / 1000 for i, s in seconds.items()}


def test_nanogpt_char_data_is_the_text_split_90_10_in_sorted_character_ids(shared_data, tmp_path):
    text_path = shared_data / "tinyshakespeare" / "input.txt"
    write_nanogpt_char_data(text_path, tmp_path / "shakespeare_char")
    text = text_path.read_text()
    with open(tmp_path / "shakespeare_char" / "meta.pkl", "rb") as f:
        meta = pickle.load(f)
    assert [meta["itos"][i] for i in range(meta["vocab_size"])] == sorted(set(text))
    assert all(meta["itos"][i] == ch and meta["stoi"][ch] == i for i, ch in meta["itos"].items())
    split = int(len(text) * 0.9)
    for name, part in (("train.bin", text[:split]), ("val.bin", text[split:])):
        ids = np.fromfile(tmp_path / "shakespeare_char" / name, dtype=np.uint16)
        assert "".join(meta["itos"][i] for i in ids.tolist()) == part


def test_the_pairs_figure_is_the_median_of_the_quiet_pairs_and_none_is_judged_without_one(monkeypatch, capsys):
    """Pairs (ratio, nanoGPT s/iter, ours s/step, quiet): the loud pair's 9x is left out of the median and the range;
    with no quiet pair nothing is judged or recorded."""
    from argparse import Namespace

    from benchmarks import bench_train

    recorded = []
    monkeypatch.setattr(bench_train.results, "record", lambda claim, value, **kw: recorded.append((claim, value, kw)))
    args = Namespace(config="shakespeare-10m", threads=None)
    pairs = [(2.0, 2.0, 1.0, True), (9.0, 9.0, 1.0, False), (2.4, 2.4, 1.0, True), (2.2, 2.2, 1.0, True)]
    bench_train._pairs_summary(args, pairs, [1.9, 2.1, 3.5], {"forward": 0.5, "backward": 0.5})
    out = capsys.readouterr().out
    assert "median of 3 quiet pair(s) of 4: 2.20x (range 2.00-2.40)" in out and "not reached" in out
    assert "where our step's time goes: forward 50.0%, backward 50.0%" in out
    assert [(claim, round(value, 3)) for claim, value, _ in recorded] == [
        ("cpu10m.nanogpt_ratio", 2.2), ("cpu10m.nanogpt_s_per_iter", 2.2), ("cpu10m.ours_s_per_step", 1.0)]
    assert recorded[0][2]["load_during"] == (1.9, 3.5)
    recorded.clear()
    bench_train._pairs_summary(args, [(9.0, 9.0, 1.0, False)], [], {})
    assert "no quiet pair of 1" in capsys.readouterr().out and not recorded
