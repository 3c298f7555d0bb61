"""`convowatch replay` as a real subprocess against Apache Kafka: refusing bad files, skipping, usage, no broker.

Each test uses its own topic names (the session broker is shared) and reads the
events topic back with kafka-python.
"""

from __future__ import annotations

import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition
from kafka.admin import NewTopic

from stream.contract import EndEvent, TurnEvent, encode_event
from tests.infra import convowatch, free_port

CONTRACT_ERROR = "lines break the event contract"
CLOSED_PORT_LIMIT_S = 60.0


def kafka_env(bootstrap: str) -> dict[str, str]:
    """CONVOWATCH_KAFKA__* for a fresh set of topic names on ``bootstrap``."""
    tag = uuid.uuid4().hex[:10]
    return {
        "CONVOWATCH_KAFKA__BOOTSTRAP_SERVERS": bootstrap,
        "CONVOWATCH_KAFKA__EVENTS_TOPIC": f"replay-test-{tag}.events",
        "CONVOWATCH_KAFKA__CLOSED_TOPIC": f"replay-test-{tag}.closed",
        "CONVOWATCH_KAFKA__SCORES_TOPIC": f"replay-test-{tag}.scores",
        "CONVOWATCH_KAFKA__DEAD_LETTER_TOPIC": f"replay-test-{tag}.dead-letters",
        "CONVOWATCH_KAFKA__APP_ID": f"replay-test-{tag}",
        "CONVOWATCH_KAFKA__PARTITIONS": "1",
    }


def create_topic(bootstrap: str, topic: str) -> None:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])
    finally:
        admin.close()


def list_topics(bootstrap: str) -> set[str]:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        return set(admin.list_topics())
    finally:
        admin.close()


