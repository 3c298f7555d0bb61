"""Importance weights from a domain classifier: they undo a known covariate shift and stay bounded."""

from __future__ import annotations

import numpy as np
import pytest

from scorers.calibrators import CalibrationError
from scorers.domain_weights import importance_weights


def test_without_a_shift_every_row_keeps_about_the_same_weight() -> None:
    rng = np.random.default_rng(0)
    found = importance_weights(rng.normal(size=(2000, 3)), rng.normal(size=(1000, 3)))
    assert found.weights.mean() == pytest.approx(1.0)
    assert found.effective_sample_size > 0.98 * 2000
    assert 0.45 < found.domain_auroc < 0.55
    assert found.capped == 0


def test_weighted_source_rows_have_the_target_mean_and_spread() -> None:
    # Source N(0, 1), target N(1, 1): the density ratio is exp(x − 1/2), which logistic regression models exactly.
    rng = np.random.default_rng(1)
    source, target = rng.normal(size=(20000, 1)), rng.normal(1.0, 1.0, size=(5000, 1))
    found = importance_weights(source, target, max_weight=1000.0)
    w = found.weights
    assert np.average(source[:, 0], weights=w) == pytest.approx(1.0, abs=0.05)
    assert np.sqrt(np.average((source[:, 0] - 1.0) ** 2, weights=w)) == pytest.approx(1.0, abs=0.05)
    np.testing.assert_allclose(np.corrcoef(np.log(w), source[:, 0])[0, 1], 1.0, atol=1e-9)
    assert found.domain_auroc == pytest.approx(0.76, abs=0.02)  # Φ(1/√2) for a shift of one SD
    assert found.effective_sample_size < 0.5 * len(source)


def test_the_cap_bounds_every_weight_and_missing_features_count_as_the_mean() -> None:
    rng = np.random.default_rng(2)
    source, target = rng.normal(size=(3000, 2)), rng.normal(3.0, 1.0, size=(300, 2))
    source[:10, 1] = np.nan
    found = importance_weights(source, target, max_weight=5.0)
    assert np.all(np.isfinite(found.weights))
    assert found.capped > 0
    assert found.weights.max() <= 5.0
    assert found.weights.mean() == pytest.approx(1.0, abs=1e-6)
    assert found.capped == np.sum(found.weights >= 5.0 - 1e-6)


@pytest.mark.parametrize(
    ("source", "target", "options", "message"),
    [
        (np.zeros((1, 2)), np.zeros((5, 2)), {}, ">= 2 rows"),
        (np.zeros((5, 2)), np.zeros((5, 3)), {}, "same width"),
        (np.zeros((5, 2)), np.zeros((5, 2)), {"l2": -1.0}, "l2 must be >= 0"),
        (np.zeros((5, 2)), np.zeros((5, 2)), {"max_weight": 1.0}, "max_weight > 1"),
    ],
)
def test_bad_input_is_one_clear_error(source: np.ndarray, target: np.ndarray, options: dict, message: str) -> None:
    with pytest.raises(CalibrationError, match=message):
        importance_weights(source, target, **options)
