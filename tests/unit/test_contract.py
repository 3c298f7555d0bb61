"""The event contract: parsing, reason codes, canonical encoding, the JSON Schema, dead letters."""

from __future__ import annotations

import base64
import calendar
import hashlib
import json
import math
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from scorers.conversation import ROLES
from stream.contract import (
    DEAD_LETTER_DETAIL_CHARS,
    DEAD_LETTER_KEY_BYTES,
    END_CAUSES,
    EVENT_TYPES,
    MAX_RATING_SCALE,
    MAX_TURN_INDEX,
    REASONS,
    RECORD_HEADROOM_BYTES,
    SCHEMA_PATH,
    TIMESTAMP_PATTERN,
    DeadLetter,
    DeadLetterError,
    EndEvent,
    FeedbackEvent,
    InvalidEvent,
    RatingEvent,
    TurnEvent,
    encode_event,
    event_key,
    format_timestamp,
    load_schema,
    may_be_of_type,
    parse_event,
    parse_timestamp,
)

DOC = Path(__file__).resolve().parents[2] / "docs" / "event-contract.md"
SCHEMA = load_schema()
VALIDATOR = Draft202012Validator(SCHEMA)
BIG = 1 << 40  # size limits off: the schema cannot express them

TURN = {
    "schema_version": 1,
    "type": "turn",
    "conversation_id": "conv-1",
    "turn_index": 0,
    "role": "user",
    "text": "My order never arrived.",
    "timestamp": "2024-02-09T05:14:33.250Z",
    "attributes": {"product": "shop", "model_version": "v7", "locale": "en-GB"},
}
END = {"schema_version": 1, "type": "end", "conversation_id": "conv-1", "timestamp": "2024-02-09T06:14:33+01:00"}
FEEDBACK = {
    "schema_version": 1,
    "type": "feedback",
    "conversation_id": "conv-1",
    "turn_index": 1,
    "rating": "down",
    "timestamp": "2024-02-09T05:15:00Z",
    "comment": "did not help",
}
RATING = {
    "schema_version": 1,
    "type": "rating",
    "conversation_id": "conv-1",
    "score": 4,
    "scale": 5,
    "timestamp": "2024-02-09T05:16:00Z",
}
BASES = {"turn": TURN, "end": END, "feedback": FEEDBACK, "rating": RATING}


def dump(obj: Any) -> bytes:
    return json.dumps(obj, ensure_ascii=False).encode("utf-8")


def with_(base: dict[str, Any], **changes: Any) -> dict[str, Any]:
    out = {**base, **changes}
    return {k: v for k, v in out.items() if v is not _DROP}


_DROP = object()


def schema_accepts(obj: Any) -> bool:
    """The schema's verdict with the one value rule it cannot express and documents: a rating's score <= its scale."""
    if not VALIDATOR.is_valid(obj):
        return False
    return not (obj.get("type") == "rating" and obj["score"] > obj["scale"])


def python_accepts(obj: Any) -> bool:
    try:
        parse_event(dump(obj), max_text_bytes=BIG, max_event_bytes=BIG)
    except InvalidEvent:
        return False
    return True


# --- valid events ------------------------------------------------------------


def test_turn_event_parses_with_utc_epoch_and_attributes() -> None:
    e = parse_event(dump(TURN), key=b"conv-1")
    assert e == TurnEvent(
        conversation_id="conv-1",
        turn_index=0,
        role="user",
        text="My order never arrived.",
        timestamp=datetime(2024, 2, 9, 5, 14, 33, 250000, tzinfo=UTC).timestamp(),
        attributes={"product": "shop", "model_version": "v7", "locale": "en-GB"},
    )


def test_end_event_parses_offset_to_utc_and_defaults_cause() -> None:
    e = parse_event(dump(END))
    assert e == EndEvent("conv-1", datetime(2024, 2, 9, 5, 14, 33, tzinfo=UTC).timestamp(), "end", {})
    for cause in END_CAUSES:
        assert parse_event(dump(with_(END, cause=cause))).cause == cause


def test_feedback_event_parses() -> None:
    e = parse_event(dump(FEEDBACK))
    assert isinstance(e, FeedbackEvent)
    assert (e.turn_index, e.rating, e.comment, e.attributes) == (1, "down", "did not help", {})
    assert parse_event(dump(with_(FEEDBACK, comment=_DROP))).comment == ""


