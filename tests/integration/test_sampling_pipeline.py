"""Sampling end to end on the real components: a 50 % sampled replay estimates the full replay's rates.

Two isolated pipelines on the session's Kafka broker (worker and sink processes, the embedded ClickHouse
engine) replay the same 223 real LLM-Rubric conversations, scored by the recorded GPT-3.5 judge: one judges
every conversation, the other half of them (``scoring.sampling.default_rate = 0.5``). The full replay's
rates are the truth for these conversations; the sampled replay's 1/π-weighted rates, read from its
ClickHouse store, must lie within their 95 % sampling interval of it, and every unsampled conversation
must be in the store as ``unsampled``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import pytest

from stream.sampling import hajek_sampling_variance, unit_hash
from tests.infra import wait_for
from tests.integration.test_pipeline import N_REAL, N_REAL_TURNS
from tests.pipeline import Pipeline

SALT = "sampled-replay"
RATE = 0.5
Z95 = 1.96

# Per rate y: its 1/π-weighted sum, the weight, and the sampling-variance sums S0, S1, S2 (docs/sampling.md).
_SUMS = """SELECT
    count() AS conversations,
    countIf(status = 'scored') AS scored,
    countIf(status = 'unsampled') AS unsampled,
    sumIf(1 / inclusion_probability, {cond}) AS weight,
    sumIf({y} / inclusion_probability, {cond}) AS weighted,
    sumIf((1 - inclusion_probability) / pow(inclusion_probability, 2), {cond}) AS s0,
    sumIf((1 - inclusion_probability) / pow(inclusion_probability, 2) * {y}, {cond}) AS s1,
    sumIf((1 - inclusion_probability) / pow(inclusion_probability, 2) * pow({y}, 2), {cond}) AS s2
FROM convowatch.latest_scores"""
CALIBRATED = "status = 'scored' AND dissatisfaction_probability IS NOT NULL"
# The demo's rubric set labels every real conversation uncertain (see README), so its label shares are 0 or 1 in
# both replays; the yes/no share "P(dsat) > 0.29" (about the median of the default calibrator's 0.13-0.47 on
# these conversations) is one that varies, so its interval is tested for real.
RATES = {
    "calibrated P(dsat)": ("ifNull(dissatisfaction_probability, 0)", CALIBRATED),
    "uncertain label share": ("toFloat64(label = 'uncertain')", "status = 'scored'"),
    "share with P(dsat) > 0.29": ("toFloat64(ifNull(dissatisfaction_probability, 0) > 0.29)", CALIBRATED),
}


@pytest.fixture
def pipelines(tmp_path: Path, kafka_broker: str, scoring_artifacts: tuple[Path, Path]) -> Iterator[tuple[Pipeline, Pipeline]]:
    rubric_set, calibrator = scoring_artifacts
    full = Pipeline(tmp_path / "full", kafka_broker, rubric_set, calibrator)
    sampled = Pipeline(
        tmp_path / "sampled",
        kafka_broker,
        rubric_set,
        calibrator,
        extra_env={"CONVOWATCH_SCORING__SAMPLING__DEFAULT_RATE": str(RATE), "CONVOWATCH_SCORING__SAMPLING__SALT": SALT},
    )
    try:
        yield full, sampled
    finally:
        full.stop_all()
        sampled.stop_all()


def _rate(p: Pipeline, y: str, cond: str) -> tuple[float, float, dict]:
    """The weighted rate of ``y`` over the rows meeting ``cond``, its sampling standard error, and the raw sums."""
    [row] = p.query_store(_SUMS.format(y=y, cond=cond))
    sums = {k: float(v) for k, v in row.items()}
    rate = sums["weighted"] / sums["weight"]
    return rate, math.sqrt(hajek_sampling_variance(rate, sums["weight"], sums["s0"], sums["s1"], sums["s2"])), sums


def test_a_sampled_replay_estimates_the_full_replays_rates_within_their_interval(pipelines: tuple[Pipeline, Pipeline]) -> None:
    full, sampled = pipelines
    workers = [p.start_worker() for p in pipelines]
    sinks = [p.start_sink() for p in pipelines]
    for p, w in zip(pipelines, workers):
        p.wait_assigned([w])
    for p in pipelines:
        assert f"sent {N_REAL_TURNS + N_REAL} events" in p.replay("llm-rubric").stdout
    for sink in sinks:
        wait_for(
            lambda sink=sink: sink.metric_sum("convowatch_sink_rows_total", table="conversation_scores") >= N_REAL,
            timeout=300,
            what="sink rows",
        )

    w = workers[1]
    judged = w.metric_sum("convowatch_conversations_sampled_total", decision="judged")
    assert judged + w.metric_sum("convowatch_conversations_sampled_total", decision="unsampled") == N_REAL
    assert w.metric_sum("convowatch_conversations_scored_total") == judged  # the judge ran for the sample only
    assert w.metric_sum("convowatch_calibrated_weight_total") == pytest.approx(judged / RATE)
    assert workers[0].metric_sum("convowatch_conversations_sampled_total", decision="judged", reason="rate") == N_REAL
    for sink in sinks:
        sink.terminate()  # the embedded store can be read by one process only

    full_rows, sampled_rows = (
        {
            r["conversation_id"]: r
            for r in p.query_store(
                "SELECT conversation_id, status, inclusion_probability, sampling_reason, dissatisfaction_probability "
                "FROM convowatch.latest_scores"
            )
        }
        for p in pipelines
    )
    assert len(full_rows) == len(sampled_rows) == N_REAL  # nothing lost: every conversation stored in both
    assert {r["status"] for r in full_rows.values()} == {"scored"}
    assert {r["inclusion_probability"] for r in full_rows.values()} == {1.0}
    chosen = {cid for cid in sampled_rows if unit_hash(SALT, cid) < RATE}
    assert len(chosen) == judged and 0.35 * N_REAL < judged < 0.65 * N_REAL
    for cid, r in sampled_rows.items():
        assert (r["status"], r["inclusion_probability"], r["sampling_reason"]) == (
            "scored" if cid in chosen else "unsampled",
            RATE,
            "rate",
        ), cid
        if cid in chosen:  # the same judge on the same conversation: the same score as in the full replay
            assert r["dissatisfaction_probability"] == pytest.approx(full_rows[cid]["dissatisfaction_probability"])

    varying = 0
    for name, (y, cond) in RATES.items():
        truth, full_se, full_sums = _rate(full, y, cond)
        estimate, se, sums = _rate(sampled, y, cond)
        assert full_se == 0.0 and full_sums["weight"] == N_REAL  # π = 1: no sampling error, n is the count
        assert sums["unsampled"] == N_REAL - judged and sums["weight"] == pytest.approx(judged / RATE)
        if truth in (0.0, 1.0):  # every conversation alike: any sample gives the truth, without error
            assert (estimate, se) == (truth, 0.0), name
            continue
        varying += 1
        assert se > 0 and abs(estimate - truth) <= Z95 * se, (name, estimate, truth, se)
    assert varying == 2  # the calibrated rate and the P > 0.29 share
