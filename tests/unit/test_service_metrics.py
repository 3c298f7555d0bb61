"""The service's Prometheus metrics (stream/metrics.py): the label policy, the names, and the real /metrics endpoint."""

from __future__ import annotations

import threading
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from stream.metrics import MISSING, OTHER, AttributeLabels, ServiceMetrics, metric_names

PREFIX = "convowatch_"


def every_series(metrics: ServiceMetrics) -> None:
    """Give every labelled metric one child, so each family exports its samples."""
    attrs = metrics.attribute_values({"product": "p", "model_version": "m"})
    m = metrics
    m.events.labels("turn", "accepted").inc()
    m.dead_letters.labels("not_json").inc()
    m.conversations_closed.labels("end").inc()
    m.closed_forgotten_early.inc()
    m.conversations_scored.labels("sat", *attrs).inc()
    m.conversations_unscored.labels("JudgeUnavailable", *attrs).inc()
    m.calibrated_conversations.labels(*attrs).inc()
    m.calibrated_dissatisfaction.labels(*attrs).inc(0.25)
    m.calibrated_dissatisfaction_squared.labels(*attrs).inc(0.0625)
    m.conversations_sampled.labels("unsampled", "rate", *attrs).inc()
    m.scored_weight.labels("sat", *attrs).inc(2)
    m.scored_sampling_variance.labels("sat", *attrs).inc(2)
    m.calibrated_weight.labels(*attrs).inc(2)
    m.calibrated_dissatisfaction_weighted.labels(*attrs).inc(0.5)
    m.calibrated_dissatisfaction_squared_weighted.labels(*attrs).inc(0.125)
    m.calibrated_sampling_variance.labels(*attrs).inc(2)
    m.calibrated_dissatisfaction_sampling_variance.labels(*attrs).inc(0.5)
    m.calibrated_dissatisfaction_squared_sampling_variance.labels(*attrs).inc(0.125)
    m.behaviour_turns.labels(*attrs).inc(3)
    m.behaviour_hits.labels("ignore", *attrs).inc(1)
    m.behaviour_turns_weight.labels(*attrs).inc(6)
    m.behaviour_hits_weight.labels("ignore", *attrs).inc(2)
    m.behaviour_turns_squared_variance.labels(*attrs).inc(36)
    m.behaviour_hits_turns_variance.labels("ignore", *attrs).inc(12)
    m.behaviour_hits_squared_variance.labels("ignore", *attrs).inc(4)
    m.behaviour_error.labels("ignore").set(1)
    m.user_feedback_conversations.labels("s1", "dsat", "negative", *attrs).inc()
    m.scorer_version_info.labels("active", "v1", "s1").set(1)
    m.shadow_conversations.labels("v2", "s2", "dsat").inc()
    m.rollout_changes.labels("applied").inc()
    m.broker_lost_data.labels("convowatch.events").inc()
    m.quarantined_records.labels("assemble").inc()
    m.redactions.labels("email").inc()
    m.injection_suspected.labels("instruction", *attrs).inc()
    m.netsat.labels(*attrs).observe(12.5)
    m.dimension.labels("Q0", *attrs).observe(3.2)
    m.scoring_attempts.labels("JudgeUnavailable").inc()
    m.judge_calls.labels("recorded").inc()
    m.judge_tokens.labels("recorded", "prompt").inc(10)
    m.rubric_questions.labels("asked").inc(3)
    m.judge_latency.labels("recorded").observe(0.1)
    m.judge_errors.labels("recorded", "JudgeUnavailable").inc()
    m.judge_cost.labels("recorded", "USD").inc(0.01)
    m.judge_budget_exhausted.labels("calls_per_minute").set(1)
    m.judge_budget_wait.labels("calls_per_minute").inc(2.5)
    m.sink_rows.labels("scores").inc()
    m.set_consumer_lag({("convowatch.events", 0): 3})
    m.partition_refetches.labels("convowatch.closed", "hole").inc()


# --- attribute labels --------------------------------------------------------------


def test_attribute_values_are_capped_per_key() -> None:
    labels = AttributeLabels(["product", "model_version"], max_values=2)
    assert labels.values({"product": "a", "model_version": "v1"}) == ("a", "v1")
    assert labels.values({"product": "b", "model_version": "v2"}) == ("b", "v2")
    assert labels.values({"product": "c", "model_version": "v1"}) == (OTHER, "v1")  # product is full, model_version is not
    assert labels.values({"product": "a", "model_version": "v3"}) == ("a", OTHER)  # known values stay themselves
    assert labels.values({"product": "d"})[0] == OTHER
    assert labels.values({"product": "b", "model_version": "v2"}) == ("b", "v2")


