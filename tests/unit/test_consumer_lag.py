"""`consumer_lag` skips a partition revoked while it asks. The race is real (Faust's assignor learns a new
assignment before aiokafka's consumer thread; test_budget_pipeline's rebalance test crashed a worker on it with the
files broker), but its timing cannot be chosen, so a stand-in consumer revokes partitions here."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from aiokafka.errors import IllegalStateError
from faust.types import TP

from stream.app import consumer_lag


class RevokingConsumer:
    """aiokafka's checks: highwater asserts the partition is assigned, position raises IllegalStateError."""

    def __init__(self, highwaters: dict[TP, int], positions: dict[TP, int], revoked_before_position: set[TP]) -> None:
        self.highwaters, self.positions, self.revoked_before_position = highwaters, positions, revoked_before_position

    def highwater(self, tp: TP) -> int:
        assert tp in self.highwaters, "Partition is not assigned"
        return self.highwaters[tp]

    async def position(self, tp: TP) -> int:
        if tp in self.revoked_before_position:
            raise IllegalStateError(f"Partition {tp} is not assigned")
        return self.positions[tp]


def test_partitions_revoked_while_asking_are_skipped() -> None:
    kept, revoked, revoked_later = TP("events", 0), TP("events", 1), TP("events", 2)
    consumer = RevokingConsumer({kept: 10, revoked_later: 7}, {kept: 4, revoked_later: 7}, {revoked_later})
    lags = asyncio.run(consumer_lag(SimpleNamespace(consumer=consumer), [kept, revoked, revoked_later]))  # type: ignore[arg-type]
    assert lags == {("events", 0): 6}
