"""The event contract: what the chat product publishes to the events topic, and what is refused.

Events are JSON objects, one per Kafka record, keyed by the UTF-8 bytes of
their ``conversation_id``. Four types: ``turn`` (one message), ``end`` (the
conversation is over), ``feedback`` (thumbs up/down on a turn) and ``rating``
(a score for the whole conversation on a scale the event declares). The
published form is the JSON Schema ``stream/schemas/events.schema.json``;
`parse_event` enforces the same rules with hand-written checks (a JSON Schema
validator per event is too slow for the worker), plus the few the schema
cannot express: byte-size limits, the record key, and valid Unicode.

A refused event raises `InvalidEvent` with a stable ``reason`` code (a
Prometheus label; every code is in `REASONS`) and a ``detail`` naming the
field. The worker puts refused events on the dead-letter topic as a
`DeadLetter`, which keeps the original bytes exactly.

Timestamps are RFC 3339 strings with a time zone; in Python they are UTC epoch
seconds (float), kept to the microsecond. `encode_event` writes the canonical
form (``...T..:..:..ffffffZ``), which `parse_event` reads back unchanged.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any, Protocol

from scorers.conversation import ROLES
from scorers.errors import UserError

SCHEMA_VERSION = 1
SCHEMA_PATH = Path(__file__).resolve().parent / "schemas" / "events.schema.json"

MAX_TEXT_BYTES = 32_768
MAX_EVENT_BYTES = 262_144
MAX_CONVERSATION_ID_CHARS = 256
MAX_TURN_INDEX = 2**31 - 1
MAX_ATTRIBUTES = 32
MAX_ATTRIBUTE_KEY_CHARS = 64
MAX_ATTRIBUTE_VALUE_CHARS = 256
END_CAUSES: tuple[str, ...] = ("end", "idle_timeout", "retention", "capacity")
MAX_RATING_SCALE = 100  # a conversation rating's scale: 1..scale, 2 <= scale <= this
RATINGS: tuple[str, ...] = ("up", "down")
NEGATIVE_RATINGS: frozenset[str] = frozenset({"down"})  # ratings that make sampling judge the conversation
DEAD_LETTER_VERSION = 1
DEAD_LETTER_PREVIEW_BYTES = 1024
# A dead letter's detail and key are cut to these (the detail can quote field names, the key is any bytes a producer
# sent): what does not fit the producer's record limit is never the refusal itself.
DEAD_LETTER_DETAIL_CHARS = 1000
DEAD_LETTER_KEY_BYTES = 1024
# Room left in a produced record beside its value (key, headers, batch framing) under kafka.max_record_bytes.
RECORD_HEADROOM_BYTES = 4096

# RFC 3339 date-time with a zone, calendar-exact (leap years included), years 1900-2199: in that
# range a float epoch keeps every microsecond, so parse -> encode -> parse is exact.
# The same string is the schema's pattern; `$(?!\n)` stops Python's `$` from matching before a final newline.
_DATE = (
    r"(?:(?:19|2[01])[0-9]{2}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)"
    r"|02-(?:0[1-9]|1[0-9]|2[0-8]))|(?:(?:19|2[01])(?:0[48]|[2468][048]|[13579][26])|2000)-02-29)"
)
_TIME = r"[Tt](?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\.[0-9]{1,9})?"
_OFFSET = r"(?:[Zz]|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])"
TIMESTAMP_PATTERN = "^" + _DATE + _TIME + _OFFSET + r"$(?!\n)"
_TIMESTAMP_RE = re.compile(TIMESTAMP_PATTERN)

REASON_DESCRIPTIONS: dict[str, str] = {
    "too_large": "the whole record value is larger than max_event_bytes",
    "invalid_utf8": "the record value is not valid UTF-8",
    "not_json": "the value is not JSON (or is empty/null, or uses NaN/Infinity)",
    "not_object": "the JSON value is not an object",
    "unsupported_schema_version": f"schema_version is not {SCHEMA_VERSION}",
    "unknown_type": "type is not turn, end, feedback or rating",
    "missing_field": "a required field is absent",
    "unknown_field": "a field the event type does not have",
    "wrong_type": "a field has the wrong JSON type (booleans are not integers)",
    "invalid_value": "a field has the right type but a bad value (empty or long id, bad timestamp, rating, cause, score or scale, attributes, lone surrogate)",
    "unknown_role": f"a turn's role is not one of {', '.join(ROLES)}",
    "negative_turn_index": "turn_index is below 0",
    "oversized_text": "a turn's text is larger than max_text_bytes (UTF-8)",
    "key_mismatch": "the record key is not the UTF-8 bytes of conversation_id",
    "duplicate_turn_index": "(assembler) a turn index seen before with a different role or text",
    "conversation_closed": "(assembler) an event for a conversation that is already closed",
    "empty_conversation": "(assembler) an end event for a conversation with no turns",
    "turn_index_too_large": "(assembler) a turn's turn_index is above assembly.max_turn_index",
    "quarantined": "(worker) a record the worker failed on twice, with the error (the record is kept, the partition goes on)",
    "bad_closed_record": "(worker) a closed-conversation record that cannot be decoded",
    "bad_score_record": "(sink) a score record that cannot be decoded or has a bad value",
}
REASONS: tuple[str, ...] = tuple(REASON_DESCRIPTIONS)


class InvalidEvent(UserError, ValueError):
    """An event that breaks the contract: ``reason`` is a stable code in `REASONS`, ``detail`` names the field."""

    def __init__(self, reason: str, detail: str) -> None:
        if reason not in REASON_DESCRIPTIONS:
            raise ValueError(f"unknown reason code {reason!r}")
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.reason, self.detail))


@dataclass(frozen=True, slots=True)
class TurnEvent:
    """One message of a conversation."""

    conversation_id: str
    turn_index: int
    role: str
    text: str
    timestamp: float
    attributes: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class EndEvent:
    """The conversation is over (``cause`` end), or the worker closed it (idle_timeout, retention, capacity)."""

    conversation_id: str
    timestamp: float
    cause: str = "end"
    attributes: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class FeedbackEvent:
    """A user's rating (up/down) of one turn."""

    conversation_id: str
    turn_index: int
    rating: str
    timestamp: float
    comment: str = ""
    attributes: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class RatingEvent:
    """A user's score for the whole conversation: ``score`` in 1..``scale`` (e.g. 4 of 5 stars)."""

    conversation_id: str
    score: int
    scale: int
    timestamp: float
    comment: str = ""
    attributes: dict[str, str] = field(default_factory=dict)


