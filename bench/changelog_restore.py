"""A worker's restore time against the number of changelog updates, before and after Kafka compacted the changelog.

A worker that is assigned a partition reads the partition's changelog from its start before it processes any event
(stream/assembly_stage.py). The changelog is created compacted (stream/topics.py), but Kafka's cleaner only cleans
segments that have rolled; until it has, a restore reads every state ever written. This benchmark measures both, for a
fixed set of open conversations (``--open``, 200) and a growing number of updates (``--sizes``: 2k, 10k, 50k records).

Each size is a changelog (``--partitions`` partitions, stream/settings.py's default) written here, record for record
what the worker writes: the states come from the worker's own rules (`ConversationAssembler.apply`, one event at a
time, each changed state written as `AssemblyStage.process` writes it: key `changelog_key`, value the msgspec JSON of
the state, or a tombstone, to the conversation's events partition under the producers' default partitioner). The
open conversations get ``--turns`` turns each (one update a turn: each turn came in a poll of its own), spread over
the whole log; the remaining updates are conversations that came and went, as in production: ``--turns`` turns, an
``end`` (the closed state) and, once ``assembly.closed_retention_s`` passed, the tombstone that forgets them. Texts and
attributes are `synthetic_events`' (200-byte turns).

Then, per size and ``--repeats`` times, a real worker (``convowatch run``, the Kafka client defaults of
stream/settings.py) is started on it and its restore timed, three ways: from the worker's log, its assemble group's
"Successfully synced group" line to its "N conversations restored" line (the restore itself, as the worker timestamps
its log, ms); from starting the process to that line; and to ``convowatch_open_conversations`` reporting the open
ones (``assembly.idle_check_interval_s`` 1 s, as in the tests). Then Kafka compacts every changelog: the topic's
``segment.ms`` 100, ``min.cleanable.dirty.ratio`` 0.01 and ``delete.retention.ms`` 100 (convowatch's 1 h
``kafka.changelog_segment_s`` would not let the cleaner act within the benchmark); one more turn of an open conversation per partition (a
state as the worker writes it) rolls each partition's segment, the cleaner (its default 15 s backoff) cleans up to
it, and a second turn and pass drop the tombstones. The same workers are timed again on the compacted changelogs.

Apache Kafka (KRaft, one node: the embedded stack's, deploy/local/stack.py) is started here on a free port. Writes
``bench/results/changelog_restore.json`` with the CPU model, the Kafka version, the command and the client settings.

Run from the repository root:
``.venv/bin/python bench/changelog_restore.py [--open 200] [--turns 10] [--sizes 2000,10000,50000] [--repeats 2]``
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import functools
import json
import os
import re
import shlex
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "bench"):
    if str(path) not in sys.path:  # run as a script from a checkout, or imported as bench.changelog_restore
        sys.path.insert(0, str(path))

import msgspec  # noqa: E402
import pipeline_throughput  # noqa: E402
from aiokafka import AIOKafkaProducer  # noqa: E402
from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition  # noqa: E402
from kafka.admin import ConfigResource, ConfigResourceType  # noqa: E402
from kafka.partitioner.default import murmur2  # noqa: E402
from results_file import cpu_model  # noqa: E402  (bench/, beside this script)

from deploy.local.kafka import kafka_version  # noqa: E402
from deploy.local.stack import stop  # noqa: E402
from stream.assembly import ConversationAssembler, State  # noqa: E402
from stream.assembly_stage import changelog_key  # noqa: E402
from stream.contract import EndEvent, TurnEvent  # noqa: E402
from stream.replay.sources import synthetic_events  # noqa: E402
from stream.settings import AssemblySettings, KafkaSettings  # noqa: E402
from stream.topics import changelog_topic, ensure_topics  # noqa: E402
from tests.infra import wait_for  # noqa: E402
from tests.integration.test_changelog_compaction import FAST_COMPACTION, cleaned_up_to, kafka_log_dir  # noqa: E402
from tests.pipeline import Pipeline, Process  # noqa: E402

OUTPUT = ROOT / "bench" / "results" / "changelog_restore.json"
QUICK_OUTPUT = Path("/tmp/changelog_restore-quick.json")
LOG_TIME = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\]")
COMPACTION_TIMEOUT_S = 180.0
RESTORE_TIMEOUT_S = 600.0


# ---------------------------------------------------------------- the changelog, as the worker writes it


@dataclass
class Changelog:
    """One size's changelog records, (key, value or None, partition) in the order written, and what they hold."""

    records: list[tuple[bytes, bytes | None, int]] = field(default_factory=list)
    open_states: dict[str, State] = field(default_factory=dict)  # the open conversations' last states
    churned: int = 0  # conversations opened, closed and forgotten

    @property
    def bytes(self) -> int:
        return sum(len(k) + len(v or b"") for k, v, _ in self.records)