def test_rating_event_parses_and_its_score_stays_on_its_scale() -> None:
    e = parse_event(dump(RATING))
    assert e == RatingEvent("conv-1", 4, 5, datetime(2024, 2, 9, 5, 16, tzinfo=UTC).timestamp())
    assert parse_event(dump(with_(RATING, score=2.0, scale=2, comment="meh"))) == RatingEvent("conv-1", 2, 2, e.timestamp, "meh")
    for bad, detail in [
        (with_(RATING, score=6), "score must be 1..5"),
        (with_(RATING, score=0), "score must be 1..5"),
        (with_(RATING, scale=1, score=1), "scale must be 2..100"),
        (with_(RATING, scale=101), "scale must be 2..100"),
        (with_(RATING, score=True), "score must be an integer"),
        (with_(RATING, scale=_DROP), "missing field(s) 'scale'"),
        (with_(RATING, turn_index=0), "1 unknown field(s): 'turn_index'"),
    ]:
        with pytest.raises(InvalidEvent) as info:
            parse_event(dump(bad))
        assert detail in info.value.detail, (bad, info.value)


def test_every_role_is_accepted_and_non_ascii_keys_match() -> None:
    for role in ROLES:
        assert parse_event(dump(with_(TURN, role=role))).role == role
    cid = "会話-ü-😀"
    e = parse_event(dump(with_(TURN, conversation_id=cid)), key=cid.encode("utf-8"))
    assert event_key(e) == cid.encode("utf-8")


def test_timestamp_range_constants() -> None:
    assert LOW_US / 1e6 == datetime(1900, 1, 1, tzinfo=UTC).timestamp()
    assert format_timestamp(HIGH_US / 1e6) == "2199-12-31T23:59:59.999999Z"
    assert parse_timestamp("2199-12-31T23:59:59.999999Z") == HIGH_US / 1e6


def test_timestamp_forms() -> None:
    utc = datetime(2024, 2, 9, 5, 14, 33, tzinfo=UTC).timestamp()
    assert parse_timestamp("2024-02-09T05:14:33Z") == utc
    assert parse_timestamp("2024-02-09t05:14:33z") == utc
    assert parse_timestamp("2024-02-09T07:14:33+02:00") == utc
    assert parse_timestamp("2024-02-09T00:44:33-04:30") == utc
    assert parse_timestamp("2024-02-09T05:14:33.123456789Z") == utc + 0.123456  # truncated to microseconds
    assert parse_timestamp("2024-02-09T05:14:33.5Z") == utc + 0.5
    for bad in ("2024-02-09T05:14:33", "2024-02-09 05:14:33Z", "2024-02-30T00:00:00Z", "2024-02-09T24:00:00Z",
                "2024-02-09T05:14:60Z", "2024-02-09T05:14:33Z\n", "20240209T051433Z", "1899-12-31T23:59:59Z",
                "2024-02-09T05:14:33+2:00", "2200-01-01T00:00:00Z", "2024-02-09T05:14:33.Z", "２０２４-02-09T05:14:33Z"):  # fmt: skip
        with pytest.raises(ValueError):
            parse_timestamp(bad)


def test_timestamp_pattern_knows_leap_years() -> None:
    """The calendar-exact pattern (shared with the schema) agrees with the calendar for every year it allows."""
    for year in range(1900, 2200):
        leap_day = f"{year}-02-29T12:00:00Z"
        if calendar.isleap(year):
            assert parse_timestamp(leap_day) == datetime(year, 2, 29, 12, tzinfo=UTC).timestamp()
        else:
            with pytest.raises(ValueError):
                parse_timestamp(leap_day)
        assert VALIDATOR.is_valid(with_(END, timestamp=leap_day)) == calendar.isleap(year)


# --- every reason code ---------------------------------------------------------

REASON_EXAMPLES: dict[str, tuple[bytes | None, dict[str, Any]]] = {
    "too_large": (dump(with_(TURN, text="x" * 300_000)), {}),
    "invalid_utf8": (b'{"schema_version":1,"type":"turn","text":"\xff"}', {}),
    "not_json": (b'{"schema_version": 1,', {}),
    "not_object": (b'[{"schema_version": 1}]', {}),
    "unsupported_schema_version": (dump(with_(TURN, schema_version=2)), {}),
    "unknown_type": (dump(with_(TURN, type="message")), {}),
    "missing_field": (dump(with_(TURN, text=_DROP)), {}),
    "unknown_field": (dump(with_(TURN, conversationId="conv-1")), {}),
    "wrong_type": (dump(with_(TURN, turn_index=True)), {}),
    "invalid_value": (dump(with_(TURN, conversation_id="")), {}),
    "unknown_role": (dump(with_(TURN, role="bot")), {}),
    "negative_turn_index": (dump(with_(TURN, turn_index=-1)), {}),
    "oversized_text": (dump(with_(TURN, text="é" * 20)), {"max_text_bytes": 39}),
    "key_mismatch": (dump(TURN), {"key": b"conv-2"}),
}
# Found after parsing: by the assembler (state) or by the worker/sink on internal topics.
ASSEMBLER_REASONS = {"duplicate_turn_index", "conversation_closed", "empty_conversation", "turn_index_too_large"}
INTERNAL_REASONS = {"bad_closed_record", "bad_score_record", "quarantined"}


