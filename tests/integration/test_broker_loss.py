"""A broker that loses its records (Kafka started again on an empty disk) is noticed by the worker.

A broker of this test's own (the session broker is shared), a worker and a sink as real processes. Ten real
conversations are scored and stored; the broker is stopped, its log directory removed (a lost disk: records,
topics and the groups' committed offsets gone) and it is started again, formatted anew, on the same ports; ten
more conversations are sent. The worker must say that the broker lost records (metric, log line) instead of
carrying on in silence. (What the sink does next is not asserted here; `BrokerLossWatch`'s rules are unit tests.)
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from deploy.local.stack import StackConfig, start_kafka, stop
from tests.infra import own_broker, wait_for
from tests.integration.test_rollout_pipeline import _conversations
from tests.pipeline import Pipeline

N = 10


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[StackConfig]:
    with own_broker(tmp_path / "stack") as cfg:
        yield cfg


@pytest.fixture
def pipeline(tmp_path: Path, broker: StackConfig, scoring_artifacts: tuple[Path, Path]) -> Iterator[Pipeline]:
    rubric_set, calibrator = scoring_artifacts
    p = Pipeline(tmp_path / "pipeline", f"127.0.0.1:{broker.kafka_port}", rubric_set, calibrator, partitions=1)
    try:
        yield p
    finally:
        p.stop_all()


def test_records_lost_by_the_broker_are_noticed_by_the_worker(pipeline: Pipeline, broker: StackConfig) -> None:
    worker = pipeline.start_worker()
    sink = pipeline.start_sink()
    pipeline.wait_assigned([worker])
    conversations = _conversations()
    for items in conversations[:N]:
        pipeline.produce((item.key, item.raw) for item in items)
    stored = lambda: sink.metric_sum("convowatch_sink_rows_total", table="conversation_scores")  # noqa: E731
    wait_for(lambda: stored() >= N, timeout=120, what="the first conversations stored")
    assert worker.metric_sum("convowatch_broker_lost_data_total") == sink.metric_sum("convowatch_broker_lost_data_total") == 0

    stop(broker, ["kafka"])
    shutil.rmtree(broker.state_dir / "kafka" / "data")  # the disk is lost: everything is gone
    start_kafka(broker)
    for items in conversations[N : 2 * N]:
        pipeline.produce((item.key, item.raw) for item in items)
    lost = lambda topic: worker.metric_sum("convowatch_broker_lost_data_total", topic=pipeline.topic(topic))  # noqa: E731
    wait_for(lambda: lost("events") >= 1, timeout=120, what="the worker noticing the lost events")
    time.sleep(3)  # three idle-timer rounds: each stage checks its own topic, so each loss is counted once
    assert lost("events") == 1 and lost("closed") <= 1
    log_text = worker.log.read_text()
    assert log_text.count("the broker lost records of " + pipeline.topic("events")) == 1
    assert worker.popen.poll() is None and sink.popen.poll() is None  # both carry on
