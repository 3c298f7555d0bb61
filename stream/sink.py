"""The sink: scores topic (and feedback and rating events) → ClickHouse, committing offsets only after the write.

Why a separate process: scoring scales out over many workers, but the
embedded ClickHouse engine (chDB) can be opened by one process only. Workers
publish `ScoreRecord`s to the scores topic; one sink writes them. With a
ClickHouse server (``http(s)://`` DSN) several sinks may share the
``kafka.sink_group`` consumer group, or ClickHouse can ingest the scores topic
itself with its Kafka table engine.

Exactly-once *visible* results from at-least-once delivery: offsets are
committed after the batch is written, so a crash re-delivers (never loses)
records, and the store's ReplacingMergeTree keys make the re-written rows
replace the first ones.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field

from kafka import KafkaConsumer, KafkaProducer
from kafka.errors import CommitFailedError, KafkaError

from stream.broker_loss import BrokerLossWatch
from stream.contract import DeadLetter, FeedbackEvent, InvalidEvent, RatingEvent, may_be_of_type, parse_event
from stream.metrics import ServiceMetrics
from stream.records import ACTIVE, FeedbackRow, RatingRow, RecordError, ScoreRecord
from stream.settings import Settings
from stream.store import ClickHouseStore, StoreError

log = logging.getLogger(__name__)

ROW_EVENT_TYPES = ("feedback", "rating")  # the events the sink writes; the workers take the turns and ends
BROKER_RETRY_S = 1.0  # the wait before polling again after no broker answered


@dataclass
class SinkBatch:
    """Decoded records waiting to be written: those of one poll, or of several gathered for one write."""

    scores: list[ScoreRecord] = field(default_factory=list)
    feedback: list[FeedbackRow] = field(default_factory=list)
    ratings: list[RatingRow] = field(default_factory=list)
    bad: list[DeadLetter] = field(default_factory=list)

    @property
    def rows(self) -> int:
        """Records that become rows (dead letters do not)."""
        return len(self.scores) + len(self.feedback) + len(self.ratings)

    def add_rows(self, other: SinkBatch) -> None:
        """Gather ``other``'s rows (not its dead letters) into this batch."""
        self.scores += other.scores
        self.feedback += other.feedback
        self.ratings += other.ratings


@dataclass
class WritePace:
    """When the sink writes what it holds, and how long it may poll before deciding again.

    It writes once it holds ``batch_size`` rows or has held a record ``flush_interval_s``; caught up with its
    partitions, it writes as soon as its share of time spent writing allows: after a write of w seconds, not before
    w * (1 / ``max_write_share`` - 1) more. An insert's cost is mostly fixed (chDB: ~100 ms of CPU for 10 records,
    ~290 ms for 300, `bench/store_write.py`), so back-to-back small writes under a busy stream cost a core; a share
    below 1 makes them fewer and larger at a latency of at most w * (1 / share - 1) more. Times are monotonic seconds.
    """

    batch_size: int
    flush_interval_s: float
    max_write_share: float = 1.0
    _next_paced: float = field(default=float("-inf"), init=False)  # the earliest a caught-up sink writes again

    def due(self, now: float, held_since: float, rows: int, caught_up: bool) -> bool:
        """True if the sink should write the ``rows`` it has held since ``held_since``."""
        if rows >= self.batch_size or now - held_since >= self.flush_interval_s:
            return True
        return caught_up and now >= self._next_paced

    def poll_timeout(self, now: float, held_since: float | None, caught_up: bool) -> float:
        """Seconds the next poll may wait: until the held record's flush deadline, or the pace allows a write."""
        if held_since is None:
            return self.flush_interval_s
        deadline = held_since + self.flush_interval_s
        if caught_up:
            deadline = min(deadline, self._next_paced)
        return max(0.0, deadline - now)

    def wrote(self, ended: float, took_s: float) -> None:
        """Record a write that ended at ``ended`` after ``took_s`` seconds."""
        self._next_paced = ended + took_s * (1.0 / self.max_write_share - 1.0)


