"""The judge budget's arithmetic and its waiting room, on a fake clock (no sleeps), the offline commands' blocking judge
(short real windows), and the price table."""

from __future__ import annotations

import asyncio
import logging
import random
import time

import pytest

from scorers.conversation import Conversation, Turn
from scorers.judges.base import Judgement, JudgeUnavailable, Provenance
from stream.budget import (
    SLOTS_PER_WINDOW,
    Blocked,
    BudgetedJudge,
    BudgetGate,
    BudgetWaitInterrupted,
    Cost,
    JudgeBudget,
    Reservation,
)
from stream.cost import judge_cost
from stream.metrics import ServiceMetrics
from stream.settings import BudgetSettings, PriceSettings, SettingsError, load_settings


def admitted(decision: Reservation | Blocked) -> Reservation:
    assert isinstance(decision, Reservation), decision
    return decision


def blocked(decision: Reservation | Blocked) -> Blocked:
    assert isinstance(decision, Blocked), decision
    return decision


# --- arithmetic ---------------------------------------------------------------------------------


def test_first_conversation_runs_alone_then_estimates_come_from_what_was_measured() -> None:
    budget = JudgeBudget(BudgetSettings(calls_per_minute=10))
    first = admitted(budget.try_acquire(1000, now=0))
    assert first.reserved == {"calls_per_minute": 10} and not first.estimated  # unknown cost: the rest of the window
    assert blocked(budget.try_acquire(1000, now=1)) == Blocked("calls_per_minute", None)  # only a settlement frees room
    budget.settle(first, Cost(calls=3, tokens=900), now=2)
    second = admitted(budget.try_acquire(1000, now=2))
    assert second.reserved == {"calls_per_minute": 3} and second.estimated
    admitted(budget.try_acquire(1000, now=2))  # 3 settled + 3 + 3 = 9 <= 10
    # 9 + 3 > 10: the settled 3 expire at 2 + 60; the two in flight still hold 6, and 6 + 3 <= 10 then
    assert blocked(budget.try_acquire(1000, now=5)) == Blocked("calls_per_minute", 57)
    admitted(budget.try_acquire(1000, now=62))


def test_token_estimate_scales_with_the_transcript_and_the_blocking_limit_is_named() -> None:
    budget = JudgeBudget(BudgetSettings(calls_per_minute=1000, tokens_per_minute=10_000, tokens_per_day=11_500))
    budget.settle(admitted(budget.try_acquire(1000, now=0)), Cost(calls=2, tokens=2500), now=0)  # 2.5 tokens per char
    r = admitted(budget.try_acquire(2000, now=0))
    assert r.reserved == {"calls_per_minute": 2, "tokens_per_minute": 5000, "tokens_per_day": 5000}
    budget.settle(r, Cost(calls=2, tokens=5000), now=1)
    # per minute: 7500 + 2500 = 10000 fits; per day: 7500 + 2500 = 10000 fits too
    budget.settle(admitted(budget.try_acquire(1000, now=2)), Cost(calls=2, tokens=2500), now=2)
    # estimate now 10000 / 4000 chars = 2.5 per char; 400 chars -> 1000 tokens: the minute window (10000) is full
    assert blocked(budget.try_acquire(400, now=3)).limit == "tokens_per_minute"
    # a minute later the minute window has room; the day holds 10000 + 1000 <= 11500, then + 1000 more does not fit
    admitted(budget.try_acquire(400, now=61))
    # the day's settlements at t = 0, 1, 2 share one slot (a day / 600 = 144 s) stamped t = 2: they leave together
    assert blocked(budget.try_acquire(400, now=61)) == Blocked("tokens_per_day", 86_400.0 + 2 - 61)


def test_an_underestimate_overshoots_by_its_excess_only_and_the_next_conversations_wait() -> None:
    budget = JudgeBudget(BudgetSettings(tokens_per_minute=1000))
    budget.settle(admitted(budget.try_acquire(100, now=0)), Cost(calls=1, tokens=100), now=0)  # 1 token per char
    big = admitted(budget.try_acquire(500, now=1))  # estimate 500: 600 <= 1000
    budget.settle(big, Cost(calls=1, tokens=1400), now=2)  # reported 1400: the window holds 1500, 900 beyond its estimate
    window = budget.windows["tokens_per_minute"]
    assert window.spent() == 1500 <= 1000 + (1400 - 500)  # within the documented bound: limit + excess
    wait = blocked(budget.try_acquire(10, now=3))
    assert wait.retry_in_s == pytest.approx(59)  # until both settlements have left the window (the 100 alone is not enough)


