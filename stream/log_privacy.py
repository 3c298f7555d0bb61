"""Keeping conversation text out of the logs, whatever the log level.

At DEBUG, the client libraries log what they send and receive: Faust, aiokafka and kafka-python each record sent
with its value (the worker's changelog, closed-conversation and score records hold every turn), kafka-python's
``kafka.protocol.parser`` and ``kafka.net.connection`` every request and response (a FetchResponse holds the events
and feedback the sink reads), httpx/httpcore/urllib3/openai their requests. `scrub_payload_args` replaces, in every
log record of these libraries' logger trees (`PAYLOAD_LOGGER_TREES`, children included), each argument that can hold
a payload by a placeholder: bytes by ``<N bytes>``, a Kafka protocol or record object by ``<ClassName>``, a
container by ``<dict of N>``; a message that is itself such an object likewise. The line is kept, so a DEBUG log
still shows what was sent where and when, without the users' words.

It is installed as the log record factory (`logging.setLogRecordFactory`), not as a logger filter: a filter on
``kafka`` does not see records of ``kafka.protocol.parser``, and handlers come and go (Faust installs its own). The
worker, the sink and every CLI command install it (`keep_conversation_text_out_of_logs`);
``log_conversation_text`` turns it off.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

# The logger trees (a name and its children) of the client libraries that log payloads at DEBUG.
PAYLOAD_LOGGER_TREES = (
    "kafka",
    "aiokafka",
    "faust",
    "mode",
    "httpx",
    "httpx2",
    "httpcore",
    "httpcore2",
    "urllib3",
    "urllib3_future",
    "openai",
)
# Modules whose objects carry Kafka payloads (requests, responses, record batches) in their str/repr.
PAYLOAD_OBJECT_MODULES = ("kafka.protocol", "kafka.record", "aiokafka.protocol", "aiokafka.record")

_factory_before: Callable[..., logging.LogRecord] | None = None


def in_payload_tree(name: str) -> bool:
    """Whether logger ``name`` is one of `PAYLOAD_LOGGER_TREES` or a child of one."""
    return any(name == tree or name.startswith(tree + ".") for tree in PAYLOAD_LOGGER_TREES)


def placeholder(value: object) -> object:
    """``value`` itself when it cannot hold a payload (numbers, text, plain objects), else a placeholder."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return f"<{len(value)} bytes>"
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, (dict, list, set, frozenset)) or type(value) is tuple:
        return f"<{type(value).__name__} of {len(value)}>"
    module = type(value).__module__ or ""
    if any(module == m or module.startswith(m + ".") for m in PAYLOAD_OBJECT_MODULES):
        return f"<{type(value).__name__}>"
    return value


def scrub_payload_args(record: logging.LogRecord) -> None:
    """Replace the payload-bearing message and arguments of ``record`` (module docstring), in place."""
    if not isinstance(record.msg, str):
        record.msg = str(placeholder(record.msg))
    args = record.args
    if isinstance(args, tuple):
        record.args = tuple(placeholder(a) for a in args)
    elif isinstance(args, Mapping):
        record.args = {k: placeholder(v) for k, v in args.items()}


def _payload_free_factory(previous: Callable[..., logging.LogRecord]) -> Callable[..., logging.LogRecord]:
    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        if in_payload_tree(record.name):
            scrub_payload_args(record)
        return record

    return factory


def keep_conversation_text_out_of_logs(log_conversation_text: bool) -> None:
    """Install (or, with ``log_conversation_text``, remove) the payload placeholders on every log record of the
    client libraries (module docstring); installing twice is installing once."""
    global _factory_before
    if log_conversation_text:
        if _factory_before is not None:
            logging.setLogRecordFactory(_factory_before)
            _factory_before = None
    elif _factory_before is None:
        _factory_before = logging.getLogRecordFactory()
        logging.setLogRecordFactory(_payload_free_factory(_factory_before))
