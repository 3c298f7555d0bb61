"""The scorers a worker uses now, and switching them without a restart.

`ScorerRollout` holds the active `ConversationScorer` and, when the registry
names one, a shadow scorer with the share of conversations it scores
(`Scorers`). With a registry (``scoring.registry``, stream/registry.py) the
worker's ``scorer_rollout`` timer calls `refresh` every
``scoring.registry_poll_s``: a changed rollout is loaded in full — every
version read and checked, its scorer built — before anything switches, so a
version that cannot be loaded is refused (logged once, counted in
``convowatch_scorer_rollout_changes_total{outcome="refused"}``) and the worker
keeps scoring with what it has. A switch is one assignment: each conversation
is scored entirely by the scorers current when its scoring starts.

Which conversations the shadow scores is decided from the conversation id
(`unit_hash`, like sampling), so a replay shadows the same ones, and only among
those the active version judged.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from stream.metrics import ServiceMetrics
from stream.records import ACTIVE, SHADOW
from stream.registry import RegistryError, Rollout, ScorerRegistry, ScorerVersion
from stream.sampling import unit_hash
from stream.scoring import ConversationScorer

log = logging.getLogger(__name__)

SHADOW_SALT = "convowatch-shadow"

BuildScorer = Callable[[ScorerVersion], ConversationScorer]


@dataclass(frozen=True)
class Scorers:
    """The active scorer, and the shadow scorer with the share of judged conversations it scores too."""

    active: ConversationScorer
    shadow: ConversationScorer | None = None
    shadow_rate: float = 0.0

    def shadows(self, conversation_id: str) -> bool:
        """Whether the shadow scores this conversation too (when the active version judged it)."""
        return self.shadow is not None and unit_hash(SHADOW_SALT, conversation_id) < self.shadow_rate


class ScorerRollout:
    """The worker's current `Scorers`, fixed or following a registry's rollout."""

    def __init__(
        self,
        current: Scorers,
        metrics: ServiceMetrics,
        registry: ScorerRegistry | None = None,
        build: BuildScorer | None = None,
        rollout: Rollout | None = None,
    ) -> None:
        self.current = current
        self.metrics = metrics
        self.registry = registry
        self._build = build
        self._rollout = rollout  # what `current` was built from
        self._refused: str | None = None  # why the last rollout was refused, so a bad one is reported once
        self._show(current)

    @classmethod
    def fixed(cls, scorer: ConversationScorer, metrics: ServiceMetrics) -> ScorerRollout:
        """One scorer, configured by file (``rubric_set``, ``calibrator``), for the worker's lifetime."""
        return cls(Scorers(scorer), metrics)

    @classmethod
    def from_registry(cls, registry: ScorerRegistry, build: BuildScorer, metrics: ServiceMetrics) -> ScorerRollout:
        """The registry's current rollout, loaded; `RegistryError` (or `SettingsError`) if it has no usable active version."""
        rollout = registry.rollout()
        return cls(_load(registry, build, rollout, None), metrics, registry, build, rollout)

    @property
    def watches(self) -> bool:
        """Whether `refresh` can change anything (a registry is configured)."""
        return self.registry is not None

    def refresh(self) -> bool:
        """Read the rollout and switch if it changed and loads; True if it switched. Never raises for a bad rollout."""
        if self.registry is None or self._build is None:
            return False
        try:
            rollout = self.registry.rollout()
            if rollout == self._rollout:
                self._refused = None  # back to what it scores with: a bad rollout written again is reported again
                return False
            scorers = _load(self.registry, self._build, rollout, self.current)
        except Exception as e:  # whatever the registry holds, the worker keeps scoring with the versions it has
            if str(e) != self._refused:  # reported once, not at every poll
                self._refused = str(e)
                self.metrics.rollout_changes.labels("refused").inc()
                log.error("scorer rollout refused, still scoring with %s: %s", _describe(self.current), e)
            return False
        self.current, self._rollout, self._refused = scorers, rollout, None
        self.metrics.rollout_changes.labels("applied").inc()
        self._show(scorers)
        log.info("scorer rollout applied: %s", _describe(scorers))
        return True

    def _show(self, scorers: Scorers) -> None:
        self.metrics.scorer_version_info.clear()
        self.metrics.scorer_version_info.labels(ACTIVE, scorers.active.name, scorers.active.scorer_version).set(1)
        if scorers.shadow is not None:
            self.metrics.scorer_version_info.labels(SHADOW, scorers.shadow.name, scorers.shadow.scorer_version).set(1)


def _load(registry: ScorerRegistry, build: BuildScorer, rollout: Rollout, current: Scorers | None) -> Scorers:
    """Build the scorers of ``rollout``, reusing those of ``current`` whose version name is unchanged."""
    have = {} if current is None else {s.name: s for s in (current.active, current.shadow) if s is not None}

    def scorer(name: str) -> ConversationScorer:
        return have[name] if name in have else build(registry.version(name))

    if rollout.active is None:
        raise RegistryError(
            f"the scorer registry {registry.root} has no active version: register one and promote it "
            "(convowatch scorers register NAME --rubric-set FILE; convowatch scorers promote NAME)"
        )
    active = scorer(rollout.active)
    shadow = scorer(rollout.shadow) if rollout.shadow is not None else None
    return Scorers(active, shadow, rollout.shadow_rate if shadow is not None else 0.0)


def _describe(scorers: Scorers) -> str:
    active = f"active {scorers.active.name or '(by file)'} ({scorers.active.scorer_version})"
    if scorers.shadow is None:
        return active
    return f"{active}, shadow {scorers.shadow.name} ({scorers.shadow.scorer_version}) on {scorers.shadow_rate:.0%}"
