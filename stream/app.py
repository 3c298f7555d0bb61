"""The worker, a Faust app: events → conversations → scores, as two stages and two timers.

    events topic ──assemble──► closed topic ──score──► scores topic
         │  (validate; state in the `conversations` table)        │
         └──► dead-letter topic                                    └──► sink (stream/sink.py) → ClickHouse

* ``assemble`` takes raw events a batch at a time and applies them with
  `BatchAssembler` (stream/batch_assembly.py: validate, apply each to its
  conversation's state, enforce the caps), publishes the closed conversations
  and the dead letters (bad events, with the original bytes and the reason),
  then writes each state the batch changed once (`StateBatch`).
* ``idle`` (a timer) publishes ``end`` events with cause ``idle_timeout`` or
  ``retention`` for conversations on this worker's partitions, into the
  partition their state lives in, so every state change happens in the
  agent, in order.
* ``refetch_stalled`` (a timer) fetches a partition again when records wait
  in it while its agent idles (`GuardedDelivery`, below).
* ``score`` scores closed conversations with the active scorer version
  (`ScorerRollout`, stream/rollout.py) and publishes one `ScoreRecord` per
  conversation, scored or unscored; when a shadow version is rolled out, it
  scores its share of the judged conversations too and publishes a second
  record (role ``shadow``). With a scorer registry, the ``scorer_rollout``
  timer switches versions without a restart. While the judge
  budget (``scoring.budget``) is spent it waits: Faust stops fetching once the
  agent's buffer is full, and offsets of conversations not yet scored stay
  uncommitted, so they wait in the closed topic. A rebalance or a shutdown
  calls such a wait off (`WorkerApp`): the conversation is left unfinished,
  so its offset stays uncommitted and it is delivered again; neither waits
  for the budget. What scoring one closed record means is `score_closed`
  (stream/score_stage.py).

With ``kafka.consumer`` batch (the default) the two agents above are two `PollStage`s instead
(stream/poll_stage.py), off Faust, each with its own aiokafka consumer group,
a whole poll at a time: `AssemblyStage` (stream/assembly_stage.py, its states
in memory and in the same changelog) and `ScoreStage` (stream/score_stage.py);
Faust then runs only the timers and its producer (its consumer is not started).

Delivery is at-least-once (`stream.delivery.GuardedDelivery`): each agent
takes a partition's events in offset order from the committed offset, an
offset is committed only after its agent has finished the event (Faust alone
would also commit events it skipped during a stop or a rebalance), and a
partition whose records were passed over or stopped arriving is fetched again.
The sink and the store make re-deliveries invisible (idempotent keys).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any, cast

import faust
from faust.app.base import BootStrategy
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import TP, EventT

from stream import changelog_codec
from stream.assembly import State, is_closed
from stream.assembly_stage import AssemblyStage
from stream.batch_assembly import BatchAssembler
from stream.broker_loss import BrokerLossWatch
from stream.budget import BudgetGate
from stream.contract import DeadLetter, EndEvent, encode_event
from stream.delivery import GuardedDelivery, in_order, in_order_batches
from stream.metrics import ServiceMetrics
from stream.poll_stage import PollStage, partition_lag
from stream.rollout import ScorerRollout
from stream.score_stage import ScoreStage, score_closed
from stream.settings import Settings
from stream.state_batch import StateBatch, write_to_table

log = logging.getLogger(__name__)

TABLE_NAME = "conversations"


def broker_urls(bootstrap_servers: str) -> list[str]:
    """``host:port,host:port`` → Faust's ``kafka://`` URLs."""
    return [f"kafka://{h.strip()}" for h in bootstrap_servers.split(",") if h.strip()]


