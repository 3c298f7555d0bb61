"""`PollStage` (stream/poll_stage.py) overlaps a poll's acknowledgements and commit with the next poll, and keeps
at-least-once: an offset is committed only once every record sent before it is acknowledged, and stopping commits
the last poll.

The session's broker and a stage of this test's own that copies every record of one topic to another, 40 records a
poll: simpler to follow than the worker's stages and the same `PollStage` underneath.
"""

from __future__ import annotations

import asyncio
import uuid

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from stream.contract import DeadLetter
from stream.poll_stage import Polled, PollStage
from stream.service import new_metrics
from stream.settings import Settings

RECORDS = 600
PER_POLL = 40


class CopyStage(PollStage):
    """Copies its topic to ``out``; notes, as each poll begins, what the broker holds as committed and which earlier
    polls' sends were all acknowledged by then."""

    name = "copy"

    def __init__(self, settings: Settings, out: str) -> None:
        super().__init__(settings, new_metrics(settings), settings.kafka.events_topic, PER_POLL, poll_wait_s=0.1)
        self.out = out
        self.sent: list[tuple[int, list[asyncio.Future]]] = []  # per poll: its end offset, its sends
        self.unacknowledged_but_committed: list[tuple[int, int]] = []  # (poll end, committed) seen out of order
        self.began_before_last_acknowledged = 0

    async def process(self, polled: Polled) -> dict[int, int]:
        if self.sent and not all(f.done() for f in self.sent[-1][1]):
            self.began_before_last_acknowledged += 1
        committed = await self.consumer.committed(TopicPartition(self.topic, 0)) or 0  # a round trip: looked at second
        for end, sends in self.sent:
            if end <= committed and not all(f.done() for f in sends):
                self.unacknowledged_but_committed.append((end, committed))
        for record in polled[0]:
            await self.send(self.out, record.key, record.value)
        self.sent.append((polled[0][-1].offset + 1, list(self._sends)))
        return {0: polled[0][-1].offset + 1}


async def _copy(bootstrap: str) -> tuple[CopyStage, int, list[bytes]]:
    source, out = f"copy-in-{uuid.uuid4().hex[:8]}", f"copy-out-{uuid.uuid4().hex[:8]}"
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(t, num_partitions=1, replication_factor=1) for t in (source, out)])
    finally:
        await admin.close()
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        for i in range(RECORDS):
            await producer.send(source, f"record {i}".encode())
        await producer.flush()
    finally:
        await producer.stop()

    settings = Settings(kafka={"bootstrap_servers": bootstrap, "events_topic": source, "app_id": f"copy-{uuid.uuid4().hex[:8]}"})
    stage = CopyStage(settings, out)
    await stage.start()
    running = asyncio.ensure_future(stage.run())
    while not stage.sent or stage.sent[-1][0] < RECORDS:
        await asyncio.sleep(0.05)
        if running.done():
            running.result()
    await stage.stop()
    await running

    reader = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=stage.group_id, enable_auto_commit=False)
    await reader.start()
    try:
        committed = await reader.committed(TopicPartition(source, 0))
        reader.assign([TopicPartition(out, 0)])
        await reader.seek_to_beginning(TopicPartition(out, 0))
        copied: list[bytes] = []
        while len(copied) < RECORDS:
            batches = await reader.getmany(timeout_ms=2000)
            if not batches:
                break
            copied += [r.value for rs in batches.values() for r in rs]
    finally:
        await reader.stop()
    return stage, committed, copied


def test_a_poll_is_processed_while_the_last_ones_sends_wait_and_no_offset_is_committed_before_its_records_are_acknowledged(
    kafka_broker: str,
) -> None:
    stage, committed, copied = asyncio.run(_copy(kafka_broker))

    assert copied == [f"record {i}".encode() for i in range(RECORDS)]
    assert committed == RECORDS  # stopping commits the last poll (its commit runs after the poll)
    assert len(stage.sent) >= RECORDS // PER_POLL
    assert stage.unacknowledged_but_committed == []
    # The overlap itself: before, every poll waited for its acknowledgements and commit, so none began before them.
    assert stage.began_before_last_acknowledged >= 1, stage.sent