def test_a_conversation_bigger_than_the_whole_limit_runs_alone_in_an_empty_window() -> None:
    budget = JudgeBudget(BudgetSettings(tokens_per_minute=1000))
    budget.settle(admitted(budget.try_acquire(100, now=0)), Cost(calls=1, tokens=100), now=0)
    assert blocked(budget.try_acquire(5000, now=1)) == Blocked("tokens_per_minute", 59)  # estimate 5000 > 1000
    huge = admitted(budget.try_acquire(5000, now=60))  # empty window: admitted rather than never
    assert blocked(budget.try_acquire(1, now=60)).retry_in_s is None  # and alone while it runs
    budget.settle(huge, Cost(calls=1, tokens=5000), now=61)
    assert blocked(budget.try_acquire(1, now=62)).retry_in_s == pytest.approx(59)


def test_a_failed_attempt_counts_its_estimate_or_nothing_before_the_first_measurement() -> None:
    budget = JudgeBudget(BudgetSettings(calls_per_minute=10))
    budget.settle(admitted(budget.try_acquire(100, now=0)), None, now=0)  # failed before any measurement: nothing spent
    assert budget.windows["calls_per_minute"].spent() == 0 and budget.estimator.conversations == 0
    budget.settle(admitted(budget.try_acquire(100, now=1)), Cost(calls=4, tokens=0), now=1)
    budget.settle(admitted(budget.try_acquire(100, now=2)), None, now=2)  # failed: its estimate (4) counts as spent
    assert budget.windows["calls_per_minute"].spent() == 8 and budget.estimator.conversations == 1


def test_a_judge_that_reports_no_cost_is_never_held_back() -> None:
    budget = JudgeBudget(BudgetSettings(calls_per_minute=1, tokens_per_minute=1))  # the recorded judge reports 0 calls
    for t in range(100):
        budget.settle(admitted(budget.try_acquire(1000, now=t * 0.01)), Cost(calls=0, tokens=0), now=t * 0.01)


def test_merged_spend_never_expires_early_and_memory_stays_bounded() -> None:
    rng = random.Random(7)
    length = 60.0
    budget = JudgeBudget(BudgetSettings(tokens_per_minute=10**12, minute_s=length))
    window = budget.windows["tokens_per_minute"]
    log: list[tuple[float, int]] = []
    now = 0.0
    for _ in range(6000):
        now += rng.expovariate(200)  # ~200 settlements a second, far more than SLOTS_PER_WINDOW per window
        tokens = rng.randrange(1, 1000)
        budget.settle(admitted(budget.try_acquire(1, now)), Cost(calls=1, tokens=tokens), now)
        log.append((now, tokens))
        window.expire(now)
        exact = sum(a for t, a in log if t > now - length)
        late = sum(a for t, a in log if t > now - length - length / SLOTS_PER_WINDOW)
        assert exact <= window.settled_total + 1e-6 <= late + 1e-6
        assert len(window.settled) <= SLOTS_PER_WINDOW + 1


def test_no_limit_means_no_gate() -> None:
    assert BudgetGate.from_settings(BudgetSettings(), ServiceMetrics()) is None


# --- settings and prices ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"), [("calls_per_minute", -1), ("tokens_per_minute", 0), ("tokens_per_day", -5), ("minute_s", 0)]
)
def test_bad_budget_settings_name_the_setting(field: str, value: float) -> None:
    with pytest.raises(SettingsError, match=rf"scoring\.budget\.{field}"):
        load_settings(scoring={"budget": {field: value}})


def test_budget_and_price_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONVOWATCH_SCORING__BUDGET__CALLS_PER_MINUTE", "120")
    monkeypatch.setenv("CONVOWATCH_SCORING__BUDGET__TOKENS_PER_DAY", "5000000")
    monkeypatch.setenv("CONVOWATCH_JUDGE__PRICE__PROMPT_PER_MILLION", "0.5")
    monkeypatch.setenv("CONVOWATCH_JUDGE__PRICE__COMPLETION_PER_MILLION", "1.5")
    s = load_settings()
    assert (s.scoring.budget.calls_per_minute, s.scoring.budget.tokens_per_minute, s.scoring.budget.tokens_per_day) == (
        120,
        None,
        5_000_000,
    )
    assert s.judge.price == PriceSettings(prompt_per_million=0.5, completion_per_million=1.5)
    with pytest.raises(SettingsError, match=r"judge\.price\.prompt_per_million"):
        load_settings(judge={"price": {"prompt_per_million": -1, "completion_per_million": 1}})


