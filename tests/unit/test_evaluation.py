"""scorers.evaluation: stratified bootstrap intervals, per-group figures, paired differences, None with a reason."""

from __future__ import annotations

import json

import numpy as np
import pytest

from scorers.evaluation import (
    BootstrapSettings,
    _strata,
    compare_rubric_sets,
    evaluate_rubric_set,
    point_figures,
    resamples,
)
from scorers.rubrics import ConfidenceWindows, Polarity, Rubric, RubricSet
from scorers.statistics import auroc

FAST = BootstrapSettings(samples=300, seed=1)
A = RubricSet((Rubric("fix", "The assistant gives a working code fix.", Polarity.SAT),), ConfidenceWindows(0.0, -2.0, 2.0))
B = RubricSet((Rubric("clear", "The assistant explains the cause clearly.", Polarity.SAT),), ConfidenceWindows(0.0, -2.0, 2.0))


def sample(n: int = 80, separation: float = 1.5, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    positive = np.arange(n) % 4 != 0  # 75 % positive
    return rng.normal(separation * positive - separation / 2, 1.5), positive


def test_resamples_keep_every_stratum_at_its_size() -> None:
    positive = np.array([True] * 30 + [False] * 10)
    groups = ["a"] * 25 + ["b"] * 15
    strata = _strata(positive, groups)
    for idx in resamples(strata, FAST):
        assert positive[idx].sum() == 30 and sum(groups[i] == "a" for i in idx) == 25
        assert sum(groups[i] == "b" and not positive[i] for i in idx) == 10  # class × group


def test_figures_have_intervals_around_the_point_and_agree_with_the_statistics() -> None:
    netsats, positive = sample()
    e = evaluate_rubric_set(A, netsats, positive, settings=FAST)
    assert (e.n, e.n_positive) == (80, 60)
    assert e.figures["auroc"].value == pytest.approx(auroc(netsats, positive))
    for name, f in e.figures.items():
        assert f.value is not None and f.low is not None and f.high is not None, name
        assert f.low <= f.value <= f.high, name
    json.loads(json.dumps(e.to_dict()), parse_constant=lambda c: pytest.fail(f"not JSON: {c}"))


def test_undefined_figures_are_none_with_a_reason() -> None:
    netsats, positive = sample()
    nothing_sat = RubricSet(A.rubrics, ConfidenceWindows(100.0))  # θ above every NetSAT, no windows
    e = evaluate_rubric_set(nothing_sat, netsats, positive, settings=FAST)
    assert e.figures["precision"].value is None and "predicted satisfied" in e.figures["precision"].reason
    assert e.figures["confident_accuracy"].value is None and "uncertainty window" in e.figures["confident_accuracy"].reason
    assert e.figures["auroc"].value is not None  # threshold-free: still defined
    early = evaluate_rubric_set(A, netsats, positive, settings=FAST, exact_netsats=False)
    assert early.figures["delta_netsat"].value is None and "early stopping" in early.figures["delta_netsat"].reason


def test_groups_get_their_own_figures_and_one_class_groups_say_so() -> None:
    netsats, positive = sample()
    groups = ["help" if positive[i] and i < 40 else "search" for i in range(80)]  # help: positives only
    e = evaluate_rubric_set(A, netsats, positive, groups, FAST)
    assert set(e.groups) == {"help", "search"} and e.groups["help"].n_positive == e.groups["help"].n == 30
    assert e.groups["help"].figures["auroc"].value is None and "one class" in e.groups["help"].figures["auroc"].reason
    mask = np.array([g == "search" for g in groups])
    assert e.groups["search"].figures["auroc"].value == pytest.approx(auroc(netsats[mask], positive[mask]))


def test_a_set_compared_with_itself_differs_by_nothing() -> None:
    netsats, positive = sample()
    (d,) = compare_rubric_sets([A, B], [netsats, netsats.copy()], positive, settings=FAST).values()
    assert (d["auroc"].value, d["auroc"].low, d["auroc"].high, d["auroc"].p_value) == (0.0, 0.0, 0.0, 1.0)


def test_a_clearly_better_set_is_significantly_better_and_a_noisy_copy_is_not() -> None:
    netsats, positive = sample(n=200, separation=0.3)
    rng = np.random.default_rng(5)
    sharp = netsats + 4.0 * (positive - 0.5)
    noisy = netsats + rng.normal(0, 0.05, len(netsats))
    diffs = compare_rubric_sets(
        [A, B, RubricSet(A.rubrics, ConfidenceWindows(0.5))], [netsats, sharp, noisy], positive, settings=FAST
    )
    better, same = diffs[B.version]["auroc"], diffs[RubricSet(A.rubrics, ConfidenceWindows(0.5)).version]["auroc"]
    assert better.value == pytest.approx(
        point_figures(B, sharp, positive)["auroc"] - point_figures(A, netsats, positive)["auroc"]
    )
    assert better.low is not None and better.low > 0 and better.p_value is not None and better.p_value < 0.01
    assert same.low is not None and same.high is not None and same.low <= 0 <= same.high and same.p_value > 0.05


def test_compare_needs_two_sets() -> None:
    netsats, positive = sample()
    with pytest.raises(ValueError, match="two or more"):
        compare_rubric_sets([A], [netsats], positive)
