"""End to end on the real components: Apache Kafka, worker and sink processes, the embedded ClickHouse engine.

Conversations are the 223 real LLM-Rubric conversations, scored with the
recorded GPT-3.5 judge, a rubric set and a calibrator made by the scoring-core
commands (the `scoring_artifacts` fixture).
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from kafka import KafkaAdminClient
from kafka.errors import MessageSizeTooLargeError
from prometheus_client import CollectorRegistry

from stream.contract import DeadLetter, EndEvent, FeedbackEvent, InvalidEvent, RatingEvent, TurnEvent, encode_event, parse_event
from stream.metrics import ServiceMetrics
from stream.records import ScoreRecord
from stream.replay.sources import ReplayItem, llm_rubric_events
from stream.settings import Settings
from stream.sink import ScoreSink
from stream.topics import ensure_topics
from tests.chdb_fixture import chdb_dsn, chdb_store, store_factory  # noqa: F401
from tests.infra import free_port, wait_for
from tests.integration.test_store import closed
from tests.pipeline import Pipeline

N_REAL = 223
N_REAL_TURNS = 1813
N_QUESTIONS = 9  # Q0..Q8: the questions the judge is asked
N_DIMENSIONS = 8  # Q0..Q7: the default calibrator predicts the ordinal questions (Q8 is an input only)


def _real_items() -> list[ReplayItem]:
    return list(llm_rubric_events())


def _ids(items: list[ReplayItem]) -> set[str]:
    return {i.event.conversation_id for i in items if i.event is not None}


def _scored_ids(pipeline: Pipeline, expect: int) -> dict[str, list[ScoreRecord]]:
    out: dict[str, list[ScoreRecord]] = {}
    for m in pipeline.consume("scores", expect):
        record = ScoreRecord.from_json(m.value)
        out.setdefault(record.conversation_id, []).append(record)
    return out


def _wait_scores(pipeline: Pipeline, ids: set[str], timeout: float = 180) -> dict[str, list[ScoreRecord]]:
    """Until every id has a record on the scores topic; returns all records by id (re-deliveries included)."""
    result: dict[str, list[ScoreRecord]] = {}

    def done() -> bool:
        nonlocal result
        result = _scored_ids(pipeline, len(ids))
        return ids <= set(result)

    try:
        wait_for(done, timeout=timeout, interval=1, what="scores for every conversation")
    except TimeoutError:
        missing = sorted(ids - set(result))
        raise AssertionError(f"{len(missing)} conversations never scored, e.g. {missing[:5]}") from None
    return result


def _wait_sink_caught_up(pipeline: Pipeline, timeout: float = 120, topic: str = "scores") -> None:
    """Until the sink group's committed offsets cover every record on ``topic`` (counted by reading it)."""
    last: dict[int, int] = {}
    for m in pipeline.consume(topic, 10**9, timeout=5):
        last[m.partition] = max(last.get(m.partition, -1), m.offset)
    admin = KafkaAdminClient(bootstrap_servers=pipeline.bootstrap)
    try:

        def committed() -> bool:
            group = pipeline.env["CONVOWATCH_KAFKA__SINK_GROUP"]
            offsets = admin.list_group_offsets(group)[group]
            got = {tp.partition: om.offset for tp, om in offsets.items() if tp.topic == pipeline.topic(topic)}
            return all(got.get(p, -1) > off for p, off in last.items())

        wait_for(committed, timeout=timeout, interval=0.5, what="sink commits")
    finally:
        admin.close()


def _store_counts(pipeline: Pipeline) -> dict:
    [row] = pipeline.query_store(
        "SELECT count() AS rows, uniqExact(conversation_id) AS conversations, countIf(status = 'scored') AS scored "
        "FROM convowatch.conversation_scores FINAL"
    )
    return row


# ------------------------------------------------------------------ happy path


