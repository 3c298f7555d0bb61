"""Run the real service for end-to-end tests: worker and sink processes on a real broker, read back for real.

Each `Pipeline` has its own topics, consumer groups and embedded ClickHouse
directory on the shared session broker, so tests do not see each other's data.
The store is read by a separate process (`query_store`) once the sink has
stopped: a chDB directory can be open in one process only, and the test
process already owns another engine.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from kafka import KafkaConsumer, KafkaProducer
from prometheus_client.parser import text_string_to_metric_families

from stream.contract import RECORD_HEADROOM_BYTES
from stream.settings import KafkaSettings
from tests.infra import free_port, wait_for

REPO = Path(__file__).resolve().parents[1]
LLM_RUBRIC_DATA = REPO / "data" / "llm-rubric"
RECORDED_REAL_ANSWERS = LLM_RUBRIC_DATA / "gpt-3.5-turbo-16k_real_evaluations_FIXED.tsv"


@dataclass
class Process:
    name: str
    popen: subprocess.Popen
    log: Path
    metrics_port: int

    def log_tail(self, n: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """Current samples as ``{(name, sorted labels): value}``."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as r:
            text = r.read().decode()
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }

    def metric_sum(self, name: str, **labels: str) -> float:
        """Sum of ``name`` over samples whose labels include ``labels`` (0 if none); an endpoint that cannot be
        reached fails the test (no silent 0)."""
        try:
            samples = self.metrics()
        except OSError as e:
            raise AssertionError(f"{self.name}'s /metrics (port {self.metrics_port}) cannot be read: {e}") from e
        return sum(v for (n, lab), v in samples.items() if n == name and all((k, val) in lab for k, val in labels.items()))

    def terminate(self, timeout: float = 30) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()

    def kill9(self) -> None:
        self.popen.kill()
        self.popen.wait()


