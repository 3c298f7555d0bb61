"""Kafka's classic consumer-group protocol on one broker: join, sync, heartbeat, leave, and session expiry.

A group moves Empty → PreparingRebalance (members (re)join) → CompletingRebalance (the leader hands out the
assignment in its SyncGroup) → Stable, and back to PreparingRebalance when a member joins, leaves or lets its
session lapse. Members are dynamic: a ``group.instance.id`` is accepted and ignored (no static membership).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

from scorers.errors import UserError


class GroupError(UserError):
    """A request the group refuses; ``kafka_error`` names the kafka.errors class to answer with."""

    def __init__(self, kafka_error: str) -> None:
        super().__init__(kafka_error)
        self.kafka_error = kafka_error


class GroupState(Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"


@dataclass(frozen=True)
class JoinResult:
    generation: int
    protocol_type: str
    protocol_name: str
    leader: str
    member_id: str
    members: list[tuple[str, bytes]]  # (member id, subscription metadata), for the leader only


@dataclass
class Member:
    member_id: str
    client_id: str
    client_host: str
    session_timeout_s: float
    rebalance_timeout_s: float
    protocols: list[tuple[str, bytes]]
    last_seen: float
    assignment: bytes = b""
    joining: asyncio.Future[JoinResult] | None = None
    syncing: asyncio.Future[bytes] | None = None

    def metadata(self, protocol: str) -> bytes:
        return next(meta for name, meta in self.protocols if name == protocol)


@dataclass
class ConsumerGroup:
    group_id: str
    state: GroupState = GroupState.EMPTY
    generation: int = 0
    protocol_type: str = ""
    protocol_name: str = ""
    leader: str = ""
    members: dict[str, Member] = field(default_factory=dict)
    join_not_before: float = 0.0  # the initial rebalance delay of a group that was empty
    join_deadline: float = 0.0  # members that have not rejoined by then are dropped

    def candidate_protocols(self) -> set[str]:
        sets = [{name for name, _ in m.protocols} for m in self.members.values()]
        return set.intersection(*sets) if sets else set()


class GroupCoordinator:
    """Every consumer group of the broker. Call :meth:`tick` a few times a second to expire sessions."""

    def __init__(self, initial_rebalance_delay_s: float = 0.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.initial_rebalance_delay_s = initial_rebalance_delay_s
        self.clock = clock
        self.groups: dict[str, ConsumerGroup] = {}

    # --- requests ---------------------------------------------------------------------------------------------

    async def join(
        self,
        group_id: str,
        member_id: str,
        *,
        client_id: str,
        client_host: str,
        session_timeout_s: float,
        rebalance_timeout_s: float,
        protocol_type: str,
        protocols: list[tuple[str, bytes]],
    ) -> JoinResult:
        if not group_id:
            raise GroupError("InvalidGroupIdError")
        if not protocols:
            raise GroupError("InconsistentGroupProtocolError")
        group = self.groups.setdefault(group_id, ConsumerGroup(group_id))
        if member_id and member_id not in group.members:
            raise GroupError("UnknownMemberIdError")
        others = [m for mid, m in group.members.items() if mid != member_id]
        if others and (
            protocol_type != group.protocol_type
            or not {name for name, _ in protocols}.intersection(*({n for n, _ in m.protocols} for m in others))
        ):
            raise GroupError("InconsistentGroupProtocolError")
        now = self.clock()
        if not member_id:
            member_id = f"{client_id}-{uuid.uuid4()}"
        member = group.members.get(member_id)
        if member is None:
            member = Member(member_id, client_id, client_host, session_timeout_s, rebalance_timeout_s, protocols, now)
            group.members[member_id] = member
        member.protocols, member.last_seen = protocols, now
        member.session_timeout_s, member.rebalance_timeout_s = session_timeout_s, rebalance_timeout_s
        if member.joining is not None and not member.joining.done():  # a second join (another connection) replaces it
            member.joining.set_exception(GroupError("RebalanceInProgressError"))
        joining = member.joining = asyncio.get_running_loop().create_future()
        group.protocol_type = protocol_type
        if group.state is not GroupState.PREPARING_REBALANCE:
            self._prepare_rebalance(group, now)
        self._maybe_complete_join(group, now)
        return await joining

    async def sync(self, group_id: str, generation: int, member_id: str, assignments: dict[str, bytes]) -> bytes:
        group, member = self.heartbeat(group_id, generation, member_id)
        if group.state is GroupState.STABLE:
            return member.assignment
        if member_id != group.leader:
            syncing = member.syncing = asyncio.get_running_loop().create_future()
            return await syncing
        for mid, m in group.members.items():
            m.assignment = assignments.get(mid, b"")
        group.state = GroupState.STABLE
        for m in group.members.values():
            if m.syncing is not None and not m.syncing.done():
                m.syncing.set_result(m.assignment)
            m.syncing = None
        return member.assignment

    def heartbeat(self, group_id: str, generation: int, member_id: str) -> tuple[ConsumerGroup, Member]:
        """A live member of the current generation (its session renewed), outside a rebalance; else GroupError."""
        group, member = self._member(group_id, member_id)
        if generation != group.generation:
            raise GroupError("IllegalGenerationError")
        member.last_seen = self.clock()
        if group.state is GroupState.PREPARING_REBALANCE:
            raise GroupError("RebalanceInProgressError")
        return group, member

    def leave(self, group_id: str, member_ids: list[str]) -> dict[str, str | None]:
        """Remove members; for each, the kafka.errors name it failed with, or None."""
        errors: dict[str, str | None] = {}
        group = self.groups.get(group_id)
        for member_id in member_ids:
            if group is None or member_id not in group.members:
                errors[member_id] = "UnknownMemberIdError"
            else:
                self._remove(group, member_id)
                errors[member_id] = None
        if group is not None and any(e is None for e in errors.values()):
            self._after_removal(group, self.clock())
        return errors

    def check_commit(self, group_id: str, generation: int, member_id: str) -> None:
        """Refuse an offset commit from outside the group's current generation, as Kafka does."""
        group = self.groups.get(group_id)
        if generation < 0 and (group is None or group.state is GroupState.EMPTY):
            return  # a commit from a consumer that assigned itself partitions (or an admin)
        if group is None or member_id not in group.members:
            raise GroupError("UnknownMemberIdError")
        if group.state is GroupState.COMPLETING_REBALANCE:
            raise GroupError("RebalanceInProgressError")
        if generation != group.generation:
            raise GroupError("IllegalGenerationError")
        group.members[member_id].last_seen = self.clock()

    # --- time -------------------------------------------------------------------------------------------------

    def tick(self) -> None:
        """Complete joins that waited long enough and drop members whose session lapsed."""
        now = self.clock()
        for group in list(self.groups.values()):
            lapsed = [
                mid
                for mid, m in group.members.items()
                if m.joining is None and now - m.last_seen > m.session_timeout_s  # a member waiting on a join is alive
            ]
            if group.state is GroupState.PREPARING_REBALANCE and now >= group.join_deadline:
                lapsed = [mid for mid, m in group.members.items() if m.joining is None]
            for member_id in lapsed:
                self._remove(group, member_id)
            if lapsed or group.state is GroupState.PREPARING_REBALANCE:
                self._after_removal(group, now)

    # --- state changes ----------------------------------------------------------------------------------------

    def _member(self, group_id: str, member_id: str) -> tuple[ConsumerGroup, Member]:
        group = self.groups.get(group_id)
        if group is None or member_id not in group.members:
            raise GroupError("UnknownMemberIdError")
        return group, group.members[member_id]

    def _prepare_rebalance(self, group: ConsumerGroup, now: float) -> None:
        for m in group.members.values():
            if m.syncing is not None and not m.syncing.done():
                m.syncing.set_exception(GroupError("RebalanceInProgressError"))
            m.syncing = None
        was_empty = group.state is GroupState.EMPTY
        group.state = GroupState.PREPARING_REBALANCE
        group.join_not_before = now + (self.initial_rebalance_delay_s if was_empty else 0.0)
        group.join_deadline = now + max(m.rebalance_timeout_s for m in group.members.values())

    def _maybe_complete_join(self, group: ConsumerGroup, now: float) -> None:
        everyone_joined = all(m.joining is not None for m in group.members.values())
        if everyone_joined and (now >= group.join_not_before or now >= group.join_deadline):
            self._complete_join(group, now)

    def _complete_join(self, group: ConsumerGroup, now: float) -> None:
        candidates = group.candidate_protocols()
        votes = Counter(next(n for n, _ in m.protocols if n in candidates) for m in group.members.values())
        first = next(iter(group.members.values()))
        protocol = max((n for n, _ in first.protocols if n in candidates), key=lambda n: votes[n])
        group.generation += 1
        group.protocol_name = protocol
        if group.leader not in group.members:
            group.leader = first.member_id
        group.state = GroupState.COMPLETING_REBALANCE
        everyone = [(mid, m.metadata(protocol)) for mid, m in group.members.items()]
        for mid, m in group.members.items():
            result = JoinResult(
                group.generation,
                group.protocol_type,
                protocol,
                group.leader,
                mid,
                everyone if mid == group.leader else [],
            )
            if m.joining is not None and not m.joining.done():
                m.joining.set_result(result)
            m.joining, m.last_seen, m.assignment = None, now, b""

    def _remove(self, group: ConsumerGroup, member_id: str) -> None:
        member = group.members.pop(member_id)
        for waiting in (member.joining, member.syncing):
            if waiting is not None and not waiting.done():
                waiting.set_exception(GroupError("UnknownMemberIdError"))

    def _after_removal(self, group: ConsumerGroup, now: float) -> None:
        """After members left: an empty group is Empty; otherwise the rest rebalance (or finish rebalancing)."""
        if not group.members:
            if group.state is not GroupState.EMPTY:
                group.state, group.leader, group.protocol_name = GroupState.EMPTY, "", ""
                group.generation += 1
        elif group.state is GroupState.PREPARING_REBALANCE:
            self._maybe_complete_join(group, now)
        else:
            self._prepare_rebalance(group, now)