@pytest.mark.parametrize("reason", sorted(REASON_EXAMPLES))
def test_each_reason_code_has_a_concrete_example(reason: str) -> None:
    raw, kwargs = REASON_EXAMPLES[reason]
    with pytest.raises(InvalidEvent) as info:
        parse_event(raw, **kwargs)
    assert info.value.reason == reason
    assert info.value.detail and str(info.value).startswith(reason + ": ")


def test_reason_table_covers_every_code() -> None:
    assert set(REASON_EXAMPLES) | ASSEMBLER_REASONS | INTERNAL_REASONS == set(REASONS)
    assert len(REASONS) == len(set(REASONS))
    for reason in ASSEMBLER_REASONS:  # produced by the assembler, but an InvalidEvent like the rest
        assert InvalidEvent(reason, "turn 3 seen with another text").reason == reason
    with pytest.raises(ValueError):
        InvalidEvent("no_such_code", "x")


@pytest.mark.parametrize(
    ("raw", "reason", "in_detail"),
    [
        (None, "not_json", "null"),
        (b"", "not_json", "JSON"),
        (b'{"schema_version": NaN}', "not_json", "NaN"),
        (b'{"schema_version": 1, "type": "turn", "turn_index": Infinity}', "not_json", "Infinity"),
        (b"[" * 100_000 + b"]" * 100_000, "not_json", "nested"),
        (b'\xef\xbb\xbf{"schema_version": 1}', "not_json", "BOM"),
        (dump(with_(TURN, schema_version="1")), "wrong_type", "schema_version"),
        (dump(with_(TURN, schema_version=True)), "wrong_type", "schema_version"),
        (dump(with_(TURN, schema_version=_DROP)), "missing_field", "schema_version"),
        (dump(with_(TURN, type=_DROP)), "missing_field", "type"),
        (dump(with_(TURN, type=["turn"])), "wrong_type", "type"),
        (dump(with_(TURN, turn_index=1.5)), "wrong_type", "turn_index"),
        (dump(with_(TURN, turn_index="3")), "wrong_type", "turn_index"),
        (dump(with_(TURN, turn_index=MAX_TURN_INDEX + 1)), "invalid_value", "turn_index"),
        (dump(with_(TURN, text=None)), "wrong_type", "text"),
        (dump(with_(TURN, role=1)), "wrong_type", "role"),
        (dump(with_(TURN, conversation_id="c" * 257)), "invalid_value", "conversation_id"),
        (dump(with_(TURN, conversation_id=7)), "wrong_type", "conversation_id"),
        (dump(with_(TURN, timestamp="2024-02-09T05:14:33")), "invalid_value", "timestamp"),
        (dump(with_(TURN, timestamp=1707455673)), "wrong_type", "timestamp"),
        (dump(with_(TURN, attributes=["a"])), "wrong_type", "attributes"),
        (dump(with_(TURN, attributes={"product": 3})), "wrong_type", "product"),
        (dump(with_(TURN, attributes={"k" * 65: "v"})), "invalid_value", "attribute name"),
        (dump(with_(TURN, attributes={"": "v"})), "invalid_value", "attribute name"),
        (dump(with_(TURN, attributes={"k": "v" * 257})), "invalid_value", "257"),
        (dump(with_(TURN, attributes={f"k{i}": "v" for i in range(33)})), "invalid_value", "33 keys"),
        (json.dumps(with_(TURN, text="a\ud800b")).encode(), "invalid_value", "surrogate"),
        (
            b'{"schema_version":1,"type":"end","conversation_id":"c","timestamp":"2024-01-01T00:00:00Z","attributes":{"a":"\\udfff"}}',
            "invalid_value",
            "surrogate",
        ),  # fmt: skip
        (dump(with_(END, cause="timeout")), "invalid_value", "cause"),
        (dump(with_(END, turn_index=3)), "unknown_field", "turn_index"),
        (dump(with_(FEEDBACK, rating="thumbs_down")), "invalid_value", "rating"),
        (dump(with_(FEEDBACK, turn_index=False)), "wrong_type", "turn_index"),
        (dump(with_(FEEDBACK, comment=None)), "wrong_type", "comment"),
        (dump(with_(FEEDBACK, rating=_DROP, turn_index=_DROP)), "missing_field", "'rating', 'turn_index'"),
    ],
)
def test_refusals_name_the_field(raw: bytes | None, reason: str, in_detail: str) -> None:
    with pytest.raises(InvalidEvent) as info:
        parse_event(raw)
    assert info.value.reason == reason, info.value
    assert in_detail in info.value.detail


