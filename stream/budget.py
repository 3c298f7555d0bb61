"""The judge budget: calls per minute, tokens per minute, tokens per day; scoring waits while it is spent.

Each limit is a *sliding window*: what the judge spent in the last window
(``scoring.budget.minute_s`` or ``day_s`` seconds) may not exceed the limit.
A conversation's cost is known only after its judge call, so the budget works
in two steps:

* **acquire** before the call reserves an *estimate*: calls = the mean calls
  per judged conversation so far; tokens = the conversation's transcript
  characters × the tokens per character measured so far (tokens = prompt +
  completion; cached prompt tokens are part of prompt, as providers' rate
  limits count them). Before any conversation has been measured the estimate
  is unknown, and the conversation reserves the rest of the window: it runs
  alone and measures the cost. A reservation is admitted when, for every
  limit, spent + reserved + estimate ≤ limit — or when the window holds
  nothing at all, so one conversation whose estimate exceeds a whole limit
  still runs (alone) instead of never.
* **settle** after the call replaces the reservation by what the judge
  reported (`Provenance` calls and tokens), stamped with the settling time
  (later than the calls, so the window never forgets spend too early). An
  attempt that failed reported nothing: its estimate counts as spent.

Worst-case overshoot: over any window the judge spends at most the limit plus,
for the conversations in flight together (at most ``scoring.concurrency`` per
worker), what each cost beyond its estimate; a single conversation larger than
a limit overshoots by its excess. Admitting a conversation then makes the next
ones wait until the window has room again. Budgets are per worker process:
with N workers, give each 1/N of the provider's limit.

`JudgeBudget` is the arithmetic, with the time passed in (tests use a fake
clock); `BudgetGate` is the asynchronous waiting room the score agent uses,
with the metrics (`convowatch_judge_budget_exhausted{limit}`,
`convowatch_judge_budget_wait_seconds_total{limit}`); `BudgetedJudge` is the
blocking one the offline commands (`convowatch learn`, `rubrics evaluate`)
wrap their judge in, so they keep the same provider limits.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from scorers.conversation import Conversation
from scorers.errors import ServiceError
from scorers.judges.base import Judge, Judgement
from scorers.questions import Question
from stream.metrics import ServiceMetrics
from stream.records import ClosedConversation
from stream.settings import BudgetSettings

Limit = Literal["calls_per_minute", "tokens_per_minute", "tokens_per_day"]
LIMITS: tuple[Limit, ...] = ("calls_per_minute", "tokens_per_minute", "tokens_per_day")

# Settled spend within window/SLOTS_PER_WINDOW of a slot's first settlement joins that slot, stamped with its latest
# settlement: at most ~600 slots per window (bounded memory for a day's window), and spend expires at most window/600
# late (0.1 s of a minute, 144 s of a day), never early.
SLOTS_PER_WINDOW = 600

log = logging.getLogger(__name__)


class BudgetWaitInterrupted(ServiceError):
    """A conversation's wait for the budget was called off (a rebalance or a stop): it was not judged and must be delivered again."""


@dataclass(frozen=True)
class Cost:
    """What one conversation's judge attempt cost."""

    calls: int
    tokens: int

    def of(self, limit: Limit) -> int:
        return self.calls if limit == "calls_per_minute" else self.tokens


@dataclass
class _Window:
    """Spend of one limit over a sliding window: settled slots ``[first time, latest time, amount]`` and reservations
    in flight. A slot leaves the window ``length_s`` after its latest time."""

    limit: int
    length_s: float
    settled: deque[list[float]] = field(default_factory=deque)
    settled_total: float = 0.0
    in_flight: float = 0.0

    def expire(self, now: float) -> None:
        while self.settled and self.settled[0][1] <= now - self.length_s:
            self.settled_total -= self.settled.popleft()[2]
        if not self.settled:
            self.settled_total = 0.0  # no float residue once empty

    def spent(self) -> float:
        return self.settled_total + self.in_flight

    def admits(self, need: float | None) -> bool:
        """Whether a reservation of ``need`` (None = unknown) fits now (call `expire` first)."""
        if self.spent() == 0:
            return True
        return need is not None and self.spent() + need <= self.limit

    def reserve(self, need: float | None) -> float:
        amount = need if need is not None else max(self.limit - self.spent(), 0.0)
        self.in_flight += amount
        return amount

    def settle(self, reserved: float, amount: float, now: float) -> None:
        self.in_flight = max(self.in_flight - reserved, 0.0)
        if amount <= 0:
            return
        if self.settled and now - self.settled[-1][0] < self.length_s / SLOTS_PER_WINDOW:
            self.settled[-1][1] = max(self.settled[-1][1], now)
            self.settled[-1][2] += amount
        else:
            self.settled.append([now, now, amount])
        self.settled_total += amount

    def wait_s(self, need: float | None, now: float) -> float | None:
        """Seconds until expiring settled spend alone makes room for ``need``; None if only a settlement can."""
        remaining = self.settled_total
        for _first, stamped, amount in self.settled:
            remaining -= amount
            spent = max(remaining, 0.0) + self.in_flight
            if spent == 0 or (need is not None and spent + need <= self.limit):
                return max(stamped + self.length_s - now, 0.0)
        return None