def test_replayed_conversations_are_scored_in_clickhouse_and_metrics(pipeline: Pipeline, tmp_path: Path) -> None:
    worker = pipeline.start_worker()
    sink = pipeline.start_sink()
    pipeline.wait_assigned([worker])

    items = _real_items()
    ids = sorted(_ids(items))
    done = pipeline.replay("llm-rubric")
    assert f"sent {N_REAL_TURNS + N_REAL} events" in done.stdout

    feedback = tmp_path / "feedback.jsonl"
    thumbs = [
        FeedbackEvent(cid, 1, rating, 1.7e9 + i)
        for i, (cid, rating) in enumerate([(ids[0], "up"), (ids[1], "down"), (ids[2], "down")])
    ]
    scores = [RatingEvent(ids[0], 4, 5, 1.7e9 + 10, "quick"), RatingEvent(ids[3], 1, 4, 1.7e9 + 11)]  # after the close
    feedback.write_text("".join(encode_event(e).decode() + "\n" for e in [*thumbs, *scores]))
    pipeline.replay("jsonl", str(feedback))

    wait_for(
        lambda: (
            sink.metric_sum("convowatch_sink_rows_total", table="conversation_scores") >= N_REAL
            and sink.metric_sum("convowatch_sink_rows_total", table="feedback") >= 3
            and sink.metric_sum("convowatch_sink_rows_total", table="conversation_ratings") >= 2
        ),
        timeout=180,
        what="sink rows",
    )

    # Worker metrics: every event counted by type and outcome, every conversation closed and scored once.
    assert worker.metric_sum("convowatch_events_total", type="turn", outcome="accepted") == N_REAL_TURNS
    assert worker.metric_sum("convowatch_events_total", type="rating", outcome="accepted") == 2
    assert worker.metric_sum("convowatch_conversations_closed_total", cause="end") == N_REAL
    assert worker.metric_sum("convowatch_conversations_scored_total") == N_REAL
    assert worker.metric_sum("convowatch_calibrated_conversations_total") == N_REAL
    p_dsat = worker.metric_sum("convowatch_calibrated_dissatisfaction_probability_total")
    assert 0 < p_dsat < N_REAL
    assert worker.metric_sum("convowatch_dimension_expected_value_count", dimension="Q0") == N_REAL
    assert worker.metric_sum("convowatch_conversations_scored_total", model_version="variant-0") == 76
    assert worker.metric_sum("convowatch_dead_letters_total") == 0
    assert sink.metric_sum("convowatch_close_to_store_latency_seconds_count") == N_REAL
    # Nothing lost, as either consumer sees it.
    assert worker.metric_sum("convowatch_broker_lost_data_total") == sink.metric_sum("convowatch_broker_lost_data_total") == 0
    # Once everything is consumed, both consumers show lag series at 0
    wait_for(
        lambda: (
            worker.metric_sum("convowatch_consumer_lag", topic=pipeline.topic("events")) == 0
            and len([k for k in worker.metrics() if k[0] == "convowatch_consumer_lag"]) >= 4
        ),
        timeout=30,
        what="worker lag 0",
    )
    assert sink.metric_sum("convowatch_consumer_lag", topic=pipeline.topic("scores")) == 0
    assert any(k[0] == "convowatch_consumer_lag" for k in sink.metrics())

    sink.terminate()
    assert sink.popen.returncode == 0, sink.log_tail()
    assert _store_counts(pipeline) == {"rows": N_REAL, "conversations": N_REAL, "scored": N_REAL}
    [dims] = pipeline.query_store("SELECT count() AS n, uniqExact(question_id) AS q FROM convowatch.dimension_predictions FINAL")
    assert dims == {"n": N_REAL * N_DIMENSIONS, "q": N_DIMENSIONS}
    [turns] = pipeline.query_store("SELECT sum(n_turns) AS n FROM convowatch.conversations FINAL")
    assert turns["n"] == N_REAL_TURNS
    fb = pipeline.query_store("SELECT conversation_id, rating FROM convowatch.feedback FINAL ORDER BY conversation_id")
    assert fb == [
        {"conversation_id": ids[0], "rating": "up"},
        {"conversation_id": ids[1], "rating": "down"},
        {"conversation_id": ids[2], "rating": "down"},
    ]
    stored = pipeline.query_store(
        "SELECT conversation_id, score, scale, comment FROM convowatch.conversation_ratings FINAL ORDER BY conversation_id"
    )
    assert stored == [
        {"conversation_id": ids[0], "score": 4, "scale": 5, "comment": "quick"},
        {"conversation_id": ids[3], "score": 1, "scale": 4, "comment": ""},
    ]
    # The calibrated dissatisfaction in the metrics is the sum of the stored probabilities.
    [s] = pipeline.query_store("SELECT sum(dissatisfaction_probability) AS p FROM convowatch.conversation_scores FINAL")
    assert s["p"] == pytest.approx(p_dsat, rel=1e-9)


# ------------------------------------------------------------------ bad input


def _mutations(valid: list[bytes], rng: random.Random, n: int) -> list[tuple[bytes | None, bytes]]:
    """Invalid events made by breaking valid ones in random ways (a fixed seed), each under a fresh conversation id."""
    out = []
    while len(out) < n:
        obj = json.loads(rng.choice(valid))
        cid = f"fuzz-{len(out)}"
        obj["conversation_id"] = cid
        how = rng.randrange(8)
        if how == 0:
            obj.pop(rng.choice(sorted(obj)))
        elif how == 1:
            obj[rng.choice(sorted(obj))] = rng.choice([None, True, 1.5, [], {}, "x", -3])
        elif how == 2:
            obj["surprise"] = 1
        elif how == 3:
            obj["schema_version"] = rng.choice([0, 2, "1"])
        elif how == 4:
            obj["type"] = rng.choice(["turns", "End", ""])
        raw = json.dumps(obj).encode()
        if how == 5:
            raw = raw[: rng.randrange(1, len(raw))]
        elif how == 6:
            raw = raw.replace(b'"', b"'", 1)
        elif how == 7:
            raw = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 40)))
        try:
            parse_event(raw, key=cid.encode())
        except InvalidEvent:
            out.append((cid.encode(), raw))
    return out


