"""Rates from a biased judge and a few human labels: prediction-powered inference (PPI++).

A judge labels every stored conversation, humans a random few. The judge's rate is biased (on ABC-Eval GPT-3.5 says
*ignore* on 43 % of bot turns where humans say 10 %); the humans' rate alone is unbiased but wide. PPI
(Angelopoulos et al., Science 2023) with power tuning (PPI++, Angelopoulos, Duchi & Zrnic 2023) combines them:

    θ̂(λ) = λ · judge rate on all stored  +  (human rate − λ · judge rate) on the labelled,

unbiased for any λ because the labelled are a random sample of the stored; λ is chosen to minimise the variance, so
the interval is never (asymptotically) wider than the labels' alone, and narrower as far as the judge tracks the
humans. λ = 0 is the labels-only estimate. (With the judge's answer known on every conversation of the window,
this is survey sampling's regression estimator; PPI's own form, with an unlabelled set drawn apart, is the same
with the judge side's variance over that set.)

The population is the conversations of a window (each stored conversation standing for 1/π of the traffic when
``sampling`` stores a share): units are conversations or bot turns, the draws are *conversations*, so a
conversation's units count together. Each side is a ratio estimate Σ w·value / Σ w·units with the linearised
variance of `scorers.statistics.clustered_rate`, the n/(n-1) small-sample factor and the finite-population factor
1 − n/N (labelling every conversation leaves no doubt); the humans' side with Agresti & Coull's plus four, so a
sample without a hit still has an interval. Weights are Horvitz–Thompson 1/π: a labelled
conversation's is its store weight times 1/(its probability to be drawn for review). The interval is the
normal one at ``level``, with Student's t quantile for the number of labelled conversations.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike

from scorers.statistics import DEFAULT_CI_LEVEL, MetricError

Method = Literal["ppi", "labels", "judge"]


@dataclass(frozen=True)
class Conversations:
    """Per conversation: the sum of a value over its units (hits, or P(dsat)), its units and its weight 1/π."""

    values: np.ndarray
    units: np.ndarray
    weights: np.ndarray

    @classmethod
    def of(cls, values: ArrayLike, units: ArrayLike | None = None, weights: ArrayLike | None = None) -> Conversations:
        """Check and hold the arrays (units and weights default to 1: one unit per conversation, no sampling)."""
        v = np.asarray(values, dtype=float)
        u = np.ones_like(v) if units is None else np.asarray(units, dtype=float)
        w = np.ones_like(v) if weights is None else np.asarray(weights, dtype=float)
        if v.ndim != 1 or u.shape != v.shape or w.shape != v.shape:
            raise MetricError(f"values, units and weights must be 1-d and of one length, got {v.shape}, {u.shape}, {w.shape}")
        if not (np.all(np.isfinite(v)) and np.all(u > 0) and np.all(w > 0) and np.all(np.isfinite(w))):
            raise MetricError("values must be finite, units and weights > 0")
        return cls(v, u, w)

    def __len__(self) -> int:
        return int(self.values.size)


@dataclass(frozen=True)
class Labelled:
    """The conversations humans labelled (a random draw from the stored ones): per conversation the humans' and the
    judge's sums over its units, its units, its store weight and its label weight (1/π of being drawn)."""

    human: Conversations
    judge: Conversations
    label_weights: np.ndarray

    @classmethod
    def of(
        cls,
        human: ArrayLike,
        judge: ArrayLike,
        label_weights: ArrayLike,
        units: ArrayLike | None = None,
        store_weights: ArrayLike | None = None,
    ) -> Labelled:
        """Check and hold the arrays (units and store weights default to 1). ``label_weights`` have no default: they
        are what makes the estimate unbiased, and they set the finite-population factor."""
        h = Conversations.of(human, units, store_weights)
        lw = np.asarray(label_weights, dtype=float)
        if lw.shape != h.values.shape or not np.all(lw >= 1) or not np.all(np.isfinite(lw)):
            raise MetricError("label_weights must be 1/π >= 1, one per labelled conversation")
        both = Conversations(h.values, h.units, h.weights * lw)
        return cls(both, Conversations.of(judge, h.units, both.weights), lw)

    def __len__(self) -> int:
        return len(self.human)


@dataclass(frozen=True)
class RateEstimate:
    """A rate with its interval, how it was made, and on how many conversations."""

    estimate: float
    low: float  # the interval, cut to [0, 1]
    high: float
    standard_error: float
    level: float
    method: Method  # ppi: judge and labels; labels: the labelled alone; judge: the judge's raw rate, no interval
    labelled: int  # conversations with human labels
    judged: int  # conversations the judge labelled (the labelled among them)
    tuning: float  # PPI++'s λ (0 = labels alone)
    judge_rate: float | None  # the judge's raw rate on all its conversations, shown beside


