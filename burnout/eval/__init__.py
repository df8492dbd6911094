"""Evaluation stage: validation loss, HellaSwag / ARC-Easy / LAMBADA scored as lm-eval does, comparison."""