Event = TurnEvent | EndEvent | FeedbackEvent | RatingEvent
EVENT_TYPES = (TurnEvent, EndEvent, FeedbackEvent, RatingEvent)

_COMMON = ("schema_version", "type", "conversation_id", "timestamp")
_FIELDS: dict[str, tuple[frozenset[str], frozenset[str]]] = {  # type -> (allowed, required)
    "turn": (
        frozenset({*_COMMON, "turn_index", "role", "text", "attributes"}),
        frozenset({*_COMMON, "turn_index", "role", "text"}),
    ),
    "end": (frozenset({*_COMMON, "cause", "attributes"}), frozenset(_COMMON)),
    "feedback": (
        frozenset({*_COMMON, "turn_index", "rating", "comment", "attributes"}),
        frozenset({*_COMMON, "turn_index", "rating"}),
    ),
    "rating": (
        frozenset({*_COMMON, "score", "scale", "comment", "attributes"}),
        frozenset({*_COMMON, "score", "scale"}),
    ),
}
_ROLES = frozenset(ROLES)
_EPOCH_ORDINAL = date(1970, 1, 1).toordinal()
_MIN_MICROS = (date(1900, 1, 1).toordinal() - _EPOCH_ORDINAL) * 86_400_000_000
_END_MICROS = (date(2200, 1, 1).toordinal() - _EPOCH_ORDINAL) * 86_400_000_000


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not allowed in JSON")


_decode_json = json.JSONDecoder(parse_constant=_reject_constant).decode