@dataclass
class CostEstimator:
    """Estimates a conversation's cost from those measured so far (module docstring)."""

    conversations: int = 0
    calls: int = 0
    chars: int = 0
    tokens: int = 0

    def estimate(self, size_chars: int) -> tuple[float, float] | None:
        """(calls, tokens) expected for a transcript of ``size_chars`` characters; None before any measurement."""
        if self.conversations == 0:
            return None
        tokens_per_char = self.tokens / self.chars if self.chars else 0.0
        return self.calls / self.conversations, tokens_per_char * size_chars

    def observe(self, size_chars: int, cost: Cost) -> None:
        self.conversations += 1
        self.calls += cost.calls
        self.chars += size_chars
        self.tokens += cost.tokens


@dataclass(frozen=True)
class Reservation:
    """What `JudgeBudget.try_acquire` reserved for one conversation, per limit."""

    size_chars: int
    reserved: dict[Limit, float]
    estimated: bool  # False: no cost measured yet, the reservation is the rest of each window


@dataclass(frozen=True)
class Blocked:
    """Why a conversation may not be judged yet: the first limit without room, and when to look again."""

    limit: Limit
    retry_in_s: float | None  # None: only a settlement (a conversation in flight finishing) can make room


class JudgeBudget:
    """The budget's arithmetic (module docstring); time is passed in, so tests need no clock."""

    def __init__(self, settings: BudgetSettings) -> None:
        lengths = {
            "calls_per_minute": settings.minute_s,
            "tokens_per_minute": settings.minute_s,
            "tokens_per_day": settings.day_s,
        }
        self.windows: dict[Limit, _Window] = {
            limit: _Window(getattr(settings, limit), lengths[limit]) for limit in LIMITS if getattr(settings, limit) is not None
        }
        self.estimator = CostEstimator()

    @property
    def limits(self) -> tuple[Limit, ...]:
        return tuple(self.windows)

    def _needs(self, size_chars: int) -> dict[Limit, float | None]:
        estimate = self.estimator.estimate(size_chars)
        calls, tokens = estimate if estimate is not None else (None, None)
        return {limit: calls if limit == "calls_per_minute" else tokens for limit in self.windows}

    def try_acquire(self, size_chars: int, now: float) -> Reservation | Blocked:
        """Reserve the estimate of a conversation of ``size_chars`` transcript characters, or say what blocks it."""
        needs = self._needs(size_chars)
        for limit, window in self.windows.items():
            window.expire(now)
            if not window.admits(needs[limit]):
                return Blocked(limit, window.wait_s(needs[limit], now))
        reserved = {limit: window.reserve(needs[limit]) for limit, window in self.windows.items()}
        return Reservation(size_chars, reserved, estimated=self.estimator.conversations > 0)

    def settle(self, reservation: Reservation, cost: Cost | None, now: float) -> None:
        """Replace a reservation by the reported ``cost``; None (the attempt failed, nothing reported) counts the
        estimate as spent (nothing if there was none yet)."""
        for limit, window in self.windows.items():
            reserved = reservation.reserved[limit]
            failed = reserved if reservation.estimated else 0.0
            window.settle(reserved, failed if cost is None else cost.of(limit), now)
        if cost is not None:
            self.estimator.observe(reservation.size_chars, cost)


Sleep = Callable[[float], Awaitable[None]]


@dataclass
class _Change:
    """Set when the budget's state changes (a settlement) or waits are called off (``interrupted``)."""

    event: asyncio.Event = field(default_factory=asyncio.Event)
    interrupted: bool = False