@dataclass
class Pipeline:
    """Settings and processes of one isolated pipeline on the session broker."""

    root: Path
    bootstrap: str
    rubric_set: Path | None  # None for both: a scorer registry (scoring.registry in extra_env) names them
    calibrator: Path | None
    partitions: int = 4
    extra_env: dict[str, str] = field(default_factory=dict)
    processes: list[Process] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.tag = uuid.uuid4().hex[:8]
        self.store_dir = self.root / "clickhouse"

    @property
    def env(self) -> dict[str, str]:
        t = self.tag
        return {
            "CONVOWATCH_KAFKA__BOOTSTRAP_SERVERS": self.bootstrap,
            "CONVOWATCH_KAFKA__EVENTS_TOPIC": f"{t}.events",
            "CONVOWATCH_KAFKA__CLOSED_TOPIC": f"{t}.closed",
            "CONVOWATCH_KAFKA__SCORES_TOPIC": f"{t}.scores",
            "CONVOWATCH_KAFKA__DEAD_LETTER_TOPIC": f"{t}.dead-letters",
            "CONVOWATCH_KAFKA__APP_ID": f"convowatch-{t}",
            "CONVOWATCH_KAFKA__DATA_DIR": str(self.root / "state" / "worker"),  # not there yet, as on a fresh checkout
            "CONVOWATCH_KAFKA__SINK_GROUP": f"sink-{t}",
            "CONVOWATCH_KAFKA__PARTITIONS": str(self.partitions),
            "CONVOWATCH_JUDGE__BACKEND": "recorded",
            "CONVOWATCH_JUDGE__RECORDED_ANSWERS": str(RECORDED_REAL_ANSWERS),
            **({"CONVOWATCH_RUBRIC_SET": str(self.rubric_set)} if self.rubric_set is not None else {}),
            **({"CONVOWATCH_CALIBRATOR": str(self.calibrator)} if self.calibrator is not None else {}),
            "CONVOWATCH_SCORING__QUESTIONS": str(LLM_RUBRIC_DATA / "questions.json"),
            "CONVOWATCH_STORE__DSN": f"chdb://{self.store_dir}",
            "CONVOWATCH_STORE__FLUSH_INTERVAL_S": "0.5",
            "CONVOWATCH_ASSEMBLY__IDLE_CHECK_INTERVAL_S": "1",
            **self.extra_env,
        }

    def topic(self, name: str) -> str:
        return self.env[f"CONVOWATCH_KAFKA__{name.upper()}_TOPIC"]

    def worker_group(self, topic: str) -> str:
        """The workers' consumer group that reads ``topic`` (events or closed): Faust's, the app id, or with
        ``kafka.consumer`` batch the stage's (``<app_id>-assemble``, ``<app_id>-score``)."""
        app_id = self.env["CONVOWATCH_KAFKA__APP_ID"]
        if self.env.get("CONVOWATCH_KAFKA__CONSUMER", KafkaSettings().consumer) == "faust":
            return app_id
        stage = {"events": "assemble", "closed": "score"}[topic]
        return f"{app_id}-{stage}"

    def _start(self, name: str, command: str, env: Mapping[str, str] | None = None, cli_options: Sequence[str] = ()) -> Process:
        """Start ``convowatch [cli_options] command`` (e.g. ``("-v",)`` for DEBUG logs) as process ``name``."""
        port = free_port()
        log = self.root / f"{name}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        # Static group membership per process name, as the production units set it: a worker killed and started
        # again under its name takes its partitions back at once.
        full_env = {
            **os.environ,
            **self.env,
            "CONVOWATCH_METRICS__PORT": str(port),
            "CONVOWATCH_KAFKA__GROUP_INSTANCE_ID": f"{self.tag}-{name}",
            **(env or {}),
        }
        with log.open("ab") as out:
            popen = subprocess.Popen(
                [sys.executable, "-m", "stream.commands.cli", *cli_options, command],
                cwd=REPO,
                env=full_env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        proc = Process(name, popen, log, port)
        self.processes.append(proc)

        def up() -> bool:
            if popen.poll() is not None:
                raise AssertionError(f"{name} exited with {popen.returncode}:\n{proc.log_tail()}")
            try:
                proc.metrics()
                return True
            except OSError:
                return False

        wait_for(up, timeout=60, what=f"{name} metrics endpoint")
        return proc

    def start_worker(
        self, name: str = "worker", env: Mapping[str, str] | None = None, cli_options: Sequence[str] = ()
    ) -> Process:
        return self._start(name, "run", env, cli_options)

    def start_sink(self, name: str = "sink", env: Mapping[str, str] | None = None, cli_options: Sequence[str] = ()) -> Process:
        return self._start(name, "sink", env, cli_options)

    def wait_assigned(self, workers: Iterable[Process], timeout: float = 90, each_at_least: int = 1) -> None:
        """Until the workers together own every partition, each at least ``each_at_least``."""
        workers = list(workers)

        def balanced() -> bool:
            owned = [w.metric_sum("convowatch_assigned_partitions") for w in workers]
            return sum(owned) == self.partitions and min(owned) >= each_at_least

        wait_for(balanced, timeout=timeout, interval=0.5, what="partition assignment")

    def replay(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "stream.commands.cli", "replay", *args],
            cwd=REPO,
            env={**os.environ, **self.env},
            capture_output=True,
            text=True,
            check=check,
            timeout=300,
        )

    def produce(self, records: Iterable[tuple[bytes | None, bytes | None]], max_request_size: int = 1_048_576) -> int:
        """Send raw (key, value) records to the events topic, byte for byte."""
        return self.produce_to("events", records, max_request_size)

    def produce_to(
        self, topic: str, records: Iterable[tuple[bytes | None, bytes | None]], max_request_size: int = 1_048_576
    ) -> int:
        """Send raw (key, value) records to this pipeline's ``topic`` (events, closed, scores, dead_letter); a record
        the broker refuses raises here (as the user's producer would see it), after the others were sent."""
        producer = KafkaProducer(bootstrap_servers=self.bootstrap, acks="all", max_request_size=max_request_size)
        try:
            sent = [producer.send(self.topic(topic), key=key, value=value) for key, value in records]
            producer.flush()
            for future in sent:
                future.get(timeout=60)
        finally:
            producer.close()
        return len(sent)

    def consume(self, topic: str, expect: int, timeout: float = 120) -> list:
        """Read ``topic`` from the beginning until at least ``expect`` records arrived (or time out)."""
        consumer = KafkaConsumer(
            self.topic(topic),
            bootstrap_servers=self.bootstrap,
            group_id=None,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            consumer_timeout_ms=1000,
        )
        out: list = []
        deadline = time.monotonic() + timeout
        try:
            while len(out) < expect and time.monotonic() < deadline:
                for batch in consumer.poll(timeout_ms=500).values():
                    out.extend(batch)
        finally:
            consumer.close()
        return out

    def check_too_large_dead_letter(
        self, message, original: bytes, key: bytes, partition: int | None = None, offset: int | None = None
    ) -> dict:
        """Check ``message``, a record of the dead-letter topic, is the dead letter of ``original`` (the value of an
        events record with ``key``, at ``partition`` and ``offset`` when given) refused as too_large and too large to
        keep whole (docs/event-contract.md): its value fits in ``kafka.max_record_bytes`` with the headroom the worker
        leaves (`DeadLetter.record_value`), it keeps the start of the original, its size and SHA-256, and says where
        it came from. Returns the dead letter as a dict."""
        max_record_bytes = int(self.env.get("CONVOWATCH_KAFKA__MAX_RECORD_BYTES", KafkaSettings().max_record_bytes))
        letter = json.loads(message.value)
        assert len(message.value) <= max_record_bytes - RECORD_HEADROOM_BYTES, len(message.value)
        assert (letter["reason"], letter["original_truncated"]) == ("too_large", True), letter["reason"]
        assert letter["original_size"] == len(original)
        assert letter["original_sha256"] == hashlib.sha256(original).hexdigest()
        kept = base64.b64decode(letter["original_base64"])
        assert kept and original.startswith(kept)
        assert letter["key_base64"] == base64.b64encode(key).decode("ascii")
        assert letter["topic"] == self.topic("events")
        if partition is not None:
            assert letter["partition"] == partition
        if offset is not None:
            assert letter["offset"] == offset
        return letter

    def query_store(self, sql: str) -> list[dict]:
        """Run a read-only query on this pipeline's embedded store in a fresh process (the sink must be stopped)."""
        return self.query_store_many([sql])[0]

    def query_store_many(self, sqls: Sequence[str]) -> list[list[dict]]:
        """`query_store` of each of ``sqls``, all in one fresh process (each process opens the engine anew)."""
        code = (
            "import json, sys\n"
            "from stream.store import ClickHouseStore\n"
            "with ClickHouseStore(sys.argv[1]) as s:\n"
            "    print(json.dumps([s.query(q) for q in json.loads(sys.stdin.read())], default=str))\n"
        )
        done = subprocess.run(
            [sys.executable, "-c", code, f"chdb://{self.store_dir}"],
            input=json.dumps(list(sqls)),
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120 + 2 * len(sqls),
        )
        if done.returncode != 0:
            raise AssertionError(f"store query failed: {done.stderr[-2000:]}")
        return json.loads(done.stdout.strip().splitlines()[-1])

    def stop_all(self) -> None:
        for proc in self.processes:
            proc.terminate()
