"""Agreement and calibration metrics against hand-computed values, scipy and relplot."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
import relplot
from scipy import stats

from scorers import statistics
from scorers.statistics import MetricError


def test_rmse_known_value():
    assert statistics.rmse([1, 2, 3, 4], [1, 2, 3, 8]) == pytest.approx(2.0)
    assert statistics.rmse([2.5], [2.5]) == 0.0


def test_correlations_match_scipy():
    rng = np.random.default_rng(0)
    y = rng.integers(1, 5, size=200).astype(float)
    yhat = y + rng.normal(0, 1.5, size=200)
    assert statistics.pearson(y, yhat) == pytest.approx(stats.pearsonr(y, yhat).statistic)
    assert statistics.spearman(y, yhat) == pytest.approx(stats.spearmanr(y, yhat).statistic)
    assert statistics.kendall(y, yhat) == pytest.approx(stats.kendalltau(y, yhat).statistic)


def test_correlations_known_values():
    assert statistics.pearson([1, 2, 3], [2, 4, 6]) == pytest.approx(1.0)
    assert statistics.spearman([1, 2, 3, 4], [1, 4, 9, 16]) == pytest.approx(1.0)
    # One discordant pair out of three: tau = (2 - 1) / 3.
    assert statistics.kendall([1, 2, 3], [1, 3, 2]) == pytest.approx(1 / 3)


def test_constant_predictions_have_undefined_correlation():
    for f in (statistics.pearson, statistics.spearman, statistics.kendall):
        assert math.isnan(f([1, 2, 3, 4], [2.8, 2.8, 2.8, 2.8]))


def test_mismatched_or_bad_inputs_are_errors():
    with pytest.raises(MetricError, match="differ in length"):
        statistics.rmse([1, 2], [1])
    with pytest.raises(MetricError, match="at least one"):
        statistics.rmse([], [])
    with pytest.raises(MetricError, match="finite"):
        statistics.pearson([1, 2, np.nan], [1, 2, 3])
    with pytest.raises(MetricError, match="correlation"):
        statistics.rmse_lower_bound([1, 2], 1.5)


def test_rmse_bound_is_reached_by_the_best_affine_predictor_and_never_beaten():
    rng = np.random.default_rng(1)
    y = rng.integers(1, 5, size=500).astype(float)
    signal = y + rng.normal(0, 2.0, size=500)
    r = statistics.pearson(y, signal)
    bound = statistics.rmse_lower_bound(y, r)
    slope, intercept = np.polyfit(signal, y, 1)
    assert statistics.rmse(y, intercept + slope * signal) == pytest.approx(bound, rel=1e-9)
    for a, b in ((0.0, 1.0), (2.0, 0.3), (intercept + 0.1, slope)):
        assert statistics.rmse(y, a + b * signal) >= bound
    # With no correlation the bound is the SD: the training-mean predictor's RMSE.
    assert statistics.rmse_lower_bound(y, 0.0) == pytest.approx(statistics.rmse(y, np.full_like(y, y.mean())))
    assert statistics.rmse_lower_bound(y, math.nan) == pytest.approx(np.std(y))


def test_agreement_has_all_columns():
    out = statistics.agreement([1, 2, 3, 4], [1.5, 2.0, 2.5, 4.0])
    assert set(out) == {"rmse", "rmse_bound", "pearson", "spearman", "kendall"}
    assert out["rmse_bound"] <= out["rmse"]


def test_smece_matches_relplot_and_separates_calibrated_from_overconfident():
    rng = np.random.default_rng(2)
    f = rng.uniform(0, 1, size=4000)
    calibrated = (rng.uniform(0, 1, size=4000) < f).astype(float)
    assert statistics.smece(f, calibrated) == pytest.approx(float(relplot.smECE(f, calibrated)))
    assert statistics.smece(f, calibrated) < 0.03
    # Always forecasting 0.9 for a fair coin is off by 0.4.
    coin = (rng.uniform(0, 1, size=4000) < 0.5).astype(float)
    assert statistics.smece(np.full(4000, 0.9), coin) == pytest.approx(0.4, abs=0.03)
    with pytest.raises(MetricError, match="0 or 1"):
        statistics.smece([0.5, 0.5], [0, 2])
    with pytest.raises(MetricError, match="probabilities"):
        statistics.smece([1.5, 0.5], [0, 1])


def test_one_vs_rest_smece_per_option():
    rng = np.random.default_rng(3)
    probs = rng.dirichlet(np.ones(4), size=3000)
    answers = np.array([rng.choice(4, p=p) + 1 for p in probs])
    per_option = statistics.smece_one_vs_rest(probs, answers)
    assert len(per_option) == 4
    assert max(per_option) < 0.04
    assert statistics.smece_multiclass(probs, answers) == pytest.approx(np.mean(per_option))
    assert per_option[1] == pytest.approx(statistics.smece(probs[:, 1], (answers == 2).astype(float)))
    # Shuffling the forecasts against the answers breaks calibration of the confident ones.
    assert statistics.smece_multiclass(probs[::-1] ** 3 / (probs[::-1] ** 3).sum(1, keepdims=True), answers) > 0.05
    with pytest.raises(MetricError, match="1..4"):
        statistics.smece_one_vs_rest(probs[:2], [0, 1])


def test_bootstrap_ci_brackets_the_estimate_and_is_reproducible():
    rng = np.random.default_rng(4)
    y = rng.normal(size=300)
    yhat = y + rng.normal(size=300)
    ci = statistics.bootstrap_ci(statistics.pearson, y, yhat, n_samples=500, seed=7)
    assert ci.low < ci.estimate < ci.high
    assert ci.estimate == pytest.approx(statistics.pearson(y, yhat))
    assert statistics.bootstrap_ci(statistics.pearson, y, yhat, n_samples=500, seed=7) == ci
    small = statistics.bootstrap_ci(statistics.pearson, y[:60], yhat[:60], n_samples=500, seed=7)
    assert (small.high - small.low) > (ci.high - ci.low)
    assert ci.as_dict()["level"] == 0.95


def test_bootstrap_by_group_keeps_groups_together():
    # Two groups of identical rows: any resample of whole groups has a mean of 0, 1 or 0.5.
    values = np.array([0.0] * 50 + [1.0] * 50)
    groups = np.array(["a"] * 50 + ["b"] * 50)
    seen = set()

    def mean(v):
        seen.add(round(float(np.mean(v)), 6))
        return float(np.mean(v))

    statistics.bootstrap_ci(mean, values, n_samples=200, groups=groups, seed=0)
    assert seen <= {0.0, 0.5, 1.0}
    with pytest.raises(MetricError, match="groups"):
        statistics.bootstrap_ci(mean, values, groups=groups[:10])


def test_auroc_counts_ordered_pairs_and_half_the_ties():
    assert statistics.auroc([0.9, 0.8, 0.1], [True, True, False]) == 1.0
    assert statistics.auroc([0.1, 0.9], [True, False]) == 0.0
    assert statistics.auroc([0.5, 0.5, 0.7, 0.2], [True, False, True, False]) == pytest.approx((1 + 0.5 + 1 + 1) / 4)
    assert np.isnan(statistics.auroc([0.3, 0.4], [True, True]))


def test_clustered_rate_matches_the_binomial_for_one_turn_conversations_and_widens_for_clusters():
    rng = np.random.default_rng(0)
    hits = rng.random(2000) < 0.1
    r, var = statistics.clustered_rate(hits, np.ones(2000))
    assert r == hits.mean() and var == pytest.approx(r * (1 - r) / 2000)
    # Ten turns, all hits or none: the same rate, ten times the binomial variance (a design effect of 10).
    r10, var10 = statistics.clustered_rate(10 * hits, np.full(2000, 10))
    assert r10 == r and var10 == pytest.approx(10 * r * (1 - r) / 20000)
    # Weights 1/π: the Hájek rate, and a conversation standing for ten adds its error ten-fold squared.
    assert statistics.clustered_rate([1, 0], [1, 1], [3, 1])[0] == 0.75
    with pytest.raises(MetricError, match="hits <= turns"):
        statistics.clustered_rate([2], [1])


def test_a_two_window_z_test_with_clustered_variance_keeps_its_false_alarm_rate():
    """No change between two windows, behaviours clustered by conversation (each conversation has its own
    propensity): the clustered z-test alarms at about its nominal 5 %, the binomial one far more often."""
    rng = np.random.default_rng(1)
    z_crit, runs = stats.norm.ppf(0.95), 2000
    alarms = {"clustered": 0, "binomial": 0}
    for _ in range(runs):
        windows = []
        for n in (100, 600):  # conversations in the short window and in the baseline before it
            turns = rng.integers(2, 12, n)
            propensity = rng.beta(0.5, 4.5, n)  # mean 0.1, most conversations near 0, a few near 1
            windows.append((rng.binomial(turns, propensity), turns))
        (r, v), (rb, vb) = (statistics.clustered_rate(h, t) for h, t in windows)
        alarms["clustered"] += (r - rb) / math.sqrt(v + vb) > z_crit
        n, nb = (float(t.sum()) for _, t in windows)
        alarms["binomial"] += (r - rb) / math.sqrt(r * (1 - r) / n + rb * (1 - rb) / nb) > z_crit
    clustered, binomial = alarms["clustered"] / runs, alarms["binomial"] / runs
    assert 0.03 < clustered < 0.075, clustered
    assert binomial > 2 * clustered, (binomial, clustered)


def test_the_command_line_and_the_service_load_without_scipy_stats():
    """Importing scipy.stats takes ~1 s (0.7 s of a 2.3 s `convowatch --help` on the 2-core Intel host): the service
    and every command start without it, and the functions that need it import it when called."""
    code = (
        "import sys, stream.commands.cli, stream.app, stream.sink, scorers.statistics, scorers.early_stopping;"
        "print(sorted(m for m in sys.modules if m.startswith('scipy.stats')))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip() == "[]", done.stdout
    assert statistics.spearman([1, 2, 3], [1, 3, 2]) == 0.5  # and the lazily imported functions still work
