"""Importance weights from a domain classifier: how much a training conversation looks like production.

A calibrator trained on one domain (LLM-Rubric's synthetic conversations) and
used on another (real traffic) sees a covariate shift: the judge's answers are
distributed differently. The classic correction (Shimodaira 2000; Sugiyama et
al. 2007) weights each training row by the density ratio p_target(x) /
p_source(x), which a probabilistic classifier of the two domains estimates as
its odds times n_source / n_target. Only *unlabelled* target rows are needed:
the judge's answers on production conversations, never a human label.

The classifier is an L2-penalised logistic regression on the features
standardised over both domains; the weights are rescaled to mean 1 and capped
at ``max_weight`` (capping and rescaling repeated until both hold), because a
few near-certain target-like rows would otherwise carry the whole fit. The effective sample size
(Σw)² / Σw² says how many training rows are left in effect.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike
from scipy.optimize import minimize
from scipy.special import expit, log_expit

from scorers import statistics
from scorers.calibrators import CalibrationError

DEFAULT_L2 = 1.0  # the classifier's penalty on its weights (standardised inputs), per row
DEFAULT_MAX_WEIGHT = 10.0  # times the mean weight
MAX_CAP_ROUNDS = 200  # capping and rescaling converges geometrically; this is far more than it takes


@dataclass(frozen=True)
class ImportanceWeights:
    """One weight per source row (mean 1) and how far the two domains are apart."""

    weights: np.ndarray
    effective_sample_size: float
    domain_auroc: float  # in-sample AUROC of the classifier: 0.5 = no shift it can see
    capped: int  # rows whose weight hit ``max_weight``

    def as_dict(self) -> dict[str, float]:
        return {
            "effective_sample_size": self.effective_sample_size,
            "rows": float(len(self.weights)),
            "domain_auroc": self.domain_auroc,
            "capped": float(self.capped),
            "max": float(self.weights.max()),
        }


def importance_weights(
    source: ArrayLike, target: ArrayLike, l2: float = DEFAULT_L2, max_weight: float = DEFAULT_MAX_WEIGHT
) -> ImportanceWeights:
    """Weights for the ``source`` rows that make them resemble the ``target`` rows (NaN features -> the mean)."""
    xs, xt = np.atleast_2d(np.asarray(source, dtype=np.float64)), np.atleast_2d(np.asarray(target, dtype=np.float64))
    if len(xs) < 2 or len(xt) < 2 or xs.shape[1] != xt.shape[1]:
        raise CalibrationError(f"need >= 2 rows of the same width per domain, got {xs.shape} and {xt.shape}")
    if l2 < 0 or max_weight <= 1:
        raise CalibrationError(f"l2 must be >= 0 and max_weight > 1, got {l2} and {max_weight}")
    x = np.vstack([xs, xt])
    with np.errstate(invalid="ignore"):
        mean, sd = np.nanmean(x, axis=0), np.nanstd(x, axis=0)
    mean, sd = np.where(np.isnan(mean), 0.0, mean), np.where(np.isnan(sd) | (sd < 1e-9), 1.0, sd)
    z = np.where(np.isnan(x), 0.0, (x - mean) / sd)
    is_target = np.concatenate([np.zeros(len(xs)), np.ones(len(xt))])
    # classes balanced in the loss, so the odds are the density ratio up to a constant the rescaling removes
    row_weight = np.where(is_target == 1, len(x) / (2 * len(xt)), len(x) / (2 * len(xs)))
    design = np.hstack([z, np.ones((len(z), 1))])

    def loss(beta: np.ndarray) -> tuple[float, np.ndarray]:
        margin = design @ beta
        nll = -(row_weight * (is_target * log_expit(margin) + (1 - is_target) * log_expit(-margin))).sum()
        residual = row_weight * (expit(margin) - is_target)
        penalty = np.concatenate([beta[:-1], [0.0]])  # the intercept is not penalised
        return (nll + l2 * float(penalty @ penalty)) / len(z), (design.T @ residual + 2 * l2 * penalty) / len(z)

    result = minimize(loss, np.zeros(design.shape[1]), jac=True, method="L-BFGS-B")
    if not result.success:
        raise CalibrationError(f"the domain classifier did not converge: {result.message}")
    margin = design @ result.x
    weights = _capped(np.exp(margin[: len(xs)]), max_weight)
    return ImportanceWeights(
        weights=weights,
        effective_sample_size=float(weights.sum() ** 2 / (weights**2).sum()),
        domain_auroc=statistics.auroc(margin, is_target.astype(bool)),
        capped=int(np.sum(weights >= max_weight * (1 - 1e-9))),
    )


def _capped(ratio: np.ndarray, max_weight: float) -> np.ndarray:
    """``ratio`` rescaled to mean 1 with no value above ``max_weight``: cap and rescale until both hold."""
    weights = ratio / ratio.mean()
    for _ in range(MAX_CAP_ROUNDS):
        if weights.max() <= max_weight * (1 + 1e-9):
            break
        weights = np.minimum(weights, max_weight)
        weights = weights / weights.mean()
    return np.minimum(weights, max_weight)
