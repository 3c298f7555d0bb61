"""A batch of raw events applied to the conversations' state: what to publish, and what to keep.

`BatchAssembler.apply` takes records of the events topic (any Kafka client's: key, value, topic, partition,
offset), validates each (a refused one becomes a `DeadLetter` with the original bytes and the reason), applies it to
its conversation's state with `ConversationAssembler`, enforces the per-partition caps of open and closed
conversations (`ConversationRecency`), and returns the closed conversations and dead letters to publish; the changed
states are in the `StateBatch`. It does no I/O: the caller publishes the outputs first, then writes the states, then
lets the offsets be committed, so a crash anywhere re-delivers the batch (a redelivered turn is recognised by its
fingerprint; a conversation closed twice is deduplicated downstream).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from stream.assembly import ConversationAssembler, State, Step, is_closed
from stream.capacity import ConversationRecency, per_partition_limit
from stream.contract import ConsumedRecord, DeadLetter, EndEvent, InvalidEvent, TurnEvent, parse_event
from stream.metrics import ServiceMetrics
from stream.settings import AssemblySettings
from stream.state_batch import StateBatch


@dataclass
class AssembledBatch:
    """What a batch produced for the topics, in the order produced: (key, value) of each closed conversation, and the
    dead letters of the events it refused; and how many events of each type had each outcome."""

    closed: list[tuple[bytes, bytes]] = field(default_factory=list)
    dead_letters: list[DeadLetter] = field(default_factory=list)
    event_counts: Counter[tuple[str, str]] = field(default_factory=Counter)  # (event type, outcome) -> events


class BatchAssembler:
    """Applies batches of events to one worker's conversations (all partitions it owns)."""

    def __init__(self, settings: AssemblySettings, partitions: int, metrics: ServiceMetrics) -> None:
        self.settings = settings
        self.metrics = metrics
        self.assembler = ConversationAssembler(settings)
        self.open_index = ConversationRecency(per_partition_limit(settings.max_open_conversations, partitions))
        self.closed_index = ConversationRecency(per_partition_limit(settings.max_closed_conversations, partitions))

    def apply(self, records: Iterable[ConsumedRecord], batch: StateBatch) -> AssembledBatch:
        """Apply ``records`` (each partition's in offset order) to the states seen through ``batch``."""
        out = AssembledBatch()
        try:
            for record in records:
                self._apply_one(record, batch, out)
        finally:
            for (etype, outcome), n in out.event_counts.items():  # counted once a batch, not once an event
                self.metrics.events.labels(etype, outcome).inc(n)
        return out

    def _apply_one(self, record: ConsumedRecord, batch: StateBatch, out: AssembledBatch) -> None:
        s = self.settings
        try:
            ev = parse_event(record.value, key=record.key, max_text_bytes=s.max_text_bytes, max_event_bytes=s.max_event_bytes)
        except InvalidEvent as e:
            out.event_counts["invalid", "dead_letter"] += 1
            self._dead_letter(e.reason, e.detail, record, out)
            return
        etype = type(ev).__name__.removesuffix("Event").lower()
        key = ev.conversation_id
        partition = record.partition
        current = batch.get(key)
        step = self.assembler.apply(current, ev, partition=partition, now=time.time())
        out.event_counts[etype, step.outcome] += 1
        if step.dead_letter is not None:
            self._dead_letter(*step.dead_letter, record, out)
        self._record(key, current, step, partition, batch, out)
        if isinstance(ev, TurnEvent) and step.outcome == "accepted":
            self.open_index.touch(partition, key)
            for longest_idle in self.open_index.excess(partition):
                self._close_for_capacity(longest_idle, partition, batch, out)

    def _dead_letter(self, reason: str, detail: str, record: ConsumedRecord, out: AssembledBatch) -> None:
        out.dead_letters.append(DeadLetter.of_message(reason, detail, record))
        self.metrics.dead_letters.labels(reason).inc()

    def _record(
        self, key: str, current: State | None, step: Step, partition: int, batch: StateBatch, out: AssembledBatch
    ) -> None:
        """Note what ``step`` closed, then keep its state (and the indexes of the caps)."""
        if step.closed is not None:
            # Published before the state that records the close is written: a crash in between re-closes
            # (deduplicated downstream) instead of losing the conversation.
            out.closed.append((key.encode("utf-8"), step.closed.to_json()))
            self.metrics.conversations_closed.labels(step.closed.close_cause).inc()
        if step.state is None:
            if current is not None:
                batch.set(key, None, partition)
            self.closed_index.discard(partition, key)
        elif step.state is not current:
            batch.set(key, step.state, partition)
        if step.state is None or step.closed is not None:
            self.open_index.discard(partition, key)
        if step.closed is not None:
            self.closed_index.touch(partition, key)
            for oldest in self.closed_index.excess(partition):
                self.closed_index.discard(partition, oldest)
                if is_closed(batch.get(oldest)):
                    batch.set(oldest, None, partition)
                    self.metrics.closed_forgotten_early.inc()

    def _close_for_capacity(self, key: str, partition: int, batch: StateBatch, out: AssembledBatch) -> None:
        """Close ``key`` (open, in ``partition``) with cause ``capacity``."""
        current = batch.get(key)
        now = time.time()
        step = self.assembler.apply(current, EndEvent(key, now, cause="capacity"), partition, now)
        self._record(key, current, step, partition, batch, out)
