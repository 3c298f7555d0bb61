"""A broker that loses its records (a restart of tansu's memory engine) is noticed by the worker and the sink.

A broker of this test's own (the session broker is shared), a worker and a sink as real processes. Ten real
conversations are scored and stored; the broker is restarted, which empties it; ten more conversations are sent.
The worker's position on the events topic is now past the new end of its log: it must say so (metric, log line)
instead of idling in silence. Score records published after the restart (as a worker that recovered would) must
make the sink notice the same on the scores topic, read the partition again from its beginning and store them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest

from deploy.local.stack import StackConfig, start_kafka, stop
from tests.infra import free_ports, wait_for
from tests.integration.test_rollout_pipeline import _conversations
from tests.integration.test_store import scored
from tests.pipeline import Pipeline

N = 10


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[StackConfig]:
    port, unused_1, unused_2 = free_ports(3)
    cfg = StackConfig(state_dir=tmp_path / "stack", kafka_port=port, prometheus_port=unused_1, alertmanager_port=unused_2)
    start_kafka(cfg)
    try:
        yield cfg
    finally:
        stop(cfg, ["kafka"])


@pytest.fixture
def pipeline(tmp_path: Path, broker: StackConfig, scoring_artifacts: tuple[Path, Path]) -> Iterator[Pipeline]:
    rubric_set, calibrator = scoring_artifacts
    p = Pipeline(tmp_path / "pipeline", f"127.0.0.1:{broker.kafka_port}", rubric_set, calibrator, partitions=1)
    try:
        yield p
    finally:
        p.stop_all()


def test_records_lost_by_the_broker_are_noticed_and_the_sink_reads_on(pipeline: Pipeline, broker: StackConfig) -> None:
    worker = pipeline.start_worker()
    sink = pipeline.start_sink()
    pipeline.wait_assigned([worker])
    conversations = _conversations()
    for items in conversations[:N]:
        pipeline.produce((item.key, item.raw) for item in items)
    stored = lambda: sink.metric_sum("convowatch_sink_rows_total", table="conversation_scores")  # noqa: E731
    wait_for(lambda: stored() >= N, timeout=120, what="the first conversations stored")
    assert worker.metric_sum("convowatch_broker_lost_data_total") == sink.metric_sum("convowatch_broker_lost_data_total") == 0

    stop(broker, ["kafka"])  # tansu's memory engine: everything is gone
    start_kafka(broker)
    for items in conversations[N : 2 * N]:
        pipeline.produce((item.key, item.raw) for item in items)
    wait_for(
        lambda: worker.metric_sum("convowatch_broker_lost_data_total", topic=pipeline.topic("events")) == 1,
        timeout=120,
        what="the worker noticing the lost events",
    )
    assert "the broker lost records of " + pipeline.topic("events") in worker.log.read_text()

    # What a recovered worker publishes after the restart reaches the store: the sink reads the new log from 0.
    after = [dataclasses.replace(scored(f"after-restart-{i}", "sat", 3.0, 0.2, 3.0), scorer_version="v-after") for i in range(3)]
    pipeline.produce_to("scores", ((r.conversation_id.encode(), r.to_json()) for r in after))
    wait_for(
        lambda: sink.metric_sum("convowatch_broker_lost_data_total", topic=pipeline.topic("scores")) == 1 and stored() >= N + 3,
        timeout=120,
        what="the sink noticing the lost scores and storing the new ones",
    )
    assert "the broker lost records of " + pipeline.topic("scores") in sink.log.read_text()
    sink.terminate()
    rows = pipeline.query_store(
        "SELECT conversation_id FROM convowatch.conversation_scores FINAL WHERE scorer_version = 'v-after'"
    )
    assert sorted(r["conversation_id"] for r in rows) == [r.conversation_id for r in after]
