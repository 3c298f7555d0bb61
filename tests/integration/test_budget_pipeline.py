"""The judge budget in the real pipeline: Apache Kafka, worker processes, a real HTTP judge endpoint.

A tiny calls-per-minute budget (with a 20 s "minute") holds conversations back.
While the score agent waits, the worker must stay in its consumer group (the
wait outlasts the 15 s max poll interval and the 6 s session timeout of the
test settings), the conversations must stay in the closed topic (offsets not
committed), and once the budget refills every conversation is scored exactly
once. A rebalance or a stop calls the wait off: the stopping worker commits
nothing it did not finish, and the next owner takes the partition in order
from the committed offset, fetching it again if Faust passed over a record or
the partition stalled (`stream.delivery.GuardedDelivery`), so the waiting
conversation and the ones buffered behind it are scored exactly once.

The judge is the stand-in OpenAI-compatible server of tests/integration/test_pipeline.py
(real HTTP, the real client counting one call per question; fixed answers and
usage, because no local model answers fast enough: see `RecoveringJudgeServer`).
The recorded judge cannot be used: it reports no calls and no tokens, so a
budget never holds it back (tests/unit/test_budget.py shows that too).
"""

from __future__ import annotations

import time

import pytest
from kafka import KafkaAdminClient

from stream.cost import judge_cost
from stream.records import ScoreRecord
from stream.settings import PriceSettings
from tests.infra import free_port, wait_for
from tests.integration.test_pipeline import N_QUESTIONS, RecoveringJudgeServer, _few_conversations, _judge_env
from tests.pipeline import Pipeline, Process

N_CONVERSATIONS = 6  # three budget windows: pairs 2 and 3 wait for the pair before them
# Shortened from the defaults (300 s, 30 s): every scenario here is a budget wait longer than max_poll_interval and the
# session timeout, which at the defaults would hold each test for over five minutes.
SHORT_GROUP_TIMEOUTS = {"CONVOWATCH_KAFKA__MAX_POLL_INTERVAL_S": "15", "CONVOWATCH_KAFKA__SESSION_TIMEOUT_S": "10"}
MINUTE_S = 20  # the budget's "minute": long enough to outlast max_poll_interval (15 s above)
CALLS_PER_MINUTE = 2 * N_QUESTIONS  # two conversations' worth of calls (one call per question)
CLOCKS_S = 0.5  # the budget runs on the monotonic clock, scored_at is wall-clock time
PRICE = PriceSettings(prompt_per_million=2.0, completion_per_million=8.0, currency="EUR")


@pytest.fixture(autouse=True)
def _short_group_timeouts(pipeline: Pipeline) -> None:
    pipeline.extra_env.update(SHORT_GROUP_TIMEOUTS)


def _records(pipeline: Pipeline) -> dict[str, list[ScoreRecord]]:
    out: dict[str, list[ScoreRecord]] = {}
    for m in pipeline.consume("scores", 10**9, timeout=3):
        record = ScoreRecord.from_json(m.value)
        out.setdefault(record.conversation_id, []).append(record)
    return out


def _wait_all_scored(pipeline: Pipeline, ids: set[str], *workers: Process) -> None:
    try:
        wait_for(lambda: set(_records(pipeline)) >= ids, timeout=240, interval=2, what="every conversation scored")
    except TimeoutError:
        state = {
            w.name: (
                w.metric_sum("convowatch_judge_budget_exhausted"),
                w.metric_sum("convowatch_judge_budget_wait_seconds_total"),
                w.metric_sum("convowatch_conversations_scored_total"),
            )
            for w in workers
        }
        closed_topic = [(m.partition, m.offset, m.key.decode()) for m in pipeline.consume("closed", 10**9, timeout=3)]
        admin = KafkaAdminClient(bootstrap_servers=pipeline.bootstrap)
        committed = _committed(pipeline, admin)
        admin.close()
        # Which worker owns the missing partitions and what it last did (assignment, recovery, refetches) is in its log.
        logs = "\n".join(f"--- {w.name}: assignment, recovery and delivery lines ---\n" + _delivery_lines(w) for w in workers)
        raise AssertionError(
            f"missing {sorted(ids - set(_records(pipeline)))}; (exhausted, waited s, scored) per worker: "
            f"{state}; closed topic (partition, offset, key): {sorted(closed_topic)}; committed: {committed}\n{logs}"
        ) from None


def _delivery_lines(worker: Process, limit: int = 80) -> str:
    """The worker log's lines about assignment, recovery, refetches and budget waits (the last ``limit``)."""
    words = ("assign", "ecover", "Joined group", "fetching again", "left uncommitted", "budget", "No event", "rebalanc")
    lines = [line for line in worker.log.read_text(errors="replace").splitlines() if any(w in line for w in words)]
    return "\n".join(lines[-limit:])


