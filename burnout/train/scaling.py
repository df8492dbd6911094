"""The scaling law L(N, D) = E + A/N^alpha + B/D^beta: a model's final loss from its parameters N and its training
tokens D, fitted to a ladder of small runs, and what a compute budget C buys under it.

The fit is Hoffmann et al. 2022's third approach as Besiroglu et al. 2024 redid it: the Huber loss (delta 1e-3) of
log L against log(exp(a - alpha·log N) + exp(b - beta·log D) + exp(e)) (A = e^a, B = e^b, E = e^e), minimised by
L-BFGS from the best starts of a grid over (a, b, e, alpha, beta); scaled so that L-BFGS does not stop early (their
finding about the original fit). Its uncertainty is a bootstrap over the rungs (each sample a refit on rungs drawn with
replacement); a prediction's interval combines the bootstrap's spread with the fit's own scatter (a new run has its
own noise). Its error is measured by fitting the smaller rungs alone and predicting the largest (`held_out_error`).

Tokens read more than once are worth fewer fresh ones: L is evaluated at the fresh tokens they are worth
(`fresh_tokens`, Muennighoff et al. 2023), on a ladder's rungs and in a plan alike, so a plan that reads its data many
times is predicted the loss of fewer tokens.

The published fits (PUBLISHED) are for their data and tokenizer (MassiveText, SentencePiece): a loss in nats per token
does not transfer between data sets and tokenizers (TRANSFER_WARNING), so they are a shape, not a prediction.
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np
from scipy.optimize import minimize
from scipy.special import huber, logsumexp, softmax

from burnout.base.text import format_count

# Chinchilla's Huber threshold on log-loss residuals.
HUBER_DELTA = 1e-3
# The grid of starts (Hoffmann et al.'s): every combination is scored, L-BFGS starts from the best few.
GRID = {"alpha": (0.0, 0.5, 1.0, 1.5, 2.0), "beta": (0.0, 0.5, 1.0, 1.5, 2.0), "e": (-1.0, -0.5, 0.0, 0.5, 1.0),
        "a": (0.0, 5.0, 10.0, 15.0, 20.0, 25.0), "b": (0.0, 5.0, 10.0, 15.0, 20.0, 25.0)}
# Exponents outside this range are not a scaling law but a degenerate fit (alpha 0 merges A into E); nor is an
# irreducible loss below E_FLOOR nats, where a fit of too few tokens drifts (E → 0 flattens the objective in E, and
# L-BFGS spends hundreds of iterations there).
EXPONENT_BOUNDS = (1e-3, 3.0)
E_FLOOR = 0.1
FIT_STARTS = 8
# A bootstrap refit starts from the fit of all the points and from the best point of the grid.
BOOTSTRAP_STARTS = 1
BOOTSTRAP_SAMPLES = 100
MAX_ITERATIONS = 1000
INTERVAL_LEVEL = 0.9  # a prediction's interval: the 5th to the 95th percentile
# Training FLOPs per parameter per token of a dense transformer (forward 2, backward 4): C ≈ 6·N·D.
FLOPS_PER_PARAM_TOKEN = 6.0
# Muennighoff et al. 2023 (Scaling Data-Constrained Language Models): D tokens read from U unique ones are worth
# D' = U + U·R*·(1 − e^(−R/R*)) fresh ones, R = D/U − 1 the repeats; their fitted R* (repeats at which a repeat's worth
# has fallen to 1/e).
REPEAT_SCALE = 15.39
TRANSFER_WARNING = ("a published fit was measured on its authors' data and tokenizer: a loss in nats per token does "
                    "not transfer between data sets and tokenizers, so its figure is the law's shape, not a prediction "
                    "for your data; `burnout ladder` fits yours")


@dataclasses.dataclass(frozen=True)
class ScalingLaw:
    """L(N, D) = E + A/N^alpha + B/D^beta; `label` says where the parameters come from."""
    E: float
    A: float
    alpha: float
    B: float
    beta: float
    label: str = ""

    def loss(self, n, d, unique: float | None = None):
        """The predicted loss of N parameters trained on D tokens (numbers or arrays), read from `unique` distinct
        ones when given (the fresh tokens they are worth: `fresh_tokens`)."""
        return self.E + self.A / np.power(n, self.alpha) + self.B / np.power(fresh_tokens(d, unique), self.beta)

    def optimal(self, flops: float, flops_per_param_token: float = FLOPS_PER_PARAM_TOKEN) -> tuple[float, float]:
        """(N, D) of the least loss for `flops` = k·N·D (Hoffmann et al.'s closed form): N = G·(C/k)^(beta/(alpha+
        beta)), G = (alpha·A / (beta·B))^(1/(alpha+beta)). A shape's own FLOPs per token (models/info.py) replace k·N
        where the shape is known (train/optimal.py)."""
        s = self.alpha + self.beta
        g = (self.alpha * self.A / (self.beta * self.B)) ** (1 / s)
        n = g * (flops / flops_per_param_token) ** (self.beta / s)
        return n, flops / flops_per_param_token / n

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, raw: dict) -> ScalingLaw:
        return cls(**{f.name: raw[f.name] for f in dataclasses.fields(cls) if f.name in raw})


PUBLISHED = {
    "hoffmann2022": ScalingLaw(1.69, 406.4, 0.34, 410.7, 0.28,
                               "Hoffmann et al. 2022 (Chinchilla), approach 3; MassiveText, their tokenizer"),
    "besiroglu2024": ScalingLaw(1.82, 482.01, 0.3478, 2085.43, 0.3658,
                                "Besiroglu et al. 2024's replication of Hoffmann et al.'s approach 3; MassiveText"),
}
# The models those fits were measured on (Hoffmann et al.: 70M to 16B parameters, 5B to 500B tokens): outside them a
# published fit is not stated as a prediction at all (at 316K parameters × 1M tokens it says 20.8 nats, more than a
# uniform guess over a 4,096-token vocabulary, 8.3).
PUBLISHED_RANGE = {"params": (7e7, 1.6e10), "tokens": (5e9, 5e11)}


def outside_published_range(n: float, d: float) -> str | None:
    """Why N parameters × D tokens lie outside PUBLISHED_RANGE, in words; None inside it."""
    (n_low, n_high), (d_low, d_high) = PUBLISHED_RANGE["params"], PUBLISHED_RANGE["tokens"]
    if n_low <= n <= n_high and d_low <= d <= d_high:
        return None
    return (f"the published fits were measured on {n_low / 1e6:.0f}M–{n_high / 1e9:.0f}B parameters and "
            f"{d_low / 1e9:.0f}B–{d_high / 1e9:.0f}B tokens, and {format_count(n)} parameters × {format_count(d)} "
            "tokens lie outside them")


def _objective(theta: np.ndarray, log_n: np.ndarray, log_d: np.ndarray, log_l: np.ndarray) -> tuple[float, np.ndarray]:
    """The mean Huber loss of the log residuals over delta² (so that values are of order one and L-BFGS's relative
    tolerance does not stop it early), and its gradient in theta = (a, b, e, alpha, beta)."""
    a, b, e, alpha, beta = theta
    terms = np.stack([a - alpha * log_n, b - beta * log_d, np.full_like(log_n, e)])
    r = logsumexp(terms, axis=0) - log_l
    scale = HUBER_DELTA**2 * len(r)
    value = huber(HUBER_DELTA, r).sum() / scale
    w = softmax(terms, axis=0) * (np.clip(r, -HUBER_DELTA, HUBER_DELTA) / scale)
    grad = np.array([w[0].sum(), w[1].sum(), w[2].sum(), -(w[0] * log_n).sum(), -(w[1] * log_d).sum()])
    return value, grad


def _grid_starts(log_n: np.ndarray, log_d: np.ndarray, log_l: np.ndarray, keep: int) -> np.ndarray:
    """The `keep` grid points of least objective, rows of (a, b, e, alpha, beta), scored at once."""
    grid = np.array(list(itertools.product(GRID["a"], GRID["b"], GRID["e"], GRID["alpha"], GRID["beta"])))
    a, b, e, alpha, beta = (grid[:, i:i + 1] for i in range(5))
    r = np.logaddexp(np.logaddexp(a - alpha * log_n, b - beta * log_d), e) - log_l
    scores = huber(HUBER_DELTA, r).sum(axis=1)
    return grid[np.argsort(scores, kind="stable")[:keep]]


def fit(n, d, loss, starts: int = FIT_STARTS, label: str = "fitted", start: ScalingLaw | None = None) -> ScalingLaw:
    """The law of least Huber loss through the points (n[i], d[i], loss[i]): L-BFGS-B from the `starts` best points
    of GRID (and from `start`, a law, when given), exponents bounded to EXPONENT_BOUNDS and E to E_FLOOR or more.
    Deterministic: the same points give the same law."""
    log_n, log_d, log_l = (np.log(np.asarray(x, dtype=float)) for x in (n, d, loss))
    if len(log_l) < 5:
        raise ValueError(f"a fit of five parameters needs at least five points; got {len(log_l)}")
    bounds = [(None, None)] * 2 + [(math.log(E_FLOOR), None)] + [EXPONENT_BOUNDS] * 2
    low, high = [b[0] if b[0] is not None else -np.inf for b in bounds], [b[1] or np.inf for b in bounds]
    x0s = list(_grid_starts(log_n, log_d, log_l, starts))
    if start is not None:
        x0s.insert(0, np.log([start.A, start.B, start.E]).tolist() + [start.alpha, start.beta])
    best = None
    for x0 in x0s:
        result = minimize(_objective, np.clip(x0, low, high), args=(log_n, log_d, log_l), jac=True,
                          method="L-BFGS-B", bounds=bounds,
                          options={"ftol": 1e-14, "gtol": 1e-10, "maxiter": MAX_ITERATIONS})
        if best is None or result.fun < best.fun:
            best = result
    a, b, e, alpha, beta = best.x
    return ScalingLaw(float(math.exp(e)), float(math.exp(a)), float(alpha), float(math.exp(b)), float(beta), label)


def bootstrap(n, d, loss, samples: int = BOOTSTRAP_SAMPLES, seed: int = 0,
              start: ScalingLaw | None = None) -> list[ScalingLaw]:
    """Laws fitted to `samples` resamplings of the points (drawn with replacement, each with at least five distinct
    points), from a seeded generator: the same points and seed give the same laws. Each refit starts from `start`
    (the fit of all the points; fitted here when not given) and from the grid's best point."""
    n, d, loss = (np.asarray(x, dtype=float) for x in (n, d, loss))
    start = start or fit(n, d, loss)
    rng = np.random.default_rng(seed)
    laws = []
    while len(laws) < samples:
        pick = rng.integers(0, len(loss), len(loss))
        if len(set(pick.tolist())) >= 5:
            laws.append(fit(n[pick], d[pick], loss[pick], starts=BOOTSTRAP_STARTS, label="bootstrap", start=start))
    return laws


