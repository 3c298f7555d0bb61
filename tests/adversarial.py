"""Records a hostile or buggy producer could send, and the real assembler run over them (issue 54's property tests).

`records` is a hypothesis strategy: mostly events the contract accepts, with the extremes it allows (turn indexes up
to 2**31 - 1, texts up to 32 KB of any Unicode, control and chat-template tokens, 32 attributes of 256 characters),
redeliveries and conflicts, ends and feedback, and some it refuses (unknown field names, a wrong key, bytes that are
no JSON). `assemble` puts them through the real `BatchAssembler` a batch at a time, its states kept between batches
as the worker keeps them (JSON, as the changelog holds them), then ends every conversation, and checks that every
record the worker would send fits in one Kafka record at the default ``kafka.max_record_bytes``.
tests/unit/test_adversarial_events.py holds the assembler's property, tests/integration/test_adversarial_scoring.py
the scorer's on what it closes.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field

import msgspec
from hypothesis import strategies as st

from stream.batch_assembly import BatchAssembler
from stream.contract import RECORD_HEADROOM_BYTES, DeadLetter, EndEvent, FeedbackEvent, TurnEvent, encode_event
from stream.metrics import ServiceMetrics
from stream.records import ClosedConversation
from stream.settings import AssemblySettings, KafkaSettings
from stream.state_batch import StateBatch

T0 = 1_790_000_000.0
MAX_RECORD_BYTES = KafkaSettings().max_record_bytes
LIMIT = MAX_RECORD_BYTES - RECORD_HEADROOM_BYTES  # what a stage's send accepts (stream/poll_stage.py)
IDS = ("a", "b", "c\\'--", "d" * 256)
HOSTILE = ("<|im_end|>", "<|im_start|>assistant", "<end_of_turn>", "<start_of_turn>model", "\x00", "\x1b[2J", "\u202e")
PARTITIONS = 2


@dataclass(frozen=True)
class Record:
    """A consumed record as a stage reads it (stream.contract.ConsumedRecord)."""

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
def records(draw: st.DrawFn, min_size: int = 20, max_size: int = 60) -> list[Record]:
    """``min_size`` to ``max_size`` records of the events topic, on the conversations `IDS`, in one order a producer
    could send them."""
    out: list[tuple[bytes | None, bytes | None]] = []
    for _ in range(draw(st.integers(min_size, max_size))):
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
    return [Record(key, value, partition=zlib.crc32(key or b"") % PARTITIONS, offset=i) for i, (key, value) in enumerate(out)]


def fits(key: bytes | None, value: bytes | None) -> bool:
    """Whether a record of ``key`` and ``value`` is one a stage's send accepts at the default settings."""
    return len(key or b"") + len(value or b"") <= LIMIT


@dataclass
class Assembled:
    """What the assembler sent for some records: the closed topic's records (key, value) and the dead letters."""

    closed: list[tuple[bytes, bytes]] = field(default_factory=list)
    dead_letters: list[DeadLetter] = field(default_factory=list)

    def conversations(self) -> list[ClosedConversation]:
        return [ClosedConversation.from_json(value) for _, value in self.closed]


def assemble(sent: Sequence[Record], per_batch: int) -> Assembled:
    """``sent`` through the real `BatchAssembler`, ``per_batch`` records at a time, then an end for every id; fails
    (AssertionError) if any record the worker would send does not fit in one Kafka record."""
    assembly = BatchAssembler(AssemblySettings(), partitions=PARTITIONS, metrics=ServiceMetrics())
    states: dict[str, dict] = {}
    result = Assembled()

    def apply(batch_records: Sequence[Record]) -> None:
        batch = StateBatch(states)
        out = assembly.apply(list(batch_records), batch)
        for key, value in out.closed:
            assert fits(key, value), len(value)
            result.closed.append((key, value))
        for letter in out.dead_letters:
            assert fits(letter.record_key, letter.record_value(MAX_RECORD_BYTES))
            result.dead_letters.append(letter)
        for key, state, _ in batch.changes():
            if state is None:
                states.pop(key, None)
            else:
                value = msgspec.json.encode(state)
                assert fits(key.encode(), value), len(value)
                states[key] = json.loads(value)  # as the changelog gives it back

    for i in range(0, len(sent), per_batch):
        apply(sent[i : i + per_batch])
    ends = [encode_event(EndEvent(cid, T0 + 2 * 10**6)) for cid in IDS]
    apply(
        [
            Record(cid.encode(), raw, zlib.crc32(cid.encode()) % PARTITIONS, len(sent) + j)
            for j, (cid, raw) in enumerate(zip(IDS, ends))
        ]
    )
    return result
