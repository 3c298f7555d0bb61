"""The fault suite's short form (tests/fault_suite.py; the full one is bench/faults.py) on the real components.

300 real conversations (copies of the 223 LLM-Rubric ones) replayed through a
3-broker Apache Kafka cluster of this test's own (replication factor 3,
``min.insync.replicas=2``), real worker and sink processes and the embedded
ClickHouse, judged over HTTP by recorded answers, while the worker is killed
(-9) three times, the sink once, the leader of an events partition, the leader
of a changelog partition and the active controller once each (each started
again), the whole cluster once (killed at once, started again on its files),
the sink is stopped for 10 s and the judge refuses connections, answers 503
and answers too slowly for 30 s (each failing mode lasts until the worker has
met it once). Afterwards every conversation is stored once, scored, with every
turn as sent.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fault_suite import BROKER_FAULTS, CLUSTER_OVERRIDES, CLUSTER_SIZE, SHORT, run_fault_suite
from tests.infra import KafkaCluster, kafka_cluster
from tests.pipeline import Pipeline


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[KafkaCluster]:
    with kafka_cluster(tmp_path / "cluster", CLUSTER_SIZE, CLUSTER_OVERRIDES) as nodes:
        yield nodes


@pytest.fixture
def own_pipeline(tmp_path: Path, cluster: KafkaCluster, scoring_artifacts: tuple[Path, Path]) -> Iterator[Pipeline]:
    rubric_set, calibrator = scoring_artifacts
    p = Pipeline(tmp_path / "pipeline", cluster.bootstrap, rubric_set, calibrator)
    try:
        yield p
    finally:
        p.stop_all()


def test_crashes_and_outages_lose_nothing_and_show_no_duplicates(own_pipeline: Pipeline, cluster: KafkaCluster) -> None:
    pipeline = own_pipeline
    assert pipeline.rubric_set is not None
    report = run_fault_suite(pipeline, pipeline.rubric_set, SHORT, cluster)
    print(report.as_dict())
    n = SHORT.conversations
    assert report.stored == {
        "sent": n,
        "score_rows": n,
        "scored": n,
        "visible_duplicates": 0,
        "missing": 0,
        "unexpected": 0,
        "turns_differing": 0,
        "open_conversations_left": 0,
        "broker_lost_data": 0,
        "dead_letters": 0,
    }
    # Every fault happened and was recovered from; the judge really failed all three ways and really answered.
    faults = [r["fault"] for r in report.recoveries]
    assert sorted(faults) == sorted(["worker kill"] * 3 + ["sink kill", "sink outage", "judge outage", *BROKER_FAULTS])
    assert all(r["caught_up_s"] > 0 for r in report.recoveries)
    assert all(r["in_sync_s"] > 0 for r in report.recoveries if r["fault"] in BROKER_FAULTS)
    assert report.judge_requests.get("error", 0) > 0 and report.judge_requests.get("slow", 0) > 0
    assert report.judge_requests.get("unknown", 0) == 0
    assert report.judge_requests["answered"] >= n
