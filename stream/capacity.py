"""The open conversations of each partition, longest idle first: the assemble agent's capacity check.

A worker keeps at most ``assembly.max_open_conversations`` conversations open:
each partition at most ``ceil(max_open_conversations / kafka.partitions)``, so
the bound holds however the partitions are spread over workers. The agent
checks it as each turn opens a conversation and closes the longest idle of that
partition itself (cause ``capacity``), in the same step. A close requested
through the topic would queue behind whatever waits there: a worker catching up
on 100,000 never-ending conversations held 80,000 open with a cap of 10,000
(bench/bounded_memory.py).

The index lives in memory; the idle timer rebuilds it from the table every
tick (`rebuild`), which also covers partitions this worker was just assigned.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from itertools import islice


def per_partition_limit(max_open_conversations: int, partitions: int) -> int:
    """The open conversations one partition may hold."""
    return math.ceil(max_open_conversations / partitions)


class OpenConversationIndex:
    """Per partition: open conversation ids in the order they last received a turn."""

    def __init__(self, per_partition: int) -> None:
        if per_partition < 1:
            raise ValueError(f"per_partition must be >= 1, got {per_partition}")
        self.per_partition = per_partition
        self._order: dict[int, dict[str, None]] = {}  # dicts keep insertion order: first = longest idle

    def touch(self, partition: int, key: str) -> None:
        """``key`` received a turn now (it may be new)."""
        order = self._order.setdefault(partition, {})
        order.pop(key, None)
        order[key] = None

    def discard(self, partition: int, key: str) -> None:
        """``key`` is no longer open."""
        self._order.get(partition, {}).pop(key, None)

    def excess(self, partition: int) -> list[str]:
        """The longest idle conversations of ``partition`` beyond its limit, to close now."""
        order = self._order.get(partition, {})
        over = len(order) - self.per_partition
        return list(islice(order, over)) if over > 0 else []

    def __len__(self) -> int:
        return sum(len(order) for order in self._order.values())

    def rebuild(self, open_conversations: Iterable[tuple[int, str, float]]) -> None:
        """Replace the index with ``(partition, key, last_seen)`` of every open conversation on this worker's partitions."""
        order: dict[int, dict[str, None]] = {}
        for partition, key, _ in sorted(open_conversations, key=lambda c: (c[2], c[1])):
            order.setdefault(partition, {})[key] = None
        self._order = order