class Writer:
    """The worker's assemble rules, one event a poll: each event's changed state becomes one changelog record."""

    def __init__(self, partitions: int) -> None:
        self.settings = AssemblySettings()
        self.assembler = ConversationAssembler(self.settings)
        self.partitions = partitions
        self.states: dict[str, State] = {}
        self.out = Changelog()

    def partition(self, conversation_id: str) -> int:
        """The events partition of a conversation, as the producers' default partitioner picks it from the key (the
        conversation id): the changelog partition its state is written to."""
        return (murmur2(conversation_id.encode("utf-8")) & 0x7FFFFFFF) % self.partitions

    def apply(self, event: TurnEvent | EndEvent, now: float | None = None) -> None:
        cid = event.conversation_id
        current = self.states.get(cid)
        p = self.partition(cid)
        step = self.assembler.apply(current, event, partition=p, now=time.time() if now is None else now)
        if step.outcome not in ("accepted", "closed", "expired"):
            raise RuntimeError(f"{cid}: {type(event).__name__} -> {step.outcome}")
        # as BatchAssembler._record and AssemblyStage.process write it
        if step.state is None:
            if current is not None:
                self.out.records.append((changelog_key(cid), None, p))
                del self.states[cid]
        elif step.state is not current:
            self.out.records.append((changelog_key(cid), msgspec.json.encode(step.state), p))
            self.states[cid] = step.state

    def forget(self, conversation_id: str) -> None:
        """The retention end the idle timer publishes ``closed_retention_s`` after the close: the tombstone."""
        closed_at = self.states[conversation_id]["closed_at"]
        at = closed_at + self.settings.closed_retention_s
        self.apply(EndEvent(conversation_id, at, cause="retention"), now=at)


def _spread(a: list[Any], b: list[Any]) -> Iterator[Any]:
    """``a`` and ``b`` merged so that each is spread evenly over the whole (each keeps its order)."""
    i = j = 0
    while i < len(a) or j < len(b):
        if j >= len(b) or (i < len(a) and (i + 0.5) / len(a) <= (j + 0.5) / len(b)):
            yield a[i]
            i += 1
        else:
            yield b[j]
            j += 1


def changelog(open_n: int, turns: int, updates: int, partitions: int) -> Changelog:
    """``open_n`` open conversations of ``turns`` turns and enough churned ones to make about ``updates`` records."""
    churn_n = max(0, (updates - open_n * turns) // (turns + 2))  # each: its turns, its closed state, its tombstone
    writer = Writer(partitions)
    opened = [i.event for i in synthetic_events(open_n, turns, seed=1) if isinstance(i.event, TurnEvent)]
    churn = [i.event for i in synthetic_events(churn_n, turns, seed=2) if i.event is not None]
    for event in _spread(opened, churn):
        writer.apply(event)
        if isinstance(event, EndEvent):
            writer.forget(event.conversation_id)
    writer.out.open_states = dict(writer.states)
    writer.out.churned = churn_n
    assert len(writer.out.open_states) == open_n and all(s["closed_at"] is None for s in writer.states.values())
    return writer.out


async def _produce(bootstrap: str, topic: str, records: Sequence[tuple[bytes, bytes | None, int]]) -> None:
    """Send ``records`` to their partitions with the producer settings of the worker's stages (stream/poll_stage.py)."""
    k = KafkaSettings()
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, max_batch_size=k.max_record_bytes, max_request_size=k.max_record_bytes, acks="all"
    )
    await producer.start()
    try:
        sent = [await producer.send(topic, value, key=key, partition=p) for key, value, p in records]
        await asyncio.gather(*sent)
    finally:
        await producer.stop()


