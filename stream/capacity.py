"""The conversations of each partition in the order they last changed: the assemble agent's capacity checks.

A worker keeps at most ``assembly.max_open_conversations`` conversations open
and remembers at most ``assembly.max_closed_conversations`` closed ones (turn
fingerprints, to recognise redeliveries): each partition at most its share
(``ceil(limit / kafka.partitions)``), so the bounds hold however the partitions
are spread over workers. The agent checks them in the step that opens or closes
a conversation: past the open share it closes the partition's longest idle
(cause ``capacity``), past the closed share it forgets the partition's oldest
closed one before ``closed_retention_s``. A close requested through the topic
would queue behind whatever waits there: a worker catching up on 100,000
never-ending conversations held 80,862 open with a cap of 10,000
(bench/bounded_memory.py).

The indexes live in memory. The idle timer compares them with the table every
tick and rebuilds one whose counts per partition differ (`sync`: a partition
just assigned or revoked): rebuilding 250,000 conversations (both caps full
at their defaults) takes 0.34 s here, comparing their counts 0.014 s, and the
timer ticks every ``assembly.idle_check_interval_s``.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from itertools import islice


def per_partition_limit(limit: int, partitions: int) -> int:
    """One partition's share of a worker's limit."""
    return math.ceil(limit / partitions)


class ConversationRecency:
    """Per partition: conversation ids, least recently changed first, and each partition's limit."""

    def __init__(self, per_partition: int) -> None:
        if per_partition < 1:
            raise ValueError(f"per_partition must be >= 1, got {per_partition}")
        self.per_partition = per_partition
        self._order: dict[int, dict[str, None]] = {}  # dicts keep insertion order: first = least recently changed

    def touch(self, partition: int, key: str) -> None:
        """``key`` changed now (it may be new)."""
        order = self._order.setdefault(partition, {})
        order.pop(key, None)
        order[key] = None

    def discard(self, partition: int, key: str) -> None:
        """``key`` left the index."""
        self._order.get(partition, {}).pop(key, None)

    def excess(self, partition: int) -> list[str]:
        """The least recently changed conversations of ``partition`` beyond its limit."""
        order = self._order.get(partition, {})
        over = len(order) - self.per_partition
        return list(islice(order, over)) if over > 0 else []

    def __len__(self) -> int:
        return sum(len(order) for order in self._order.values())

    def rebuild(self, conversations: Iterable[tuple[int, str, float]]) -> None:
        """Replace the index with ``(partition, key, last changed)`` of every conversation it holds on this worker."""
        order: dict[int, dict[str, None]] = {}
        for partition, key, _ in sorted(conversations, key=lambda c: (c[2], c[1])):
            order.setdefault(partition, {})[key] = None
        self._order = order

    def sync(self, conversations: Sequence[tuple[int, str, float]]) -> bool:
        """`rebuild` from ``conversations`` if the index holds other numbers per partition; True if it did."""
        counts = Counter(partition for partition, _, _ in conversations)
        if counts == Counter({partition: len(order) for partition, order in self._order.items() if order}):
            return False
        self.rebuild(conversations)
        return True
