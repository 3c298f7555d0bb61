"""A worker stage on aiokafka directly: one topic, its own consumer group, a whole poll at a time.

Faust delivers records to an agent one by one through its own fetch, dispatch and stream machinery, which costs
several times what the worker does with them (docs/benchmarks.md, "The assemble stage without Faust"). A
`PollStage` reads its topic with its own `AIOKafkaConsumer` and, for each poll:

1. hands the records of the partitions it owns to `process` (the subclass), which sends what they produce with
   `send` and returns, per partition, the offset up to which it finished them;
2. seeks back to those offsets where records past them were left unfinished, so those come again;
3. waits until the broker has acknowledged every send, then commits those offsets (`committable`: a subclass whose
   work outlives the poll, as `ScoreStage`'s does, commits each partition up to its first record still in work, and
   commits between polls too when that work finishes, `pending`).

No record can stop a partition: a record `send` is refused before it reaches the producer when it is larger than
``kafka.max_record_bytes`` allows (`RecordTooLarge`), and a poll whose `process` raises anything but a broker error is
processed again a record at a time; a record that fails again alone is *quarantined*: sent to the dead-letter topic
(reason ``quarantined``, the error's class and message, the record kept as every dead letter keeps it), counted in
``convowatch_quarantined_records_total`` and logged with its traceback, and the partition goes on. What the failed
run had sent already is sent again (closed conversations and scores are deduplicated downstream). A broker error
still stops the worker: it is not the record's fault, and the poll comes again after the restart.

Step 3 runs while the next poll is fetched and processed (the broker's round trips no longer idle the stage), one
poll's at a time and in poll order, so an offset is committed only once every record sent before it is acknowledged.
A crash anywhere before 3 delivers the poll again; a send that fails stops the worker rather than commit past it.
`process` runs under `lock`, which a rebalance takes too: the poll in flight finishes, the work beyond it finishes or
is called off (`drain`), and what finished commits before partitions are revoked (`revoked`) or assigned
(`assigned`). `interrupt` runs first, before the lock is taken (and when the stage stops), so a subclass can call off
what could hold the poll (a judge budget wait), and `resume` once the new assignment is in place. A poll processed for longer than half of ``kafka.max_poll_interval_s`` has the consumer keep
polling meanwhile with its partitions paused: Kafka takes a consumer that stops polling that long for stalled.

A group with no offsets in its topic yet first takes those of the Faust workers' group (``kafka.app_id``, the
``faust`` consumer), if that has any (else it starts at the earliest offsets): a deployment switched from ``faust``
goes on where it was instead of judging everything again.
"""

from __future__ import annotations

import asyncio
import logging
import traceback
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import CommitFailedError, IllegalStateError, KafkaError
from aiokafka.structs import ConsumerRecord

from scorers.errors import ServiceError
from stream.broker_loss import BrokerLossWatch
from stream.contract import DEAD_LETTER_KEY_BYTES, RECORD_HEADROOM_BYTES, DeadLetter
from stream.metrics import ServiceMetrics
from stream.settings import Settings

log = logging.getLogger(__name__)
T = TypeVar("T")
RETRY_BACKOFF_S = 0.5

Polled = dict[int, list[ConsumerRecord]]  # partition -> its records of one poll, in offset order
NOT_THE_RECORD = (KafkaError, asyncio.CancelledError)  # errors a poll raises that are no reason to quarantine a record


class RecordTooLarge(ServiceError):
    """A record a stage would send that is larger than ``kafka.max_record_bytes`` allows (with room for the batch)."""


async def partition_lag(consumer: Any, tp: Any) -> int | None:
    """High-water mark minus position of ``tp`` for an aiokafka consumer or Faust's (same two calls); None if the
    broker has not reported a high-water mark, or if the partition was revoked while this asked (a rebalance ends in
    the consumer's own task or thread): aiokafka asserts in ``highwater`` and raises in ``position``."""
    try:
        highwater = consumer.highwater(tp)
        position = await consumer.position(tp)
    except (AssertionError, IllegalStateError):
        return None
    if highwater is None or position is None:
        return None
    return int(highwater - position)


