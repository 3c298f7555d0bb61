"""One batch of events' view of the conversations table: each changed conversation written once.

The ``assemble`` agent takes events a batch at a time. Writing a conversation's state to the Faust table after
every turn costs one changelog record per turn (one produce request each on the embedded stack, whose broker needs
one record per batch); a `StateBatch` collects the batch's changes and `write_to_table` writes each changed
conversation once. Reads see the batch's own changes first. Nothing is lost by waiting: the batch's events are marked
finished (their offsets may be committed) only after the write, so a crash before it delivers the whole batch again.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator, Mapping, MutableMapping
from contextlib import contextmanager

from faust import streams as faust_streams
from faust.types import EventT

from stream.assembly import State


@contextmanager
def processing(event: EventT) -> Iterator[None]:
    """Faust writes a table's changelog to the partition of the event being processed: make that ``event``."""
    token = faust_streams._current_event.set(weakref.ref(event))
    try:
        yield
    finally:
        faust_streams._current_event.reset(token)


class StateBatch:
    """The conversations table as seen by one batch of events (``None`` = no state, as the table's default)."""

    def __init__(self, table: Mapping[str, State | None]) -> None:
        self._table = table
        self._changes: dict[str, tuple[State | None, int]] = {}  # key -> (new state or None, the partition it lives in)

    def get(self, key: str) -> State | None:
        """The conversation's state, with this batch's changes."""
        if key in self._changes:
            return self._changes[key][0]
        return self._table.get(key)

    def set(self, key: str, state: State | None, partition: int) -> None:
        """Change the state (``None`` deletes it); ``partition`` is the one the state lives in."""
        self._changes[key] = (state, partition)

    def __len__(self) -> int:
        return len(self._changes)

    def changes(self) -> list[tuple[str, State | None, int]]:
        """Each changed conversation once, in the order first changed: key, new state (``None``: delete), partition."""
        return [(key, state, partition) for key, (state, partition) in self._changes.items()]


def write_to_table(table: MutableMapping[str, State | None], batch: StateBatch, event_of_partition: Mapping[int, EventT]) -> int:
    """Write every conversation ``batch`` changed to the Faust ``table`` once, each while an event of its partition is
    Faust's current event (so its changelog record goes to that partition); how many were changed."""
    changes = batch.changes()
    for key, state, partition in changes:
        with processing(event_of_partition[partition]):
            if state is not None:
                table[key] = state
            elif table.get(key) is not None:
                del table[key]
    return len(changes)
