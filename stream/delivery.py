"""At-least-once delivery for the worker's agents, on top of Faust's consumer.

Faust commits an offset once the event has been acked, and it acks events however the agent's body is left,
including events it hands out unprocessed during a stop or a rebalance or from an older consumer generation.
Its fetch loop can also pass over a record (a record fetched before a rebalance's seek, one dropped while flow
control was suspended), and its commit accepts an acked run that starts one past the committed offset. Either
way an offset is committed for a conversation nobody scored. `GuardedDelivery` closes both doors for the guarded
topics (events and closed):

* **In order, from the committed offset.** An agent takes each partition's events in offset order, starting at
  the broker's committed offset (the earliest offset for a partition never committed). A later record is not
  processed: the partition is fetched again from the offset it should have received (a *hole*). A record
  delivered twice is not processed twice. A record an agent takes and hands back unfinished is expected again.
* **Only finished events are committed.** Agents call `finished`; before each commit, acked offsets that were
  not finished are withdrawn, so the commit stops below them and the event is delivered again.
* **No silent stall.** When an agent has been idle for ``refetch_idle_s`` while a partition it owns has records
  past the offset it should take next, that partition is fetched again from there (a *stall*).
* **A refetch is not undone.** Faust's fetch loop drops a record below its partition's *read offset* and sets
  that offset after it hands a record to the agents; with a full buffer it hands over later records of the old
  fetch after a refetch's seek (made by the agent, in `take`), which would move the read offset past the
  refetch's start and drop the refetched records, leaving the partition to the stall check. `ReadOffsets`
  holds a refetched partition's read offset at the refetch's start until the record there is read.

Every refetch is logged (WARNING) and counted (``convowatch_partition_refetches_total``).
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Callable, MutableMapping
from typing import Any

from faust.transport.consumer import ensure_TP
from faust.types import TP, EventT, Message, StreamT
from faust.types.tuples import ack_lock

log = logging.getLogger(__name__)


class ReadOffsets(defaultdict[TP, "int | None"]):
    """Faust's read offsets (``Consumer._read_offset``; None = take any offset), with holds for refetches.

    While ``hold(tp, offset)`` lasts, any read offset set for ``tp`` is replaced by the held one, so the fetch loop
    takes the record at ``offset`` when the refetch brings it; setting exactly that offset (the fetch loop read it)
    ends the hold. A rebalance ends it too (`GuardedDelivery` calls `release`).
    """

    def __init__(self) -> None:
        super().__init__(lambda: None)
        self._held: dict[TP, int] = {}

    def hold(self, tp: TP, offset: int) -> None:
        self._held[tp] = offset
        super().__setitem__(tp, offset or None)  # Faust's own convention: 0 is "any"

    def release(self, tp: TP) -> None:
        self._held.pop(tp, None)

    def __setitem__(self, tp: TP, offset: int | None) -> None:
        held = self._held.get(tp)
        if held is not None:
            if offset != held:
                offset = held or None
            else:
                del self._held[tp]
        super().__setitem__(tp, offset)


class GuardedDelivery:
    """Consumer mix-in (before Faust's consumer class): in-order takes, finished-only commits, refetches.

    The app sets ``guarded_topics`` (a frozenset of topic names) and may set ``on_refetch(topic, reason)``.
    Faust's Cython stream iterator acks inline, bypassing ``Consumer.ack``, so the commit check sits where Faust
    chooses the offsets of a commit (``_new_offset``).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._finished_offsets: defaultdict[TP, set[int]] = defaultdict(set)
        self._next_offset: dict[TP, int] = {}  # the offset an agent takes next, per partition, this assignment
        self._refetching: dict[TP, int] = {}  # partitions fetched again, and from where
        self._start: dict[TP, int] = {}  # where the agents started this assignment (committed, else earliest)
        self._gone_below: dict[TP, int] = {}  # the earliest offset, when records past the committed one were deleted
        self._in_flight: defaultdict[str, int] = defaultdict(int)  # events taken and not yet released, per topic
        self._last_activity: dict[str, float] = {}  # monotonic time of the last take or release, per topic
        self._committed_before: dict[TP, int] = {}  # what this consumer had committed when a partition came (back)
        self._read_offsets = ReadOffsets()
        self._read_offset: MutableMapping[TP, int | None] = self._read_offsets  # Faust's, used by its fetch loop

    # -------------------------------------------------------------- what the agents call

    async def take(self, message: Message) -> bool:
        """Whether the agent should process ``message`` now: the next offset of its partition."""
        tp, offset = message.tp, message.offset
        self._last_activity[tp.topic] = time.monotonic()
        expected = self._next_offset.get(tp)
        if expected is None:
            expected = await self._start_offset(tp)
        if expected is None or offset == expected:
            self._next_offset[tp] = offset + 1
            if self._refetching.pop(tp, None) is not None:
                self._read_offsets.release(tp)  # the refetch arrived
            if offset in self._finished_offsets[tp]:
                return False  # processed before a lower offset was handed back (`release`): not processed twice
            self._in_flight[tp.topic] += 1
            return True
        if offset > expected and self._refetching.get(tp) != expected:
            await self._refetch(tp, expected, "hole", f"offset {offset} arrived before {expected}")
        return False  # below: taken before (delivered twice); above: waits for the refetch

    def release(self, message: Message) -> None:
        """The agent is done with a taken ``message``, finished or not.

        An unfinished one (e.g. a budget wait called off by a rebalance) is handed back: its partition expects it
        again, so the next later record is a hole (or the idle partition a stall) and it is fetched again, also when
        the partition stays with this worker and no seek to the committed offset follows."""
        tp, offset = message.tp, message.offset
        self._in_flight[tp.topic] -= 1
        self._last_activity[tp.topic] = time.monotonic()
        if offset not in self._finished_offsets[tp] and self._next_offset.get(tp, offset) > offset:
            self._next_offset[tp] = offset

    def finished(self, message: Message) -> None:
        """``message`` was processed: its ack may commit its offset."""
        self._finished_offsets[message.tp].add(message.offset)

    async def refetch_stalled(self, idle_s: float) -> None:
        """Fetch again each guarded partition with records past its next offset while its agent idles ``idle_s``."""
        app: Any = self.app  # type: ignore[attr-defined]
        now = time.monotonic()
        if app.rebalancing or app.in_recovery:  # idle time counts from the end of a rebalance
            self._last_activity.update((topic, now) for topic in app.guarded_topics)
            return
        assigned = [tp for tp in self.assignment() if tp.topic in app.guarded_topics]  # type: ignore[attr-defined]
        idle = [
            tp
            for tp in assigned
            if not self._in_flight[tp.topic] and now - self._last_activity.setdefault(tp.topic, now) >= idle_s
        ]
        if not idle:
            return
        highwaters = await self.highwaters(*idle)  # type: ignore[attr-defined]
        if app.rebalancing:  # began while we waited: the partitions may not be ours any more
            return
        for tp in idle:
            expected = self._next_offset.get(tp)
            if expected is None:
                expected = await self._start_offset(tp)
            if expected is not None and highwaters.get(tp, -1) > expected:
                await self._refetch(tp, expected, "stall", f"{highwaters[tp] - expected} records wait while idle {idle_s:g} s")
                self._last_activity[tp.topic] = time.monotonic()

    # -------------------------------------------------------------- Faust's hooks

    async def on_partitions_revoked(self, revoked: set[TP]) -> None:
        self._remember_committed(revoked)
        self._forget(revoked)
        await super().on_partitions_revoked(revoked)  # type: ignore[misc]

    async def on_partitions_assigned(self, assigned: set[TP], generation_id: int = 0) -> None:
        # Every rebalance ends with Faust seeking each assigned partition to its committed offset.
        self._remember_committed(assigned)
        self._forget(set(self._next_offset) | set(assigned))
        await super().on_partitions_assigned(assigned, generation_id)  # type: ignore[misc]

    def _new_offset(self, tp: TP) -> int | None:
        """The offset to commit for ``tp``: one past the run of finished offsets that starts at the commit floor.

        Guarded topics are neither compacted nor transactional, so their offsets have no gaps to skip, and
        Faust's own rule (which accepts a run starting one past the committed offset) is not used for them.
        """
        if tp.topic not in self.app.guarded_topics:  # type: ignore[attr-defined]
            return super()._new_offset(tp)  # type: ignore[misc]
        self._gap.pop(tp, None)  # type: ignore[attr-defined]  # skipped offsets Faust notes for its own rule: unused here
        with ack_lock:
            acked: list[int] = self._acked[tp]  # type: ignore[attr-defined]
            acked_index: set[int] = self._acked_index[tp]  # type: ignore[attr-defined]
            finished = self._finished_offsets[tp]
            unfinished = [o for o in acked if o not in finished]
            if unfinished:
                log.info(
                    "%s[%d] offsets %s left uncommitted: handed out or ended without being processed (a stop or "
                    "a rebalance); they are delivered again",
                    tp.topic,
                    tp.partition,
                    offsets_text(unfinished),
                )
            floor = self._commit_floor(tp)
            acked[:] = sorted(o for o in acked if o in finished and (floor is None or o >= floor))
            acked_index.intersection_update(acked)
            if not acked or (floor is not None and acked[0] != floor):
                return None  # the next offset to commit is not finished
            run = 1
            while run < len(acked) and acked[run] == acked[0] + run:
                run += 1
            offset = acked[run - 1] + 1
            acked_index.difference_update(acked[:run])
            del acked[:run]
            self._finished_offsets[tp] = {o for o in finished if o >= offset}
            return offset

    # -------------------------------------------------------------- internals

    def _forget(self, tps: set[TP]) -> None:
        for state in (self._next_offset, self._refetching, self._start, self._gone_below):
            for tp in tps:
                state.pop(tp, None)
        for tp in tps:
            self._read_offsets.release(tp)

    def _commit_floor(self, tp: TP) -> int | None:
        """The lowest offset of ``tp`` not yet committed, as far as known."""
        floor = self._committed_offset[tp]  # type: ignore[attr-defined]  # None for offset 0 (Faust's bookkeeping)
        if floor is None:
            floor = self._start.get(tp)
        gone = self._gone_below.get(tp)
        return floor if gone is None or floor is None else max(floor, gone)

    async def committed_offsets(self, tp: TP) -> tuple[int | None, int | None]:
        """(the broker's committed offset of ``tp`` for this group, the offset this consumer last committed)."""
        own = self._committed_offset.get(tp)  # type: ignore[attr-defined]
        return await self._broker_committed(tp), own if own is not None else self._committed_before.get(tp)

    async def committed_since_assignment(self) -> dict[TP, tuple[int | None, int]]:
        """Once per partition that came (back) after this consumer had committed in it: (the broker's committed
        offset now, what this consumer had committed). A broker that lost its records lost these offsets too."""
        found = {}
        for tp in [tp for tp in self._committed_before if tp in self.assignment()]:  # type: ignore[attr-defined]
            found[tp] = (await self._broker_committed(tp), self._committed_before.pop(tp))
        return found

    def _remember_committed(self, tps: set[TP]) -> None:
        for tp in tps:
            offset = self._committed_offset.get(tp)  # type: ignore[attr-defined]
            if offset is not None:
                self._committed_before[tp] = max(offset, self._committed_before.get(tp, offset))

    async def _broker_committed(self, tp: TP) -> int | None:
        return await self._thread.call_thread(self._thread._ensure_consumer().committed, tp)  # type: ignore[attr-defined]

    async def _start_offset(self, tp: TP) -> int | None:
        """The broker's committed offset of ``tp``, else its earliest offset (where Faust starts reading)."""
        committed = await self._broker_committed(tp)
        if committed is None:
            committed = (await self.earliest_offsets(tp)).get(tp)  # type: ignore[attr-defined]
        if committed is not None and tp not in self._next_offset:
            self._next_offset[tp] = self._start[tp] = committed
        return self._next_offset.get(tp)

    async def _refetch(self, tp: TP, offset: int, reason: str, why: str) -> None:
        # A message's ``tp`` is aiokafka's TopicPartition; Faust's sets of partitions must hold its own TP (it
        # asserts so: the worker's fetcher crashed on one handed to ``on_buffer_drop``).
        tp = ensure_TP(tp)
        earliest = (await self.earliest_offsets(tp)).get(tp)  # type: ignore[attr-defined]
        if earliest is not None and earliest > offset:  # the records before it are gone (retention)
            offset = self._gone_below[tp] = earliest
        log.warning("%s[%d]: %s; fetching again from offset %d", tp.topic, tp.partition, why, offset)
        self._next_offset[tp] = offset
        self._refetching[tp] = offset
        await self.seek(tp, offset)  # type: ignore[attr-defined]
        self._read_offsets.hold(tp, offset)
        self.on_buffer_drop(tp)  # type: ignore[attr-defined]  # fetch it even if Faust had set it aside
        on_refetch: Callable[[str, str], None] | None = getattr(self.app, "on_refetch", None)  # type: ignore[attr-defined]
        if on_refetch is not None:
            on_refetch(tp.topic, reason)


def offsets_text(offsets: list[int], shown: int = 10) -> str:
    """Offsets for a log line: all of a few, else the first and last few and how many (a refetch can leave
    thousands)."""
    ordered = sorted(offsets)
    if len(ordered) <= shown:
        return str(ordered)
    half = shown // 2
    return f"{ordered[:half]} … {ordered[-half:]} ({len(ordered)} offsets)"


async def in_order(consumer: GuardedDelivery, stream: StreamT) -> AsyncIterator[EventT]:
    """The stream's events an agent should process now (`GuardedDelivery.take`), released after its body."""
    async for event in stream.events():
        if not await consumer.take(event.message):
            continue
        try:
            yield event
        finally:
            consumer.release(event.message)


async def in_order_batches(
    consumer: GuardedDelivery, stream: StreamT, max_events: int, within_s: float
) -> AsyncIterator[list[EventT]]:
    """`in_order` a batch at a time: up to ``max_events`` events, waiting at most ``within_s`` for a batch to fill.

    Faust acks a batch's events after the agent's body; `GuardedDelivery` commits only those marked finished."""
    async for events in stream.take_events(max_events, within_s):  # type: ignore[attr-defined]  # on Stream, not StreamT
        taken = [event for event in events if await consumer.take(event.message)]
        if not taken:
            continue
        try:
            yield taken
        finally:
            for event in taken:
                consumer.release(event.message)
