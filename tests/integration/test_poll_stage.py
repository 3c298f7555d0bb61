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
