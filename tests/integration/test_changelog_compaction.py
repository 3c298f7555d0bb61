"""The worker's changelog is compacted by Kafka, and a worker restored from the compacted changelog holds exactly the
open conversations.

A worker (real process, batch stages, one partition) on the session broker assembles 30 conversations (real LLM-Rubric
ids, so the recorded judge scores them) whose turns arrive in 12 separate rounds, so each conversation's state is
written to the changelog 12 times. 10 of them end: each is written once more as a closed state, and once more as a
tombstone when the worker forgets it (``closed_retention_s``). The changelog topic is created compacted by
`ensure_topics`; the test makes Kafka's log cleaner act within the test's time by setting the topic's ``segment.ms``,
``min.cleanable.dirty.ratio`` and ``delete.retention.ms``. Kafka never cleans a partition's active segment, and
``segment.ms`` rolls a segment only when a record is appended once it has passed, so after the change the test keeps
adding turns to one open conversation (the worker writes its state each time): each rolls the segment before it,
which the cleaner may then clean. The cleaner's own backoff (``log.cleaner.backoff.ms``, 15 s) stays Kafka's default,
so cleaning starts within 15 s; the tombstones need a second pass (the first sets their delete horizon).

Checked: the cleaned part of the changelog (below the cleaner's checkpoint, read from the broker's log directory)
holds exactly one record per open conversation and nothing of the ended ones (states and tombstones gone); the worker
is killed (-9) and started again, restores from it, and reports exactly the 20 open conversations (its log line and
``convowatch_open_conversations``); the open ones then end, each is closed once with every turn it had, scored and
stored once.

Settings shortened, and why:

- topic ``segment.ms`` 100 (convowatch creates the changelog with ``kafka.changelog_segment_s``, 1 h): a segment
  must roll to be cleanable at all;
- topic ``min.cleanable.dirty.ratio`` 0.01 (default 0.5): the cleaner runs on the few records each roll adds;
- topic ``delete.retention.ms`` 100 (default 1 day): tombstones are dropped on the cleaner's next pass;
- ``assembly.closed_retention_s`` 2 (default 1 day): the ended conversations are forgotten (tombstoned) in the test.
"""

from __future__ import annotations

import functools
import itertools
import time
from collections import Counter
from pathlib import Path

from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition
from kafka.admin import ConfigResource, ConfigResourceType
from kafka.consumer.fetcher import ConsumerRecord

from stream.assembly_stage import changelog_key
from stream.contract import EndEvent, TurnEvent, encode_event
from stream.records import ClosedConversation, ScoreRecord
from stream.replay.sources import llm_rubric_events
from stream.settings import KafkaSettings
from stream.topics import changelog_topic
from tests.infra import wait_for
from tests.pipeline import Pipeline, Process

OPEN, ENDED, ROUNDS = 20, 10, 12
CLOSED_RETENTION_S = 2
FAST_COMPACTION = {
    # The policy named again: kafka-python sends IncrementalAlterConfigs to Kafka 4 (only these keys change), but an
    # AlterConfigs request (older brokers, incremental=False) resets every config it omits.
    "cleanup.policy": "compact",
    "segment.ms": "100",
    "min.cleanable.dirty.ratio": "0.01",
    "delete.retention.ms": "100",
}
CLEANER_CHECKPOINT = "cleaner-offset-checkpoint"  # in each log directory: per partition, the offset cleaned up to


def _changelog(pipeline: Pipeline) -> str:
    return changelog_topic(KafkaSettings(app_id=pipeline.env["CONVOWATCH_KAFKA__APP_ID"]))


