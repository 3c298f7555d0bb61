"""Evaluation metrics for calibrated predictions of human answers.

Regression-style agreement (RMSE, Pearson, Spearman, Kendall — the columns of
LLM-Rubric's Table 1), the RMSE floor a predictor with correlation r cannot
beat, smooth ECE (Błasiok & Nakkiran 2023, via ``relplot``), and a percentile
bootstrap for confidence intervals; for rates of binary events (ABC-Eval's
behaviours per turn) the Wilson interval and the two-proportion z-test.

Calibration of a K-option question is reduced to K binary problems
(one-vs-rest): for option k the forecast is p̂(y = k) and the outcome is
1[y = k]; `smece_one_vs_rest` returns each option's smECE and `smece_multiclass`
their mean. This is how LLM-Rubric reports calibration (one curve per answer
value).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from scorers.errors import UserError

DEFAULT_BOOTSTRAP_SAMPLES = 1000
DEFAULT_CI_LEVEL = 0.95


class MetricError(UserError, ValueError):
    """Inputs a metric cannot be computed on (mismatched lengths, empty, out of range)."""


def _pair(y: ArrayLike, yhat: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    a = np.asarray(y, dtype=np.float64).reshape(-1)
    b = np.asarray(yhat, dtype=np.float64).reshape(-1)
    if a.shape != b.shape:
        raise MetricError(f"y and yhat differ in length: {a.size} vs {b.size}")
    if a.size == 0:
        raise MetricError("need at least one value")
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
        raise MetricError("values must be finite")
    return a, b


def rmse(y: ArrayLike, yhat: ArrayLike) -> float:
    """Root mean squared error."""
    a, b = _pair(y, yhat)
    return float(np.sqrt(np.mean((a - b) ** 2)))


def _constant(a: np.ndarray) -> bool:
    return bool(np.all(a == a[0]))


def _correlation(test: Callable[..., Any], y: ArrayLike, yhat: ArrayLike) -> float:
    a, b = _pair(y, yhat)
    if a.size < 2 or _constant(a) or _constant(b):
        return math.nan  # undefined for a constant side
    return float(test(a, b).statistic)


# scipy.stats is imported where it is used: importing it takes ~1 s, and most commands and the service never need it.
def pearson(y: ArrayLike, yhat: ArrayLike) -> float:
    """Pearson correlation; NaN when either side is constant (correlation undefined)."""
    from scipy import stats

    return _correlation(stats.pearsonr, y, yhat)


def spearman(y: ArrayLike, yhat: ArrayLike) -> float:
    """Spearman rank correlation; NaN when either side is constant."""
    from scipy import stats

    return _correlation(stats.spearmanr, y, yhat)


def kendall(y: ArrayLike, yhat: ArrayLike) -> float:
    """Kendall's tau-b (scipy's default, handles ties); NaN when either side is constant."""
    from scipy import stats

    return _correlation(stats.kendalltau, y, yhat)


def rmse_lower_bound(y: ArrayLike, r: float) -> float:
    """SD(y)·√(1−r²): no affine function of a predictor with correlation r gets a lower RMSE.

    SD is the population standard deviation (ddof=0), matching RMSE's 1/n.
    """
    a = np.asarray(y, dtype=np.float64).reshape(-1)
    if a.size == 0:
        raise MetricError("need at least one value")
    if math.isnan(r):
        r = 0.0
    if not -1.0 <= r <= 1.0:
        raise MetricError(f"correlation must be in [-1, 1], got {r}")
    return float(np.std(a) * math.sqrt(1.0 - r * r))


def agreement(y: ArrayLike, yhat: ArrayLike) -> dict[str, float]:
    """RMSE, Pearson, Spearman, Kendall and the RMSE bound at the measured Pearson r."""
    r = pearson(y, yhat)
    return {
        "rmse": rmse(y, yhat),
        "rmse_bound": rmse_lower_bound(y, r),
        "pearson": r,
        "spearman": spearman(y, yhat),
        "kendall": kendall(y, yhat),
    }


def auroc(scores: ArrayLike, positive: ArrayLike) -> float:
    """P(score of a random positive > score of a random negative), ties counting half; NaN with one class."""
    s, flags = np.asarray(scores, dtype=np.float64), np.asarray(positive, dtype=bool)
    pos, neg = s[flags], s[~flags]
    if len(pos) == 0 or len(neg) == 0:
        return math.nan
    greater = (pos[:, None] > neg[None, :]).mean()
    ties = (pos[:, None] == neg[None, :]).mean()
    return float(greater + 0.5 * ties)


def average_precision(scores: ArrayLike, positive: ArrayLike) -> float:
    """Average precision of ranking by ``scores`` (highest first) for the positives: the mean, over positives, of the
    precision among the conversations scoring at least as high (ties count together); NaN without positives."""
    s, flags = np.asarray(scores, dtype=np.float64), np.asarray(positive, dtype=bool)
    if not flags.any():
        return math.nan
    # for each positive: positives and all items with score >= its score
    at_least = (s[None, :] >= s[flags][:, None]).sum(axis=1)
    positives_at_least = (s[flags][None, :] >= s[flags][:, None]).sum(axis=1)
    return float(np.mean(positives_at_least / at_least))


def smece(forecasts: ArrayLike, outcomes: ArrayLike) -> float:
    """Smooth ECE of binary forecasts in [0, 1] against 0/1 outcomes (``relplot.smECE``)."""
    o, f = _pair(outcomes, forecasts)
    if np.any((f < 0) | (f > 1)):
        raise MetricError("forecasts must be probabilities in [0, 1]")
    if np.any((o != 0) & (o != 1)):
        raise MetricError("outcomes must be 0 or 1")
    import relplot  # imports scikit-learn (~3 s): only where smooth ECE is computed, not in every worker

    return float(relplot.smECE(f, o))


def smece_one_vs_rest(probabilities: ArrayLike, answers: ArrayLike) -> list[float]:
    """smECE of p̂(y = k) against 1[y = k], for each option k (answers are 1..K)."""
    p = np.asarray(probabilities, dtype=np.float64)
    y = np.asarray(answers).reshape(-1)
    if p.ndim != 2 or p.shape[0] != y.size:
        raise MetricError(f"probabilities must be (n, K) with n = len(answers); got {p.shape} and {y.size}")
    n_options = p.shape[1]
    if np.any((y < 1) | (y > n_options)) or np.any(y != np.round(y)):
        raise MetricError(f"answers must be whole numbers in 1..{n_options}")
    return [smece(p[:, k], (y == k + 1).astype(np.float64)) for k in range(n_options)]


def smece_multiclass(probabilities: ArrayLike, answers: ArrayLike) -> float:
    """Mean over options of the one-vs-rest smECE."""
    return float(np.mean(smece_one_vs_rest(probabilities, answers)))


@dataclass(frozen=True)
class ConfidenceInterval:
    """A point estimate with a percentile-bootstrap interval."""

    estimate: float
    low: float
    high: float
    level: float

    def as_dict(self) -> dict[str, float]:
        return {"estimate": self.estimate, "low": self.low, "high": self.high, "level": self.level}


def bootstrap_ci(
    metric: Callable[..., float],
    *arrays: ArrayLike,
    n_samples: int = DEFAULT_BOOTSTRAP_SAMPLES,
    level: float = DEFAULT_CI_LEVEL,
    seed: int = 0,
    groups: Sequence | None = None,
) -> ConfidenceInterval:
    """Percentile bootstrap CI of ``metric(*arrays)``, resampling rows with replacement.

    With ``groups`` (e.g. conversation ids) whole groups are resampled, which
    keeps correlated rows together. Resamples where the metric is NaN (e.g. a
    constant resample for a correlation) are skipped.
    """
    cols = [np.asarray(a) for a in arrays]
    if not cols:
        raise MetricError("bootstrap_ci needs at least one array")
    n = len(cols[0])
    if any(len(c) != n for c in cols):
        raise MetricError("arrays differ in length")
    if n == 0:
        raise MetricError("need at least one row")
    if not 0 < level < 1:
        raise MetricError(f"level must be in (0, 1), got {level}")
    rng = np.random.default_rng(seed)
    if groups is None:
        members = [np.array([i]) for i in range(n)]
    else:
        g = np.asarray(groups)
        if len(g) != n:
            raise MetricError("groups differs in length from the arrays")
        _, inverse = np.unique(g, return_inverse=True)
        members = [np.flatnonzero(inverse == k) for k in range(inverse.max() + 1)]
    values = []
    for _ in range(n_samples):
        pick = rng.integers(0, len(members), size=len(members))
        idx = np.concatenate([members[k] for k in pick])
        v = metric(*(c[idx] for c in cols))
        if not math.isnan(v):
            values.append(v)
    if not values:
        raise MetricError("the metric was NaN on every bootstrap sample")
    tail = (1 - level) / 2
    lo, hi = np.quantile(values, [tail, 1 - tail])
    return ConfidenceInterval(estimate=float(metric(*cols)), low=float(lo), high=float(hi), level=level)


def wilson_interval(hits: int, n: int, level: float = DEFAULT_CI_LEVEL) -> ConfidenceInterval:
    """The rate ``hits / n`` with its Wilson score interval (good at rates near 0 and small n)."""
    if n <= 0 or not 0 <= hits <= n:
        raise MetricError(f"need 0 <= hits <= n and n > 0, got hits={hits}, n={n}")
    if not 0 < level < 1:
        raise MetricError(f"level must be in (0, 1), got {level}")
    z = NormalDist().inv_cdf(0.5 + level / 2)
    rate = hits / n
    centre = (rate + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(rate * (1 - rate) / n + z * z / (4 * n * n))
    low = 0.0 if hits == 0 else max(0.0, centre - half)  # exact at the ends, where rounding leaves ~1e-17
    high = 1.0 if hits == n else min(1.0, centre + half)
    return ConfidenceInterval(estimate=rate, low=low, high=high, level=level)


def clustered_rate(hits: ArrayLike, turns: ArrayLike, weights: ArrayLike | None = None) -> tuple[float, float]:
    """A per-turn rate over conversations and its variance, counting each conversation as one draw.

    ``hits[i]`` and ``turns[i]`` are conversation i's hits and turns, ``weights[i]`` its 1/π (1 without
    sampling). The rate is R = Σ w·h / Σ w·t and its linearised variance Σ w²·(h - R·t)² / (Σ w·t)²: what the
    behaviour-rise alert computes from the ``convowatch_behaviour_*_variance_total`` counters. Unlike the binomial
    p(1-p)/n it stays honest when a conversation's turns show a behaviour together."""
    h, t = np.asarray(hits, dtype=float), np.asarray(turns, dtype=float)
    w = np.ones_like(t) if weights is None else np.asarray(weights, dtype=float)
    if h.shape != t.shape or w.shape != t.shape or h.ndim != 1:
        raise MetricError(f"hits, turns and weights must be 1-d and of one length, got {h.shape}, {t.shape}, {w.shape}")
    total = float(np.sum(w * t))
    if total <= 0 or np.any(h < 0) or np.any(h > t) or np.any(w <= 0):
        raise MetricError("need 0 <= hits <= turns, weights > 0 and at least one turn")
    r = float(np.sum(w * h)) / total
    return r, float(np.sum((w * (h - r * t)) ** 2)) / total**2


def two_proportion_z(hits_a: int, n_a: int, hits_b: int, n_b: int) -> tuple[float, float]:
    """z and the one-sided p-value that rate b exceeds rate a (pooled standard error); (0, 1) if no variance."""
    if n_a <= 0 or n_b <= 0 or not 0 <= hits_a <= n_a or not 0 <= hits_b <= n_b:
        raise MetricError(f"need 0 <= hits <= n and n > 0, got {hits_a}/{n_a} and {hits_b}/{n_b}")
    pooled = (hits_a + hits_b) / (n_a + n_b)
    se = math.sqrt(pooled * (1 - pooled) * (1 / n_a + 1 / n_b))
    if se == 0:
        return 0.0, 1.0
    z = (hits_b / n_b - hits_a / n_a) / se
    return z, 0.5 * math.erfc(z / math.sqrt(2))  # the standard normal's survival function at z