def test_size_limits_are_parameters() -> None:
    raw = dump(with_(TURN, text="ab" * 50))
    parse_event(raw, max_text_bytes=100, max_event_bytes=len(raw))
    with pytest.raises(InvalidEvent, match="oversized_text"):
        parse_event(raw, max_text_bytes=99)
    with pytest.raises(InvalidEvent, match="too_large"):
        parse_event(raw, max_event_bytes=len(raw) - 1)


# --- fuzzing -------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4),
    max_leaves=20,
)
field_names = st.sampled_from(sorted({k for b in BASES.values() for k in b} | {"cause", "comment", "rating", "extra"}))
field_values = json_values | st.sampled_from(
    [-1, 0, 1, 1.0, 2, 5, 6, 100, 101, 2**31, True, "", "up", "end", "retention", "user", "tool", "turn", "end", "feedback", "rating",
     "2024-02-29T00:00:00Z", "2023-02-29T00:00:00Z", "2024-01-01T00:00:00", "x" * 257, {"a": "b"}, {"a": 1}]
)  # fmt: skip


@st.composite
def mutated_events(draw: st.DrawFn) -> dict[str, Any]:
    """A valid event with a few fields replaced, added or removed: mostly near the contract's edges."""
    obj = dict(BASES[draw(st.sampled_from(sorted(BASES)))])
    for _ in range(draw(st.integers(0, 3))):
        name = draw(field_names)
        if draw(st.booleans()) and name in obj:
            del obj[name]
        else:
            obj[name] = draw(field_values)
    return obj


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=512))
def test_arbitrary_bytes_only_raise_invalid_event(raw: bytes) -> None:
    try:
        parse_event(raw, key=raw[:4] or None)
    except InvalidEvent as e:
        assert e.reason in REASONS


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(json_values | mutated_events())
def test_arbitrary_json_only_raises_invalid_event(obj: Any) -> None:
    for raw in (json.dumps(obj).encode(), dump(obj)):  # ASCII escapes and raw UTF-8
        try:
            parse_event(raw, key=b"conv-1")
        except InvalidEvent as e:
            assert e.reason in REASONS


# --- canonical encoding ----------------------------------------------------------

LOW_US, HIGH_US = -2_208_988_800 * 10**6, 7_258_118_400 * 10**6 - 1  # 1900-01-01, 2199-12-31T23:59:59.999999 (UTC)
LOW, HIGH = LOW_US / 1e6, (HIGH_US - 100_000) / 1e6
micros_timestamps = st.integers(LOW_US, HIGH_US).map(lambda us: us / 1_000_000)
ids = st.text(min_size=1, max_size=256)
attributes = st.dictionaries(st.text(min_size=1, max_size=64), st.text(max_size=256), max_size=32)
events = st.one_of(
    st.builds(TurnEvent, ids, st.integers(0, MAX_TURN_INDEX), st.sampled_from(ROLES), st.text(), micros_timestamps, attributes),
    st.builds(EndEvent, ids, micros_timestamps, st.sampled_from(END_CAUSES), attributes),
    st.builds(
        FeedbackEvent,
        ids,
        st.integers(0, MAX_TURN_INDEX),
        st.sampled_from(["up", "down"]),
        micros_timestamps,
        st.text(),
        attributes,
    ),
    st.integers(2, 100).flatmap(
        lambda scale: st.builds(RatingEvent, ids, st.integers(1, scale), st.just(scale), micros_timestamps, st.text(), attributes)
    ),
)


@settings(max_examples=300)
@given(events)
def test_encode_parse_round_trip(event: Any) -> None:
    raw = encode_event(event)
    assert parse_event(raw, key=event_key(event), max_text_bytes=BIG, max_event_bytes=BIG) == event
    assert encode_event(parse_event(raw, max_text_bytes=BIG, max_event_bytes=BIG)) == raw
    assert VALIDATOR.is_valid(json.loads(raw))


ROW_KINDS = ("feedback", "rating")


@given(events | mutated_events() | json_values)
def test_may_be_of_type_is_true_of_every_event_of_those_types(value: Any) -> None:
    """The sink skips a record without parsing it when `may_be_of_type` says no: never one it would have written."""
    raws = [encode_event(value)] if isinstance(value, EVENT_TYPES) else [json.dumps(value).encode(), dump(value)]
    for raw in raws:
        try:
            event = parse_event(raw, max_text_bytes=BIG, max_event_bytes=BIG)
        except InvalidEvent:
            continue
        if isinstance(event, (FeedbackEvent, RatingEvent)):
            assert may_be_of_type(raw, ROW_KINDS)


