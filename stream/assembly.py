"""Conversation assembly: validated events in, closed conversations out.

`ConversationAssembler.apply` is a pure function of (state, event, now) so the
Faust agent that calls it stays a thin loop and the rules are testable on
their own. The state of one conversation is plain JSON-able data (it lives in
a Faust table whose changelog makes it survive worker restarts).

Rules (documented in the README's "Conversation assembly" section):

* Turns are kept by index and ordered by index when the conversation closes,
  whatever order they arrived in. Indices that never arrived are reported as
  ``missing_turn_indices``.
* A turn whose index was already seen is a *duplicate* when role and text are
  the same (a redelivery: dropped, counted) and a *conflict* otherwise (dead
  letter ``duplicate_turn_index``).
* A conversation closes on an ``end`` event, after ``idle_timeout_s`` without
  events (processing time, not event time: the worker publishes an ``end``
  event with cause ``idle_timeout``), when it reaches ``max_turns`` turns
  (cause ``max_turns``), or when its turns' texts reach ``max_conversation_bytes``
  (JSON-encoded; cause ``max_bytes``): what a conversation holds is bounded,
  so its state and records fit in a Kafka record whatever producers send.
* A turn whose index is above ``max_turn_index`` is dead-lettered
  (``turn_index_too_large``): the indices below the highest that never came
  are listed, so the highest bounds that list.
* A worker keeps at most ``max_open_conversations`` open (each partition
  its share, stream/capacity.py): a turn that opens one more makes the agent
  close the partition's longest idle at once (an ``end`` with cause
  ``capacity``), to be scored with the turns it has, so memory stays bounded
  whatever producers send and however much waits in the topic.
* A closed conversation is remembered (turn fingerprints only) for
  ``closed_retention_s``: redelivered turns are recognised as duplicates,
  genuinely new turns are dead-lettered as ``conversation_closed``. After the
  retention the worker publishes an ``end`` event with cause ``retention``
  that forgets it.
* Attributes merge by event time: a later event's values override earlier
  ones; an earlier event that arrives late only fills keys not yet set.
* An ``end`` for a conversation with no turns is dead-lettered
  (``empty_conversation``).
* Feedback on an open conversation is noted in its state: the latest rating
  of each rated turn (by event time), carried on the `ClosedConversation`
  (``feedback_ratings``) so the worker can count how its label agrees with
  the users (`stream.metrics`), and whether any rating was ``down``
  (``negative_feedback``), so sampling always judges it. Feedback on a closed
  conversation (it has been sampled already: late feedback cannot change the
  decision) and feedback before the first turn leave the state as it is. The
  sink stores every feedback event in the ``feedback`` table either way.
* A ``rating`` (a score for the whole conversation) leaves the state as it
  is, whenever it comes: the sink stores it in ``conversation_ratings``, where
  ``convowatch calibrate adapt --from-store`` reads it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Literal, TypeGuard

import msgspec

from stream.contract import NEGATIVE_RATINGS, EndEvent, Event, FeedbackEvent, RatingEvent, TurnEvent
from stream.records import ClosedConversation, TurnRecord
from stream.settings import AssemblySettings

State = dict[str, Any]
Outcome = Literal["accepted", "duplicate", "closed", "dead_letter", "ignored", "expired"]


WORKER_CAUSES = ("idle_timeout", "retention", "capacity")  # end causes only the worker publishes


@dataclass(frozen=True)
class Step:
    """What one event did: the new state (None = forget the key), and what to emit."""

    state: State | None
    outcome: Outcome
    closed: ClosedConversation | None = None
    dead_letter: tuple[str, str] | None = None  # (reason, detail)


def _fingerprint(role: str, text: str) -> str:
    return hashlib.blake2b(f"{role}\x00{text}".encode(), digest_size=8).hexdigest()


def _text_bytes(turns: dict[str, list[Any]]) -> int:
    """What the texts of ``turns`` take in a JSON record (escapes included)."""
    return sum(len(msgspec.json.encode(turn[1])) for turn in turns.values())


def _missing(indices: list[int]) -> tuple[int, ...]:
    """The indices below the highest of sorted ``indices`` that are not in it."""
    gaps: list[int] = []
    expected = 0
    for i in indices:
        gaps.extend(range(expected, i))
        expected = i + 1
    return tuple(gaps)


def _merge(current: dict[str, str], incoming: dict[str, str], newer: bool) -> dict[str, str]:
    """Attributes of a later event (by event time) override earlier ones; a late-arriving earlier event only fills gaps."""
    return {**current, **incoming} if newer else {**incoming, **current}


def is_closed(state: State | None) -> TypeGuard[State]:
    return state is not None and state.get("closed_at") is not None


class ConversationAssembler:
    """Applies events to per-conversation state according to the module's rules."""

    def __init__(self, settings: AssemblySettings) -> None:
        self.settings = settings

    def apply(self, state: State | None, event: Event, partition: int, now: float) -> Step:
        if isinstance(event, TurnEvent):
            return self._turn(state, event, partition, now)
        if isinstance(event, EndEvent):
            return self._end(state, event, now)
        if isinstance(event, FeedbackEvent):
            return self._feedback(state, event)
        if isinstance(event, RatingEvent):
            return Step(state, "accepted")
        raise TypeError(f"not an event: {event!r}")

    def due(self, state: State, now: float) -> Literal["idle_timeout", "retention"] | None:
        """Which worker-published ``end`` cause is due for this state, if any."""
        if is_closed(state):
            return "retention" if now - state["closed_at"] >= self.settings.closed_retention_s else None
        return "idle_timeout" if now - state["last_seen"] >= self.settings.idle_timeout_s else None

    # -- turn ---------------------------------------------------------------

    def _turn(self, state: State | None, event: TurnEvent, partition: int, now: float) -> Step:
        key = str(event.turn_index)
        fingerprint = _fingerprint(event.role, event.text)
        if is_closed(state):
            if state["seen"].get(key) == fingerprint:
                return Step(state, "duplicate")
            if event.turn_index > self.settings.max_turn_index:
                return self._index_too_large(state, event)
            return Step(
                state,
                "dead_letter",
                dead_letter=(
                    "conversation_closed",
                    f"turn {event.turn_index} arrived after the conversation closed ({state['close_cause']})",
                ),
            )
        if event.turn_index > self.settings.max_turn_index:
            return self._index_too_large(state, event)
        if state is None:
            state = {
                "partition": partition,
                "turns": {},
                "attributes": {},
                "first_event_at": event.timestamp,
                "last_event_at": event.timestamp,
                "last_seen": now,
                "closed_at": None,
            }
        existing = state["turns"].get(key)
        if existing is not None:
            if existing[0] == event.role and existing[1] == event.text:
                return Step(state, "duplicate")
            return Step(
                state,
                "dead_letter",
                dead_letter=("duplicate_turn_index", f"turn {event.turn_index} already holds a different {existing[0]} message"),
            )
        text_bytes = state["bytes"] if "bytes" in state else _text_bytes(state["turns"])  # states written before 2026-12
        state = {
            **state,
            "turns": {**state["turns"], key: [event.role, event.text, event.timestamp]},
            "bytes": text_bytes + len(msgspec.json.encode(event.text)),
            "attributes": _merge(state["attributes"], event.attributes, newer=event.timestamp >= state["last_event_at"]),
            "first_event_at": min(state["first_event_at"], event.timestamp),
            "last_event_at": max(state["last_event_at"], event.timestamp),
            "last_seen": now,
        }
        if len(state["turns"]) >= self.settings.max_turns:
            return self._close(event.conversation_id, state, "max_turns", now)
        if state["bytes"] >= self.settings.max_conversation_bytes:
            return self._close(event.conversation_id, state, "max_bytes", now)
        return Step(state, "accepted")

    def _index_too_large(self, state: State | None, event: TurnEvent) -> Step:
        detail = f"turn_index {event.turn_index} is above assembly.max_turn_index {self.settings.max_turn_index}"
        return Step(state, "dead_letter", dead_letter=("turn_index_too_large", detail))

    # -- feedback -----------------------------------------------------------

    def _feedback(self, state: State | None, event: FeedbackEvent) -> Step:
        if state is None or is_closed(state) or event.turn_index >= self.settings.max_turns:  # bounded like the turns
            return Step(state, "accepted")
        ratings = state.get("feedback", {})
        key = str(event.turn_index)
        latest = ratings[key] if key in ratings and ratings[key][1] > event.timestamp else [event.rating, event.timestamp]
        negative = bool(state.get("negative_feedback", False)) or event.rating in NEGATIVE_RATINGS
        new = {**state, "feedback": {**ratings, key: latest}, "negative_feedback": negative}
        return Step(state if new == state else new, "accepted")  # a redelivery changes nothing

    # -- end ----------------------------------------------------------------

    def _end(self, state: State | None, event: EndEvent, now: float) -> Step:
        if state is None:
            if event.cause in WORKER_CAUSES:
                return Step(None, "ignored")  # a worker-published end for a key already forgotten
            return Step(None, "dead_letter", dead_letter=("empty_conversation", "end event for a conversation with no turns"))
        if is_closed(state):
            if event.cause == "retention" and self.due(state, now) == "retention":
                return Step(None, "expired")
            # a producer's end seen again is a redelivery; a worker-published one that lost a race is just stale
            return Step(state, "duplicate" if event.cause == "end" else "ignored")
        if event.cause == "retention":
            return Step(state, "ignored")
        if event.cause == "idle_timeout" and self.due(state, now) != "idle_timeout":
            return Step(state, "ignored")  # a turn arrived after the worker decided to close
        if event.cause == "end":  # a worker-published end carries processing time, not event time
            state = {
                **state,
                "attributes": _merge(state["attributes"], event.attributes, newer=event.timestamp >= state["last_event_at"]),
                "last_event_at": max(state["last_event_at"], event.timestamp),
            }
        return self._close(event.conversation_id, state, event.cause, now)  # end, idle_timeout or capacity

    # -- close --------------------------------------------------------------

    def _close(self, conversation_id: str, state: State, cause: str, now: float) -> Step:
        indices = sorted(int(i) for i in state["turns"])
        turns = tuple(
            TurnRecord(
                index=i, role=state["turns"][str(i)][0], text=state["turns"][str(i)][1], timestamp=state["turns"][str(i)][2]
            )
            for i in indices
        )
        missing = _missing(indices)
        ratings = state.get("feedback", {})  # turn index -> [latest rating, its time]
        closed = ClosedConversation(
            conversation_id=conversation_id,
            turns=turns,
            attributes=dict(state["attributes"]),
            close_cause=cause,  # type: ignore[arg-type]
            closed_at=now,
            first_event_at=state["first_event_at"],
            last_event_at=state["last_event_at"],
            missing_turn_indices=missing,
            negative_feedback=bool(state.get("negative_feedback", False)),
            feedback_ratings=tuple(ratings[k][0] for k in sorted(ratings, key=int)),
        )
        tombstone = {
            "partition": state["partition"],
            "closed_at": now,
            "close_cause": cause,
            "seen": {k: _fingerprint(v[0], v[1]) for k, v in state["turns"].items()},
            "last_seen": now,
        }
        return Step(tombstone, "closed", closed=closed)
