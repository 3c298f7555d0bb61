"""`StateBatch`: a batch's reads see its own changes; `write_to_table` writes each changed conversation to the table
once, while an event of its partition is Faust's current event (where Faust sends the changelog record)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from faust.streams import current_event

from stream.state_batch import StateBatch, write_to_table


class RecordingTable(dict):
    """A dict that notes, for every write, the partition of Faust's current event (as a Faust table would use)."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.writes: list[tuple[str, str, int]] = []

    def _partition(self) -> int:
        event = current_event()
        assert event is not None, "a table write outside of an event"
        return event.message.partition

    def __setitem__(self, key: str, value: Any) -> None:
        self.writes.append(("set", key, self._partition()))
        super().__setitem__(key, value)

    def __delitem__(self, key: str) -> None:
        self.writes.append(("del", key, self._partition()))
        super().__delitem__(key)


class _Event:
    """What a flush reads of a Faust event (a class: Faust keeps a weak reference to the current event)."""

    def __init__(self, partition: int) -> None:
        self.message = SimpleNamespace(partition=partition)


def _event(partition: int) -> Any:
    return _Event(partition)


def test_reads_see_the_batch_and_each_key_is_written_once_with_its_partitions_event() -> None:
    table = RecordingTable({"a": {"turns": 1}, "gone": {"turns": 3}})
    batch = StateBatch(table)
    batch.set("a", {"turns": 2}, 0)
    batch.set("a", {"turns": 3}, 0)
    batch.set("b", {"turns": 1}, 1)
    batch.set("gone", None, 1)
    batch.set("never", None, 0)  # deleting what the table does not have writes nothing
    assert batch.get("a") == {"turns": 3} and batch.get("gone") is None and batch.get("c") is None
    assert batch.changes() == [("a", {"turns": 3}, 0), ("b", {"turns": 1}, 1), ("gone", None, 1), ("never", None, 0)]
    assert table.writes == [] and table["a"] == {"turns": 1}
    assert write_to_table(table, batch, {0: _event(0), 1: _event(1)}) == 4
    assert table.writes == [("set", "a", 0), ("set", "b", 1), ("del", "gone", 1)]
    assert dict(table) == {"a": {"turns": 3}, "b": {"turns": 1}}
    assert current_event() is None  # the current event is restored after the write
