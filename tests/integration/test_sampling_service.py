"""Sampling in the service: settings, the worker's decision, records, metrics, store rows and the π = 1 reduction.

Real parts as in tests/unit/test_scoring.py (GPT-3.5's recorded answers on LLM-Rubric's real conversations, a
calibrator trained on its synthetic data, the real assembler) and the real chDB store.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

from stream.metrics import ServiceMetrics
from stream.records import ClosedConversation, RecordError, ScoreRecord
from stream.report.data import Z95, Counts
from stream.report.summary import summarize
from stream.sampling import SamplingPolicy, unit_hash
from stream.scoring import ConversationScorer
from stream.settings import SamplingRuleSettings, SamplingSettings, SettingsError, load_settings
from tests.chdb_fixture import chdb_dsn, store_factory  # noqa: F401
from tests.unit.test_scoring import _assemble_all, calibrator, fast_retries, judge, rubric_set, sample, score, unfitted  # noqa: F401

N_CONVERSATIONS = 40


@pytest.fixture(scope="module")
def conversations() -> list[ClosedConversation]:
    closed = list(_assemble_all(limit=N_CONVERSATIONS).values())
    assert len(closed) == N_CONVERSATIONS
    return closed


def _attrs(closed: ClosedConversation) -> dict[str, str]:
    return {"product": "llm-rubric-demo", "model_version": closed.attributes["model_version"]}


def _total(metrics: ServiceMetrics, name: str, **labels: str) -> float:
    """A counter summed over every label set that has ``labels``."""
    return sum(
        s.value
        for family in metrics.registry.collect()
        for s in family.samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )


# --- settings -------------------------------------------------------------------------------------


def test_by_default_every_conversation_is_judged_with_weight_one() -> None:
    s = load_settings().scoring.sampling
    assert (s.default_rate, s.rules, s.always_first_per_model_version, s.always_score_negative_feedback) == (1.0, [], 0, True)
    decision = SamplingPolicy.from_settings(s).decide("any", {"product": "p"})
    assert (decision.scored, decision.inclusion_probability, decision.reason) == (True, 1.0, "rate")


@pytest.mark.parametrize(
    ("sampling", "field"),
    [
        ({"default_rate": 0}, r"scoring\.sampling\.default_rate"),
        ({"default_rate": 1.5}, r"scoring\.sampling\.default_rate"),
        ({"rules": [{"match": {"product": "a"}, "rate": -0.1}]}, r"scoring\.sampling\.rules\.0\.rate"),
        ({"rules": [{"match": {}, "rate": 0.5}]}, r"scoring\.sampling\.rules\.0\.match"),
        ({"always_first_per_model_version": -1}, r"scoring\.sampling\.always_first_per_model_version"),
        ({"default_rat": 0.5}, r"scoring\.sampling\.default_rat"),  # a typo is refused, not ignored
    ],
)
def test_bad_sampling_settings_are_a_settings_error_naming_the_field(sampling: dict, field: str) -> None:
    with pytest.raises(SettingsError, match=field):
        load_settings(scoring={"sampling": sampling})


def test_sampling_settings_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONVOWATCH_SCORING__SAMPLING__DEFAULT_RATE", "0.25")
    monkeypatch.setenv("CONVOWATCH_SCORING__SAMPLING__RULES", '[{"match": {"product": "search"}, "rate": 1}]')
    s = load_settings().scoring.sampling
    assert s.default_rate == 0.25 and s.rules == [SamplingRuleSettings(match={"product": "search"}, rate=1.0)]
    monkeypatch.setenv("CONVOWATCH_SCORING__SAMPLING__DEFAULT_RATE", "2")
    with pytest.raises(SettingsError, match=r"scoring\.sampling\.default_rate"):
        load_settings()


# --- records --------------------------------------------------------------------------------------


def test_sampling_fields_survive_the_topics_and_old_records_still_decode(conversations) -> None:
    closed = replace(conversations[0], negative_feedback=True)
    assert ClosedConversation.from_json(closed.to_json()) == closed
    record = ScoreRecord(closed, "unsampled", "sv", "j", "rs", "cal", 1.0, 0, inclusion_probability=0.1, sampling_reason="rate")
    assert ScoreRecord.from_json(record.to_json()) == record

    old = json.loads(record.to_json())  # as written before sampling existed
    del old["inclusion_probability"], old["sampling_reason"], old["conversation"]["negative_feedback"]
    decoded = ScoreRecord.from_json(json.dumps(old).encode())
    assert (decoded.inclusion_probability, decoded.sampling_reason, decoded.conversation.negative_feedback) == (1.0, "", False)
    bad = json.loads(closed.to_json())
    bad["negative_feedback"] = "yes"
    with pytest.raises(RecordError, match="negative_feedback"):
        ClosedConversation.from_json(json.dumps(bad).encode())


# --- the worker's decision --------------------------------------------------------------------------


def test_a_sample_is_judged_and_the_rest_is_stored_unsampled(judge, rubric_set, calibrator, conversations, store_factory) -> None:
    metrics = ServiceMetrics()
    sampling = SamplingSettings(default_rate=0.5, salt="test")
    scorer = ConversationScorer(judge, rubric_set, calibrator, fast_retries(sampling=sampling), metrics)
    records = [score(scorer, c) for c in conversations]

    chosen = {c.conversation_id for c in conversations if unit_hash("test", c.conversation_id) < 0.5}
    assert 5 < len(chosen) < N_CONVERSATIONS - 5
    judged = [r for r in records if r.status == "scored"]
    unsampled = [r for r in records if r.status == "unsampled"]
    assert {r.conversation_id for r in judged} == chosen and len(judged) + len(unsampled) == N_CONVERSATIONS
    assert all((r.inclusion_probability, r.sampling_reason) == (0.5, "rate") for r in records)
    for r in unsampled:  # counted, never judged
        assert (r.label, r.netsat, r.dissatisfaction_probability, r.rubrics, r.judge_calls, r.attempts) == (
            "",
            None,
            None,
            (),
            0,
            0,
        )
    assert _total(metrics, "convowatch_judge_latency_seconds_count") == len(judged)  # the judge ran for the chosen only

    assert _total(metrics, "convowatch_conversations_sampled_total", decision="judged", reason="rate") == len(judged)
    assert _total(metrics, "convowatch_conversations_sampled_total", decision="unsampled", reason="rate") == len(unsampled)
    assert _total(metrics, "convowatch_conversations_scored_total") == len(judged)  # judge work, unweighted
    assert _total(metrics, "convowatch_conversations_scored_weight_total") == pytest.approx(2 * len(judged))
    p = [r.dissatisfaction_probability for r in judged]
    expected = {  # w = 1/π = 2, (1-π)/π² = 2
        "convowatch_calibrated_weight_total": 2 * len(p),
        "convowatch_calibrated_dissatisfaction_probability_weighted_total": 2 * sum(p),
        "convowatch_calibrated_dissatisfaction_probability_squared_weighted_total": 2 * sum(x * x for x in p),
        "convowatch_calibrated_sampling_variance_total": 2 * len(p),
        "convowatch_calibrated_dissatisfaction_probability_sampling_variance_total": 2 * sum(p),
        "convowatch_calibrated_dissatisfaction_probability_squared_sampling_variance_total": 2 * sum(x * x for x in p),
    }
    for name, value in expected.items():
        assert _total(metrics, name) == pytest.approx(value), name

    store = store_factory()
    store.write_scores(records)
    assert store.query("SELECT status, count() AS n FROM latest_scores GROUP BY status ORDER BY status") == [
        {"status": "scored", "n": len(judged)},
        {"status": "unsampled", "n": len(unsampled)},
    ]
    summary = summarize(store, group_by="product")
    assert summary.by_label["unsampled"] == len(unsampled) and sum(
        summary.by_label[k] for k in ("sat", "dsat", "uncertain")
    ) == len(judged)
    [v] = summary.variants
    assert (v.n, v.n_scored) == (N_CONVERSATIONS, len(judged))  # unsampled rows are volume, never scored
    assert v.calibrated_dissatisfaction == pytest.approx(sum(p) / len(p))  # equal weights: the plain mean of the judged


def test_negative_feedback_and_new_model_versions_are_always_judged(judge, rubric_set, calibrator, conversations) -> None:
    metrics = ServiceMetrics()
    rare = SamplingSettings(default_rate=0.01, always_first_per_model_version=1)
    scorer = ConversationScorer(judge, rubric_set, calibrator, fast_retries(sampling=rare), metrics)
    versions = sorted({c.attributes["model_version"] for c in conversations})
    firsts = [next(c for c in conversations if c.attributes["model_version"] == v) for v in versions]
    for c in firsts:
        r = score(scorer, c)
        assert (r.status, r.inclusion_probability, r.sampling_reason) == ("scored", 1.0, "new_model_version")
    unhappy = replace(
        next(c for c in conversations if c not in firsts and unit_hash("", c.conversation_id) >= 0.01), negative_feedback=True
    )
    r = score(scorer, unhappy)
    assert (r.status, r.inclusion_probability, r.sampling_reason) == ("scored", 1.0, "negative_feedback")
    assert _total(metrics, "convowatch_conversations_sampled_total", decision="judged", reason="negative_feedback") == 1

    ignoring = rare.model_copy(update={"always_score_negative_feedback": False, "always_first_per_model_version": 0})
    r = score(ConversationScorer(judge, rubric_set, calibrator, fast_retries(sampling=ignoring), ServiceMetrics()), unhappy)
    assert (r.status, r.inclusion_probability, r.sampling_reason) == ("unsampled", 0.01, "rate")


def test_rated_conversations_are_judged_and_counted_against_their_feedback(judge, rubric_set, calibrator, conversations) -> None:
    metrics = ServiceMetrics()
    rare = SamplingSettings(default_rate=0.01)
    scorer = ConversationScorer(judge, rubric_set, calibrator, fast_retries(sampling=rare), metrics)
    unsampled = [c for c in conversations if unit_hash("", c.conversation_id) >= 0.01]
    feedback = {"positive": ("up",), "negative": ("down", "down"), "conflict": ("up", "down")}
    records = {}
    for (kind, ratings), c in zip(feedback.items(), unsampled):
        records[kind] = score(scorer, replace(c, feedback_ratings=ratings, negative_feedback="down" in ratings))
        assert records[kind].status == "scored" and records[kind].inclusion_probability == 1.0
    assert [r.sampling_reason for r in records.values()] == ["rated", "negative_feedback", "negative_feedback"]
    assert score(scorer, unsampled[3]).status == "unsampled"  # no feedback: not counted below
    for kind, r in records.items():
        assert (
            _total(
                metrics,
                "convowatch_user_feedback_conversations_total",
                scorer_version=r.scorer_version,
                label=r.label,
                feedback=kind,
            )
            == 1
        ), kind
    assert _total(metrics, "convowatch_user_feedback_conversations_total") == 3

    off = rare.model_copy(update={"always_score_rated": False})
    r = score(
        ConversationScorer(judge, rubric_set, calibrator, fast_retries(sampling=off), ServiceMetrics()),
        replace(unsampled[0], feedback_ratings=("up",)),
    )
    assert (r.status, r.sampling_reason) == ("unsampled", "rate")


# --- π = 1: everything reduces to the unweighted values ---------------------------------------------


def test_at_full_rate_the_weighted_counters_are_the_unweighted_ones(judge, rubric_set, calibrator, conversations) -> None:
    metrics = ServiceMetrics()
    scorer = ConversationScorer(judge, rubric_set, calibrator, fast_retries(), metrics)
    records = [score(scorer, c) for c in conversations[:6]]
    assert all(r.status == "scored" and r.inclusion_probability == 1.0 for r in records)
    pairs = {
        "convowatch_calibrated_weight_total": "convowatch_calibrated_conversations_total",
        "convowatch_calibrated_dissatisfaction_probability_weighted_total": "convowatch_calibrated_dissatisfaction_probability_total",
        "convowatch_calibrated_dissatisfaction_probability_squared_weighted_total": "convowatch_calibrated_dissatisfaction_probability_squared_total",
        "convowatch_conversations_scored_weight_total": "convowatch_conversations_scored_total",
    }
    for weighted, plain in pairs.items():
        assert _total(metrics, weighted) == _total(metrics, plain) > 0, weighted
    for name in (
        "convowatch_calibrated_sampling_variance_total",
        "convowatch_conversations_scored_sampling_variance_total",
        "convowatch_calibrated_dissatisfaction_probability_sampling_variance_total",
        "convowatch_calibrated_dissatisfaction_probability_squared_sampling_variance_total",
    ):
        assert _total(metrics, name) == 0.0 and any(  # exported (as 0), so the PromQL over it has series
            s.name == name for f in metrics.registry.collect() for s in f.samples
        ), name


def _counts(values: list[float], pi: float) -> Counts:
    """What the report's SQL sums to for judged conversations with P(dsat) ``values`` and inclusion probability ``pi``."""
    w, v = 1 / pi, (1 - pi) / pi**2
    n = len(values)
    return Counts(
        conversations=round(n * w),
        scored=n,
        calibrated=n,
        scored_weight=n * w,
        sat_weight=n * w,
        calibrated_weight=n * w,
        dsat_probability_sum=w * sum(values),
        dsat_probability_sq_sum=w * sum(x * x for x in values),
        sampling_s0=n * v,
        sampling_s1=v * sum(values),
        sampling_s2=v * sum(x * x for x in values),
    )


def test_the_report_interval_reduces_to_the_sample_mean_one_at_full_rate_and_widens_when_sampled() -> None:
    values = [0.1, 0.9, 0.4, 0.2, 0.7]
    mean = sum(values) / len(values)
    half = Z95 * math.sqrt((sum(x * x for x in values) / len(values) - mean**2) / len(values))  # the formula before sampling
    full = _counts(values, 1.0)
    assert full.calibrated_dsat_rate == pytest.approx(mean)
    assert full.calibrated_dsat_interval == pytest.approx((mean - half, mean + half))
    # 50 conversations: all judged, or 10 % of them judged (each standing for 10): the same rate, but the sample's
    # interval is as wide as for the 5 it judged, sqrt(10) times the full population's
    population = _counts(values * 10, 1.0)
    sampled = _counts(values, 0.1)
    assert sampled.calibrated_dsat_rate == pytest.approx(population.calibrated_dsat_rate) == pytest.approx(mean)
    (lo, hi), (plo, phi) = sampled.calibrated_dsat_interval, population.calibrated_dsat_interval
    assert (hi - lo) / (phi - plo) == pytest.approx(math.sqrt(10))
    assert hi - lo == pytest.approx(2 * half)