def _json_type(v: object) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, (int, float)):
        return "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, list):
        return "array"
    return "object"


def _wrong_type(kind: str, name: str, expected: str, v: object) -> InvalidEvent:
    return InvalidEvent("wrong_type", f"{kind} event: {name} must be {expected}, got {_json_type(v)}")


def _string(kind: str, name: str, v: object) -> str:
    if type(v) is not str:
        raise _wrong_type(kind, name, "a string", v)
    return v


def _integer(kind: str, name: str, v: object) -> int:
    """A JSON integer: an int, or a float with no fractional part (JSON does not tell them apart); never a boolean."""
    if type(v) is int:
        return v
    if type(v) is float and v.is_integer():
        return int(v)
    raise _wrong_type(kind, name, "an integer", v)


def _turn_index(kind: str, v: object) -> int:
    i = _integer(kind, "turn_index", v)
    if i < 0:
        raise InvalidEvent("negative_turn_index", f"{kind} event: turn_index must be >= 0, got {i}")
    if i > MAX_TURN_INDEX:
        raise InvalidEvent("invalid_value", f"{kind} event: turn_index must be <= {MAX_TURN_INDEX}, got {i}")
    return i


def _conversation_id(kind: str, v: object) -> str:
    cid = _string(kind, "conversation_id", v)
    if not cid or len(cid) > MAX_CONVERSATION_ID_CHARS:
        raise InvalidEvent(
            "invalid_value", f"{kind} event: conversation_id must be 1..{MAX_CONVERSATION_ID_CHARS} characters, got {len(cid)}"
        )
    return cid


def parse_timestamp(value: str) -> float:
    """UTC epoch seconds of an RFC 3339 timestamp with a zone (years 1900-2199, also in UTC); ValueError if not.

    Fractional digits beyond the microsecond are truncated; the result is the
    float nearest to the exact instant, so `format_timestamp` gives it back.
    """
    if _TIMESTAMP_RE.match(value) is None:
        raise ValueError(
            f"{value[:64]!r} is not an RFC 3339 date-time with a time zone (e.g. 2024-02-09T05:14:33.5Z), years 1900-2199"
        )
    days = date(int(value[0:4]), int(value[5:7]), int(value[8:10])).toordinal() - _EPOCH_ORDINAL
    seconds = days * 86_400 + int(value[11:13]) * 3600 + int(value[14:16]) * 60 + int(value[17:19])
    micros = 0
    pos = 19
    if value[19] == ".":
        end = 20
        while value[end].isdigit():  # the pattern guarantees ASCII digits, then the zone
            end += 1
        micros = int(value[20:end][:6].ljust(6, "0"))
        pos = end
    if value[pos] not in "Zz":
        offset = int(value[pos + 1 : pos + 3]) * 3600 + int(value[pos + 4 : pos + 6]) * 60
        seconds -= offset if value[pos] == "+" else -offset
    total = seconds * 1_000_000 + micros
    if not _MIN_MICROS <= total < _END_MICROS:  # only within a day of the edges: the zone moved the date across
        raise ValueError(f"{value[:64]!r} is outside years 1900-2199 once converted to UTC")
    return total / 1_000_000  # int / int is correctly rounded


def _epoch_micros(ts: float) -> int:
    """``ts`` in whole microseconds, rounded exactly (half away from zero)."""
    num, den = float(ts).as_integer_ratio()
    q, r = divmod(num * 1_000_000, den)
    return q + 1 if 2 * r >= den else q


def format_timestamp(ts: float) -> str:
    """Canonical RFC 3339 form of UTC epoch seconds: ``YYYY-MM-DDTHH:MM:SS.ffffffZ``."""
    days, rem = divmod(_epoch_micros(ts), 86_400_000_000)
    d = date.fromordinal(days + _EPOCH_ORDINAL)  # ValueError/OverflowError outside years 1..9999
    secs, micros = divmod(rem, 1_000_000)
    hh, rest = divmod(secs, 3600)
    mm, ss = divmod(rest, 60)
    return f"{d.year:04d}-{d.month:02d}-{d.day:02d}T{hh:02d}:{mm:02d}:{ss:02d}.{micros:06d}Z"


