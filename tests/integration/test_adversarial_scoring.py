"""A property of the scorer (issue 54, item 7): whatever a producer sends and a judge answers, every closed
conversation gets exactly one score record or a dead letter, and no exception escapes.

Hypothesis draws records as a hostile or buggy producer could send them (tests/adversarial.py: sizes, turn indexes up
to 2**31 - 1, any Unicode, control and chat-template tokens, unknown field names, wrong keys, junk) and a script of
judge replies. The records go through the real `BatchAssembler`; each closed conversation it sends, as a record of the
closed topic, goes through `score_closed` (stream/score_stage.py: what the worker does with it) with the worker's
scorer, built from settings by `stream.service.build_scorer` (the real `OpenAIJudge`, the rubric set and calibrator
the other pipeline tests use). The judge is a `ScriptedServer` standing in for an upstream gone wrong, a fault no real
judge produces on demand: it answers in turn from the drawn script, well-formed answers among replies of the wrong
shape (tests/integration/test_judge_hostile_replies.py) and error bodies that echo the API key, encoded or cut
(tests/integration/test_judge_secrets.py). The property:

- no exception escapes;
- every closed conversation yields exactly one score record, scored or unscored with a bounded, printable reason
  free of the key, that encodes within ``kafka.max_record_bytes`` (as a stage's send checks it) and that the sink
  can decode — or a dead letter; nothing is lost.

360 examples of 20 to 60 records: about 11,000 events a run, counted and asserted (>= 10,000) at the end of the
module (a 30-example run: 937 events, 106 conversations, 865 judge calls, 5.8 s; so about 70 s for the whole). Half
the examples draw an all well-formed judge, so both scored and unscored records are checked.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stream.metrics import ServiceMetrics
from stream.records import ScoreRecord
from stream.rollout import ScorerRollout
from stream.score_stage import score_closed
from stream.scoring import MAX_UNSCORED_REASON_CHARS
from stream.service import build_scorer
from stream.settings import JudgeSettings, ScoringSettings, Settings
from tests.adversarial import Record, assemble, fits, records
from tests.integration.test_judge_hostile_replies import GOOD_REPLY, HOSTILE_BODIES
from tests.integration.test_judge_secrets import ECHOES, KEY, _leaked
from tests.pipeline import LLM_RUBRIC_DATA
from tests.servers import Received, Reply, ScriptedServer

EXAMPLES = 360  # about 31 events each as hypothesis draws them (20 to 60): over 10,000
EVENTS_SEEN: list[int] = []
CONVERSATIONS_SCORED: list[str] = []  # each closed conversation's outcome: scored, unscored or dead_letter
WELL_FORMED = "well-formed"
REPLIES = [WELL_FORMED] * 4 + sorted(HOSTILE_BODIES) + sorted(ECHOES)


def _reply(kind: str, request: Received) -> Reply:
    """The scripted judge's reply of ``kind``: a well-formed answer, a hostile body (200) or a key echo (its status)."""
    if kind == WELL_FORMED:
        return Reply(200, json.dumps(GOOD_REPLY).encode())
    if kind in HOSTILE_BODIES:
        return Reply(200, HOSTILE_BODIES[kind])
    status, said = ECHOES[kind]
    body = {"error": {"message": said(request.headers.get("authorization", "")), "type": "server_error"}}
    return Reply(status, json.dumps(body).encode())


class Script:
    """The replies the scripted judge gives, in turn (one script per example)."""

    def __init__(self) -> None:
        self.kinds = [WELL_FORMED]
        self._lock = threading.Lock()
        self._next = 0

    def respond(self, _: int, request: Received) -> Reply:
        with self._lock:
            kind = self.kinds[self._next % len(self.kinds)]
            self._next += 1
        return _reply(kind, request)


@pytest.fixture(scope="module")
def script() -> Script:
    return Script()


@pytest.fixture(scope="module")
def rollout(script: Script, scoring_artifacts: tuple[Path, Path]) -> Iterator[ScorerRollout]:
    """The worker's scorer on the scripted judge: retries kept short (the backoffs are not under test)."""
    rubric_set, calibrator = scoring_artifacts
    with ScriptedServer(script.respond) as server:
        settings = Settings(
            judge=JudgeSettings(
                backend="openai",
                base_url=server.url + "/v1",
                model="stand-in",
                api_key=KEY,
                max_retries=1,
                backoff_initial_s=0.001,
                backoff_max_s=0.002,
                timeout_s=10,
            ),
            scoring=ScoringSettings(
                questions=LLM_RUBRIC_DATA / "questions.json", max_attempts=2, retry_initial_s=0.001, retry_max_s=0.002
            ),
            rubric_set=rubric_set,
            calibrator=calibrator,
        )
        metrics = ServiceMetrics()
        scorer = build_scorer(settings, metrics)
        try:
            yield ScorerRollout.fixed(scorer, metrics)
        finally:
            scorer.judge.close()


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
)
@given(records(), st.integers(1, 20), st.just([WELL_FORMED]) | st.lists(st.sampled_from(REPLIES), min_size=1, max_size=12))
def test_every_closed_conversation_gets_one_bounded_record(
    rollout: ScorerRollout, script: Script, sent: list[Record], per_batch: int, replies: list[str]
) -> None:
    script.kinds = replies
    closed = assemble(sent, per_batch).closed
    for offset, (key, value) in enumerate(closed):
        record = Record(key, value, partition=0, offset=offset, topic="convowatch.closed")
        out = asyncio.run(score_closed(record, rollout, rollout.metrics))
        assert out is not None  # None only when a judge budget wait is called off: no budget here
        if out.dead_letter is not None:
            assert out.scores == () and fits(out.dead_letter.record_key, out.dead_letter.record_value(1_000_000))
            CONVERSATIONS_SCORED.append("dead_letter")
            continue
        [score] = out.scores
        assert out.key == key and score.conversation_id == key.decode()
        encoded = score.to_json()
        assert fits(out.key, encoded), len(encoded)
        assert ScoreRecord.from_json(encoded) == score  # what the sink reads back
        assert score.status in ("scored", "unscored"), score.status
        if score.status == "unscored":
            reason = score.unscored_reason
            assert reason and reason.isprintable() and len(reason) <= MAX_UNSCORED_REASON_CHARS, reason
        assert _leaked(encoded.decode()) == []
        CONVERSATIONS_SCORED.append(score.status)
    EVENTS_SEEN.append(len(sent))


def test_the_property_saw_enough_events_and_both_outcomes() -> None:
    """Runs after the property (pytest keeps a module's order): the events it saw, and that both well-formed and
    hostile replies reached records (so it tested the scorer, not only one of its paths)."""
    assert sum(EVENTS_SEEN) >= 10_000, sum(EVENTS_SEEN)
    assert {"scored", "unscored"} <= set(CONVERSATIONS_SCORED), sorted(set(CONVERSATIONS_SCORED))