def _transport_with_fetch_wait(fetch_max_wait_ms: int) -> type[faust_aiokafka.Transport]:
    """Faust's aiokafka transport with a configurable fetch wait (Faust hard-codes 1,500 ms)."""

    class ConsumerThread(faust_aiokafka.AIOKafkaConsumerThread):
        def _create_worker_consumer(self, transport: Any) -> Any:
            consumer = super()._create_worker_consumer(transport)
            consumer._fetch_max_wait_ms = fetch_max_wait_ms  # read by aiokafka when the consumer starts
            return consumer

        async def on_partitions_revoked(self, revoked: set[TP]) -> None:
            """aiokafka rejoins the group after a revoke only if the consumer fetched within ``max_poll_interval``,
            and Faust fetches again only after the rejoin. A worker that left its group because its agents were
            blocked that long (e.g. a spent judge budget with a full buffer) would wait for the other forever:
            count the revoke as fetch activity, so the rejoin goes ahead."""
            await super().on_partitions_revoked(revoked)
            with self._ensure_consumer()._subscription.fetch_context():
                pass  # leaving the context records "fetched just now" (aiokafka's fetcher_idle_time)

    class Consumer(GuardedDelivery, faust_aiokafka.Consumer):
        def _new_consumer_thread(self) -> ConsumerThread:
            return ConsumerThread(self, loop=self.loop, beacon=self.beacon)

    class Transport(faust_aiokafka.Transport):
        pass

    Transport.Consumer = Consumer
    return Transport


class WorkerApp(faust.App):
    """A Faust app whose consumer uses ``kafka.fetch_max_wait_s`` and calls off budget waits on a rebalance."""

    fetch_max_wait_ms: int = 500
    budget: BudgetGate | None = None
    guarded_topics: frozenset[str] = frozenset()  # topics delivered by `GuardedDelivery`
    on_refetch: Callable[[str, str], None] | None = None  # (topic, reason) of each refetch, for the metric
    stages: tuple[PollStage, ...] = ()  # with kafka.consumer = batch: the assemble and score stages, off Faust

    @property
    def guarded_consumer(self) -> GuardedDelivery:
        """The consumer, a `GuardedDelivery` (see `_new_transport`); Faust types it as its own ``ConsumerT``."""
        return cast(GuardedDelivery, self.consumer)

    def in_order(self, stream: faust.StreamT) -> AsyncIterator[EventT]:
        """The events of ``stream`` its agent should process now, in offset order per partition (`GuardedDelivery`)."""
        return in_order(self.guarded_consumer, stream)

    def in_order_batches(self, stream: faust.StreamT, max_events: int, within_s: float) -> AsyncIterator[list[EventT]]:
        """`in_order`, a batch of up to ``max_events`` at a time (`stream.delivery.in_order_batches`)."""
        return in_order_batches(self.guarded_consumer, stream, max_events, within_s)

    def finished(self, event: EventT) -> None:
        """The agent is done with ``event``: Faust's ack of it may now commit its offset."""
        self.guarded_consumer.finished(event.message)

    def on_rebalance_start(self) -> None:
        """Faust calls this first thing in a rebalance (from its consumer thread). Faust then waits for the event each
        agent is processing; one waiting for the judge budget could hold the rebalance past the group's timeout, so
        budget waits are called off until the rebalance ends."""
        super().on_rebalance_start()
        if self.budget is not None:
            self.loop.call_soon_threadsafe(self.budget.call_off)

    def on_rebalance_end(self) -> None:
        """Faust calls this on the event loop once the new assignment is recovered: budget waits are allowed again."""
        super().on_rebalance_end()
        if self.budget is not None:
            self.budget.resume()

    async def on_stop(self) -> None:
        """On shutdown Faust likewise waits for each agent's event: call budget waits off first, so the worker stops
        without waiting for the budget (the waiting conversation's offset stays uncommitted)."""
        if self.budget is not None:
            self.budget.call_off()
        for stage in self.stages:
            await stage.stop()
        await super().on_stop()

    async def _consumer_wait_empty(self, consumer: Any, logger: Any) -> None:
        """Faust's final commit on the way out is skipped when a periodic commit is in flight at that moment, so
        events finished after that commit chose its offsets were delivered again (scored twice). Commit once more,
        after any commit in flight."""
        await super()._consumer_wait_empty(consumer, logger)
        await consumer.maybe_wait_for_commit_to_finish()
        await consumer.commit()

    def _new_transport(self) -> Any:
        return _transport_with_fetch_wait(self.fetch_max_wait_ms)(self.conf.broker_consumer, self)


