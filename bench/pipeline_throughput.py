"""Pipeline throughput and latency on the embedded stack (issue 3's benchmark, ``make bench``).

A synthetic workload (``--conversations`` × ``--turns`` turns plus one ``end``
event each, `stream.replay.sources.synthetic_events`) goes through the real service:
Apache Kafka (KRaft, one node: the embedded stack's, deploy/local/stack.py) started here on a free port, ONE worker process
(``convowatch run``) and the sink process (``convowatch sink``) writing to an
embedded ClickHouse (chDB) directory, with the **recorded** GPT-3.5 judge and
a rubric set + calibrator made by the scoring-core commands (as the tests'
``scoring_artifacts`` fixture and ``make demo`` do; cached in ``bench/.cache``).
The worker and the sink run with the Kafka client defaults of stream/settings.py,
as a production user gets them: no client setting is changed for the benchmark.

The recorded judge answers by conversation id, and knows only the 223 real
LLM-Rubric ids. Synthetic conversation k is therefore called
``<real id k mod 223>#<phase>-<k>`` and this script writes a bench-only
answers TSV (the real rows, re-keyed to those ids) that the worker's recorded
judge loads (``CONVOWATCH_JUDGE__RECORDED_ANSWERS``): the service's own code
path, unchanged, with a judge that takes ~0 s.

Measured, in one run:

1. **Worker throughput.** The events topic is pre-loaded with the whole
   workload, then the worker starts; turn events/s is N×turns over the time
   from the worker's first processed event (its ``/metrics``, polled every 0.25 s
   until then, every 2 s after) to the last conversation's ``scored_at`` in the store.
   Also the cores the worker, the sink, the broker and the whole host (``/proc/stat``) used
   over the same window (CPU counters read every 0.05 s; the samples bracketing the
   window count), and of the host's the share the hypervisor stole (a
   VM's steal: time none of these processes could run): the worker shares the
   host with them. How long the worker's threads waited for a core while ready
   to run (``/proc/PID/task/*/schedstat``) says whether they held it back.
   Then the same on a fresh workload with the sink started only once every
   conversation is scored: what one worker does with the host's cores to itself
   (the broker and this script still run beside it). And the same phase (sink
   running) once more with the other consumer path (``kafka.consumer`` faust
   when the run's is batch, and the reverse), on the same broker.
2. **Latency ``end`` → row in ClickHouse.** Fresh topics, worker and sink;
   after a warm-up, the workload is published at a steady rate below capacity
   (default: half the measured all-events rate, at most 1,000 events/s), the
   wall-clock send time of every ``end`` event is kept; after the sink has
   written everything and stopped, each conversation's ``stored_at`` (the row's
   insert time, ``DEFAULT now64(6)``) is read from the store in a separate
   process, and p50/p95/p99/max of ``stored_at − end sent`` are reported, with
   its legs (end sent → ``closed_at`` → ``scored_at`` → ``stored_at``).
   Store settings are the defaults (``flush_interval_s`` 1.0, ``batch_size`` 500).
3. **Raw consume rate** of the same broker: the same pre-loaded topic read from
   the beginning by a plain ``AIOKafkaConsumer`` (no processing), the
   denominator of the worker/raw ratio.
4. **Two workers** (not with ``--quick``): the same workload on fresh topics, published once the group has
   formed (every worker owns partitions, so no join interrupts the count) as record batches encoded before (so
   that publishing takes next to no CPU from the workers; its rate is reported), read by one worker and by two
   workers in one group (4 partitions); the ratio of the two rates, with the sink running and with it started after,
   in ``--scaling-rounds`` rounds (one → two, then two → one, ...): the median ratio is the figure, as a phase's rate
   on a small VM moves by a third from one phase to the next.

Targets (issue 14): ≥ 5,000 turn events/s per worker, p99 ≤ 1 s excluding judge time, and two workers ≥ 1.8×
one. Prints a table and writes
``bench/results/pipeline_throughput.json`` (with the load average: other work
may share the machine; the CPU model and the Kafka version).

Run from the repository root:
``.venv/bin/python bench/pipeline_throughput.py [--conversations 2000 --turns 10] [--quick] [--consumer batch]``
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import dataclasses
import json
import os
import platform
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "bench"):
    if str(path) not in sys.path:  # run as a script from a checkout, or imported as bench.pipeline_throughput
        sys.path.insert(0, str(path))

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402
from results_file import cpu_model  # noqa: E402  (bench/, beside this script)

from deploy.local.kafka import kafka_version  # noqa: E402
from deploy.local.stack import StackConfig, start_kafka, stop  # noqa: E402
from stream.contract import EndEvent, TurnEvent  # noqa: E402
from stream.replay.publisher import publish  # noqa: E402
from stream.replay.sources import ReplayItem, synthetic_events  # noqa: E402
from stream.settings import KafkaSettings, StoreSettings  # noqa: E402
from stream.topics import ensure_topics  # noqa: E402

DATA = ROOT / "data" / "llm-rubric"
REAL_ANSWERS = DATA / "gpt-3.5-turbo-16k_real_evaluations_FIXED.tsv"
SYNTH_ANSWERS = DATA / "gpt-3.5-turbo-16k_synth_evaluations_FIXED.tsv"
CACHE = ROOT / "bench" / ".cache" / "pipeline-scoring-artifacts"
OUTPUT = ROOT / "bench" / "results" / "pipeline_throughput.json"

TARGET_TURN_EVENTS_PER_S = 5000.0  # issue 14
TARGET_P99_S = 1.0
TARGET_TWO_WORKERS_SPEEDUP = 1.8  # two workers on the 4-partition topic against one, in the same run
MAX_LATENCY_RATE = 1000.0  # events/s: the latency phase's rate is at most this
LATENCY_PHASE_SECONDS = 60.0  # the latency phase sends at most about this long
WARMUP_CONVERSATIONS = 20
PARTITIONS = 4
PUBLISH_BATCH_BYTES = 1_048_576  # publish_prebuilt: a record batch holds up to this many bytes
START_POLL_S = 0.25  # /metrics polls of the worker until its first event: when processing starts
# ... then until the last conversation is scored. Each poll costs the worker a /metrics page (~25 ms of CPU with a
# few thousand conversations' attribute series, holding the GIL): at 4 polls/s that was ~10 % of its samples. The
# end is read from the store (the last conversation's scored_at), so slow polls cost no precision.
PROGRESS_POLL_S = 2.0
CPU_SAMPLE_S = 0.05  # meanwhile, /proc CPU counters this often (CpuSamples): the CPU window is the phase's, to within this

# The Kafka client tuning of stream/settings.py that the worker and the sink run with (their defaults), recorded
# with the figures.
CLIENT_SETTINGS = (
    "session_timeout_s",
    "heartbeat_interval_s",
    "max_poll_interval_s",
    "commit_interval_s",
    "fetch_max_wait_s",
    "max_poll_records",
    "max_record_bytes",
    "group_instance_id",
)


class BenchError(RuntimeError):
    """The benchmark could not run (a process died, a wait timed out, results are incomplete)."""


# ---------------------------------------------------------------- small helpers


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_ports(n: int) -> list[int]:
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in sockets]
    finally:
        for s in sockets:
            s.close()


def wait_until(predicate: Callable[[], bool], timeout: float, what: str, interval: float = 0.2) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise BenchError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolation percentile (numpy's default), ``q`` in 0..100."""
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


