"""The stack's Apache Kafka with real clients: kafka-python, aiokafka, a crash, a record Kafka refuses.

The broker runs as the stack starts it (its own process, Kafka's defaults); it is killed with SIGKILL and started
again on the same directory, and everything acknowledged with ``acks=all`` before the kill must be there: records at
the same offsets, the groups' committed offsets, idempotent producers' batches not duplicated.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewTopic
from kafka.errors import MessageSizeTooLargeError

from deploy.local.stack import StackConfig
from tests.infra import crash_and_restart, own_broker

TOPIC = "orders"
PARTITIONS = 4


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[StackConfig]:
    with own_broker(tmp_path / "stack") as cfg:
        yield cfg


def _bootstrap(cfg: StackConfig) -> str:
    return f"127.0.0.1:{cfg.kafka_port}"


def _read_all(bootstrap: str, partitions: int = PARTITIONS) -> dict[tuple[int, int], bytes]:
    """(partition, offset) → value of every record of the topic, read without a group."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap.split(","), enable_auto_commit=False, consumer_timeout_ms=5000)
    tps = [TopicPartition(TOPIC, p) for p in range(partitions)]
    consumer.assign(tps)
    consumer.seek_to_beginning(*tps)
    out = {(m.partition, m.offset): m.value for m in consumer}
    consumer.close()
    return out


async def _aiokafka_produce(bootstrap: str, n: int) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, acks="all")
    await producer.start()
    try:
        for i in range(n):
            await producer.send(TOPIC, key=b"a%d" % (i % 7), value=b"aiokafka-%d" % i)
        await producer.flush()
    finally:
        await producer.stop()


def test_acknowledged_records_and_commits_survive_a_crash(broker: StackConfig) -> None:
    bootstrap = _bootstrap(broker)
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1)])
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, acks="all")  # idempotent by default (kafka-python 3)
    for i in range(500):
        producer.send(TOPIC, key=b"k%d" % (i % 13), value=b"kafka-python-%d" % i)
    producer.flush()
    producer.close()
    asyncio.run(_aiokafka_produce(bootstrap, 300))
    consumer = KafkaConsumer(
        TOPIC, bootstrap_servers=bootstrap, group_id="readers", auto_offset_reset="earliest", enable_auto_commit=False
    )
    seen = 0
    while seen < 400:
        seen += sum(len(b) for b in consumer.poll(timeout_ms=500).values())
    consumer.commit()
    committed = {tp.partition: om.offset for tp, om in admin.list_group_offsets("readers")["readers"].items()}
    consumer.close()
    admin.close()
    before = _read_all(bootstrap)
    assert len(before) == 800 and sorted(before.values()) == sorted(
        [b"kafka-python-%d" % i for i in range(500)] + [b"aiokafka-%d" % i for i in range(300)]
    )

    crash_and_restart(broker)

    assert _read_all(bootstrap) == before
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    after = {tp.partition: om.offset for tp, om in admin.list_group_offsets("readers")["readers"].items()}
    assert after == committed and sum(committed.values()) >= 400
    assert len(admin.describe_topics([TOPIC])[0]["partitions"]) == PARTITIONS
    admin.close()
    producer = KafkaProducer(bootstrap_servers=bootstrap)
    metadata = producer.send(TOPIC, partition=0, value=b"after the crash").get(timeout=30)
    producer.close()
    assert metadata.offset == 1 + max(o for p, o in before if p == 0)


def test_two_aiokafka_consumers_split_the_partitions_and_read_everything_once(broker: StackConfig) -> None:
    bootstrap = _bootstrap(broker)
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1)])
    admin.close()
    asyncio.run(_aiokafka_produce(bootstrap, 1000))

    async def consume() -> tuple[list[set[int]], list[tuple[int, int]]]:
        consumers = [
            AIOKafkaConsumer(
                TOPIC,
                bootstrap_servers=bootstrap,
                group_id="pair",
                auto_offset_reset="earliest",
            )
            for _ in range(2)
        ]
        for c in consumers:
            await c.start()
        got: list[tuple[int, int]] = []
        try:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 60
            while loop.time() < deadline and not (len(set(got)) == 1000 and all(c.assignment() for c in consumers)):
                for c in consumers:
                    for tp, msgs in (await c.getmany(timeout_ms=100)).items():
                        got.extend((tp.partition, m.offset) for m in msgs)
            return [{tp.partition for tp in c.assignment()} for c in consumers], got
        finally:
            for c in consumers:
                await c.stop()

    assignments, got = asyncio.run(consume())
    assert sorted(assignments[0] | assignments[1]) == list(range(PARTITIONS)) and not assignments[0] & assignments[1]
    assert len(set(got)) == 1000


def test_a_record_larger_than_the_topic_takes_is_refused_to_the_producer(broker: StackConfig) -> None:
    """Kafka refuses a record over the topic's ``max.message.bytes`` (default 1,048,588 bytes a batch) with
    MESSAGE_TOO_LARGE, even from a producer whose own limit would let it through."""
    bootstrap = _bootstrap(broker)
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1)])
    admin.close()
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", max_request_size=4_000_000, retries=0)
    with pytest.raises(MessageSizeTooLargeError):
        producer.send(TOPIC, partition=0, value=b"x" * 2_000_000).get(timeout=30)
    assert producer.send(TOPIC, partition=0, value=b"x" * 1_000_000).get(timeout=30).offset == 0  # under the limit
    producer.close()
    assert list(_read_all(bootstrap)) == [(0, 0)]
