"""Which closed conversations the judge scores, and the weights that keep rates unbiased.

Sampling is *Poisson sampling*: each conversation is scored independently with
its own inclusion probability π, decided deterministically from its id (a hash
mapped to [0, 1) compared with π), so a replay scores exactly the same
conversations. π comes from the first `SamplingRule` whose attribute pairs the
conversation has, else ``default_rate``. ``always_first_per_model_version``
conversations of every model version a policy has not seen before are scored
with π = 1 (a new release is watched closely from its first conversation), and
so, when ``always_score_negative_feedback`` is on, is every conversation a user
rated down while it was open (`ClosedConversation.negative_feedback`), and,
when ``always_score_rated`` is on, every conversation a user rated at all (the
ones the scorer's agreement with its users is measured on): their inclusion
probability really is 1, so the weights stay right. Feedback that
arrives after the close cannot change the decision (the conversation has been
decided by then). The first-N count is kept per worker process.

Every conversation is *counted* (volume, N); only the sampled ones are judged,
and each carries its π. A population mean of a per-conversation value y (a
0/1 label, a calibrated P(dissatisfied)) is then estimated without bias by the
Horvitz–Thompson estimator over the sampled set s:

    Ŷ = (1/N) Σ_s y_i / π_i                     E[Ŷ] = Ȳ exactly

and its sampling variance (Poisson sampling) by

    V̂ = (1/N²) Σ_s (1 − π_i) y_i² / π_i²       E[V̂] = Var(Ŷ)

Both are sums over scored conversations, so they are kept as Prometheus
counters (Σ y/π, Σ (1−π) y²/π², N) and computed in PromQL or SQL; with π = 1
everywhere they reduce to the plain mean and zero sampling variance.

Dashboards, reports and alerts use the *Hájek* (ratio) form instead, which
needs no separate count of the population and is what a rate over a window
is: R = Σ_s y/π / Σ_s 1/π, with the linearised Poisson-sampling variance

    V̂ = Σ_s (1 − π) / π² · (y − R)² / (Σ_s 1/π)²
      = (S2 − 2R·S1 + R²·S0) / (Σ_s 1/π)²,   S_k = Σ_s (1 − π) / π² · y^k

(`hajek_sampling_variance`); the S_k are counters too.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from scorers.errors import UserError

if TYPE_CHECKING:
    from stream.settings import SamplingSettings

MODEL_VERSION = "model_version"
# Why a conversation got its inclusion probability (stored with every score as its sampling reason).
RATE, NEW_MODEL_VERSION, NEGATIVE_FEEDBACK, RATED = "rate", "new_model_version", "negative_feedback", "rated"
_HASH_BYTES = 8


class SamplingError(UserError, ValueError):
    """A sampling policy that cannot be used; the message names the field."""


@dataclass(frozen=True)
class SamplingRule:
    """Conversations whose attributes contain every ``match`` pair are scored with probability ``rate``."""

    match: Mapping[str, str]
    rate: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "match", dict(self.match))
        if not self.match:
            raise SamplingError("a sampling rule needs at least one attribute to match (use default_rate for the rest)")
        _check_rate(self.rate, f"rule {self.match}")

    def matches(self, attributes: Mapping[str, str]) -> bool:
        return all(attributes.get(k) == v for k, v in self.match.items())


@dataclass(frozen=True)
class SamplingDecision:
    """Whether to judge a conversation, with the probability it had of being judged."""

    scored: bool
    inclusion_probability: float
    reason: str  # RATE, NEW_MODEL_VERSION, NEGATIVE_FEEDBACK or RATED


@dataclass
class SamplingPolicy:
    """Decides, per closed conversation, whether the judge scores it (module docstring)."""

    default_rate: float = 1.0
    rules: Sequence[SamplingRule] = ()
    always_first_per_model_version: int = 0
    salt: str = ""
    always_score_negative_feedback: bool = False
    always_score_rated: bool = False
    _seen_per_version: dict[str, int] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        _check_rate(self.default_rate, "default_rate")
        if self.always_first_per_model_version < 0:
            raise SamplingError(f"always_first_per_model_version must be >= 0, got {self.always_first_per_model_version}")
        self.rules = tuple(self.rules)

    def rate_for(self, attributes: Mapping[str, str]) -> float:
        """π for a conversation with these attributes (first matching rule, else the default)."""
        for rule in self.rules:
            if rule.matches(attributes):
                return rule.rate
        return self.default_rate

    @classmethod
    def from_settings(cls, settings: SamplingSettings) -> SamplingPolicy:
        """The policy ``scoring.sampling`` describes."""
        return cls(
            default_rate=settings.default_rate,
            rules=[SamplingRule(r.match, r.rate) for r in settings.rules],
            always_first_per_model_version=settings.always_first_per_model_version,
            salt=settings.salt,
            always_score_negative_feedback=settings.always_score_negative_feedback,
            always_score_rated=settings.always_score_rated,
        )

    def decide(
        self, conversation_id: str, attributes: Mapping[str, str], negative_feedback: bool = False, rated: bool = False
    ) -> SamplingDecision:
        """Score it or not; the same id and attributes always get the same answer (but for new-version counting).
        ``negative_feedback``: a user rated it down while it was open; ``rated``: a user rated it at all."""
        if negative_feedback and self.always_score_negative_feedback:
            return SamplingDecision(True, 1.0, NEGATIVE_FEEDBACK)
        if rated and self.always_score_rated:
            return SamplingDecision(True, 1.0, RATED)
        version = attributes.get(MODEL_VERSION)
        if version is not None and self.always_first_per_model_version:
            seen = self._seen_per_version.get(version, 0)
            self._seen_per_version[version] = seen + 1
            if seen < self.always_first_per_model_version:
                return SamplingDecision(True, 1.0, NEW_MODEL_VERSION)
        rate = self.rate_for(attributes)
        return SamplingDecision(unit_hash(self.salt, conversation_id) < rate, rate, RATE)


def unit_hash(salt: str, conversation_id: str) -> float:
    """A number in [0, 1) that is a fixed, uniform-looking function of (salt, conversation id)."""
    digest = hashlib.sha256(f"{salt}\x00{conversation_id}".encode()).digest()
    return int.from_bytes(digest[:_HASH_BYTES], "big") / 2 ** (8 * _HASH_BYTES)


def _check_rate(rate: float, where: str) -> None:
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not (0.0 < rate <= 1.0) or math.isnan(rate):
        raise SamplingError(f"{where}: a sampling rate must be in (0, 1], got {rate!r}")


@dataclass(frozen=True)
class RateEstimate:
    """A Horvitz–Thompson estimate of a population mean and its standard error from sampling."""

    mean: float
    standard_error: float
    population: int
    sampled: int


def horvitz_thompson_mean(values: Sequence[float], inclusion_probabilities: Sequence[float], population: int) -> RateEstimate:
    """Ŷ and √V̂ of the module docstring, from the sampled values, their π and the counted population N."""
    if len(values) != len(inclusion_probabilities):
        raise SamplingError("values and inclusion_probabilities differ in length")
    if population < len(values) or population < 1:
        raise SamplingError(f"population {population} must be >= 1 and >= the {len(values)} sampled")
    total = 0.0
    variance = 0.0
    for y, pi in zip(values, inclusion_probabilities):
        _check_rate(pi, "inclusion probability")
        total += y / pi
        variance += (1.0 - pi) * y * y / (pi * pi)
    return RateEstimate(total / population, math.sqrt(variance) / population, population, len(values))


def hajek_sampling_variance(rate: float, weight: float, s0: float, s1: float, s2: float) -> float:
    """V̂ of the module docstring for the ratio ``rate`` = Σ y/π / ``weight``, from S0, S1, S2; 0 when all π = 1."""
    if weight <= 0:
        raise SamplingError(f"the weight Σ 1/π must be > 0, got {weight}")
    return max(s2 - 2 * rate * s1 + rate * rate * s0, 0.0) / (weight * weight)
