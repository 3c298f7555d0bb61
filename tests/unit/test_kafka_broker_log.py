"""The files broker's storage: PartitionLog and BrokerStorage on real files, with batches built by kafka-python."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from kafka.record.default_records import DefaultRecordBatchBuilder
from kafka.record.memory_records import MemoryRecords

from deploy.local.kafka_broker.partition_log import CorruptBatchError, PartitionLog
from deploy.local.kafka_broker.storage import BrokerStorage, CommittedOffset, TopicError


def batch(values: list[bytes], *, timestamp: int = 1_000, producer: int = -1, sequence: int = -1) -> bytes:
    """One magic-2 record batch as a producer sends it (base offset 0)."""
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=0,
        is_transactional=False,
        producer_id=producer,
        producer_epoch=0 if producer >= 0 else -1,
        base_sequence=sequence,
        batch_size=1 << 20,
    )
    for i, value in enumerate(values):
        builder.append(i, timestamp=timestamp + i, key=None, value=value, headers=[])
    return bytes(builder.build())


def records(data: bytes) -> list[tuple[int, bytes]]:
    """(offset, value) of every record in fetched bytes."""
    out = []
    memory = MemoryRecords(data)
    while (b := memory.next_batch()) is not None:
        out.extend((r.offset, r.value) for r in b)
    return out


def test_appends_get_consecutive_offsets_and_read_returns_whole_batches(tmp_path: Path) -> None:
    log = PartitionLog(tmp_path / "p.log", fsync=False)
    assert log.append(batch([b"a", b"b", b"c"])) == 0
    assert log.append(batch([b"d"]) + batch([b"e", b"f"])) == 3
    assert log.next_offset == 6
    assert records(log.read(0, 1 << 20)) == list(enumerate([b"a", b"b", b"c", b"d", b"e", b"f"]))
    # From the middle of a batch: the whole batch (the client skips what it did not ask for).
    assert [o for o, _ in records(log.read(5, 1 << 20))] == [4, 5]
    # max_bytes cuts between batches but never returns less than the first one.
    assert [o for o, _ in records(log.read(0, 1))] == [0, 1, 2]
    assert log.read(6, 1 << 20) == b""


def test_a_reopened_log_has_every_batch_and_cuts_a_torn_write(tmp_path: Path) -> None:
    path = tmp_path / "p.log"
    log = PartitionLog(path, fsync=True)
    log.append(batch([b"a", b"b"]))
    log.append(batch([b"c"]))
    log.close()
    with open(path, "ab") as f:  # a crash in the middle of the next write
        f.write(batch([b"torn"])[:30])
    reopened = PartitionLog(path, fsync=False)
    assert reopened.next_offset == 3
    assert os.path.getsize(path) == len(batch([b"a", b"b"])) + len(batch([b"c"]))
    assert reopened.append(batch([b"d"])) == 3
    assert records(reopened.read(0, 1 << 20)) == list(enumerate([b"a", b"b", b"c", b"d"]))


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda b: b[:-1] + bytes([b[-1] ^ 1]), id="crc"),
        pytest.param(lambda b: b[:16] + b"\x01" + b[17:], id="magic-1"),
        pytest.param(lambda b: b + b"\x00\x00\x00", id="trailing-bytes"),
        pytest.param(lambda b: b[:-5], id="short"),
    ],
)
def test_a_damaged_batch_is_refused_and_nothing_of_the_request_is_appended(tmp_path: Path, damage) -> None:  # type: ignore[no-untyped-def]
    log = PartitionLog(tmp_path / "p.log", fsync=False)
    with pytest.raises(CorruptBatchError):
        log.append(batch([b"good"]) + damage(batch([b"bad"])))
    assert log.next_offset == 0 and os.path.getsize(tmp_path / "p.log") == 0


def test_a_retried_idempotent_batch_is_appended_once_also_after_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "p.log"
    log = PartitionLog(path, fsync=False)
    assert log.append(batch([b"x", b"y"], producer=7, sequence=0)) == 0
    assert log.append(batch([b"z"], producer=7, sequence=2)) == 2
    assert log.append(batch([b"x", b"y"], producer=7, sequence=0)) == 0  # the retry: its first offset, no append
    assert log.append(batch([b"x"], producer=8, sequence=0)) == 3  # another producer's sequence 0 is new
    log.close()
    reopened = PartitionLog(path, fsync=False)
    assert reopened.append(batch([b"z"], producer=7, sequence=2)) == 2
    assert reopened.next_offset == 4
    assert [v for _, v in records(reopened.read(0, 1 << 20))] == [b"x", b"y", b"z", b"x"]


def test_offset_for_timestamp_is_the_first_batch_reaching_it(tmp_path: Path) -> None:
    log = PartitionLog(tmp_path / "p.log", fsync=False)
    log.append(batch([b"a", b"b"], timestamp=100))  # timestamps 100, 101
    log.append(batch([b"c"], timestamp=200))
    assert log.offset_for_timestamp(50) == 0
    assert log.offset_for_timestamp(101) == 0
    assert log.offset_for_timestamp(150) == 2
    assert log.offset_for_timestamp(999) == 3


def test_topics_records_and_committed_offsets_survive_reopening(tmp_path: Path) -> None:
    storage = BrokerStorage(tmp_path)
    topic = storage.create_topic("events", 3, {"cleanup.policy": "compact"})
    topic.partitions[2].append(batch([b"a"]))
    storage.commit("g", {("events", 2): CommittedOffset(1, "meta")})
    storage.commit("g", {("events", 2): CommittedOffset(5, "")})
    storage.close()
    reopened = BrokerStorage(tmp_path)
    assert list(reopened.topics) == ["events"]
    assert reopened.topics["events"].configs == {"cleanup.policy": "compact"}
    assert [log.next_offset for log in reopened.topics["events"].partitions] == [0, 0, 1]
    assert reopened.offsets == {"g": {("events", 2): CommittedOffset(5, "")}}
    assert reopened.partition("events", 3) is None and reopened.partition("nope", 0) is None


def test_a_torn_offsets_line_keeps_the_commits_before_it(tmp_path: Path) -> None:
    storage = BrokerStorage(tmp_path)
    storage.create_topic("t", 1, {})
    storage.commit("g", {("t", 0): CommittedOffset(3, "")})
    storage.close()
    with open(tmp_path / "offsets.jsonl", "a", encoding="utf-8") as f:
        f.write('{"group": "g", "topic": "t", "partit')
    assert BrokerStorage(tmp_path).offsets == {"g": {("t", 0): CommittedOffset(3, "")}}


def test_the_offsets_file_is_rewritten_with_live_entries_when_it_grew_long(tmp_path: Path) -> None:
    storage = BrokerStorage(tmp_path)
    storage.create_topic("t", 1, {})
    for offset in range(100):
        storage.commit("g", {("t", 0): CommittedOffset(offset, "")})
    storage.close()
    assert len((tmp_path / "offsets.jsonl").read_text().splitlines()) == 100
    assert BrokerStorage(tmp_path).offsets == {"g": {("t", 0): CommittedOffset(99, "")}}
    assert len((tmp_path / "offsets.jsonl").read_text().splitlines()) == 1


@pytest.mark.parametrize(
    ("name", "partitions", "error"),
    [
        ("../escape", 1, "InvalidTopicError"),
        ("..", 1, "InvalidTopicError"),
        ("x" * 250, 1, "InvalidTopicError"),
        ("ok", 0, "InvalidPartitionsError"),
        ("taken", 1, "TopicAlreadyExistsError"),
    ],
)
def test_topics_that_cannot_be_created(tmp_path: Path, name: str, partitions: int, error: str) -> None:
    storage = BrokerStorage(tmp_path)
    storage.create_topic("taken", 1, {})
    with pytest.raises(TopicError) as refused:
        storage.create_topic(name, partitions, {})
    assert refused.value.kafka_error == error
    assert list(storage.topics) == ["taken"]


def test_a_deleted_topic_is_gone_after_reopening_and_can_be_created_empty(tmp_path: Path) -> None:
    storage = BrokerStorage(tmp_path)
    storage.create_topic("t", 1, {}).partitions[0].append(batch([b"old"]))
    storage.delete_topic("t")
    with pytest.raises(TopicError):
        storage.delete_topic("t")
    storage.close()
    reopened = BrokerStorage(tmp_path)
    assert reopened.topics == {}
    assert reopened.create_topic("t", 1, {}).partitions[0].next_offset == 0


def test_producer_ids_are_never_handed_out_twice_across_restarts(tmp_path: Path) -> None:
    first = BrokerStorage(tmp_path)
    ids = [first.new_producer_id() for _ in range(1000)]  # faster than one a microsecond: the counter runs ahead
    first.close()
    time.sleep(0.01)  # a restart takes longer than that lead (1,000 ids: at most 1 ms)
    later = BrokerStorage(tmp_path).new_producer_id()
    assert len(set(ids)) == 1000 and ids == sorted(ids) and later > ids[-1]
