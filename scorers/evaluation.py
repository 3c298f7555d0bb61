"""Rubric sets evaluated on labelled conversations: figures with bootstrap intervals, per group, and paired differences.

`evaluate_rubric_set` gives RUBICON's figures (`scorers.rubrics.evaluate`) plus
the threshold-free AUROC and average precision of NetSAT for the satisfied
class, each with a percentile-bootstrap interval. Resamples are *stratified*:
conversations are drawn with replacement within each stratum (class, times the
value of a chosen attribute when one is given), so every resample has the
sample's class balance and mix of groups. `compare_rubric_sets` scores two or
more sets on the same conversations and tests each against the first with a
*paired* bootstrap: the same resample for both sets, the interval of the
difference, and a two-sided p-value (twice the share of resamples on the
other side of zero). A figure that cannot be computed is None with a reason
(`Figure`), never NaN, so results serialise as valid JSON.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from scorers.rubrics import RubricSet, evaluate
from scorers.statistics import DEFAULT_BOOTSTRAP_SAMPLES, DEFAULT_CI_LEVEL, auroc, average_precision

# The figures reported for a set, in order; those with intervals and paired tests are all but the counts.
FIGURES = (
    "delta_netsat",
    "yield_rate",
    "accuracy",
    "precision",
    "recall",
    "f1",
    "confident_accuracy",
    "auroc",
    "average_precision",
)
WHY_NAN = {
    "precision": "no conversation is predicted satisfied (every NetSAT is below θ)",
    "f1": "no conversation is predicted satisfied (every NetSAT is below θ)",
    "confident_accuracy": "no conversation is outside the uncertainty window",
    "delta_netsat": "not measured",
}
ONE_CLASS = "needs both satisfied and dissatisfied conversations; this group has one class"


@dataclass(frozen=True)
class Figure:
    """A figure, its bootstrap interval when one was computed, or None and why not."""

    value: float | None
    low: float | None = None
    high: float | None = None
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"value": self.value}
        if self.low is not None:
            out |= {"low": self.low, "high": self.high}
        if self.reason:
            out["reason"] = self.reason
        return out


@dataclass(frozen=True)
class Evaluation:
    """One rubric set's figures on one sample (or one group of it)."""

    rubric_set: str  # version
    n: int
    n_positive: int
    figures: dict[str, Figure]
    groups: dict[str, Evaluation] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"rubric_set": self.rubric_set, "n": self.n, "n_positive": self.n_positive}
        out["figures"] = {k: f.to_dict() for k, f in self.figures.items()}
        if self.groups:
            out["groups"] = {g: {k: v for k, v in e.to_dict().items() if k != "rubric_set"} for g, e in self.groups.items()}
        return out


@dataclass(frozen=True)
class Difference:
    """A figure of one set minus the same figure of the reference set, on the same conversations."""

    figure: str
    value: float | None
    low: float | None
    high: float | None
    p_value: float | None
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"value": self.value, "low": self.low, "high": self.high, "p_value": self.p_value}
        return out | ({"reason": self.reason} if self.reason else {})


@dataclass(frozen=True)
class BootstrapSettings:
    """How intervals are computed: resamples, level, seed."""

    samples: int = DEFAULT_BOOTSTRAP_SAMPLES
    level: float = DEFAULT_CI_LEVEL
    seed: int = 0


def point_figures(rubric_set: RubricSet, netsats: np.ndarray, positive: np.ndarray) -> dict[str, float]:
    """RUBICON's figures and NetSAT's AUROC and average precision for the satisfied class (NaN where undefined)."""
    m = evaluate(netsats, positive, rubric_set)
    return {
        **{k: getattr(m, k) for k in FIGURES[:7]},
        "auroc": auroc(netsats, positive),
        "average_precision": average_precision(netsats, positive),
    }


def resamples(strata: np.ndarray, settings: BootstrapSettings) -> Iterator[np.ndarray]:
    """Index arrays of stratified bootstrap resamples: within each stratum, as many draws with replacement as it has."""
    rng = np.random.default_rng(settings.seed)
    members = [np.flatnonzero(strata == s) for s in np.unique(strata)]
    for _ in range(settings.samples):
        yield np.concatenate([m[rng.integers(0, len(m), size=len(m))] for m in members])


def _strata(positive: np.ndarray, groups: Sequence[str] | None) -> np.ndarray:
    keys = [f"{p}\x00{g}" for p, g in zip(positive, groups or [""] * len(positive))]
    return np.unique(keys, return_inverse=True)[1]


def evaluate_rubric_set(
    rubric_set: RubricSet,
    netsats: np.ndarray,
    positive: np.ndarray,
    groups: Sequence[str] | None = None,
    settings: BootstrapSettings = BootstrapSettings(),
    exact_netsats: bool = True,
) -> Evaluation:
    """The set's figures with stratified bootstrap intervals, and per group when ``groups`` (one value per
    conversation) is given. ``exact_netsats=False`` (early stopping: NetSATs only bounded) drops ΔNetSAT."""
    s, y = np.asarray(netsats, dtype=float), np.asarray(positive, dtype=bool)
    strata = _strata(y, groups)
    point = point_figures(rubric_set, s, y)
    draws: dict[str, list[float]] = {k: [] for k in FIGURES}
    for idx in resamples(strata, settings):
        for k, v in point_figures(rubric_set, s[idx], y[idx]).items():
            draws[k].append(v)
    figures = {k: _figure(point[k], draws[k], settings.level, k) for k in FIGURES}
    if not exact_netsats:
        figures["delta_netsat"] = Figure(None, reason="early stopping leaves NetSATs bounded, not known")
    out = Evaluation(rubric_set.version, len(s), int(y.sum()), figures)
    if groups is None:
        return out
    by_group = {}
    for g in sorted(set(groups)):
        mask = np.array([x == g for x in groups])
        by_group[g] = _group(rubric_set, s[mask], y[mask], settings, exact_netsats)
    return Evaluation(out.rubric_set, out.n, out.n_positive, out.figures, by_group)