def test_bad_input_is_dead_lettered_with_its_reason_and_valid_conversations_are_scored(pipeline: Pipeline) -> None:
    pipeline.extra_env["CONVOWATCH_ASSEMBLY__MAX_TEXT_BYTES"] = "20000"
    worker = pipeline.start_worker()
    pipeline.wait_assigned([worker])

    items = _real_items()
    valid_ids = sorted(_ids(items))[:20]
    valid = [i for i in items if i.event is not None and i.event.conversation_id in valid_ids]
    first = valid_ids[0]
    t = 1_707_000_000.0
    k = first.encode()
    # Fixed corpus: one example of every reason the worker can find, with what we expect.
    fixed: list[tuple[bytes | None, bytes | None, str]] = [
        (b"c-a", b"\xff\xfe\x00 not utf-8", "invalid_utf8"),
        (b"c-b", b"this is not json", "not_json"),
        (b"c-c", b"[1, 2]", "not_object"),
        (b"c-d", None, "not_json"),
        (b"c-e", b'{"schema_version": 1, "type": "turn", "conversation_id": "c-e"}', "missing_field"),
        (
            b"c-f",
            json.dumps(
                {
                    "schema_version": 1,
                    "type": "turn",
                    "conversation_id": "c-f",
                    "turn_index": 0,
                    "role": "robot",
                    "text": "hi",
                    "timestamp": "2024-02-09T00:00:00Z",
                }
            ).encode(),
            "unknown_role",
        ),
        (
            b"c-g",
            json.dumps(
                {
                    "schema_version": 1,
                    "type": "turn",
                    "conversation_id": "c-g",
                    "turn_index": -1,
                    "role": "user",
                    "text": "hi",
                    "timestamp": "2024-02-09T00:00:00Z",
                }
            ).encode(),
            "negative_turn_index",
        ),
        (b"c-h", encode_event(TurnEvent("c-h", 0, "user", "x" * 20001, t, {})), "oversized_text"),
        (b"not-c-i", encode_event(TurnEvent("c-i", 0, "user", "hi", t, {})), "key_mismatch"),
        (
            b"c-j",
            json.dumps(
                {
                    "schema_version": 1,
                    "type": "turn",
                    "conversation_id": "c-j",
                    "turn_index": True,
                    "role": "user",
                    "text": "hi",
                    "timestamp": "2024-02-09T00:00:00Z",
                }
            ).encode(),
            "wrong_type",
        ),
        (b"c-k", encode_event(EndEvent("c-k", t)), "empty_conversation"),
        (k, encode_event(TurnEvent(first, 0, "user", "a different first turn", t, {})), "duplicate_turn_index"),
    ]
    late = (k, encode_event(TurnEvent(first, 999, "user", "a turn after the end", t, {})), "conversation_closed")
    fuzzed = _mutations([i.raw for i in valid], random.Random(1234), 60)

    records: list[tuple[bytes | None, bytes | None]] = []
    for item in valid:
        records.append((item.key, item.raw))
        if item.event.conversation_id == first and isinstance(item.event, TurnEvent) and item.event.turn_index == 0:
            records.append(fixed[-1][:2])  # the conflicting duplicate right after the real turn 0
            records.append((item.key, item.raw))  # and an exact redelivery, which is silently dropped
    records += [(key, value) for key, value, _ in fixed[:-1]]
    records.append(late[:2])  # after `first` has ended
    records += fuzzed
    pipeline.produce(records)

    expected = [(value or b"", reason) for _, value, reason in fixed + [late]]
    expected += [(raw, parse_event_reason(raw, key)) for key, raw in fuzzed]
    letters = [DeadLetter.from_json(m.value) for m in pipeline.consume("dead_letter", len(expected))]
    got = sorted((letter.original, letter.reason) for letter in letters)
    assert got == sorted(expected)

    scores = _wait_scores(pipeline, set(valid_ids))
    assert set(scores) == set(valid_ids)
    assert all(r.status == "scored" for rs in scores.values() for r in rs)
    first_score = scores[first][0]
    assert [t.index for t in first_score.conversation.turns] == list(range(len(first_score.conversation.turns)))
    assert worker.popen.poll() is None, "the worker must survive any input"
    assert worker.metric_sum("convowatch_events_total", type="turn", outcome="duplicate") == 1
    assert worker.metric_sum("convowatch_dead_letters_total") == len(expected)


def test_a_closed_topic_record_that_is_no_conversation_is_dead_lettered_and_the_poll_around_it_is_scored(
    pipeline: Pipeline,
) -> None:
    """The score stage scores a poll at once with the recorded judge (`score_many`): a bad record in the middle of the
    poll becomes a dead letter with its bytes, and the conversations before and after it are scored in order."""
    worker = pipeline.start_worker()
    pipeline.wait_assigned([worker])
    ids = sorted(_ids(_real_items()))[:6]
    bad = b'{"conversation_id": "half a record"}'
    records = [(cid.encode(), closed(cid).to_json()) for cid in ids[:3]]
    records += [(b"half", bad)] + [(cid.encode(), closed(cid).to_json()) for cid in ids[3:]]
    pipeline.produce_to("closed", records)

    scores = _wait_scores(pipeline, set(ids))
    assert all(r.status == "scored" for rs in scores.values() for r in rs)
    [letter] = [DeadLetter.from_json(m.value) for m in pipeline.consume("dead_letter", 1)]
    assert (letter.reason, letter.original) == ("bad_closed_record", bad)
    assert worker.metric_sum("convowatch_dead_letters_total", reason="bad_closed_record") == 1


