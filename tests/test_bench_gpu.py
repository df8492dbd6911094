"""benchmarks/bench_gpu.py's records, from a shape's results as its workers return them (no GPU needed): each
figure under its claim, the ratios computed from the two sides."""

from __future__ import annotations

import pytest

from benchmarks.bench_gpu import _record_shape
from burnout.base.files import read_jsonl


def test_a_shapes_figures_are_recorded_under_their_claims(tmp_path, monkeypatch):
    path = tmp_path / "results.jsonl"
    monkeypatch.setenv("BURNOUT_RESULTS", str(path))
    ours = {"batch": 16, "seq": 2048, "tokens_per_s": 77_000.0, "mfu": 0.548, "planned_gib": 62.5, "peak_gib": 61.5}
    row = {"shape": "llama-1b", "ours": {"bf16": ours, "fp8:tensorwise": {"tokens_per_s": 94_710.0}},
           "peer": {"tokens_per_s": 63_000.0}}
    _record_shape(row, 10, 0.3)
    got = {r["claim"]: r["value"] for r in read_jsonl(path)}
    assert got == pytest.approx({"gpu.llama1b.tokens_per_s": 77_000.0, "gpu.llama1b.mfu": 54.8,
                                 "planner.compiled.llama-1b.16x2048": 100 * (62.5 / 61.5 - 1),
                                 "gpu.llama1b.peer_ratio": 77_000 / 63_000, "gpu.fp8_ratio": 1.23})
    assert all(r["load_before"] == 0.3 for r in read_jsonl(path))


def test_a_failed_peer_or_step_records_no_ratio(tmp_path, monkeypatch):
    path = tmp_path / "results.jsonl"
    monkeypatch.setenv("BURNOUT_RESULTS", str(path))
    ours = {"batch": 64, "seq": 512, "tokens_per_s": 540_000.0, "mfu": 0.39, "planned_gib": None, "peak_gib": 14.1}
    _record_shape({"shape": "gpt2-134m", "ours": {"bf16": ours}, "peer": "CUDA out of memory"}, 10, None)
    assert [r["claim"] for r in read_jsonl(path)] == ["gpu.gpt2_134m.tokens_per_s", "gpu.gpt2_134m.mfu"]
    _record_shape({"shape": "gpt2-134m", "ours": {"bf16": "FAILED"}, "peer": {"tokens_per_s": 1.0}}, 10, None)
    assert len(read_jsonl(path)) == 2
