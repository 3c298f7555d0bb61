"""Ask a rubric set's questions in rounds and stop as soon as the label is decided.

RUBICON's labels depend only on where NetSAT falls against the threshold θ and
the two window edges. Every rubric's contribution to NetSAT is bounded by its
scale: a SAT rubric adds a rating in ``[min score, max score]``, a DSAT rubric
subtracts one. So after some rubrics are answered, the final NetSAT lies in

    [asked + Σ lowest contributions of the rest,  asked + Σ highest contributions of the rest]

and if the confident label (sat / dsat / uncertain) and the binary label are
the same at both ends of that interval, they are the same for *every* answer
the remaining rubrics could get: asking them cannot change either label. Both
labels are monotone in NetSAT (dsat ≤ d < uncertain < s ≤ sat; dsat < θ ≤ sat),
so equal labels at the two ends mean one label over the whole interval. The
ends are widened by a rounding margin so a float sum can never cross an edge
the exact sum does not.

`EarlyStoppingScorer` asks rubrics in the rubric set's order (learned sets are
written in greedy selection order: the rubric that separated the classes most
comes first), ``round_size`` per judge call, plus any ``always_ask`` questions
(e.g. the calibrator's) in the first call; rubrics that are also always-asked
questions are answered in that call and count from the start. Rubrics it did not ask have *no*
score (absent from ``rubric_scores``, NULL downstream), never 0; NetSAT is then
only known to lie in ``[netsat_lower, netsat_upper]``.

The approximate mode (``max_change_probability`` > 0, with `ScoreMoments`)
also stops when the labels are merely *likely* settled: it models the rubrics
not yet asked as jointly Gaussian with the answered ones (their mean and
covariance over n labelled conversations, from `rubrics fit`), predicts the
final NetSAT by the regression of the rest on the answered scores, with a
Student-t whose width includes the uncertainty of moments fitted on n
conversations, and stops once the probability that the
final NetSAT falls in another label's region is at most the setting. Its labels
are then not guaranteed; its agreement with asking all is measured by
``bench/early_stopping.py`` (docs/judge-cost.md).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from scorers.conversation import Conversation
from scorers.judges.base import Judge, Judgement, Provenance
from scorers.questions import Question
from scorers.rubrics import ConfidenceWindows, Label, Polarity, Rubric, RubricSet, RubricSetError

# Relative slack per rubric for float rounding of sums of ratings in [0, 10].
ROUNDING_MARGIN_PER_RUBRIC = 1e-9


def contribution_range(rubric: Rubric) -> tuple[float, float]:
    """The lowest and highest signed score ``rubric`` can add to NetSAT."""
    low, high = min(rubric.scale.scores), max(rubric.scale.scores)
    return (low, high) if rubric.polarity is Polarity.SAT else (-high, -low)


def netsat_range(asked_sum: float, remaining: Sequence[Rubric]) -> tuple[float, float]:
    """Where NetSAT can still end up, given the sum of the answered rubrics and the unanswered ones."""
    ranges = [contribution_range(r) for r in remaining]
    return asked_sum + sum(lo for lo, _ in ranges), asked_sum + sum(hi for _, hi in ranges)


def decided(windows: ConfidenceWindows, low: float, high: float, n_rubrics: int) -> bool:
    """Whether every NetSAT in ``[low, high]`` gets the same confident label and the same binary label."""
    margin = ROUNDING_MARGIN_PER_RUBRIC * max(n_rubrics, 1) * max(1.0, abs(low), abs(high))
    low, high = low - margin, high + margin
    return windows.label(low) == windows.label(high) and windows.binary_label(low) == windows.binary_label(high)


# Where `rubrics fit` records the moments in a rubric set's metadata.
MOMENTS_KEY = "score_moments"
# Ridge added to the covariance's diagonal, relative to its mean variance, so the conditional is well defined.
COVARIANCE_RIDGE = 1e-3


@dataclass(frozen=True)
class ScoreMoments:
    """Mean and covariance of a rubric set's signed rubric scores over ``n`` labelled conversations.

    The approximate mode's model of the rubrics not yet asked: the regression of their sum on the
    answered ones, with the prediction's uncertainty (`remaining_sum`). The moments are estimates
    from ``n`` conversations, so the prediction is Student-t, not the plug-in Gaussian, which is
    over-confident when ``n`` is not far above the number of answered rubrics.
    """

    rubric_ids: tuple[str, ...]
    mean: tuple[float, ...]
    covariance: tuple[tuple[float, ...], ...]
    n: int

    def __post_init__(self) -> None:
        k = len(self.rubric_ids)
        cov = np.asarray(self.covariance, dtype=float)
        if len(set(self.rubric_ids)) != k or len(self.mean) != k or cov.shape != (k, k):
            raise ValueError(f"score moments need one mean and a {k}x{k} covariance for {k} distinct rubric ids")
        if not (np.isfinite(self.mean).all() and np.isfinite(cov).all() and np.allclose(cov, cov.T)):
            raise ValueError("score moments must be finite and the covariance symmetric")
        if isinstance(self.n, bool) or not isinstance(self.n, int) or self.n < 2:
            raise ValueError(f"score moments need the number of conversations they were fitted on (>= 2), got {self.n!r}")

    @classmethod
    def fit(cls, rubric_ids: Sequence[str], scores: np.ndarray) -> ScoreMoments:
        """Moments of ``scores`` (conversations × rubrics, signed scores in ``rubric_ids`` order)."""
        scores = np.asarray(scores, dtype=float)
        if scores.ndim != 2 or scores.shape[1] != len(rubric_ids) or scores.shape[0] < 2:
            raise ValueError(f"need scores of at least 2 conversations × {len(rubric_ids)} rubrics, got {scores.shape}")
        cov = np.cov(scores, rowvar=False).reshape(len(rubric_ids), len(rubric_ids))
        cov += np.eye(len(rubric_ids)) * COVARIANCE_RIDGE * max(float(np.mean(np.diag(cov))), 1e-6)
        means = tuple(map(float, scores.mean(axis=0)))
        return cls(tuple(rubric_ids), means, tuple(tuple(map(float, row)) for row in cov), int(scores.shape[0]))

    def remaining_sum(self, answered: Mapping[str, float], remaining: Sequence[str]) -> tuple[float, float, int]:
        """Prediction of the sum of the ``remaining`` rubrics' scores given the ``answered`` ones: (mean, squared
        scale, degrees of freedom) of a Student-t.

        This is the prediction interval of the least-squares regression of the remaining sum on the answered
        scores over the ``n`` fitted conversations: conditional mean, residual variance on n − a − 1 degrees of
        freedom, widened by the uncertainty of the fitted coefficients. With a + 1 ≥ n the regression cannot
        be estimated: the scale is infinite (never stop on it).
        """
        index = {rid: i for i, rid in enumerate(self.rubric_ids)}
        a = [index[rid] for rid in answered]
        r = [index[rid] for rid in remaining]
        dof = self.n - len(a) - 1
        if dof < 1:
            return math.nan, math.inf, 0
        mean, cov = np.asarray(self.mean), np.asarray(self.covariance)
        ones = np.ones(len(r))
        m, v, leverage = ones @ mean[r], ones @ cov[np.ix_(r, r)] @ ones, 0.0
        if a:
            inverse = np.linalg.pinv(cov[np.ix_(a, a)])
            gain = ones @ cov[np.ix_(r, a)] @ inverse
            d = np.array([answered[rid] for rid in answered]) - mean[a]
            m += gain @ d
            v -= gain @ cov[np.ix_(a, r)] @ ones
            leverage = float(d @ inverse @ d) / (self.n - 1)
        residual = max(float(v), 0.0) * (self.n - 1) / dof
        return float(m), residual * (1 + 1 / self.n + leverage), dof

    def digest(self) -> str:
        """A short hash of the moments, for scorer versions."""
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()[:12]

    def to_dict(self) -> dict[str, Any]:
        return {
            "rubric_ids": list(self.rubric_ids),
            "mean": list(self.mean),
            "covariance": [list(r) for r in self.covariance],
            "n": self.n,
        }

    @classmethod
    def of_rubric_set(cls, rubric_set: RubricSet) -> ScoreMoments | None:
        """The moments recorded in ``rubric_set``'s metadata (None if absent); they must cover its rubrics."""
        doc = rubric_set.metadata.get(MOMENTS_KEY)
        if doc is None:
            return None
        try:
            rows = tuple(tuple(row) for row in doc["covariance"])
            moments = cls(tuple(doc["rubric_ids"]), tuple(doc["mean"]), rows, doc.get("n"))
        except (KeyError, TypeError, ValueError) as e:
            raise RubricSetError(
                f"metadata.{MOMENTS_KEY}",
                f"is not a mean and covariance of rubric scores with their number of conversations ({e}); "
                "moments written before the number was recorded must be refitted with `convowatch rubrics fit`",
            ) from None
        missing = sorted({r.id for r in rubric_set.rubrics} - set(moments.rubric_ids))
        if missing:
            raise RubricSetError(f"metadata.{MOMENTS_KEY}", f"has no moments for rubrics {missing}")
        return moments

    @classmethod
    def required_by(cls, rubric_set: RubricSet) -> ScoreMoments:
        """The moments approximate early stopping needs; `RubricSetError` saying how to get them if absent."""
        moments = cls.of_rubric_set(rubric_set)
        if moments is None:
            raise RubricSetError(
                f"metadata.{MOMENTS_KEY}",
                f"is missing in rubric set {rubric_set.version}, and approximate early stopping needs the rubric scores' "
                "moments: refit it with `convowatch rubrics fit`",
            )
        return moments


