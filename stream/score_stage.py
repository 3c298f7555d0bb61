"""The score stage: closed topic → scores topic.

`score_closed` is what scoring one record of the closed topic means, for either consumer: the active scorer
version's record (`ScorerRollout`, stream/rollout.py), then the shadow version's when one is rolled out and the
conversation is in its share; a record that is not a closed conversation becomes a dead letter. A judge budget wait
that a rebalance or a stop called off leaves the conversation unfinished (``None``): it must be delivered again.

`ScoreStage` runs it off Faust (``kafka.consumer`` batch) on a `PollStage` (consumer group ``<kafka.app_id>-score``):
up to ``scoring.concurrency`` conversations are scored at once, each one's records sent as soon as it is scored. A
conversation's scoring outlives the poll that brought it: a poll waits for its conversations for at most
``kafka.commit_interval_s``, then the next poll's take the slots that free up, so one slow judge answer holds one slot,
not the conversations behind it (bench/slow_judge.py). Those not started by then are read again. Each partition is
committed up to its first conversation not finished, so a crash scores again what came after it (at least once; the
sink stores a conversation once). A rebalance or a stop calls budget waits off, waits ``scoring.drain_s`` for the
conversations being scored, calls off the rest (their partitions' next owner scores them), and commits what finished.
When the judge answers from memory, no budget is set and no shadow version is rolled out (`scores_at_once`), nothing
waits: the poll's conversations are scored by one `ConversationScorer.score_many` (one calibrator call for all).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import zip_longest

from stream.budget import BudgetWaitInterrupted
from stream.contract import ConsumedRecord, DeadLetter
from stream.metrics import ServiceMetrics
from stream.poll_stage import NOT_THE_RECORD, Polled, PollStage
from stream.records import ClosedConversation, RecordError, ScoreRecord
from stream.rollout import ScorerRollout
from stream.scoring import ConversationScorer
from stream.settings import Settings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ClosedScores:
    """What one record of the closed topic produced: its score records (the active version's, then the shadow's),
    keyed by conversation id, or the dead letter of a record that is not a closed conversation."""

    key: bytes | None
    scores: tuple[ScoreRecord, ...] = ()
    dead_letter: DeadLetter | None = None


def parse_closed(record: ConsumedRecord, metrics: ServiceMetrics) -> ClosedConversation | ClosedScores:
    """The closed conversation a record of the closed topic holds, or the dead letter of one that holds none."""
    try:
        return ClosedConversation.from_json(record.value)
    except RecordError as e:
        metrics.dead_letters.labels("bad_closed_record").inc()
        return ClosedScores(record.key, dead_letter=DeadLetter.of_message("bad_closed_record", str(e), record))


async def score_closed(record: ConsumedRecord, rollout: ScorerRollout, metrics: ServiceMetrics) -> ClosedScores | None:
    """Score one record of the closed topic (see the module); None if it was not judged and must come again."""
    closed = parse_closed(record, metrics)
    if isinstance(closed, ClosedScores):
        return closed
    scorers = rollout.current  # one version scores the whole conversation, whatever switches meanwhile
    try:
        active = await scorers.active.score(closed)
    except BudgetWaitInterrupted:
        # Not judged and not finished: its offset stays uncommitted and it is delivered again.
        log.info("rebalance or shutdown: %s left in the closed topic while waiting for the judge budget", closed.conversation_id)
        return None
    scores = [active]
    if scorers.shadow is not None and active.status != "unsampled" and scorers.shadows(closed.conversation_id):
        try:
            scores.append(await scorers.shadow.score_shadow(closed, active))
        except BudgetWaitInterrupted:  # the shadow is a sample: skip it rather than judge the active version again
            log.info("rebalance or shutdown: %s not scored by the shadow version", closed.conversation_id)
    return ClosedScores(closed.conversation_id.encode("utf-8"), tuple(scores))


@dataclass
class _InWork:
    """What the score stage has started of one partition and not yet committed."""

    read_to: int  # where reading the partition goes on: after the last record started
    running: dict[int, asyncio.Task[bool]] = field(default_factory=dict)  # offset -> its conversation's scoring
    unfinished: int | None = None  # lowest offset of a conversation called off: the partition's next owner reads it

    def commit_offset(self) -> int:
        """Up to the first record not finished (running, called off, or not yet read)."""
        return min([self.read_to, *self.running, *([] if self.unfinished is None else [self.unfinished])])


class ScoreStage(PollStage):
    """The worker's score stage off Faust (see the module): `start`, then `run` until `stop`."""

    name = "score"

    def __init__(self, settings: Settings, rollout: ScorerRollout, metrics: ServiceMetrics) -> None:
        k = settings.kafka
        super().__init__(settings, metrics, k.closed_topic, k.max_poll_records, k.fetch_max_wait_s)
        self.rollout = rollout
        self.concurrency = settings.scoring.concurrency
        self.budget = rollout.current.active.budget  # every version's scorer shares it (ConversationScorer.for_version)
        self._in_work: dict[int, _InWork] = {}  # partition -> its records started and not yet committed
        self._offered: dict[int, int] = {}  # partition -> the offset `committable` last gave for it
        self._failure: BaseException | None = None  # a broker error in a conversation's sends: stops the worker

    async def process(self, polled: Polled) -> dict[int, int]:
        """Start scoring the poll's conversations, the partitions' in turn, as ``scoring.concurrency`` slots (shared
        with those still running from earlier polls) free up, and wait for them until ``kafka.commit_interval_s`` has
        passed; the ones not started by then are read again, the ones started run on beyond the poll."""
        in_turn = [r for rs in zip_longest(*polled.values()) for r in rs if r is not None]
        scorers = self.rollout.current
        if scorers.shadow is None and scorers.active.scores_at_once:
            await self._score_at_once(in_turn, scorers.active)
            return {p: records[-1].offset + 1 for p, records in polled.items()}
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.kafka.commit_interval_s
        started: list[asyncio.Task[bool]] = []
        next_unstarted = {p: records[-1].offset + 1 for p, records in polled.items()}
        for n, record in enumerate(in_turn):
            if not await self._slot_free_by(deadline):
                for r in in_turn[n:]:  # the partitions' records were started in offset order: these come again
                    next_unstarted[r.partition] = min(next_unstarted[r.partition], r.offset)
                break
            started.append(self._start(record))
        if started:
            await asyncio.wait(started, timeout=max(0.0, deadline - loop.time()))
        return next_unstarted

    async def _slot_free_by(self, deadline: float) -> bool:
        """Wait until fewer than ``scoring.concurrency`` conversations are being scored, or ``deadline`` passes."""
        loop = asyncio.get_running_loop()
        while len(running := self._running()) >= self.concurrency:
            if loop.time() >= deadline:
                return False
            await asyncio.wait(running, timeout=deadline - loop.time(), return_when=asyncio.FIRST_COMPLETED)
        return True

    def _running(self) -> list[asyncio.Task[bool]]:
        return [t for s in self._in_work.values() for t in s.running.values() if not t.done()]

    def _start(self, record: ConsumedRecord) -> asyncio.Task[bool]:
        started = self._in_work.setdefault(record.partition, _InWork(read_to=record.offset))
        task = asyncio.ensure_future(self._score(record))
        started.running[record.offset] = task
        started.read_to = record.offset + 1
        return task

    async def _score(self, record: ConsumedRecord) -> bool:
        """Score one record and send what it produced; False if it was called off (it must come again). A record that
        fails twice is quarantined, as a poll's record is (`PollStage`)."""
        error = None
        for _ in range(2):
            try:
                out = await score_closed(record, self.rollout, self.metrics)
                if out is not None:
                    await self._publish(out)
                return out is not None
            except NOT_THE_RECORD:
                raise
            except Exception as e:
                log.warning(
                    "%s: partition %d offset %d failed (%s)", self.name, record.partition, record.offset, type(e).__name__
                )
                error = e
        assert error is not None
        await self._quarantine(record, error)
        return True

    def _reap(self) -> None:
        """Take the finished conversations out of the running ones: called off ones (False, or cancelled) hold their
        partition's commit; a broker error is kept to stop the worker."""
        for started in self._in_work.values():
            for offset, task in [(o, t) for o, t in started.running.items() if t.done()]:
                del started.running[offset]
                failure = None if task.cancelled() else task.exception()
                if failure is not None and self._failure is None:
                    self._failure = failure
                if task.cancelled() or failure is not None or not task.result():
                    started.unfinished = offset if started.unfinished is None else min(offset, started.unfinished)

    def committable(self, finished: dict[int, int]) -> dict[int, int]:
        for p, offset in finished.items():
            self._in_work.setdefault(p, _InWork(read_to=offset)).read_to = offset
        offsets = self._new_offsets()
        self._offered.update(offsets)
        return offsets

    def pending(self) -> bool:
        return bool(self._new_offsets())

    def _new_offsets(self) -> dict[int, int]:
        """Each owned partition's commit offset where it differs from the one last given; raises a broker error a
        conversation's sends met."""
        self._reap()
        if self._failure is not None:
            raise self._failure
        offsets = {p: s.commit_offset() for p, s in self._in_work.items() if p in self.partitions}
        return {p: o for p, o in offsets.items() if self._offered.get(p) != o}

    async def drain(self, partitions: set[int]) -> None:
        """Wait up to ``scoring.drain_s`` for the conversations of ``partitions`` still being scored (budget waits were
        called off already), then call off the rest: the partitions' next owner scores them again."""
        running = [t for p in partitions if p in self._in_work for t in self._in_work[p].running.values()]
        if running:
            _, late = await asyncio.wait(running, timeout=self.settings.scoring.drain_s)
            if late:
                log.info("%s: %d conversations still being scored called off; they will be scored again", self.name, len(late))
            await self._call_off(late)

    def abandon(self) -> None:
        for task in self._running():
            task.cancel()

    async def revoked(self, partitions: set[int]) -> None:
        await self._call_off([t for p in partitions if p in self._in_work for t in self._in_work.pop(p).running.values()])
        for p in partitions:
            self._offered.pop(p, None)
        await super().revoked(partitions)

    @staticmethod
    async def _call_off(tasks: Iterable[asyncio.Task[bool]]) -> None:
        tasks = list(tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _score_at_once(self, records: list[ConsumedRecord], scorer: ConversationScorer) -> None:
        """Score the poll's conversations with one `score_many` (a judge that answers from memory, no budget: nothing
        waits, so nothing is gained by concurrency or a deadline) and publish what each record produced, in order."""
        parsed = [parse_closed(record, self.metrics) for record in records]
        closed = [c for c in parsed if isinstance(c, ClosedConversation)]
        scored = iter(await scorer.score_many(closed))
        for c in parsed:
            if isinstance(c, ClosedScores):
                await self._publish(c)
            else:
                await self._publish(ClosedScores(c.conversation_id.encode("utf-8"), (next(scored),)))

    async def _publish(self, out: ClosedScores) -> None:
        k = self.settings.kafka
        for record in out.scores:
            await self.send(k.scores_topic, out.key, record.to_json())
        if out.dead_letter is not None:
            await self.send_dead_letter(out.dead_letter)

    def interrupt(self) -> None:
        if self.budget is not None:
            self.budget.call_off()

    def resume(self) -> None:
        if self.budget is not None:
            self.budget.resume()