class PollStage:
    """One topic read a poll at a time (see the module): `start`, then `run` until `stop`."""

    name = "stage"  # in log lines and client ids

    def __init__(self, settings: Settings, metrics: ServiceMetrics, topic: str, max_poll_records: int, poll_wait_s: float):
        self.settings = settings
        self.metrics = metrics
        self.topic = topic
        self.group_id = f"{settings.kafka.app_id}-{self.name}"
        self.max_poll_records = max_poll_records
        self.poll_wait_s = poll_wait_s
        self.partitions: set[int] = set()  # partitions owned and ready (`assigned` has run for them)
        self.lock = asyncio.Lock()  # held while a poll or a rebalance runs (and whatever else reads the stage's state)
        self.loss_watch = BrokerLossWatch(metrics, "worker", (topic,))
        metrics.quarantined_records.labels(self.name)  # at 0 from the start: Prometheus sees the first one as an increase
        self._committed: dict[int, int] = {}  # partition -> the offset this worker last committed there
        self._sends: list[asyncio.Future] = []
        self._last_commit: asyncio.Future | None = None  # step 3 of the last poll (see the module)
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
            max_poll_records=self.max_poll_records,
            fetch_max_wait_ms=int(k.fetch_max_wait_s * 1000),
            session_timeout_ms=int(k.session_timeout_s * 1000),
            heartbeat_interval_ms=int(k.heartbeat_interval_s * 1000),
            max_poll_interval_ms=int(k.max_poll_interval_s * 1000),
            group_instance_id=k.group_instance_id,
        )
        self.producer = AIOKafkaProducer(
            bootstrap_servers=k.bootstrap_servers,
            client_id=f"{self.group_id}-producer",
            # A partition's records of a poll go in one batch of up to the largest record (the broker takes that much
            # at once): aiokafka keeps one open batch per partition and a send that finds it full waits until it is
            # sent, so with its 16 KB batches a poll's few hundred KB waited for several round trips in turn.
            max_batch_size=k.max_record_bytes,
            max_request_size=k.max_record_bytes,
            acks="all",
        )
        self._started = True
        await self._adopt_faust_offsets()
        await self.producer.start()
        await self.consumer.start()
        self.consumer.subscribe([self.topic], listener=_Rebalance(self))

    async def run(self) -> None:
        """Process polls until `stop`; a failed send stops the worker (raised)."""
        self._ran_out.clear()
        try:
            while not self._stopping:
                polled = await self.consumer.getmany(timeout_ms=int(self.poll_wait_s * 1000))
                if self._last_commit is not None and self._last_commit.done():
                    await self._finish_last_commit()  # raises what failed (a send) without waiting for the next poll
                if (polled or self.pending()) and not self._stopping:
                    async with self.lock:
                        await self._while_polling(self._poll({tp.partition: records for tp, records in polled.items()}))
            async with self.lock:
                await self._settle(set(self.partitions))
        finally:
            try:
                self.abandon()
                await self._finish_last_commit()
            finally:
                self._ran_out.set()

    async def _while_polling(self, work: Awaitable[None]) -> None:
        """Await ``work``; if it runs past half of ``kafka.max_poll_interval_s``, poll the consumer meanwhile with its
        partitions paused (polls return nothing): Kafka takes a consumer that stops polling that long for stalled and
        rebalances its group, and a poll can wait that long (a spent judge budget). Only then: a poll of paused
        partitions throws away what the consumer had fetched ahead, so the next poll would wait for the broker."""
        task = asyncio.ensure_future(work)
        try:
            await asyncio.wait({task}, timeout=self.settings.kafka.max_poll_interval_s / 2)
            if not task.done():
                await self._keep_polling_until(task)
        finally:
            if not task.done():  # cancelled (the worker stops): do not leave the poll running unawaited
                task.cancel()
        task.result()

    async def _keep_polling_until(self, task: asyncio.Future) -> None:
        self.consumer.pause(*self.consumer.assignment())
        try:
            while not task.done():
                keepalive = asyncio.ensure_future(self.consumer.getmany(timeout_ms=int(self.poll_wait_s * 1000)))
                await asyncio.wait({task, keepalive}, return_when=asyncio.FIRST_COMPLETED)
                if not keepalive.done():
                    keepalive.cancel()
                    await asyncio.gather(keepalive, return_exceptions=True)
                else:
                    for tp, records in keepalive.result().items():  # not expected of paused partitions: read them again
                        self.consumer.seek(tp, records[0].offset)
        finally:
            self.consumer.resume(*self.consumer.paused())

    async def stop(self) -> None:
        """Let the poll in flight finish (it commits), then leave the group and flush the producer."""
        self._stopping = True
        if not self._started:
            return
        self.interrupt()
        await self._ran_out.wait()
        await self.consumer.stop()
        await self.producer.stop()

    async def send(self, topic: str, key: bytes | None, value: bytes | None, partition: int | None = None) -> None:
        """Send a record; the poll commits only once the broker has acknowledged it. A value over
        ``kafka.max_record_bytes`` less RECORD_HEADROOM_BYTES, or a key over DEAD_LETTER_KEY_BYTES, raises `RecordTooLarge`
        (the producer would refuse the record)."""
        # The headroom beside a value holds the key (a conversation id, or a dead letter's cut key) and the framing.
        limit = self.settings.kafka.max_record_bytes - RECORD_HEADROOM_BYTES
        if len(value or b"") > limit or len(key or b"") > DEAD_LETTER_KEY_BYTES:
            raise RecordTooLarge(
                f"a {topic} record of {len(value or b'')} bytes under a {len(key or b'')}-byte key: a value may take "
                f"{limit} bytes, a key {DEAD_LETTER_KEY_BYTES}"
            )
        self._sends.append(await self.producer.send(topic, key=key, value=value, partition=partition))

    async def send_dead_letter(self, letter: DeadLetter) -> None:
        """`send` ``letter`` to the dead-letter topic, its original cut to what fits in one record."""
        k = self.settings.kafka
        await self.send(k.dead_letter_topic, letter.record_key, letter.record_value(k.max_record_bytes))

    async def _process_alone(self, polled: Polled) -> dict[int, int]:
        """`process` each record of ``polled`` by itself, quarantining those that fail; per partition, the offset up
        to which it finished (as `process` returns it)."""
        finished: dict[int, int] = {}
        for p, records in polled.items():
            for record in records:
                try:
                    done = (await self.process({p: [record]})).get(p, record.offset)
                except NOT_THE_RECORD:
                    raise
                except Exception as e:
                    await self._quarantine(record, e)
                    done = record.offset + 1
                finished[p] = done
                if done <= record.offset:  # left unfinished (it comes again): so are the records after it
                    break
        return finished

    async def _quarantine(self, record: ConsumerRecord, error: Exception) -> None:
        """Send ``record``, which failed twice, to the dead-letter topic with ``error`` (see the module)."""
        kind = type(error).__name__
        frames = "".join(traceback.format_tb(error.__traceback__))  # frames only: the message may quote conversation text
        log.error(
            "%s: %s partition %d offset %d failed twice (%s): quarantined to the dead-letter topic\n%s",
            self.name, record.topic, record.partition, record.offset, kind, frames,
        )  # fmt: skip
        self.metrics.quarantined_records.labels(self.name).inc()
        self.metrics.dead_letters.labels("quarantined").inc()
        await self.send_dead_letter(DeadLetter.of_message("quarantined", f"{self.name} stage: {kind}: {error}", record))

    async def _poll(self, polled: Polled) -> None:
        # Records of a partition revoked between the poll and now are left to its next owner (not committed here).
        polled = {p: records for p, records in polled.items() if p in self.partitions and records}
        finished: dict[int, int] = {}
        if polled:
            try:
                finished = await self.process(polled)
            except NOT_THE_RECORD:
                raise
            except Exception as e:
                log.warning("%s: a poll failed (%s); processing its records one at a time", self.name, type(e).__name__)
                finished = await self._process_alone(polled)
            finished = {p: finished[p] for p in polled if p in finished}
            for p, records in polled.items():
                if finished.get(p, records[0].offset) <= records[-1].offset:  # left some unfinished: read them again
                    self.consumer.seek(TopicPartition(self.topic, p), finished.get(p, records[0].offset))
        await self._commit(finished)

    async def _settle(self, partitions: set[int]) -> None:
        """Before ``partitions`` are given up (a rebalance or a stop; the caller holds the lock): the work beyond the
        polls finishes or is called off (`drain`), and what finished is committed."""
        await self.drain(partitions)
        await self._commit({})

    async def _commit(self, finished: dict[int, int]) -> None:
        """Commit `committable` ``finished`` once every record sent so far is acknowledged (in the background, after
        the last such commit). Sends made while nothing new can be committed wait for the next commit."""
        offsets = self.committable(finished)
        if not offsets:
            return
        sends, self._sends = self._sends, []  # with no await since `committable`: each send it counted is among them
        await self._finish_last_commit()  # commits in poll order
        self._last_commit = asyncio.ensure_future(self._commit_once_sent(sends, offsets))

    async def _commit_once_sent(self, sends: list[asyncio.Future], offsets: dict[int, int]) -> None:
        await asyncio.gather(*sends)
        try:
            await self.consumer.commit({TopicPartition(self.topic, p): o for p, o in offsets.items()})
        except (CommitFailedError, IllegalStateError) as e:  # a rebalance: the partitions' next owner reads them again
            log.warning("%s: offsets %s not committed (%s); they will be delivered again", self.name, offsets, e)
            return
        self._committed.update(offsets)

    async def _finish_last_commit(self) -> None:
        """Wait until the last poll's sends are acknowledged and its offsets committed; raise if a send failed."""
        commit, self._last_commit = self._last_commit, None
        if commit is not None:
            await commit

    async def wait_for_last_commit(self) -> None:
        """Wait until the last poll's offsets are committed (or failed to be: `run` raises that, this does not)."""
        if self._last_commit is not None:
            await asyncio.wait({self._last_commit})

    async def process(self, polled: Polled) -> dict[int, int]:
        """Process one poll: send what it produces (`send`); per partition, the offset after the last record of the
        unbroken run it finished from the start (the next one to read)."""
        raise NotImplementedError

    def committable(self, finished: dict[int, int]) -> dict[int, int]:
        """The offsets to commit after a poll whose `process` returned ``finished`` (empty: no poll, see `pending`). A
        stage whose work outlasts its poll commits less: each partition up to its first record still in work."""
        return finished

    def pending(self) -> bool:
        """Whether work done beyond the polls waits to be committed though no poll brings records."""
        return False

    async def drain(self, partitions: set[int]) -> None:
        """Before ``partitions`` are given up (the caller holds the lock): let their work still running beyond the
        polls finish, or call it off (its records are read again by their next owner)."""

    def abandon(self) -> None:
        """The stage stops on an error: call off all work still running beyond the polls, at once."""

    # -- rebalances -------------------------------------------------------------

    def interrupt(self) -> None:
        """A rebalance or a stop begins (the poll in flight may still run): call off what could hold it."""

    def resume(self) -> None:
        """The rebalance is over: the new assignment is in place."""

    async def revoked(self, partitions: set[int]) -> None:
        """``partitions`` are no longer this worker's (the caller holds the lock)."""
        self.partitions -= partitions

    async def assigned(self, partitions: set[int]) -> None:
        """``partitions`` are newly this worker's (the caller holds the lock): checks that the broker kept this
        group's offsets of them."""
        self.partitions |= partitions
        committed = {}
        for p in sorted(partitions):
            if p in self._committed:
                tp = TopicPartition(self.topic, p)
                committed[(self.topic, p)] = (await self.consumer.committed(tp), self._committed[p])
        self.loss_watch.confirm(committed)

    async def _adopt_faust_offsets(self) -> None:
        """A deployment switched from ``kafka.consumer`` faust: its workers' group (``kafka.app_id``) committed how far
        they got in this topic. If this stage's group has no offsets in it yet, commit those as its own before it
        joins, so it starts there rather than read the topic again from its start (every conversation closed and
        judged again). The Faust workers must all have stopped: the two groups do not share the work."""
        k = self.settings.kafka
        admin = AIOKafkaAdminClient(bootstrap_servers=k.bootstrap_servers)
        await admin.start()
        try:
            [topic] = await admin.describe_topics([self.topic])
            tps = [TopicPartition(self.topic, p["partition"]) for p in topic["partitions"]]
            if not tps:
                return
            ours = await _retrying(lambda: admin.list_consumer_group_offsets(self.group_id, partitions=tps), k.admin_timeout_s)
            if any(meta.offset >= 0 for meta in ours.values()):
                return
            faust = await _retrying(lambda: admin.list_consumer_group_offsets(k.app_id, partitions=tps), k.admin_timeout_s)
        finally:
            await admin.close()
        offsets = {tp: meta.offset for tp, meta in faust.items() if meta.offset >= 0}
        if not offsets:
            return
        committer = AIOKafkaConsumer(bootstrap_servers=k.bootstrap_servers, group_id=self.group_id, enable_auto_commit=False)
        await committer.start()
        try:
            committer.assign(list(offsets))
            await committer.commit(offsets)
        finally:
            await committer.stop()
        log.info("%s: starts %s where the group %s left it: %s", self.name, self.topic, k.app_id, sorted(offsets.items()))

    # -- what the idle timer reads --------------------------------------------------

    async def lags(self) -> dict[tuple[str, int], int]:
        """High-water mark minus position of each owned partition whose high-water mark the broker has reported."""
        lags = {}
        for p in sorted(self.partitions):  # a partition revoked while the listener has yet to run has no lag
            lag = await partition_lag(self.consumer, TopicPartition(self.topic, p))
            if lag is not None:
                lags[(self.topic, p)] = lag
        return lags

    async def check_broker_loss(self, lags: dict[tuple[str, int], int]) -> None:
        """Confirm partitions of this stage's topic whose log now ends below this worker's position (`BrokerLossWatch`;
        ``lags`` may hold other stages' topics too: those are theirs to check, with their group's offsets)."""
        committed = {}
        for topic, p in self.loss_watch.suspects({tp: lag for tp, lag in lags.items() if tp[0] == self.topic}):
            committed[(topic, p)] = (await self.consumer.committed(TopicPartition(topic, p)), self._committed.get(p))
        self.loss_watch.confirm(committed)