def read_topic(bootstrap: str, topic: str, wait_ms: int = 3000) -> list[tuple[bytes | None, bytes]]:
    """Every record of partition 0 from the beginning, as (key, value); stops after ``wait_ms`` without one."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, consumer_timeout_ms=wait_ms, enable_auto_commit=False)
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        return [(r.key, r.value) for r in consumer]
    finally:
        consumer.close()


@dataclass
class MixedFile:
    path: Path
    good: list[bytes]  # the valid lines, in file order
    bad: list[tuple[int, str]]  # (line number, reason)
    events: int  # non-blank lines


def write_mixed(tmp_path: Path, extra_bad: int = 0) -> MixedFile:
    t0 = 1_704_067_200.0
    good = [
        encode_event(TurnEvent("conv-a", 0, "user", "Where is my parcel?", t0, {"product": "shop"})),
        encode_event(TurnEvent("conv-a", 1, "assistant", "It arrives tomorrow.", t0 + 5)),
        encode_event(EndEvent("conv-a", t0 + 10)),
    ]
    robot = good[0].replace(b'"role":"user"', b'"role":"robot"')
    negative = good[1].replace(b'"turn_index":1', b'"turn_index":-1')
    lines = [good[0], b"this is not json", good[1], b"", robot, good[2], negative]
    bad = [(2, "not_json"), (5, "unknown_role"), (7, "negative_turn_index")]
    for _ in range(extra_bad):
        lines.append(b'{"schema_version":1}')
        bad.append((len(lines), "missing_field"))
    path = tmp_path / "events.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    return MixedFile(path, good, bad, sum(1 for line in lines if line))


# --- invalid lines -----------------------------------------------------------------------


def test_invalid_lines_refuse_the_file_and_send_nothing(tmp_path: Path, kafka_broker: str) -> None:
    env = kafka_env(kafka_broker)
    events_topic = env["CONVOWATCH_KAFKA__EVENTS_TOPIC"]
    create_topic(kafka_broker, events_topic)  # so the test can read it back
    f = write_mixed(tmp_path)

    r = convowatch("replay", "jsonl", f.path, env=env)

    assert r.returncode == 2, r.stderr
    assert r.stdout == ""
    shown = "; ".join(f"{f.path}:{line}: {reason}" for line, reason in f.bad)
    assert r.stderr.splitlines() == [
        f"convowatch: error: 3 of {f.events} {CONTRACT_ERROR} ({shown}); fix them or pass --skip-invalid"
    ]
    assert read_topic(kafka_broker, events_topic) == []
    assert env["CONVOWATCH_KAFKA__CLOSED_TOPIC"] not in list_topics(kafka_broker)  # the broker was not even touched


def test_the_error_names_at_most_five_lines(tmp_path: Path, kafka_broker: str) -> None:
    f = write_mixed(tmp_path, extra_bad=4)
    r = convowatch("replay", "jsonl", f.path, env=kafka_env(kafka_broker))
    assert r.returncode == 2
    (line,) = r.stderr.splitlines()
    assert line.startswith(f"convowatch: error: 7 of {f.events} {CONTRACT_ERROR} (")
    assert line.count(f"{f.path}:") == 5
    assert f"{f.path}:9: missing_field ...); fix them or pass --skip-invalid" in line
    assert f"{f.path}:10:" not in line


def test_skip_invalid_sends_the_valid_lines_and_reports_the_rest(tmp_path: Path, kafka_broker: str) -> None:
    env = kafka_env(kafka_broker)
    events_topic = env["CONVOWATCH_KAFKA__EVENTS_TOPIC"]
    f = write_mixed(tmp_path)

    r = convowatch("replay", "jsonl", f.path, "--skip-invalid", env=env)

    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"sent 3 events to {events_topic}, skipped 3 invalid"
    skipped = [line.strip() for line in r.stderr.splitlines() if line.strip().startswith("skipped ")]
    assert [s.split(": ")[0] for s in skipped] == [f"skipped {f.path}:{line}" for line, _ in f.bad]
    assert [s.split(": ")[1] for s in skipped] == [reason for _, reason in f.bad]
    assert read_topic(kafka_broker, events_topic) == [(b"conv-a", raw) for raw in f.good]  # byte for byte, keyed, in order
    assert {env[f"CONVOWATCH_KAFKA__{t}_TOPIC"] for t in ("EVENTS", "CLOSED", "SCORES", "DEAD_LETTER")} <= list_topics(
        kafka_broker
    )


# --- usage ---------------------------------------------------------------------------------


@pytest.mark.parametrize("source", ["uss", "jsonl"])
def test_sources_that_need_a_path_say_so(source: str) -> None:
    r = convowatch("replay", source, env=kafka_env(f"127.0.0.1:{free_port()}"), timeout=30)  # refused before any broker call
    assert r.returncode == 2
    assert r.stdout == ""
    assert "Usage: convowatch replay" in r.stderr
    assert f"Error: replay {source} needs a PATH" in r.stderr


def test_a_missing_path_is_a_usage_error(tmp_path: Path) -> None:
    r = convowatch("replay", "jsonl", tmp_path / "nope.jsonl", env=kafka_env(f"127.0.0.1:{free_port()}"), timeout=30)
    assert r.returncode == 2
    assert "does not exist" in r.stderr


# --- no broker -------------------------------------------------------------------------------


@dataclass
class ClosedPortRun:
    port: int
    result: subprocess.CompletedProcess[str]
    elapsed_s: float


@pytest.fixture(scope="module")
def closed_port_run(tmp_path_factory: pytest.TempPathFactory) -> ClosedPortRun:
    """One replay against a port nothing listens on; kafka.admin_timeout_s bounds the wait."""
    f = write_mixed(tmp_path_factory.mktemp("closed-port"))
    port = free_port()
    env = {**kafka_env(f"127.0.0.1:{port}"), "CONVOWATCH_KAFKA__ADMIN_TIMEOUT_S": "5"}
    started = time.monotonic()
    try:
        r = convowatch("replay", "jsonl", f.path, "--skip-invalid", env=env, timeout=CLOSED_PORT_LIMIT_S + 30)
    except subprocess.TimeoutExpired:
        pytest.fail(f"replay against a closed port was still running after {CLOSED_PORT_LIMIT_S + 30:.0f} s")
    return ClosedPortRun(port, r, time.monotonic() - started)


def test_no_broker_is_one_clear_error_in_bounded_time(closed_port_run: ClosedPortRun) -> None:
    r = closed_port_run.result
    assert r.returncode == 2, r.stderr[-2000:]
    assert closed_port_run.elapsed_s < CLOSED_PORT_LIMIT_S
    errors = [line for line in r.stderr.splitlines() if line.startswith("convowatch: error:")]
    assert errors == [r.stderr.splitlines()[-1]]
    assert errors[0].startswith(f"convowatch: error: cannot reach Kafka at 127.0.0.1:{closed_port_run.port}: ")
    assert "Traceback" not in r.stderr
    assert "sent " not in r.stdout


def test_no_broker_prints_only_the_error_line(closed_port_run: ClosedPortRun) -> None:
    assert len(closed_port_run.result.stderr.splitlines()) == 1, closed_port_run.result.stderr
