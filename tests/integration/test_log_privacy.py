"""At DEBUG, the worker's and the sink's logs hold no conversation text unless ``log_conversation_text`` asks for it.

Faust, aiokafka and kafka-python log each record they send, value included, at DEBUG (stream/log_privacy.py). A real
worker and sink on the session broker score three real conversations at DEBUG; their logs are searched for the turns'
texts. The second case turns the setting on and finds them, so the search is shown to work.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from stream.contract import TurnEvent
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