def test_may_be_of_type_sees_a_type_spelt_with_escapes_and_skips_turns_and_ends() -> None:
    escaped = dump(FEEDBACK).replace(b'"feedback"', b'"\\u0066eedback"')
    assert isinstance(parse_event(escaped), FeedbackEvent) and may_be_of_type(escaped, ROW_KINDS)
    assert may_be_of_type(dump(RATING), ROW_KINDS) and may_be_of_type(dump(FEEDBACK), ROW_KINDS)
    assert not may_be_of_type(dump(TURN), ROW_KINDS) and not may_be_of_type(dump(END), ROW_KINDS)
    assert not may_be_of_type(None, ROW_KINDS)
    assert may_be_of_type(dump({**TURN, "attributes": {"topic": "rating"}}), ROW_KINDS)  # a false yes: parse_event decides


@settings(max_examples=300)
@given(st.floats(LOW, HIGH))
def test_any_float_timestamp_is_stable_after_one_encoding(ts: float) -> None:
    """Timestamps are kept to the microsecond: one encoding rounds, later ones change nothing."""
    text = format_timestamp(ts)
    back = parse_timestamp(text)
    assert abs(back - ts) <= 0.5e-6 + abs(ts) * 2**-52
    assert format_timestamp(back) == text


def test_encoding_is_canonical() -> None:
    e = parse_event(dump(with_(TURN, timestamp="2024-02-09T07:14:33.25+02:00", attributes={"b": "2", "a": "1"})))
    assert encode_event(e) == (
        b'{"schema_version":1,"type":"turn","conversation_id":"conv-1","turn_index":0,"role":"user",'
        b'"text":"My order never arrived.","timestamp":"2024-02-09T05:14:33.250000Z","attributes":{"a":"1","b":"2"}}'
    )
    assert (
        encode_event(EndEvent("c", 0.0))
        == b'{"schema_version":1,"type":"end","conversation_id":"c","timestamp":"1970-01-01T00:00:00.000000Z","cause":"end"}'
    )


def test_encoder_refuses_events_that_break_the_contract() -> None:
    for bad, reason in [
        (TurnEvent("c", 0, "bot", "hi", 0.0, {}), "unknown_role"),
        (TurnEvent("", 0, "user", "hi", 0.0, {}), "invalid_value"),
        (TurnEvent("c", -2, "user", "hi", 0.0, {}), "negative_turn_index"),
        (TurnEvent("c", 0, "user", "\udc80", 0.0, {}), "invalid_value"),
        (EndEvent("c", math.nan), "invalid_value"),
        (EndEvent("c", 1e12), "invalid_value"),  # year 33658
        (EndEvent("c", 7_258_118_400.0), "invalid_value"),  # 2200-01-01
        (EndEvent("c", 0.0, "closed"), "invalid_value"),
        (FeedbackEvent("c", 0, "up", 0.0, attributes={"a": 1}), "wrong_type"),  # type: ignore[dict-item]
    ]:
        with pytest.raises(InvalidEvent) as info:
            encode_event(bad)
        assert info.value.reason == reason, (bad, info.value)


# --- the JSON Schema agrees with the parser ----------------------------------------