def produce(bootstrap: str, topic: str, records: Sequence[tuple[bytes, bytes | None, int]]) -> None:
    asyncio.run(_produce(bootstrap, topic, records))


def read_back(bootstrap: str, topic: str, partitions: int) -> list[tuple[int, int, bytes, bytes | None]]:
    """Every record of ``topic``: (partition, offset, key, value)."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, max_partition_fetch_bytes=8 << 20)
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    try:
        consumer.assign(tps)
        ends = consumer.end_offsets(tps)
        consumer.seek_to_beginning(*tps)
        out: list[tuple[int, int, bytes, bytes | None]] = []
        deadline = time.monotonic() + 300
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{topic}: not read to its end offsets {ends} in 300 s")
            for batch in consumer.poll(timeout_ms=500).values():
                out.extend(
                    (r.partition, r.offset, r.key, r.value) for r in batch if r.offset < ends[TopicPartition(topic, r.partition)]
                )
        return out
    finally:
        consumer.close()


def topic_known(bootstrap: str, topic: str, partitions: int) -> bool:
    """Whether the broker's metadata holds ``topic`` with its partitions (a producer sent to it before would retry)."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap)
    try:
        return len(consumer.partitions_for_topic(topic) or ()) == partitions
    finally:
        consumer.close()


def end_offsets(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap)
    try:
        ends = consumer.end_offsets([TopicPartition(topic, p) for p in range(partitions)])
        return {tp.partition: int(offset) for tp, offset in ends.items()}
    finally:
        consumer.close()


# ---------------------------------------------------------------- one size: its topics, its worker


@dataclass
class Case:
    updates_asked: int
    pipeline: Pipeline
    log: Changelog
    topic: str
    partitions: int
    roll_turns: dict[int, str] = field(default_factory=dict)  # partition -> the open conversation whose turns roll it

    def kafka_settings(self) -> KafkaSettings:
        e = self.pipeline.env
        return KafkaSettings(
            bootstrap_servers=self.pipeline.bootstrap,
            events_topic=e["CONVOWATCH_KAFKA__EVENTS_TOPIC"],
            closed_topic=e["CONVOWATCH_KAFKA__CLOSED_TOPIC"],
            scores_topic=e["CONVOWATCH_KAFKA__SCORES_TOPIC"],
            dead_letter_topic=e["CONVOWATCH_KAFKA__DEAD_LETTER_TOPIC"],
            app_id=e["CONVOWATCH_KAFKA__APP_ID"],
            partitions=self.partitions,
        )

    def roll(self) -> dict[int, int]:
        """One more turn of an open conversation in each partition, written as the worker would: rolls each partition's
        segment (segment.ms has passed). Returns each partition's offset of that record."""
        writer = Writer(self.partitions)
        writer.states = self.log.open_states
        before = end_offsets(self.pipeline.bootstrap, self.topic, self.partitions)
        for cid in self.roll_turns.values():
            state = writer.states[cid]
            index = len(state["turns"])
            writer.apply(TurnEvent(cid, index, "user" if index % 2 == 0 else "assistant", f"turn {index}", time.time()))
        produce(self.pipeline.bootstrap, self.topic, writer.out.records)
        return before


