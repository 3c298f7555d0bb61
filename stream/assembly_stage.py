"""The assemble stage off Faust: events topic → closed topic, a whole poll at a time (a `PollStage`).

For each poll of the events topic (consumer group ``<kafka.app_id>-assemble``) it applies the records, each
partition's in offset order, with `BatchAssembler` (stream/batch_assembly.py), and sends the closed conversations,
the dead letters, and one changelog record per conversation the poll changed (the conversation's state, or a
tombstone, to the changelog partition of its events partition); `PollStage` commits once all are acknowledged. A
redelivered turn is recognised by its fingerprint, a conversation closed twice is deduplicated downstream.

The states of the partitions this worker owns live in memory (`states`) and in the changelog topic
(``<app_id>-conversations-changelog``, the name and record format of the Faust table it replaces). When partitions
are assigned, their states are read back from the changelog (at least up to its end offsets when the restore
starts) before any of their events is processed; when they are revoked, the poll in flight is finished and
committed first, then their states are dropped. A deployment switched from the Faust consumer starts where the
Faust workers left the events topic (`PollStage`) and reads their open conversations from the same changelog.
"""

from __future__ import annotations

import json
import logging
from itertools import chain

import msgspec
from aiokafka import AIOKafkaConsumer, TopicPartition

from stream import changelog_codec
from stream.assembly import State
from stream.batch_assembly import BatchAssembler
from stream.metrics import ServiceMetrics
from stream.poll_stage import Polled, PollStage
from stream.settings import Settings
from stream.state_batch import StateBatch
from stream.topics import changelog_topic

log = logging.getLogger(__name__)


class AssemblyStage(PollStage):
    """The worker's assemble stage (see the module): `start`, then `run` until `stop`."""

    name = "assemble"

    def __init__(self, settings: Settings, metrics: ServiceMetrics) -> None:
        a, k = settings.assembly, settings.kafka
        super().__init__(settings, metrics, k.events_topic, a.batch_max_events, a.batch_max_wait_s)
        self.changelog = changelog_topic(k)
        self.assembly = BatchAssembler(a, k.partitions, metrics)
        self.states: dict[str, State] = {}  # the conversations of the partitions in `partitions`

    async def process(self, polled: Polled) -> dict[int, int]:
        batch = StateBatch(self.states)
        out = self.assembly.apply(chain.from_iterable(polled.values()), batch)
        k = self.settings.kafka
        for key, value in out.closed:
            await self.send(k.closed_topic, key, value)
        for letter in out.dead_letters:
            await self.send_dead_letter(letter)
        for conversation_id, state, partition in batch.changes():
            state_json = None if state is None else msgspec.json.encode(state)
            await self.send(self.changelog, changelog_key(conversation_id), state_json, partition)
            if state is None:
                self.states.pop(conversation_id, None)
            else:
                self.states[conversation_id] = state
        return {p: records[-1].offset + 1 for p, records in polled.items()}

    # -- rebalances -------------------------------------------------------------

    async def revoked(self, partitions: set[int]) -> None:
        """Drop the states of ``partitions`` (the poll in flight has finished: the caller holds the lock)."""
        await super().revoked(partitions)
        for key in [key for key, state in self.states.items() if state["partition"] in partitions]:
            del self.states[key]
        self.metrics.assigned_partitions.set(len(self.partitions))

    async def assigned(self, partitions: set[int]) -> None:
        """Read the states of newly owned ``partitions`` back from the changelog first."""
        restored = await self._restore(partitions)
        await super().assigned(partitions)
        self.metrics.assigned_partitions.set(len(self.partitions))
        log.info(
            "assemble: partitions %s assigned, %d conversations restored from %s", sorted(partitions), restored, self.changelog
        )

    async def _restore(self, partitions: set[int]) -> int:
        """Read the changelog partitions of ``partitions`` into `states`; how many conversations they hold."""
        tps = [TopicPartition(self.changelog, p) for p in sorted(partitions)]
        reader = AIOKafkaConsumer(
            bootstrap_servers=self.settings.kafka.bootstrap_servers, enable_auto_commit=False, group_id=None
        )
        await reader.start()
        try:
            reader.assign(tps)
            await reader.seek_to_beginning(*tps)
            ends = await reader.end_offsets(tps)
            remaining = {tp for tp in tps if await reader.position(tp) < ends[tp]}
            while remaining:
                for records in (await reader.getmany(*remaining, timeout_ms=1000)).values():
                    for record in records:  # a record past the end taken at the start is a newer state: kept too
                        key = conversation_of(record.key)
                        if record.value is None:
                            self.states.pop(key, None)
                        else:
                            self.states[key] = msgspec.json.decode(record.value)
                remaining = {tp for tp in remaining if await reader.position(tp) < ends[tp]}
        finally:
            await reader.stop()
        return sum(1 for state in self.states.values() if state["partition"] in partitions)


def changelog_key(conversation_id: str) -> bytes:
    """A conversation's key in the changelog, as the Faust table writes it (JSON), so either consumer reads the other's."""
    return changelog_codec.dumps(conversation_id)


def conversation_of(key: bytes) -> str:
    """The conversation id of a changelog key; a key that is not JSON is the raw id the batch stage wrote before
    2026-11-27."""
    try:
        conversation_id = json.loads(key)
    except ValueError:
        return key.decode("utf-8")
    return conversation_id if isinstance(conversation_id, str) else key.decode("utf-8")