# ---------------------------------------------------------------- scoring artifacts and judge answers


def scoring_artifacts(cache: Path) -> tuple[Path, Path]:
    """(rubric set, calibrator) by the scoring-core CLI from LLM-Rubric's synthetic data, as tests/conftest.py makes them."""
    rubric_set, calibrator, done = cache / "rubricset.json", cache / "calibrator", cache / "done"
    if done.exists() and rubric_set.exists() and calibrator.exists():
        return rubric_set, calibrator
    cache.mkdir(parents=True, exist_ok=True)
    cw = [sys.executable, "-m", "stream.commands.cli"]
    env = {**os.environ, "CONVOWATCH_JUDGE__BACKEND": "recorded", "CONVOWATCH_JUDGE__RECORDED_ANSWERS": str(SYNTH_ANSWERS)}
    steps = [
        [
            "data",
            "llm-rubric",
            "--data-dir",
            str(DATA),
            "--split",
            "synth",
            "--labelled-out",
            str(cache / "synth.jsonl"),
            "--rubric-set-out",
            str(cache / "unfitted.json"),
        ],
        [
            "rubrics",
            "fit",
            "--rubric-set",
            str(cache / "unfitted.json"),
            "--labelled",
            str(cache / "synth.jsonl"),
            "--out",
            str(rubric_set),
        ],
        [
            "calibrate",
            "train",
            "--judge-answers",
            str(SYNTH_ANSWERS),
            "--human-labels",
            str(DATA / "human_judges_synth_all_FIXED_ANON.tsv"),
            "--questions",
            str(DATA / "questions.json"),
            "--grid",
            "none",
            "--out",
            str(calibrator),
        ],
    ]
    for step in steps:
        print(f"  convowatch {' '.join(step[:2])} ...", flush=True)
        done_step = subprocess.run(cw + step, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
        if done_step.returncode != 0:
            raise BenchError(f"`convowatch {' '.join(step)}` failed:\n{done_step.stdout[-2000:]}{done_step.stderr[-2000:]}")
    done.write_text("ok\n")
    return rubric_set, calibrator


def real_answer_rows() -> tuple[list[str], dict[str, list[dict[str, str]]]]:
    """The real evaluations TSV: its header and its rows grouped by conversation id (ids sorted)."""
    with REAL_ANSWERS.open(encoding="utf-8", newline="") as f:
        reader = csv.DictReader(f, delimiter="\t")
        header = list(reader.fieldnames or [])
        rows: dict[str, list[dict[str, str]]] = {}
        for row in reader:
            rows.setdefault(row["text_id"], []).append(row)
    return header, dict(sorted(rows.items()))


def write_judge_answers(path: Path, header: list[str], rows: Mapping[str, list[dict[str, str]]], ids: Mapping[str, str]) -> None:
    """A recorded-answers TSV for the synthetic ids: ``ids`` maps each synthetic id to the real id whose answers it reuses."""
    with path.open("w", encoding="utf-8", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=header, delimiter="\t", lineterminator="\n")
        writer.writeheader()
        for synthetic_id, real_id in ids.items():
            for row in rows[real_id]:
                writer.writerow({**row, "text_id": synthetic_id})


@dataclass
class Workload:
    """Encoded events of one phase and what the judge must know about its conversation ids."""

    items: list[ReplayItem]
    ids: dict[str, str]  # synthetic id -> real id (for the judge answers)

    @property
    def conversations(self) -> int:
        return len(self.ids)

    @property
    def turn_events(self) -> int:
        return sum(isinstance(i.event, TurnEvent) for i in self.items)


def workload(phase: str, n: int, turns: int, seed: int, real_ids: list[str], event_interval_s: float = 0.01) -> Workload:
    """`synthetic_events` with conversation k renamed ``<real_ids[k mod len]>#<phase>-<k>`` (k in order of first event)."""
    renamed: dict[str, str] = {}
    ids: dict[str, str] = {}
    items = []
    for item in synthetic_events(n, turns, seed=seed, event_interval_s=event_interval_s):
        assert item.event is not None  # synthetic events are valid events
        old = item.event.conversation_id
        new = renamed.get(old)
        if new is None:
            k = len(renamed)
            real = real_ids[k % len(real_ids)]
            new = renamed[old] = f"{real}#{phase}-{k}"
            ids[new] = real
        items.append(ReplayItem.of(dataclasses.replace(item.event, conversation_id=new), new))
    return Workload(items, ids)


# ---------------------------------------------------------------- service processes


def metric_sum(samples: Mapping[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    """Sum of ``name`` over ``samples`` (`Service.samples`) whose labels include ``labels``."""
    return sum(v for (n, lab), v in samples.items() if n == name and all((k, x) in lab for k, x in labels.items()))


@dataclass
class Service:
    """A `convowatch run|sink` process with its /metrics port and log."""

    name: str
    popen: subprocess.Popen
    log: Path
    port: int

    def samples(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as r:
            text = r.read().decode()
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text)
            for s in fam.samples
        }

    def metric(self, name: str, **labels: str) -> float:
        """Sum of ``name`` over samples with ``labels`` (0 if unreachable); raises if the process died."""
        self.check_alive()
        try:
            samples = self.samples()
        except OSError:
            return 0.0
        return metric_sum(samples, name, **labels)

    def check_alive(self) -> None:
        if self.popen.poll() is not None:
            tail = "\n".join(self.log.read_text(errors="replace").splitlines()[-30:])
            raise BenchError(f"{self.name} exited with {self.popen.returncode}:\n{tail}")

    def terminate(self, timeout: float = 30) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()


@dataclass
class Pipeline:
    """Topic names, store directory and environment of one isolated pipeline on the bench broker."""

    root: Path
    tag: str
    bootstrap: str
    base_env: Mapping[str, str]
    broker_pid: int
    services: list[Service] = dataclasses.field(default_factory=list)

    @property
    def store_dir(self) -> Path:
        return self.root / f"clickhouse-{self.tag}"

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
            "CONVOWATCH_KAFKA__SINK_GROUP": f"sink-{t}",
            "CONVOWATCH_KAFKA__PARTITIONS": str(PARTITIONS),
            "CONVOWATCH_STORE__DSN": f"chdb://{self.store_dir}",
            **self.base_env,
        }

    def kafka_settings(self) -> KafkaSettings:
        e = self.env
        return KafkaSettings(
            bootstrap_servers=self.bootstrap,
            events_topic=e["CONVOWATCH_KAFKA__EVENTS_TOPIC"],
            closed_topic=e["CONVOWATCH_KAFKA__CLOSED_TOPIC"],
            scores_topic=e["CONVOWATCH_KAFKA__SCORES_TOPIC"],
            dead_letter_topic=e["CONVOWATCH_KAFKA__DEAD_LETTER_TOPIC"],
            app_id=e["CONVOWATCH_KAFKA__APP_ID"],
            partitions=PARTITIONS,
        )

    def start(self, name: str, command: str) -> Service:
        port = free_port()
        log = self.root / f"{self.tag}-{name}.log"
        # No CONVOWATCH_* setting of the caller's shell reaches the service: its Kafka client runs with the defaults.
        clean = {k: v for k, v in os.environ.items() if not k.startswith("CONVOWATCH_")}
        env = {**clean, **self.env, "CONVOWATCH_METRICS__PORT": str(port)}
        with log.open("ab") as out:
            popen = subprocess.Popen(
                [sys.executable, "-m", "stream.commands.cli", command],
                cwd=ROOT,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        service = Service(name, popen, log, port)
        self.services.append(service)

        def up() -> bool:
            service.check_alive()
            try:
                service.samples()
                return True
            except OSError:
                return False

        wait_until(up, 120, f"the {name}'s metrics endpoint")
        return service

    def query_store(self, sql: str) -> list[dict]:
        """A read-only query on this pipeline's chDB store, in a fresh process (one chDB per process; the sink must be stopped)."""
        code = (
            "import json, sys\n"
            "from stream.store import ClickHouseStore\n"
            "with ClickHouseStore(sys.argv[1]) as s:\n"
            "    print(json.dumps(s.query(sys.argv[2]), default=str))\n"
        )
        done = subprocess.run(
            [sys.executable, "-c", code, f"chdb://{self.store_dir}", sql], cwd=ROOT, capture_output=True, text=True, timeout=300
        )
        if done.returncode != 0:
            raise BenchError(f"store query failed: {done.stderr[-2000:]}")
        return json.loads(done.stdout.strip().splitlines()[-1])

    def stop_all(self) -> None:
        for service in reversed(self.services):
            service.terminate()


def scored(worker: Service) -> float:
    return worker.metric("convowatch_conversations_scored_total") + worker.metric("convowatch_conversations_unscored_total")


def store_check(pipeline: Pipeline, expect_ids: Iterable[str]) -> dict:
    """Rows per conversation in the store: every expected id scored, none missing."""
    rows = pipeline.query_store(
        "SELECT conversation_id, countIf(status = 'scored') AS scored, count() AS rows, "
        "min(toUnixTimestamp64Micro(stored_at)) AS stored_us, min(toUnixTimestamp64Micro(closed_at)) AS closed_us, "
        "min(toUnixTimestamp64Micro(scored_at)) AS scored_us, avg(judge_latency_s) AS judge_latency_s "
        "FROM convowatch.conversation_scores GROUP BY conversation_id"
    )
    by_id = {r["conversation_id"]: r for r in rows}
    expect = set(expect_ids)
    missing = sorted(expect - set(by_id))
    unscored = sorted(cid for cid in expect & set(by_id) if int(by_id[cid]["scored"]) == 0)
    if missing or unscored:
        raise BenchError(
            f"store incomplete: {len(missing)} conversations missing (e.g. {missing[:3]}), "
            f"{len(unscored)} unscored (e.g. {unscored[:3]})"
        )
    return by_id


# ---------------------------------------------------------------- phase 1 and 3: throughput, raw consume


async def publish_prebuilt(bootstrap: str, topic: str, items: list[ReplayItem], go: threading.Event) -> dict:
    """Encode ``items`` (all valid) into Kafka record batches of up to 1 MB per partition, wait for ``go``, then send
    the batches: a phase whose workers read while the workload is published then measures the workers, not a
    publisher encoding records beside them on the same cores (the replay publisher, kafka-python a record at a time,
    sends ~10,000 events/s; aiokafka's `send` some 11,000-31,000 in large batches, using a core meanwhile). Keys go
    to the partitions `publish` would choose (murmur2, as kafka-python's default partitioner)."""
    from aiokafka import AIOKafkaProducer
    from aiokafka.partitioner import DefaultPartitioner
    from aiokafka.producer.message_accumulator import BatchBuilder

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", max_batch_size=PUBLISH_BATCH_BYTES)
    await producer.start()
    try:
        t = time.perf_counter()
        partitions = sorted(await producer.partitions_for(topic))
        partition_of = DefaultPartitioner()
        batches: list[tuple[int, BatchBuilder]] = []
        filling: dict[int, BatchBuilder] = {}
        for item in items:
            p = partition_of(item.key, partitions, partitions)
            batch = filling.setdefault(p, producer.create_batch())
            if batch.append(key=item.key, value=item.raw, timestamp=None) is None:  # full
                batches.append((p, batch))
                batch = filling[p] = producer.create_batch()
                batch.append(key=item.key, value=item.raw, timestamp=None)
        batches.extend(filling.items())
        for _, batch in batches:
            batch.close()
        encode_seconds = time.perf_counter() - t
        await asyncio.to_thread(go.wait)
        t, sent_from = time.perf_counter(), time.time()
        sends = [await producer.send_batch(batch, topic, partition=p) for p, batch in batches]  # in order per partition
        await asyncio.gather(*sends)
        seconds = time.perf_counter() - t
    finally:
        await producer.stop()
    return {
        "events": len(items),
        "batches": len(batches),
        "encode_seconds_before": round(encode_seconds, 3),
        "sent_from": sent_from,  # wall-clock time.time() of the first batch's send
        "seconds": round(seconds, 3),
        "events_per_s": round(len(items) / seconds, 1),
    }


def preload(pipeline: Pipeline, work: Workload) -> dict:
    ensure_topics(pipeline.kafka_settings())
    t = time.perf_counter()
    report = publish(work.items, pipeline.kafka_settings(), speed=0)
    seconds = time.perf_counter() - t
    if report.sent != len(work.items):
        raise BenchError(f"pre-load sent {report.sent} of {len(work.items)} events: {report.skipped_where[:3]}")
    return {"events": report.sent, "seconds": round(seconds, 3), "events_per_s": round(report.sent / seconds, 1)}


async def _raw_consume(bootstrap: str, topic: str, expect: int, timeout: float) -> dict:
    from aiokafka import AIOKafkaConsumer

    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=bootstrap, group_id=None, auto_offset_reset="earliest", enable_auto_commit=False
    )
    await consumer.start()  # connection and metadata: not counted, as the worker's figure starts at its first event
    started = last = time.perf_counter()
    try:
        n = 0
        deadline = time.monotonic() + timeout
        while n < expect:
            if time.monotonic() > deadline:
                raise BenchError(f"raw consumer read {n} of {expect} events in {timeout:.0f} s")
            batches = await consumer.getmany(timeout_ms=1000, max_records=10_000)
            got = sum(len(msgs) for msgs in batches.values())
            if got:
                n += got
                last = time.perf_counter()
    finally:
        await consumer.stop()
    seconds = last - started
    return {"events": n, "seconds": round(seconds, 4), "events_per_s": round(n / seconds, 1)}


def raw_consume(pipeline: Pipeline, expect: int, repeats: int = 3) -> dict:
    """Plain aiokafka read of the pre-loaded events topic from the beginning (no processing); the best of ``repeats`` runs."""
    runs = [
        asyncio.run(_raw_consume(pipeline.bootstrap, pipeline.env["CONVOWATCH_KAFKA__EVENTS_TOPIC"], expect, 300))
        for _ in range(repeats)
    ]
    return {"runs": runs, "events_per_s": max(r["events_per_s"] for r in runs)}


def throughput(
    pipeline: Pipeline,
    work: Workload,
    timeout: float,
    workers: int = 1,
    publish_after_join: bool = False,
    sink_after: bool = False,
) -> dict:
    """Start the sink, then ``workers`` workers; time first processed event → last conversation scored (sums over
    the workers' /metrics). The topic is pre-loaded, or with ``publish_after_join`` the workload is published once
    every worker owns partitions (so no group join happens while the workload is processed). With ``sink_after`` the
    sink starts only once every conversation is scored, so the workers do not share the host's cores with it."""
    total = len(work.items)
    sink = None if sink_after else pipeline.start("sink", "sink")
    started, wall_started = time.perf_counter(), time.time()
    procs = [pipeline.start(f"worker-{i}" if workers > 1 else "worker", "run") for i in range(workers)]
    up = time.perf_counter()
    publish_errors: list[Exception] = []
    published: dict[str, float] = {}
    if publish_after_join:
        go = threading.Event()  # set once the group has formed: the batches are encoded meanwhile

        def publish_workload() -> None:
            try:
                k = pipeline.kafka_settings()
                published.update(asyncio.run(publish_prebuilt(k.bootstrap_servers, k.events_topic, work.items, go)))
            except Exception as e:  # reported by the loop below
                publish_errors.append(e)

        publisher = threading.Thread(target=publish_workload, daemon=True)
        publisher.start()
        try:
            wait_until(
                lambda: (
                    [w.metric("convowatch_assigned_partitions") > 0 for w in procs] == [True] * workers
                    and sum(w.metric("convowatch_assigned_partitions") for w in procs) == PARTITIONS
                ),
                180,
                "every worker to own partitions",
                interval=1.0,
            )
        finally:
            go.set()
    timeline: list[tuple[float, float, float]] = []  # (t, events processed, conversations scored)
    t_first = None  # wall-clock time.time(), as the store's closed_at and scored_at
    # The worker shares the host with the sink and the broker: what they used over the same window shows whether the
    # host's cores, not the worker, were the limit.
    usage = CpuSamples(None if sink is None else sink.popen.pid, pipeline.broker_pid, [w.popen.pid for w in procs])
    usage.take()
    wall_previous = time.time()
    deadline = time.monotonic() + timeout
    all_scored = False
    while not all_scored:
        if publish_errors:
            raise BenchError(f"publishing the workload failed: {publish_errors[0]}")
        if time.monotonic() > deadline:
            raise BenchError(
                f"workers processed {timeline[-1][1] if timeline else 0:.0f} of {total} events and scored "
                f"{timeline[-1][2] if timeline else 0:.0f} of {work.conversations} conversations in {timeout:.0f} s"
            )
        events = sum(w.metric("convowatch_events_total") for w in procs)
        done = sum(scored(w) for w in procs)
        wall = time.time()
        timeline.append((round(time.perf_counter() - started, 3), events, done))
        if events > 0 and t_first is None:
            t_first = (wall + wall_previous) / 2  # the first event was processed between the previous poll and this one
        all_scored = done >= work.conversations
        wall_previous = wall
        next_poll = time.monotonic() + (START_POLL_S if t_first is None else PROGRESS_POLL_S)
        while not all_scored and (now := time.monotonic()) < next_poll:
            usage.take()
            time.sleep(min(CPU_SAMPLE_S, next_poll - now))
    usage.take()
    if sink is None:
        sink = pipeline.start("sink", "sink")
    wait_until(
        lambda: sink.metric("convowatch_sink_rows_total", table="conversation_scores") >= work.conversations,
        300,
        "the sink to store every conversation",
    )
    lifetime_cpu = {s.name: cpu_seconds(s) for s in (*procs, sink)}
    pipeline.stop_all()
    by_id = store_check(pipeline, work.ids)
    assert t_first is not None  # the first event comes before the last score
    if publish_after_join:
        # The workers read each record as it arrives, and the whole workload is sent within ~0.1 s: its first send is
        # a start as precise as the store's end (a poll of /metrics waits for a busy worker's GIL: at 1 s phases, the
        # first event's time between two polls was a large part of the window).
        publisher.join(60)
        if publish_errors or "sent_from" not in published:
            raise BenchError(f"publishing the workload did not finish: {publish_errors[:1]}")
        t_first = published["sent_from"]
    # The last conversation closed when the worker processed its end, the last event of the workload.
    t_events = max(int(r["closed_us"]) for r in by_id.values()) / 1e6
    t_scored = max(int(r["scored_us"]) for r in by_id.values()) / 1e6
    seconds = t_scored - t_first
    events_seconds = t_events - t_first
    used = usage.between(t_first, t_scored)
    return {
        "workers": workers,
        "sink": "started after every conversation was scored" if sink_after else "running throughout",
        "worker_start_to_metrics_s": round(up - started, 2),
        "worker_start_to_first_event_s": round(t_first - wall_started, 2),
        "seconds_first_event_to_all_scored": round(seconds, 3),
        "seconds_first_event_to_all_events_processed": round(events_seconds, 3),
        "turn_events_per_s": round(work.turn_events / seconds, 1),
        "all_events_per_s": round(total / seconds, 1),
        "assembly_only_events_per_s": round(total / events_seconds, 1),
        "conversations_per_s": round(work.conversations / seconds, 1),
        "cpu_seconds_process_lifetime": lifetime_cpu,
        "cpu_window_s": used["window_s"],  # the samples bracketing first event → last score
        "worker_cpu_seconds_first_event_to_all_scored": used["workers_cpu_seconds"],
        "worker_cpu_utilisation": round(used["workers_cpu_seconds"] / used["window_s"], 3),  # 1.0: a core busy
        "turn_events_per_worker_cpu_second": round(work.turn_events / max(used["workers_cpu_seconds"], 1e-9), 1),
        "same_window_cores": used["cores"],
        "timeline_sampled": timeline[:: max(1, len(timeline) // 60)],
        **({"published_while_processing": published} if publish_after_join else {}),
    }


def cpu_seconds(service: Service) -> float:
    """User + system CPU seconds used so far by a live process (/proc/PID/stat)."""
    return process_cpu_seconds(service.popen.pid)


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds used so far by the live process ``pid`` (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return round((int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"), 2)


def run_queue_wait_seconds(pid: int) -> float:
    """Seconds the live process ``pid``'s threads have spent ready to run but waiting for a CPU (/proc/PID/task/*/schedstat,
    second field, nanoseconds): on a host whose cores are all busy, the CPU a process did not get."""
    waited = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            waited += int((task / "schedstat").read_text().split()[1])
        except (OSError, IndexError, ValueError):  # a thread that ended meanwhile
            continue
    return waited / 1e9


def host_busy_cpu_seconds() -> tuple[float, float]:
    """CPU seconds all of the host's CPUs were not available so far, and of them stolen (/proc/stat: every state but
    idle and iowait; steal is the time the hypervisor ran other guests, which a VM's processes cannot use)."""
    ticks = [int(t) for t in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    hz = os.sysconf("SC_CLK_TCK")
    # user nice system idle iowait irq softirq steal
    return (sum(ticks[:8]) - ticks[3] - ticks[4]) / hz, ticks[7] / hz


class CpuSamples:
    """CPU counters of the workers, the sink, the broker and the whole host, read from /proc every `take` (cheap: no
    worker takes part, unlike a /metrics poll). `between` gives what was used between the last sample at or before one
    wall-clock time and the first at or after another: the phase's exact window, read from the store afterwards, give
    or take a sampling interval (the polls of /metrics that find the end are seconds apart)."""

    def __init__(self, sink_pid: int | None, broker_pid: int, worker_pids: list[int]) -> None:
        self.sink_pid, self.broker_pid, self.worker_pids = sink_pid, broker_pid, worker_pids
        self.samples: list[tuple[float, ...]] = []

    def take(self) -> None:
        self.samples.append(
            (
                time.time(),
                sum(map(process_cpu_seconds, self.worker_pids)),
                0.0 if self.sink_pid is None else process_cpu_seconds(self.sink_pid),
                process_cpu_seconds(self.broker_pid),
                *host_busy_cpu_seconds(),
                sum(map(run_queue_wait_seconds, self.worker_pids)),
            )
        )

    def between(self, t_start: float, t_end: float) -> dict[str, Any]:
        """The workers' CPU seconds, and the cores of the sink, the broker and the host (and stolen from it),
        and how long the workers' threads were ready to run but waited for a core (the kernel's run-queue wait), all
        averaged over the samples bracketing ``t_start``..``t_end`` (1.0: one core all the time)."""
        first = max((s for s in self.samples if s[0] <= t_start), default=self.samples[0], key=lambda s: s[0])
        last = min((s for s in self.samples if s[0] >= t_end), default=self.samples[-1], key=lambda s: s[0])
        seconds = last[0] - first[0]
        workers_cpu, sink, broker, host, stolen, waited = (b - a for a, b in zip(first[1:], last[1:]))
        cores: dict[str, float | None] = {
            "sink": None if self.sink_pid is None else sink / seconds,
            "broker": broker / seconds,
            "host": host / seconds,
            "host_stolen": stolen / seconds,
            "workers_waiting_for_a_core": waited / seconds,
        }
        return {
            "workers_cpu_seconds": round(workers_cpu, 2),
            "window_s": round(seconds, 3),
            "cores": {**{name: None if v is None else round(v, 2) for name, v in cores.items()}, "host_cpus": os.cpu_count()},
        }


# ---------------------------------------------------------------- phase 2: latency


def latency(pipeline: Pipeline, work: Workload, warmup: Workload, rate: float, timeout: float) -> dict:
    """Publish ``work`` at ``rate`` events/s into a warmed-up pipeline; stored_at − end sent per conversation."""
    ensure_topics(pipeline.kafka_settings())
    sink = pipeline.start("sink", "sink")
    worker = pipeline.start("worker", "run")
    publish(warmup.items, pipeline.kafka_settings(), speed=0)
    wait_until(
        lambda: sink.metric("convowatch_sink_rows_total", table="conversation_scores") >= warmup.conversations,
        timeout,
        "the warm-up conversations to be stored",
    )
    wait_until(lambda: worker.metric("convowatch_assigned_partitions") >= PARTITIONS, 60, "the worker to own every partition")

    end_sent: dict[str, float] = {}

    def on_sent(item: ReplayItem) -> None:
        if isinstance(item.event, EndEvent):
            end_sent[item.event.conversation_id] = time.time()

    t = time.perf_counter()
    report = publish(work.items, pipeline.kafka_settings(), speed=1.0, on_sent=on_sent)  # event times are 1/rate apart
    send_seconds = time.perf_counter() - t
    expect = warmup.conversations + work.conversations
    wait_until(
        lambda: sink.metric("convowatch_sink_rows_total", table="conversation_scores") >= expect,
        timeout,
        "the sink to store every conversation",
    )
    sink_batches = sink.metric("convowatch_sink_latency_seconds_count")
    pipeline.stop_all()
    by_id = store_check(pipeline, list(work.ids) + list(warmup.ids))
    lat = [int(by_id[cid]["stored_us"]) / 1e6 - sent for cid, sent in end_sent.items()]
    judge = [float(by_id[cid]["judge_latency_s"]) for cid in work.ids]
    # where the time goes: end sent -> closed by the worker -> scored by the worker -> row inserted by the sink
    legs = {
        "end_sent_to_closed": [int(by_id[cid]["closed_us"]) / 1e6 - sent for cid, sent in end_sent.items()],
        "closed_to_scored": [(int(by_id[cid]["scored_us"]) - int(by_id[cid]["closed_us"])) / 1e6 for cid in end_sent],
        "scored_to_stored": [(int(by_id[cid]["stored_us"]) - int(by_id[cid]["scored_us"])) / 1e6 for cid in end_sent],
    }
    return {
        "conversations": work.conversations,
        "events": report.sent,
        "target_rate_events_per_s": round(rate, 1),
        "achieved_rate_events_per_s": round(report.sent / send_seconds, 1),
        "warmup_conversations": warmup.conversations,
        "sink_batches": sink_batches,
        "end_to_stored_s": {
            "p50": round(percentile(lat, 50), 4),
            "p95": round(percentile(lat, 95), 4),
            "p99": round(percentile(lat, 99), 4),
            "max": round(max(lat), 4),
            "min": round(min(lat), 4),
            "mean": round(statistics.fmean(lat), 4),
            "n": len(lat),
        },
        "legs_s": {
            name: {
                "p50": round(percentile(xs, 50), 4),
                "p99": round(percentile(xs, 99), 4),
                "mean": round(statistics.fmean(xs), 4),
            }
            for name, xs in legs.items()
        },
        "judge_latency_s_mean": round(statistics.fmean(judge), 6),
    }


# ---------------------------------------------------------------- main


@dataclass
class Stack:
    cfg: StackConfig
    bootstrap: str
    broker_pid: int


def start_broker(root: Path, port: int | None = None, controller_port: int | None = None) -> Stack:
    """Apache Kafka (the stack's one KRaft node, its broker settings) under ``root``, on ``port`` or a free one; its
    controller listener on ``controller_port`` or a free one."""
    kafka_port, unused_1, unused_2 = free_ports(3)
    cfg = StackConfig(
        state_dir=root / "stack",
        kafka_port=port or kafka_port,
        kafka_controller_port=controller_port,
        prometheus_port=unused_1,
        alertmanager_port=unused_2,
    )
    broker = start_kafka(cfg)
    return Stack(cfg, broker.url, broker.pid)


def client_settings() -> dict[str, Any]:
    """The Kafka client settings (stream/settings.py defaults) the worker and the sink run with, as recorded."""
    defaults = KafkaSettings()
    return {name: getattr(defaults, name) for name in CLIENT_SETTINGS}


def base_env(rubric_set: Path, calibrator: Path, answers: Path, consumer: str = "batch") -> dict[str, str]:
    """The services' environment: the recorded judge, the scoring artifacts and ``consumer``; the Kafka client settings
    are stream/settings.py's defaults (none is set here)."""
    env = {
        "CONVOWATCH_KAFKA__CONSUMER": consumer,
        "CONVOWATCH_JUDGE__BACKEND": "recorded",
        "CONVOWATCH_JUDGE__RECORDED_ANSWERS": str(answers),
        "CONVOWATCH_RUBRIC_SET": str(rubric_set),
        "CONVOWATCH_CALIBRATOR": str(calibrator),
        "CONVOWATCH_SCORING__QUESTIONS": str(DATA / "questions.json"),
        # log_level stays at its default (INFO): at WARNING or above Faust's worker installs its terminal
        # spinner and sets the root logger to DEBUG, so every aiokafka/Faust debug call builds a LogRecord.
    }
    return env


def run(args: argparse.Namespace, root: Path) -> dict:
    load_before = load()
    print(f"load average before: {load_before}", flush=True)
    print("scoring artifacts (rubric set, calibrator):", flush=True)
    rubric_set, calibrator = scoring_artifacts(CACHE)
    header, rows = real_answer_rows()
    real_ids = list(rows)
    n, turns = args.conversations, args.turns
    work1 = workload("t", n, turns, seed=1, real_ids=real_ids)
    work1c = workload("m", n, turns, seed=1, real_ids=real_ids)
    work1d = workload("o", n, turns, seed=1, real_ids=real_ids)
    work1e = workload("a", n, turns, seed=1, real_ids=real_ids)
    work1f = workload("f", n, turns, seed=1, real_ids=real_ids)
    warm = workload("w", WARMUP_CONVERSATIONS, turns, seed=3, real_ids=real_ids)
    answers = root / "judge-answers.tsv"
    # the latency phase's ids are added once its size is known; write all phases' ids now (a superset is harmless)
    n2_max = n
    work2_ids = {f"{real_ids[k % len(real_ids)]}#l-{k}": real_ids[k % len(real_ids)] for k in range(n2_max)}
    all_ids = {**work1.ids, **work1c.ids, **work1d.ids, **work1e.ids, **work1f.ids, **warm.ids, **work2_ids}
    write_judge_answers(answers, header, rows, all_ids)
    print(
        f"workload: {n} conversations x {turns} turns + end = {len(work1.items)} events; judge answers for "
        f"{len(all_ids)} ids in {answers}",
        flush=True,
    )

    stack = start_broker(root)
    results: dict = {}
    pipelines: list[Pipeline] = []

    def pipeline(tag: str, consumer: str = args.consumer) -> Pipeline:
        """A fresh set of topics and services, stopped at the end."""
        env = base_env(rubric_set, calibrator, answers, consumer=consumer)
        pipelines.append(Pipeline(root, tag, stack.bootstrap, env, stack.broker_pid))
        return pipelines[-1]

    try:
        print(f"Apache Kafka {kafka_version()} on {stack.bootstrap}", flush=True)

        # 1 + 3: throughput (the client defaults) and the raw consume rate of the same topic
        p1 = pipeline("tput")
        results["preload"] = preload(p1, work1)
        print(f"pre-loaded {results['preload']['events']} events in {results['preload']['seconds']} s", flush=True)
        results["raw_consume"] = raw_consume(p1, len(work1.items))
        print(f"raw aiokafka consume: {results['raw_consume']['events_per_s']:.0f} events/s", flush=True)
        results["load_after_raw_consume"] = load()
        timeout = max(600.0, len(work1.items) / 20)
        results["throughput"] = throughput(p1, work1, timeout)
        results["load_after_throughput"] = load()
        tp = results["throughput"]
        print(
            f"worker: {tp['turn_events_per_s']:.0f} turn events/s, "
            f"{tp['all_events_per_s']:.0f} all events/s ({tp['seconds_first_event_to_all_scored']:.1f} s)",
            flush=True,
        )

        # 1b: the same with the sink started once everything is scored: what the worker does with the cores to itself
        p1a = pipeline("tput-sink-after")
        preload(p1a, work1e)
        results["throughput_sink_after"] = throughput(p1a, work1e, timeout, sink_after=True)
        results["load_after_throughput_sink_after"] = load()
        print(
            f"worker, the sink started after it: {results['throughput_sink_after']['turn_events_per_s']:.0f} turn events/s",
            flush=True,
        )

        # 1c: the other consumer path (kafka.consumer), the same phase on the same broker
        other = other_consumer(args.consumer)
        p1o = pipeline(f"tput-{other}", consumer=other)
        preload(p1o, work1f)
        results["throughput_other_consumer"] = {"consumer": other, **throughput(p1o, work1f, timeout)}
        results["load_after_throughput_other_consumer"] = load()
        print(
            f"worker, kafka.consumer {other}: {results['throughput_other_consumer']['turn_events_per_s']:.0f} turn events/s",
            flush=True,
        )

        if not args.quick:
            # 4: one and two workers, each group formed before the workload is published; with the sink running, then
            # with the sink started after (on a small host the sink takes the cores a second worker would use). A
            # phase's rate on this VM moves by a third from one phase to the next, so the pairs run in rounds, in
            # turn one → two and two → one, and the ratio is the rounds' median.
            for r in range(1, args.scaling_rounds + 1):
                for sink_after in (False, True):
                    for workers in (1, 2) if r % 2 else (2, 1):
                        key = scaling_key(workers, sink_after, r)
                        pj = pipeline(key.removeprefix("throughput_").replace("_", "-"))
                        ensure_topics(pj.kafka_settings())
                        work = work1c if workers == 1 else work1d
                        results[key] = throughput(
                            pj, work, timeout, workers=workers, publish_after_join=True, sink_after=sink_after
                        )
                        results[f"load_after_{key}"] = load()
                        print(
                            f"round {r}, {workers} worker(s), joined before publishing"
                            f"{', the sink started after' if sink_after else ''}: "
                            f"{results[key]['turn_events_per_s']:.0f} turn events/s"
                            f" (published at {results[key]['published_while_processing']['events_per_s']:.0f} events/s)",
                            flush=True,
                        )

        # 2: latency at a steady rate below capacity
        rate = args.rate or min(MAX_LATENCY_RATE, 0.5 * tp["all_events_per_s"])
        n2 = max(10, min(n, int(rate * LATENCY_PHASE_SECONDS / (turns + 1))))
        work2 = workload("l", n2, turns, seed=2, real_ids=real_ids, event_interval_s=1.0 / rate)
        assert set(work2.ids) <= set(work2_ids)
        p2 = pipeline("latency")
        print(f"latency phase: {n2} conversations ({len(work2.items)} events) at {rate:.0f} events/s ...", flush=True)
        results["latency"] = latency(p2, work2, warm, rate, timeout)
        results["load_after_latency"] = load()
    finally:
        for p in pipelines:
            p.stop_all()
        stop(stack.cfg, ["kafka"])
    results["load_before"] = load_before
    return results


def other_consumer(consumer: str) -> str:
    return "faust" if consumer == "batch" else "batch"


def scaling_key(workers: int, sink_after: bool, round_: int) -> str:
    """The results key of a scaling phase (round 1's are the names earlier results used)."""
    key = "throughput_one_worker_joined" if workers == 1 else "throughput_two_workers"
    return key + ("_sink_after" if sink_after else "") + ("" if round_ == 1 else f"_round{round_}")


def speedups(results: dict, sink_after: bool) -> list[float]:
    """Two workers' turn events/s over one worker's, per round of the scaling phases ([] with ``--quick``)."""
    ratios, r = [], 1
    while (one := results.get(scaling_key(1, sink_after, r))) and (two := results.get(scaling_key(2, sink_after, r))):
        ratios.append(round(two["turn_events_per_s"] / one["turn_events_per_s"], 3))
        r += 1
    return ratios


def report(args: argparse.Namespace, results: dict, wall_s: float) -> dict:
    tp, lat, raw = results["throughput"], results["latency"], results["raw_consume"]
    p99 = lat["end_to_stored_s"]["p99"]
    rounds, rounds_sink_after = speedups(results, sink_after=False), speedups(results, sink_after=True)
    two_over_one = statistics.median(rounds) if rounds else None
    two_over_one_sink_after = statistics.median(rounds_sink_after) if rounds_sink_after else None
    out: dict[str, Any] = {
        "benchmark": "pipeline_throughput",
        "command": "cd "
        + shlex.quote(str(ROOT))
        + " && .venv/bin/python bench/"
        + Path(__file__).name
        + " "
        + " ".join(shlex.quote(a) for a in sys.argv[1:]),
        "config": {
            "conversations": args.conversations,
            "turns": args.turns,
            "quick": args.quick,
            "partitions": PARTITIONS,
            "workers": 1,
            "judge": "recorded (GPT-3.5 LLM-Rubric answers re-keyed to synthetic ids)",
            "broker": f"Apache Kafka {kafka_version()} (KRaft, one node, deploy/local/kafka.py's broker settings)",
            "kafka_client": client_settings(),
            "consumer": args.consumer,
            "store": {
                "flush_interval_s": StoreSettings().flush_interval_s,
                "batch_size": StoreSettings().batch_size,
                "engine": "chDB (embedded)",
            },
            "latency_rate_events_per_s": lat["target_rate_events_per_s"],
        },
        "targets": {
            "turn_events_per_s_per_worker": TARGET_TURN_EVENTS_PER_S,
            "p99_end_to_store_s": TARGET_P99_S,
            "two_workers_over_one": TARGET_TWO_WORKERS_SPEEDUP,
        },
        "definitions": {
            "turn_events_per_s": (
                "turn events / (worker's first processed event, between two /metrics polls -> the last conversation's "
                "scored_at in the store), topic pre-loaded; in the one- and two-worker phases, from the first send of "
                "the workload (published once the group has formed) instead of the first processed event"
            ),
            "end_to_store": "stored_at (conversation_scores insert time) - wall-clock time the end event was handed to the producer",
            "legs": "end sent -> closed_at (worker) -> scored_at (worker) -> stored_at (sink)",
            "judge_latency_s_mean": "the store's judge_latency_s: the recorded judge reports 0 (a table lookup)",
            "raw_consume": "AIOKafkaConsumer, no group, from the beginning of the same pre-loaded topic, best of 3",
        },
        "headline": {
            "turn_events_per_s_per_worker": tp["turn_events_per_s"],
            "turn_events_per_s_per_worker_sink_after": results["throughput_sink_after"]["turn_events_per_s"],
            f"turn_events_per_s_per_worker_{other_consumer(args.consumer)}_consumer": results["throughput_other_consumer"][
                "turn_events_per_s"
            ],
            "all_events_per_s_per_worker": tp["all_events_per_s"],
            "raw_aiokafka_events_per_s": raw["events_per_s"],
            "worker_over_raw": round(tp["all_events_per_s"] / raw["events_per_s"], 4),
            "p50_end_to_store_s": lat["end_to_stored_s"]["p50"],
            "p95_end_to_store_s": lat["end_to_stored_s"]["p95"],
            "p99_end_to_store_s": p99,
            "max_end_to_store_s": lat["end_to_stored_s"]["max"],
            "judge_latency_s_mean": lat["judge_latency_s_mean"],
            "two_workers_over_one": two_over_one,  # the median of the rounds'
            "two_workers_over_one_rounds": rounds,
            "two_workers_over_one_sink_after": two_over_one_sink_after,
            "two_workers_over_one_sink_after_rounds": rounds_sink_after,
            "throughput_pass": tp["turn_events_per_s"] >= TARGET_TURN_EVENTS_PER_S,
            "two_workers_pass": None if two_over_one is None else two_over_one >= TARGET_TWO_WORKERS_SPEEDUP,
            "p99_pass": p99 <= TARGET_P99_S,
        },
        "results": results,
        "machine": {
            "cpu": cpu_model(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
            "kafka": kafka_version(),
            "packages": {p: version(p) for p in ("faust-streaming", "aiokafka", "kafka-python", "chdb", "clickhouse-connect")},
        },
        "wall_s": round(wall_s, 1),
    }
    h = out["headline"]
    print()
    print(f"{'measure':<44} {'measured':>12} {'target':>10}  result")
    print(
        f"{'turn events/s per worker':<44} {h['turn_events_per_s_per_worker']:>12.0f} "
        f"{'>= ' + format(TARGET_TURN_EVENTS_PER_S, '.0f'):>10}  "
        f"{'PASS' if h['throughput_pass'] else 'MISS'}"
    )
    print(f"{'all events/s per worker (turns + ends)':<44} {h['all_events_per_s_per_worker']:>12.0f}")
    print(f"{'  turn events/s, the sink started after':<44} {h['turn_events_per_s_per_worker_sink_after']:>12.0f}")
    other = other_consumer(args.consumer)
    print(f"{'  turn events/s, kafka.consumer ' + other:<44} {h[f'turn_events_per_s_per_worker_{other}_consumer']:>12.0f}")
    if two_over_one is not None:
        print(
            f"{'two workers / one worker, median of rounds':<44} {two_over_one:>12.2f} "
            f"{'>= ' + format(TARGET_TWO_WORKERS_SPEEDUP, '.1f'):>10}  {'PASS' if h['two_workers_pass'] else 'MISS'}"
            f"  (rounds {', '.join(f'{x:.2f}' for x in rounds)})"
        )
    if two_over_one_sink_after is not None:
        print(
            f"{'  same, the sink started after':<44} {two_over_one_sink_after:>12.2f} {'':>10}        "
            f"(rounds {', '.join(f'{x:.2f}' for x in rounds_sink_after)})"
        )
    print(f"{'  worker CPU use in that window (cores)':<44} {tp['worker_cpu_utilisation']:>12.2f}")
    print(f"{'  turn events per worker CPU second':<44} {tp['turn_events_per_worker_cpu_second']:>12.0f}")
    if tp["same_window_cores"] is not None:
        c = tp["same_window_cores"]
        print(f"{'  sink / broker CPU use then (cores)':<44} {c['sink']:>12.2f} {c['broker']:>10.2f}")
        print(f"{'  worker waiting for a core then (cores)':<44} {c['workers_waiting_for_a_core']:>12.2f}")
        print(
            f"{'  whole host busy then (cores of ' + str(c['host_cpus']) + '), stolen':<44} {c['host']:>12.2f} {c['host_stolen']:>10.2f}"
        )
    print(f"{'  assembly only (all events processed), ev/s':<44} {tp['assembly_only_events_per_s']:>12.0f}")
    print(f"{'raw aiokafka consume, events/s':<44} {h['raw_aiokafka_events_per_s']:>12.0f}")
    print(f"{'worker / raw':<44} {h['worker_over_raw']:>12.3f}")
    print(f"{'end -> ClickHouse p50 (s)':<44} {h['p50_end_to_store_s']:>12.3f}")
    print(f"{'end -> ClickHouse p95 (s)':<44} {h['p95_end_to_store_s']:>12.3f}")
    print(
        f"{'end -> ClickHouse p99 (s)':<44} {h['p99_end_to_store_s']:>12.3f} {'<= ' + format(TARGET_P99_S, 'g'):>10}  "
        f"{'PASS' if h['p99_pass'] else 'MISS'}"
    )
    print(f"{'end -> ClickHouse max (s)':<44} {h['max_end_to_store_s']:>12.3f}")
    for name, leg in lat["legs_s"].items():
        print(f"{'  ' + name.replace('_', ' ') + ' p50 / p99 (s)':<44} {leg['p50']:>12.3f} {leg['p99']:>10.3f}")
    print(f"{'judge latency mean (s, recorded judge)':<44} {h['judge_latency_s_mean']:>12.4f}")
    print(
        f"latency phase: {lat['conversations']} conversations at {lat['achieved_rate_events_per_s']:.0f} events/s; "
        f"load average before {results['load_before']}, after {results['load_after_latency']}"
    )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--conversations", type=int, default=2000)
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--quick", action="store_true", help="300 conversations, no two-worker comparison runs")
    parser.add_argument(
        "--rate", type=float, default=None, help="latency phase events/s (default: half the measured rate, <= 1000)"
    )
    parser.add_argument(
        "--consumer",
        choices=("batch", "faust"),
        default="batch",
        help="the workers' kafka.consumer (default batch, the service's default)",
    )
    parser.add_argument(
        "--scaling-rounds",
        type=int,
        default=5,
        help="rounds of the one- and two-worker phases (default 5; the ratio is their median)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs, stores) and print its path")
    args = parser.parse_args(argv)
    if args.quick and args.conversations == 2000:
        args.conversations = 300
    if args.conversations < 10 or args.turns < 1 or args.scaling_rounds < 1:
        parser.error("need --conversations >= 10, --turns >= 1 and --scaling-rounds >= 1")
    started = time.perf_counter()
    tmp = tempfile.mkdtemp(prefix="convowatch-bench-pipeline-")
    try:
        results = run(args, Path(tmp))
    except BenchError as e:
        print(f"pipeline_throughput: error: {e}\n(logs in {tmp})", file=sys.stderr)
        return 1
    out = report(args, results, time.perf_counter() - started)
    OUTPUT.parent.mkdir(parents=True, exist_ok=True)
    OUTPUT.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {OUTPUT.relative_to(ROOT)}")
    if args.keep:
        print(f"work directory kept: {tmp}")
    else:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
