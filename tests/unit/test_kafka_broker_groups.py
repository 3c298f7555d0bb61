"""The files broker's consumer-group coordinator, driven directly with a clock the test moves."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from deploy.local.kafka_broker.groups import GroupCoordinator, GroupError, GroupState, JoinResult


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def run(test: Callable[[GroupCoordinator, Clock], Awaitable[None]], **kwargs: Any) -> None:
    clock = Clock()
    asyncio.run(test(GroupCoordinator(clock=clock, **kwargs), clock))


def join(coordinator: GroupCoordinator, member_id: str = "", client: str = "c", protocols=None) -> asyncio.Task[JoinResult]:  # type: ignore[no-untyped-def]
    return asyncio.ensure_future(
        coordinator.join(
            "g",
            member_id,
            client_id=client,
            client_host="127.0.0.1",
            session_timeout_s=10,
            rebalance_timeout_s=30,
            protocol_type="consumer",
            protocols=protocols or [("range", client.encode())],
        )
    )


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def two_stable_members(coordinator: GroupCoordinator) -> tuple[JoinResult, JoinResult]:
    """A first member alone, then a second joining: both rejoin, the leader syncs, the group is Stable."""
    a = await join(coordinator, client="a")
    await coordinator.sync("g", a.generation, a.member_id, {a.member_id: b"all"})
    b_join = join(coordinator, client="b")
    await settle()
    assert coordinator.groups["g"].state is GroupState.PREPARING_REBALANCE
    with pytest.raises(GroupError, match="RebalanceInProgressError"):
        coordinator.heartbeat("g", a.generation, a.member_id)
    a2 = await join(coordinator, a.member_id, client="a")
    b = await b_join
    assert a2.generation == b.generation == a.generation + 1
    follower = asyncio.ensure_future(coordinator.sync("g", b.generation, b.member_id, {}))
    await settle()
    assert not follower.done()  # waits for the leader's assignment
    leader_gets = await coordinator.sync("g", a2.generation, a2.member_id, {a2.member_id: b"p0", b.member_id: b"p1"})
    assert (leader_gets, await follower) == (b"p0", b"p1")
    assert coordinator.groups["g"].state is GroupState.STABLE
    return a2, b


def test_a_lone_member_leads_and_a_second_one_triggers_a_rebalance_with_the_leader_kept() -> None:
    async def test(coordinator: GroupCoordinator, clock: Clock) -> None:
        a, b = await two_stable_members(coordinator)
        assert a.leader == b.leader == a.member_id
        assert sorted(m for m, _ in a.members) == sorted([a.member_id, b.member_id]) and b.members == []
        assert dict(a.members)[b.member_id] == b"b"  # the follower's subscription, for the leader to assign
        coordinator.heartbeat("g", a.generation, a.member_id)
        assert await coordinator.sync("g", b.generation, b.member_id, {}) == b"p1"  # asked again when Stable

    run(test)


def test_a_member_that_does_not_rejoin_is_dropped_at_the_rebalance_deadline() -> None:
    async def test(coordinator: GroupCoordinator, clock: Clock) -> None:
        a, b = await two_stable_members(coordinator)
        c_join = join(coordinator, client="c")
        a_join = join(coordinator, a.member_id, client="a")
        await settle()
        for _ in range(31):  # b keeps heartbeating (so its session holds) but never rejoins
            clock.now += 1
            with pytest.raises(GroupError, match="RebalanceInProgressError"):
                coordinator.heartbeat("g", b.generation, b.member_id)
            coordinator.tick()
            await settle()
            if c_join.done():
                break
        assert clock.now - 100 >= 30
        c, a2 = await c_join, await a_join
        assert sorted(m for m, _ in a2.members) == sorted([a.member_id, c.member_id])
        with pytest.raises(GroupError, match="UnknownMemberIdError"):
            coordinator.heartbeat("g", c.generation, b.member_id)

    run(test)


def test_a_lapsed_session_starts_a_rebalance_and_a_stale_generation_is_refused() -> None:
    async def test(coordinator: GroupCoordinator, clock: Clock) -> None:
        a, b = await two_stable_members(coordinator)
        clock.now += 6
        coordinator.heartbeat("g", a.generation, a.member_id)
        clock.now += 6  # b: 12 s without a word, past its 10 s session; a: 6 s
        coordinator.tick()
        assert list(coordinator.groups["g"].members) == [a.member_id]
        with pytest.raises(GroupError, match="RebalanceInProgressError"):
            coordinator.heartbeat("g", a.generation, a.member_id)
        a2 = await join(coordinator, a.member_id, client="a")
        assert a2.generation == a.generation + 1 and [m for m, _ in a2.members] == [a.member_id]
        with pytest.raises(GroupError, match="IllegalGenerationError"):
            coordinator.heartbeat("g", a.generation, a.member_id)
        with pytest.raises(GroupError, match="IllegalGenerationError"):
            await coordinator.sync("g", a.generation, a.member_id, {})

    run(test)


def test_leaving_rebalances_the_rest_and_the_last_one_out_empties_the_group() -> None:
    async def test(coordinator: GroupCoordinator, clock: Clock) -> None:
        a, b = await two_stable_members(coordinator)
        assert coordinator.leave("g", [b.member_id, "stranger"]) == {b.member_id: None, "stranger": "UnknownMemberIdError"}
        assert coordinator.groups["g"].state is GroupState.PREPARING_REBALANCE
        a2 = await join(coordinator, a.member_id, client="a")
        assert [m for m, _ in a2.members] == [a.member_id]
        coordinator.leave("g", [a.member_id])
        group = coordinator.groups["g"]
        assert (group.state, group.members, group.generation) == (GroupState.EMPTY, {}, a2.generation + 1)

    run(test)


def test_commits_are_checked_against_the_current_generation_like_kafka() -> None:
    async def test(coordinator: GroupCoordinator, clock: Clock) -> None:
        coordinator.check_commit("standalone", -1, "")  # a consumer that assigned itself partitions
        a, b = await two_stable_members(coordinator)
        coordinator.check_commit("g", a.generation, a.member_id)
        for generation, member, error in [
            (a.generation - 1, a.member_id, "IllegalGenerationError"),
            (a.generation, "stranger", "UnknownMemberIdError"),
            (-1, "", "UnknownMemberIdError"),  # the group has members: no commits from outside it
        ]:
            with pytest.raises(GroupError, match=error):
                coordinator.check_commit("g", generation, member)

    run(test)


def test_members_must_share_a_protocol_and_get_one_they_all_support() -> None:
    async def test(coordinator: GroupCoordinator, clock: Clock) -> None:
        a = join(coordinator, client="a", protocols=[("roundrobin", b"a"), ("range", b"a")])
        await settle()
        with pytest.raises(GroupError, match="InconsistentGroupProtocolError"):
            await join(coordinator, client="x", protocols=[("sticky", b"x")])
        b = join(coordinator, client="b", protocols=[("range", b"b"), ("roundrobin", b"b")])
        c = join(coordinator, client="c", protocols=[("range", b"c")])
        await settle()
        coordinator.tick()
        assert not a.done()  # the new group waits out its initial delay for more members
        clock.now += 1
        coordinator.tick()
        results = await asyncio.gather(a, b, c)
        assert {r.protocol_name for r in results} == {"range"}

    run(test, initial_rebalance_delay_s=1.0)  # the three join inside the new group's initial delay


def test_an_unknown_member_id_is_refused_and_an_empty_one_gets_a_new_id() -> None:
    async def test(coordinator: GroupCoordinator, clock: Clock) -> None:
        with pytest.raises(GroupError, match="UnknownMemberIdError"):
            await join(coordinator, "made-up")
        first = await join(coordinator, client="cli")
        assert first.member_id.startswith("cli-") and first.leader == first.member_id

    run(test)


def test_a_second_join_of_the_same_member_answers_the_first_with_an_error() -> None:
    async def test(coordinator: GroupCoordinator, clock: Clock) -> None:
        a, b = await two_stable_members(coordinator)
        first = join(coordinator, b.member_id, client="b")  # e.g. a request its client gave up on
        await settle()
        second = join(coordinator, b.member_id, client="b")
        a_again = join(coordinator, a.member_id, client="a")
        with pytest.raises(GroupError, match="RebalanceInProgressError"):
            await first
        assert (await second).generation == (await a_again).generation == b.generation + 1

    run(test)
