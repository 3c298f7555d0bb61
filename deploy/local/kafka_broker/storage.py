"""The broker's files: the topic catalog, one PartitionLog per partition, and the groups' committed offsets.

<data_dir>/topics.json          {topic: {"partitions": n, "configs": {...}}}, replaced atomically
<data_dir>/logs/<topic>-<p>.log  record batches (PartitionLog)
<data_dir>/offsets.jsonl         one line per committed offset, the last line for a partition wins
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from deploy.local.kafka_broker.partition_log import PartitionLog
from scorers.errors import UserError

LEGAL_TOPIC = re.compile(r"[a-zA-Z0-9._-]{1,249}")
# Offsets file lines per live entry above which it is rewritten with only the live entries when opened.
OFFSETS_REWRITE_RATIO = 10


class TopicError(UserError, ValueError):
    """A topic that cannot be created or found; ``kafka_error`` is the kafka.errors class to answer with."""

    def __init__(self, message: str, kafka_error: str) -> None:
        super().__init__(message)
        self.kafka_error = kafka_error


@dataclass
class Topic:
    name: str
    partitions: list[PartitionLog]
    configs: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class CommittedOffset:
    offset: int
    metadata: str


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


class BrokerStorage:
    """Topics, their partition logs and committed offsets under one directory, as they were before a restart."""

    def __init__(self, data_dir: Path, *, fsync: bool = False) -> None:
        self.data_dir = data_dir
        self.fsync = fsync
        (data_dir / "logs").mkdir(parents=True, exist_ok=True, mode=0o700)
        self._catalog = data_dir / "topics.json"
        self.topics: dict[str, Topic] = {}
        catalog = json.loads(self._catalog.read_text(encoding="utf-8")) if self._catalog.exists() else {}
        for name, entry in catalog.items():
            logs = [self._open_log(name, p) for p in range(entry["partitions"])]
            self.topics[name] = Topic(name, logs, dict(entry.get("configs", {})))
        self._offsets_path = data_dir / "offsets.jsonl"
        self.offsets: dict[str, dict[tuple[str, int], CommittedOffset]] = {}
        self._offsets_file = self._load_offsets()
        self._last_producer_id = 0

    def _open_log(self, topic: str, partition: int) -> PartitionLog:
        return PartitionLog(self.data_dir / "logs" / f"{topic}-{partition}.log", fsync=self.fsync)

    def _save_catalog(self) -> None:
        catalog = {t.name: {"partitions": len(t.partitions), "configs": t.configs} for t in self.topics.values()}
        _write_atomically(self._catalog, json.dumps(catalog, indent=1, sort_keys=True))

    def create_topic(self, name: str, partitions: int, configs: dict[str, str]) -> Topic:
        if not LEGAL_TOPIC.fullmatch(name) or name in (".", ".."):
            raise TopicError(f"illegal topic name {name!r}: 1-249 of [a-zA-Z0-9._-]", "InvalidTopicError")
        if name in self.topics:
            raise TopicError(f"topic {name!r} already exists", "TopicAlreadyExistsError")
        if partitions < 1:
            raise TopicError(f"topic {name!r}: {partitions} partitions, at least 1 is needed", "InvalidPartitionsError")
        for p in range(partitions):  # files left by a topic deleted while the broker was down
            (self.data_dir / "logs" / f"{name}-{p}.log").unlink(missing_ok=True)
        topic = Topic(name, [self._open_log(name, p) for p in range(partitions)], dict(configs))
        self.topics[name] = topic
        self._save_catalog()
        return topic

    def delete_topic(self, name: str) -> None:
        topic = self.topics.pop(name, None)
        if topic is None:
            raise TopicError(f"no topic {name!r}", "UnknownTopicOrPartitionError")
        self._save_catalog()
        for log in topic.partitions:
            log.close()
            log.path.unlink(missing_ok=True)

    def partition(self, topic: str, partition: int) -> PartitionLog | None:
        found = self.topics.get(topic)
        if found is None or not 0 <= partition < len(found.partitions):
            return None
        return found.partitions[partition]

    def _load_offsets(self) -> TextIO:
        lines = 0
        if self._offsets_path.exists():
            with open(self._offsets_path, encoding="utf-8") as f:
                for line in f:
                    try:
                        entry = json.loads(line)
                    except json.JSONDecodeError:  # a line torn by a crash mid-write: the ones before it stand
                        break
                    lines += 1
                    group = self.offsets.setdefault(entry["group"], {})
                    group[(entry["topic"], entry["partition"])] = CommittedOffset(entry["offset"], entry["metadata"])
        live = sum(len(g) for g in self.offsets.values())
        if lines > OFFSETS_REWRITE_RATIO * max(live, 1) or not self._offsets_path.exists():
            _write_atomically(self._offsets_path, "".join(self._offset_lines(self.offsets)))
        return open(self._offsets_path, "a", encoding="utf-8")  # held open for the broker's life

    @staticmethod
    def _offset_lines(offsets: dict[str, dict[tuple[str, int], CommittedOffset]]) -> list[str]:
        return [
            json.dumps({"group": g, "topic": t, "partition": p, "offset": c.offset, "metadata": c.metadata}) + "\n"
            for g, entries in offsets.items()
            for (t, p), c in entries.items()
        ]

    def commit(self, group: str, entries: dict[tuple[str, int], CommittedOffset]) -> None:
        """Record ``entries`` for ``group``, on disk before in memory."""
        self._offsets_file.write("".join(self._offset_lines({group: entries})))
        self._offsets_file.flush()
        if self.fsync:
            os.fsync(self._offsets_file.fileno())
        self.offsets.setdefault(group, {}).update(entries)

    def new_producer_id(self) -> int:
        """A producer id never handed out before, across restarts too: microseconds since the epoch, or one more.

        A restarted broker remembers the last batches of every producer id from its logs (to drop retried
        batches), so an id handed out again would make a new producer's first batches look like retries. The
        counter runs ahead of the clock only by the ids handed out within the same microseconds, far less than a
        restart takes.
        """
        self._last_producer_id = max(self._last_producer_id + 1, time.time_ns() // 1000)
        return self._last_producer_id

    def close(self) -> None:
        self._offsets_file.close()
        for topic in self.topics.values():
            for log in topic.partitions:
                log.close()
