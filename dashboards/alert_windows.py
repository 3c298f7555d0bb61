"""`AlertWindows`: every window, duration and threshold of convowatch's alert rules, as plain data.

The committed rule files use the production defaults below. Tests render the
same rules with compressed windows (seconds instead of minutes) so a real
Prometheus can fire them within a test; the rules are otherwise identical.

Durations are Prometheus duration strings (``30s``, ``10m``, ``6h``, ``1d``,
``1h30m``). They appear verbatim in recorded metric names
(``convowatch:calibrated_dsat_rate:ratio_rate10m``), so a rule always says
which window it measures.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, fields

from scorers.errors import UserError

_UNIT_S = {"y": 365 * 86400, "w": 7 * 86400, "d": 86400, "h": 3600, "m": 60, "s": 1, "ms": 0.001}
# Prometheus' duration syntax: units in this order, each at most once, integers only.
_DURATION = re.compile(r"(?:(\d+)y)?(?:(\d+)w)?(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?(?:(\d+)ms)?")


class AlertWindowsError(UserError, ValueError):
    """An `AlertWindows` field has a value the rules cannot use; the message names the field."""


def duration_seconds(text: str) -> float:
    """Seconds in a Prometheus duration string (``"10m"`` -> 600.0); ValueError if it is not one."""
    match = _DURATION.fullmatch(text) if isinstance(text, str) and text else None
    if match is None:
        raise ValueError(
            f"{text!r} is not a Prometheus duration (integers with units y w d h m s ms, largest first: 30s, 10m, 1h30m, 1d)"
        )
    return sum(int(n) * _UNIT_S[u] for n, u in zip(match.groups(), _UNIT_S) if n is not None)


@dataclass(frozen=True)
class AlertWindows:
    """Windows and thresholds of the alert rules (defaults: production)."""

    # --- windows ---------------------------------------------------------------------------
    short: str = "10m"
    """The "now" window: rates and counts that alerts compare are measured over it."""
    baseline: str = "6h"
    """Baseline window of the spike and surge alerts. It ends now, so it includes the short window:
    a spike lifts its own baseline a little (by short/baseline of the lift, 1/36 with the defaults),
    which makes the alert slightly conservative, never trigger-happy."""
    yesterday: str = "1d"
    """Offset of the same-time-yesterday comparison (the short window, this long ago)."""
    for_: str = "10m"
    """How long a condition must hold before its alert fires (Prometheus ``for:``)."""
    stall_for: str = "15m"
    """Pipeline stalled: conversations closed during this window and none was scored or stored unscored."""
    lost_data_for: str = "1h"
    """Broker lost data: a worker or the sink found a partition's log shorter than its position during this window
    (it keeps firing this long after the last such finding, longer than ``for_``)."""
    quarantined_for: str = "1h"
    """Records quarantined: a worker stage dead-lettered a record it failed on twice during this window (it keeps
    firing this long after the last one, as for lost data)."""
    grafana_interval: str = "1m"
    """How often Grafana evaluates its rule group (Grafana needs one per group). The Prometheus rules set
    none: they run at Prometheus' global ``evaluation_interval`` (15s in deploy/production/prometheus.yml)."""

    # --- dissatisfaction spike ---------------------------------------------------------------
    min_conversations: int = 50
    """Calibrated conversations needed in the short window (and in yesterday's) before a spike can fire:
    low traffic cannot page."""
    z: float = 3.0
    """Standard errors above the baseline a short-window rate must be to count as significant."""
    min_lift: float = 0.05
    """Smallest absolute rise (5 points of dissatisfaction rate) that can fire, however tight the error."""

    # --- uncertain surge (judge drift) ----------------------------------------------------------
    uncertain_min_lift: float = 0.15
    """Smallest absolute rise of the uncertain share (15 points) that can fire."""
    uncertain_min_conversations: int = 50
    """Scored conversations needed in the short window before the uncertain surge can fire."""

    # --- behaviour rise (ABC-Eval behaviours per assistant turn) ----------------------------------
    behaviour_min_turns: int = 200
    """Assistant turns judged in the short window (Σ 1/π) before a behaviour's rise can fire."""
    behaviour_min_lift: float = 0.05
    """Smallest absolute rise of a behaviour's rate per turn (5 points) that can fire, however tight the error."""

    # --- agreement with the users (rated conversations) ----------------------------------------
    agreement_short: str = "1d"
    """The "now" window of the agreement-drop alert: users rate few conversations, so it is long."""
    agreement_baseline: str = "7d"
    """Baseline of the agreement-drop alert: the window before ``agreement_short`` (so the two are independent samples)."""
    agreement_min_conversations: int = 50
    """Rated conversations with a confident label needed in each of the two windows before the drop can fire."""
    agreement_min_drop: float = 0.10
    """Smallest absolute fall of the agreement with the users (10 points) that can fire, however tight the error."""

    # --- operations ----------------------------------------------------------------------------
    judge_error_ratio: float = 0.10
    """Judge errors: share of judge attempts that failed in the short window."""
    judge_min_attempts: int = 20
    """Judge attempts (failed + succeeded) needed in the short window before judge errors can fire."""
    dead_letter_ratio: float = 0.05
    """Dead-letter surge: dead letters per consumed event in the short window."""
    dead_letter_min_events: int = 200
    """Consumed events needed in the short window before the dead-letter surge can fire."""
    budget_wait_share: float = 0.5
    """Judge budget exhausted: share of the short window during which a worker's scoring waited for the budget."""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type == "str":
                try:
                    seconds = duration_seconds(value)
                except ValueError as e:
                    raise AlertWindowsError(f"AlertWindows.{f.name}: {e}") from None
                if seconds <= 0 and f.name != "for_":
                    raise AlertWindowsError(f"AlertWindows.{f.name}: {value!r} must be longer than 0s")
            elif f.type == "int":
                if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                    raise AlertWindowsError(f"AlertWindows.{f.name}: {value!r} must be a whole number >= 1")
            elif f.type == "float":
                if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                    raise AlertWindowsError(f"AlertWindows.{f.name}: {value!r} must be a finite number")
        self._check_order()
        self._check_ranges()

    def seconds(self, name: str) -> float:
        """A duration field in seconds (``w.seconds("short")``)."""
        return duration_seconds(getattr(self, name))

    def _check_order(self) -> None:
        s = self.seconds
        if s("short") >= s("baseline"):
            raise AlertWindowsError(f"AlertWindows.short ({self.short}) must be shorter than baseline ({self.baseline})")
        if s("agreement_short") >= s("agreement_baseline"):
            raise AlertWindowsError(
                f"AlertWindows.agreement_short ({self.agreement_short}) must be shorter than agreement_baseline "
                f"({self.agreement_baseline})"
            )
        if s("yesterday") < s("short"):
            raise AlertWindowsError(
                f"AlertWindows.yesterday ({self.yesterday}) must be at least the short window ({self.short}), "
                "or the two windows compared overlap"
            )

    def _check_ranges(self) -> None:
        if self.z <= 0:
            raise AlertWindowsError(f"AlertWindows.z: {self.z!r} must be > 0 (standard errors above the baseline)")
        for name in ("min_lift", "uncertain_min_lift", "behaviour_min_lift", "agreement_min_drop"):
            if not 0 <= getattr(self, name) < 1:
                raise AlertWindowsError(
                    f"AlertWindows.{name}: {getattr(self, name)!r} must be in [0, 1) (a difference of two shares)"
                )
        for name in ("judge_error_ratio", "dead_letter_ratio", "budget_wait_share"):
            if not 0 < getattr(self, name) < 1:
                raise AlertWindowsError(f"AlertWindows.{name}: {getattr(self, name)!r} must be in (0, 1) (a share)")