def _log_time(line: str) -> float:
    m = LOG_TIME.match(line)
    if m is None:
        raise RuntimeError(f"no timestamp in the worker's log line {line!r}")
    return dt.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()


def time_restore(case: Case, expect_open: int) -> dict[str, Any]:
    """Start a worker on ``case``'s topics, time its restore, stop it."""
    p = case.pipeline
    log = p.root / "worker.log"
    since = log.stat().st_size if log.exists() else 0
    started = time.monotonic()
    worker: Process = p.start_worker()  # returns once its /metrics answer
    synced_mark = f"Successfully synced group {p.worker_group('events')}"
    restored_mark = f"conversations restored from {case.topic}"

    def restored() -> tuple[str, str] | None:
        with log.open("rb") as f:
            f.seek(since)
            lines = f.read().decode(errors="replace").splitlines()
        if worker.popen.poll() is not None:
            raise RuntimeError(f"the worker exited with {worker.popen.returncode}:\n{worker.log_tail()}")
        synced = None
        for line in lines:
            if synced_mark in line:
                synced = line  # the last assignment before the restore
            elif restored_mark in line and synced is not None:
                return synced, line
        return None

    try:
        found = wait_for(restored, timeout=RESTORE_TIMEOUT_S, interval=0.05, what="the restore logged")
        assert found is not None  # wait_for returns only what is true
        synced, done = found
        to_line = time.monotonic() - started
        wait_for(
            lambda: worker.metric_sum("convowatch_open_conversations") == expect_open,
            timeout=120,
            interval=0.1,
            what=f"{expect_open} open conversations reported",
        )
        to_metric = time.monotonic() - started
    finally:
        worker.terminate()
    count = re.search(r"(\d+) conversations restored", done)
    restored_n = int(count.group(1)) if count else -1
    if restored_n != expect_open:
        raise RuntimeError(f"the worker restored {restored_n} conversations, not {expect_open}: {done}")
    return {
        "restore_s": round(_log_time(done) - _log_time(synced), 3),
        "start_to_restored_s": round(to_line, 3),
        "start_to_open_metric_s": round(to_metric, 3),
        "restored": restored_n,
    }


def time_restores(case: Case, expect_open: int, repeats: int) -> dict[str, Any]:
    runs = [time_restore(case, expect_open) for _ in range(repeats)]
    return {
        "restore_s": statistics.median(r["restore_s"] for r in runs),
        "start_to_restored_s": statistics.median(r["start_to_restored_s"] for r in runs),
        "start_to_open_metric_s": statistics.median(r["start_to_open_metric_s"] for r in runs),
        "runs": runs,
    }


def census(case: Case) -> dict[str, Any]:
    """What the changelog holds now (read back)."""
    records = read_back(case.pipeline.bootstrap, case.topic, case.partitions)
    keys = Counter(key for _, _, key, _ in records)
    latest: dict[bytes, bytes | None] = {}
    for _, _, key, value in sorted(records, key=lambda r: (r[0], r[1])):
        latest[key] = value
    return {
        "records": len(records),
        "bytes": sum(len(k) + len(v or b"") for _, _, k, v in records),
        "tombstones": sum(1 for *_, v in records if v is None),
        "keys": len(keys),
        "keys_more_than_once": sum(1 for n in keys.values() if n > 1),
        "live_keys": sum(1 for v in latest.values() if v is not None),
    }


