"""Evaluation stage: validation loss, benchmarks and in-context-learning suites scored as lm-evaluation-harness
scores them, any lm-eval task through our engine (`--harness`), and the same prompts across checkpoints."""
