"""One slow judge answer does not hold the conversations behind it (issue 54, item 2).

A real worker (batch consumer, Apache Kafka from the session fixture) scores real LLM-Rubric conversations through
the OpenAI-compatible judge API. The judge is a small HTTP server (`ScriptedServer`) answering in the OpenAI chat
format: every call about one chosen conversation waits ``delay_s`` first, every other call answers at once. It is a
stand-in for a fault that cannot be produced for real on demand (a judge that hangs on one conversation). Measured:
the end -> scored latency (the record's ``scored_at`` minus the time all events were produced) of the others.

``measure_slow_judge`` is what `bench/slow_judge.py` runs, with a 60 s delay at the default settings; the test runs
it with a shorter one. Before a conversation's scoring could outlive its poll, the others of later polls waited for
the slow one (bench/slow_judge.py: 300 s behind a 60 s judge).
"""

from __future__ import annotations

import json
import os
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from scorers.conversation import Conversation
from scorers.judges.openai_http import OpenAIJudge
from scorers.questions import likert_question
from stream.contract import TurnEvent
from stream.records import ScoreRecord
from stream.replay.sources import llm_rubric_events
from tests.infra import wait_for
from tests.integration.test_pipeline import _completion
from tests.pipeline import Pipeline
from tests.servers import Received, Reply, ScriptedServer

FAST_DELAY_S = 4.0  # the slow answer of the judge client's test
SLOW_DELAY_S = 15.0  # the worker test's: far above the others' end -> scored latency (2-5 s here)
BENCH_DELAY_S = 60.0  # bench/slow_judge.py's
BENCH_OUT_ENV = "CONVOWATCH_BENCH_SLOW_JUDGE_OUT"  # where test_slow_judge_bench writes its figures
N_CONVERSATIONS = 8


def measure_slow_judge(
    pipeline: Pipeline, delay_s: float, n: int = N_CONVERSATIONS, timeout_s: float = 600, **extra_env: str
) -> dict[str, Any]:
    """Score ``n`` real conversations with one slow (``delay_s`` per call) and report each one's end -> scored
    latency: the slow one's and the others' (max, median)."""
    items = list(llm_rubric_events())
    ids = sorted({i.event.conversation_id for i in items if i.event is not None})[:n]
    chosen = [i for i in items if i.event is not None and i.event.conversation_id in ids]
    slow_id = ids[0]
    turns = [i.event for i in chosen if isinstance(i.event, TurnEvent)]
    other_text = "\n".join(t.text for t in turns if t.conversation_id != slow_id)
    # The slow conversation's prompts are told by a piece of its text found in no other conversation.
    marker = next(
        piece
        for t in sorted((t for t in turns if t.conversation_id == slow_id), key=lambda t: -len(t.text))
        for piece in [t.text.strip()[:60]]
        if piece and piece not in other_text
    )
    reply = json.dumps(_completion()).encode()
    slow_calls = 0
    lock = threading.Lock()

    def respond(_: int, request: Received) -> Reply:
        nonlocal slow_calls
        prompt = json.loads(request.body)["messages"][0]["content"]
        if marker in prompt:
            with lock:
                slow_calls += 1
            return Reply(200, reply, {"Content-Type": "application/json"}, delay_s=delay_s)
        return Reply(200, reply, {"Content-Type": "application/json"})

    with ScriptedServer(respond) as judge:
        pipeline.extra_env.update(
            {
                "CONVOWATCH_JUDGE__BACKEND": "openai",
                "CONVOWATCH_JUDGE__BASE_URL": judge.url + "/v1",
                "CONVOWATCH_JUDGE__MODEL": "stand-in",
                "CONVOWATCH_JUDGE__MAX_RETRIES": "0",
                "CONVOWATCH_JUDGE__TIMEOUT_S": str(delay_s + 30),  # the slow answer is slow, not timed out
                "CONVOWATCH_KAFKA__CONSUMER": "batch",
                **extra_env,
            }
        )
        worker = pipeline.start_worker()
        pipeline.wait_assigned([worker])
        pipeline.produce((i.key, i.raw) for i in chosen)
        produced_at = time.time()
        records: dict[str, ScoreRecord] = {}

        def all_scored() -> bool:
            for m in pipeline.consume("scores", len(ids), timeout=2):
                r = ScoreRecord.from_json(m.value)
                records.setdefault(r.conversation_id, r)
            return set(ids) <= set(records)

        wait_for(all_scored, timeout=timeout_s, interval=0.5, what="a score record for every conversation")
    latency = {cid: records[cid].scored_at - produced_at for cid in ids}
    others = [latency[cid] for cid in ids if cid != slow_id]
    return {
        "conversations": n,
        "slow_delay_s": delay_s,
        "slow_judge_calls": slow_calls,
        "scoring_concurrency": worker_setting(pipeline, "CONVOWATCH_SCORING__CONCURRENCY"),
        "slow_end_to_scored_s": round(latency[slow_id], 3),
        "others_end_to_scored_max_s": round(max(others), 3),
        "others_end_to_scored_median_s": round(statistics.median(others), 3),
        "statuses": sorted({records[cid].status for cid in ids}),
    }


