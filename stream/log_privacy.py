"""Keeping conversation text out of the logs, whatever the log level.

At DEBUG, Faust, aiokafka and kafka-python log every record they send with its value: the worker's changelog,
closed-conversation and score records, which hold every turn of every conversation. `RecordValueFilter` replaces
those values (any bytes argument of a log record from these libraries' send paths) with their size, so a DEBUG log
can be shared to debug the pipeline without sharing the users' words. ``log_conversation_text`` turns it off.
"""

from __future__ import annotations

import logging

# The loggers whose DEBUG lines carry a record's value ("send: topic=... v=...", "Sending (key=... value=...)").
SENDING_LOGGERS = ("faust.topics", "faust.transport.drivers.aiokafka", "aiokafka.producer.producer", "kafka.producer.kafka")


class RecordValueFilter(logging.Filter):
    """Replaces every bytes argument of a log record with ``<N bytes>``; the line itself is kept."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple) and any(isinstance(a, (bytes, bytearray)) for a in record.args):
            record.args = tuple(f"<{len(a)} bytes>" if isinstance(a, (bytes, bytearray)) else a for a in record.args)
        return True


_FILTER = RecordValueFilter()


def keep_conversation_text_out_of_logs(log_conversation_text: bool) -> None:
    """Install (or, with ``log_conversation_text``, remove) the filter on the loggers that log sent records."""
    for name in SENDING_LOGGERS:
        logger = logging.getLogger(name)
        if log_conversation_text:
            logger.removeFilter(_FILTER)
        else:
            logger.addFilter(_FILTER)