async def consumer_lag(app: faust.App, partitions: Iterable[TP]) -> dict[tuple[str, int], int]:
    """High-water mark minus position for each partition whose high-water mark the broker has reported. A partition
    revoked meanwhile is skipped (Faust's assignor learns the new assignment before aiokafka's consumer thread does,
    and a rebalance can end between the two calls): the next check sees the new assignment."""
    lags = {}
    for tp in partitions:
        lag = await partition_lag(app.consumer, tp)
        if lag is not None:
            lags[(tp.topic, tp.partition)] = lag
    return lags


def create_app(settings: Settings, rollout: ScorerRollout, metrics: ServiceMetrics) -> faust.App:
    """Build the worker's Faust app from settings (no module-level globals, so tests can build several)."""
    changelog_codec.register()  # the changelog's bytes must not depend on whether orjson is installed
    k = settings.kafka
    app = WorkerApp(
        k.app_id,
        broker=broker_urls(k.bootstrap_servers),
        store="memory://",
        datadir=k.data_dir,
        topic_partitions=k.partitions,
        topic_replication_factor=k.replication_factor,
        table_standby_replicas=0,
        processing_guarantee="at_least_once",
        consumer_auto_offset_reset="earliest",
        broker_session_timeout=k.session_timeout_s,
        broker_heartbeat_interval=k.heartbeat_interval_s,
        broker_max_poll_interval=k.max_poll_interval_s,
        broker_commit_interval=k.commit_interval_s,
        producer_max_request_size=k.max_record_bytes,
        stream_buffer_maxsize=k.stream_buffer_maxsize,
        broker_max_poll_records=k.max_poll_records,
        web_enabled=False,
    )
    app.fetch_max_wait_ms = int(k.fetch_max_wait_s * 1000)
    app.guarded_topics = frozenset({k.events_topic, k.closed_topic})
    app.on_refetch = lambda topic, reason: metrics.partition_refetches.labels(topic, reason).inc()

    def raw_topic(name: str) -> faust.TopicT:
        """A topic of raw bytes (keys and values) with ``kafka.partitions`` partitions."""
        return app.topic(
            name, partitions=k.partitions, key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw"
        )

    events_topic = raw_topic(k.events_topic)
    closed_topic = raw_topic(k.closed_topic)
    scores_topic = raw_topic(k.scores_topic)
    dead_letter_topic = raw_topic(k.dead_letter_topic)
    a = settings.assembly

    async def send_dead_letter(letter: DeadLetter) -> None:
        await dead_letter_topic.send(key=letter.record_key, value=letter.record_value(k.max_record_bytes))

    if k.consumer == "batch":
        assemble_stage = AssemblyStage(settings, metrics)
        score_stage = ScoreStage(settings, rollout, metrics)
        app.stages = (assemble_stage, score_stage)
        app.guarded_topics = frozenset()
        # Faust's consumer would have nothing to read, yet join a group and leave it again whenever it idled past
        # max_poll_interval: it is not started (nor its table manager); the producer and the timers are.
        app.boot_strategy = BootStrategy(app, enable_kafka_consumer=False)
        assembly, states_lock = assemble_stage.assembly, assemble_stage.lock

        def owned_states() -> list[tuple[str, State]]:
            states, owned = assemble_stage.states, assemble_stage.partitions
            return [(key, state) for key, state in states.items() if state["partition"] in owned]

        @app.task
        async def assemble_batches() -> None:
            await assemble_stage.start()
            await assemble_stage.run()

        @app.task
        async def score_batches() -> None:
            await score_stage.start()
            await score_stage.run()

    else:
        table = app.Table(
            TABLE_NAME,
            default=None,
            partitions=k.partitions,
            schema=faust.Schema(key_type=str, key_serializer="raw", value_serializer="json"),
        )
        assembly = BatchAssembler(a, k.partitions, metrics)
        # a batch's changes reach the table only at its end: the idle timer waits for it
        states_lock = asyncio.Lock()

        app.budget = rollout.current.active.budget  # every version's scorer shares it (ConversationScorer.for_version)

        def owned_states() -> list[tuple[str, State]]:
            actives = app.assignor.assigned_actives()
            return [
                (key, state)
                for key, state in table.items()
                if state is not None and TP(k.events_topic, state["partition"]) in actives
            ]

        @app.agent(events_topic, name="assemble")
        async def assemble(stream: faust.StreamT) -> None:
            async for events in app.in_order_batches(stream, a.batch_max_events, a.batch_max_wait_s):
                async with states_lock:
                    batch = StateBatch(table)
                    out = assembly.apply([event.message for event in events], batch)
                    for key, value in out.closed:
                        await closed_topic.send(key=key, value=value)
                    for letter in out.dead_letters:
                        await send_dead_letter(letter)
                    write_to_table(table, batch, {event.message.partition: event for event in events})
                for event in events:
                    app.finished(event)

        @app.timer(interval=k.refetch_idle_s / 2, name="refetch_stalled")
        async def refetch_stalled() -> None:
            await app.guarded_consumer.refetch_stalled(k.refetch_idle_s)

        @app.agent(closed_topic, name="score", concurrency=settings.scoring.concurrency)
        async def score(stream: faust.StreamT) -> None:
            async for event in app.in_order(stream):
                out = await score_closed(event.message, rollout, metrics)
                if out is None:
                    continue  # not finished: its offset stays uncommitted and it is delivered again
                for record in out.scores:
                    await scores_topic.send(key=out.key, value=record.to_json())
                if out.dead_letter is not None:
                    await send_dead_letter(out.dead_letter)
                app.finished(event)

    requested: dict[str, float] = {}
    loss_watch = BrokerLossWatch(metrics, "worker", (k.events_topic, k.closed_topic))  # the Faust consumer's

    async def request_end(key: str, cause: str, partition: int, now: float) -> None:
        """Publish a worker ``end`` for ``key`` unless one was requested lately (it is on its way)."""
        if now - requested.get(key, 0.0) < a.idle_check_interval_s * 3:
            return
        requested[key] = now
        end = EndEvent(conversation_id=key, timestamp=now, cause=cause)
        await events_topic.send(key=key.encode("utf-8"), value=encode_event(end), partition=partition)

    @app.timer(interval=a.idle_check_interval_s, name="idle")
    async def idle() -> None:
        now = time.time()
        async with states_lock:
            mine = owned_states()
            assembly.open_index.sync(
                [(state["partition"], key, state["last_seen"]) for key, state in mine if not is_closed(state)]
            )
            assembly.closed_index.sync([(state["partition"], key, state["closed_at"]) for key, state in mine if is_closed(state)])
        for key, state in mine:
            cause = assembly.assembler.due(state, now)
            if cause is not None:
                await request_end(key, cause, state["partition"], now)
        metrics.open_conversations.set(len(assembly.open_index))
        # Records the broker lost are logged and counted (the runbook says how to recover): a partition whose log ends
        # below this worker's position, or one that came back after a rebalance without the offsets this worker committed.
        if app.stages:
            lags: dict[tuple[str, int], int] = {}
            for stage in app.stages:
                lags |= await stage.lags()
            metrics.set_consumer_lag(lags)
            for stage in app.stages:
                await stage.check_broker_loss(lags)
        else:
            actives = app.assignor.assigned_actives()
            lags = await consumer_lag(app, actives)
            metrics.assigned_partitions.set(sum(1 for tp in actives if tp.topic == k.events_topic))
            metrics.set_consumer_lag(lags)
            consumer = app.guarded_consumer
            committed = {tp: await consumer.committed_offsets(TP(*tp)) for tp in loss_watch.suspects(lags)}
            committed |= {(tp.topic, tp.partition): c for tp, c in (await consumer.committed_since_assignment()).items()}
            loss_watch.confirm(committed)
        for key, at in list(requested.items()):
            if now - at > a.idle_check_interval_s * 10:
                del requested[key]

    if rollout.watches:

        @app.timer(interval=settings.scoring.registry_poll_s, name="scorer_rollout")
        async def scorer_rollout() -> None:
            await asyncio.get_running_loop().run_in_executor(None, rollout.refresh)  # loading may take seconds

    app.convowatch_topics = (events_topic, closed_topic, scores_topic, dead_letter_topic)  # type: ignore[attr-defined]
    return app