def fresh_tokens(d, unique: float | None):
    """The fresh tokens D tokens read from `unique` distinct ones are worth (REPEAT_SCALE's formula); D itself when
    `unique` is None (not known) or D ≤ unique (one pass or less)."""
    d = np.asarray(d, dtype=float)
    if unique is None:
        return d
    repeats = np.maximum(d / unique - 1.0, 0.0)
    return np.minimum(d, unique) + unique * REPEAT_SCALE * -np.expm1(-repeats / REPEAT_SCALE)


def log_residuals(law: ScalingLaw, n, d, loss) -> np.ndarray:
    """log(observed) − log(predicted) at each point."""
    return np.log(np.asarray(loss, dtype=float)) - np.log(law.loss(np.asarray(n, float), np.asarray(d, float)))


def predict(law: ScalingLaw, samples: list[ScalingLaw], residuals: np.ndarray, n: float, d: float,
            unique: float | None = None, level: float = INTERVAL_LEVEL, seed: int = 0) -> dict:
    """The law's loss at (n, d) and its `level` interval: each bootstrap law's prediction times exp of a residual
    drawn from the fit's (inflated by sqrt(points / (points − 5)) for the five parameters fitted), percentiles of
    those. The interval is the parameters' uncertainty and a run's own scatter about the law together."""
    points = len(residuals)
    spread = np.asarray(residuals, float) * math.sqrt(points / max(1, points - 5))
    rng = np.random.default_rng(seed)
    draws = np.array([s.loss(n, d, unique) for s in samples]) * np.exp(rng.choice(spread, size=len(samples)))
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(draws, [tail, 100 - tail])
    central = float(law.loss(n, d, unique))
    return {"val_loss": central, "low": float(min(low, central)), "high": float(max(high, central)), "level": level}


def held_out_error(n, d, loss, compute, held_out: int) -> dict:
    """The fit's own error: the law fitted to all but the `held_out` points of most compute, and its relative error
    (predicted − observed) / observed on those held-out points alone."""
    n, d, loss, compute = (np.asarray(x, dtype=float) for x in (n, d, loss, compute))
    order = np.argsort(compute, kind="stable")
    kept, out = order[:len(order) - held_out], order[len(order) - held_out:]
    law = fit(n[kept], d[kept], loss[kept], label="fitted to the smaller rungs")
    rows = [{"index": int(i), "N": float(n[i]), "D": float(d[i]), "loss": float(loss[i]),
             "predicted": float(law.loss(n[i], d[i])),
             "error": float((law.loss(n[i], d[i]) - loss[i]) / loss[i])} for i in out]
    return {"law": law.to_dict(), "fitted_on": [int(i) for i in kept], "held_out": rows,
            "mean_abs_error": float(np.mean([abs(r["error"]) for r in rows]))}