def _timestamp(kind: str, v: object) -> float:
    s = _string(kind, "timestamp", v)
    try:
        return parse_timestamp(s)
    except ValueError as e:
        raise InvalidEvent("invalid_value", f"{kind} event: timestamp {e}") from None


def _attributes(kind: str, v: object) -> dict[str, str]:
    if type(v) is not dict:
        raise _wrong_type(kind, "attributes", "an object of strings", v)
    if len(v) > MAX_ATTRIBUTES:
        raise InvalidEvent("invalid_value", f"{kind} event: attributes has {len(v)} keys, at most {MAX_ATTRIBUTES} allowed")
    for k, val in v.items():
        if not k or len(k) > MAX_ATTRIBUTE_KEY_CHARS:
            raise InvalidEvent(
                "invalid_value", f"{kind} event: attribute name {k[:80]!r} must be 1..{MAX_ATTRIBUTE_KEY_CHARS} characters"
            )
        if type(val) is not str:
            raise _wrong_type(kind, f"attributes[{k!r}]", "a string", val)
        if len(val) > MAX_ATTRIBUTE_VALUE_CHARS:
            raise InvalidEvent(
                "invalid_value",
                f"{kind} event: attributes[{k!r}] has {len(val)} characters, at most {MAX_ATTRIBUTE_VALUE_CHARS} allowed",
            )
    return v