class ScoreSink:
    """Consumes the scores topic and the feedback and rating events and writes them to the store in batches."""

    def __init__(self, settings: Settings, store: ClickHouseStore, metrics: ServiceMetrics) -> None:
        self.settings = settings
        self.store = store
        self.metrics = metrics
        k = settings.kafka
        self.consumer = KafkaConsumer(
            k.scores_topic,
            k.events_topic,
            bootstrap_servers=k.bootstrap_servers.split(","),
            group_id=k.sink_group,
            client_id="convowatch-sink",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            max_poll_records=settings.store.batch_size,
            session_timeout_ms=int(k.session_timeout_s * 1000),
            heartbeat_interval_ms=int(k.heartbeat_interval_s * 1000),
            max_poll_interval_ms=int(k.max_poll_interval_s * 1000),
            fetch_max_wait_ms=int(k.fetch_max_wait_s * 1000),
            group_instance_id=k.group_instance_id,
        )
        self.loss_watch = BrokerLossWatch(metrics, "sink", (k.scores_topic, k.events_topic))
        self._committed: dict[tuple[str, int], int] = {}  # what this sink last committed, per partition
        self.pace = WritePace(settings.store.batch_size, settings.store.flush_interval_s, settings.store.max_write_share)
        self.producer = KafkaProducer(
            bootstrap_servers=k.bootstrap_servers.split(","),
            client_id="convowatch-sink",
            acks="all",
            max_request_size=k.max_record_bytes,
        )

    def decode(self, messages) -> SinkBatch:
        k = self.settings.kafka
        batch = SinkBatch()
        for m in messages:
            if m.topic == k.scores_topic:
                try:
                    batch.scores.append(ScoreRecord.from_json(m.value))
                except RecordError as e:
                    batch.bad.append(DeadLetter.of_message("bad_score_record", str(e), m))
                continue
            if not may_be_of_type(m.value, ROW_EVENT_TYPES):  # a turn or an end: skipped without parsing it
                continue
            try:
                event = parse_event(
                    m.value,
                    key=m.key,
                    max_text_bytes=self.settings.assembly.max_text_bytes,
                    max_event_bytes=self.settings.assembly.max_event_bytes,
                )
            except InvalidEvent:
                continue  # the workers dead-letter invalid events; the sink only needs valid feedback and ratings
            if isinstance(event, FeedbackEvent):  # a valid event makes a valid row: the contract checks more than it
                batch.feedback.append(
                    FeedbackRow(
                        conversation_id=event.conversation_id,
                        turn_index=event.turn_index,
                        rating=event.rating,
                        comment=event.comment,
                        timestamp=event.timestamp,
                        attributes=dict(event.attributes),
                        received_at=time.time(),
                    )
                )
            elif isinstance(event, RatingEvent):
                batch.ratings.append(
                    RatingRow(
                        conversation_id=event.conversation_id,
                        score=event.score,
                        scale=event.scale,
                        comment=event.comment,
                        timestamp=event.timestamp,
                        attributes=dict(event.attributes),
                        received_at=time.time(),
                    )
                )
        return batch

    def write(self, batch: SinkBatch, stop: threading.Event) -> bool:
        """Write until it succeeds (retrying store errors with backoff) or ``stop`` is set; True if written."""
        delay = 0.5
        while True:
            started = time.perf_counter()
            try:
                rows = self.store.write_scores(batch.scores) if batch.scores else {}
                if batch.feedback:
                    rows["feedback"] = self.store.write_feedback(batch.feedback)
                if batch.ratings:
                    rows["conversation_ratings"] = self.store.write_ratings(batch.ratings)
                break
            except StoreError as e:
                self.metrics.sink_errors.inc()
                log.error("store write failed (retrying in %.1fs): %s", delay, e)
                if stop.wait(delay):
                    return False
                delay = min(delay * 2, 30.0)
        took_s = time.perf_counter() - started  # the successful attempt's
        self.metrics.sink_latency.observe(took_s)
        self.pace.wrote(time.monotonic(), took_s)
        for table, n in rows.items():
            self.metrics.sink_rows.labels(table).inc(n)
        now = time.time()
        for record in batch.scores:
            if record.role == ACTIVE:  # a shadow's record follows its active one: the latency is the active's
                self.metrics.end_to_store_latency.observe(max(0.0, now - record.conversation.closed_at))
        return True

    def dead_letter(self, letters: list[DeadLetter]) -> None:
        for letter in letters:
            value = letter.record_value(self.settings.kafka.max_record_bytes)
            self.producer.send(self.settings.kafka.dead_letter_topic, key=letter.record_key, value=value)
            self.metrics.dead_letters.labels(letter.reason).inc()
        self.producer.flush()

    def run(self, stop: threading.Event) -> None:
        """Poll, write, commit; until ``stop`` is set. Uncommitted records are re-delivered after a restart.

        Polls are gathered into one write (each insert makes parts that ClickHouse merges, so fewer, larger inserts):
        it writes when `WritePace` says (caught up with its partitions and paced, ``store.batch_size`` rows held, or a
        record held ``store.flush_interval_s``), and commits only after the write. Stopped, it writes and commits what
        it holds (one attempt: if the store fails, the records are re-delivered to the next sink)."""
        store = self.settings.store
        pending = SinkBatch()
        held_since: float | None = None  # when the oldest polled, uncommitted record was polled
        caught_up = False
        while not stop.is_set():
            wait_s = self.pace.poll_timeout(time.monotonic(), held_since, caught_up)
            try:
                polled = self.consumer.poll(timeout_ms=int(wait_s * 1000), max_records=max(1, store.batch_size - pending.rows))
            except KafkaError as e:
                # kafka-python raises from poll when no broker answers the coordinator lookup (the whole cluster
                # restarting); what the sink holds stays held, uncommitted, and it polls again.
                if not e.retriable:
                    raise
                log.warning("poll failed, no broker answered (retrying in %.0f s): %s", BROKER_RETRY_S, e)
                if stop.wait(BROKER_RETRY_S):
                    break
                continue
            messages = [m for part in polled.values() for m in part]
            caught_up = self.report_lag()
            if messages:
                batch = self.decode(messages)
                if batch.bad:
                    self.dead_letter(batch.bad)
                pending.add_rows(batch)
                if held_since is None:
                    held_since = time.monotonic()
            if held_since is None:
                continue
            if not self.pace.due(time.monotonic(), held_since, pending.rows, caught_up):
                continue
            if not self.write_and_commit(pending, stop):
                return
            pending, held_since = SinkBatch(), None
        if held_since is not None:
            self.write_and_commit(pending, stop)

    def write_and_commit(self, pending: SinkBatch, stop: threading.Event) -> bool:
        """Write ``pending`` (`write`), then commit the positions of every record polled; False if not written."""
        if pending.rows and not self.write(pending, stop):
            return False
        try:
            self.consumer.commit()
            self._committed.update({(tp.topic, tp.partition): self.consumer.position(tp) for tp in self.consumer.assignment()})
        except (CommitFailedError, KafkaError) as e:
            # A rebalance took the partitions: the records are re-delivered to their new owner and rewritten idempotently.
            log.warning("offset commit failed after a durable write (will be re-delivered, deduplicated): %s", e)
        return True

    def report_lag(self) -> bool:
        """Consumer lag per assigned partition, where the broker has reported a high-water mark; a partition whose
        records the broker lost (stream/broker_loss.py) is read again from its beginning. True if every assigned
        partition is read up to its high-water mark; False, and nothing reported, while the broker does not answer (a
        position or committed offset kafka-python must fetch raises then: the next round tries again)."""
        lags = {}
        assigned = {(tp.topic, tp.partition): tp for tp in self.consumer.assignment()}
        try:
            for key, tp in assigned.items():
                highwater = self.consumer.highwater(tp)
                if highwater is not None:
                    lags[key] = highwater - self.consumer.position(tp)
            self.metrics.set_consumer_lag(lags)
            suspects = self.loss_watch.suspects(lags)
            if suspects:
                committed = {key: (self.consumer.committed(assigned[key]), self._committed.get(key)) for key in suspects}
                for key in self.loss_watch.confirm(committed):
                    self.consumer.seek_to_beginning(assigned[key])
        except KafkaError as e:
            log.warning("consumer lag not read, the broker did not answer: %s", e)
            return False
        return len(lags) == len(assigned) and all(lag <= 0 for lag in lags.values())

    def close(self) -> None:
        self.consumer.close()
        self.producer.close()
        self.store.close()
