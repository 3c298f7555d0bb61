"""The recency index behind the per-partition caps of open and closed conversations (stream/capacity.py)."""

from __future__ import annotations

import pytest

from stream.capacity import ConversationRecency, per_partition_limit


def test_the_limit_is_each_partitions_share_rounded_up() -> None:
    assert per_partition_limit(50_000, 4) == 12_500
    assert per_partition_limit(3, 4) == 1
    assert per_partition_limit(10, 3) == 4


def test_past_the_limit_the_longest_idle_of_that_partition_are_the_excess() -> None:
    index = ConversationRecency(per_partition=2)
    for key in ("a", "b", "c"):
        index.touch(0, key)
    index.touch(1, "x")
    assert index.excess(0) == ["a"]
    assert index.excess(1) == []  # other partitions have their own share
    index.touch(0, "a")  # a turn makes it the most recently active
    assert index.excess(0) == ["b"]
    index.discard(0, "b")
    assert index.excess(0) == [] and len(index) == 3


def test_a_rebuild_orders_by_last_seen_then_id_and_drops_what_is_gone() -> None:
    index = ConversationRecency(per_partition=1)
    index.touch(3, "revoked")  # a partition this worker no longer owns
    index.rebuild([(0, "late", 9.0), (0, "w", 1.0), (0, "v", 1.0), (2, "y", 2.0)])
    assert index.excess(0) == ["v", "w"]  # ties by id: the same pick every time
    assert index.excess(3) == [] and len(index) == 4


def test_a_limit_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="per_partition must be >= 1"):
        ConversationRecency(0)


def test_sync_rebuilds_only_when_a_partitions_count_differs() -> None:
    index = ConversationRecency(per_partition=5)
    index.touch(0, "b")
    index.touch(0, "a")  # the agent's order: a changed last
    assert index.sync([(0, "a", 1.0), (0, "b", 2.0)]) is False  # same counts: the agent's order stands
    assert index.excess(0) == [] and list(index._order[0]) == ["b", "a"]
    assert index.sync([(0, "a", 1.0), (0, "b", 2.0), (1, "x", 3.0)]) is True  # partition 1 just assigned
    assert list(index._order[0]) == ["a", "b"] and len(index) == 3
    assert index.sync([(1, "x", 3.0)]) is True and len(index) == 1  # partition 0 revoked
