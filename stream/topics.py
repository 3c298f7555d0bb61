"""Topic creation: every topic the service uses exists, with the configured partitions, before it starts.

A broker that auto-creates topics gives them its own partition count (Kafka's
``num.partitions``, default 1), which would silently cap how many workers can share the load; so topics are
created explicitly, and an existing topic with fewer partitions is reported.
"""

from __future__ import annotations

import logging

from kafka import KafkaAdminClient
from kafka.admin import NewTopic
from kafka.errors import KafkaError, TopicAlreadyExistsError

from scorers.errors import ServiceError
from stream.settings import KafkaSettings

log = logging.getLogger(__name__)


class TopicError(ServiceError, RuntimeError):
    """The broker is unreachable or refused to create a topic."""


def changelog_topic(settings: KafkaSettings, table: str = "conversations") -> str:
    """Faust's name for a table's changelog topic."""
    return f"{settings.app_id}-{table}-changelog"


def service_topics(settings: KafkaSettings) -> list[str]:
    return [
        settings.events_topic,
        settings.closed_topic,
        settings.scores_topic,
        settings.dead_letter_topic,
        changelog_topic(settings),
    ]


def new_topic(settings: KafkaSettings, name: str) -> NewTopic:
    """The topic to create: ``kafka.partitions`` partitions; the changelog compacted, since restoring a partition's
    conversations needs only each one's last state (Faust would create its changelog so, but finds it made here, and
    a changelog under the default delete policy keeps every state written for the retention period, all read back
    on each restore), its segments rolled every ``kafka.changelog_segment_s`` so that the cleaner gets to them."""
    configs = {}
    if name == changelog_topic(settings):
        configs = {"cleanup.policy": "compact", "segment.ms": str(int(settings.changelog_segment_s * 1000))}
    return NewTopic(name, settings.partitions, settings.replication_factor, topic_configs=configs)


def ensure_topics(settings: KafkaSettings) -> list[str]:
    """Create missing topics; return the names created. Raises `TopicError` with the broker address on failure."""
    try:
        admin = KafkaAdminClient(
            bootstrap_servers=settings.bootstrap_servers.split(","),
            client_id="convowatch-admin",
            request_timeout_ms=int(settings.admin_timeout_s * 1000),
        )
    except KafkaError as e:
        raise TopicError(f"cannot reach Kafka at {settings.bootstrap_servers}: {e}") from e
    try:
        existing = set(admin.list_topics())
        wanted = [t for t in service_topics(settings) if t not in existing]
        created = []
        for name in wanted:
            try:
                admin.create_topics([new_topic(settings, name)])
                created.append(name)
            except TopicAlreadyExistsError:
                pass
        described = admin.describe_topics(service_topics(settings))
        for topic in described:
            n = len(topic.get("partitions") or [])
            if n and n < settings.partitions:
                log.warning(
                    "topic %s has %d partitions, fewer than kafka.partitions=%d: at most %d workers share it",
                    topic["name"],  # kafka-python 3 names the field as the protocol does
                    n,
                    settings.partitions,
                    n,
                )
        return created
    except KafkaError as e:
        raise TopicError(f"Kafka at {settings.bootstrap_servers} refused topic creation: {e}") from e
    finally:
        admin.close()
