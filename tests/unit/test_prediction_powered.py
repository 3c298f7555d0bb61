"""PPI++ rates (scorers/prediction_powered.py) on simulated populations whose true rate is known."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from scorers.prediction_powered import Conversations, Labelled, judge_only_rate, prediction_powered_rate
from scorers.statistics import MetricError, clustered_rate

N_POPULATION = 5000
N_LABELLED = 100
DRAWS = 800


def _population(rng: np.random.Generator, agreement: float) -> tuple[np.ndarray, np.ndarray]:
    """Human labels at a 20 % rate; a judge that copies them with probability ``agreement``, else says yes at 60 %
    (biased upwards)."""
    human = (rng.random(N_POPULATION) < 0.2).astype(float)
    copied = rng.random(N_POPULATION) < agreement
    judge = np.where(copied, human, (rng.random(N_POPULATION) < 0.6).astype(float))
    return human, judge


def _draws(agreement: float, tune: bool, seed: int = 0) -> tuple[float, float, float]:
    """Coverage of the population's human rate, mean width, and the judge's raw rate over DRAWS random samples."""
    rng = np.random.default_rng(seed)
    human, judge = _population(rng, agreement)
    truth = human.mean()
    covered, widths = 0, []
    judged = Conversations.of(judge)
    for _ in range(DRAWS):
        drawn = rng.choice(N_POPULATION, N_LABELLED, replace=False)
        labelled = Labelled.of(human[drawn], judge[drawn], np.full(N_LABELLED, N_POPULATION / N_LABELLED))
        r = prediction_powered_rate(judged, labelled, tune=tune)
        covered += r.low <= truth <= r.high
        widths.append(r.high - r.low)
    return covered / DRAWS, float(np.mean(widths)), float(judge.mean())


def test_a_biased_judge_that_tracks_the_humans_gives_a_valid_and_narrower_interval() -> None:
    coverage, width, raw = _draws(agreement=0.8, tune=True)
    labels_coverage, labels_width, _ = _draws(agreement=0.8, tune=False)
    assert abs(raw - 0.2) > 0.05  # the judge's own rate is off
    assert 0.93 <= coverage <= 0.97 and 0.92 <= labels_coverage <= 0.97
    assert width < 0.85 * labels_width


def test_a_judge_that_knows_nothing_costs_at_most_a_little_width() -> None:
    coverage, width, _ = _draws(agreement=0.0, tune=True)
    _, labels_width, _ = _draws(agreement=0.0, tune=False)
    assert 0.92 <= coverage <= 0.97
    assert width <= 1.05 * labels_width


def test_labels_alone_are_the_clustered_ratio_estimate_with_plus_four_and_the_finite_population_factor() -> None:
    hits, turns = np.array([1.0, 0, 3, 2, 0]), np.array([2.0, 1, 4, 3, 5])
    judged = Conversations.of(np.zeros(50), np.full(50, 3.0))  # five of fifty conversations labelled
    r = prediction_powered_rate(judged, Labelled.of(hits, hits, np.full(5, 10.0), turns), tune=False)
    assert r.method == "labels" and r.tuning == 0 and r.estimate == pytest.approx(clustered_rate(hits, turns)[0])
    # two turns of hits and two of misses, in the variance only
    _, variance = clustered_rate(np.append(hits, [1, 1, 0, 0]), np.append(turns, [1, 1, 1, 1]))
    half = stats.t.ppf(0.975, 4) * (variance * 5 / 4 * (1 - 5 / 50)) ** 0.5
    assert r.standard_error == pytest.approx((variance * 5 / 4 * (1 - 5 / 50)) ** 0.5, rel=1e-9)
    assert (r.high - r.estimate) == pytest.approx(half, rel=1e-5)


def test_every_conversation_labelled_leaves_no_doubt() -> None:
    human, judge = np.array([1.0, 0, 1, 0]), np.array([1.0, 1, 1, 1])
    r = prediction_powered_rate(Conversations.of(judge), Labelled.of(human, judge, np.ones(4)))
    assert r.estimate == 0.5 and r.low == r.high == 0.5 and r.judge_rate == 1.0


def test_inclusion_weights_make_an_unequal_sample_unbiased() -> None:
    """Conversations with the behaviour are twice as likely to be labelled; 1/π weights undo it."""
    rng = np.random.default_rng(1)
    human, judge = _population(rng, agreement=0.7)
    pi = np.where(human == 1, 0.04, 0.02)
    judged = Conversations.of(judge)
    estimates, naive = [], []
    for _ in range(400):
        drawn = np.flatnonzero(rng.random(N_POPULATION) < pi)
        estimates.append(prediction_powered_rate(judged, Labelled.of(human[drawn], judge[drawn], 1 / pi[drawn])).estimate)
        uniform = np.full(drawn.size, N_POPULATION / drawn.size)  # as if every conversation were as likely
        naive.append(prediction_powered_rate(judged, Labelled.of(human[drawn], judge[drawn], uniform)).estimate)
    assert abs(np.mean(estimates) - human.mean()) < 0.01
    assert np.mean(naive) - human.mean() > 0.05  # the check can fail: unweighted, the sample's excess shows


def test_without_labels_the_judges_rate_is_shown_as_the_judges() -> None:
    r = judge_only_rate(Conversations.of([1.0, 0.0, 1.0, 1.0]))
    assert r.method == "judge" and r.estimate == 0.75 and np.isnan(r.low) and r.labelled == 0


@pytest.mark.parametrize(
    "human, units, label_weights",
    [
        ([1.0], None, [2.0]),
        ([1.0, 0.0], [1.0, 0.0], [2.0, 2.0]),
        ([np.nan, 1.0], None, [2.0, 2.0]),
        ([1.0, 0.0], None, [0.5, 2.0]),
    ],
)
def test_bad_inputs_give_one_clear_error(human: list[float], units: list[float] | None, label_weights: list[float]) -> None:
    with pytest.raises(MetricError):
        prediction_powered_rate(Conversations.of([1.0, 0.0, 1.0]), Labelled.of(human, human, label_weights, units))


def test_a_rare_rate_keeps_its_coverage_when_the_sample_holds_no_hit() -> None:
    """1 % of 2,000 turns, 50 labelled: most samples hold no hit. Their own variance is 0; the plus-four variance
    gives them an interval (on ABC-Eval, rates of 0.2-0.9 % were covered 22-54 % of the time without it)."""
    rng = np.random.default_rng(3)
    human = np.zeros(2000)
    human[rng.choice(2000, 20, replace=False)] = 1
    judge = np.where(rng.random(2000) < 0.5, human, 0.0)
    judged, covered, empty = Conversations.of(judge), 0, 0
    for _ in range(DRAWS):
        drawn = rng.choice(2000, 50, replace=False)
        r = prediction_powered_rate(judged, Labelled.of(human[drawn], judge[drawn], np.full(50, 40.0)))
        covered += r.low <= 0.01 <= r.high
        empty += not human[drawn].any()
    assert empty > DRAWS / 2
    assert covered / DRAWS >= 0.93
