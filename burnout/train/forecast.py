"""Where the loss curve is heading: a power law L(D) = E + A·D^(-alpha) in tokens seen D, fitted to
the run's logged losses, with a bootstrap interval. Used at each phase end to price the next one."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# Losses from the first part of a run (warmup, the initial plunge) do not follow the power law.
_SKIP_FRACTION = 0.2
_MIN_POINTS = 6


@dataclass
class PowerLaw:
    E: float
    A: float
    alpha: float

    def __call__(self, tokens) -> np.ndarray:
        return self.E + self.A * np.asarray(tokens, dtype=float) ** -self.alpha


def fit_power_law(tokens, losses, grid: int = 40) -> PowerLaw | None:
    """Least squares in loss space over a grid of floors E; for each E the rest is a line in log-log."""
    d, loss = np.asarray(tokens, dtype=float), np.asarray(losses, dtype=float)
    ok = np.isfinite(loss) & (d > 0)
    d, loss = d[ok], loss[ok]
    if len(d) < 3 or loss.min() <= 0:
        return None
    best, best_sse = None, np.inf
    for E in np.linspace(0.0, 0.98 * loss.min(), grid):
        slope, intercept = np.polyfit(np.log(d), np.log(loss - E), 1)
        if slope >= 0:  # a flat or rising curve has no power-law floor to approach
            continue
        fit = PowerLaw(float(E), float(np.exp(intercept)), float(-slope))
        sse = float(np.sum((fit(d) - loss) ** 2))
        if sse < best_sse:
            best, best_sse = fit, sse
    return best


def forecast_loss(tokens, losses, at_tokens: float, resamples: int = 60, seed: int = 0) -> dict | None:
    """Predicted loss at `at_tokens` with a 10–90% bootstrap interval, or None with too few points."""
    d, loss = np.asarray(tokens, dtype=float), np.asarray(losses, dtype=float)
    keep = d >= _SKIP_FRACTION * d.max() if len(d) else d.astype(bool)
    d, loss = d[keep], loss[keep]
    if len(d) < _MIN_POINTS:
        return None
    fit = fit_power_law(d, loss)
    if fit is None:
        return None
    rng = np.random.default_rng(seed)
    draws = []
    for _ in range(resamples):
        idx = rng.integers(0, len(d), len(d))
        f = fit_power_law(d[idx], loss[idx], grid=20)
        if f is not None:
            draws.append(float(f(at_tokens)))
    low, high = np.percentile(draws, [10, 90]) if draws else (np.nan, np.nan)
    return {"loss": float(fit(at_tokens)), "low": float(low), "high": float(high),
            "fit": {"E": fit.E, "A": fit.A, "alpha": fit.alpha}}