def _linearised(c: Conversations) -> tuple[float, np.ndarray]:
    """The ratio estimate and each conversation's linearised contribution to its error (they sum to 0)."""
    total = float(np.sum(c.weights * c.units))
    rate = float(np.sum(c.weights * c.values)) / total
    return rate, c.weights * (c.values - rate * c.units) / total


def _variance_factor(n: int, weights: np.ndarray) -> float:
    """n/(n-1) (with-replacement variance of n draws; 0 for one draw) times 1 − the sampled fraction n / Σ 1/π."""
    if n < 2:
        return 0.0
    return n / (n - 1) * max(0.0, 1 - n / float(np.sum(weights)))


def _plus_four_variance(human: Conversations) -> float:
    """Σ of the squared linearised contributions of the humans' ratio, with two units of hits and two of misses
    added (each a draw of one unit, of the mean weight): Agresti & Coull's "plus four", counted in units as they
    define it. A rare rate's sample often holds no hit, and its own variance, 0, would give an interval of no width
    (on ABC-Eval, rates of 0.2-0.9 % were covered 22-54 % of the time at 50 labelled turns); the estimate itself
    stays the unadjusted, unbiased one."""
    weight = float(np.mean(human.weights))
    plus = Conversations(
        np.concatenate([human.values, [1.0, 1.0, 0.0, 0.0]]),
        np.concatenate([human.units, np.ones(4)]),
        np.concatenate([human.weights, np.full(4, weight)]),
    )
    _, a = _linearised(plus)
    return float(a @ a)


def _quantile(level: float, draws: int) -> float:
    """Student's t quantile with draws − 1 degrees of freedom: the labelled conversations are the draws, often few
    (a hundred labelled turns may be seven conversations), where the normal quantile's interval is too narrow."""
    from scipy import stats  # imported where used: ~1 s, and the service never needs it

    return float(stats.t.ppf(0.5 + level / 2, draws - 1))


def judge_rate(judged: Conversations) -> float:
    """The judge's raw rate: Σ w·value / Σ w·units."""
    if not len(judged):
        raise MetricError("no judged conversations")
    return _linearised(judged)[0]


def prediction_powered_rate(
    judged: Conversations, labelled: Labelled, level: float = DEFAULT_CI_LEVEL, tune: bool = True
) -> RateEstimate:
    """The PPI++ rate (see the module) of the ``judged`` (every stored conversation of the window: the judge's sums,
    units and store weights) given the ``labelled`` among them; ``tune=False`` gives the labels-only estimate."""
    if not 0 < level < 1:
        raise MetricError(f"level must be in (0, 1), got {level}")
    if len(labelled) < 2:
        raise MetricError(f"need at least 2 labelled conversations, got {len(labelled)}")
    if len(judged) < len(labelled):
        raise MetricError(f"the labelled ({len(labelled)}) must be among the judged ({len(judged)})")
    rate_judged, c = _linearised(judged)
    var_judged = _variance_factor(len(judged), judged.weights) * float(c @ c)  # 0 unless the store samples
    rate_y, a = _linearised(labelled.human)
    rate_f, b = _linearised(labelled.judge)
    k = _variance_factor(len(labelled), labelled.label_weights)
    cov_ab, var_b = k * float(a @ b), k * float(b @ b)
    var_a = k * _plus_four_variance(labelled.human)
    denominator = var_b + var_judged
    tuning = cov_ab / denominator if tune and denominator > 0 else 0.0
    estimate = tuning * rate_judged + rate_y - tuning * rate_f
    variance = max(0.0, var_a - 2 * tuning * cov_ab + tuning**2 * denominator)
    half = _quantile(level, len(labelled)) * variance**0.5
    return RateEstimate(
        estimate=estimate,
        low=max(0.0, estimate - half),
        high=min(1.0, estimate + half),
        standard_error=variance**0.5,
        level=level,
        method="ppi" if tuning != 0 else "labels",
        labelled=len(labelled),
        judged=len(judged),
        tuning=tuning,
        judge_rate=rate_judged,
    )


def judge_only_rate(judged: Conversations, level: float = DEFAULT_CI_LEVEL) -> RateEstimate:
    """Where no human labels exist: the judge's raw rate, labelled as such (no interval: its bias is unknown)."""
    rate = judge_rate(judged)
    return RateEstimate(rate, float("nan"), float("nan"), float("nan"), level, "judge", 0, len(judged), 0.0, rate)