def _group(rubric_set: RubricSet, s: np.ndarray, y: np.ndarray, settings: BootstrapSettings, exact: bool) -> Evaluation:
    if y.all() or not y.any():
        return Evaluation(rubric_set.version, len(s), int(y.sum()), {k: Figure(None, reason=ONE_CLASS) for k in FIGURES})
    return evaluate_rubric_set(rubric_set, s, y, None, settings, exact)


def _figure(point: float, draws: Sequence[float], level: float, name: str) -> Figure:
    if math.isnan(point):
        return Figure(None, reason=WHY_NAN.get(name, "undefined on this sample"))
    kept = [d for d in draws if not math.isnan(d)]
    if not kept:
        return Figure(point, reason="undefined on every bootstrap resample: no interval")
    tail = (1 - level) / 2
    low, high = np.quantile(kept, [tail, 1 - tail])
    return Figure(point, float(low), float(high))


def compare_rubric_sets(
    rubric_sets: Sequence[RubricSet],
    netsats: Sequence[np.ndarray],
    positive: np.ndarray,
    groups: Sequence[str] | None = None,
    settings: BootstrapSettings = BootstrapSettings(),
) -> dict[str, dict[str, Difference]]:
    """Each set after the first against the first, per figure, by a paired stratified bootstrap (module docstring).

    Keyed by the other set's version, then by figure."""
    if len(rubric_sets) < 2 or len(rubric_sets) != len(netsats):
        raise ValueError("compare needs two or more rubric sets, each with its NetSATs")
    y = np.asarray(positive, dtype=bool)
    strata = _strata(y, groups)
    points = [point_figures(r, np.asarray(s, dtype=float), y) for r, s in zip(rubric_sets, netsats)]
    diffs: list[dict[str, list[float]]] = [{k: [] for k in FIGURES} for _ in rubric_sets[1:]]
    for idx in resamples(strata, settings):
        reference = point_figures(rubric_sets[0], np.asarray(netsats[0], dtype=float)[idx], y[idx])
        for j, (r, s) in enumerate(zip(rubric_sets[1:], netsats[1:])):
            other = point_figures(r, np.asarray(s, dtype=float)[idx], y[idx])
            for k in FIGURES:
                diffs[j][k].append(other[k] - reference[k])
    out: dict[str, dict[str, Difference]] = {}
    for j, r in enumerate(rubric_sets[1:]):
        out[r.version] = {k: _difference(k, points[j + 1][k] - points[0][k], diffs[j][k], settings.level) for k in FIGURES}
    return out


def _difference(name: str, point: float, draws: Sequence[float], level: float) -> Difference:
    if math.isnan(point):
        return Difference(
            name, None, None, None, None, "undefined for one of the two sets: " + WHY_NAN.get(name, "see its figures")
        )
    kept = np.array([d for d in draws if not math.isnan(d)])
    if len(kept) == 0:
        return Difference(name, point, None, None, None, "undefined on every bootstrap resample: no interval")
    tail = (1 - level) / 2
    low, high = np.quantile(kept, [tail, 1 - tail])
    # two-sided: twice the share of resampled differences on the far side of 0 (ties count half), at most 1
    below, at = float(np.mean(kept < 0)), float(np.mean(kept == 0))
    p = min(1.0, 2 * min(below + at / 2, 1 - below - at / 2))
    return Difference(name, point, float(low), float(high), p)


def conversation_rows(
    rubric_set: RubricSet,
    ids: Sequence[str],
    positive: np.ndarray,
    signed_scores: np.ndarray,
    groups: Sequence[str] | None = None,
) -> list[dict[str, Any]]:
    """One row per conversation: its id, the human label, NetSAT, the set's labels, group and signed rubric scores."""
    rows = []
    for i, cid in enumerate(ids):
        netsat = float(signed_scores[i].sum())
        row: dict[str, Any] = {
            "conversation_id": cid,
            "rubric_set": rubric_set.version,
            "human_label": "positive" if positive[i] else "negative",
            "netsat": netsat,
            "label": rubric_set.windows.label(netsat),
            "threshold_label": rubric_set.windows.binary_label(netsat),
        }
        if groups is not None:
            row["group"] = groups[i]
        row["rubric_scores"] = {r.id: float(v) for r, v in zip(rubric_set.rubrics, signed_scores[i])}
        rows.append(row)
    return rows


def group_values(attributes: Sequence[Mapping[str, str]], key: str) -> list[str]:
    """Each conversation's value of attribute ``key`` ("(none)" where it has none), for ``--by``."""
    return [a.get(key, "(none)") for a in attributes]