def compact(cases: list[Case], log_dir: Path) -> dict[str, Any]:
    """Make Kafka compact every case's changelog (see the module); returns how long it took."""
    admin = KafkaAdminClient(bootstrap_servers=cases[0].pipeline.bootstrap)
    try:
        for case in cases:
            admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, case.topic, configs=FAST_COMPACTION)])
        resources = [ConfigResource(ConfigResourceType.TOPIC, c.topic) for c in cases]

        def changed() -> bool:
            described = admin.describe_configs(resources)["topic"]
            return all({k: v["value"] for k, v in described[c.topic].items()}.items() >= FAST_COMPACTION.items() for c in cases)

        wait_for(changed, timeout=30, what="the topic configs changed")
    finally:
        admin.close()
    started = time.monotonic()
    passes = []
    time.sleep(0.2)  # past segment.ms: the next record of each partition rolls its segment
    while True:
        # each partition's offset of its roll record: the base of its new active segment, the first offset a pass
        # after the roll leaves uncleaned
        rolled = {c.topic: c.roll() for c in cases}

        def cleaned_past_rolls(rolled: dict[str, dict[int, int]] = rolled) -> bool:
            return all(
                (upto := cleaned_up_to(log_dir, c.topic, p)) is not None and upto >= rolled[c.topic][p]
                for c in cases
                for p in range(c.partitions)
            )

        wait_for(cleaned_past_rolls, timeout=COMPACTION_TIMEOUT_S, interval=0.5, what="the cleaner past the rolls")
        now = [census(c) for c in cases]
        passes.append({"after_s": round(time.monotonic() - started, 1), "tombstones": [n["tombstones"] for n in now]})
        if all(n["tombstones"] == 0 for n in now):  # the first pass keeps tombstones for delete.retention.ms
            break
        if time.monotonic() - started > COMPACTION_TIMEOUT_S:
            raise RuntimeError(f"tombstones left after {COMPACTION_TIMEOUT_S} s: {passes}")
    return {"seconds": round(time.monotonic() - started, 1), "passes": passes}


# ---------------------------------------------------------------- the run


