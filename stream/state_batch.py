"""One batch of events' view of the conversations table: each changed conversation written once.

The ``assemble`` agent takes events a batch at a time. Writing a conversation's state to the Faust table after
every turn costs one changelog record per turn (one produce request each on the embedded stack, whose broker needs
one record per batch); a `StateBatch` collects the batch's changes and `flush` writes each changed conversation
once. Reads see the batch's own changes first. Nothing is lost by waiting: the batch's events are marked finished
(their offsets may be committed) only after the flush, so a crash before it delivers the whole batch again.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator, MutableMapping
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

    def __init__(self, table: MutableMapping[str, State | None]) -> None:
        self._table = table
        self._changes: dict[str, tuple[State | None, EventT]] = {}  # key -> (new state or None, an event of its partition)

    def get(self, key: str) -> State | None:
        """The conversation's state, with this batch's changes."""
        if key in self._changes:
            return self._changes[key][0]
        return self._table.get(key)

    def set(self, key: str, state: State | None, event: EventT) -> None:
        """Change the state (``None`` deletes it); ``event`` is of the partition the state lives in."""
        self._changes[key] = (state, event)

    def __len__(self) -> int:
        return len(self._changes)

    def flush(self) -> int:
        """Write every changed conversation to the table once; how many were written."""
        written = len(self._changes)
        for key, (state, event) in self._changes.items():
            with processing(event):
                if state is not None:
                    self._table[key] = state
                elif self._table.get(key) is not None:
                    del self._table[key]
        self._changes.clear()
        return written
