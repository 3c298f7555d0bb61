"""The score stage: closed topic → scores topic.

`score_closed` is what scoring one record of the closed topic means, for either consumer: the active scorer
version's record (`ScorerRollout`, stream/rollout.py), then the shadow version's when one is rolled out and the
conversation is in its share; a record that is not a closed conversation becomes a dead letter. A judge budget wait
that a rebalance or a stop called off leaves the conversation unfinished (``None``): it must be delivered again.

`ScoreStage` runs it off Faust (``kafka.consumer`` batch), a poll at a time (a `PollStage`, consumer group
``<kafka.app_id>-score``): up to ``scoring.concurrency`` conversations of the poll are scored at once, each one's
records sent as soon as it is scored, and each partition committed up to its first unfinished conversation, which is
read again — one a rebalance or a stop called off while it waited for the judge budget, or one not started because the
poll had run for ``kafka.commit_interval_s`` (so a slow judge holds neither the commit nor, after a crash, the work
done again to a whole poll). A rebalance or a stop calls budget waits off first, so neither waits for the budget.
When the judge answers from memory, no budget is set and no shadow version is rolled out (`scores_at_once`), nothing
waits: the poll's conversations are scored by one `ConversationScorer.score_many` (one calibrator call for all).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from itertools import zip_longest

from stream.budget import BudgetWaitInterrupted
from stream.contract import ConsumedRecord, DeadLetter
from stream.metrics import ServiceMetrics
from stream.poll_stage import Polled, PollStage
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


class ScoreStage(PollStage):
    """The worker's score stage off Faust (see the module): `start`, then `run` until `stop`."""

    name = "score"

    def __init__(self, settings: Settings, rollout: ScorerRollout, metrics: ServiceMetrics) -> None:
        k = settings.kafka
        super().__init__(settings, metrics, k.closed_topic, k.max_poll_records, k.fetch_max_wait_s)
        self.rollout = rollout
        self.concurrency = settings.scoring.concurrency
        self.budget = rollout.current.active.budget  # every version's scorer shares it (ConversationScorer.for_version)

    async def process(self, polled: Polled) -> dict[int, int]:
        """Score the poll's conversations, the partitions' in turn, ``scoring.concurrency`` at once, each one's records
        sent as soon as it is scored; none is started after ``kafka.commit_interval_s``, so a slow judge does not hold
        the commit (and the work a crash would repeat) for a whole poll: the rest are read again."""
        in_turn = [r for rs in zip_longest(*polled.values()) for r in rs if r is not None]
        scorers = self.rollout.current
        if scorers.shadow is None and scorers.active.scores_at_once:
            await self._score_at_once(in_turn, scorers.active)
            return {p: records[-1].offset + 1 for p, records in polled.items()}
        deadline = time.monotonic() + self.settings.kafka.commit_interval_s
        queue = iter(in_turn)
        outcomes: dict[tuple[int, int], ClosedScores | None] = {}

        async def scorer() -> None:  # ``scoring.concurrency`` of these take the poll's records in turn
            for record in queue:
                out = None if time.monotonic() > deadline else await score_closed(record, self.rollout, self.metrics)
                if out is not None:
                    await self._publish(out)
                outcomes[(record.partition, record.offset)] = out

        await asyncio.gather(*(scorer() for _ in range(min(self.concurrency, len(in_turn)))))
        # Each partition is read again from its first record left unfinished (those after it, if scored, twice).
        return {
            p: next((r.offset for r in records if outcomes[(p, r.offset)] is None), records[-1].offset + 1)
            for p, records in polled.items()
        }

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
