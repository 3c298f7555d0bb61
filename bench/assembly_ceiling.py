"""How fast can the assemble stage go on aiokafka directly, without Faust's per-event machinery?

issue 14 asks for 5,000 turn events/s per worker; `bench/pipeline_throughput.py` measures 700-1,000 here, and
py-spy puts most of the worker's CPU in Faust's fetch, stream and produce paths, not in our code. This benchmark
measures the consume path proposed instead: the same `BatchAssembler` the worker's ``assemble`` agent runs
(validation, assembly, the caps, stream/batch_assembly.py), fed by `AIOKafkaConsumer.getmany` in a consumer group,
each poll's closed conversations sent to a closed topic and each conversation the poll changed written once to a
state topic (to its partition, as a changelog), all sends acknowledged, then the poll's offsets committed.

Not in it: scoring (the ``score`` agent), restoring the state on assignment, rebalances, timers. Apache Kafka (KRaft,
one node: the embedded stack's) is started here; the events topic (4 partitions) is pre-loaded with `synthetic_events`
(``--conversations`` × 10 turns + an end each), then read from the start. The consumer and the producer are made as the
worker's stages make theirs (stream/poll_stage.py) from the defaults of stream/settings.py, the client settings a
production user gets. Reported: events/s from the first poll to the last commit and the process's CPU seconds in that
window, best of ``--runs``; and the raw consume rate of the same topic (no processing). The CPU model and the Kafka
version are recorded with the figures.

Run: ``.venv/bin/python bench/assembly_ceiling.py [--conversations 3000] [--runs 3]``; figures to
bench/results/assembly_ceiling.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "bench"):
    if str(path) not in sys.path:  # run as a script from a checkout, or imported as bench.assembly_ceiling
        sys.path.insert(0, str(path))

import pipeline_throughput  # noqa: E402
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer  # noqa: E402
from aiokafka.admin import AIOKafkaAdminClient, NewTopic  # noqa: E402
from results_file import cpu_model  # noqa: E402  (bench/, beside this script)

from deploy.local.kafka import kafka_version  # noqa: E402
from deploy.local.stack import stop  # noqa: E402
from stream.batch_assembly import BatchAssembler  # noqa: E402
from stream.metrics import ServiceMetrics  # noqa: E402
from stream.replay.sources import synthetic_events  # noqa: E402
from stream.settings import AssemblySettings, KafkaSettings  # noqa: E402
from stream.state_batch import StateBatch  # noqa: E402

PARTITIONS = 4
TURNS = 10
RESULTS = ROOT / "bench" / "results" / "assembly_ceiling.json"


async def create_topics(bootstrap: str, run: int) -> tuple[str, str, str]:
    names = (f"events-{run}", f"closed-{run}", f"state-{run}")
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, PARTITIONS, 1) for name in names])
    finally:
        await admin.close()
    return names


async def preload(bootstrap: str, topic: str, conversations: int) -> int:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    await producer.start()
    try:
        sent = [
            await producer.send(topic, key=item.key, value=item.raw) for item in synthetic_events(conversations, TURNS, seed=1)
        ]
        await asyncio.gather(*sent)
    finally:
        await producer.stop()
    return len(sent)


async def assemble(bootstrap: str, topics: tuple[str, str, str], expect: int) -> dict:
    """Read the events topic in a group, assemble, publish, write states, commit; the figures of one pass."""
    events_topic, closed_topic, state_topic = topics
    assembly = BatchAssembler(AssemblySettings(), PARTITIONS, ServiceMetrics())
    states: dict = {}
    k = KafkaSettings()  # the defaults, as the worker's stages use them (stream/poll_stage.py)
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, max_batch_size=k.max_record_bytes, max_request_size=k.max_record_bytes, acks="all"
    )
    consumer = AIOKafkaConsumer(
        events_topic,
        bootstrap_servers=bootstrap,
        group_id=f"ceiling-{events_topic}",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        max_poll_records=k.max_poll_records,
        fetch_max_wait_ms=int(k.fetch_max_wait_s * 1000),
        session_timeout_ms=int(k.session_timeout_s * 1000),
        heartbeat_interval_ms=int(k.heartbeat_interval_s * 1000),
        max_poll_interval_ms=int(k.max_poll_interval_s * 1000),
    )
    await producer.start()
    await consumer.start()
    done = closed = state_writes = 0
    started = cpu_started = 0.0
    try:
        while done < expect:
            polled = await consumer.getmany(timeout_ms=1000, max_records=k.max_poll_records)
            if not polled:
                continue
            if not done:
                started, cpu_started = time.perf_counter(), time.process_time()
            sends = []
            batch = StateBatch(states)
            for records in polled.values():
                out = assembly.apply(records, batch)
                sends += [await producer.send(closed_topic, key=key, value=value) for key, value in out.closed]
                closed += len(out.closed)
                done += len(records)
            for key, state, partition in batch.changes():
                value = None if state is None else json.dumps(state).encode("utf-8")
                sends.append(await producer.send(state_topic, key=key.encode("utf-8"), value=value, partition=partition))
                if state is None:
                    states.pop(key, None)
                else:
                    states[key] = state
            state_writes += len(batch)
            await asyncio.gather(*sends)
            await consumer.commit({tp: records[-1].offset + 1 for tp, records in polled.items()})
        seconds, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    finally:
        await consumer.stop()
        await producer.stop()
    return {
        "events": done,
        "seconds": round(seconds, 3),
        "events_per_s": round(done / seconds),
        "cpu_seconds": round(cpu, 3),
        "events_per_cpu_second": round(done / cpu),
        "closed": closed,
        "state_writes": state_writes,
    }


async def measure(bootstrap: str, conversations: int, runs: int) -> dict:
    passes: list[dict] = []
    raw = []
    for run in range(runs):
        topics = await create_topics(bootstrap, run)
        expect = await preload(bootstrap, topics[0], conversations)
        raw.append((await pipeline_throughput._raw_consume(bootstrap, topics[0], expect, timeout=300))["events_per_s"])
        passes.append(await assemble(bootstrap, topics, expect))
    return {
        "raw_consume_events_per_s": round(max(raw)),
        "default_settings": {"best": max(passes, key=lambda r: r["events_per_s"]), "runs": passes},
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--conversations", type=int, default=3000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args(argv)
    stack = pipeline_throughput.start_broker(Path(tempfile.mkdtemp(prefix="convowatch-bench-ceiling-")))
    try:
        results = asyncio.run(measure(stack.bootstrap, args.conversations, args.runs))
    finally:
        stop(stack.cfg, ["kafka"])
    print(f"{'':38} {'events/s':>10} {'per CPU-s':>10}")
    best = results["default_settings"]["best"]
    print(f"{'BatchAssembler on aiokafka':38} {best['events_per_s']:>10,} {best['events_per_cpu_second']:>10,}")
    print(f"{'raw aiokafka consume (no processing)':38} {results['raw_consume_events_per_s']:>10,}")
    RESULTS.write_text(
        json.dumps(
            {
                "benchmark": "assembly_ceiling",
                "command": ".venv/bin/python bench/assembly_ceiling.py " + " ".join(argv or sys.argv[1:]),
                "machine": {"cpu": cpu_model(), "kafka": kafka_version(), "load_average_after": pipeline_throughput.load()},
                "workload": {"conversations": args.conversations, "turns": TURNS, "partitions": PARTITIONS},
                "kafka_client": pipeline_throughput.client_settings(),
                "runs": args.runs,
                **results,
            },
            indent=2,
        )
        + "\n",
        encoding="utf-8",
    )
    print(f"wrote {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