def test_an_event_too_large_for_its_dead_letter_is_dead_lettered_in_part_and_the_worker_goes_on(pipeline: Pipeline) -> None:
    """An event of 1.5 MB is refused to the producer by Kafka (the events topic's ``max.message.bytes``, default
    1,048,588 bytes a batch). One just under that limit is taken, and base64 makes its dead letter larger than the
    worker's 1 MB record limit: it is dead-lettered in part. Before, the assemble agent crashed
    (MessageSizeTooLargeError) and the event was lost with only a log line."""
    worker = pipeline.start_worker()
    pipeline.wait_assigned([worker])
    refused = encode_event(TurnEvent("c-refused", 0, "user", "x" * 1_500_000, 1_707_000_000.0, {}))
    with pytest.raises(MessageSizeTooLargeError):
        pipeline.produce([(b"c-refused", refused)], max_request_size=4 * 1_048_576)
    huge = encode_event(TurnEvent("c-huge", 0, "user", "x" * 1_040_000, 1_707_000_000.0, {}))
    items = _real_items()
    after = sorted(_ids(items))[:2]
    pipeline.produce([(b"c-huge", huge)], max_request_size=4 * 1_048_576)
    pipeline.produce((i.key, i.raw) for i in items if i.event is not None and i.event.conversation_id in after)
    [message] = pipeline.consume("dead_letter", 1)
    pipeline.check_too_large_dead_letter(message, huge, b"c-huge", offset=0)  # the first record of its partition
    assert set(_wait_scores(pipeline, set(after))) == set(after)  # the conversations after it are scored
    assert worker.popen.poll() is None and worker.metric_sum("convowatch_dead_letters_total", reason="too_large") == 1


def parse_event_reason(raw: bytes, key: bytes | None) -> str:
    try:
        parse_event(raw, key=key)
    except InvalidEvent as e:
        return e.reason
    raise AssertionError("expected an invalid event")


# ------------------------------------------------------------------ crash


