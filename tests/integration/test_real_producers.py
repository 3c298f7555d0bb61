"""Events published by librdkafka clients, as product teams publish them: confluent-kafka (PyPI) and kcat (Debian),
idempotent (so acks=all), with each compression codec Kafka has; and events too large for the topic or the contract.

One worker and one sink serve the whole module (starting them is most of a case's cost). Each codec case sends real
LLM-Rubric conversations of its own and a thumb on one of them, checks the batches the broker stored are compressed
with that codec by an idempotent producer (read from the partition's segment files), that every conversation is
scored once and that the sink has written and committed them; the last test stops the sink and reads the store.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer
from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition
from kafka.admin import ConfigResource, ConfigResourceType, NewTopic
from kafka.record import MemoryRecords

from stream.contract import FeedbackEvent, TurnEvent, encode_event
from stream.records import ScoreRecord
from stream.replay.sources import ReplayItem, llm_rubric_events
from tests.infra import wait_for
from tests.pipeline import Pipeline, Process

CODECS = ("none", "gzip", "snappy", "lz4", "zstd")
CODEC_IDS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}  # a record batch's attributes, bits 0-2
KAFKA_MAX_MESSAGE_BYTES = 1_048_588  # Kafka's default max.message.bytes of a topic (1 MiB + the 12-byte log overhead)
# A batch of one uncompressed record with a key of under 64 bytes and no headers: the batch header (61 bytes, the log
# overhead included) and the record's framing (length 3, attributes 1, timestamp and offset deltas 1 each, key length
# 1, value length 3, header count 1). The test finds the same limit on the broker (accepted, one byte more refused).
ONE_RECORD_BATCH_OVERHEAD = 72
LARGE_PRODUCER_LIMIT = 4 * 1_048_576  # librdkafka's own message.max.bytes, raised so that the refusal is Kafka's
T0 = 1_707_000_000.0


@dataclass
class Line:
    """The module's pipeline, its long-lived worker and sink, and what the tests sent."""

    pipeline: Pipeline
    worker: Process
    sink: Process
    conversations: dict[str, list[ReplayItem]]
    unused: list[str]
    scored: set[str] = field(default_factory=set)  # conversations scored once and written by the sink
    thumbs: set[str] = field(default_factory=set)

    def take(self, n: int) -> list[str]:
        taken, self.unused = self.unused[:n], self.unused[n:]
        assert len(taken) == n, "the module has used up the real conversations"
        return taken


@pytest.fixture(scope="module")
def line(tmp_path_factory: pytest.TempPathFactory, kafka_broker: str, scoring_artifacts: tuple[Path, Path]) -> Iterator[Line]:
    rubric_set, calibrator = scoring_artifacts
    pipeline = Pipeline(tmp_path_factory.mktemp("real-producers"), kafka_broker, rubric_set, calibrator)
    conversations: dict[str, list[ReplayItem]] = {}
    for item in llm_rubric_events():
        assert item.event is not None
        conversations.setdefault(item.event.conversation_id, []).append(item)
    try:
        with ThreadPoolExecutor(2) as starting:  # both create the topics (Kafka's default max.message.bytes) if missing
            starting_worker, starting_sink = starting.submit(pipeline.start_worker), starting.submit(pipeline.start_sink)
            worker, sink = starting_worker.result(), starting_sink.result()
        pipeline.wait_assigned([worker])
        yield Line(pipeline, worker, sink, conversations, sorted(conversations))
    finally:
        pipeline.stop_all()


# ------------------------------------------------------------------ producers and the broker


def _confluent(bootstrap: str, codec: str = "none", config: Mapping[str, object] | None = None) -> Producer:
    """An idempotent confluent-kafka producer (librdkafka then forces acks=all)."""
    return Producer(
        {"bootstrap.servers": bootstrap, "enable.idempotence": True, "compression.type": codec, "linger.ms": 20, **(config or {})}
    )


def _send(
    producer: Producer, topic: str, records: Sequence[tuple[bytes | None, bytes]]
) -> list[tuple[KafkaError | None, int, int]]:
    """Produce ``records`` and wait for every delivery report: (error or None, partition, offset) each, in order."""
    reports: dict[int, tuple[KafkaError | None, int, int]] = {}
    for n, (key, value) in enumerate(records):

        def report(err: KafkaError | None, msg, n: int = n) -> None:
            reports[n] = (err, msg.partition(), msg.offset())

        producer.produce(topic, key=key, value=value, on_delivery=report)
    assert producer.flush(60) == 0, "records left undelivered"
    return [reports[n] for n in range(len(records))]