def test_cached_prompt_tokens_are_priced_at_the_cached_rate_and_the_rest_at_the_prompt_rate() -> None:
    price = PriceSettings(prompt_per_million=2.0, cached_prompt_per_million=0.5, completion_per_million=8.0, currency="EUR")
    # 1M prompt of which 400k cached, 100k completion: 600k * 2 + 400k * 0.5 + 100k * 8 per million
    assert judge_cost(price, 1_000_000, 400_000, 100_000) == pytest.approx(1.2 + 0.2 + 0.8)
    no_discount = PriceSettings(prompt_per_million=2.0, completion_per_million=8.0)
    assert judge_cost(no_discount, 1_000_000, 400_000, 0) == pytest.approx(2.0)
    # linear: the cost of a sum is the sum of the costs (the report prices ClickHouse sums)
    parts = [(900, 300, 20), (1200, 0, 35), (50, 50, 1)]
    total = [sum(col) for col in zip(*parts)]
    assert judge_cost(price, *total) == pytest.approx(sum(judge_cost(price, *p) for p in parts))


# --- the waiting room, on a fake clock ----------------------------------------------------------


class FakeClock:
    """Monotonic time that moves only when a waiter sleeps; ``block`` makes sleeps never end (until cancelled)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []
        self.block = False
        self.on_sleep = lambda: None

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.on_sleep()
        if self.block:
            await asyncio.Event().wait()
        self.now += seconds
        await asyncio.sleep(0)


def gate(clock: FakeClock, **limits: float) -> tuple[BudgetGate, ServiceMetrics]:
    metrics = ServiceMetrics()
    settings = BudgetSettings(**limits)
    return BudgetGate(JudgeBudget(settings), metrics, max_sleep_s=settings.minute_s, clock=clock, sleep=clock.sleep), metrics


def sample(metrics: ServiceMetrics, name: str, limit: str) -> float | None:
    return metrics.registry.get_sample_value(name, {"limit": limit})


def test_a_waiter_sleeps_until_the_window_has_room_and_the_metrics_say_so() -> None:
    clock = FakeClock()
    g, metrics = gate(clock, calls_per_minute=10)
    assert sample(metrics, "convowatch_judge_budget_exhausted", "calls_per_minute") == 0
    assert sample(metrics, "convowatch_judge_budget_exhausted", "tokens_per_day") is None  # not configured: no series
    seen: list[float | None] = []
    clock.on_sleep = lambda: seen.append(sample(metrics, "convowatch_judge_budget_exhausted", "calls_per_minute"))

    async def run() -> None:
        g.settle(await g.acquire(100), Cost(calls=4, tokens=0))
        g.settle(await g.acquire(100), Cost(calls=4, tokens=0))
        clock.now = 10.0
        await g.acquire(100)  # 8 + 4 > 10: sleeps once, exactly until the settled 8 leave the window (t = 60)

    asyncio.run(run())
    assert clock.sleeps == [50.0] and clock.now == 60.0  # one sleep, no polling
    assert seen == [1.0]  # exhausted while waiting
    assert sample(metrics, "convowatch_judge_budget_exhausted", "calls_per_minute") == 0
    assert sample(metrics, "convowatch_judge_budget_wait_seconds_total", "calls_per_minute") == 50.0


def test_long_waits_wake_once_a_minute_so_the_wait_counter_keeps_growing() -> None:
    clock = FakeClock()
    g, metrics = gate(clock, tokens_per_day=1000)
    counted: list[float | None] = []
    clock.on_sleep = lambda: counted.append(sample(metrics, "convowatch_judge_budget_wait_seconds_total", "tokens_per_day"))

    async def run() -> None:
        g.settle(await g.acquire(100), Cost(calls=1, tokens=1000))
        await g.acquire(100)

    asyncio.run(run())
    assert clock.sleeps == [60.0] * 1440 and clock.now == 86_400.0
    assert counted[:3] == [0.0, 60.0, 120.0]
    assert sample(metrics, "convowatch_judge_budget_wait_seconds_total", "tokens_per_day") == 86_400.0


def test_a_settlement_wakes_a_waiter_blocked_by_a_conversation_in_flight() -> None:
    clock = FakeClock()
    clock.block = True  # time never passes: only the settlement can admit the waiter
    g, _ = gate(clock, calls_per_minute=10)

    async def run() -> Reservation:
        first = await g.acquire(100)  # no estimate yet: it holds the whole window
        waiter = asyncio.ensure_future(g.acquire(100))
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert not waiter.done()
        g.settle(first, Cost(calls=2, tokens=0))
        return await asyncio.wait_for(waiter, timeout=5)

    assert asyncio.run(run()).reserved == {"calls_per_minute": 2}


def test_call_off_ends_every_wait_and_refuses_new_ones_until_resume() -> None:
    clock = FakeClock()
    clock.block = True
    g, metrics = gate(clock, calls_per_minute=10)

    async def run() -> None:
        first = await g.acquire(100)
        waiters = [asyncio.ensure_future(g.acquire(100)) for _ in range(2)]
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        g.call_off()
        for w in waiters:
            with pytest.raises(BudgetWaitInterrupted, match="calls_per_minute"):
                await asyncio.wait_for(w, timeout=5)
        assert sample(metrics, "convowatch_judge_budget_exhausted", "calls_per_minute") == 0
        # Still called off: the agent's next buffered conversation must not start a new wait (it would hold the
        # rebalance), so an acquire the budget does not admit at once raises at once ...
        with pytest.raises(BudgetWaitInterrupted, match="called off"):
            await asyncio.wait_for(g.acquire(100), timeout=5)
        g.settle(first, Cost(calls=5, tokens=0))
        # ... while one it admits goes through (5 calls spent and 5 estimated: the window is full again).
        second = await asyncio.wait_for(g.acquire(100), timeout=5)
        g.resume()
        later = asyncio.ensure_future(g.acquire(100))
        await asyncio.sleep(0)
        assert not later.done()  # waits as usual after resume
        g.settle(second, Cost(calls=0, tokens=0))
        await asyncio.wait_for(later, timeout=5)

    asyncio.run(run())


# --- the offline commands' blocking judge ---------------------------------------------------------


class _CountingJudge:
    """Answers nothing, reports ``calls`` judge calls per conversation, and records when each call started."""

    name = "counting"
    model = "m"

    def __init__(self, calls: int) -> None:
        self.calls = calls
        self.started: list[float] = []

    def judge(self, conversation, questions):
        self.started.append(time.monotonic())
        return Judgement(conversation.id, {}, Provenance(judge=self.name, model=self.model, calls=self.calls, prompt_tokens=50))


def test_the_blocking_judge_keeps_calls_per_window_and_is_the_judge_itself_without_a_limit(caplog) -> None:
    inner = _CountingJudge(calls=4)
    assert BudgetedJudge.wrap(inner, BudgetSettings()) is inner
    judge = BudgetedJudge.wrap(inner, BudgetSettings(calls_per_minute=4, minute_s=0.4))
    assert (judge.name, judge.model) == ("counting", "m")  # the score cache sees the wrapped judge's identity
    conversation = Conversation("c1", (Turn("user", "hello"), Turn("assistant", "hi")))
    with caplog.at_level(logging.INFO, logger="stream.budget"):
        for _ in range(3):
            judge.judge(conversation, [])
    # Each conversation spends the whole window (4 calls): the next starts only after it has passed.
    gaps = [b - a for a, b in zip(inner.started, inner.started[1:])]
    assert all(gap >= 0.4 for gap in gaps), gaps
    assert "waiting up to" in caplog.text and "calls_per_minute" in caplog.text


def test_a_failed_call_counts_its_estimate_and_the_next_call_still_runs() -> None:
    class Failing(_CountingJudge):
        def judge(self, conversation, questions):
            super().judge(conversation, questions)
            raise JudgeUnavailable("down")

    inner = _CountingJudge(calls=2)
    judge = BudgetedJudge(inner, JudgeBudget(BudgetSettings(calls_per_minute=10, minute_s=0.2)), max_sleep_s=0.2)
    conversation = Conversation("c1", (Turn("user", "hello"),))
    judge.judge(conversation, [])
    judge._judge = Failing(calls=2)
    with pytest.raises(JudgeUnavailable):
        judge.judge(conversation, [])
    judge._judge = inner
    judge.judge(conversation, [])
    assert len(inner.started) == 2
