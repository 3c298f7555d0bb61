"""`score_closed`: what scoring one record of the closed topic gives either consumer (the Faust agent and `ScoreStage`).

Real parts: the registry versions of tests/unit/test_rollout.py (LLM-Rubric's rubric set on the recorded GPT-3.5
answers, an ordinal calibrator) and real conversations assembled from replayed events. The stage's Kafka side (polls,
commits, rebalances, budget waits called off) runs on the real broker in tests/integration/test_pipeline.py and
test_budget_pipeline.py, each test for both consumers.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from stream.metrics import ServiceMetrics
from stream.records import ACTIVE, SHADOW, ClosedConversation, ScoreRecord
from stream.registry import ScorerRegistry
from stream.rollout import ScorerRollout
from stream.score_stage import score_closed
from tests.unit.test_rollout import builder, total
from tests.unit.test_rollout import files as files
from tests.unit.test_rollout import registry as registry
from tests.unit.test_scoring import closed_conversations as closed_conversations
from tests.unit.test_scoring import conversation as conversation
from tests.unit.test_scoring import judge as judge
from tests.unit.test_scoring import rubric_set as rubric_set
from tests.unit.test_scoring import unfitted as unfitted


@dataclass(frozen=True)
class Record:
    """A consumed record as both Kafka clients give it."""

    value: bytes | None
    key: bytes | None = b"k"
    topic: str = "convowatch.closed"
    partition: int = 2
    offset: int = 17


def test_a_closed_conversation_gets_the_active_then_the_shadow_record(
    registry: ScorerRegistry, judge, conversation: ClosedConversation
) -> None:
    metrics = ServiceMetrics()
    registry.promote("v1")
    registry.start_shadow("v2", 1.0)
    rollout = ScorerRollout.from_registry(registry, builder(judge, metrics), metrics)
    out = asyncio.run(score_closed(Record(conversation.to_json()), rollout, metrics))
    assert out is not None and out.dead_letter is None
    assert out.key == conversation.conversation_id.encode("utf-8")
    assert [(r.role, r.scorer_name, r.status) for r in out.scores] == [(ACTIVE, "v1", "scored"), (SHADOW, "v2", "scored")]
    assert all(ScoreRecord.from_json(r.to_json()).conversation_id == conversation.conversation_id for r in out.scores)


def test_a_record_that_is_no_closed_conversation_becomes_a_dead_letter_where_it_was_read(registry: ScorerRegistry, judge) -> None:
    metrics = ServiceMetrics()
    registry.promote("v1")
    rollout = ScorerRollout.from_registry(registry, builder(judge, metrics), metrics)
    out = asyncio.run(score_closed(Record(b'{"conversation_id": 3}'), rollout, metrics))
    assert out is not None and out.scores == ()
    letter = out.dead_letter
    assert letter is not None and letter.reason == "bad_closed_record"
    assert (letter.original, letter.key, letter.topic, letter.partition, letter.offset) == (
        b'{"conversation_id": 3}',
        b"k",
        "convowatch.closed",
        2,
        17,
    )
    assert total(metrics, "convowatch_dead_letters_total") == 1
    assert total(metrics, "convowatch_conversations_scored_total") == 0