CORPUS: list[tuple[str, dict[str, Any]]] = [
    ("turn", TURN),
    ("end", END),
    ("feedback", FEEDBACK),
    ("turn without attributes", with_(TURN, attributes=_DROP)),
    ("end with cause retention", with_(END, cause="retention", attributes={"product": "p"})),
    ("feedback without comment", with_(FEEDBACK, comment=_DROP)),
    ("integral float index", with_(TURN, turn_index=4.0)),
    ("float schema version", with_(TURN, schema_version=1.0)),
    ("max index", with_(TURN, turn_index=MAX_TURN_INDEX)),
    ("index too big", with_(TURN, turn_index=MAX_TURN_INDEX + 1)),
    ("boolean index", with_(TURN, turn_index=True)),
    ("negative index", with_(FEEDBACK, turn_index=-1)),
    ("fractional index", with_(TURN, turn_index=0.5)),
    ("schema version 2", with_(TURN, schema_version=2)),
    ("schema version string", with_(TURN, schema_version="1")),
    ("schema version true", with_(TURN, schema_version=True)),
    ("no schema version", with_(END, schema_version=_DROP)),
    ("type capitalised", with_(TURN, type="Turn")),
    ("no type", with_(TURN, type=_DROP)),
    ("unknown role", with_(TURN, role="bot")),
    ("empty text", with_(TURN, text="")),
    ("null text", with_(TURN, text=None)),
    ("empty id", with_(TURN, conversation_id="")),
    ("256-character id", with_(TURN, conversation_id="😀" * 256)),
    ("257-character id", with_(TURN, conversation_id="c" * 257)),
    ("numeric id", with_(TURN, conversation_id=12)),
    ("naive timestamp", with_(TURN, timestamp="2024-02-09T05:14:33")),
    ("lower-case t and z", with_(TURN, timestamp="2024-02-09t05:14:33z")),
    ("nanoseconds", with_(TURN, timestamp="2024-02-09T05:14:33.123456789Z")),
    ("ten fraction digits", with_(TURN, timestamp="2024-02-09T05:14:33.1234567891Z")),
    ("space separator", with_(TURN, timestamp="2024-02-09 05:14:33Z")),
    ("date only", with_(TURN, timestamp="2024-02-09")),
    ("trailing newline", with_(TURN, timestamp="2024-02-09T05:14:33Z\n")),
    ("leading space", with_(TURN, timestamp=" 2024-02-09T05:14:33Z")),
    ("30 February", with_(TURN, timestamp="2024-02-30T05:14:33Z")),
    ("31 April", with_(TURN, timestamp="2024-04-31T05:14:33Z")),
    ("29 February 2000", with_(TURN, timestamp="2000-02-29T05:14:33Z")),
    ("29 February 1900", with_(TURN, timestamp="1900-02-29T05:14:33Z")),
    ("year 2199", with_(TURN, timestamp="2199-12-31T23:59:59.999999Z")),
    ("year 2200", with_(TURN, timestamp="2200-01-01T00:00:00Z")),
    ("hour 24", with_(TURN, timestamp="2024-02-09T24:00:00Z")),
    ("offset +14:00", with_(TURN, timestamp="2024-02-09T05:14:33+14:00")),
    ("offset without colon", with_(TURN, timestamp="2024-02-09T05:14:33+0100")),
    ("epoch number", with_(TURN, timestamp=1707455673)),
    ("32 attributes", with_(TURN, attributes={f"k{i}": "v" for i in range(32)})),
    ("33 attributes", with_(TURN, attributes={f"k{i}": "v" for i in range(33)})),
    ("64-character attribute name", with_(TURN, attributes={"k" * 64: "v"})),
    ("65-character attribute name", with_(TURN, attributes={"k" * 65: "v"})),
    ("empty attribute name", with_(TURN, attributes={"": "v"})),
    ("256-character attribute value", with_(TURN, attributes={"k": "é" * 256})),
    ("257-character attribute value", with_(TURN, attributes={"k": "v" * 257})),
    ("numeric attribute value", with_(TURN, attributes={"k": 1})),
    ("null attributes", with_(TURN, attributes=None)),
    ("unknown field", with_(TURN, session="s")),
    ("end with a turn index", with_(END, turn_index=0)),
    ("end with a role", with_(END, role="user")),
    ("bad cause", with_(END, cause="closed")),
    ("null cause", with_(END, cause=None)),
    ("rating sideways", with_(FEEDBACK, rating="meh")),
    ("numeric comment", with_(FEEDBACK, comment=5)),
    ("feedback without index", with_(FEEDBACK, turn_index=_DROP)),
    ("feedback with text", with_(FEEDBACK, text="hi")),
    ("rating", RATING),
    ("rating 1 of 2 with a comment", with_(RATING, score=1, scale=2, comment="no")),
    ("rating above its scale", with_(RATING, score=6)),
    ("rating of 0", with_(RATING, score=0)),
    ("rating scale 1", with_(RATING, scale=1, score=1)),
    ("rating scale 101", with_(RATING, scale=101, score=3)),
    ("rating with a turn index", with_(RATING, turn_index=1)),
    ("rating without scale", with_(RATING, scale=_DROP)),
    ("fractional score", with_(RATING, score=3.5)),
    ("turn with a comment", with_(TURN, comment="hi")),
    ("not an object", [TURN]),  # type: ignore[list-item]
    ("a string", "turn"),  # type: ignore[list-item]
]


@pytest.mark.parametrize(("name", "obj"), CORPUS, ids=[n for n, _ in CORPUS])
def test_schema_and_parser_agree_on_corpus(name: str, obj: Any) -> None:
    assert schema_accepts(obj) == python_accepts(obj)


def test_corpus_has_both_verdicts() -> None:
    verdicts = [python_accepts(obj) for _, obj in CORPUS]
    assert sum(verdicts) >= 12 and len(verdicts) - sum(verdicts) >= 30


@settings(max_examples=500, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_events())
def test_schema_and_parser_agree_on_mutated_events(obj: dict[str, Any]) -> None:
    assert schema_accepts(obj) == python_accepts(obj)