def _publish_confluent(pipeline: Pipeline, records: Sequence[tuple[bytes | None, bytes]], codec: str) -> None:
    reports = _send(_confluent(pipeline.bootstrap, codec), pipeline.topic("events"), records)
    assert [err for err, _, _ in reports if err is not None] == []


def _publish_kcat(pipeline: Pipeline, records: Sequence[tuple[bytes | None, bytes]], codec: str) -> None:
    """kcat reads ``key<TAB>value`` lines; the events are one-line JSON, and no conversation id holds a tab."""
    keyed = [(key, value) for key, value in records if key is not None]
    assert len(keyed) == len(records) and not any(b"\t" in key or b"\n" in key + value for key, value in keyed)
    lines = b"".join(key + b"\t" + value + b"\n" for key, value in keyed)
    argv = ["kcat", "-P", "-b", pipeline.bootstrap, "-t", pipeline.topic("events"), "-K", "\t", "-z", codec]
    done = subprocess.run([*argv, "-X", "enable.idempotence=true"], input=lines, capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr.decode(errors="replace")


PUBLISHERS = {"confluent-kafka": _publish_confluent, "kcat": _publish_kcat}


def _end_offsets(pipeline: Pipeline, topic: str) -> dict[int, int]:
    consumer = KafkaConsumer(bootstrap_servers=pipeline.bootstrap, enable_auto_commit=False)
    try:
        tps = [TopicPartition(pipeline.topic(topic), p) for p in range(pipeline.partitions)]
        return {tp.partition: offset for tp, offset in consumer.end_offsets(tps).items()}
    finally:
        consumer.close()


def _read_topic(pipeline: Pipeline, topic: str) -> list:
    """Every record of ``topic`` up to its current end."""
    ends = _end_offsets(pipeline, topic)
    consumer = KafkaConsumer(bootstrap_servers=pipeline.bootstrap, enable_auto_commit=False)
    tps = [TopicPartition(pipeline.topic(topic), p) for p in ends]
    out: list = []

    def read_to_the_end() -> bool:
        for batch in consumer.poll(timeout_ms=200).values():
            out.extend(batch)
        return all(consumer.position(tp) >= ends[tp.partition] for tp in tps)

    try:
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        wait_for(read_to_the_end, timeout=60, interval=0, what=f"{topic} read to its end")
    finally:
        consumer.close()
    return out


def _topic_config(pipeline: Pipeline, topic: str, name: str) -> str:
    admin = KafkaAdminClient(bootstrap_servers=pipeline.bootstrap)
    try:
        resource = ConfigResource(ConfigResourceType.TOPIC, pipeline.topic(topic), {name: None})
        return admin.describe_configs([resource], config_filter="all")["topic"][pipeline.topic(topic)][name]["value"]
    finally:
        admin.close()


def _stored_batches(pipeline: Pipeline, since: dict[int, int]) -> list[tuple[int, int, int, int]]:
    """The record batches the broker stored on the events topic from offsets ``since`` on, as (partition, records,
    compression codec id, producer id), read from the partitions' segment files in the broker's log directory."""
    admin = KafkaAdminClient(bootstrap_servers=pipeline.bootstrap)
    try:
        [broker] = admin.describe_cluster()["brokers"]
        resource = ConfigResource(ConfigResourceType.BROKER, str(broker["broker_id"]), {"log.dirs": None})
        log_dirs = admin.describe_configs([resource], config_filter="all")["broker"][str(broker["broker_id"])]
    finally:
        admin.close()
    [log_dir] = log_dirs["log.dirs"]["value"].split(",")
    out = []
    for partition, start in since.items():
        for segment in sorted((Path(log_dir) / f"{pipeline.topic('events')}-{partition}").glob("*.log")):
            records = MemoryRecords(segment.read_bytes())
            while (batch := records.next_batch()) is not None:
                if batch.base_offset >= start:
                    out.append((partition, batch.next_offset - batch.base_offset, batch.compression_type, batch.producer_id))
    return out


# ------------------------------------------------------------------ what the worker and the sink did


def _scores(pipeline: Pipeline, ids: set[str]) -> dict[str, list[ScoreRecord]]:
    out: dict[str, list[ScoreRecord]] = {}
    for m in _read_topic(pipeline, "scores"):
        record = ScoreRecord.from_json(m.value)
        if record.conversation_id in ids:
            out.setdefault(record.conversation_id, []).append(record)
    return out


def _wait_scored_once(line: Line, ids: set[str], timeout: float = 60) -> dict[str, ScoreRecord]:
    """Until every conversation of ``ids`` is on the scores topic; each must be there once. A worker or sink that
    died (a batch it cannot decompress crashed both) fails at once, with its log."""
    pipeline, records = line.pipeline, {}

    def all_there() -> bool:
        nonlocal records
        for proc in (line.worker, line.sink):
            assert proc.popen.poll() is None, f"{proc.name} exited with {proc.popen.returncode}:\n{proc.log_tail()}"
        records = _scores(pipeline, ids)
        return set(records) == ids

    wait_for(all_there, timeout=timeout, interval=0.5, what=f"scores for {sorted(ids)}")
    assert {cid: len(rs) for cid, rs in records.items()} == dict.fromkeys(ids, 1)
    return {cid: rs[0] for cid, rs in records.items()}


def _wait_sink_committed(pipeline: Pipeline, timeout: float = 60) -> None:
    """Until the sink has committed the scores and events topics to their current ends (it commits after the write)."""
    ends = {(pipeline.topic(t), p): o for t in ("scores", "events") for p, o in _end_offsets(pipeline, t).items()}
    group = pipeline.env["CONVOWATCH_KAFKA__SINK_GROUP"]
    admin = KafkaAdminClient(bootstrap_servers=pipeline.bootstrap)
    try:

        def committed() -> bool:
            got = {(tp.topic, tp.partition): om.offset for tp, om in admin.list_group_offsets(group)[group].items()}
            return all(got.get(tp, 0) >= end for tp, end in ends.items())

        wait_for(committed, timeout=timeout, interval=0.5, what="the sink's commits")
    finally:
        admin.close()


# ------------------------------------------------------------------ compression and idempotence


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("producer", sorted(PUBLISHERS))
def test_events_from_a_librdkafka_producer_are_scored_and_stored(line: Line, producer: str, codec: str) -> None:
    p = line.pipeline
    ids = line.take(2)
    records = [(i.key, i.raw) for cid in ids for i in line.conversations[cid]]
    thumb = FeedbackEvent(ids[0], 1, "down", T0)
    records.append((ids[0].encode(), encode_event(thumb)))
    before = _end_offsets(p, "events")

    PUBLISHERS[producer](p, records, codec)

    batches = _stored_batches(p, before)
    assert sum(n for _, n, _, _ in batches) == len(records)
    assert {(codec_id, producer_id >= 0) for _, _, codec_id, producer_id in batches} == {(CODEC_IDS[codec], True)}
    assert len({producer_id for *_, producer_id in batches}) == 1  # one idempotent producer id (-1 without idempotence)
    scored = _wait_scored_once(line, set(ids))
    assert {cid: r.status for cid, r in scored.items()} == dict.fromkeys(ids, "scored")
    assert {cid: len(r.conversation.turns) for cid, r in scored.items()} == {
        cid: sum(isinstance(i.event, TurnEvent) for i in line.conversations[cid]) for cid in ids
    }
    _wait_sink_committed(p)
    line.scored.update(ids)
    line.thumbs.add(ids[0])
    assert line.worker.popen.poll() is None and line.sink.popen.poll() is None
    assert line.worker.metric_sum("convowatch_dead_letters_total") == 0


# ------------------------------------------------------------------ size limits


def _event_of_size(cid: str, size: int) -> bytes:
    """A turn event of exactly ``size`` bytes."""
    base = len(encode_event(TurnEvent(cid, 0, "user", "x", T0)))
    raw = encode_event(TurnEvent(cid, 0, "user", "x" * (size - base + 1), T0))
    assert len(raw) == size
    return raw


def test_an_event_over_the_topics_max_message_bytes_is_refused_to_the_producer_by_kafka(line: Line) -> None:
    """The events topic is made with Kafka's default max.message.bytes (convowatch sets no size); an event of 1.5 MB
    is over it. librdkafka's own message.max.bytes (default 1,000,000) refuses it first, in produce(); raised past
    the event, the broker refuses it: the delivery report says MSG_SIZE_TOO_LARGE and nothing is written. A topic
    whose max.message.bytes is raised takes the same event from the same producer: the limit is the topic's."""
    p = line.pipeline
    assert int(_topic_config(p, "events", "max.message.bytes")) == KAFKA_MAX_MESSAGE_BYTES
    event = _event_of_size("c-refused", 1_500_000)
    with pytest.raises(KafkaException) as local:
        _confluent(p.bootstrap).produce(p.topic("events"), key=b"c-refused", value=event)
    assert local.value.args[0].code() == KafkaError.MSG_SIZE_TOO_LARGE

    before = _end_offsets(p, "events")
    producer = _confluent(p.bootstrap, config={"message.max.bytes": LARGE_PRODUCER_LIMIT})
    [(err, _, _)] = _send(producer, p.topic("events"), [(b"c-refused", event)])
    assert err is not None and err.code() == KafkaError.MSG_SIZE_TOO_LARGE, err
    assert _end_offsets(p, "events") == before

    raised = f"{p.tag}.raised-limit"
    admin = KafkaAdminClient(bootstrap_servers=p.bootstrap)
    try:
        admin.create_topics([NewTopic(raised, 1, 1, topic_configs={"max.message.bytes": str(2 * KAFKA_MAX_MESSAGE_BYTES)})])
    finally:
        admin.close()
    [(err, _, offset)] = _send(producer, raised, [(b"c-refused", event)])
    assert (err, offset) == (None, 0)


@pytest.mark.parametrize("size", ["1MB", "largest"])
def test_an_event_kafka_takes_but_the_contract_refuses_is_dead_lettered_in_part(line: Line, size: str) -> None:
    """1,000,000 bytes, and the largest record the topic takes (max.message.bytes less the batch's framing; one byte
    more is refused), from an idempotent librdkafka producer without compression: far over the contract's
    max_event_bytes (262,144), the worker dead-letters it as too_large, in part, and scores what comes next."""
    p = line.pipeline
    cid = f"c-{size}"
    key = cid.encode()
    n = 1_000_000 if size == "1MB" else KAFKA_MAX_MESSAGE_BYTES - ONE_RECORD_BATCH_OVERHEAD - len(key)
    event = _event_of_size(cid, n)
    producer = _confluent(p.bootstrap, config={"message.max.bytes": LARGE_PRODUCER_LIMIT})
    [(err, partition, offset)] = _send(producer, p.topic("events"), [(key, event)])
    assert err is None, err
    if size == "largest":
        [(err, _, _)] = _send(producer, p.topic("events"), [(key, _event_of_size(cid, n + 1))])
        assert err is not None and err.code() == KafkaError.MSG_SIZE_TOO_LARGE, err

    def letter():
        return [m for m in _read_topic(p, "dead_letter") if m.key == key]

    [message] = wait_for(letter, timeout=60, interval=0.5, what=f"the dead letter of {cid}")
    p.check_too_large_dead_letter(message, event, key, partition, offset)

    after = line.take(1)  # the worker goes on
    _publish_confluent(p, [(i.key, i.raw) for i in line.conversations[after[0]]], "none")
    assert _wait_scored_once(line, set(after))[after[0]].status == "scored"
    _wait_sink_committed(p)
    line.scored.update(after)
    assert line.worker.popen.poll() is None


# ------------------------------------------------------------------ the store, last


def test_every_conversation_the_module_sent_is_stored_once(line: Line) -> None:
    if not line.scored:
        pytest.skip("no test of this module sent conversations")
    line.sink.terminate()
    assert line.sink.popen.returncode == 0, line.sink.log_tail()
    rows = line.pipeline.query_store(
        "SELECT 'score' AS t, conversation_id, status AS v FROM convowatch.conversation_scores FINAL "
        "UNION ALL SELECT 'thumb' AS t, conversation_id, rating AS v FROM convowatch.feedback FINAL"
    )
    sent = line.scored | line.thumbs  # a case that failed is left out
    got = sorted((r["t"], r["conversation_id"], r["v"]) for r in rows if r["conversation_id"] in sent)
    assert got == sorted([("score", cid, "scored") for cid in line.scored] + [("thumb", cid, "down") for cid in line.thumbs])