def _joins(pipeline: Pipeline, log: str) -> int:
    """How often the log says the worker joined the group that reads the closed topic (aiokafka logs each join)."""
    return log.count(f"Joined group '{pipeline.worker_group('closed')}'")


def _committed(pipeline: Pipeline, admin: KafkaAdminClient) -> dict[int, int]:
    """The worker group's committed offsets on the closed topic, by partition."""
    group = pipeline.worker_group("closed")
    return {
        tp.partition: om.offset
        for tp, om in admin.list_group_offsets(group)[group].items()
        if tp.topic == pipeline.topic("closed")
    }


def _closed_backlog(pipeline: Pipeline, admin: KafkaAdminClient) -> int:
    """Closed conversations on the closed topic beyond the worker group's committed offsets."""
    ends: dict[int, int] = {}
    for m in pipeline.consume("closed", 10**9, timeout=3):
        ends[m.partition] = max(ends.get(m.partition, -1), m.offset) + 1
    committed = _committed(pipeline, admin)
    return sum(end - max(committed.get(p, 0), 0) for p, end in ends.items())


@pytest.mark.parametrize("consumer", ["batch"])  # faust: kept for compatibility (docs/architecture.md)
def test_a_spent_budget_holds_conversations_in_the_closed_topic_and_loses_none(pipeline: Pipeline, consumer: str) -> None:
    port = free_port()
    pipeline.extra_env.update(
        {
            "CONVOWATCH_KAFKA__CONSUMER": consumer,
            **_judge_env(port, max_attempts=3),
            "CONVOWATCH_SCORING__BUDGET__CALLS_PER_MINUTE": str(CALLS_PER_MINUTE),
            "CONVOWATCH_SCORING__BUDGET__MINUTE_S": str(MINUTE_S),
            "CONVOWATCH_JUDGE__PRICE__PROMPT_PER_MILLION": str(PRICE.prompt_per_million),
            "CONVOWATCH_JUDGE__PRICE__COMPLETION_PER_MILLION": str(PRICE.completion_per_million),
            "CONVOWATCH_JUDGE__PRICE__CURRENCY": PRICE.currency,
        }
    )
    items, ids = _few_conversations(N_CONVERSATIONS)
    admin = KafkaAdminClient(bootstrap_servers=pipeline.bootstrap)
    with RecoveringJudgeServer(port, failures=0):
        worker = pipeline.start_worker("worker-1")
        pipeline.wait_assigned([worker])
        assert worker.metric_sum("convowatch_judge_budget_exhausted", limit="calls_per_minute") == 0
        pipeline.produce((i.key, i.raw) for i in items)

        wait_for(
            lambda: worker.metric_sum("convowatch_judge_budget_exhausted", limit="calls_per_minute") == 1,
            timeout=120,
            what="the budget is exhausted",
        )
        # Held back for longer than max_poll_interval (and the session timeout), and the budget refilled at least once
        # in that time (a third conversation needs the first's calls to leave the window).
        poll_s = float(pipeline.env["CONVOWATCH_KAFKA__MAX_POLL_INTERVAL_S"])
        wait_for(
            lambda: worker.metric_sum("convowatch_judge_budget_wait_seconds_total") > poll_s + 1 and len(_records(pipeline)) >= 3,
            timeout=120,
            interval=1,
            what="a long wait and a refill",
        )
        held = _records(pipeline)
        assert 3 <= len(held) < N_CONVERSATIONS, len(held)
        assert worker.metric_sum("convowatch_judge_budget_exhausted", limit="calls_per_minute") == 1
        # The worker stayed in its group and kept its partitions; the waiting conversations' offsets are not committed.
        assert worker.popen.poll() is None
        assert worker.metric_sum("convowatch_assigned_partitions") == pipeline.partitions
        log = worker.log.read_text(errors="replace")
        # aiokafka logs every join ("Joined group ... (generation N)"); idle past max_poll_interval it leaves the group.
        assert _joins(pipeline, log) == 1, worker.log_tail()
        assert not any(s in log for s in ("LeaveGroup", "Heartbeat session expired", "Heartbeat failed")), worker.log_tail()
        backlog = _closed_backlog(pipeline, admin)
        assert backlog >= N_CONVERSATIONS - len(_records(pipeline)) > 0, backlog
        # The budget refills: the same worker scores every conversation, each exactly once.
        _wait_all_scored(pipeline, ids, worker)

    records = _records(pipeline)
    admin.close()
    assert {cid: [r.status for r in rs] for cid, rs in records.items()} == {cid: ["scored"] for cid in ids}
    assert all(r.judge_calls == N_QUESTIONS and r.judge_prompt_tokens == 100 * N_QUESTIONS for rs in records.values() for r in rs)
    # The budget held: 2 conversations' calls per window, so the k-th and (k+2)-th scores are at least a window apart
    # (a conversation is admitted only once the calls of the one two before it have left the window).
    times = sorted(r.scored_at for rs in records.values() for r in rs)
    assert all(b - a >= MINUTE_S - CLOCKS_S for a, b in zip(times, times[2:])), times
    # A wait of about a window for every pair after the first (each waits for the pair before it), less the time between a
    # settlement and the next conversation's acquire (CLOCKS_S covers it on an idle machine; 2 s allows for load).
    assert worker.metric_sum("convowatch_judge_budget_wait_seconds_total") >= (N_CONVERSATIONS // 2 - 1) * (MINUTE_S - 2)
    # The cost counter prices the tokens the judge reported.
    expected = sum(
        judge_cost(PRICE, r.judge_prompt_tokens, r.judge_cached_prompt_tokens, r.judge_completion_tokens)
        for rs in records.values()
        for r in rs
    )
    assert expected > 0 and worker.metric_sum("convowatch_judge_cost_total", currency="EUR") == pytest.approx(expected)
    wait_for(
        lambda: worker.metric_sum("convowatch_judge_budget_exhausted", limit="calls_per_minute") == 0,
        timeout=30,
        what="the gauge back at 0 once nothing waits",
    )
    assert _joins(pipeline, worker.log.read_text(errors="replace")) == 1  # no rebalance in the whole run


@pytest.mark.parametrize("consumer", ["batch"])  # faust: kept for compatibility (docs/architecture.md)
def test_a_worker_stopped_while_waiting_commits_nothing_unscored(pipeline: Pipeline, consumer: str) -> None:
    port = free_port()
    pipeline.extra_env.update(
        {
            "CONVOWATCH_KAFKA__CONSUMER": consumer,
            **_judge_env(port, max_attempts=3),
            "CONVOWATCH_SCORING__BUDGET__CALLS_PER_MINUTE": str(CALLS_PER_MINUTE),
            "CONVOWATCH_SCORING__BUDGET__MINUTE_S": str(MINUTE_S),
        }
    )
    items, ids = _few_conversations(N_CONVERSATIONS)
    admin = KafkaAdminClient(bootstrap_servers=pipeline.bootstrap)
    with RecoveringJudgeServer(port, failures=0):
        worker = pipeline.start_worker("worker-1")
        pipeline.wait_assigned([worker])
        pipeline.produce((i.key, i.raw) for i in items)
        wait_for(
            lambda: (
                worker.metric_sum("convowatch_judge_budget_exhausted", limit="calls_per_minute") == 1
                and len(_records(pipeline)) >= 3
            ),
            timeout=120,
            interval=1,
            what="waiting after a refill",
        )
        # Stop the worker while it waits: it exits promptly (the wait is called off, the conversation left unfinished) ...
        started = time.monotonic()
        worker.terminate()
        assert worker.popen.returncode == 0, worker.log_tail()
        print(f"worker stopped {time.monotonic() - started:.1f} s after SIGTERM while waiting for the budget")
        log = worker.log.read_text(errors="replace")
        assert "left in the closed topic while waiting for the judge budget" in log, worker.log_tail()
        if consumer == "faust":
            assert "left uncommitted" in log, worker.log_tail()  # Faust's ack of the unfinished event did not commit it
        # ... and what it committed covers only conversations it scored.
        scored_ids = set(_records(pipeline))
        closed = [(m.partition, m.offset, m.key.decode()) for m in pipeline.consume("closed", 10**9, timeout=3)]
        committed = _committed(pipeline, admin)
        admin.close()
        skipped = [(p, o, k) for p, o, k in closed if o < committed.get(p, 0) and k not in scored_ids]
        assert not skipped, f"committed past unscored conversations {skipped}: closed {sorted(closed)}, committed {committed}"
        # A new worker (a fresh budget) scores the rest: every conversation exactly once.
        successor = pipeline.start_worker("worker-2")
        _wait_all_scored(pipeline, ids, successor)
    records = _records(pipeline)
    assert {cid: [r.status for r in rs] for cid, rs in records.items()} == {cid: ["scored"] for cid in ids}


@pytest.mark.parametrize("consumer", ["batch"])  # faust: kept for compatibility (docs/architecture.md)
def test_a_rebalance_calls_off_the_wait_and_the_waiting_conversation_is_scored_once(pipeline: Pipeline, consumer: str) -> None:
    port = free_port()
    pipeline.extra_env.update(
        {
            "CONVOWATCH_KAFKA__CONSUMER": consumer,
            **_judge_env(port, max_attempts=3),
            "CONVOWATCH_SCORING__BUDGET__CALLS_PER_MINUTE": str(CALLS_PER_MINUTE),
            "CONVOWATCH_SCORING__BUDGET__MINUTE_S": str(MINUTE_S),
        }
    )
    items, ids = _few_conversations(N_CONVERSATIONS)
    with RecoveringJudgeServer(port, failures=0):
        first = pipeline.start_worker("worker-a")
        pipeline.wait_assigned([first])
        pipeline.produce((i.key, i.raw) for i in items)
        wait_for(
            lambda: first.metric_sum("convowatch_judge_budget_exhausted", limit="calls_per_minute") == 1,
            timeout=120,
            what="the budget is exhausted",
        )
        # A second worker joins while the first waits: the rebalance must not wait for the budget.
        second = pipeline.start_worker("worker-b")
        pipeline.wait_assigned([first, second], each_at_least=1, timeout=120)
        _wait_all_scored(pipeline, ids, first, second)
        log = first.log.read_text(errors="replace")

    records = _records(pipeline)
    assert {cid: [r.status for r in rs] for cid, rs in records.items()} == {cid: ["scored"] for cid in ids}
    assert "left in the closed topic while waiting for the judge budget" in log, first.log_tail()
    assert first.popen.poll() is None and "LeaveGroup" not in log and "Heartbeat session expired" not in log
    assert _joins(pipeline, log) == 2  # the first join and the rebalance, nothing else
    # The rebalance did not wait for the budget: once the wait was called off, the next buffered conversation did not
    # start a new one (Faust logs "Waiting for tasks" while it waits for an agent's event, and its flight recorder
    # "Task timed out" after 95 % of the session timeout).
    assert "wait_empty: Waiting for tasks" not in log and "Task timed out" not in log, first.log_tail()


def test_a_worker_blocked_past_max_poll_interval_joins_its_group_again(pipeline: Pipeline) -> None:
    """A spent budget with a full buffer (``kafka.stream_buffer_maxsize`` 1): Faust stops fetching, so after
    ``max_poll_interval_s`` aiokafka leaves the group. aiokafka rejoins only after a fetch and Faust fetches only
    after the rejoin, so before `stream.app`'s ConsumerThread counted the revoke as fetch activity the worker
    stopped for good here (found under load in bench/bounded_memory.py). After the rejoin, a record fetched out of
    order is fetched again, which used to crash Faust's fetcher (`GuardedDelivery._refetch` handed it aiokafka's
    TopicPartition; seen in CI). Now it joins again, and once the budget refills every conversation is scored
    exactly once."""
    port = free_port()
    pipeline.extra_env.update(
        {
            **_judge_env(port, max_attempts=3),
            "CONVOWATCH_SCORING__BUDGET__CALLS_PER_MINUTE": str(CALLS_PER_MINUTE),
            "CONVOWATCH_SCORING__BUDGET__MINUTE_S": str(MINUTE_S),
            "CONVOWATCH_KAFKA__STREAM_BUFFER_MAXSIZE": "1",
            "CONVOWATCH_KAFKA__CONSUMER": "faust",  # Faust's stream buffer; the batch stages keep polling while they wait
            # One score agent, blocked on the budget with a full buffer, is the scenario. With the default 4, a
            # conversation in flight at the rebalance can be scored twice (at least once; the sink stores it once),
            # which the exactly-once check below would not tell from a fetch bug.
            "CONVOWATCH_SCORING__CONCURRENCY": "1",
        }
    )
    # Four windows: with three the last wait ended before the blocked consumer's revoke came (seen here).
    items, ids = _few_conversations(N_CONVERSATIONS + 2)
    with RecoveringJudgeServer(port, failures=0):
        worker = pipeline.start_worker("worker-1")
        pipeline.wait_assigned([worker])
        pipeline.produce((i.key, i.raw) for i in items)
        _wait_all_scored(pipeline, ids, worker)
        log = worker.log.read_text(errors="replace")

    records = _records(pipeline)
    assert {cid: [r.status for r in rs] for cid, rs in records.items()} == {cid: ["scored"] for cid in ids}
    assert worker.popen.poll() is None
    # The scenario happened: alone in its group, the blocked worker was revoked while it waited for the budget and
    # joined again, and not because its heartbeats stopped.
    assert "left in the closed topic while waiting for the judge budget" in log, worker.log_tail()
    assert log.count("Joined group") >= 2 and "Heartbeat session expired" not in log, worker.log_tail()
