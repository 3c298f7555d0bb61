"""Publishing replayed events to the events topic (kafka-python), validated first, paced, with progress."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from kafka import KafkaProducer
from kafka.errors import KafkaError

from stream.replay.sources import ReplayItem, paced
from stream.settings import KafkaSettings
from stream.topics import TopicError


@dataclass
class PublishReport:
    sent: int = 0
    skipped: int = 0
    skipped_where: list[str] = field(default_factory=list)


def invalid_items(items: Sequence[ReplayItem]) -> list[ReplayItem]:
    """The items that break the event contract (validated by the source)."""
    return [item for item in items if item.error is not None]


def publish(
    items: Iterable[ReplayItem],
    settings: KafkaSettings,
    speed: float = 0.0,
    on_sent: Callable[[ReplayItem], None] | None = None,
) -> PublishReport:
    """Send valid items to the events topic at ``speed``× event time (0 = as fast as possible); skip invalid ones.

    Waits for every send to be acknowledged; a broker failure raises `TopicError`.
    """
    report = PublishReport()
    try:
        producer = KafkaProducer(
            bootstrap_servers=settings.bootstrap_servers.split(","),
            client_id="convowatch-replay",
            acks="all",
            linger_ms=5,
            retries=5,
            max_block_ms=int(settings.admin_timeout_s * 1000),
        )
    except KafkaError as e:
        raise TopicError(f"cannot reach Kafka at {settings.bootstrap_servers}: {e}") from e
    try:
        for item in paced(items, speed):
            if item.error is not None:
                report.skipped += 1
                report.skipped_where.append(f"{item.where}: {item.error.reason}: {item.error.detail}")
                continue
            producer.send(settings.events_topic, key=item.key, value=item.raw)
            report.sent += 1
            if on_sent is not None:
                on_sent(item)
        producer.flush()
    except KafkaError as e:
        raise TopicError(f"publishing to {settings.events_topic} at {settings.bootstrap_servers} failed: {e}") from e
    finally:
        producer.close()
    return report