def _utf8_size(kind: str, name: str, s: str) -> int:
    """UTF-8 length of ``s``; JSON can escape lone UTF-16 surrogates (\\ud800), which are not Unicode and cannot be stored."""
    try:
        return len(s.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidEvent(
            "invalid_value", f"{kind} event: {name} contains a lone UTF-16 surrogate escape, which is not valid Unicode"
        ) from None


def _parse_turn(obj: dict[str, Any], max_text_bytes: int) -> TurnEvent:
    cid = _conversation_id("turn", obj["conversation_id"])
    index = _turn_index("turn", obj["turn_index"])
    role = _string("turn", "role", obj["role"])
    if role not in _ROLES:
        raise InvalidEvent("unknown_role", f"turn event: role {role[:40]!r} is not one of {ROLES}")
    text = _string("turn", "text", obj["text"])
    size = len(text) if text.isascii() else _utf8_size("turn", "text", text)
    if size > max_text_bytes:
        raise InvalidEvent("oversized_text", f"turn event: text is {size} UTF-8 bytes, at most {max_text_bytes} allowed")
    ts = _timestamp("turn", obj["timestamp"])
    attrs = _attributes("turn", obj["attributes"]) if "attributes" in obj else {}
    return TurnEvent(cid, index, role, text, ts, attrs)


def _parse_end(obj: dict[str, Any], max_text_bytes: int) -> EndEvent:
    cid = _conversation_id("end", obj["conversation_id"])
    ts = _timestamp("end", obj["timestamp"])
    cause = "end"
    if "cause" in obj:
        cause = _string("end", "cause", obj["cause"])
        if cause not in END_CAUSES:
            raise InvalidEvent("invalid_value", f"end event: cause {cause[:40]!r} is not one of {END_CAUSES}")
    attrs = _attributes("end", obj["attributes"]) if "attributes" in obj else {}
    return EndEvent(cid, ts, cause, attrs)


def _parse_feedback(obj: dict[str, Any], max_text_bytes: int) -> FeedbackEvent:
    cid = _conversation_id("feedback", obj["conversation_id"])
    index = _turn_index("feedback", obj["turn_index"])
    rating = _string("feedback", "rating", obj["rating"])
    if rating not in RATINGS:
        raise InvalidEvent("invalid_value", f"feedback event: rating {rating[:40]!r} is not one of {RATINGS}")
    ts = _timestamp("feedback", obj["timestamp"])
    comment = _string("feedback", "comment", obj["comment"]) if "comment" in obj else ""
    attrs = _attributes("feedback", obj["attributes"]) if "attributes" in obj else {}
    return FeedbackEvent(cid, index, rating, ts, comment, attrs)


def _parse_rating(obj: dict[str, Any], max_text_bytes: int) -> RatingEvent:
    cid = _conversation_id("rating", obj["conversation_id"])
    scale = _integer("rating", "scale", obj["scale"])
    if not 2 <= scale <= MAX_RATING_SCALE:
        raise InvalidEvent("invalid_value", f"rating event: scale must be 2..{MAX_RATING_SCALE} (answers 1..scale), got {scale}")
    score = _integer("rating", "score", obj["score"])
    if not 1 <= score <= scale:
        raise InvalidEvent("invalid_value", f"rating event: score must be 1..{scale} (its scale), got {score}")
    ts = _timestamp("rating", obj["timestamp"])
    comment = _string("rating", "comment", obj["comment"]) if "comment" in obj else ""
    attrs = _attributes("rating", obj["attributes"]) if "attributes" in obj else {}
    return RatingEvent(cid, score, scale, ts, comment, attrs)


_PARSERS: dict[str, Callable[[dict[str, Any], int], Event]] = {
    "turn": _parse_turn,
    "end": _parse_end,
    "feedback": _parse_feedback,
    "rating": _parse_rating,
}


def _strings(event: Event) -> list[tuple[str, str]]:
    out = [("conversation_id", event.conversation_id)]
    if isinstance(event, TurnEvent):
        out.append(("text", event.text))
    elif isinstance(event, (FeedbackEvent, RatingEvent)):
        out.append(("comment", event.comment))
    for k, v in event.attributes.items():
        out += [("attribute name", k), (f"attributes[{k!r}]", v)]
    return out


def _kind(event: Event) -> str:
    kinds = {TurnEvent: "turn", EndEvent: "end", FeedbackEvent: "feedback", RatingEvent: "rating"}
    return kinds[type(event)]


def parse_event(
    raw: bytes | None,
    *,
    key: bytes | None = None,
    max_text_bytes: int = MAX_TEXT_BYTES,
    max_event_bytes: int = MAX_EVENT_BYTES,
) -> Event:
    """Validate one record value (and its key, when given) against the contract; raise `InvalidEvent`."""
    if raw is None:
        raise InvalidEvent("not_json", "the record has no value (null)")
    if len(raw) > max_event_bytes:
        raise InvalidEvent("too_large", f"the event is {len(raw)} bytes, at most {max_event_bytes} allowed")
    try:
        text = bytes(raw).decode("utf-8")
    except UnicodeDecodeError as e:
        raise InvalidEvent(
            "invalid_utf8", f"the value is not UTF-8: byte {e.start} ({raw[e.start : e.start + 1]!r}) {e.reason}"
        ) from None
    if text.startswith("\ufeff"):
        raise InvalidEvent("not_json", "the value starts with a byte order mark (BOM); JSON on the topic must not")
    try:
        obj = _decode_json(text)
    except RecursionError:
        raise InvalidEvent("not_json", "the value is nested too deeply to parse") from None
    except ValueError as e:  # JSONDecodeError, NaN/Infinity
        raise InvalidEvent("not_json", f"the value is not JSON: {e}") from None
    if type(obj) is not dict:
        raise InvalidEvent("not_object", f"the event must be a JSON object, got {_json_type(obj)}")

    if "schema_version" not in obj:
        raise InvalidEvent("missing_field", "missing field 'schema_version'")
    version = obj["schema_version"]
    if type(version) not in (int, float) or version != SCHEMA_VERSION:
        if type(version) in (int, float):
            raise InvalidEvent(
                "unsupported_schema_version", f"schema_version {version!r} is not supported; this worker reads {SCHEMA_VERSION}"
            )
        raise _wrong_type("the", "schema_version", "an integer", version)
    if "type" not in obj:
        raise InvalidEvent("missing_field", "missing field 'type'")
    kind = obj["type"]
    if type(kind) is not str:
        raise _wrong_type("the", "type", "a string", kind)
    parser = _PARSERS.get(kind)
    if parser is None:
        raise InvalidEvent("unknown_type", f"type {kind[:40]!r} is not one of {tuple(_PARSERS)}")
    allowed, required = _FIELDS[kind]
    if not allowed.issuperset(obj):
        extra = sorted(k for k in obj if k not in allowed)
        more = f" and {len(extra) - 5} more" if len(extra) > 5 else ""
        names = ", ".join(repr(k[:24]) for k in extra[:5])  # at most ~500 characters: each repr'd char takes up to 10
        raise InvalidEvent("unknown_field", f"{kind} event: {len(extra)} unknown field(s): {names}{more}")
    if not required.issubset(obj):
        missing = sorted(required.difference(obj))
        raise InvalidEvent("missing_field", f"{kind} event: missing field(s) {', '.join(repr(k) for k in missing)}")
    event = parser(obj, max_text_bytes)

    if b"\\u" in raw:  # only JSON escapes can smuggle in lone surrogates
        for name, s in _strings(event):
            if not s.isascii():
                _utf8_size(kind, name, s)
    if key is not None and key != event.conversation_id.encode("utf-8"):
        raise InvalidEvent(
            "key_mismatch", f"{kind} event: record key {bytes(key)[:80]!r} is not conversation_id {event.conversation_id[:80]!r}"
        )
    return event


def may_be_of_type(raw: bytes | None, kinds: Iterable[str]) -> bool:
    """False only if ``raw`` cannot be an event of one of ``kinds``: none of their names appears in it as a JSON string
    and it has no ``\\u`` escape (the only way JSON can spell a letter otherwise). A test far cheaper than `parse_event`,
    for a reader that wants a few types of a busy topic (the sink: feedback and ratings among the turns)."""
    if raw is None:
        return False
    return b"\\u" in raw or any(f'"{kind}"'.encode() in raw for kind in kinds)


def event_key(event: Event) -> bytes:
    """The record key of an event: its conversation id in UTF-8."""
    return event.conversation_id.encode("utf-8")


def event_to_dict(event: Event) -> dict[str, Any]:
    """The canonical JSON object of an event (fields in schema order; empty optional fields left out)."""
    kind = _kind(event)
    try:
        ts = format_timestamp(event.timestamp)
    except (ValueError, OverflowError, TypeError) as e:
        raise InvalidEvent("invalid_value", f"{kind} event: timestamp {event.timestamp!r} cannot be written: {e}") from None
    d: dict[str, Any] = {"schema_version": SCHEMA_VERSION, "type": kind, "conversation_id": event.conversation_id}
    if isinstance(event, TurnEvent):
        d.update(turn_index=event.turn_index, role=event.role, text=event.text, timestamp=ts)
    elif isinstance(event, EndEvent):
        d.update(timestamp=ts, cause=event.cause)
    elif isinstance(event, FeedbackEvent):
        d.update(turn_index=event.turn_index, rating=event.rating, timestamp=ts)
        if event.comment:
            d["comment"] = event.comment
    else:
        d.update(score=event.score, scale=event.scale, timestamp=ts)
        if event.comment:
            d["comment"] = event.comment
    if event.attributes:
        d["attributes"] = dict(sorted(event.attributes.items()))
    return d


def encode_event(event: Event) -> bytes:
    """Canonical UTF-8 JSON of an event; raises `InvalidEvent` if the event breaks the contract.

    The result parses back (`parse_event`) to an equal event. Size limits are
    the worker's settings and are not applied here.
    """
    if not isinstance(event, EVENT_TYPES):
        raise TypeError(f"not an event: {type(event).__name__}")
    try:
        for name, s in _strings(event):
            if isinstance(s, str):
                _utf8_size(_kind(event), name, s)
        raw = json.dumps(event_to_dict(event), ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")
    except InvalidEvent:
        raise
    except (TypeError, ValueError, AttributeError) as e:
        raise InvalidEvent("wrong_type", f"{_kind(event)} event cannot be written as JSON: {e}") from None
    parse_event(raw, max_text_bytes=len(raw), max_event_bytes=len(raw))  # the encoder never writes what the worker refuses
    return raw


def load_schema() -> dict[str, Any]:
    """The published JSON Schema of events (draft 2020-12)."""
    return json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))


