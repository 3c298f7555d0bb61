"""`ensure_topics` against the session's real broker: it creates what is missing and names a topic that has fewer
partitions than ``kafka.partitions`` (made before, e.g. auto-created by a producer that came first)."""

from __future__ import annotations

import logging
import uuid

import pytest
from kafka import KafkaAdminClient
from kafka.admin import NewTopic

from stream.settings import KafkaSettings
from stream.topics import ensure_topics, service_topics


def test_missing_topics_are_created_and_a_narrower_existing_one_is_named(
    kafka_broker: str, caplog: pytest.LogCaptureFixture
) -> None:
    run = uuid.uuid4().hex[:8]
    settings = KafkaSettings(
        bootstrap_servers=kafka_broker,
        partitions=3,
        app_id=f"topics-{run}",
        events_topic=f"topics-{run}.events",
        closed_topic=f"topics-{run}.closed",
        scores_topic=f"topics-{run}.scores",
        dead_letter_topic=f"topics-{run}.dead-letters",
    )
    admin = KafkaAdminClient(bootstrap_servers=kafka_broker)
    try:
        admin.create_topics([NewTopic(settings.events_topic, 1, 1)])  # made before the service, with one partition
    finally:
        admin.close()

    with caplog.at_level(logging.WARNING, logger="stream.topics"):
        created = ensure_topics(settings)

    assert sorted(created) == sorted(t for t in service_topics(settings) if t != settings.events_topic)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        f"topic {settings.events_topic} has 1 partitions, fewer than kafka.partitions=3: at most 1 workers share it"
    ]
    assert ensure_topics(settings) == []  # a second start creates nothing
