"""Sampling decisions and Horvitz–Thompson rates: unbiased against a population whose truth is known.

The simulation draws one finite population of conversations with known
dissatisfaction per stratum (product), then samples it many times under the
policy (a different salt = an independent Poisson sample) at rates from 1 %
to 100 %, and checks that the weighted rate is unbiased and that its 95 %
interval covers the truth about 95 % of the time.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from stream.sampling import (
    SamplingError,
    SamplingPolicy,
    SamplingRule,
    hajek_sampling_variance,
    horvitz_thompson_mean,
    unit_hash,
)

# product -> (conversations, true dissatisfaction probability, sampling rate)
STRATA = {"a": (6000, 0.30, 0.01), "b": (600, 0.05, 1.0), "c": (3000, 0.15, 0.10), "d": (1000, 0.60, 1.0)}
REPLICATES = 300


def _population(seed: int = 0) -> list[tuple[str, dict[str, str], float]]:
    rng = np.random.default_rng(seed)
    out = []
    for product, (n, p, _) in STRATA.items():
        for i, y in enumerate(rng.random(n) < p):
            out.append((f"{product}-{i}", {"product": product}, float(y)))
    return out


def _policy(salt: str) -> SamplingPolicy:
    rules = [SamplingRule({"product": product}, rate) for product, (_, _, rate) in STRATA.items()]
    return SamplingPolicy(default_rate=1.0, rules=rules, salt=salt)


def test_weighted_rates_are_unbiased_and_their_intervals_cover_the_truth() -> None:
    population = _population()
    truth = float(np.mean([y for _, _, y in population]))
    truth_by_product = {p: float(np.mean([y for _, a, y in population if a["product"] == p])) for p in STRATA}
    estimates, covered = [], 0
    by_product: dict[str, list[float]] = {p: [] for p in STRATA}
    for r in range(REPLICATES):
        policy = _policy(f"replicate-{r}")
        values, pis, products = [], [], []
        for cid, attrs, y in population:
            decision = policy.decide(cid, attrs)
            if decision.scored:
                values.append(y)
                pis.append(decision.inclusion_probability)
                products.append(attrs["product"])
        est = horvitz_thompson_mean(values, pis, len(population))
        estimates.append(est.mean)
        covered += abs(est.mean - truth) <= 1.96 * est.standard_error
        for p, (n, _, _) in STRATA.items():
            idx = [i for i, q in enumerate(products) if q == p]
            by_product[p].append(horvitz_thompson_mean([values[i] for i in idx], [pis[i] for i in idx], n).mean)
    spread = float(np.std(estimates))
    assert abs(np.mean(estimates) - truth) < 4 * spread / math.sqrt(REPLICATES), (np.mean(estimates), truth)
    assert 0.90 <= covered / REPLICATES <= 0.99, covered / REPLICATES
    for p, values in by_product.items():
        sd = float(np.std(values))
        assert abs(np.mean(values) - truth_by_product[p]) <= 4 * sd / math.sqrt(REPLICATES) + 1e-12, p
    # the unweighted mean of the sampled conversations is biased here: it over-weights the fully sampled, unhappy d
    naive = []
    for r in range(20):
        policy = _policy(f"naive-{r}")
        naive.append(np.mean([y for cid, a, y in population if policy.decide(cid, a).scored]))
    assert abs(np.mean(naive) - truth) > 0.05


def test_the_ratio_form_from_counter_sums_is_unbiased_and_its_intervals_cover_the_truth() -> None:
    """The Hájek rate R = Σ y/π / Σ 1/π and its linearised variance from the S0, S1, S2 sums the counters keep."""
    population = _population()
    truth = float(np.mean([y for _, _, y in population]))
    rates, covered = [], 0
    for r in range(REPLICATES):
        policy = _policy(f"ratio-{r}")
        weight = s_y = s0 = s1 = s2 = 0.0
        for cid, attrs, y in population:
            decision = policy.decide(cid, attrs)
            if decision.scored:
                pi = decision.inclusion_probability
                v = (1 - pi) / pi**2
                weight, s_y = weight + 1 / pi, s_y + y / pi
                s0, s1, s2 = s0 + v, s1 + v * y, s2 + v * y * y
        rate = s_y / weight
        rates.append(rate)
        covered += abs(rate - truth) <= 1.96 * math.sqrt(hajek_sampling_variance(rate, weight, s0, s1, s2))
    assert abs(np.mean(rates) - truth) < 4 * float(np.std(rates)) / math.sqrt(REPLICATES)
    assert 0.90 <= covered / REPLICATES <= 0.99, covered / REPLICATES
    assert hajek_sampling_variance(0.4, 3.0, 0.0, 0.0, 0.0) == 0.0  # π = 1 everywhere: no sampling error
    with pytest.raises(SamplingError, match="weight"):
        hajek_sampling_variance(0.4, 0.0, 0.0, 0.0, 0.0)


def test_at_full_rate_the_estimate_is_the_plain_mean_with_no_sampling_error() -> None:
    values = [0.2, 0.9, 0.4]
    est = horvitz_thompson_mean(values, [1.0, 1.0, 1.0], 3)
    assert est.mean == pytest.approx(0.5) and est.standard_error == 0.0


def test_decisions_are_deterministic_by_id_and_follow_the_first_matching_rule() -> None:
    policy = SamplingPolicy(0.5, [SamplingRule({"product": "x", "region": "eu"}, 0.2), SamplingRule({"product": "x"}, 1.0)])
    assert policy.rate_for({"product": "x", "region": "eu"}) == 0.2
    assert policy.rate_for({"product": "x"}) == 1.0
    assert policy.rate_for({"product": "y"}) == 0.5
    first = [policy.decide(f"c{i}", {"product": "y"}).scored for i in range(200)]
    again = [SamplingPolicy(0.5).decide(f"c{i}", {"product": "y"}).scored for i in range(200)]
    assert first == again  # a replay samples the same conversations
    assert 70 < sum(first) < 130
    assert [policy.decide(f"c{i}", {"product": "y"}).scored for i in range(200)] == [
        unit_hash("", f"c{i}") < 0.5 for i in range(200)
    ]


def test_negative_feedback_is_scored_with_certainty_only_when_the_policy_says_so() -> None:
    policy = SamplingPolicy(default_rate=0.01, always_first_per_model_version=1, always_score_negative_feedback=True)
    d = policy.decide("c1", {"model_version": "v1"}, negative_feedback=True)
    assert (d.scored, d.inclusion_probability, d.reason) == (True, 1.0, "negative_feedback")
    assert policy.decide("c2", {"model_version": "v1"}).reason == "new_model_version"  # feedback did not use up the first N
    off = SamplingPolicy(default_rate=0.01)
    assert off.decide("c1", {}, negative_feedback=True) == off.decide("c1", {})


def test_a_rated_conversation_is_scored_with_certainty_only_when_the_policy_says_so() -> None:
    policy = SamplingPolicy(default_rate=0.01, always_score_negative_feedback=True, always_score_rated=True)
    d = policy.decide("c1", {}, rated=True)
    assert (d.scored, d.inclusion_probability, d.reason) == (True, 1.0, "rated")
    assert policy.decide("c1", {}, negative_feedback=True, rated=True).reason == "negative_feedback"  # the first rule wins
    negative_only = SamplingPolicy(default_rate=0.01, always_score_negative_feedback=True)
    assert negative_only.decide("c1", {}, rated=True) == negative_only.decide("c1", {})
    assert negative_only.decide("c1", {}, negative_feedback=True, rated=True).reason == "negative_feedback"


def test_the_first_conversations_of_a_new_model_version_are_always_scored() -> None:
    policy = SamplingPolicy(default_rate=0.01, always_first_per_model_version=3)
    decisions = [policy.decide(f"v2-{i}", {"model_version": "v2"}) for i in range(10)]
    assert [d.reason for d in decisions[:3]] == ["new_model_version"] * 3
    assert all(d.scored and d.inclusion_probability == 1.0 for d in decisions[:3])
    assert all(d.inclusion_probability == 0.01 for d in decisions[3:])
    assert policy.decide("v3-0", {"model_version": "v3"}).reason == "new_model_version"


@pytest.mark.parametrize("rate", [0.0, -0.1, 1.5, float("nan"), True])
def test_bad_rates_are_refused(rate: float) -> None:
    with pytest.raises(SamplingError, match="rate"):
        SamplingPolicy(default_rate=rate)
    with pytest.raises(SamplingError, match="rate"):
        SamplingRule({"product": "a"}, rate)


def test_a_rule_must_match_something_and_the_population_must_hold_the_sample() -> None:
    with pytest.raises(SamplingError, match="at least one attribute"):
        SamplingRule({}, 0.5)
    with pytest.raises(SamplingError, match="population"):
        horvitz_thompson_mean([1.0, 0.0], [0.5, 0.5], 1)