def run(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    rubric_set, calibrator = pipeline_throughput.scoring_artifacts(pipeline_throughput.CACHE)
    stack = pipeline_throughput.start_broker(root)
    print(f"Apache Kafka {kafka_version()} on {stack.bootstrap}", flush=True)
    cases: list[Case] = []
    try:
        for updates in args.sizes:
            started = time.monotonic()
            log = changelog(args.open, args.turns, updates, args.partitions)
            made_s = time.monotonic() - started
            p = Pipeline(root / f"updates-{updates}", stack.bootstrap, rubric_set, calibrator, partitions=args.partitions)
            case = Case(
                updates, p, log, changelog_topic(KafkaSettings(app_id=p.env["CONVOWATCH_KAFKA__APP_ID"])), args.partitions
            )
            case.roll_turns = {}
            for cid in sorted(log.open_states):
                case.roll_turns.setdefault(log.open_states[cid]["partition"], cid)
            if len(case.roll_turns) != args.partitions:
                raise RuntimeError(f"open conversations in partitions {sorted(case.roll_turns)} only")
            ensure_topics(case.kafka_settings())  # the changelog compacted, segments of kafka.changelog_segment_s
            wait_for(functools.partial(topic_known, stack.bootstrap, case.topic, args.partitions), timeout=30, what="the topic")
            started = time.monotonic()
            produce(stack.bootstrap, case.topic, log.records)
            print(
                f"{len(log.records)} updates ({args.open} open, {log.churned} churned conversations, "
                f"{log.bytes / 1e6:.1f} MB): made in {made_s:.1f} s, written in {time.monotonic() - started:.1f} s",
                flush=True,
            )
            cases.append(case)

        results: list[dict[str, Any]] = []
        for case in cases:
            before = census(case)
            uncompacted = time_restores(case, args.open, args.repeats)
            print(f"{before['records']:>7} records uncompacted: restore {uncompacted['restore_s']:.3f} s", flush=True)
            results.append(
                {
                    "updates": len(case.log.records),
                    "open_conversations": args.open,
                    "churned_conversations": case.log.churned,
                    "written_bytes": case.log.bytes,
                    "uncompacted": {"changelog": before, **uncompacted},
                }
            )
        log_dir = kafka_log_dir(stack.bootstrap, cases[0].topic)
        compaction = compact(cases, log_dir)
        print(f"compacted by Kafka in {compaction['seconds']} s ({len(compaction['passes'])} rolls)", flush=True)
        for case, result in zip(cases, results, strict=True):
            after = census(case)
            compacted = time_restores(case, args.open, args.repeats)
            print(f"{after['records']:>7} records compacted:   restore {compacted['restore_s']:.3f} s", flush=True)
            result["compacted"] = {"changelog": after, **compacted}
    finally:
        for case in cases:
            case.pipeline.stop_all()
        stop(stack.cfg, ["kafka"])
    return {"sizes": results, "compaction": compaction}


def report(results: dict[str, Any]) -> None:
    print()
    print(
        f"{'updates':>8} {'records':>8} {'restore s':>10} {'start->restored s':>18}   {'records':>8} {'restore s':>10} {'start->restored s':>18}"
    )
    print(f"{'':>8} {'uncompacted':>39}   {'compacted':>38}")
    for r in results["sizes"]:
        u, c = r["uncompacted"], r["compacted"]
        print(
            f"{r['updates']:>8} {u['changelog']['records']:>8} {u['restore_s']:>10.3f} {u['start_to_restored_s']:>18.2f}   "
            f"{c['changelog']['records']:>8} {c['restore_s']:>10.3f} {c['start_to_restored_s']:>18.2f}"
        )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--open", type=int, default=200, help="open conversations in every changelog")
    ap.add_argument("--turns", type=int, default=10, help="turns of each conversation (one update each)")
    ap.add_argument(
        "--sizes", type=lambda s: [int(x) for x in s.split(",")], default=[2000, 10_000, 50_000], help="updates per changelog"
    )
    ap.add_argument("--partitions", type=int, default=KafkaSettings().partitions, help="partitions of every topic")
    ap.add_argument("--repeats", type=int, default=2, help="worker starts per changelog and state (the median is reported)")
    ap.add_argument("--quick", action="store_true", help="results to /tmp instead of bench/results")
    args = ap.parse_args(argv)
    if min(args.sizes) < args.open * args.turns:
        ap.error(f"--sizes must be at least --open x --turns ({args.open * args.turns}): the open conversations' own updates")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="convowatch-changelog-restore-") as tmp:
        results = run(args, Path(tmp))
    k = KafkaSettings()
    out = {
        "benchmark": "changelog_restore",
        "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": "cd "
        + shlex.quote(str(ROOT))
        + " && .venv/bin/python bench/changelog_restore.py "
        + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:])),
        "machine": {
            "cpu": cpu_model(),
            "cpus": os.cpu_count(),
            "kafka": kafka_version(),
            "load_average_after": pipeline_throughput.load(),
        },
        "config": {
            "open_conversations": args.open,
            "turns": args.turns,
            "sizes": args.sizes,
            "partitions": args.partitions,
            "repeats": args.repeats,
            "broker": f"Apache Kafka {kafka_version()} (KRaft, one node, deploy/local/kafka.py's broker settings)",
            "compaction_topic_configs": FAST_COMPACTION,
            "kafka_client": pipeline_throughput.client_settings(),
            "changelog_producer": {"max_batch_size": k.max_record_bytes, "max_request_size": k.max_record_bytes, "acks": "all"},
            "worker_env": "tests/pipeline.py's Pipeline (assembly.idle_check_interval_s 1, recorded judge)",
        },
        "definitions": {
            "updates": "changelog records written (states and tombstones), as the worker writes them one event a poll",
            "restore_s": "the worker's log: its assemble group's 'Successfully synced group' line to its "
            "'N conversations restored' line (the restore; log timestamps in ms); median of the repeats",
            "start_to_restored_s": "starting the worker process to that line appearing in its log",
            "start_to_open_metric_s": "starting the worker process to convowatch_open_conversations == the open ones",
        },
        **results,
        "wall_s": round(time.monotonic() - started, 1),
    }
    path = QUICK_OUTPUT if args.quick else OUTPUT
    path.write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")
    report(out)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