def _read(bootstrap: str, topic: str) -> list[ConsumerRecord]:
    """Every record of ``topic``'s partition 0, from its start to its end offset."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    tp = TopicPartition(topic, 0)
    try:
        consumer.assign([tp])
        end = consumer.end_offsets([tp])[tp]
        consumer.seek_to_beginning(tp)
        out: list[ConsumerRecord] = []
        deadline = time.monotonic() + 30
        while consumer.position(tp) < end:
            if time.monotonic() > deadline:
                raise AssertionError(f"{topic}: read to {consumer.position(tp)} of {end} in 30 s")
            for records in consumer.poll(timeout_ms=500).values():
                out.extend(records)
        return [r for r in out if r.offset < end]
    finally:
        consumer.close()


def _end_offset(bootstrap: str, topic: str) -> int:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap)
    try:
        tp = TopicPartition(topic, 0)
        return int(consumer.end_offsets([tp])[tp])
    finally:
        consumer.close()


def kafka_log_dir(bootstrap: str, topic: str) -> Path:
    """The log directory of the (one) broker holding ``topic``, as the broker reports it (DescribeLogDirs)."""
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        [broker] = admin.describe_log_dirs([topic])
    finally:
        admin.close()
    [log_dir] = broker["log_dirs"]
    return Path(log_dir["log_dir"])


def cleaned_up_to(log_dir: Path, topic: str, partition: int = 0) -> int | None:
    """The offset Kafka's log cleaner has cleaned ``topic``'s ``partition`` up to (the cleaner's checkpoint file in the
    broker's log directory), None before its first pass."""
    path = log_dir / CLEANER_CHECKPOINT
    lines = path.read_text().splitlines() if path.exists() else []
    if len(lines) < 2:  # not written yet, or caught while being written
        return None
    version, _count, *entries = lines
    assert version == "0", f"{path}: checkpoint version {version}"
    for line in entries:
        name, number, offset = line.split()
        if name == topic and int(number) == partition:
            return int(offset)
    return None


def _turn(cid: str, index: int) -> tuple[bytes, bytes]:
    event = TurnEvent(cid, index, "user" if index % 2 == 0 else "assistant", f"turn {index} of {cid}", time.time())
    return cid.encode(), encode_event(event)


def _end(cid: str) -> tuple[bytes, bytes]:
    return cid.encode(), encode_event(EndEvent(cid, time.time()))


def _restored_line(worker: Process, changelog: str, since: int) -> str:
    """The worker's restore line in its log after byte ``since`` (a process started again appends to the same log)."""
    with worker.log.open("rb") as f:
        f.seek(since)
        text = f.read().decode(errors="replace")
    for line in text.splitlines():
        if f"conversations restored from {changelog}" in line:
            return line
    return ""


def test_a_worker_restores_exactly_the_open_conversations_from_the_compacted_changelog(pipeline: Pipeline) -> None:
    pipeline.partitions = 1  # one changelog partition: one log, one cleaner checkpoint to read
    pipeline.extra_env["CONVOWATCH_ASSEMBLY__CLOSED_RETENTION_S"] = str(CLOSED_RETENTION_S)
    real_ids = sorted({i.event.conversation_id for i in llm_rubric_events() if i.event is not None})
    open_ids, ended_ids = real_ids[:OPEN], real_ids[OPEN : OPEN + ENDED]
    roller = open_ids[0]  # the conversation whose later turns roll the changelog's segments
    worker = pipeline.start_worker()
    pipeline.wait_assigned([worker])

    def events(type_: str, outcome: str) -> float:
        return worker.metric_sum("convowatch_events_total", type=type_, outcome=outcome)

    def assembled(rounds: int) -> bool:
        return events("turn", "accepted") >= rounds * (OPEN + ENDED)

    for r in range(ROUNDS):  # a round is assembled before the next is sent: every conversation written once a round
        pipeline.produce(_turn(cid, r) for cid in open_ids + ended_ids)
        wait_for(functools.partial(assembled, r + 1), timeout=60, what=f"round {r} assembled")
    pipeline.produce(_end(cid) for cid in ended_ids)
    wait_for(lambda: events("end", "closed") == ENDED, timeout=60, what="the ended ones closed")
    # closed_retention_s later the idle timer publishes a retention end for each; the worker forgets it: a tombstone
    wait_for(lambda: events("end", "expired") == ENDED, timeout=30, what="the ended ones forgotten")

    changelog = _changelog(pipeline)
    ended_keys = {changelog_key(cid) for cid in ended_ids}
    wait_for(
        lambda: _end_offset(pipeline.bootstrap, changelog) == ROUNDS * (OPEN + ENDED) + 2 * ENDED,
        timeout=30,
        what="every state written",
    )
    written = _read(pipeline.bootstrap, changelog)
    # a state per conversation per round, then a closed state and a tombstone for each ended one
    assert len(written) == ROUNDS * (OPEN + ENDED) + 2 * ENDED
    assert sum(1 for r in written if r.value is None) == ENDED
    assert {r.key for r in written if r.value is None} == ended_keys

    admin = KafkaAdminClient(bootstrap_servers=pipeline.bootstrap)
    try:
        resource = ConfigResource(ConfigResourceType.TOPIC, changelog)

        def topic_configs() -> dict[str, str]:
            return {k: v["value"] for k, v in admin.describe_configs([resource])["topic"][changelog].items()}

        assert topic_configs().get("cleanup.policy") == "compact"  # created so by ensure_topics
        admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, changelog, configs=FAST_COMPACTION)])
        # a topic's configs reach the broker through the metadata log: a describe just after may not show them yet
        wait_for(lambda: topic_configs().items() >= FAST_COMPACTION.items(), timeout=10, what="the topic configs changed")
    finally:
        admin.close()
    log_dir = kafka_log_dir(pipeline.bootstrap, changelog)

    later_turns = itertools.count(ROUNDS)
    roll_offsets: list[int] = []

    def roll() -> None:
        """One more turn of ``roller``: the worker writes its state, which rolls the changelog's segment."""
        end = _end_offset(pipeline.bootstrap, changelog)
        roll_offsets.append(end)
        pipeline.produce([_turn(roller, next(later_turns))])
        wait_for(lambda: _end_offset(pipeline.bootstrap, changelog) > end, timeout=30, what="the roller's state written")

    def cleaned() -> int | None:
        """The cleaner's checkpoint once it has cleaned past the first roll and dropped the ended ones' records."""
        roll()
        upto = cleaned_up_to(log_dir, changelog)
        if upto is None or upto < roll_offsets[0]:  # the first roll's record is the first a pass leaves
            return None
        if any(r.key in ended_keys for r in _read(pipeline.bootstrap, changelog)):
            return None  # tombstones kept until a pass after delete.retention.ms
        return upto

    time.sleep(0.2)  # past segment.ms: the next record written rolls the segment that holds everything so far
    started = time.monotonic()
    roll()
    sink = pipeline.start_sink()  # for the end of the test, started while the cleaner waits out its backoff
    upto = wait_for(cleaned, timeout=90, interval=2, what="the changelog compacted by Kafka")
    compaction_s = time.monotonic() - started
    records = _read(pipeline.bootstrap, changelog)  # read after the checkpoint: all below it was cleaned when read
    open_keys = {changelog_key(cid) for cid in open_ids}
    below = Counter(r.key for r in records if r.offset < upto)
    # The cleaned part: at most one record per key, every open conversation's but the roller's (a pass after the
    # checkpoint was read may have dropped its record there for a later one), nothing of the ended ones.
    assert max(below.values()) == 1, below
    assert open_keys - {changelog_key(roller)} <= set(below) <= open_keys, (upto, below)
    assert {r.key for r in records if r.offset >= upto} <= {changelog_key(roller)}  # only rolls since the last pass
    assert all(r.value is not None for r in records)  # the tombstones gone too
    assert {r.key for r in records} == open_keys
    assert len(records) < len(written) / 5, (len(records), len(written))
    turns_written = next(later_turns)  # the roller's turns: ROUNDS + the rolls

    worker.kill9()
    log_size = worker.log.stat().st_size
    restarted = pipeline.start_worker()  # same name: same static member id, it takes the partition back at once
    pipeline.wait_assigned([restarted])
    line = wait_for(lambda: _restored_line(restarted, changelog, log_size), timeout=30, what="the restore logged")
    assert f": partitions [0] assigned, {OPEN} conversations restored from {changelog}" in line, line
    wait_for(
        lambda: restarted.metric_sum("convowatch_open_conversations") == OPEN,
        timeout=30,
        what=f"{OPEN} open conversations after the restore",
    )

    # The restored states are the whole conversations: ended now, each is closed once with every turn it had.
    pipeline.produce(_end(cid) for cid in open_ids)
    closed_records = pipeline.consume("closed", OPEN + ENDED, timeout=60)
    closed_open = [ClosedConversation.from_json(m.value) for m in closed_records if m.key.decode() in open_ids]
    assert sorted(c.conversation_id for c in closed_open) == sorted(open_ids)
    for c in closed_open:
        expected = turns_written if c.conversation_id == roller else ROUNDS
        assert c.close_cause == "end"
        assert [t.index for t in c.turns] == list(range(expected)), (c.conversation_id, [t.index for t in c.turns])
        assert all(t.text == f"turn {t.index} of {c.conversation_id}" for t in c.turns)

    def scored() -> list[ScoreRecord]:
        records = [ScoreRecord.from_json(m.value) for m in pipeline.consume("scores", OPEN + ENDED, timeout=5)]
        return records if {r.conversation_id for r in records} >= set(open_ids) else []

    scores = wait_for(scored, timeout=60, interval=1, what="the open ones scored")
    assert sorted(r.conversation_id for r in scores if r.conversation_id in open_ids) == sorted(open_ids)  # once each
    assert {r.status for r in scores if r.conversation_id in open_ids} == {"scored"}
    wait_for(
        lambda: sink.metric_sum("convowatch_sink_rows_total", table="conversation_scores") >= len(scores),
        timeout=60,
        what="the sink wrote every score",
    )
    sink.terminate()
    rows = pipeline.query_store(
        "SELECT conversation_id, count() AS n, any(n_turns) AS turns, any(status) AS status "
        "FROM convowatch.conversation_scores GROUP BY conversation_id"
    )
    stored = {r["conversation_id"]: r for r in rows if r["conversation_id"] in open_ids}
    assert set(stored) == set(open_ids)
    assert all(r["n"] == 1 and r["status"] == "scored" for r in stored.values()), stored
    assert {cid: r["turns"] for cid, r in stored.items()} == {cid: turns_written if cid == roller else ROUNDS for cid in open_ids}
    print(f"compacted in {compaction_s:.1f} s (cleaned up to {upto}): {len(written)} records -> {len(records)}")