class ConsumedRecord(Protocol):
    """What is read of a consumed record (Faust's `Message` and aiokafka's `ConsumerRecord` both have it)."""

    @property
    def key(self) -> bytes | None: ...
    @property
    def value(self) -> bytes | None: ...
    @property
    def topic(self) -> str: ...
    @property
    def partition(self) -> int: ...
    @property
    def offset(self) -> int: ...


class DeadLetterError(UserError, ValueError):
    """A dead-letter record that cannot be decoded; the message names the field."""


def _dumps(d: dict[str, Any]) -> bytes:
    try:
        return json.dumps(d, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")
    except UnicodeEncodeError:  # a detail quoting a lone surrogate: escape everything instead
        return json.dumps(d, ensure_ascii=True, separators=(",", ":"), allow_nan=False).encode("ascii")


def _preview(original: bytes) -> str:
    """At most DEAD_LETTER_PREVIEW_BYTES UTF-8 bytes of text, bad bytes replaced: for humans reading the topic."""
    text = original[:DEAD_LETTER_PREVIEW_BYTES].decode("utf-8", "replace")
    return text.encode("utf-8")[:DEAD_LETTER_PREVIEW_BYTES].decode("utf-8", "ignore")


@dataclass(frozen=True)
class DeadLetter:
    """A refused event on the dead-letter topic: why, where it came from, and its exact bytes."""

    reason: str
    detail: str
    original: bytes
    key: bytes | None
    topic: str
    partition: int
    offset: int
    dead_lettered_at: float

    @classmethod
    def of_record(
        cls,
        reason: str,
        detail: str,
        value: bytes | None,
        key: bytes | None,
        topic: str,
        partition: int,
        offset: int,
        at: float | None = None,
    ) -> DeadLetter:
        """The dead letter for a consumed record refused for ``reason`` (a null value is kept as empty bytes), dead-lettered
        ``at`` (default: now). The worker and the sink both build their dead letters here."""
        return cls(
            reason,
            detail,
            bytes(value or b""),
            None if key is None else bytes(key),
            topic,
            partition,
            offset,
            time.time() if at is None else at,
        )

    @classmethod
    def of_message(cls, reason: str, detail: str, record: ConsumedRecord) -> DeadLetter:
        """`of_record` for a consumed ``record`` of any Kafka client."""
        r = record
        return cls.of_record(reason, detail, r.value, r.key, r.topic, r.partition, r.offset)

    @property
    def record_key(self) -> bytes | None:
        """The dead letter's own Kafka key: the original key, or none if that is longer than DEAD_LETTER_KEY_BYTES."""
        return self.key if self.key is None or len(self.key) <= DEAD_LETTER_KEY_BYTES else None

    def to_dict(self, original_bytes: int | None = None) -> dict[str, Any]:
        """The record; with ``original_bytes``, ``original_base64`` holds only that many first bytes of the value
        (``original_truncated``); ``original_size`` and ``original_sha256`` always describe all of it. The detail
        and the key are cut to DEAD_LETTER_DETAIL_CHARS and DEAD_LETTER_KEY_BYTES (``key_truncated``, with the whole
        key's ``key_size`` and ``key_sha256``)."""
        kept = self.original if original_bytes is None else self.original[:original_bytes]
        detail = self.detail
        if len(detail) > DEAD_LETTER_DETAIL_CHARS:
            cut = f"... ({len(detail)} characters)"
            detail = detail[: DEAD_LETTER_DETAIL_CHARS - len(cut)] + cut
        key = self.key
        out = {
            "dead_letter_version": DEAD_LETTER_VERSION,
            "reason": self.reason,
            "detail": detail,
            "original_base64": base64.b64encode(kept).decode("ascii"),
            "original_size": len(self.original),
            "original_sha256": hashlib.sha256(self.original).hexdigest(),
            "original_preview": _preview(self.original),
            "key_base64": None if key is None else base64.b64encode(key[:DEAD_LETTER_KEY_BYTES]).decode("ascii"),
            "topic": self.topic,
            "partition": self.partition,
            "offset": self.offset,
            "dead_lettered_at": self.dead_lettered_at,
        }
        if len(kept) < len(self.original):
            out["original_truncated"] = True
        if key is not None and len(key) > DEAD_LETTER_KEY_BYTES:
            out.update(key_truncated=True, key_size=len(key), key_sha256=hashlib.sha256(key).hexdigest())
        return out

    def to_json(self, max_bytes: int | None = None) -> bytes:
        """The record as JSON, at most ``max_bytes`` long (the producer's record limit): an original too large to
        fit whole is cut to the longest start that fits, so the refusal itself is never lost."""
        raw = _dumps(self.to_dict())
        if max_bytes is None or len(raw) <= max_bytes:
            return raw
        overhead = len(_dumps(self.to_dict(original_bytes=0)))
        keep = max((max_bytes - overhead) // 4 * 3, 0)  # base64: 4 characters per 3 bytes
        raw = _dumps(self.to_dict(original_bytes=keep))
        if len(raw) > max_bytes:
            raise ValueError(f"a dead letter needs {overhead} bytes without its original, more than max_bytes {max_bytes}")
        return raw

    def record_value(self, max_record_bytes: int) -> bytes:
        """`to_json` for a producer whose records are at most ``max_record_bytes`` (``kafka.max_record_bytes``), room
        left for the key, headers and batch framing."""
        return self.to_json(max_bytes=max_record_bytes - RECORD_HEADROOM_BYTES)

    @classmethod
    def from_json(cls, raw: bytes) -> DeadLetter:
        """Decode a dead-letter record; the original bytes come back exactly."""
        try:
            d = json.loads(raw)
        except ValueError as e:
            raise DeadLetterError(f"dead letter is not JSON: {e}") from None
        if not isinstance(d, dict):
            raise DeadLetterError("dead letter must be a JSON object")
        if d.get("dead_letter_version") != DEAD_LETTER_VERSION:
            raise DeadLetterError(f"dead_letter_version {d.get('dead_letter_version')!r} is not {DEAD_LETTER_VERSION}")
        if d.get("original_truncated"):
            raise DeadLetterError(
                f"dead letter of {d.get('topic')!r} offset {d.get('offset')!r} holds only the start of its original "
                f"({d.get('original_size')!r} bytes, SHA-256 {d.get('original_sha256')!r}): it cannot give the original back"
            )
        if d.get("key_truncated"):
            raise DeadLetterError(
                f"dead letter of {d.get('topic')!r} offset {d.get('offset')!r} holds only the start of its key "
                f"({d.get('key_size')!r} bytes, SHA-256 {d.get('key_sha256')!r}): it cannot give the original back"
            )
        fields: Mapping[str, type | tuple[type, ...]] = {
            "reason": str, "detail": str, "original_base64": str, "topic": str,
            "partition": int, "offset": int, "dead_lettered_at": (int, float),
        }  # fmt: skip
        for name, t in fields.items():
            if name not in d:
                raise DeadLetterError(f"dead letter: missing field {name!r}")
            if not isinstance(d[name], t) or isinstance(d[name], bool):
                raise DeadLetterError(f"dead letter: field {name!r} has the wrong type ({_json_type(d[name])})")
        key_b64 = d.get("key_base64")
        if key_b64 is not None and not isinstance(key_b64, str):
            raise DeadLetterError(f"dead letter: field 'key_base64' has the wrong type ({_json_type(key_b64)})")
        try:
            original = base64.b64decode(d["original_base64"], validate=True)
            key = None if key_b64 is None else base64.b64decode(key_b64, validate=True)
        except binascii.Error as e:
            raise DeadLetterError(f"dead letter: bad base64: {e}") from None
        return cls(d["reason"], d["detail"], original, key, d["topic"], d["partition"], d["offset"], float(d["dead_lettered_at"]))
