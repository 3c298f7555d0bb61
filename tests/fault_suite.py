"""The fault suite: a replay under repeated crashes and outages, then a count of what reached ClickHouse.

One scenario, two sizes: `SHORT` runs in ``make test``
(tests/integration/test_faults.py), `FULL` (≥ 1,000 conversations, ten worker
kills, three sink kills, a 60 s sink outage, a 5 min judge outage) in ``bench/faults.py``.

The broker is a 3-node Apache Kafka cluster on loopback (KRaft, each node
broker and controller; `tests.infra.KafkaCluster`) run as production runs it:
convowatch creates its topics with replication factor 3, the brokers require
``min.insync.replicas=2``, every producer sends with ``acks=all``. Its faults,
in both sizes: the leader of an events partition and the leader of a changelog
partition killed (-9) mid-stream and started again, the active controller
killed and started again, and the whole cluster killed at once and started
again on its files.

The conversations are the 223 real LLM-Rubric ones, copied under new ids
(``<real id>#<k>``) up to the plan's count, and judged over HTTP by the
`RecordedJudgeServer` (recorded GPT-3.5 answers, looked up by prompt), so the
judge's outages are real ones: refused connections, 503s, replies slower than
the worker's judge timeout. Each conversation's turns are sent in two parts in
consecutive chunks, so conversations are open (only in the table's changelog)
whenever a worker dies.

Faults run in a seeded random order between the chunks; after each, the time
until the process it hit has caught up is measured: the committed offsets of
its consumer group reach the topic's end offsets as they stood at the fault
(a worker: the events topic; the sink: the scores topic; a broker fault: both,
and the time until every replica of the pipeline's topics is back in sync;
the judge, which runs in the background while the other faults go on: the
closed topic, from the moment it answers again). At the end every conversation must be in the
store exactly once, scored, with every turn as it was sent, in order; no
dead letter; no conversation left open; no process flagged lost broker data
(``convowatch_broker_lost_data_total`` of every worker and sink incarnation,
read before each is stopped or killed).

The service runs with its default client settings. Each restarted worker or
sink comes back under the same ``kafka.group_instance_id`` (Kafka's static
membership, as the production units run it), so it takes its partitions back
without waiting for the killed one's session to expire.
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition
from kafka.errors import KafkaError

from scorers.conversation import Conversation
from scorers.datasets.llm_rubric import load_real_conversations
from scorers.judges.recorded import load_answer_table
from scorers.questions import load_questions
from scorers.rubrics import RubricSet
from stream.contract import EndEvent, Event, TurnEvent
from stream.records import ScoreRecord
from stream.replay.sources import LLM_RUBRIC_REAL_DATA, ReplayItem, llm_rubric_events
from stream.settings import JudgeSettings, KafkaSettings
from stream.topics import changelog_topic
from tests.infra import KafkaCluster, free_port, wait_for
from tests.pipeline import LLM_RUBRIC_DATA, RECORDED_REAL_ANSWERS, Pipeline, Process
from tests.recorded_judge_server import RecordedJudgeServer

JUDGE_TIMEOUT_S = 2.0
SLOW_REPLY_S = 3.0  # longer than the judge timeout: a slow reply is a failed attempt
OFFSETS_TIMEOUT_MS = 10_000  # one read of end offsets; a read that fails is tried again
OUTAGE_MODE_MAX_WAIT_S = 300.0  # the last chunk's conversations reach the judge well within this
T = TypeVar("T")


@dataclass(frozen=True)
class FaultPlan:
    """How big the replay is and which faults hit it."""

    conversations: int
    worker_kills: int
    sink_kills: int
    sink_outage_s: float
    judge_outage_s: float  # a third each: connection refused, HTTP 503, replies slower than the judge timeout
    leader_kills: int = 1  # of an events partition's leader, and as many of a changelog partition's
    controller_kills: int = 1
    cluster_restarts: int = 1  # every node killed at once, then all started again
    seed: int = 1


SHORT = FaultPlan(conversations=300, worker_kills=3, sink_kills=1, sink_outage_s=10, judge_outage_s=30)
FULL = FaultPlan(conversations=1000, worker_kills=10, sink_kills=3, sink_outage_s=60, judge_outage_s=300)

# What production runs on (deploy/production/README.md): writes need two in-sync replicas of three.
CLUSTER_OVERRIDES = {"min.insync.replicas": "2"}
CLUSTER_SIZE = 3
BROKER_FAULTS = ("events leader kill", "changelog leader kill", "controller kill", "cluster restart")

# The worker retries a conversation through a judge outage (capped backoff) instead of storing it unscored.
JUDGE_ENV = {
    "CONVOWATCH_JUDGE__BACKEND": "openai",
    "CONVOWATCH_JUDGE__MODEL": "recorded",
    "CONVOWATCH_JUDGE__API_KEY": "fault-suite",
    "CONVOWATCH_JUDGE__MAX_RETRIES": "0",
    "CONVOWATCH_JUDGE__TIMEOUT_S": str(JUDGE_TIMEOUT_S),
    "CONVOWATCH_SCORING__MAX_ATTEMPTS": "1000",
    "CONVOWATCH_SCORING__RETRY_INITIAL_S": "0.5",
    "CONVOWATCH_SCORING__RETRY_MAX_S": "5",
}


@dataclass
class Workload:
    """The chunks of events to send and, per conversation id, the turns as sent: (index, role, text)."""

    chunks: list[list[ReplayItem]]
    sent: dict[str, list[tuple[int, str, str]]]


def workload(n: int, n_chunks: int) -> Workload:
    """``n`` copies of the real conversations in ``n_chunks`` chunks; each copy's first half of turns goes in
    one chunk, the rest and its end event in the next."""
    by_id: dict[str, list[Event]] = defaultdict(list)
    for item in llm_rubric_events():
        assert item.event is not None
        by_id[item.event.conversation_id].append(item.event)
    real = sorted(by_id)
    chunks: list[list[ReplayItem]] = [[] for _ in range(n_chunks)]
    sent: dict[str, list[tuple[int, str, str]]] = {}
    for k in range(n):
        source = real[k % len(real)]
        new_id = f"{source}#{k}"
        events = [dataclasses.replace(e, conversation_id=new_id) for e in by_id[source]]
        turns = [e for e in events if isinstance(e, TurnEvent)]
        end = events[-1]
        assert isinstance(end, EndEvent)
        sent[new_id] = [(t.turn_index, t.role, t.text) for t in turns]
        first = k * (n_chunks - 1) // n
        half = len(turns) // 2
        chunks[first].extend(ReplayItem.of(e) for e in turns[:half])
        rest: list[Event] = [*turns[half:], end]
        chunks[first + 1].extend(ReplayItem.of(e) for e in rest)
    return Workload(chunks, sent)


def judge_server(rubric_set_path: Path) -> RecordedJudgeServer:
    """The recorded judge over HTTP for every question the worker can ask (the rubric set's and LLM-Rubric's)."""
    questions = load_questions(LLM_RUBRIC_DATA / "questions.json")
    questions.update({q.id: q for q in RubricSet.load(rubric_set_path).questions()})
    conversations: list[Conversation] = list(load_real_conversations(LLM_RUBRIC_REAL_DATA).values())
    return RecordedJudgeServer(
        free_port(),
        conversations,
        questions.values(),
        load_answer_table(RECORDED_REAL_ANSWERS),
        max_transcript_chars=JudgeSettings().max_transcript_chars,
        slow_s=SLOW_REPLY_S,
    )


@dataclass
class FaultReport:
    """What happened and what reached the store."""

    plan: FaultPlan
    recoveries: list[dict[str, Any]] = field(default_factory=list)
    judge_requests: dict[str, int] = field(default_factory=dict)
    score_records: int = 0
    stored: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class FaultRun:
    """Runs `FaultPlan` against a pipeline (its own topics and store) with a recorded judge server."""

    def __init__(self, pipeline: Pipeline, judge: RecordedJudgeServer, plan: FaultPlan, cluster: KafkaCluster) -> None:
        self.pipeline, self.judge, self.plan, self.cluster = pipeline, judge, plan, cluster
        self.rng = random.Random(plan.seed)
        self.report = FaultReport(plan)
        pipeline.extra_env.update(
            {
                **JUDGE_ENV,
                "CONVOWATCH_JUDGE__BASE_URL": f"http://127.0.0.1:{judge.port}/v1",
                "CONVOWATCH_KAFKA__REPLICATION_FACTOR": str(len(cluster.nodes)),
            }
        )
        self.admin = KafkaAdminClient(bootstrap_servers=pipeline.bootstrap)
        self.offsets = KafkaConsumer(bootstrap_servers=pipeline.bootstrap)
        self.workers = 0
        self.sinks = 0
        self.running: dict[str, Process] = {}  # the worker and the sink as they are now
        self.lost_data_flags = 0.0  # convowatch_broker_lost_data_total of every incarnation that was stopped
        self._judge_thread: threading.Thread | None = None
        self._kafka = threading.Lock()  # the judge outage's thread reads offsets too; the clients are not thread-safe

    def close(self) -> None:
        self.admin.close()
        self.offsets.close()

    # ---------------------------------------------------------------- offsets

    def end_offsets(self, topic: str) -> dict[int, int]:
        name = self.pipeline.topic(topic)
        tps = [TopicPartition(name, p) for p in range(self.pipeline.partitions)]
        with self._kafka, self._afresh_on_error():
            return {tp.partition: off for tp, off in self.offsets.end_offsets(tps, timeout_ms=OFFSETS_TIMEOUT_MS).items()}

    def committed(self, group: str, topic: str) -> dict[int, int]:
        name = self.pipeline.topic(topic)
        with self._kafka, self._afresh_on_error():
            offsets = self.admin.list_group_offsets(group)[group]
        return {tp.partition: om.offset for tp, om in offsets.items() if tp.topic == name}

    @contextlib.contextmanager
    def _afresh_on_error(self) -> Iterator[None]:
        """This run's own clients are made again after a broker error: a kafka-python client that met a node while
        it restarted was seen to fail every read for over a minute after it was back (the service's clients were not)."""
        try:
            yield
        except KafkaError:
            self.close()
            self.admin = KafkaAdminClient(bootstrap_servers=self.pipeline.bootstrap)
            self.offsets = KafkaConsumer(bootstrap_servers=self.pipeline.bootstrap)
            raise

    def caught_up_after(self, group: str, topic: str, since: float, timeout: float = 900) -> float:
        """Seconds from ``since`` (the fault) until ``group`` has committed ``topic`` up to its end offsets as they
        are now (the process that was hit is back)."""
        target = wait_for(lambda: _unless_unreachable(self.end_offsets, topic) or {}, timeout=60, what=f"{topic} end offsets")

        def done() -> bool:
            for p in self.running.values():
                if p.popen.poll() is not None:
                    raise AssertionError(f"{p.name} exited with {p.popen.returncode}:\n{p.log_tail()}")
            got = _unless_unreachable(self.committed, group, topic)
            return got is not None and all(got.get(p, 0) >= end for p, end in target.items())

        wait_for(done, timeout=timeout, interval=0.2, what=f"{group} caught up on {topic}")
        return round(time.monotonic() - since, 2)

    @property
    def sink_group(self) -> str:
        return self.pipeline.env["CONVOWATCH_KAFKA__SINK_GROUP"]

    # ---------------------------------------------------------------- processes

    def start_worker(self) -> Process:
        self.workers += 1
        worker = self.running["worker"] = self.pipeline.start_worker(f"worker-{self.workers}", env=self._instance("worker"))
        self.pipeline.wait_assigned([worker])
        return worker

    def start_sink(self) -> Process:
        self.sinks += 1
        self.running["sink"] = self.pipeline.start_sink(f"sink-{self.sinks}", env=self._instance("sink"))
        return self.running["sink"]

    def _instance(self, role: str) -> dict[str, str]:
        """Every incarnation of a role joins under one static member id."""
        return {"CONVOWATCH_KAFKA__GROUP_INSTANCE_ID": f"{self.pipeline.tag}-{role}"}

    def _stop(self, process: Process, kill: bool) -> None:
        """Read the process's lost-data flags (it cannot be read after), then kill it (-9) or stop it (SIGTERM)."""
        self.lost_data_flags += process.metric_sum("convowatch_broker_lost_data_total")
        self.running = {role: p for role, p in self.running.items() if p is not process}
        if kill:
            process.kill9()
        else:
            process.terminate()

    # ---------------------------------------------------------------- faults

    def _judge_outage(self) -> None:
        """A third of the outage in each failure mode; a failing mode lasts until the worker has met it at
        least once (the worker may have had nothing to judge, or been restarting, for a whole third)."""
        third = self.plan.judge_outage_s / 3
        try:
            for mode in ("refuse", "error", "slow"):
                self.judge.set_mode(mode)
                time.sleep(third)
                if mode != "refuse":  # a refused connection reaches no handler, so there is nothing to count
                    self._wait_for_judge_request(mode)
        finally:
            self.judge.set_mode("answer")
        back = time.monotonic()
        self.report.recoveries.append(
            {
                "fault": "judge outage",
                "seconds": self.plan.judge_outage_s,
                "caught_up_s": self.caught_up_after(self.pipeline.worker_group("closed"), "closed", back),
            }
        )

    def _wait_for_judge_request(self, mode: str) -> None:
        wait_for(
            lambda: self.judge.requests.get(mode, 0) > 0,
            timeout=OUTAGE_MODE_MAX_WAIT_S,
            what=f"a judge request during the {mode!r} outage",
        )

    def _broker_fault(self, action: str) -> list[int]:
        """Kill (-9) the node the action names, or every node, and start it again on its files; returns the ids
        of the nodes killed. The worker, the sink and this run's own clients find the new leaders by themselves."""
        if action == "cluster restart":
            self.cluster.crash_and_restart_all()
            return [n.node_id for n in self.cluster]
        if action == "controller kill":
            node = self.cluster.active_controller()
        else:
            topic = self.pipeline.topic("events") if action == "events leader kill" else self._changelog
            node = self.cluster.leader_of(topic, self.rng.randrange(self.pipeline.partitions))
        self.cluster.crash_and_restart(node)
        return [node.node_id]

    @property
    def _changelog(self) -> str:
        return changelog_topic(KafkaSettings(app_id=self.pipeline.env["CONVOWATCH_KAFKA__APP_ID"]))

    def in_sync_after(self, since: float, timeout: float = 300) -> float:
        """Seconds from ``since`` until every partition of the pipeline's topics has all its replicas in sync."""
        topics = [self.pipeline.topic(t) for t in ("events", "closed", "scores", "dead_letter")] + [self._changelog]

        def in_sync() -> bool:
            with self._kafka:
                described = _unless_unreachable(self.admin.describe_topics, topics)
            partitions = [p for t in described or [] for p in t["partitions"]]
            return bool(partitions) and all(len(p["isr_nodes"]) == len(self.cluster.nodes) for p in partitions)

        wait_for(in_sync, timeout=timeout, interval=0.5, what="every replica back in sync")
        return round(time.monotonic() - since, 2)

    def _actions(self) -> list[str]:
        actions = ["worker kill"] * self.plan.worker_kills + ["sink kill"] * self.plan.sink_kills
        actions += ["events leader kill", "changelog leader kill"] * self.plan.leader_kills
        actions += ["controller kill"] * self.plan.controller_kills + ["cluster restart"] * self.plan.cluster_restarts
        actions += ["sink outage", "judge outage"]
        self.rng.shuffle(actions)
        return actions

    def run(self) -> FaultReport:
        started = time.monotonic()
        actions = self._actions()
        work = workload(self.plan.conversations, len(actions) + 1)
        worker, sink = self.start_worker(), self.start_sink()
        for chunk, action in zip(work.chunks, actions):
            self.pipeline.produce((item.key, item.raw) for item in chunk)
            time.sleep(self.rng.uniform(0.5, 3.0))
            at = time.monotonic()
            if action == "worker kill":
                self._stop(worker, kill=True)
                worker = self.start_worker()
                caught = self.caught_up_after(self.pipeline.worker_group("events"), "events", at)
                self.report.recoveries.append({"fault": action, "caught_up_s": caught})
            elif action == "sink kill":
                self._stop(sink, kill=True)
                sink = self.start_sink()
                self.report.recoveries.append(
                    {"fault": action, "caught_up_s": self.caught_up_after(self.sink_group, "scores", at)}
                )
            elif action in BROKER_FAULTS:
                killed = self._broker_fault(action)
                worker_back = self.caught_up_after(self.pipeline.worker_group("events"), "events", at)
                sink_back = self.caught_up_after(self.sink_group, "scores", at)
                self.report.recoveries.append(
                    {
                        "fault": action,
                        "nodes": killed,
                        "caught_up_s": max(worker_back, sink_back),
                        "in_sync_s": self.in_sync_after(at),
                    }
                )
            elif action == "sink outage":
                self._stop(sink, kill=False)
                time.sleep(self.plan.sink_outage_s)
                back = time.monotonic()
                sink = self.start_sink()
                self.report.recoveries.append(
                    {
                        "fault": action,
                        "seconds": self.plan.sink_outage_s,
                        "caught_up_s": self.caught_up_after(self.sink_group, "scores", back),
                    }
                )
            else:
                self._judge_thread = threading.Thread(target=self._judge_outage, daemon=True)
                self._judge_thread.start()
        self.pipeline.produce((item.key, item.raw) for item in work.chunks[-1])
        if self._judge_thread is not None:
            self._judge_thread.join()
        self._settle(worker, sink, work)
        self.report.judge_requests = dict(self.judge.requests)
        self.report.seconds = round(time.monotonic() - started, 1)
        return self.report

    # ---------------------------------------------------------------- the count

    def _settle(self, worker: Process, sink: Process, work: Workload) -> None:
        """Wait for every conversation's score record and for the sink, then read the store."""
        ids = set(work.sent)
        seen: dict[str, list[ScoreRecord]] = {}

        def all_scored() -> bool:
            for m in self.pipeline.consume("scores", 10**9, timeout=3):
                r = ScoreRecord.from_json(m.value)
                seen.setdefault(r.conversation_id, []).append(r)
            if ids <= set(seen):
                return True
            seen.clear()  # read again from the start next time
            return False

        wait_for(all_scored, timeout=900, interval=2, what="a score record for every conversation")
        self.report.score_records = sum(len(rs) for rs in seen.values())
        self.caught_up_after(self.sink_group, "scores", time.monotonic())
        open_left = worker.metric_sum("convowatch_open_conversations")
        self._stop(sink, kill=False)
        self._stop(worker, kill=False)
        self.report.stored = {
            **stored_counts(self.pipeline, work.sent),
            "open_conversations_left": open_left,
            "broker_lost_data": self.lost_data_flags,
            "dead_letters": len(self.pipeline.consume("dead_letter", 1, timeout=3)),
        }


def stored_counts(pipeline: Pipeline, sent: dict[str, list[tuple[int, str, str]]]) -> dict[str, Any]:
    """What the store holds against what was sent: rows, duplicates visible after FINAL, turns differing."""
    [scores] = pipeline.query_store(
        "SELECT count() AS rows, uniqExact(conversation_id) AS conversations, countIf(status = 'scored') AS scored "
        "FROM convowatch.conversation_scores FINAL"
    )
    rows = pipeline.query_store("SELECT conversation_id, turns FROM convowatch.conversations FINAL")
    stored = {r["conversation_id"]: [(int(t["index"]), t["role"], t["text"]) for t in r["turns"]] for r in rows}
    return {
        "sent": len(sent),
        "score_rows": scores["rows"],
        "scored": scores["scored"],
        "visible_duplicates": scores["rows"] - scores["conversations"],
        "missing": len(set(sent) - set(stored)),
        "unexpected": len(set(stored) - set(sent)),
        "turns_differing": sum(stored.get(cid) != turns for cid, turns in sent.items() if cid in stored),
    }


def _unless_unreachable(call: Callable[..., T], *args: Any) -> T | None:
    """``call(*args)``, or None while the broker cannot answer (restarting: the client backs off, NodeNotReadyError)."""
    try:
        return call(*args)
    except KafkaError:
        return None


def run_fault_suite(pipeline: Pipeline, rubric_set: Path, plan: FaultPlan, cluster: KafkaCluster) -> FaultReport:
    """Run ``plan`` on ``pipeline`` (no process started yet, its bootstrap ``cluster``'s) with a recorded judge
    server in front of it; ``cluster`` was started with `CLUSTER_OVERRIDES`."""
    with judge_server(rubric_set) as judge:
        run = FaultRun(pipeline, judge, plan, cluster)
        try:
            return run.run()
        finally:
            run.close()
