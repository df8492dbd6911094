"""`burnout bench`: measured training speed of a run config, and the optimization ladder (`--ablate`)."""

from burnout.bench.bench import RUNGS, Setup, ablate, bench, bench_data_dir, format_ablation, format_bench

__all__ = ["RUNGS", "Setup", "ablate", "bench", "bench_data_dir", "format_ablation", "format_bench"]
