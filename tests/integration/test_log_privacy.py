"""At DEBUG, the worker's and the sink's logs hold no conversation text unless ``log_conversation_text`` asks for it.

Faust, aiokafka and kafka-python log each record they send, value included, at DEBUG (stream/log_privacy.py). A real
worker and sink on the session broker score three real conversations at DEBUG; their logs are searched for the turns'
texts. The second case turns the setting on and finds them, so the search is shown to work.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from stream.contract import Event, FeedbackEvent, TurnEvent, encode_event
from tests.infra import wait_for
from tests.integration.test_rollout_pipeline import _conversations
from tests.pipeline import Pipeline

N = 3


@pytest.fixture(params=[False, True], ids=["default", "log_conversation_text"])
def pipeline(request, tmp_path: Path, kafka_broker: str, scoring_artifacts: tuple[Path, Path]) -> Iterator[Pipeline]:
    rubric_set, calibrator = scoring_artifacts
    env = {"CONVOWATCH_LOG_LEVEL": "DEBUG", "CONVOWATCH_LOG_CONVERSATION_TEXT": str(request.param).lower()}
    p = Pipeline(tmp_path / "pipeline", kafka_broker, rubric_set, calibrator, partitions=1, extra_env=env)
    try:
        yield p
    finally:
        p.stop_all()


def test_debug_logs_hold_no_conversation_text_unless_asked(pipeline: Pipeline) -> None:
    asked = pipeline.env["CONVOWATCH_LOG_CONVERSATION_TEXT"] == "true"
    worker = pipeline.start_worker()
    sink = pipeline.start_sink()
    pipeline.wait_assigned([worker])
    conversations = _conversations()[:N]
    for items in conversations:
        pipeline.produce((item.key, item.raw) for item in items)
    wait_for(
        lambda: sink.metric_sum("convowatch_sink_rows_total", table="conversation_scores") >= N,
        timeout=120,
        what="the conversations stored",
    )
    texts = [item.event.text for items in conversations for item in items if isinstance(item.event, TurnEvent)]
    texts = [t for t in texts if len(t) >= 30]  # long enough not to occur in a log by chance
    assert texts
    log = worker.log.read_text(errors="replace")
    # The worker did log its sends: aiokafka's producer line (the default kafka.consumer batch; Faust's agents log
    # "send: topic=" too).
    assert "[DEBUG]" in log and "Sending (key=" in log
    leaked = [t[:30] for t in texts if t[:30] in log or t[:30] in sink.log.read_text(errors="replace")]
    if asked:
        assert leaked, "with log_conversation_text the sends' values are logged"
    else:
        assert leaked == []
        assert " bytes>" in log  # the values were logged as their sizes


@pytest.fixture
def verbose_pipeline(tmp_path: Path, kafka_broker: str, scoring_artifacts: tuple[Path, Path]) -> Iterator[Pipeline]:
    rubric_set, calibrator = scoring_artifacts
    env = {"CONVOWATCH_LOG_LEVEL": "DEBUG"}
    p = Pipeline(tmp_path / "pipeline", kafka_broker, rubric_set, calibrator, partitions=1, extra_env=env)
    try:
        yield p
    finally:
        p.stop_all()


def test_verbose_worker_and_sink_print_no_canary_from_any_client_library(verbose_pipeline: Pipeline) -> None:
    """``convowatch -v run`` and ``convowatch -v sink`` log at DEBUG everywhere, kafka-python's request/response
    loggers (``kafka.protocol.parser``, ``kafka.net.connection``) included: a user, an assistant and a feedback canary
    of one real conversation (texts no log line holds by chance) must appear in neither log."""
    pipeline = verbose_pipeline
    worker = pipeline.start_worker(cli_options=("-v",))
    sink = pipeline.start_sink(cli_options=("-v",))
    pipeline.wait_assigned([worker])
    tag = uuid.uuid4().hex
    canaries = {"user": f"user canary {tag} says", "assistant": f"assistant canary {tag} says", "feedback": f"feedback {tag}"}
    items = _conversations()[0]
    turns = [item.event for item in items if isinstance(item.event, TurnEvent)]
    first_user = next(t for t in turns if t.role == "user")
    first_assistant = next(t for t in turns if t.role == "assistant")
    planted = {first_user.turn_index: canaries["user"], first_assistant.turn_index: canaries["assistant"]}
    events: list[Event] = [
        replace(item.event, text=planted[item.event.turn_index])
        if isinstance(item.event, TurnEvent) and item.event.turn_index in planted
        else item.event
        for item in items
    ]
    cid = first_user.conversation_id
    events.append(
        FeedbackEvent(cid, first_assistant.turn_index, "down", first_assistant.timestamp + 1, comment=canaries["feedback"])
    )
    pipeline.produce((cid.encode(), encode_event(e)) for e in events)
    wait_for(
        lambda: (
            sink.metric_sum("convowatch_sink_rows_total", table="conversation_scores") >= 1
            and sink.metric_sum("convowatch_sink_rows_total", table="feedback") >= 1
        ),
        timeout=120,
        what="the conversation and its feedback stored",
    )
    worker.terminate()
    sink.terminate()  # the embedded store opens in one process only
    stored = pipeline.query_store(f"SELECT comment FROM convowatch.feedback FINAL WHERE conversation_id = '{cid}'")
    assert stored == [{"comment": canaries["feedback"]}]  # the canaries went through the pipeline
    worker_log, sink_log = (p.log.read_text(errors="replace") for p in (worker, sink))
    # Both logged at DEBUG through kafka-python's request/response loggers (the lines that printed the payloads).
    assert "DEBUG kafka.protocol.parser" in sink_log and "DEBUG kafka.net.connection" in sink_log
    assert "[DEBUG]" in worker_log
    leaked = {name: log.count(tag) for name, log in (("worker", worker_log), ("sink", sink_log)) if tag in log}
    assert leaked == {}, f"canary lines: {leaked}"