def change_probability(windows: ConfidenceWindows, mean: float, variance: float, dof: int | None = None) -> float:
    """P(a NetSAT with this centre and squared scale gets other labels than ``mean`` does): mass outside mean's
    region, under a Gaussian, or a Student-t with ``dof`` degrees of freedom."""
    if not math.isfinite(variance):
        return 1.0
    edges = sorted(e for e in (windows.threshold, windows.dsat_upper, windows.sat_lower) if e is not None)
    low = max((e for e in edges if e <= mean), default=-math.inf)
    high = min((e for e in edges if e > mean), default=math.inf)
    if variance <= 0:
        return 0.0 if low < mean else 1.0
    sd = math.sqrt(variance)
    if dof is None:
        cdf = _normal_cdf
    else:
        from scipy import stats  # imported here: ~1 s to import, and the service's default (dof None) never needs it

        cdf = stats.t(dof).cdf
    inside = float(cdf((high - mean) / sd) - cdf((low - mean) / sd))
    return max(0.0, 1.0 - inside)


def _normal_cdf(z: float) -> float:
    return 0.5 * math.erfc(-z / math.sqrt(2))


@dataclass(frozen=True)
class EarlyStoppedScore:
    """A conversation scored with early stopping.

    ``rubric_scores`` holds the asked rubrics only; ``unasked`` the others, in
    ask order. ``netsat`` is the exact NetSAT when nothing was skipped, else
    None; ``netsat_lower``/``netsat_upper`` bound it either way (equal when complete).
    """

    rubric_set_version: str
    rubric_scores: Mapping[str, float]
    unasked: tuple[str, ...]
    netsat: float | None
    netsat_lower: float
    netsat_upper: float
    label: Label
    threshold_label: Label
    judgement: Judgement
    rounds: int
    predicted_netsat: float  # carries the labels: exact when complete, mid-bounds when decided, predicted if approximate
    change_probability: float = 0.0  # approximate mode: P(asking the rest would change a label); 0 when decided


