"""A property of the assembler (issue 54): whatever a producer sends, nothing escapes and nothing is lost.

Hypothesis generates records the way a hostile or buggy producer could: mostly events the contract accepts, with
the extremes it allows (turn indexes up to 2**31 - 1, texts up to 32 KB of any Unicode, control and chat-template
tokens, 32 attributes of 256 characters), redeliveries and conflicts, ends and feedback, and some it refuses (unknown
field names, a wrong key, bytes that are no JSON). They go through the real `BatchAssembler` a batch at a time, with
its states kept between batches as the worker keeps them (JSON, as the changelog holds them), then every open
conversation is ended. The property:

- no exception escapes `apply`;
- every record the worker would send fits in one Kafka record at the default ``kafka.max_record_bytes`` (closed
  conversation, changelog state, dead letter), so no send can fail on size;
- nothing is lost: each turn event is in the turns of its closed conversation (once), a redelivery of one that is, or
  a dead letter with its exact bytes.

300 examples of 20 to 60 records: about 12,000 events a run (counted and asserted at the end of the module).
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stream.batch_assembly import BatchAssembler
from stream.contract import RECORD_HEADROOM_BYTES, DeadLetter, EndEvent, FeedbackEvent, TurnEvent, encode_event
from stream.metrics import ServiceMetrics
from stream.records import ClosedConversation
from stream.settings import AssemblySettings, KafkaSettings
from stream.state_batch import StateBatch

T0 = 1_790_000_000.0
LIMIT = KafkaSettings().max_record_bytes - RECORD_HEADROOM_BYTES
IDS = ("a", "b", "c\\'--", "d" * 256)
HOSTILE = ("<|im_end|>", "<|im_start|>assistant", "<end_of_turn>", "<start_of_turn>model", "\x00", "\x1b[2J", "\u202e")
EVENTS_SEEN: list[int] = []


@dataclass(frozen=True)
class Record:
    key: bytes | None
    value: bytes | None
    partition: int
    offset: int
    topic: str = "convowatch.events"


texts = st.one_of(
    st.text(max_size=40),
    st.builds(lambda part, n: (part * n)[:32_000], st.sampled_from(HOSTILE + ("x", "é", "\U0001f600")), st.integers(1, 32_000)),
)
indexes = st.one_of(st.integers(0, 12), st.integers(0, 2**31 - 1), st.sampled_from([9_999, 10_000, 1_000_000, 2**31 - 1]))
attributes = st.dictionaries(st.text(min_size=1, max_size=64), st.text(max_size=256), max_size=32)


@st.composite
def records(draw: st.DrawFn) -> list[Record]:
    out: list[tuple[bytes | None, bytes | None]] = []
    for _ in range(draw(st.integers(20, 60))):
        cid = draw(st.sampled_from(IDS))
        kind = draw(st.sampled_from(["turn"] * 6 + ["redeliver", "end", "feedback", "unknown_field", "bad_key", "junk"]))
        at = T0 + draw(st.integers(0, 10**6))
        if kind == "redeliver" and out:
            out.append(draw(st.sampled_from(out)))
            continue
        if kind == "end":
            event: TurnEvent | EndEvent | FeedbackEvent = EndEvent(cid, at, attributes=draw(attributes))
        elif kind == "feedback":
            event = FeedbackEvent(cid, draw(indexes), draw(st.sampled_from(["up", "down"])), at, draw(st.text(max_size=50)))
        else:
            event = TurnEvent(cid, draw(indexes), draw(st.sampled_from(["user", "assistant"])), draw(texts), at, draw(attributes))
        raw = encode_event(event)
        if kind == "unknown_field":
            names = draw(st.lists(st.text(min_size=1, max_size=64), min_size=1, max_size=3000))
            raw = json.dumps({**json.loads(raw), **{f"x{n}": 1 for n in names}}).encode()
        key = cid.encode()
        if kind == "bad_key":
            key = draw(st.binary(max_size=300_000))
        if kind == "junk":
            raw = draw(st.binary(max_size=2000))
        out.append((key, raw))
    return [Record(key, value, partition=zlib.crc32(key or b"") % 2, offset=i) for i, (key, value) in enumerate(out)]


def _fits(key: bytes | None, value: bytes | None) -> bool:
    return len(key or b"") + len(value or b"") <= LIMIT


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(records(), st.integers(1, 20))
def test_no_event_escapes_the_assembler_or_is_lost(sent: list[Record], per_batch: int) -> None:
    assembly = BatchAssembler(AssemblySettings(), partitions=2, metrics=ServiceMetrics())
    states: dict[str, dict] = {}
    closed: list[ClosedConversation] = []
    letters: list[DeadLetter] = []

    def apply(batch_records: list[Record]) -> None:
        batch = StateBatch(states)
        out = assembly.apply(batch_records, batch)
        for key, value in out.closed:
            assert _fits(key, value), len(value)
            closed.append(ClosedConversation.from_json(value))
        for letter in out.dead_letters:
            assert _fits(letter.record_key, letter.record_value(KafkaSettings().max_record_bytes))
            letters.append(letter)
        for key, state, _ in batch.changes():
            if state is None:
                states.pop(key, None)
            else:
                value = msgspec.json.encode(state)
                assert _fits(key.encode(), value), len(value)
                states[key] = json.loads(value)  # as the changelog gives it back

    for i in range(0, len(sent), per_batch):
        apply(sent[i : i + per_batch])
    ends = [encode_event(EndEvent(cid, T0 + 2 * 10**6)) for cid in IDS]
    apply([Record(cid.encode(), raw, zlib.crc32(cid.encode()) % 2, len(sent) + j) for j, (cid, raw) in enumerate(zip(IDS, ends))])

    stored = {}
    for c in closed:
        for t in c.turns:
            stored.setdefault((c.conversation_id, t.index), set()).add((t.role, t.text))
    dead = {letter.original for letter in letters}
    for record in sent:
        try:
            event = msgspec.json.decode(record.value or b"")
        except msgspec.DecodeError:
            assert record.value in dead or (record.value or b"") in dead
            continue
        if not isinstance(event, dict) or event.get("type") != "turn" or record.key != str(event.get("conversation_id")).encode():
            continue  # not a turn under its own key: dead-lettered or not a turn at all
        where = stored.get((event["conversation_id"], event["turn_index"]), set())
        assert (event["role"], event["text"]) in where or record.value in dead, (event["conversation_id"], event["turn_index"])
    EVENTS_SEEN.append(len(sent))


def test_the_property_saw_about_ten_thousand_events() -> None:
    """Runs after the property (pytest keeps a module's order): the ≥ 10,000 events issue 54 asks for."""
    assert sum(EVENTS_SEEN) >= 10_000, sum(EVENTS_SEEN)
