"""`BatchAssembler`: a batch of raw event records → closed conversations, dead letters and changed states, with the
per-partition caps of open and closed conversations (the assemble agent's logic, without Kafka)."""

from __future__ import annotations

from dataclasses import dataclass

from stream.batch_assembly import BatchAssembler
from stream.contract import EndEvent, TurnEvent, encode_event
from stream.metrics import ServiceMetrics
from stream.records import ClosedConversation
from stream.settings import AssemblySettings
from stream.state_batch import StateBatch

T0 = 1_790_000_000.0


@dataclass(frozen=True)
class Record:
    """A consumed record as aiokafka or Faust hands it over."""

    key: bytes | None
    value: bytes | None
    partition: int = 0
    offset: int = 0
    topic: str = "convowatch.events"


def turn(cid: str, index: int, partition: int = 0, offset: int = 0) -> Record:
    event = TurnEvent(cid, index, "user" if index % 2 == 0 else "assistant", f"text {index}", T0 + index)
    return Record(cid.encode(), encode_event(event), partition, offset)


def end(cid: str, partition: int = 0, offset: int = 0) -> Record:
    return Record(cid.encode(), encode_event(EndEvent(cid, T0 + 100)), partition, offset)


def assembler(**settings: int) -> tuple[BatchAssembler, ServiceMetrics]:
    metrics = ServiceMetrics()
    return BatchAssembler(AssemblySettings(**settings), partitions=2, metrics=metrics), metrics


def test_a_batch_closes_what_ended_and_keeps_each_changed_state_once() -> None:
    assembly, metrics = assembler()
    table: dict = {}
    batch = StateBatch(table)
    out = assembly.apply([turn("a", 0), turn("b", 0, partition=1), turn("a", 1), end("a")], batch)
    assert [key for key, _ in out.closed] == [b"a"] and out.dead_letters == []
    closed = ClosedConversation.from_json(out.closed[0][1])
    assert [t.index for t in closed.turns] == [0, 1] and closed.close_cause == "end"
    changes = {key: (state is not None, partition) for key, state, partition in batch.changes()}
    assert changes == {"a": (True, 0), "b": (True, 1)}  # a is kept closed (its fingerprints), b open in partition 1
    assert metrics.conversations_closed.labels("end")._value.get() == 1
    assert metrics.events.labels("turn", "accepted")._value.get() == 3


def test_bad_records_become_dead_letters_with_their_origin_and_the_batch_goes_on() -> None:
    assembly, metrics = assembler()
    batch = StateBatch({})
    bad = Record(b"x", b"{not json", partition=1, offset=41)
    out = assembly.apply([bad, turn("a", 0, offset=42)], batch)
    [letter] = out.dead_letters
    assert (letter.original, letter.key, letter.partition, letter.offset) == (b"{not json", b"x", 1, 41)
    assert letter.topic == "convowatch.events" and letter.reason == "not_json"
    assert [key for key, _, _ in batch.changes()] == ["a"]
    assert metrics.dead_letters.labels("not_json")._value.get() == 1
    counted = {
        (s.labels["type"], s.labels["outcome"]): s.value for s in metrics.events.collect()[0].samples if s.name.endswith("_total")
    }
    assert counted == {("invalid", "dead_letter"): 1, ("turn", "accepted"): 1}  # each event once, the bad one too


def test_a_turn_after_the_close_is_dead_lettered_and_a_redelivered_one_is_not() -> None:
    assembly, _ = assembler()
    table: dict = {}
    batch = StateBatch(table)
    assembly.apply([turn("a", 0), end("a")], batch)
    out = assembly.apply([turn("a", 0, offset=7), turn("a", 5, offset=8)], batch)
    assert out.closed == [] and [(d.reason, d.offset) for d in out.dead_letters] == [("conversation_closed", 8)]


def test_past_a_partitions_open_share_its_longest_idle_is_closed_with_cause_capacity() -> None:
    assembly, metrics = assembler(max_open_conversations=4)  # 2 per partition (2 partitions)
    batch = StateBatch({})
    out = assembly.apply([turn("a", 0), turn("b", 0), turn("x", 0, partition=1), turn("a", 1), turn("c", 0)], batch)
    [(key, value)] = out.closed
    assert key == b"b" and ClosedConversation.from_json(value).close_cause == "capacity"  # a had a newer turn
    assert metrics.conversations_closed.labels("capacity")._value.get() == 1
    assert len(assembly.open_index) == 3


def test_past_a_partitions_closed_share_its_oldest_closed_state_is_deleted() -> None:
    assembly, metrics = assembler(max_closed_conversations=2)  # 1 per partition
    batch = StateBatch({})
    assembly.apply([turn("a", 0), end("a"), turn("b", 0), end("b")], batch)
    assert batch.get("a") is None and batch.get("b") is not None  # a's fingerprints forgotten early
    assert metrics.closed_forgotten_early._value.get() == 1