class EarlyStoppingScorer:
    """Scores conversations with a rubric set, asking only as many rubrics as the label needs.

    ``round_size``: rubrics per judge call (None = all in one call, i.e. no
    early stopping). ``always_ask``: questions asked in the first call whatever
    happens (the calibrator's). ``judge`` answers each round's questions; a
    judge that asks one question per call still benefits (fewer calls).
    ``max_change_probability`` > 0 turns on the approximate mode, which needs ``moments``.
    """

    def __init__(
        self,
        rubric_set: RubricSet,
        judge: Judge,
        *,
        round_size: int | None = 5,
        always_ask: Sequence[Question] = (),
        max_change_probability: float = 0.0,
        moments: ScoreMoments | None = None,
    ) -> None:
        if round_size is not None and round_size < 1:
            raise ValueError(f"round_size must be >= 1 or None, got {round_size}")
        if not 0 <= max_change_probability < 1:
            raise ValueError(f"max_change_probability must be in [0, 1), got {max_change_probability}")
        if max_change_probability > 0 and moments is None:
            raise ValueError("the approximate mode (max_change_probability > 0) needs the rubric scores' moments")
        self.max_change_probability = max_change_probability
        self.moments = moments
        always = {q.id for q in always_ask}
        # Rubrics that are also always-asked questions are answered in the first round anyway: they go first.
        self.ask_order = tuple(r for r in rubric_set.rubrics if r.id in always) + tuple(
            r for r in rubric_set.rubrics if r.id not in always
        )
        self._answered_first = sum(1 for r in rubric_set.rubrics if r.id in always)
        rubric_ids = {r.id for r in rubric_set.rubrics}
        self.always_ask = tuple(q for q in always_ask if q.id not in rubric_ids)
        self.rubric_set = rubric_set
        self.judge = judge
        self.round_size = round_size or len(rubric_set.rubrics)
        self._questions = {r.id: r.question() for r in rubric_set.rubrics}  # made once, not per conversation

    def score(self, conversation: Conversation) -> EarlyStoppedScore:
        """Ask rounds of rubrics until the label is decided or every rubric is answered."""
        rubrics = self.ask_order
        windows = self.rubric_set.windows
        judgements: list[Judgement] = []
        scores: dict[str, float] = {}
        asked = 0
        while True:
            first = not judgements
            end = asked + self.round_size + (self._answered_first if first else 0)
            batch = rubrics[asked:end]
            extra = self.always_ask if first else ()
            judgement = self.judge.judge(conversation, [self._questions[r.id] for r in batch] + list(extra))
            judgements.append(judgement)
            for rubric in batch:
                scores[rubric.id] = rubric.score(self.rubric_set.answer_for(judgement, rubric))
            asked += len(batch)
            low, high = netsat_range(sum(scores.values()), rubrics[asked:])
            if asked == len(rubrics) or decided(windows, low, high, len(rubrics)):
                predicted, p_change = (low + high) / 2, 0.0
                break
            if self.max_change_probability > 0 and self.moments is not None:
                mean, variance, dof = self.moments.remaining_sum(scores, [r.id for r in rubrics[asked:]])
                if dof < 1:  # more rubrics answered than the moments can regress on: ask on
                    continue
                predicted = min(max(sum(scores.values()) + mean, low), high)
                p_change = change_probability(windows, predicted, variance, dof)
                if p_change <= self.max_change_probability:
                    break
        complete = asked == len(rubrics)
        netsat = float(sum(scores[r.id] for r in self.rubric_set.rubrics)) if complete else None
        return EarlyStoppedScore(
            rubric_set_version=self.rubric_set.version,
            rubric_scores=scores,
            unasked=tuple(r.id for r in rubrics[asked:]),
            netsat=netsat,
            netsat_lower=netsat if netsat is not None else low,
            netsat_upper=netsat if netsat is not None else high,
            label=windows.label(predicted),
            threshold_label=windows.binary_label(predicted),
            judgement=merge_judgements(judgements),
            rounds=len(judgements),
            predicted_netsat=predicted,
            change_probability=p_change,
        )


def merge_judgements(judgements: Sequence[Judgement]) -> Judgement:
    """One judgement holding every round's answers; provenance counts summed (latency too)."""
    first = judgements[0]
    if len(judgements) == 1:
        return first
    answers = {qid: a for j in judgements for qid, a in j.answers.items()}
    provenance = Provenance.total([j.provenance for j in judgements])
    return Judgement(conversation_id=first.conversation_id, answers=answers, provenance=provenance, extra=dict(first.extra))
