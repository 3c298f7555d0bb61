"""`WritePace`: when the sink writes what it holds (the sink's loop on the real broker and chDB engine is in
tests/integration/test_pipeline.py)."""

from __future__ import annotations

import pytest

from stream.sink import WritePace


def test_unpaced_a_caught_up_sink_writes_at_once_and_behind_it_waits_for_the_batch_or_the_deadline() -> None:
    pace = WritePace(batch_size=100, flush_interval_s=1.0)
    pace.wrote(ended=10.0, took_s=0.3)
    assert pace.due(10.0, held_since=10.0, rows=1, caught_up=True)
    assert not pace.due(10.5, held_since=10.0, rows=99, caught_up=False)
    assert pace.due(10.5, held_since=10.0, rows=100, caught_up=False)
    assert pace.due(11.0, held_since=10.0, rows=1, caught_up=False)


def test_a_share_below_one_spaces_caught_up_writes_by_the_last_writes_duration() -> None:
    pace = WritePace(batch_size=100, flush_interval_s=1.0, max_write_share=0.5)
    assert pace.due(0.0, held_since=0.0, rows=1, caught_up=True)  # no write yet: nothing to pace
    pace.wrote(ended=10.0, took_s=0.2)  # half its time writing: the next write 0.2 s after this one ended
    assert not pace.due(10.1, held_since=10.0, rows=5, caught_up=True)
    assert pace.poll_timeout(10.1, held_since=10.0, caught_up=True) == pytest.approx(0.1)
    assert pace.due(10.2, held_since=10.0, rows=5, caught_up=True)
    # A full batch or the flush deadline still write at once; behind a backlog the pace does not shorten the poll.
    assert pace.due(10.1, held_since=10.0, rows=100, caught_up=True)
    pace.wrote(ended=20.0, took_s=2.0)
    assert not pace.due(20.5, held_since=20.0, rows=5, caught_up=True)
    assert pace.due(21.0, held_since=20.0, rows=5, caught_up=True)  # the flush interval bounds the wait
    assert pace.poll_timeout(20.5, held_since=20.0, caught_up=True) == pytest.approx(0.5)
    assert pace.poll_timeout(20.5, held_since=20.0, caught_up=False) == pytest.approx(0.5)
    assert pace.poll_timeout(20.5, held_since=None, caught_up=True) == 1.0


def test_the_share_must_be_a_fraction() -> None:
    from pydantic import ValidationError

    from stream.settings import StoreSettings

    for bad in (0, 1.5, -0.1):
        with pytest.raises(ValidationError, match="max_write_share"):
            StoreSettings(max_write_share=bad)
