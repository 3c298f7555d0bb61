"""Noticing that the broker lost records: a partition whose log now ends below what this process consumed.

A broker that comes back without its data (a lost disk, a log directory
formatted anew) or whose topic was deleted and recreated comes back with
shorter logs, or none, and without the consumer groups' committed offsets.
Producers recreate the topics and write from offset 0 again, while a consumer
that survived keeps its position: it sits past the new end of the log, reads
nothing, and no error says so — the records before the loss and the new ones
alike are lost in silence.

So the worker and the sink check, with every lag report, for partitions whose
high-water mark fell below their position (a negative lag) — *suspects* — and
confirm each by asking the broker for the group's committed offset: lost when
the broker no longer has it, or has one below the offset this process last
committed. The worker asks the same once for every partition that comes back
to it after a rebalance (a restarted broker makes its consumers rejoin, and
Faust then starts the partition from whatever the broker says). Both are needed: a negative lag alone can be a
high-water mark read a moment before the position moved past it (the two are
fetched apart), and a missing committed offset alone is also what a group's
expired offsets look like. And one read of the committed offset is not enough:
while a group coordinator loads after a broker restart or a leader change,
OffsetFetch answers with the error at the response's top level and -1 for
every partition, which aiokafka (the worker's client) hands back as "no
committed offset" (seen in tests/fault_suite.py's 3-broker cluster). So a
partition is reported only when a second read, at least ``recheck_s`` after
the first, still finds the broker's offset missing or below the one this
process had committed when the doubt arose. A confirmed partition is logged (ERROR) and counted
once in ``convowatch_broker_lost_data_total{topic}`` (alert
``ConvowatchBrokerLostData``, docs/runbooks.md), and again only after it
recovered and lost records anew. The sink then reads the partition again from
its beginning (the records still there are new, or stored again idempotently);
a worker whose group rejoined starts from the broker's new log start anyway.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping

from stream.metrics import ServiceMetrics

log = logging.getLogger(__name__)

Partition = tuple[str, int]


class BrokerLossWatch:
    """Finds partitions whose records the broker lost (see the module), and reports each once."""

    def __init__(self, metrics: ServiceMetrics, who: str, topics: Iterable[str], recheck_s: float = 10.0) -> None:
        self.metrics = metrics
        self.who = who  # "worker" or "sink", for the log line
        self.recheck_s = recheck_s
        self._lost: set[Partition] = set()
        self._doubted: dict[Partition, tuple[float, int]] = {}  # first read that found it lost: (when, our offset then)
        for topic in topics:  # at 0 from the start: Prometheus sees the first finding as an increase
            metrics.broker_lost_data.labels(topic)

    def suspects(self, lags: Mapping[Partition, int]) -> list[Partition]:
        """Partitions whose high-water mark is below this consumer's position (``lags``: high-water mark − position),
        not already reported; partitions whose lag is back at 0 or above may be reported again."""
        self._lost -= {tp for tp, lag in lags.items() if lag >= 0}
        return sorted(tp for tp, lag in lags.items() if (lag < 0 or tp in self._doubted) and tp not in self._lost)

    def confirm(self, committed: Mapping[Partition, tuple[int | None, int | None]], now: float | None = None) -> list[Partition]:
        """The partitions the broker lost records of: ``committed[tp]`` = (the broker's committed offset of the group,
        the offset this process last committed); lost when the first is missing or below the second on a first read
        and on a read ``recheck_s`` later (against the offset of the first: this process may have committed anew)."""
        now = time.monotonic() if now is None else now
        lost = []
        for tp, (broker, own) in sorted(committed.items()):
            if tp in self._lost:
                continue
            doubted = self._doubted.get(tp)
            if doubted is not None:
                own = doubted[1]
            if not own or (broker is not None and broker >= own):  # 0 committed: nothing to lose
                self._doubted.pop(tp, None)
                continue
            if doubted is None:
                self._doubted[tp] = (now, own)
                continue
            if now - doubted[0] < self.recheck_s:
                continue
            del self._doubted[tp]
            lost.append(tp)
            self._lost.add(tp)
            topic, partition = tp
            self.metrics.broker_lost_data.labels(topic).inc()
            log.error(
                "%s: the broker lost records of %s[%d]: it has %s of the group's committed offset %d (a broker restart "
                "without durable storage, a lost disk, or the topic recreated); records from before the loss that were "
                "not yet processed are gone (docs/runbooks.md#convowatchbrokerlostdata)",
                self.who,
                topic,
                partition,
                "none" if broker is None else f"only {broker}",
                own,
            )
        return lost