class BudgetGate:
    """Where the score agent waits for the budget: no busy loop, metrics while waiting, called off on a rebalance.

    A waiter sleeps until expiring spend makes room or a settlement changes the picture, but at most one
    per-minute window at a time, so the wait counter keeps growing during long (per-day) waits. Between
    `call_off` and `resume` (a rebalance, or a stop) nothing waits: current waits end and an acquire the budget
    does not admit at once raises `BudgetWaitInterrupted`, because the agent takes the next buffered conversation
    as soon as its wait ends, before Faust suspends the flow. All methods run on the worker's event loop (from the
    consumer thread through ``loop.call_soon_threadsafe``).
    """

    def __init__(
        self,
        budget: JudgeBudget,
        metrics: ServiceMetrics,
        max_sleep_s: float,
        clock: Callable[[], float] = time.monotonic,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        self.budget = budget
        self.metrics = metrics
        self.max_sleep_s = max_sleep_s
        self._clock = clock
        self._sleep = sleep
        self._change = _Change()
        self._called_off = False
        self._waiting: dict[Limit, int] = {limit: 0 for limit in budget.limits}
        self._accounted_at = clock()
        for limit in budget.limits:  # every configured limit exports its series from the start
            metrics.judge_budget_exhausted.labels(limit).set(0)
            metrics.judge_budget_wait.labels(limit).inc(0)

    @classmethod
    def from_settings(cls, settings: BudgetSettings, metrics: ServiceMetrics) -> BudgetGate | None:
        """A gate for the configured limits; None when no limit is set (unlimited: nothing waits)."""
        budget = JudgeBudget(settings)
        return cls(budget, metrics, max_sleep_s=settings.minute_s) if budget.limits else None

    def _account(self) -> None:
        """Add the time since the last call to the wait counter of every limit something is waiting for."""
        now = self._clock()
        for limit, n in self._waiting.items():
            if n:
                self.metrics.judge_budget_wait.labels(limit).inc(now - self._accounted_at)
        self._accounted_at = now

    def _set_waiting(self, limit: Limit, delta: int) -> None:
        self._account()
        self._waiting[limit] += delta
        self.metrics.judge_budget_exhausted.labels(limit).set(1 if self._waiting[limit] else 0)

    def _notify(self, interrupted: bool = False) -> None:
        change, self._change = self._change, _Change()
        change.interrupted = interrupted
        change.event.set()

    async def acquire(self, size_chars: int) -> Reservation:
        """Wait until the budget admits a conversation of ``size_chars`` characters; `BudgetWaitInterrupted` if called off."""
        waiting_on: Limit | None = None
        try:
            while True:
                decision = self.budget.try_acquire(size_chars, self._clock())
                if isinstance(decision, Reservation):
                    return decision
                if self._called_off:
                    raise BudgetWaitInterrupted(f"waiting for the judge budget ({decision.limit}) is called off")
                if decision.limit != waiting_on:
                    if waiting_on is not None:
                        self._set_waiting(waiting_on, -1)
                    waiting_on = decision.limit
                    self._set_waiting(waiting_on, +1)
                change = self._change
                delay = self.max_sleep_s if decision.retry_in_s is None else min(decision.retry_in_s, self.max_sleep_s)
                sleeper = asyncio.ensure_future(self._sleep(delay))
                notified = asyncio.ensure_future(change.event.wait())
                try:
                    await asyncio.wait({sleeper, notified}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    sleeper.cancel()
                    notified.cancel()
                self._account()
                if change.interrupted:
                    raise BudgetWaitInterrupted(f"waiting for the judge budget ({waiting_on}) was called off")
        finally:
            if waiting_on is not None:
                self._set_waiting(waiting_on, -1)

    def settle(self, reservation: Reservation, cost: Cost | None) -> None:
        """Record what an admitted conversation cost (None: its attempt failed) and wake the waiters."""
        self.budget.settle(reservation, cost, self._clock())
        self._notify()

    def call_off(self) -> None:
        """Call off every wait, current and later (each raises `BudgetWaitInterrupted`) until `resume`."""
        self._called_off = True
        self._notify(interrupted=True)

    def resume(self) -> None:
        """Acquires wait for the budget again (the rebalance is over)."""
        self._called_off = False


def transcript_chars(conversation: Conversation | ClosedConversation) -> int:
    """Characters of a conversation's turn texts: what the judge budget scales its token estimate by."""
    return sum(len(t.text) for t in conversation.turns)


class BudgetedJudge:
    """A judge whose every ``judge`` call first waits (blocking) while ``scoring.budget`` is spent.

    Other attributes are the wrapped judge's (name, model, questions per call), so score caches keyed by the
    judge's identity are shared with the unwrapped judge, and cache hits never reach the budget. Thread-safe.
    Each wait is logged (INFO), so a command that pauses says why.
    """

    answers_in_memory = False  # it may wait for the budget, whatever judge it wraps

    def __init__(
        self, judge: Judge, budget: JudgeBudget, max_sleep_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._judge = judge
        self._budget = budget
        self._max_sleep_s = max_sleep_s
        self._clock = clock
        self._changed = threading.Condition()

    @classmethod
    def wrap(cls, judge: Judge, settings: BudgetSettings) -> Judge:
        """``judge`` within the configured limits; ``judge`` itself when no limit is set."""
        budget = JudgeBudget(settings)
        return cls(judge, budget, settings.minute_s) if budget.limits else judge

    def __getattr__(self, name: str) -> Any:
        return getattr(self._judge, name)

    def judge(self, conversation: Conversation, questions: Sequence[Question]) -> Judgement:
        size = transcript_chars(conversation)
        told: Limit | None = None
        with self._changed:
            while True:
                decision = self._budget.try_acquire(size, self._clock())
                if isinstance(decision, Reservation):
                    reservation = decision
                    break
                delay = self._max_sleep_s if decision.retry_in_s is None else min(decision.retry_in_s, self._max_sleep_s)
                if decision.limit != told:
                    log.info("waiting up to %.1f s for the judge budget (%s)", delay, decision.limit)
                    told = decision.limit
                self._changed.wait(timeout=delay)
        judgement: Judgement | None = None
        try:
            judgement = self._judge.judge(conversation, questions)
            return judgement
        finally:
            p = None if judgement is None else judgement.provenance
            with self._changed:
                self._budget.settle(
                    reservation, None if p is None else Cost(p.calls, p.prompt_tokens + p.completion_tokens), self._clock()
                )
                self._changed.notify_all()