def test_rules_beyond_the_schema_are_the_documented_ones() -> None:
    """The schema cannot express byte sizes, the record key, lone surrogates or the UTC year range; the parser adds those."""
    lone = b'{"schema_version":1,"type":"end","conversation_id":"\\ud83d","timestamp":"2024-01-01T00:00:00Z"}'
    assert VALIDATOR.is_valid(json.loads(lone))
    with pytest.raises(InvalidEvent, match="invalid_value.*surrogate"):
        parse_event(lone)
    for edge in ("2199-12-31T23:30:00-01:00", "1900-01-01T00:30:00+01:00"):  # in range locally, not in UTC
        obj = with_(END, timestamp=edge)
        assert VALIDATOR.is_valid(obj) and not python_accepts(obj)
    assert VALIDATOR.is_valid(with_(RATING, score=6)) and not python_accepts(with_(RATING, score=6))
    for phrase in ("max_event_bytes", "max_text_bytes", "key", "surrogate", "converted to UTC", "score must not exceed"):
        assert phrase in SCHEMA["description"]


def test_schema_file_is_valid_and_matches_the_module() -> None:
    Draft202012Validator.check_schema(SCHEMA)
    assert SCHEMA_PATH.is_file()
    defs = SCHEMA["$defs"]
    assert defs["timestamp"]["pattern"] == TIMESTAMP_PATTERN
    assert tuple(defs["turn"]["properties"]["role"]["enum"]) == ROLES
    assert tuple(defs["end"]["properties"]["cause"]["enum"]) == END_CAUSES
    assert tuple(defs["deadLetterReason"]["enum"]) == REASONS
    assert defs["turnIndex"]["maximum"] == MAX_TURN_INDEX
    assert {b["$ref"] for b in SCHEMA["oneOf"]} == {"#/$defs/turn", "#/$defs/end", "#/$defs/feedback", "#/$defs/rating"}
    assert defs["rating"]["properties"]["scale"]["maximum"] == MAX_RATING_SCALE


def test_docs_list_every_reason_code() -> None:
    doc = DOC.read_text(encoding="utf-8")
    for reason in REASONS:
        assert f"`{reason}`" in doc, reason


# --- dead letters ------------------------------------------------------------------


def test_dead_letter_keeps_exact_bytes_including_invalid_utf8() -> None:
    original = b'\xff\xfe{"text": "caf\xc3\xa9 \xe2\x82"}\x00'
    with pytest.raises(InvalidEvent) as info:
        parse_event(original, key=b"\x80key")
    dl = DeadLetter.of_record(
        info.value.reason, info.value.detail, original, b"\x80key", "convowatch.events", 3, 1234, 1707455673.5
    )
    raw = dl.to_json()
    back = DeadLetter.from_json(raw)
    assert back == dl
    assert back.original == original and back.key == b"\x80key" and back.reason == "invalid_utf8"
    d = json.loads(raw)
    assert d["original_preview"].startswith("\ufffd\ufffd{")
    assert d["original_size"] == len(original)
    Draft202012Validator(SCHEMA["$defs"]["deadLetter"]).validate(d)


def test_dead_letter_preview_is_at_most_1_kb() -> None:
    original = ("é" * 3000).encode("utf-8") + b"\xff" * 10
    dl = DeadLetter("too_large", "big", original, None, "t", 0, 0, 0.0)
    d = json.loads(dl.to_json())
    assert len(d["original_preview"].encode("utf-8")) <= 1024
    assert d["original_preview"] == "é" * 512
    assert d["key_base64"] is None
    assert DeadLetter.from_json(dl.to_json()).original == original


def test_a_dead_letter_too_large_for_a_record_keeps_the_start_size_and_hash_of_its_original() -> None:
    """An event of 1-3 MB made a dead letter larger than the producer's limit: the worker's agent crashed and the
    event was gone. Now the letter fits and says what it left out."""
    original = ('{"text": "' + "x" * 1_500_000 + '"}').encode()
    limit = 1_000_000 - RECORD_HEADROOM_BYTES
    dl = DeadLetter("too_large", "event is 1500012 bytes", original, b"c-1", "convowatch.events", 0, 9, 1.0)
    raw = dl.to_json(max_bytes=limit)
    assert len(dl.to_json()) > limit >= len(raw) > limit - 16
    assert dl.record_value(1_000_000) == raw  # what the worker and the sink send, under kafka.max_record_bytes 1,000,000
    d = json.loads(raw)
    Draft202012Validator(SCHEMA["$defs"]["deadLetter"]).validate(d)
    kept = base64.b64decode(d["original_base64"])
    assert d["original_truncated"] is True and original.startswith(kept) and len(kept) > 700_000
    assert d["original_size"] == len(original) and d["original_sha256"] == hashlib.sha256(original).hexdigest()
    with pytest.raises(DeadLetterError, match="holds only the start of its original"):
        DeadLetter.from_json(raw)
    small = DeadLetter("not_json", "x", b"{", None, "t", 0, 0, 0.0)
    assert small.to_json(max_bytes=limit) == small.to_json() and "original_truncated" not in json.loads(small.to_json())
    with pytest.raises(ValueError, match="without its original"):
        dl.to_json(max_bytes=100)


