"""Records check their values when they are built, so a bad one fails where it is made, never in the store."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from stream.records import (
    BehaviourHit,
    ClosedConversation,
    DimensionPrediction,
    FeedbackRow,
    RecordError,
    RubricHit,
    ScoreRecord,
    TurnRecord,
)

T0 = 1_707_480_000.0


def closed(cid: str = "c1") -> ClosedConversation:
    return ClosedConversation(
        conversation_id=cid,
        turns=(TurnRecord(0, "user", "hi", T0), TurnRecord(1, "assistant", "hello", T0 + 1)),
        attributes={"product": "chat"},
        close_cause="end",
        closed_at=T0 + 2,
        first_event_at=T0,
        last_event_at=T0 + 1,
    )


def scored(**changes) -> ScoreRecord:
    record = ScoreRecord(
        conversation=closed(),
        status="scored",
        scorer_version="v1",
        judge="recorded:test",
        rubric_set_version="rs1",
        calibrator_version="cal1",
        scored_at=T0 + 3,
        attempts=1,
        netsat=1.0,
        label="sat",
        dissatisfaction_probability=0.2,
        dimensions=(DimensionPrediction("Q1", (0.5, 0.5), 1.5),),
        rubrics=(RubricHit("r1", "sat", 5.0),),
        behaviour_set_version="bs1",
        behaviours=(BehaviourHit(1, "ignore", 0.75, True), BehaviourHit(1, "redundant", 0.0, False)),
    )
    return replace(record, **changes)


def test_a_good_record_round_trips() -> None:
    record = scored()
    assert ScoreRecord.from_json(record.to_json()) == record


def test_a_record_written_before_behaviours_reads_with_none() -> None:
    d = json.loads(scored().to_json())
    del d["behaviours"], d["behaviour_set_version"]
    old = ScoreRecord.from_json(json.dumps(d).encode())
    assert (old.behaviours, old.behaviour_set_version) == ((), "")


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"status": "done"}, r"conversation 'c1': status 'done' is not one of"),
        ({"label": "great"}, r"conversation 'c1': label 'great' of a scored record is not one of"),
        ({"status": "unscored"}, r"an unscored record carries a label, dimensions, rubrics or behaviours"),
        (
            {"status": "unsampled", "label": "", "dimensions": (), "rubrics": ()},
            r"an unsampled record carries a label, dimensions, rubrics or behaviours",
        ),
        ({"behaviours": ({"turn_index": 1},)}, r"behaviours are not BehaviourHits"),
        ({"netsat": float("nan")}, r"netsat = nan is not a finite number or null"),
        ({"dissatisfaction_probability": float("inf")}, r"dissatisfaction_probability = inf is not a finite number or null"),
        ({"scored_at": float("inf")}, r"scored_at = inf is not a finite number"),
        ({"scored_at": 1e12}, r"scored_at = 1000000000000.0 is not an epoch time"),
        ({"inclusion_probability": 0.0}, r"inclusion_probability = 0.0 is not in \(0, 1\]"),
        ({"inclusion_probability": True}, r"inclusion_probability = True is not a finite number"),
        ({"judge": 3}, r"judge = 3 is not a string"),
        ({"rubrics_unasked": ["r1"]}, r"rubrics_unasked = \['r1'\] is not a list of strings"),
        ({"main_probabilities": (0.5, float("nan"))}, r"main_probabilities = \(0.5, nan\) is not a list of finite numbers"),
        ({"extra": []}, r"extra = \[\] is not an object"),
        # msgspec writes NaN as null rather than refuse it: the record refuses it
        ({"extra": {"p": [0.5, float("nan")]}}, r"extra = \{'p': \[0.5, nan\]\} is not an object of JSON values"),
        ({"extra": {1: "a"}}, r"extra = \{1: 'a'\} is not an object of JSON values"),
        ({"judge_prompt_tokens": -1}, r"judge_prompt_tokens = -1 is not a count"),
        ({"attempts": 1.5}, r"attempts = 1.5 is not a count"),
    ],
)
def test_a_score_record_with_a_bad_value_cannot_be_built(changes: dict, message: str) -> None:
    with pytest.raises(RecordError, match=message):
        scored(**changes)


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda: DimensionPrediction("Q1", (0.5, 1.5), 1.5), r"Q1: probabilities \(0.5, 1.5\) are not in \[0, 1\]"),
        (lambda: DimensionPrediction("Q1", (0.5, 0.5), float("nan")), r"Q1: expected_value = nan is not finite"),
        (lambda: RubricHit("r1", "neutral", 1.0), r"rubric r1: polarity 'neutral' is not one of"),
        (lambda: RubricHit("r1", "dsat", float("-inf")), r"rubric r1: score = -inf is not finite"),
        (lambda: BehaviourHit(1, "ignore", 1.5, True), r"behaviour ignore of turn 1: probability 1.5 is not in \[0, 1\]"),
        (lambda: BehaviourHit(-1, "ignore", 0.5, True), r"behaviour ignore of turn -1: turn_index is not a count"),
        (lambda: BehaviourHit(1, "ignore", 0.5, 1), r"behaviour ignore of turn 1: hit = 1 is not a boolean"),
        (lambda: TurnRecord(-1, "user", "x", T0), r"turn index -1 is not a non-negative integer"),
        (lambda: TurnRecord(0, "bot", "x", T0), r"turn 0: role 'bot' is not one of"),
        (lambda: TurnRecord(0, "user", "x", float("nan")), r"turn 0 timestamp = nan is not an epoch time"),
        (lambda: replace(closed(), conversation_id=""), r"conversation_id is empty"),
        (lambda: replace(closed(), close_cause="bored"), r"close_cause 'bored' is not one of"),
        (lambda: replace(closed(), negative_feedback="yes"), r"negative_feedback 'yes' is not true or false"),
        (lambda: replace(closed(), feedback_ratings=("up", "meh")), r"feedback_ratings \('up', 'meh'\) are not all in"),
        (lambda: FeedbackRow("c9", 0, "", "", T0, {}, T0), r"feedback for conversation 'c9': rating is empty"),
        (lambda: FeedbackRow("c9", 0, "down", "", T0, {}, float("inf")), r"'c9': received_at = inf is not an epoch time"),
    ],
)
def test_parts_of_records_check_their_values(build, message: str) -> None:
    with pytest.raises(RecordError, match=message):
        build()


def test_decoding_a_record_with_a_bad_value_is_a_record_error() -> None:
    """What the sink dead-letters as ``bad_score_record``: the message names the conversation and the field."""
    d = json.loads(scored().to_json())
    d["netsat"] = 1e400  # JSON overflow: Python reads inf
    with pytest.raises(RecordError, match=r"score record for conversation 'c1': netsat = inf is not a finite number or null"):
        ScoreRecord.from_json(json.dumps(d).encode())
    d = json.loads(scored().to_json()) | {"scorer_version": 5}
    with pytest.raises(RecordError, match=r"'c1': scorer_version = 5 is not a string"):
        ScoreRecord.from_json(json.dumps(d).encode())
    d = json.loads(scored().to_json())
    del d["judge"]
    with pytest.raises(RecordError, match=r"not a score record: TypeError.*judge"):
        ScoreRecord.from_json(json.dumps(d).encode())
    d = json.loads(closed().to_json())
    d["close_cause"] = "bored"
    with pytest.raises(RecordError, match=r"^close_cause 'bored' is not one of"):
        ClosedConversation.from_json(json.dumps(d).encode())


@pytest.mark.parametrize(
    "raw, message",
    [
        (b"\xff{}", r"not JSON"),  # not UTF-8
        (b'{"record_version": NaN}', r"record_version nan is not 1"),  # read by `json`, which takes NaN
        (b"[" * 100_000 + b"]" * 100_000, r"not JSON: nested too deeply"),
        (b'["\\ud800",' + b"[" * 100_000 + b"]" * 100_001, r"not JSON: nested too deeply"),  # msgspec refuses, then json
        (b"[1, 2]", r"record must be a JSON object"),
    ],
)
def test_bytes_that_are_not_a_record_are_a_record_error(raw: bytes, message: str) -> None:
    """Whatever is on the topic, decoding raises `RecordError` (which the sink dead-letters), never anything else."""
    for record_type in (ScoreRecord, ClosedConversation):
        with pytest.raises(RecordError, match=message):
            record_type.from_json(raw)


def test_times_before_1970_are_valid() -> None:
    """The event contract accepts years from 1900, so records do too (negative epoch seconds)."""
    old = replace(closed(), first_event_at=-631_151_999.75)
    assert ClosedConversation.from_json(old.to_json()) == old


def test_a_closed_conversation_hashes_like_its_conversation() -> None:
    c = closed()
    assert c.content_hash() == c.to_conversation().content_hash()
    assert replace(c, turns=c.turns[:1]).content_hash() != c.content_hash()