def _publish_in_steps(pipeline: Pipeline, items: list[ReplayItem], steps: int) -> Iterator[int]:
    chunk = -(-len(items) // steps)
    for i in range(steps):
        part = items[i * chunk : (i + 1) * chunk]
        pipeline.produce((item.key, item.raw) for item in part)
        yield i


# faust (kept for compatibility, docs/architecture.md) in the harder case only: four agents finishing out of order.
@pytest.mark.parametrize("scoring_concurrency, consumer", [(4, "faust"), (1, "batch"), (4, "batch")])
def test_kill_9_of_worker_and_sink_loses_nothing_and_shows_no_duplicates(
    pipeline: Pipeline, scoring_concurrency: int, consumer: str
) -> None:
    """With ``scoring.concurrency`` 4, four score agents (faust) or scorers of a poll (batch) share the closed topic's
    records and may finish out of order: a commit must still cover only the finished conversations. With
    ``kafka.consumer`` batch, the restarted worker reads the open conversations back from the changelog the killed one
    wrote."""
    env = {"CONVOWATCH_SCORING__CONCURRENCY": str(scoring_concurrency), "CONVOWATCH_KAFKA__CONSUMER": consumer}
    worker = pipeline.start_worker("worker-1", env)
    sink = pipeline.start_sink("sink-1")
    pipeline.wait_assigned([worker])
    items = _real_items()
    ids = _ids(items)

    for step in _publish_in_steps(pipeline, items, 4):
        time.sleep(2)
        if step == 1:
            worker.kill9()  # mid-stream: conversations half assembled, some closed but maybe not scored
            worker = pipeline.start_worker("worker-2", env)
            pipeline.wait_assigned([worker])
        if step == 2:
            sink.kill9()  # mid-write: offsets not yet committed for what it was writing
            sink = pipeline.start_sink("sink-2")

    records = _wait_scores(pipeline, ids)
    _wait_sink_caught_up(pipeline)
    sink.terminate()
    assert sink.popen.returncode == 0, sink.log_tail()
    counts = _store_counts(pipeline)
    assert counts == {"rows": N_REAL, "conversations": N_REAL, "scored": N_REAL}, counts
    stored = {r["conversation_id"] for r in pipeline.query_store("SELECT conversation_id FROM convowatch.conversations FINAL")}
    assert stored == ids
    # Every stored conversation has all its turns, although the worker died while assembling some.
    [turns] = pipeline.query_store(
        "SELECT sum(n_turns) AS n, sum(length(missing_turn_indices)) AS missing FROM convowatch.conversations FINAL"
    )
    assert turns == {"n": N_REAL_TURNS, "missing": 0}
    redelivered = sum(len(rs) - 1 for rs in records.values())
    print(f"re-delivered score records after the crashes: {redelivered}")


def test_a_deployment_switched_from_faust_to_batch_goes_on_where_the_faust_workers_left_off(pipeline: Pipeline) -> None:
    """``kafka.consumer`` faust → batch: the stages' new groups have no offsets; they start where the Faust workers'
    group (``kafka.app_id``) left the events and closed topics, and read the open conversations back from the same
    changelog. Without that the batch worker would read both topics from the start and judge every conversation
    again."""
    by_id: dict[str, list[ReplayItem]] = {}
    for item in _real_items():
        by_id.setdefault(item.event.conversation_id, []).append(item)
    ids = set(by_id)
    open_at_switch = sorted(ids)[::3]  # all but their last turn and end before the switch, the rest after it
    before = [i for cid, items in by_id.items() for i in (items[:-2] if cid in open_at_switch else items)]
    after = [i for cid in open_at_switch for i in by_id[cid][-2:]]

    faust = pipeline.start_worker("worker-faust", {"CONVOWATCH_KAFKA__CONSUMER": "faust"})
    pipeline.wait_assigned([faust])
    pipeline.produce((i.key, i.raw) for i in before)
    _wait_scores(pipeline, ids - set(open_at_switch))
    wait_for(lambda: faust.metric_sum("convowatch_open_conversations") == len(open_at_switch), timeout=60, what="open")
    faust.terminate()
    assert faust.popen.returncode == 0, faust.log_tail()

    batch = pipeline.start_worker("worker-batch", {"CONVOWATCH_KAFKA__CONSUMER": "batch"})
    pipeline.wait_assigned([batch])
    pipeline.produce((i.key, i.raw) for i in after)
    records = _wait_scores(pipeline, ids)
    log = batch.log.read_text(errors="replace")
    assert log.count(f"where the group {pipeline.env['CONVOWATCH_KAFKA__APP_ID']} left it") == 2, batch.log_tail()
    # Nothing judged twice, and the conversations open at the switch have every turn, read back from the changelog.
    assert {cid: len(rs) for cid, rs in records.items() if len(rs) != 1} == {}
    turns_sent = {cid: sum(isinstance(i.event, TurnEvent) for i in items) for cid, items in by_id.items()}
    assert {cid: len(rs[0].conversation.turns) for cid, rs in records.items()} == turns_sent


# ------------------------------------------------------------------ scale-out


@pytest.mark.parametrize("consumer", ["faust", "batch"])
def test_two_workers_split_the_partitions_and_score_everything_once(pipeline: Pipeline, consumer: str) -> None:
    pipeline.extra_env["CONVOWATCH_KAFKA__CONSUMER"] = consumer
    a = pipeline.start_worker("worker-a")
    pipeline.wait_assigned([a])
    b = pipeline.start_worker("worker-b")
    pipeline.wait_assigned([a, b], each_at_least=1, timeout=120)
    items = _real_items()
    ids = _ids(items)
    pipeline.replay("llm-rubric")
    records = _wait_scores(pipeline, ids)

    scored = [w.metric_sum("convowatch_conversations_scored_total") for w in (a, b)]
    assert min(scored) > 0, scored
    assert sum(scored) == N_REAL, scored
    assert sum(len(rs) for rs in records.values()) == N_REAL
    assert [w.metric_sum("convowatch_assigned_partitions") for w in (a, b)] == [2, 2]
    assert [w.metric_sum("convowatch_broker_lost_data_total") for w in (a, b)] == [0, 0]  # a rebalance loses nothing


# ------------------------------------------------------------------ judge outage


class RecoveringJudgeServer:
    """An OpenAI-compatible endpoint that starts late on a fixed port, then fails its first requests.

    The outage is real (connection refused while nothing listens, then HTTP 503s).
    The answering model is a stand-in: no local model can serve logprob
    answers fast enough for this test (llama.cpp on Gemma takes 30-70 s per
    conversation here), so once "recovered" it returns one fixed distribution.
    """

    def __init__(self, port: int, failures: int) -> None:
        self.port, self.failures, self.requests = port, failures, 0
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with server._lock:
                    server.requests += 1
                    failing = server.requests <= server.failures
                body = b'{"error": {"message": "overloaded"}}' if failing else json.dumps(_completion()).encode()
                self.send_response(503 if failing else 200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> RecoveringJudgeServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _completion() -> dict:
    import math

    top = [{"token": str(i), "logprob": math.log(p), "bytes": None} for i, p in zip(range(1, 5), (0.1, 0.2, 0.3, 0.35))]
    return {
        "id": "x",
        "object": "chat.completion",
        "created": 0,
        "model": "stand-in",
        "choices": [
            {
                "index": 0,
                "finish_reason": "length",
                "message": {"role": "assistant", "content": top[3]["token"]},
                "logprobs": {"content": [{"token": "4", "logprob": top[3]["logprob"], "bytes": None, "top_logprobs": top}]},
            }
        ],
        "usage": {"prompt_tokens": 100, "completion_tokens": 1, "total_tokens": 101},
    }


def _judge_env(port: int, max_attempts: int) -> dict[str, str]:
    return {
        "CONVOWATCH_JUDGE__BACKEND": "openai",
        "CONVOWATCH_JUDGE__BASE_URL": f"http://127.0.0.1:{port}/v1",
        "CONVOWATCH_JUDGE__MODEL": "stand-in",
        "CONVOWATCH_JUDGE__API_KEY": "test-key",
        "CONVOWATCH_JUDGE__MAX_RETRIES": "0",  # the worker's own retries are under test
        "CONVOWATCH_JUDGE__TIMEOUT_S": "5",
        "CONVOWATCH_SCORING__MAX_ATTEMPTS": str(max_attempts),
        "CONVOWATCH_SCORING__RETRY_INITIAL_S": "0.5",
        "CONVOWATCH_SCORING__RETRY_MAX_S": "2",
    }


def _few_conversations(n: int) -> tuple[list[ReplayItem], set[str]]:
    items = _real_items()
    ids = set(sorted(_ids(items))[:n])
    return [i for i in items if i.event.conversation_id in ids], ids


def _shortest_conversations(n: int) -> tuple[list[ReplayItem], set[str]]:
    """The ``n`` real conversations with the least turn text: for tests whose judge is a real (slow) model."""
    items = _real_items()
    text: dict[str, int] = {}
    for e in (i.event for i in items):
        if isinstance(e, TurnEvent):
            text[e.conversation_id] = text.get(e.conversation_id, 0) + len(e.text)
    ids = set(sorted(text, key=lambda cid: (text[cid], cid))[:n])
    return [i for i in items if i.event is not None and i.event.conversation_id in ids], ids


def test_judge_outage_is_retried_and_conversations_are_scored_after_recovery(pipeline: Pipeline) -> None:
    port = free_port()
    pipeline.extra_env.update(_judge_env(port, max_attempts=30))
    worker = pipeline.start_worker()
    pipeline.wait_assigned([worker])
    items, ids = _few_conversations(4)
    pipeline.produce((i.key, i.raw) for i in items)

    wait_for(lambda: worker.metric_sum("convowatch_scoring_retries_total") >= 3, timeout=60, what="retries during the outage")
    with RecoveringJudgeServer(port, failures=5):
        records = _wait_scores(pipeline, ids, timeout=120)
    assert {cid: [r.status for r in rs] for cid, rs in records.items()} == {cid: ["scored"] for cid in ids}
    assert worker.metric_sum("convowatch_judge_errors_total") >= 3
    assert max(r.attempts for rs in records.values() for r in rs) > 1


def test_judge_that_stays_down_leaves_conversations_unscored_with_the_reason(pipeline: Pipeline) -> None:
    port = free_port()  # nothing ever listens here
    pipeline.extra_env.update(_judge_env(port, max_attempts=2))
    worker = pipeline.start_worker()
    sink = pipeline.start_sink()
    pipeline.wait_assigned([worker])
    items, ids = _few_conversations(3)
    pipeline.produce((i.key, i.raw) for i in items)

    records = _wait_scores(pipeline, ids, timeout=120)
    assert all(
        r.status == "unscored" and r.unscored_reason.startswith("JudgeUnavailable") and r.attempts == 2
        for rs in records.values()
        for r in rs
    )
    _wait_sink_caught_up(pipeline)
    sink.terminate()
    rows = pipeline.query_store("SELECT conversation_id, status, unscored_reason FROM convowatch.conversation_scores FINAL")
    assert {r["conversation_id"] for r in rows} == ids
    assert all(r["status"] == "unscored" and "JudgeUnavailable" in r["unscored_reason"] for r in rows)
    assert worker.metric_sum("convowatch_conversations_unscored_total", reason="JudgeUnavailable") == len(ids)


# ------------------------------------------------------------------ idle timeout, retention, max turns


@pytest.mark.parametrize("consumer", ["faust", "batch"])
def test_idle_timeout_max_turns_and_retention_in_a_real_worker(pipeline: Pipeline, consumer: str) -> None:
    pipeline.extra_env.update(
        {
            "CONVOWATCH_KAFKA__CONSUMER": consumer,
            "CONVOWATCH_ASSEMBLY__IDLE_TIMEOUT_S": "3",
            "CONVOWATCH_ASSEMBLY__CLOSED_RETENTION_S": "6",
            "CONVOWATCH_ASSEMBLY__MAX_TURNS": "4",
        }
    )
    worker = pipeline.start_worker()
    pipeline.wait_assigned([worker])
    items = _real_items()
    ids = sorted(_ids(items))
    turns = {cid: [i for i in items if i.event.conversation_id == cid and isinstance(i.event, TurnEvent)] for cid in ids[:40]}
    idle_id = next(cid for cid, ts in turns.items() if len(ts) <= 4)  # never ends: closed by the idle timeout
    capped_id = next(cid for cid, ts in turns.items() if len(ts) >= 6)  # longer than max_turns
    pipeline.produce((i.key, i.raw) for i in turns[idle_id] + turns[capped_id])

    records = _wait_scores(pipeline, {idle_id, capped_id}, timeout=60)
    idle, capped = records[idle_id][0].conversation, records[capped_id][0].conversation
    assert idle.close_cause == "idle_timeout" and len(idle.turns) == len(turns[idle_id])
    assert idle.last_event_at == max(t.event.timestamp for t in turns[idle_id])  # event time, not the worker's clock
    assert capped.close_cause == "max_turns" and [t.index for t in capped.turns] == [0, 1, 2, 3]
    letters = [DeadLetter.from_json(m.value) for m in pipeline.consume("dead_letter", len(turns[capped_id]) - 4)]
    assert sorted(letter.reason for letter in letters) == ["conversation_closed"] * (len(turns[capped_id]) - 4)

    # After the retention the worker forgets both; a redelivered turn then starts a new conversation.
    wait_for(
        lambda: worker.metric_sum("convowatch_events_total", type="end", outcome="expired") == 2,
        timeout=60,
        what="closed conversations forgotten after the retention",
    )
    assert worker.metric_sum("convowatch_conversations_closed_total", cause="idle_timeout") == 1
    assert worker.metric_sum("convowatch_conversations_closed_total", cause="max_turns") == 1
    assert worker.metric_sum("convowatch_open_conversations") == 0


def test_past_max_open_conversations_the_longest_idle_are_closed_and_scored(pipeline: Pipeline) -> None:
    """Open conversations grew without a cap (about 4.5 KB each, kept for the 30-minute idle timeout). One
    partition, so its share of the cap is the whole cap."""
    pipeline.partitions = 1
    pipeline.extra_env.update(
        {"CONVOWATCH_ASSEMBLY__MAX_OPEN_CONVERSATIONS": "3", "CONVOWATCH_ASSEMBLY__IDLE_CHECK_INTERVAL_S": "1"}
    )
    worker = pipeline.start_worker()
    pipeline.wait_assigned([worker])
    items = _real_items()
    ids = sorted(_ids(items))[:6]
    for cid in ids:  # one after the other: the first ones are the longest idle
        first_turns = [i for i in items if i.event.conversation_id == cid and isinstance(i.event, TurnEvent)][:2]
        pipeline.produce((i.key, i.raw) for i in first_turns)
        wait_for(
            lambda cid=cid: worker.metric_sum("convowatch_events_total", type="turn") >= 2 * (ids.index(cid) + 1),
            timeout=60,
            what="turns consumed",
        )
    records = _wait_scores(pipeline, set(ids[:3]), timeout=60)
    assert {cid: records[cid][0].conversation.close_cause for cid in ids[:3]} == dict.fromkeys(ids[:3], "capacity")
    assert all(len(records[cid][0].conversation.turns) == 2 for cid in ids[:3])  # scored with the turns it had
    wait_for(lambda: worker.metric_sum("convowatch_open_conversations") == 3, timeout=30, what="three left open")
    assert worker.metric_sum("convowatch_conversations_closed_total", cause="capacity") == 3


def test_the_open_cap_holds_while_a_backlog_waits(pipeline: Pipeline) -> None:
    """The idle timer closed conversations past the cap by publishing ``end`` events behind the backlog, so a worker
    catching up held them all open (80,862 under a cap of 10,000 in bench/bounded_memory.py). Six conversations' first
    turns, then their second turns, are in the topic before the worker starts: with a cap of 3 the first three must be
    closed with one turn each as the fourth to sixth open, so their second turns arrive after the close."""
    pipeline.partitions = 1
    pipeline.extra_env.update({"CONVOWATCH_ASSEMBLY__MAX_OPEN_CONVERSATIONS": "3"})
    items = _real_items()
    ids = sorted(_ids(items))[:6]
    turns = {cid: [i for i in items if i.event.conversation_id == cid and isinstance(i.event, TurnEvent)][:2] for cid in ids}
    worker = pipeline.start_worker()  # creates the topics; it owns the one partition before anything is sent
    pipeline.wait_assigned([worker])
    worker.terminate()
    pipeline.produce((turns[cid][0].key, turns[cid][0].raw) for cid in ids)
    pipeline.produce((turns[cid][1].key, turns[cid][1].raw) for cid in ids)
    worker = pipeline.start_worker("worker-2")
    records = _wait_scores(pipeline, set(ids[:3]), timeout=60)
    assert {cid: len(records[cid][0].conversation.turns) for cid in ids[:3]} == dict.fromkeys(ids[:3], 1)
    wait_for(
        lambda: worker.metric_sum("convowatch_dead_letters_total", reason="conversation_closed") == 3,
        timeout=30,
        what="the second turns of the three closed conversations dead-lettered",
    )


def test_past_max_closed_conversations_the_oldest_closed_are_forgotten_early_and_counted(pipeline: Pipeline) -> None:
    """Closed conversations were remembered for a day whatever their number (turn fingerprints, about 1 KB each)."""
    pipeline.partitions = 1
    pipeline.extra_env.update({"CONVOWATCH_ASSEMBLY__MAX_CLOSED_CONVERSATIONS": "2"})
    worker = pipeline.start_worker()
    pipeline.wait_assigned([worker])
    items = _real_items()
    ids = sorted(_ids(items))[:4]
    for cid in ids:  # one after the other, so the first closed is the oldest
        pipeline.produce((i.key, i.raw) for i in items if i.event.conversation_id == cid)
        _wait_scores(pipeline, {cid}, timeout=60)
    wait_for(
        lambda: worker.metric_sum("convowatch_closed_conversations_forgotten_early_total") == 2, timeout=30, what="two forgotten"
    )
    # The last two are still remembered: a redelivered turn is a duplicate. The first is forgotten: its turn opens it again.
    first_turn = {cid: next(i for i in items if i.event.conversation_id == cid) for cid in (ids[0], ids[3])}
    pipeline.produce([(first_turn[ids[3]].key, first_turn[ids[3]].raw)])
    wait_for(
        lambda: worker.metric_sum("convowatch_events_total", type="turn", outcome="duplicate") == 1,
        timeout=30,
        what="a duplicate",
    )
    pipeline.produce([(first_turn[ids[0]].key, first_turn[ids[0]].raw)])
    wait_for(lambda: worker.metric_sum("convowatch_open_conversations") == 1, timeout=30, what="the forgotten one opened again")


def test_a_sink_behind_a_backlog_writes_it_at_once_and_commits_after_the_write(pipeline: Pipeline) -> None:
    """The sink gathers its polls into one write once it has caught up (or holds ``store.batch_size`` rows, or has
    held a record ``store.flush_interval_s``): 400 events, 40 of them feedback, read in polls of at most 100, make one
    insert, not one per poll that held a row (each insert is parts for chDB to merge)."""
    pipeline.extra_env.update({"CONVOWATCH_STORE__BATCH_SIZE": "100", "CONVOWATCH_STORE__FLUSH_INTERVAL_S": "5"})
    records = []
    for c in range(40):
        cid = f"backlog-{c:02d}"
        turns = [TurnEvent(cid, n, ("user", "assistant")[n % 2], f"turn {n}", 1.7e9 + n, {}) for n in range(9)]
        records += [(cid.encode(), encode_event(e)) for e in (*turns, FeedbackEvent(cid, 1, "down", 1.7e9 + 9))]
    pipeline.produce(records)
    sink = pipeline.start_sink()
    wait_for(lambda: sink.metric_sum("convowatch_sink_rows_total", table="feedback") >= 40, timeout=60, what="the feedback")
    assert sink.metric_sum("convowatch_sink_latency_seconds_count") == 1  # writes
    assert sink.metric_sum("convowatch_sink_rows_total", table="feedback") == 40
    _wait_sink_caught_up(pipeline, timeout=30, topic="events")  # committed after the write, to the topic's end
    sink.terminate()
    assert pipeline.query_store("SELECT count() AS n FROM convowatch.feedback FINAL") == [{"n": 40}]


def test_a_sink_stopped_while_it_holds_records_writes_and_commits_them(
    pipeline: Pipeline, store_factory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sink behind a backlog holds polled records until it has caught up; stopped before that, it writes and commits
    what it holds instead of leaving it all to be read again. In-process (the real broker and chDB engine), so the stop
    comes exactly after the first poll that held records."""
    for name, value in {
        **pipeline.env,
        "CONVOWATCH_STORE__BATCH_SIZE": "500",
        "CONVOWATCH_STORE__FLUSH_INTERVAL_S": "60",
    }.items():
        monkeypatch.setenv(name, value)
    settings = Settings()
    ensure_topics(settings.kafka)
    records = []
    for c in range(300):
        cid = f"held-{c:03d}"
        turns = [TurnEvent(cid, n, ("user", "assistant")[n % 2], f"turn {n}", 1.7e9 + n, {}) for n in range(9)]
        records += [(cid.encode(), encode_event(e)) for e in (*turns, FeedbackEvent(cid, 1, "down", 1.7e9 + 9))]
    pipeline.produce(records)  # 3,000 events: more than one poll of at most 500
    store = store_factory()
    sink = ScoreSink(settings, store, ServiceMetrics(registry=CollectorRegistry()))
    stop, polled = threading.Event(), []
    decode = sink.decode

    def decode_then_stop(messages):  # the stop arrives while the first poll's records are held
        polled.extend(messages)
        stop.set()
        return decode(messages)

    sink.decode = decode_then_stop  # type: ignore[method-assign]
    try:
        sink.run(stop)
        committed = {tp: sink.consumer.committed(tp) for tp in sink.consumer.assignment()}
    finally:
        sink.consumer.close()
        sink.producer.close()
    assert 0 < len(polled) < len(records)
    positions: dict = {}
    for m in polled:
        positions[m.partition] = max(positions.get(m.partition, 0), m.offset + 1)
    assert {tp.partition: o for tp, o in committed.items() if tp.topic == pipeline.topic("events") and o} == positions
    feedback = sum(1 for m in polled if b'"feedback"' in m.value)
    assert feedback > 0
    assert store.query("SELECT count() AS n FROM feedback FINAL") == [{"n": feedback}]


def test_feedback_while_open_is_judged_and_counted_against_the_scorers_label(pipeline: Pipeline) -> None:
    """Thumbs on open conversations travel with them to the scorer: judged with π = 1, counted by label and feedback."""
    pipeline.extra_env["CONVOWATCH_SCORING__SAMPLING__DEFAULT_RATE"] = "0.01"  # only feedback makes them judged
    worker = pipeline.start_worker()
    pipeline.wait_assigned([worker])
    items = _real_items()
    ids = sorted(_ids(items))[:4]
    feedback = {ids[0]: [(1, "up")], ids[1]: [(1, "down")], ids[2]: [(1, "up"), (3, "down")], ids[3]: [(1, "down"), (1, "up")]}
    events = [i for i in items if i.event.conversation_id in feedback]
    turns = [(i.key, i.raw) for i in events if isinstance(i.event, TurnEvent)]
    ends = [(i.key, i.raw) for i in events if isinstance(i.event, EndEvent)]
    ratings = [
        (cid.encode(), encode_event(FeedbackEvent(cid, turn, rating, 1.7e9 + n)))
        for cid, given in feedback.items()
        for n, (turn, rating) in enumerate(given)
    ]
    pipeline.produce(turns + ratings + ends)

    records = {cid: rs[0] for cid, rs in _wait_scores(pipeline, set(feedback), timeout=120).items()}
    assert {cid: r.status for cid, r in records.items()} == dict.fromkeys(feedback, "scored")
    assert {cid: r.sampling_reason for cid, r in records.items()} == {
        ids[0]: "rated",
        ids[1]: "negative_feedback",
        ids[2]: "negative_feedback",
        ids[3]: "negative_feedback",  # rated down, then up: a thumbs-down while open is always judged
    }
    assert records[ids[3]].conversation.feedback_ratings == ("up",)  # the latest rating of turn 1
    expected = {"positive": [ids[0], ids[3]], "negative": [ids[1]], "conflict": [ids[2]]}
    for kind, cids in expected.items():
        for label in {records[cid].label for cid in cids}:
            n = sum(records[cid].label == label for cid in cids)
            assert worker.metric_sum("convowatch_user_feedback_conversations_total", label=label, feedback=kind) == n
    assert worker.metric_sum("convowatch_user_feedback_conversations_total") == 4