def test_a_dead_letters_detail_and_key_are_bounded() -> None:
    """Issue 54: a 262 KB event with 3,797 unknown field names of DEL characters made a 1.17 MB detail, and building
    its dead letter raised: the worker crash-looped. A record key can be as long as the broker allows, too."""
    fields = {f"{i:04}" + "\x7f" * 56: 1 for i in range(3_797)}
    raw = json.dumps(
        {"schema_version": 1, "type": "end", "conversation_id": "c", "timestamp": "2024-02-09T00:00:00Z", **fields},
        ensure_ascii=False,
    )
    with pytest.raises(InvalidEvent) as info:
        parse_event(raw.encode())
    assert (
        info.value.reason == "unknown_field"
        and info.value.detail.endswith("and 3792 more")
        and len(info.value.detail) < DEAD_LETTER_DETAIL_CHARS
    )
    key = b"k" * 300_000
    letter = DeadLetter.of_record("key_mismatch", "x" * 50_000, raw.encode(), key, "convowatch.events", 0, 5, 1.0)
    d = json.loads(letter.record_value(1_000_000))
    Draft202012Validator(SCHEMA["$defs"]["deadLetter"]).validate(d)
    assert len(d["detail"]) == DEAD_LETTER_DETAIL_CHARS and d["detail"].endswith("x... (50000 characters)")
    assert base64.b64decode(d["key_base64"]) == key[:DEAD_LETTER_KEY_BYTES] and d["key_truncated"] is True
    assert (d["key_size"], d["key_sha256"]) == (len(key), hashlib.sha256(key).hexdigest())
    assert letter.record_key is None  # the dead letter's own Kafka key: none rather than 300 KB
    with pytest.raises(DeadLetterError, match="holds only the start of its key"):
        DeadLetter.from_json(letter.to_json())
    short = DeadLetter.of_record("not_json", "x", b"{", b"c-1", "t", 0, 0, 1.0)
    assert short.record_key == b"c-1" and "key_truncated" not in json.loads(short.to_json())


def test_dead_letter_of_a_null_value_and_a_surrogate_detail() -> None:
    with pytest.raises(InvalidEvent) as info:
        parse_event(None)
    dl = DeadLetter.of_record(info.value.reason, info.value.detail, None, None, "t", 0, 7, 1.0)
    assert DeadLetter.from_json(dl.to_json()) == DeadLetter("not_json", info.value.detail, b"", None, "t", 0, 7, 1.0)
    odd = DeadLetter("invalid_value", "quoted \udc80", b"x", None, "t", 0, 0, 0.0)  # a detail that is not Unicode
    assert DeadLetter.from_json(odd.to_json()) == odd


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"nope", "not JSON"),
        (b"[]", "object"),
        (b'{"dead_letter_version": 2}', "dead_letter_version"),
        (
            json.dumps(
                {**json.loads(DeadLetter("x", "y", b"z", None, "t", 0, 0, 0.0).to_json()), "original_base64": "!!"}
            ).encode(),
            "base64",
        ),
        (
            json.dumps({**json.loads(DeadLetter("x", "y", b"z", None, "t", 0, 0, 0.0).to_json()), "offset": "3"}).encode(),
            "'offset'",
        ),
        (
            json.dumps(
                {k: v for k, v in json.loads(DeadLetter("x", "y", b"z", None, "t", 0, 0, 0.0).to_json()).items() if k != "topic"}
            ).encode(),
            "'topic'",
        ),  # fmt: skip
    ],
)
def test_bad_dead_letters_are_refused(raw: bytes, message: str) -> None:
    with pytest.raises(DeadLetterError, match=message):
        DeadLetter.from_json(raw)


def test_dead_letter_base64_is_standard() -> None:
    dl = DeadLetter("not_json", "d", bytes(range(256)), b"k", "t", 1, 2, 3.0)
    assert base64.b64decode(json.loads(dl.to_json())["original_base64"]) == bytes(range(256))
    assert DeadLetter.from_json(dl.to_json()).dead_lettered_at == 3.0