def test_the_conversations_behind_a_slow_judge_answer_are_scored_before_it_answers(pipeline: Pipeline) -> None:
    """Eight conversations, one of them answered after SLOW_DELAY_S per judge call, at the default settings: the
    others are scored within the first slow answer. Before (a poll finished before the next), those of later polls
    were scored only after the slow one (measured here: about 5 x SLOW_DELAY_S)."""
    result = measure_slow_judge(pipeline, SLOW_DELAY_S)
    print(result)
    assert result["statuses"] == ["scored"], result
    assert result["slow_end_to_scored_s"] >= SLOW_DELAY_S, result  # it was slow
    assert result["others_end_to_scored_max_s"] < SLOW_DELAY_S, result


def worker_setting(pipeline: Pipeline, name: str) -> str:
    """The value the worker ran with (its environment, else the default)."""
    return pipeline.env.get(name, "default")


def test_a_slow_conversation_does_not_take_every_judge_call_in_flight() -> None:
    """Four conversations judged at once (scoring.concurrency 4) by one OpenAIJudge with 4 calls in flight: every call
    about one of them waits FAST_DELAY_S. Its calls take judge.max_calls_per_conversation (2) of the 4, so the three
    others are answered while it waits; with every slot open to one conversation (the code before), they waited for
    its calls (measured 4.5 s, against 0.2-0.65 s with the cap)."""
    reply = json.dumps(_completion()).encode()

    def respond(_: int, request: Received) -> Reply:
        slow = "SLOW-CONVERSATION" in json.loads(request.body)["messages"][0]["content"]
        return Reply(200, reply, {"Content-Type": "application/json"}, delay_s=FAST_DELAY_S if slow else 0.0)

    questions = [likert_question(f"q{i}", f"Question {i}?") for i in range(9)]
    took: dict[str, float] = {}
    with ScriptedServer(respond) as server:
        judge = OpenAIJudge(base_url=server.url + "/v1", model="m", max_retries=0, max_calls_per_conversation=2)

        def ask(name: str) -> None:
            started = time.monotonic()
            conversation = Conversation.from_messages(
                name, [{"role": "user", "content": name}, {"role": "assistant", "content": "ok"}]
            )
            judge.judge(conversation, questions)
            took[name] = time.monotonic() - started

        threads = [threading.Thread(target=ask, args=(name,)) for name in ("SLOW-CONVERSATION", "fast-1", "fast-2", "fast-3")]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        judge.close()
    assert took["SLOW-CONVERSATION"] >= FAST_DELAY_S
    assert max(took[f"fast-{i}"] for i in (1, 2, 3)) < FAST_DELAY_S / 2, took


@pytest.mark.skipif(not os.environ.get(BENCH_OUT_ENV), reason=f"bench/slow_judge.py runs it (sets {BENCH_OUT_ENV})")
def test_slow_judge_bench(pipeline: Pipeline) -> None:
    """bench/slow_judge.py: a 60 s answer at the default settings; the figures go to the file it names."""
    result = measure_slow_judge(pipeline, BENCH_DELAY_S, timeout_s=1800)
    Path(os.environ[BENCH_OUT_ENV]).write_text(json.dumps(result, indent=2) + "\n")
