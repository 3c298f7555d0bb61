"""`BrokerLossWatch`: a negative lag is a suspect; the broker's committed offset decides (tests/integration/
test_broker_loss.py restarts a real broker)."""

from __future__ import annotations

from stream.broker_loss import BrokerLossWatch
from stream.metrics import ServiceMetrics

EVENTS, SCORES = "convowatch.events", "convowatch.scores"


def lost_count(metrics: ServiceMetrics, topic: str) -> float | None:
    return metrics.registry.get_sample_value("convowatch_broker_lost_data_total", {"topic": topic})


def test_a_negative_lag_is_lost_data_only_when_the_broker_forgot_the_committed_offset() -> None:
    metrics = ServiceMetrics()
    watch = BrokerLossWatch(metrics, "sink", (EVENTS, SCORES), recheck_s=10)
    assert lost_count(metrics, EVENTS) == lost_count(metrics, SCORES) == 0  # exported at 0 from the start
    lags = {(EVENTS, 0): -8, (EVENTS, 1): -3, (SCORES, 0): 5}
    assert watch.suspects(lags) == [(EVENTS, 0), (EVENTS, 1)]
    # partition 0: the broker has no committed offset (it restarted empty); partition 1: it still has ours (a
    # high-water mark read before the position moved past it): not lost.
    assert watch.confirm({(EVENTS, 0): (None, 120), (EVENTS, 1): (40, 40)}, now=0) == []  # a first read decides nothing
    assert watch.confirm({(EVENTS, 0): (None, 120)}, now=5) == []  # nor one too soon after it
    assert watch.confirm({(EVENTS, 0): (None, 120)}, now=10) == [(EVENTS, 0)]
    assert lost_count(metrics, EVENTS) == 1
    assert watch.suspects(lags) == [(EVENTS, 1)]  # reported once
    watch.confirm({(SCORES, 1): (3, 9)}, now=20)
    # a committed offset gone backwards; this process has committed anew since (on the broker's new log): still lost
    assert watch.confirm({(SCORES, 1): (5, 5)}, now=30) == [(SCORES, 1)]
    assert watch.confirm({(EVENTS, 1): (None, None)}, now=40) == []  # nothing committed: no evidence


def test_a_doubt_the_second_read_dispels_is_not_reported_and_stays_suspect_until_read_again() -> None:
    """A group coordinator still loading answers OffsetFetch with -1 for every partition (aiokafka: no committed
    offset): the second read finds the offset, nothing is reported."""
    metrics = ServiceMetrics()
    watch = BrokerLossWatch(metrics, "worker", (EVENTS,), recheck_s=10)
    assert watch.confirm({(EVENTS, 2): (None, 339)}, now=0) == []
    assert watch.suspects({(EVENTS, 2): 4}) == [(EVENTS, 2)]  # read again with the next lag report, lag or none
    assert watch.confirm({(EVENTS, 2): (339, 339)}, now=12) == []
    assert watch.suspects({(EVENTS, 2): 4}) == []
    assert lost_count(metrics, EVENTS) == 0


def test_a_partition_that_caught_up_is_reported_again_when_it_loses_records_again() -> None:
    metrics = ServiceMetrics()
    watch = BrokerLossWatch(metrics, "worker", (EVENTS,), recheck_s=10)
    watch.confirm({(EVENTS, 0): (None, 10)}, now=0)
    watch.confirm({(EVENTS, 0): (None, 10)}, now=10)
    assert watch.suspects({(EVENTS, 0): -10}) == []
    assert watch.suspects({(EVENTS, 0): 0}) == []  # read again from the start: caught up
    assert watch.suspects({(EVENTS, 0): -4}) == [(EVENTS, 0)]
    watch.confirm({(EVENTS, 0): (None, 4)}, now=20)
    watch.confirm({(EVENTS, 0): (None, 4)}, now=30)
    assert lost_count(metrics, EVENTS) == 2
