"""Noticing that the broker lost records: a partition whose log now ends below what this process consumed.

A broker that keeps nothing across a restart (tansu's ``memory://`` engine, the
embedded default) or that lost a disk comes back with shorter logs, or none.
Producers recreate the topics and write from offset 0 again, while a consumer
that survived keeps its position: it sits past the new end of the log, reads
nothing, and no error says so — the records before the restart and the new
ones alike are lost in silence. So the worker and the sink check, with every
lag report, whether a partition's high-water mark fell below their position
(a negative lag): then the broker lost records. Each such partition is logged
(ERROR) and counted once in ``convowatch_broker_lost_data_total{topic}``
(alert ``ConvowatchBrokerLostData``, docs/runbooks.md), and counted again only
after it recovered and lost records anew. The sink then reads the partition
again from its beginning (the records still there are new, or stored again
idempotently); the worker reports it (docs/service.md says what to do).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

from stream.metrics import ServiceMetrics

log = logging.getLogger(__name__)

Partition = tuple[str, int]


class BrokerLossWatch:
    """Finds partitions whose high-water mark fell below this consumer's position, and reports each once."""

    def __init__(self, metrics: ServiceMetrics, who: str, topics: Iterable[str]) -> None:
        self.metrics = metrics
        self.who = who  # "worker" or "sink", for the log line
        self._lost: set[Partition] = set()
        for topic in topics:  # at 0 from the start: Prometheus sees the first finding as an increase
            metrics.broker_lost_data.labels(topic)

    def check(self, lags: Mapping[Partition, int]) -> list[Partition]:
        """The partitions that newly lost records, from ``lags`` (high-water mark − position, per partition)."""
        lost = {tp for tp, lag in lags.items() if lag < 0}
        new = sorted(lost - self._lost)
        self._lost = lost | (self._lost - set(lags))  # a partition not reported now keeps its state
        for topic, partition in new:
            self.metrics.broker_lost_data.labels(topic).inc()
            log.error(
                "%s: the broker lost records of %s[%d]: its log now ends %d records before this %s's position "
                "(a broker restart without durable storage, or a lost disk); records from before the loss that were not "
                "yet processed are gone (docs/runbooks.md#convowatchbrokerlostdata)",
                self.who,
                topic,
                partition,
                -lags[(topic, partition)],
                self.who,
            )
        return new