class _Rebalance(ConsumerRebalanceListener):
    """aiokafka awaits these during a rebalance, before the group rejoins and after it."""

    def __init__(self, stage: PollStage) -> None:
        self.stage = stage

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        self.stage.interrupt()
        partitions = {tp.partition for tp in revoked} & self.stage.partitions
        async with self.stage.lock:  # the poll in flight finishes and commits first, then what runs beyond it
            await self.stage._settle(partitions)
            await self.stage.wait_for_last_commit()
            await self.stage.revoked(partitions)

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        partitions = {tp.partition for tp in assigned}
        async with self.stage.lock:
            await self.stage.wait_for_last_commit()
            await self.stage.revoked(self.stage.partitions - partitions)
            new = partitions - self.stage.partitions
            if new:
                await self.stage.assigned(new)
        self.stage.resume()


async def _retrying(call: Callable[[], Awaitable[T]], timeout_s: float) -> T:
    """``await call()``, again after a retriable broker error (a coordinator not yet elected or still loading, as on a
    broker that has just started) until ``timeout_s`` has passed; then the last error is raised."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        try:
            return await call()
        except KafkaError as e:
            if not e.retriable or asyncio.get_running_loop().time() + RETRY_BACKOFF_S > deadline:
                raise
            log.info("broker not ready (%s); retrying", e)
            await asyncio.sleep(RETRY_BACKOFF_S)
