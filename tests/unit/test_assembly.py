"""`ConversationAssembler`: the assembly rules of stream/assembly.py, applied as a pure function of (state, event, now).

Every step goes through `apply_checked`, which also holds the state to what the
Faust table needs: plain JSON that survives a ``json.dumps``/``json.loads`` round
trip (the table's changelog is JSON), and an assembler that behaves the same on
the decoded copy as on the original.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scorers.conversation import ROLES
from stream.assembly import ConversationAssembler, State, Step, is_closed
from stream.contract import EndEvent, Event, FeedbackEvent, TurnEvent
from stream.records import ClosedConversation, RecordError, ScoreRecord
from stream.settings import AssemblySettings

CID = "conv-1"
T0 = 1_704_067_200.0  # event time: 2024-01-01T00:00:00Z
NOW = 1_800_000_000.0  # processing time (the worker's clock), far from event time on purpose
IDLE_S = 600.0
RETENTION_S = 3600.0


def assembler(max_turns: int = 50) -> ConversationAssembler:
    return ConversationAssembler(AssemblySettings(idle_timeout_s=IDLE_S, closed_retention_s=RETENTION_S, max_turns=max_turns))


def turn(
    i: int, text: str | None = None, role: str | None = None, at: float | None = None, cid: str = CID, **attributes: str
) -> TurnEvent:
    return TurnEvent(
        cid,
        i,
        role or ("user" if i % 2 == 0 else "assistant"),
        text if text is not None else f"message {i}",
        T0 + 10 * i if at is None else at,
        dict(attributes),
    )


def end(at: float = T0 + 1000, cause: str = "end", cid: str = CID, **attributes: str) -> EndEvent:
    return EndEvent(cid, at, cause, dict(attributes))


def json_round_trip(state: State | None) -> State | None:
    return json.loads(json.dumps(state, allow_nan=False))


def comparable(step: Step) -> tuple[Any, ...]:
    return (step.state, step.outcome, step.closed, step.dead_letter)


def apply_checked(a: ConversationAssembler, state: State | None, event: Event, now: float, partition: int = 0) -> Step:
    """``a.apply`` plus the table contract: JSON state in and out, same result on the JSON-decoded state, input untouched."""
    before = copy.deepcopy(state)
    step = a.apply(state, event, partition, now)
    assert state == before, "apply mutated the state it was given"
    assert json_round_trip(step.state) == step.state, "state does not survive the JSON changelog"
    decoded = a.apply(json_round_trip(state), event, partition, now)
    assert comparable(decoded) == comparable(step), "a state read back from the changelog behaves differently"
    return step


def run(
    a: ConversationAssembler, events: list[Event], now: float = NOW, state: State | None = None
) -> tuple[State | None, list[Step]]:
    steps = []
    for e in events:
        step = apply_checked(a, state, e, now)
        steps.append(step)
        state = step.state
    return state, steps


def closed_of(steps: list[Step]) -> ClosedConversation:
    closed = [s.closed for s in steps if s.closed is not None]
    assert len(closed) == 1, f"expected one close, got {len(closed)}"
    return closed[0]


# --- ordering, duplicates, conflicts ------------------------------------------------------


def test_out_of_order_turns_are_closed_in_index_order() -> None:
    a = assembler()
    state, steps = run(a, [turn(2), turn(0), turn(3), turn(1), end(at=T0 + 100)])
    assert [s.outcome for s in steps] == ["accepted"] * 4 + ["closed"]
    closed = closed_of(steps)
    assert [t.index for t in closed.turns] == [0, 1, 2, 3]
    assert [t.text for t in closed.turns] == [f"message {i}" for i in range(4)]
    assert [t.timestamp for t in closed.turns] == [T0 + 10 * i for i in range(4)]
    assert closed.missing_turn_indices == ()
    assert closed.to_conversation().turns[0].role == "user"


def test_exact_duplicate_is_dropped_and_leaves_the_state_unchanged() -> None:
    a = assembler()
    state, _ = run(a, [turn(0), turn(1)], now=NOW)
    step = apply_checked(a, state, turn(1), NOW + 5)
    assert step.outcome == "duplicate"
    assert step.state == state and step.dead_letter is None and step.closed is None


def test_same_index_with_other_text_or_role_is_a_conflict_dead_letter() -> None:
    a = assembler()
    state, _ = run(a, [turn(0), turn(1)])
    for conflicting in (turn(1, text="something else"), turn(1, role="user")):
        step = apply_checked(a, state, conflicting, NOW)
        assert step.outcome == "dead_letter"
        assert step.dead_letter is not None and step.dead_letter[0] == "duplicate_turn_index"
        assert "turn 1" in step.dead_letter[1]
        assert step.state == state  # the first version of the turn is kept
    closed = closed_of(run(a, [end()], state=state)[1])
    assert [t.text for t in closed.turns] == ["message 0", "message 1"]


def test_missing_indices_are_reported() -> None:
    closed = closed_of(run(assembler(), [turn(0), turn(3), turn(5), end()])[1])
    assert [t.index for t in closed.turns] == [0, 3, 5]
    assert closed.missing_turn_indices == (1, 2, 4)


# --- closing ---------------------------------------------------------------------------


def test_end_closes_with_times_and_merged_attributes() -> None:
    a = assembler()
    events = [
        turn(1, at=T0 + 20, product="chat", model_version="v1", locale="en"),
        turn(0, at=T0 + 10, product="chat"),
        turn(2, at=T0 + 30, model_version="v2"),
        end(at=T0 + 50, product="chat-pro"),
    ]
    state, steps = run(a, events, now=NOW)
    closed = closed_of(steps)
    assert steps[-1].outcome == "closed"
    assert closed.conversation_id == CID
    assert closed.close_cause == "end"
    assert closed.closed_at == NOW
    assert closed.first_event_at == T0 + 10  # the earliest event time, though it arrived second
    assert closed.last_event_at == T0 + 50  # the end event's time
    assert closed.attributes == {"product": "chat-pro", "model_version": "v2", "locale": "en"}
    assert is_closed(state) and state["close_cause"] == "end"
    assert ClosedConversation.from_json(closed.to_json()) == closed


def test_max_turns_closes_at_the_cap() -> None:
    a = assembler(max_turns=3)
    state, steps = run(a, [turn(0), turn(2), turn(1)])
    assert [s.outcome for s in steps] == ["accepted", "accepted", "closed"]
    closed = closed_of(steps)
    assert closed.close_cause == "max_turns"
    assert [t.index for t in closed.turns] == [0, 1, 2]
    step = apply_checked(a, state, turn(3), NOW)
    assert step.dead_letter is not None and step.dead_letter[0] == "conversation_closed"


def test_a_turn_index_above_the_bound_is_dead_lettered_without_building_its_gap() -> None:
    """Issue 54: one turn with turn_index 2**31 - 1 (a 148-byte event the contract accepts) made the close build
    set(range(2**31)), a MemoryError that crash-looped the worker."""
    a = assembler()
    bound = a.settings.max_turn_index
    for state in (None, run(a, [turn(0)])[0], run(a, [turn(0), end()])[0]):
        step = apply_checked(a, state, turn(2**31 - 1), NOW)
        assert step.outcome == "dead_letter" and step.dead_letter is not None
        assert step.dead_letter[0] == "turn_index_too_large" and step.state is state
    _, steps = run(a, [turn(0), turn(bound), end()])
    closed = closed_of(steps)
    assert [t.index for t in closed.turns] == [0, bound]
    assert closed.missing_turn_indices == tuple(range(1, bound))


def test_missing_indices_are_the_gaps_below_the_highest() -> None:
    _, steps = run(assembler(), [turn(5), turn(1), turn(2), turn(9), end()])
    assert closed_of(steps).missing_turn_indices == (0, 3, 4, 6, 7, 8)


def test_a_conversation_closes_when_its_texts_reach_max_conversation_bytes() -> None:
    """Issue 54: forty valid 32 KB turns made a 1.2 MB state that the changelog refused (MessageSizeTooLargeError),
    stopping the partition. Texts count as they are encoded: a control character takes six bytes."""
    settings = AssemblySettings(idle_timeout_s=IDLE_S, closed_retention_s=RETENTION_S, max_conversation_bytes=30_000)
    a = ConversationAssembler(settings)
    heavy = "\x01" * 2_000  # 2,000 characters, 12,002 bytes in JSON
    state, steps = run(a, [turn(0, heavy), turn(1, heavy), turn(2, heavy), turn(3, "after the close")])
    assert [s.outcome for s in steps] == ["accepted", "accepted", "closed", "dead_letter"]
    closed = closed_of(steps)
    assert (closed.close_cause, [t.index for t in closed.turns]) == ("max_bytes", [0, 1, 2])
    assert steps[-1].dead_letter is not None and steps[-1].dead_letter[0] == "conversation_closed"
    assert len(closed.to_json()) < 30_000 + 13_000  # the bound plus the turn that crossed it, and the framing


def test_a_state_from_before_the_byte_count_is_counted_when_it_next_changes() -> None:
    a = ConversationAssembler(AssemblySettings(max_conversation_bytes=20_000))
    state, _ = run(a, [turn(0, "x" * 12_000)])
    assert state is not None
    old = {k: v for k, v in state.items() if k != "bytes"}  # as the worker wrote it before the bound
    step = apply_checked(a, old, turn(1, "y" * 12_000), NOW)
    assert step.outcome == "closed" and step.closed is not None and step.closed.close_cause == "max_bytes"


def test_after_close_redelivery_is_a_duplicate_and_a_new_turn_is_dead_lettered() -> None:
    a = assembler()
    state, _ = run(a, [turn(0), turn(1), end()])
    for redelivered in (turn(0), turn(1)):
        step = apply_checked(a, state, redelivered, NOW + 10)
        assert (step.outcome, step.dead_letter, step.closed) == ("duplicate", None, None)
        assert step.state == state
    for late in (turn(2), turn(1, text="edited")):
        step = apply_checked(a, state, late, NOW + 10)
        assert step.outcome == "dead_letter" and step.closed is None
        assert step.dead_letter is not None and step.dead_letter[0] == "conversation_closed"
        assert step.state == state
    again = apply_checked(a, state, end(), NOW + 10)  # a redelivered end does not close twice
    assert again.closed is None and again.state == state


# --- timers: idle timeout and retention ----------------------------------------------------


def test_due_gives_idle_timeout_after_idle_time_since_last_seen() -> None:
    a = assembler()
    state, _ = run(a, [turn(0)], now=NOW)
    state, _ = run(a, [turn(1)], now=NOW + 100, state=state)  # last_seen moves with processing time
    assert a.due(state, NOW + 100 + IDLE_S - 1) is None
    assert a.due(state, NOW + 100 + IDLE_S) == "idle_timeout"
    # Event time plays no part: these turns are stamped in 2024, yet nothing is due "now".
    assert a.due(state, NOW + 100) is None


def test_idle_timeout_end_closes_when_due_and_is_ignored_after_a_new_turn() -> None:
    a = assembler()
    state, _ = run(a, [turn(0), turn(1)], now=NOW)
    decided = NOW + IDLE_S  # the worker's timer sees the conversation idle and publishes an end
    assert a.due(state, decided) == "idle_timeout"
    # ... but a turn arrives before that end event is consumed
    state, _ = run(a, [turn(2)], now=decided + 1, state=state)
    step = apply_checked(a, state, end(at=decided, cause="idle_timeout"), decided + 2)
    assert (step.outcome, step.closed, step.state) == ("ignored", None, state)
    # later, really idle: the next worker end closes it
    later = decided + 1 + IDLE_S
    step = apply_checked(a, state, end(at=later, cause="idle_timeout"), later)
    assert step.outcome == "closed" and step.closed is not None
    assert step.closed.close_cause == "idle_timeout" and step.closed.closed_at == later
    assert [t.index for t in step.closed.turns] == [0, 1, 2]


def test_a_capacity_end_closes_a_conversation_that_is_not_idle() -> None:
    a = ConversationAssembler(AssemblySettings(idle_timeout_s=IDLE_S, closed_retention_s=RETENTION_S, max_open_conversations=2))
    state, _ = run(a, [turn(0), turn(1)], now=NOW)
    step = apply_checked(a, state, end(at=NOW + 5, cause="capacity"), NOW + 5)  # not idle yet: closed all the same
    assert step.outcome == "closed" and step.closed is not None and step.closed.close_cause == "capacity"
    assert [t.index for t in step.closed.turns] == [0, 1]
    again = apply_checked(a, step.state, end(at=NOW + 6, cause="capacity"), NOW + 6)
    assert (again.outcome, again.closed) == ("ignored", None)  # a second capacity end finds it closed
    forgotten = apply_checked(a, None, end(at=NOW, cause="capacity"), NOW)
    assert (forgotten.outcome, forgotten.dead_letter) == ("ignored", None)


def test_idle_timeout_close_keeps_event_time_in_last_event_at() -> None:
    a = assembler()
    state, _ = run(a, [turn(0, at=T0), turn(1, at=T0 + 10)], now=NOW)
    worker_now = NOW + IDLE_S
    step = apply_checked(a, state, end(at=worker_now, cause="idle_timeout"), worker_now)  # as stream/app.py publishes it
    assert step.closed is not None
    assert step.closed.last_event_at == T0 + 10


def test_retention_forgets_a_closed_conversation_only_when_due() -> None:
    a = assembler()
    state, _ = run(a, [turn(0), end()], now=NOW)
    assert a.due(state, NOW + RETENTION_S - 1) is None
    assert a.due(state, NOW + RETENTION_S) == "retention"
    early = apply_checked(a, state, end(at=NOW, cause="retention"), NOW + RETENTION_S - 1)
    assert early.state == state and early.outcome != "expired" and early.closed is None
    step = apply_checked(a, state, end(at=NOW, cause="retention"), NOW + RETENTION_S)
    assert (step.state, step.outcome, step.closed, step.dead_letter) == (None, "expired", None, None)


def test_retention_end_for_an_open_conversation_is_ignored() -> None:
    a = assembler()
    state, _ = run(a, [turn(0)])
    step = apply_checked(a, state, end(cause="retention"), NOW + RETENTION_S * 2)
    assert (step.outcome, step.state, step.closed) == ("ignored", state, None)


def test_stale_worker_end_on_a_closed_conversation_is_ignored_not_a_duplicate() -> None:
    a = assembler()
    state, _ = run(a, [turn(0), end()], now=NOW)
    assert apply_checked(a, state, end(cause="idle_timeout"), NOW + 1).outcome == "ignored"
    assert apply_checked(a, state, end(cause="retention"), NOW + 1).outcome == "ignored"


# --- unknown conversations, feedback ------------------------------------------------------------


def test_end_for_an_unknown_conversation() -> None:
    a = assembler()
    step = apply_checked(a, None, end(), NOW)
    assert step.state is None and step.outcome == "dead_letter" and step.closed is None
    assert step.dead_letter is not None and step.dead_letter[0] == "empty_conversation"
    for cause in ("idle_timeout", "retention"):  # the worker's end for a key forgotten meanwhile
        step = apply_checked(a, None, end(cause=cause), NOW)
        assert (step.state, step.outcome, step.dead_letter, step.closed) == (None, "ignored", None, None)


def test_a_thumbs_down_while_open_is_carried_to_the_close() -> None:
    a = assembler()
    down = FeedbackEvent(CID, 0, "down", T0 + 5, "wrong answer", {"product": "chat"})
    state, _ = run(a, [turn(0)])
    step = apply_checked(a, state, down, NOW + 1)
    assert step.outcome == "accepted" and step.closed is None and step.dead_letter is None
    assert step.state is not None and step.state["negative_feedback"] is True
    again = apply_checked(a, step.state, down, NOW + 2)
    assert again.state is step.state  # a second thumbs-down changes nothing
    _, steps = run(a, [turn(1), end()], state=again.state)
    assert closed_of(steps).negative_feedback is True


def test_feedback_while_open_keeps_the_latest_rating_of_each_turn() -> None:
    a = assembler()
    up = FeedbackEvent(CID, 0, "up", T0 + 5)
    down_later = FeedbackEvent(CID, 0, "down", T0 + 9)
    up_other_turn = FeedbackEvent(CID, 1, "up", T0 + 6)
    state, _ = run(a, [turn(0)])
    for event in (up, down_later, up, up_other_turn):  # the older thumbs-up of turn 0 arrives again, late
        state = apply_checked(a, state, event, NOW + 1).state
    assert state is not None and state["feedback"] == {"0": ["down", T0 + 9], "1": ["up", T0 + 6]}
    assert apply_checked(a, state, up_other_turn, NOW + 2).state is state  # a redelivery changes nothing
    _, steps = run(a, [turn(1), end()], state=state)
    assert (closed_of(steps).feedback_ratings, closed_of(steps).negative_feedback) == (("down", "up"), True)


def test_a_thumbs_up_alone_is_carried_but_is_not_negative() -> None:
    a = assembler()
    state, _ = run(a, [turn(0)])
    state = apply_checked(a, state, FeedbackEvent(CID, 0, "up", T0 + 5), NOW + 1).state
    _, steps = run(a, [end()], state=state)
    assert (closed_of(steps).feedback_ratings, closed_of(steps).negative_feedback) == (("up",), False)


def test_feedback_before_the_first_turn_after_the_close_or_past_max_turns_leaves_the_state_untouched() -> None:
    a = assembler()
    down = FeedbackEvent(CID, 0, "down", T0 + 5, "wrong answer", {"product": "chat"})
    assert apply_checked(a, None, down, NOW).state is None  # before the first turn: nothing to note it on
    state, _ = run(a, [turn(0)])
    past = FeedbackEvent(CID, a.settings.max_turns, "down", T0 + 5)  # would let one conversation's state grow without end
    assert apply_checked(a, state, past, NOW + 1).state is state
    _, steps = run(a, [end()], state=state)
    assert (closed_of(steps).feedback_ratings, closed_of(steps).negative_feedback) == ((), False)
    closed_state, _ = run(a, [turn(0), end()])
    step = apply_checked(a, closed_state, down, NOW + 1)  # after the close: sampling has decided already
    assert step.state is closed_state and step.closed is None and step.dead_letter is None


def test_first_turn_records_its_partition() -> None:
    a = assembler()
    step = apply_checked(a, None, turn(0), NOW, partition=3)
    assert step.state is not None and step.state["partition"] == 3
    closed = apply_checked(a, step.state, end(), NOW, partition=3)
    assert closed.state is not None and closed.state["partition"] == 3  # the idle timer sends retention there


def test_conversations_do_not_share_state() -> None:
    a = assembler()
    s1, _ = run(a, [turn(0, cid="a"), turn(1, cid="a")])
    s2, steps = run(a, [turn(0, cid="b", text="other"), end(cid="b")])
    closed = closed_of(steps)
    assert closed.conversation_id == "b" and [t.text for t in closed.turns] == ["other"]
    assert not is_closed(s1) and is_closed(s2)


# --- property: arrival order and redeliveries do not matter -------------------------------------


@st.composite
def deliveries(draw: st.DrawFn) -> tuple[list[TurnEvent], list[TurnEvent]]:
    """(the conversation's turns, the order they arrive in: shuffled, with exact redeliveries mixed in)."""
    n = draw(st.integers(1, 12))
    texts = draw(st.lists(st.text(max_size=30), min_size=n, max_size=n))
    roles = draw(st.lists(st.sampled_from(ROLES), min_size=n, max_size=n))
    times = draw(st.lists(st.floats(T0, T0 + 86_400, allow_nan=False), min_size=n, max_size=n))
    turns = [TurnEvent(CID, i, roles[i], texts[i], times[i], {"k": str(i)}) for i in range(n)]
    redelivered = draw(st.lists(st.integers(0, n - 1), max_size=2 * n))
    arrival = draw(st.permutations(list(range(n)) + redelivered))
    return turns, [turns[i] for i in arrival]


@settings(max_examples=150, deadline=None)
@given(deliveries())
def test_any_arrival_order_with_redeliveries_closes_the_same_conversation(case: tuple[list[TurnEvent], list[TurnEvent]]) -> None:
    turns, arrival = case
    a = assembler(max_turns=50)
    state, steps = run(a, [*arrival, end(at=T0 + 100_000)])
    assert [s.outcome for s in steps].count("duplicate") == len(arrival) - len(turns)
    assert all(s.dead_letter is None for s in steps)
    closed = closed_of(steps)
    assert [(t.index, t.role, t.text, t.timestamp) for t in closed.turns] == [
        (t.turn_index, t.role, t.text, t.timestamp) for t in turns
    ]
    assert closed.missing_turn_indices == ()
    assert closed.first_event_at == min(t.timestamp for t in turns)
    # every redelivery after the close is still recognised
    for t in turns:
        assert apply_checked(a, state, t, NOW).outcome == "duplicate"


@pytest.mark.parametrize("record_class", [ClosedConversation, ScoreRecord])
@pytest.mark.parametrize("raw", [None, b"not json", b"[1, 2]", b'{"record_version": 999}'])
def test_records_without_a_valid_value_raise_record_error(record_class, raw) -> None:
    """A tombstone (null value), non-JSON or a foreign version is a RecordError, which the worker and sink dead-letter."""
    with pytest.raises(RecordError):
        record_class.from_json(raw)