def test_missing_or_empty_attribute_is_none_and_other_keys_are_not_labels() -> None:
    labels = AttributeLabels(["product"], max_values=5)
    assert MISSING == "none"
    assert labels.values({}) == ("none",)
    assert labels.values({"product": ""}) == ("none",)
    assert labels.values({"locale": "de-DE", "product": "x"}) == ("x",)


def test_caps_hold_under_concurrent_use() -> None:
    labels = AttributeLabels(["product"], max_values=10)
    seen: set[str] = set()
    lock = threading.Lock()

    def worker(offset: int) -> None:
        for i in range(200):
            (value,) = labels.values({"product": f"p{offset + i}"})
            with lock:
                seen.add(value)

    threads = [threading.Thread(target=worker, args=(k * 1000,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(seen - {OTHER}) == 10 and OTHER in seen


def test_missing_attribute_stays_none_after_the_cap_is_reached() -> None:
    labels = AttributeLabels(["product"], max_values=2)
    labels.values({"product": "a"})
    labels.values({"product": "b"})
    assert labels.values({}) == ("none",)


def test_service_metrics_use_the_configured_cap() -> None:
    metrics = ServiceMetrics(attribute_keys=("product",), max_label_values=1)
    assert metrics.attribute_values({"product": "first"}) == ("first",)
    assert metrics.attribute_values({"product": "second"}) == (OTHER,)


def test_combinations_are_capped_and_a_later_one_keeps_its_first_attribute() -> None:
    """The cardinality the issue measured: 50 products × 50 model versions (per-key caps of 50 let all 2,500
    combinations through, 242,659 series in all). Capped at 200 combinations, a later one keeps its product."""
    labels = AttributeLabels(["product", "model_version"], max_values=50, max_combinations=200)
    seen = set()
    for p in range(50):
        for v in range(50):
            got = labels.values({"product": f"p{p}", "model_version": f"v{v}"})
            seen.add(got)
            assert got[0] == f"p{p}"  # the product is never merged (50 products fit the per-key cap)
    assert len(seen) <= 200 + 50 + 1
    assert labels.values({"product": "p0", "model_version": "v0"}) == ("p0", "v0")  # early ones keep their values
    assert labels.values({"product": "p49", "model_version": "v49"}) == ("p49", OTHER)
    assert labels.values({"product": "p49"}) == ("p49", MISSING)  # a missing value stays missing


def test_combination_cap_bounds_the_exported_series() -> None:
    capped = ServiceMetrics(max_label_values=50, max_label_combinations=20)
    for p in range(30):
        for v in range(30):
            attrs = capped.attribute_values({"product": f"p{p}", "model_version": f"v{v}"})
            capped.conversations_scored.labels("sat", *attrs).inc()
    samples = [s for f in text_string_to_metric_families(_exposition(capped)) for s in f.samples]
    scored = {tuple(s.labels.values()) for s in samples if s.name == "convowatch_conversations_scored_total"}
    assert 30 <= len(scored) <= 20 + 30 + 1


def test_no_created_series_are_exported() -> None:
    """Each ``*_created`` sample is a series of its own in Prometheus; every family exports without them."""
    metrics = ServiceMetrics()
    every_series(metrics)
    samples = [s for f in text_string_to_metric_families(_exposition(metrics)) for s in f.samples]
    assert samples
    assert [s.name for s in samples if s.name.endswith("_created")] == []
    assert {s.name for s in samples} >= {"convowatch_conversations_scored_total", "convowatch_netsat_bucket"}


def _exposition(metrics: ServiceMetrics) -> str:
    from prometheus_client import generate_latest

    return generate_latest(metrics.registry).decode()


def test_attribute_keys_that_clash_with_fixed_labels_are_refused() -> None:
    for key in ("label", "reason", "dimension"):
        with pytest.raises(ValueError, match=key):
            ServiceMetrics(attribute_keys=("product", key))


def test_consumer_lag_drops_the_series_of_partitions_no_longer_reported() -> None:
    metrics = ServiceMetrics()
    metrics.set_consumer_lag({("events", 0): 5, ("events", 1): 0})
    lag = metrics.registry.get_sample_value
    assert lag("convowatch_consumer_lag", {"topic": "events", "partition": "0"}) == 5
    metrics.set_consumer_lag({("events", 1): 7, ("events", 2): -1})  # partition 0 revoked; a negative lag reads as 0
    assert lag("convowatch_consumer_lag", {"topic": "events", "partition": "0"}) is None
    assert lag("convowatch_consumer_lag", {"topic": "events", "partition": "1"}) == 7
    assert lag("convowatch_consumer_lag", {"topic": "events", "partition": "2"}) == 0


# --- names -------------------------------------------------------------------------


def test_every_metric_name_has_the_prefix() -> None:
    metrics = ServiceMetrics()
    families = [m.name for m in metrics.registry.collect()]
    assert len(families) >= 20
    assert all(name.startswith(PREFIX) for name in families), families
    every_series(metrics)
    samples = [s.name for m in metrics.registry.collect() for s in m.samples]
    assert all(name.startswith(PREFIX) for name in samples)
    assert set(metric_names(metrics)) == set(samples)
    # every family now exports something
    assert {m.name for m in metrics.registry.collect() if m.samples} == set(families)


def test_metric_names_lists_the_readme_metrics_once_labelled() -> None:
    metrics = ServiceMetrics()
    every_series(metrics)
    names = set(metric_names(metrics))
    for name in (
        "convowatch_events_total",
        "convowatch_dead_letters_total",
        "convowatch_conversations_scored_total",
        "convowatch_calibrated_dissatisfaction_probability_total",
        "convowatch_calibrated_conversations_total",
        "convowatch_netsat_bucket",
        "convowatch_dimension_expected_value_bucket",
        "convowatch_judge_tokens_total",
        "convowatch_scoring_latency_seconds_count",
        "convowatch_open_conversations",
        "convowatch_closed_conversations_forgotten_early_total",
        "convowatch_assigned_partitions",
    ):
        assert name in names, name


def test_netsat_histogram_has_buckets_but_no_sum_because_netsat_can_be_negative() -> None:
    """Documented in stream/metrics.py: OpenMetrics forbids a _sum that can decrease; quantiles come from the buckets."""
    metrics = ServiceMetrics()
    metrics.netsat.labels("p", "m").observe(-12.5)
    labels = {"product": "p", "model_version": "m"}
    assert metrics.registry.get_sample_value("convowatch_netsat_sum", labels) is None
    assert metrics.registry.get_sample_value("convowatch_netsat_bucket", {**labels, "le": "-10.0"}) == 1.0
    assert metrics.registry.get_sample_value("convowatch_netsat_bucket", {**labels, "le": "-20.0"}) == 0.0


# --- the real endpoint ---------------------------------------------------------------


def test_serve_exposes_metrics_over_http() -> None:
    metrics = ServiceMetrics()
    port = metrics.serve("127.0.0.1", 0)
    assert port > 0
    attrs = metrics.attribute_values({"product": "chat"})
    metrics.conversations_scored.labels("dsat", *attrs).inc(3)
    metrics.events.labels("turn", "duplicate").inc()

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        assert reply.status == 200
        assert reply.headers["Content-Type"].startswith("text/plain")
        body = reply.read().decode("utf-8")
    families = {f.name: f for f in text_string_to_metric_families(body)}
    assert all(name.startswith(PREFIX) for name in families), sorted(families)
    scored = [s for s in families["convowatch_conversations_scored"].samples if s.name.endswith("_total")]
    assert [(s.labels, s.value) for s in scored] == [({"label": "dsat", "product": "chat", "model_version": "none"}, 3.0)]
    events = [s for s in families["convowatch_events"].samples if s.name.endswith("_total")]
    assert [(s.labels, s.value) for s in events] == [({"type": "turn", "outcome": "duplicate"}, 1.0)]

    metrics.events.labels("turn", "duplicate").inc()  # the endpoint serves live values
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        assert 'convowatch_events_total{outcome="duplicate",type="turn"} 2.0' in reply.read().decode("utf-8")


def test_two_processes_worth_of_metrics_do_not_share_a_registry() -> None:
    a, b = ServiceMetrics(), ServiceMetrics()
    a.events.labels("turn", "accepted").inc()
    assert b.registry.get_sample_value("convowatch_events_total", {"type": "turn", "outcome": "accepted"}) is None
