"""The assemble stage on aiokafka directly: events topic → closed topic, a whole poll at a time.

Faust delivers events to an agent one by one through its own fetch, dispatch and stream machinery, which costs
several times what assembling them does (docs/benchmarks.md, "The assemble stage without Faust"). This stage reads
the events topic with its own `AIOKafkaConsumer` (consumer group ``<kafka.app_id>-assemble``) and, for each poll:

1. applies the records, each partition's in offset order, with `BatchAssembler` (stream/batch_assembly.py);
2. sends the closed conversations, the dead letters, and one changelog record per conversation the poll changed
   (the conversation's state, or a tombstone, to the changelog partition of its events partition);
3. waits until the broker has acknowledged every send, then commits the poll's offsets.

A crash anywhere before 3 delivers the poll again (a redelivered turn is recognised by its fingerprint, a
conversation closed twice is deduplicated downstream); a send that fails stops the worker rather than commit past it.

The states of the partitions this worker owns live in memory (`states`) and in the changelog topic
(``<app_id>-conversations-changelog``, the name and record format of the Faust table it replaces). When partitions
are assigned, their states are read back from the changelog before any of their events is processed, keeping every
record of each fetched batch (tansu reports a batch's first offset as the end of a log, so a reader that stops at
the reported end would miss the rest of that batch); when they are revoked, the poll in flight is finished and
committed first, then their states are dropped. The group starts from the earliest offsets: switching a running
deployment from the Faust consumer would read the events topic again from its start (not supported yet).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterable
from itertools import chain

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import CommitFailedError, IllegalStateError

from stream.assembly import State
from stream.batch_assembly import BatchAssembler
from stream.broker_loss import BrokerLossWatch
from stream.contract import RECORD_HEADROOM_BYTES
from stream.metrics import ServiceMetrics
from stream.settings import Settings
from stream.state_batch import StateBatch
from stream.topics import changelog_topic

log = logging.getLogger(__name__)


class AssemblyStage:
    """The worker's assemble stage (see the module): `start`, then `run` until `stop`."""

    def __init__(self, settings: Settings, metrics: ServiceMetrics) -> None:
        self.settings = settings
        self.metrics = metrics
        k = settings.kafka
        self.events_topic = k.events_topic
        self.changelog = changelog_topic(k)
        self.group_id = f"{k.app_id}-assemble"
        self.assembly = BatchAssembler(settings.assembly, k.partitions, metrics)
        self.states: dict[str, State] = {}  # the conversations of the partitions in `partitions`
        self.partitions: set[int] = set()  # events-topic partitions owned, their states restored
        self.lock = asyncio.Lock()  # held while a poll, a restore, a revoke or the idle timer uses the states
        self.loss_watch = BrokerLossWatch(metrics, "worker", (k.events_topic,))
        self._committed: dict[int, int] = {}  # partition -> the offset this worker last committed there
        self._dead_letter_bytes = k.max_record_bytes - RECORD_HEADROOM_BYTES
        self._stopping = False
        self._ran_out = asyncio.Event()  # set when `run` has returned (or never started)
        self._ran_out.set()
        self._started = False
        self.consumer: AIOKafkaConsumer  # made by `start`
        self.producer: AIOKafkaProducer

    async def start(self) -> None:
        """Connect (aiokafka's clients are made inside the running loop) and join the group."""
        k = self.settings.kafka
        self.consumer = AIOKafkaConsumer(
            bootstrap_servers=k.bootstrap_servers,
            group_id=self.group_id,
            client_id=f"{self.group_id}-consumer",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            max_poll_records=self.settings.assembly.batch_max_events,
            fetch_max_wait_ms=int(k.fetch_max_wait_s * 1000),
            session_timeout_ms=int(k.session_timeout_s * 1000),
            heartbeat_interval_ms=int(k.heartbeat_interval_s * 1000),
            max_poll_interval_ms=int(k.max_poll_interval_s * 1000),
        )
        self.producer = AIOKafkaProducer(
            bootstrap_servers=k.bootstrap_servers,
            client_id=f"{self.group_id}-producer",
            # Not kafka.producer_max_batch_size: that works around tansu's end offsets for Faust's table recovery,
            # which `_restore` does not need, and one record per request would make every poll wait for dozens of
            # round trips.
            max_request_size=k.max_record_bytes,
            acks="all",
        )
        self._started = True
        await self.producer.start()
        await self.consumer.start()
        self.consumer.subscribe([self.events_topic], listener=_Rebalance(self))

    async def run(self) -> None:
        """Process polls until `stop`; a failed send or state write stops the worker (raised)."""
        wait_ms = int(self.settings.assembly.batch_max_wait_s * 1000)
        self._ran_out.clear()
        try:
            while not self._stopping:
                polled = await self.consumer.getmany(timeout_ms=wait_ms)
                if polled and not self._stopping:
                    async with self.lock:
                        await self._process({tp.partition: records for tp, records in polled.items()})
        finally:
            self._ran_out.set()

    async def stop(self) -> None:
        """Let the poll in flight finish (it commits), then leave the group and flush the producer."""
        self._stopping = True
        if not self._started:
            return
        await self._ran_out.wait()
        await self.consumer.stop()
        await self.producer.stop()

    async def _process(self, polled: dict[int, list]) -> None:
        # Records of a partition revoked between the poll and now are left to its next owner (not committed here).
        polled = {p: records for p, records in polled.items() if p in self.partitions}
        batch = StateBatch(self.states)
        out = self.assembly.apply(chain.from_iterable(polled.values()), batch)
        k = self.settings.kafka
        sends = [await self.producer.send(k.closed_topic, key=key, value=value) for key, value in out.closed]
        for letter in out.dead_letters:
            letter_json = letter.to_json(max_bytes=self._dead_letter_bytes)
            sends.append(await self.producer.send(k.dead_letter_topic, key=letter.key, value=letter_json))
        for key, state, partition in batch.changes():
            state_json = None if state is None else json.dumps(state).encode("utf-8")
            sends.append(await self.producer.send(self.changelog, key=key.encode("utf-8"), value=state_json, partition=partition))
            if state is None:
                self.states.pop(key, None)
            else:
                self.states[key] = state
        await asyncio.gather(*sends)
        offsets = {p: records[-1].offset + 1 for p, records in polled.items() if records}
        try:
            await self.consumer.commit({TopicPartition(self.events_topic, p): o for p, o in offsets.items()})
        except (CommitFailedError, IllegalStateError) as e:  # a rebalance: the partitions' next owner reads them again
            log.warning("assemble: offsets %s not committed (%s); they will be delivered again", offsets, e)
            return
        self._committed.update(offsets)

    # -- rebalances -------------------------------------------------------------

    async def revoked(self, partitions: Iterable[int]) -> None:
        """Drop the states of ``partitions`` (the poll in flight has finished: the caller holds the lock)."""
        gone = set(partitions) & self.partitions
        self.partitions -= gone
        for key in [key for key, state in self.states.items() if state["partition"] in gone]:
            del self.states[key]

    async def assigned(self, partitions: Iterable[int]) -> None:
        """Read the states of newly owned ``partitions`` back from the changelog and check that the broker kept this
        group's offsets."""
        new = set(partitions) - self.partitions
        if not new:
            return
        restored = await self._restore(new)
        self.partitions |= new
        log.info("assemble: partitions %s assigned, %d conversations restored from %s", sorted(new), restored, self.changelog)
        committed = {}
        for p in sorted(new):
            tp = TopicPartition(self.events_topic, p)
            if p in self._committed:
                committed[(self.events_topic, p)] = (await self.consumer.committed(tp), self._committed[p])
        self.loss_watch.confirm(committed)

    async def _restore(self, partitions: set[int]) -> int:
        """Read the changelog partitions of ``partitions`` into `states`; how many conversations they hold."""
        tps = [TopicPartition(self.changelog, p) for p in sorted(partitions)]
        reader = AIOKafkaConsumer(
            bootstrap_servers=self.settings.kafka.bootstrap_servers, enable_auto_commit=False, group_id=None
        )
        await reader.start()
        try:
            reader.assign(tps)
            await reader.seek_to_beginning(*tps)
            ends = await reader.end_offsets(tps)
            remaining = {tp for tp in tps if await reader.position(tp) < ends[tp]}
            while remaining:
                for records in (await reader.getmany(*remaining, timeout_ms=1000)).values():
                    for record in records:  # every record of the batch, past the reported end too (see the module)
                        key = record.key.decode("utf-8")
                        if record.value is None:
                            self.states.pop(key, None)
                        else:
                            self.states[key] = json.loads(record.value)
                remaining = {tp for tp in remaining if await reader.position(tp) < ends[tp]}
        finally:
            await reader.stop()
        return sum(1 for state in self.states.values() if state["partition"] in partitions)

    # -- what the idle timer reads --------------------------------------------------

    async def lags(self) -> dict[tuple[str, int], int]:
        """High-water mark minus position of each owned partition whose high-water mark the broker has reported."""
        lags = {}
        for p in sorted(self.partitions):
            tp = TopicPartition(self.events_topic, p)
            highwater = self.consumer.highwater(tp)
            try:
                position = await self.consumer.position(tp)
            except IllegalStateError:  # revoked while the listener has yet to run
                continue
            if highwater is not None:
                lags[(self.events_topic, p)] = highwater - position
        return lags

    async def check_broker_loss(self, lags: dict[tuple[str, int], int]) -> None:
        """Confirm partitions whose log now ends below this worker's position (`BrokerLossWatch`)."""
        committed = {}
        for topic, p in self.loss_watch.suspects(lags):
            committed[(topic, p)] = (await self.consumer.committed(TopicPartition(topic, p)), self._committed.get(p))
        self.loss_watch.confirm(committed)


class _Rebalance(ConsumerRebalanceListener):
    """aiokafka awaits these during a rebalance, before the group rejoins and after it."""

    def __init__(self, stage: AssemblyStage) -> None:
        self.stage = stage

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        async with self.stage.lock:  # the poll in flight finishes and commits first
            await self.stage.revoked(tp.partition for tp in revoked)

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        async with self.stage.lock:
            await self.stage.revoked(self.stage.partitions - {tp.partition for tp in assigned})
            await self.stage.assigned(tp.partition for tp in assigned)
            self.stage.metrics.assigned_partitions.set(len(self.stage.partitions))
