"""One partition's log: Kafka v2 record batches appended to one file, indexed by offset again after a restart."""

from __future__ import annotations

import bisect
import os
import struct
from array import array
from collections import deque
from pathlib import Path

from kafka.record.util import calc_crc32c

from scorers.errors import UserError

# Kafka's record batch header (magic 2): base offset, length, leader epoch, magic, CRC, attributes,
# last offset delta, first and max timestamp, producer id and epoch, base sequence, record count.
BATCH_HEADER = struct.Struct(">qiibIhiqqqhii")
LENGTH_PREFIX = struct.calcsize(">qi")  # base offset and length: the bytes before what `length` counts
CRC_COVERS_FROM = struct.calcsize(">qiibI")  # the CRC-32C covers attributes to the end of the batch
BASE_OFFSET = struct.Struct(">q")
SCAN_CHUNK = 1 << 20
# Batches remembered per idempotent producer to answer a retried batch with its first offset (Kafka keeps 5).
PRODUCER_BATCHES_KEPT = 5


class CorruptBatchError(UserError, ValueError):
    """A produced batch that is not a whole, intact magic-2 record batch."""


def split_batches(records: bytes) -> list[memoryview]:
    """The record batches in a produce request's ``records`` bytes, each checked (length, magic 2, CRC-32C)."""
    view, batches, pos = memoryview(records), [], 0
    while pos < len(view):
        if len(view) - pos < BATCH_HEADER.size:
            raise CorruptBatchError(f"{len(view) - pos} trailing bytes are shorter than a batch header")
        (_, length, _, magic, crc, *_) = BATCH_HEADER.unpack_from(view, pos)
        end = pos + LENGTH_PREFIX + length
        if end > len(view) or length < BATCH_HEADER.size - LENGTH_PREFIX:
            raise CorruptBatchError(f"a batch claims {length} bytes, {len(view) - pos - LENGTH_PREFIX} are there")
        if magic != 2:
            raise CorruptBatchError(f"record batch magic {magic}: only magic 2 (Kafka 0.11+ clients) is accepted")
        if calc_crc32c(view[pos + CRC_COVERS_FROM : end]) != crc:
            raise CorruptBatchError("a record batch fails its CRC-32C")
        batches.append(view[pos:end])
        pos = end
    return batches


class PartitionLog:
    """Append-only record batches in one file; each batch is rewritten with its offset in the partition.

    The in-memory index (first offset, file position, length, max timestamp of every batch) is rebuilt from the
    file when the log is opened; a batch torn by a crash mid-write is cut off. A batch an idempotent producer sends
    again (same producer id and base sequence as one of its last few) is not appended twice. With ``fsync`` every append is
    flushed to the device before it returns; without, an append survives the broker process dying (the
    operating system holds the write) but not the machine.
    """

    def __init__(self, path: Path, *, fsync: bool) -> None:
        self.path = path
        self.fsync = fsync
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
        self._bases = array("q")
        self._positions = array("q")
        self._lengths = array("q")
        self._max_timestamps = array("q")
        self._size = 0
        self.next_offset = 0
        # producer id → (base sequence, first offset) of its last batches
        self._producers: dict[int, deque[tuple[int, int]]] = {}
        self._recover()

    @property
    def log_start_offset(self) -> int:
        return 0

    def _recover(self) -> None:
        size = os.fstat(self._fd).st_size
        pos, buffer, buffer_at = 0, b"", 0
        while pos < size:
            if pos + BATCH_HEADER.size > buffer_at + len(buffer):
                buffer, buffer_at = os.pread(self._fd, max(SCAN_CHUNK, BATCH_HEADER.size), pos), pos
            if len(buffer) - (pos - buffer_at) < BATCH_HEADER.size:
                break
            base, length, _, _, _, _, last_delta, _, max_ts, producer, _, sequence, _ = BATCH_HEADER.unpack_from(
                buffer, pos - buffer_at
            )
            end = pos + LENGTH_PREFIX + length
            if end > size or base != self.next_offset:
                break
            self._index(base, pos, end - pos, max_ts)
            self._remember(producer, sequence, base)
            self.next_offset = base + last_delta + 1
            pos = end
        if pos < size:  # a torn last write (or bytes that are not ours): keep the intact prefix
            os.ftruncate(self._fd, pos)
        self._size = pos

    def _index(self, base: int, pos: int, length: int, max_timestamp: int) -> None:
        self._bases.append(base)
        self._positions.append(pos)
        self._lengths.append(length)
        self._max_timestamps.append(max_timestamp)

    def _remember(self, producer: int, sequence: int, first_offset: int) -> None:
        if producer >= 0:
            kept = self._producers.setdefault(producer, deque(maxlen=PRODUCER_BATCHES_KEPT))
            kept.append((sequence, first_offset))

    def _appended_before(self, producer: int, sequence: int) -> int | None:
        return next((first for seq, first in self._producers.get(producer, ()) if seq == sequence), None)

    def append(self, records: bytes) -> int:
        """Append the batches in ``records`` (raises CorruptBatchError, appending nothing); their first offset."""
        batches = split_batches(records)
        first: int | None = None
        out = bytearray()
        for batch in batches:
            _, _, _, _, _, _, last_delta, _, max_ts, producer, _, sequence, _ = BATCH_HEADER.unpack_from(batch)
            if producer >= 0 and (earlier := self._appended_before(producer, sequence)) is not None:
                first = earlier if first is None else first
                continue
            first = self.next_offset if first is None else first
            self._remember(producer, sequence, self.next_offset)
            start = len(out)
            out += batch
            BASE_OFFSET.pack_into(out, start, self.next_offset)  # outside the CRC, as in Kafka
            self._index(self.next_offset, self._size + start, len(batch), max_ts)
            self.next_offset += last_delta + 1
        if not out:
            return first if first is not None else self.next_offset
        written = os.write(self._fd, out)
        if written != len(out):
            raise OSError(f"short write to {self.path}: {written} of {len(out)} bytes")
        if self.fsync:
            os.fsync(self._fd)
        self._size += len(out)
        return first if first is not None else self.next_offset

    def read(self, offset: int, max_bytes: int) -> bytes:
        """Whole batches from the one holding ``offset``: at most ``max_bytes``, but always the first one."""
        i = bisect.bisect_right(self._bases, offset) - 1
        if i < 0 or offset >= self.next_offset:
            return b""
        start, total = self._positions[i], self._lengths[i]
        for j in range(i + 1, len(self._bases)):
            if total + self._lengths[j] > max_bytes:
                break
            total += self._lengths[j]
        return os.pread(self._fd, total, start)

    def offset_for_timestamp(self, timestamp_ms: int) -> int:
        """The first offset of the first batch with a record at or after ``timestamp_ms``; the end if none."""
        for base, max_ts in zip(self._bases, self._max_timestamps):
            if max_ts >= timestamp_ms:
                return base
        return self.next_offset

    def close(self) -> None:
        os.close(self._fd)
