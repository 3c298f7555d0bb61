"""stream/log_privacy.py: payload placeholders on every record of the client libraries' logger trees, children included."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from kafka.protocol.metadata import FindCoordinatorResponse

from stream.log_privacy import keep_conversation_text_out_of_logs

CANARY = b"a user's words that must not be logged"


@pytest.fixture
def installed() -> Iterator[None]:
    keep_conversation_text_out_of_logs(False)
    try:
        yield
    finally:
        keep_conversation_text_out_of_logs(True)


def _logged(caplog: pytest.LogCaptureFixture, logger: str, msg: object, *args: object) -> str:
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger=logger):
        logging.getLogger(logger).debug(msg, *args)
    return caplog.text


def test_children_of_the_client_trees_get_placeholders(installed: None, caplog: pytest.LogCaptureFixture) -> None:
    # kafka.protocol.parser and kafka.net.connection printed the sink's fetched events (issue 54): children of "kafka".
    for name in ("kafka.protocol.parser", "kafka.net.connection", "aiokafka.conn", "httpcore.http11", "openai._base_client"):
        text = _logged(caplog, name, "%s Recv: %r", "<conn node=1>", CANARY)
        assert CANARY.decode() not in text and f"<{len(CANARY)} bytes>" in text and "<conn node=1>" in text, name
    response = FindCoordinatorResponse()  # a real kafka-python protocol object: its repr would hold its fields
    text = _logged(caplog, "kafka.net.connection", "Response %d: %s", 7, response)
    assert "Response 7: <FindCoordinatorResponse>" in text
    text = _logged(caplog, "kafka.consumer.fetcher", "records %s", {"tp": [CANARY]})
    assert CANARY.decode() not in text and "<list of 1>" in text  # one mapping argument: its values replaced


def test_other_loggers_and_the_opt_in_are_left_alone(installed: None, caplog: pytest.LogCaptureFixture) -> None:
    assert CANARY.decode() in _logged(caplog, "stream.sink", "%r", CANARY.decode())
    keep_conversation_text_out_of_logs(True)  # log_conversation_text: the values are logged
    assert repr(CANARY) in _logged(caplog, "kafka.protocol.parser", "Recv: %r", CANARY)


def test_installing_twice_is_installing_once(caplog: pytest.LogCaptureFixture) -> None:
    before = logging.getLogRecordFactory()
    keep_conversation_text_out_of_logs(False)
    keep_conversation_text_out_of_logs(False)
    keep_conversation_text_out_of_logs(True)
    assert logging.getLogRecordFactory() is before