class FaultyCopyStage(PollStage):
    """Copies its topic to ``out`` a poll at a time, failing where a bug would: a stand-in, since no input is known
    that makes the worker's own stages fail any more (a record the bounds did not foresee is what this guards)."""

    name = "faulty-copy"

    def __init__(self, settings: Settings, out: str) -> None:
        super().__init__(settings, new_metrics(settings), settings.kafka.events_topic, PER_POLL, poll_wait_s=0.1)
        self.out = out
        self.failed_once: set[bytes] = set()
        self.last_end = 0

    async def process(self, polled: Polled) -> dict[int, int]:
        for record in polled[0]:
            if record.value == b"bug":
                raise KeyError("a bug that this record meets every time")
            if record.value == b"transient" and record.value not in self.failed_once:
                self.failed_once.add(record.value)
                raise RuntimeError("fails once, then works")
            value = b"x" * self.settings.kafka.max_record_bytes if record.value == b"huge" else record.value
            await self.send(self.out, record.key, value)
        self.last_end = polled[0][-1].offset + 1
        return {0: self.last_end}


def test_a_record_that_fails_twice_is_quarantined_and_the_partition_goes_on(kafka_broker: str) -> None:
    """Issue 54: a record a stage fails on crash-looped the worker. Now the poll runs again record by record and the
    record that fails again alone goes to the dead-letter topic with its error; one that fails once is processed."""
    values = [f"record {i}".encode() for i in range(100)]
    values[10], values[55], values[70] = b"bug", b"transient", b"huge"

    async def scenario() -> tuple[FaultyCopyStage, list[bytes], list[DeadLetter], int]:
        source, out, dead = (f"{name}-{uuid.uuid4().hex[:8]}" for name in ("faulty-in", "faulty-out", "faulty-dead"))
        admin = AIOKafkaAdminClient(bootstrap_servers=kafka_broker)
        await admin.start()
        try:
            await admin.create_topics([NewTopic(t, num_partitions=1, replication_factor=1) for t in (source, out, dead)])
        finally:
            await admin.close()
        producer = AIOKafkaProducer(bootstrap_servers=kafka_broker)
        await producer.start()
        try:
            for value in values:
                await producer.send(source, value, key=b"k")
            await producer.flush()
        finally:
            await producer.stop()
        kafka = {"bootstrap_servers": kafka_broker, "events_topic": source, "dead_letter_topic": dead}
        stage = FaultyCopyStage(Settings(kafka={**kafka, "app_id": f"faulty-{uuid.uuid4().hex[:8]}"}), out)
        await stage.start()
        running = asyncio.ensure_future(stage.run())
        while stage.last_end < len(values):
            await asyncio.sleep(0.05)
            if running.done():
                running.result()
        await stage.stop()
        await running
        copied = await _read_all(kafka_broker, out, len(values) - 2)
        letters = [DeadLetter.from_json(v) for v in await _read_all(kafka_broker, dead, 2)]
        reader = AIOKafkaConsumer(bootstrap_servers=kafka_broker, group_id=stage.group_id, enable_auto_commit=False)
        await reader.start()
        try:
            committed = await reader.committed(TopicPartition(source, 0))
        finally:
            await reader.stop()
        return stage, copied, letters, committed

    stage, copied, letters, committed = asyncio.run(scenario())
    # In order, the transient one too; what a failed poll had sent before it failed comes twice (at least once).
    assert list(dict.fromkeys(copied)) == [v for v in values if v not in (b"bug", b"huge")]
    assert [(d.reason, d.original, d.offset) for d in letters] == [("quarantined", b"bug", 10), ("quarantined", b"huge", 70)]
    assert letters[0].detail.startswith("faulty-copy stage: KeyError")
    assert letters[1].detail.startswith("faulty-copy stage: RecordTooLarge")
    assert committed == len(values)
    samples = [s for m in stage.metrics.quarantined_records.collect() for s in m.samples if s.name.endswith("_total")]
    assert {s.labels["stage"]: s.value for s in samples} == {"faulty-copy": 2.0}


async def _read_all(bootstrap: str, topic: str, at_least: int) -> list[bytes]:
    reader = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await reader.start()
    try:
        tp = TopicPartition(topic, 0)
        reader.assign([tp])
        await reader.seek_to_beginning(tp)
        values: list[bytes] = []
        while True:
            batches = await reader.getmany(timeout_ms=3000)
            if not batches and len(values) >= at_least:
                return values
            if not batches:
                raise AssertionError(f"{topic}: {len(values)} records, expected at least {at_least}")
            values += [r.value for rs in batches.values() for r in rs]
    finally:
        await reader.stop()
