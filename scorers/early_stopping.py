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
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields

from scorers.conversation import Conversation
from scorers.judges.base import Judge, Judgement, Provenance
from scorers.questions import Question
from scorers.rubrics import ConfidenceWindows, Label, Polarity, Rubric, RubricSet

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


class EarlyStoppingScorer:
    """Scores conversations with a rubric set, asking only as many rubrics as the label needs.

    ``round_size``: rubrics per judge call (None = all in one call, i.e. no
    early stopping). ``always_ask``: questions asked in the first call whatever
    happens (the calibrator's). ``judge`` answers each round's questions; a
    judge that asks one question per call still benefits (fewer calls).
    """

    def __init__(
        self,
        rubric_set: RubricSet,
        judge: Judge,
        *,
        round_size: int | None = 5,
        always_ask: Sequence[Question] = (),
    ) -> None:
        if round_size is not None and round_size < 1:
            raise ValueError(f"round_size must be >= 1 or None, got {round_size}")
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
            judgement = self.judge.judge(conversation, [r.question() for r in batch] + list(extra))
            judgements.append(judgement)
            for rubric in batch:
                scores[rubric.id] = rubric.score(self.rubric_set.answer_for(judgement, rubric))
            asked += len(batch)
            low, high = netsat_range(sum(scores.values()), rubrics[asked:])
            if asked == len(rubrics) or decided(windows, low, high, len(rubrics)):
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
            label=windows.label(low),
            threshold_label=windows.binary_label(low),
            judgement=merge_judgements(judgements),
            rounds=len(judgements),
        )


def merge_judgements(judgements: Sequence[Judgement]) -> Judgement:
    """One judgement holding every round's answers; provenance counts summed (latency too)."""
    first = judgements[0]
    if len(judgements) == 1:
        return first
    answers = {qid: a for j in judgements for qid, a in j.answers.items()}
    provs = [j.provenance for j in judgements]
    counts = {f.name: sum(getattr(p, f.name) for p in provs) for f in fields(Provenance) if f.name not in ("judge", "model")}
    provenance = Provenance(judge=first.provenance.judge, model=first.provenance.model, **counts)
    return Judgement(conversation_id=first.conversation_id, answers=answers, provenance=provenance, extra=dict(first.extra))
