"""Scoring closed conversations: judge → rubric set → calibrator (→ behaviours) → `ScoreRecord`.

`ConversationScorer.score` never raises for a conversation: transient judge
failures are retried with capped exponential backoff (full jitter) up to
``max_attempts``; what still cannot be scored becomes an *unscored* record with
the reason, so nothing is dropped. Before any of that, the sampling policy
(``scoring.sampling``, stream/sampling.py) decides whether to judge it at all:
an unsampled conversation becomes an *unsampled* record (stored and counted,
not judged). Every record carries its inclusion probability π and the reason.
With a behaviour set (``scoring.behaviours``, scorers/behaviours.py) the judge
also answers its yes/no questions about every assistant turn; what they cost is
counted with the rest of the conversation's judge cost.

With ``redaction.kinds`` the judge reads the conversation with personal data
replaced by placeholders (scorers/redaction.py); the record keeps the text as
it came unless ``redaction.stored``. A scorer of a registered version
(``name``, stream/rollout.py) may also score as a *shadow* (`score_shadow`).

A judge budget (``scoring.budget``, stream/budget.py) makes each attempt wait
while it is spent. The one exception `score` lets out is
`BudgetWaitInterrupted`: a rebalance called the wait off, the conversation was
not judged, and the caller puts it back in the closed topic.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import random
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from scorers.behaviours import BehaviourScorer, BehaviourSet, ConversationBehaviours, shows
from scorers.calibrators import CalibrationError, Calibrator, Prediction
from scorers.conversation import Conversation
from scorers.early_stopping import EarlyStoppedScore, EarlyStoppingScorer, ScoreMoments
from scorers.injection import InjectionDetector
from scorers.judges.base import Judge, JudgeError, JudgeReplyError, Provenance, answers_in_memory, error_excerpt
from scorers.questions import Question, load_questions
from scorers.rubrics import RubricSet, RubricSetError
from stream.budget import BudgetGate, Cost, transcript_chars
from stream.cost import judge_cost
from stream.feedback_labels import FeedbackLabelRules
from stream.metrics import JUDGED, UNSAMPLED, ServiceMetrics
from stream.records import SHADOW, BehaviourHit, ClosedConversation, DimensionPrediction, RubricHit, ScoreRecord
from stream.sampling import SamplingDecision, SamplingPolicy, unit_hash
from stream.settings import PriceSettings, RedactionSettings, ScoringSettings, SettingsError

log = logging.getLogger(__name__)

NO_CALIBRATOR = "none"
BEHAVIOUR_SALT = "behaviours"  # its own salt: which conversations get behaviours does not follow which are judged
FEEDBACK_RULES = FeedbackLabelRules(on_conflict="exclude")  # the metric keeps conflicts apart; PromQL leaves them out
NOT_CALIBRATED: dict[str, Any] = {  # a record's calibrated fields without a calibrator
    "main_question_id": "",
    "main_probabilities": (),
    "main_expected_value": None,
    "dissatisfaction_probability": None,
    "dimensions": (),
}
MAX_UNSCORED_REASON_CHARS = 1000  # of an unscored record's reason (stored in ClickHouse, on the scores topic, logged)
DEADLINE_PASSED = "DeadlinePassed"  # the reason (and judge-error type) of a conversation past scoring.deadline_s


def unscored_reason(reason: str) -> str:
    """An unscored record's reason: control characters dropped, at most `MAX_UNSCORED_REASON_CHARS` characters."""
    return error_excerpt(reason, MAX_UNSCORED_REASON_CHARS)


def judge_identity(judge: Judge) -> str:
    """``name:model`` for judges that report a model, else the name; ``+reuse=none`` (or ``within_conversation``)
    when the judge limits server prompt reuse, so every stored score says which mode produced it."""
    model = getattr(judge, "model", None)
    reuse = getattr(judge, "prompt_reuse", "any")
    return (f"{judge.name}:{model}" if model else judge.name) + (f"+reuse={reuse}" if reuse != "any" else "")


def scoring_questions(rubric_set: RubricSet, calibrator: Calibrator | None, questions_file: Path | None) -> tuple[Question, ...]:
    """The questions to ask: the rubric set's, then the calibrator's others (texts from ``questions_file``)."""
    asked = {q.id: q for q in rubric_set.questions()}
    if calibrator is None:
        return tuple(asked.values())
    needed = [q for q in calibrator.question_ids_ if q not in asked]
    if needed:
        if questions_file is None:
            raise SettingsError(
                f"the calibrator needs questions {needed}; set scoring.questions to the questions file that defines them"
            )
        by_id = load_questions(questions_file)
        unknown = [q for q in needed if q not in by_id]
        if unknown:
            raise SettingsError(f"{questions_file} does not define {unknown}, which the calibrator needs")
        for qid in needed:
            asked[qid] = by_id[qid]
    return tuple(asked.values())


@dataclass(frozen=True)
class Judged:
    """What the judge answered about one conversation, before the calibrator: its rubric score (and answers), its
    behaviours, what it cost, and the attempt it took."""

    rubric_score: EarlyStoppedScore
    behaviours: tuple[BehaviourHit, ...]
    provenance: Provenance
    attempts: int


def _approximate_stopping_moments(rubric_set: RubricSet, settings: ScoringSettings) -> ScoreMoments | None:
    """The score moments approximate early stopping needs, when it is on; `SettingsError` if it cannot work."""
    if settings.max_label_change_probability == 0:
        return None
    if settings.rubrics_per_round is None:
        raise SettingsError("scoring.max_label_change_probability needs scoring.rubrics_per_round (early stopping in rounds)")
    try:
        return ScoreMoments.required_by(rubric_set)
    except RubricSetError as e:
        raise SettingsError(f"scoring.max_label_change_probability: {e}") from None


class ConversationScorer:
    """Scores `ClosedConversation`s with one judge, rubric set, (optional) calibrator and (optional) behaviour set."""

    def __init__(
        self,
        judge: Judge,
        rubric_set: RubricSet,
        calibrator: Calibrator | None,
        settings: ScoringSettings,
        metrics: ServiceMetrics,
        questions: Sequence[Question] | None = None,
        rng: random.Random | None = None,
        price: PriceSettings | None = None,
        behaviour_set: BehaviourSet | None = None,
        name: str = "",
        redaction: RedactionSettings | None = None,
        behaviour_judge: Judge | None = None,
    ) -> None:
        self.name = name  # the registry's name of this version ('' when configured by file)
        self.judge = judge
        # Who answers the behaviour questions (``scoring.behaviour_judge``); its cost stays out of the scores' judge cost.
        self.behaviour_judge = behaviour_judge if behaviour_judge is not None else judge
        self.rubric_set = rubric_set
        self._polarity = {r.id: r.polarity.value for r in rubric_set.rubrics}
        self.calibrator = calibrator
        self.settings = settings
        self.metrics = metrics
        self.questions = (
            tuple(questions) if questions is not None else scoring_questions(rubric_set, calibrator, settings.questions)
        )
        unknown = [j for j in settings.trusted_judges if calibrator is None or j not in calibrator.judges_]
        if unknown:
            known = list(calibrator.judges_) if calibrator is not None else []
            raise SettingsError(f"scoring.trusted_judges {unknown} are not judges the calibrator was trained with: {known}")
        self.judge_name = judge_identity(judge)
        self.calibrator_version = calibrator.version_ if calibrator is not None else NO_CALIBRATOR
        versions = f"{self.judge_name}|{rubric_set.version}|{self.calibrator_version}"
        moments = _approximate_stopping_moments(rubric_set, settings)
        if moments is not None:  # approximate labels depend on the moments and the setting too
            versions += f"|approximate:{settings.max_label_change_probability}:{moments.digest()}"
        if behaviour_set is not None:
            versions += f"|behaviours:{behaviour_set.version}"
            if self.behaviour_judge is not judge:
                versions += f"|behaviour_judge:{judge_identity(self.behaviour_judge)}"
        if settings.injection_policy != "flag":  # it changes labels
            versions += f"|injection:{settings.injection_policy}"
        self.scorer_version = hashlib.sha256(versions.encode("utf-8")).hexdigest()[:12]
        # The calibrator reads all its questions, so they are asked whatever early stopping decides.
        rubric_ids = {r.id for r in rubric_set.rubrics}
        calibrator_ids = set(calibrator.question_ids_) if calibrator is not None else set()
        self._rubric_scorer = EarlyStoppingScorer(
            rubric_set,
            judge,
            round_size=settings.rubrics_per_round,
            always_ask=[q for q in self.questions if q.id in calibrator_ids or q.id not in rubric_ids],
            max_change_probability=settings.max_label_change_probability,
            moments=moments,
        )
        self.behaviour_set = behaviour_set
        self.behaviour_set_version = ""
        self._behaviour_scorer: BehaviourScorer | None = None
        if behaviour_set is not None:
            self.behaviour_set_version = behaviour_set.version
            self._behaviour_scorer = BehaviourScorer(behaviour_set)
            for behaviour in behaviour_set.behaviours:
                metrics.behaviour_error.labels(behaviour.id).set(int(behaviour.error))
        self._rng = rng or random.Random()
        self.price = price
        self.budget = BudgetGate.from_settings(settings.budget, metrics)  # None: no limit set
        self.sampling = SamplingPolicy.from_settings(settings.sampling)
        self.redaction = redaction or RedactionSettings()
        self._redactor = self.redaction.redactor()
        self._injection = InjectionDetector()
        # Every judge `score_once` may ask answers from memory: it is called on the event loop (`_call`).
        self._in_memory = answers_in_memory(judge) and (behaviour_set is None or answers_in_memory(self.behaviour_judge))

    def for_version(self, rubric_set: RubricSet, calibrator: Calibrator | None, name: str) -> ConversationScorer:
        """A scorer of another version (stream/rollout.py): this one's judge, settings and behaviour set, and the same
        judge budget and sampling state (one budget per worker, one first-N count per model version)."""
        other = ConversationScorer(
            self.judge,
            rubric_set,
            calibrator,
            self.settings,
            self.metrics,
            rng=self._rng,
            price=self.price,
            behaviour_set=self.behaviour_set,
            name=name,
            redaction=self.redaction,
            behaviour_judge=self.behaviour_judge,
        )
        other.budget, other.sampling = self.budget, self.sampling
        return other

    # -- one attempt ----------------------------------------------------------

    def _judge_rubrics(self, conversation: Conversation) -> EarlyStoppedScore:
        """Ask the judge (in rounds when early stopping is on) and count the cost in the metrics."""
        scored = self._rubric_scorer.score(conversation)
        self._count_judge_cost(scored.judgement.provenance)
        self.metrics.rubric_questions.labels("asked").inc(len(scored.rubric_scores))
        self.metrics.rubric_questions.labels("skipped").inc(len(scored.unasked))
        return scored

    def judges_behaviours_of(self, conversation_id: str) -> bool:
        """Whether this conversation's assistant turns are judged for behaviours (``scoring.behaviour_rate``)."""
        rate = self.settings.behaviour_rate
        return self._behaviour_scorer is not None and (rate >= 1.0 or unit_hash(BEHAVIOUR_SALT, conversation_id) < rate)

    def _judge_behaviours(self, scorer: BehaviourScorer, conversation: Conversation) -> ConversationBehaviours:
        """Ask the behaviour set's questions about every assistant turn and count the cost in the metrics."""
        behaviours = scorer.score(self.behaviour_judge, conversation)
        if self.behaviour_judge is self.judge:
            self._count_judge_cost(behaviours.provenance)
        else:
            self._count_judge_cost(behaviours.provenance, judge_identity(self.behaviour_judge), priced=False)
        return behaviours

    def _count_judge_cost(self, p: Provenance, judge_name: str | None = None, priced: bool = True) -> None:
        judge_name = judge_name or self.judge_name
        self.metrics.judge_calls.labels(judge_name).inc(p.calls)
        self.metrics.judge_tokens.labels(judge_name, "prompt").inc(p.prompt_tokens)
        self.metrics.judge_tokens.labels(judge_name, "completion").inc(p.completion_tokens)
        self.metrics.judge_tokens.labels(judge_name, "cached_prompt").inc(p.cached_prompt_tokens)
        if self.price is not None and priced:
            cost = judge_cost(self.price, p.prompt_tokens, p.cached_prompt_tokens, p.completion_tokens)
            self.metrics.judge_cost.labels(self.judge_name, self.price.currency).inc(cost)

    def score_once(self, closed: ClosedConversation, attempts: int = 1, with_behaviours: bool = True) -> ScoreRecord:
        """Judge and score one conversation (its behaviours too, unless ``with_behaviours`` is False); raises
        `JudgeError`/`CalibrationError` on failure."""
        return self._records_of([closed], [self.judge_once(closed, attempts, with_behaviours)], isolate=False)[0]

    def judge_once(self, closed: ClosedConversation, attempts: int = 1, with_behaviours: bool = True) -> Judged:
        """Ask the judge about one conversation (its behaviours too, unless ``with_behaviours`` is False) and count
        what it cost; raises `JudgeError` on failure. The calibrator comes after (`_records_of`)."""
        started = time.perf_counter()
        conversation = closed.to_conversation()
        judged: ConversationBehaviours | None = None
        asking = self.judge_name
        try:
            rubric_score = self._judge_rubrics(conversation)
            if with_behaviours and self._behaviour_scorer is not None and self.judges_behaviours_of(closed.conversation_id):
                asking = judge_identity(self.behaviour_judge)
                judged = self._judge_behaviours(self._behaviour_scorer, conversation)
        except JudgeError as e:
            self.metrics.judge_errors.labels(asking, type(e).__name__).inc()
            raise
        except Exception as e:  # the last line: a judge (or what reads its answers) that raised something else
            self.metrics.judge_errors.labels(asking, JudgeReplyError.__name__).inc()
            raise JudgeReplyError(
                f"judge {asking!r}'s answers could not be read ({type(e).__name__}: {error_excerpt(str(e))})"
            ) from None  # not chained: the exception's text may hold a reply, and a logged traceback prints it
        p = rubric_score.judgement.provenance
        behaviours: tuple[BehaviourHit, ...] = ()
        if judged is not None:
            if self.behaviour_judge is self.judge:  # the scores' judge cost is that of the configured judge only
                p = Provenance.total([p, judged.provenance])
            behaviours = tuple(
                BehaviourHit(turn.turn_index, behaviour, probability, shows(probability))
                for turn in judged.turns
                for behaviour, probability in turn.probabilities.items()
            )
        # One observation per conversation, its rubric and behaviour calls together.
        self.metrics.judge_latency.labels(self.judge_name).observe(p.latency_s or time.perf_counter() - started)
        return Judged(rubric_score, behaviours, p, attempts)

    def _records_of(
        self, conversations: Sequence[ClosedConversation], judged: Sequence[Judged], isolate: bool = True
    ) -> list[ScoreRecord]:
        """The scored records of judged ``conversations``, the calibrator's predictions for all of them made at once.
        With ``isolate``, a conversation whose prediction or record fails is unscored with the reason (if the joint
        prediction fails, each is predicted alone to find which); without, the error is raised."""
        calibrated = [NOT_CALIBRATED] * len(judged)
        if self.calibrator is not None:
            judgements = [j.rubric_score.judgement for j in judged]
            try:
                predictions = self.calibrator.predict_judgements(judgements, judges=self.settings.trusted_judges or None)
                calibrated = self._calibrated_fields(predictions, self.calibrator.main_question)
            except (CalibrationError, ValueError) as e:  # ValueError: a prediction the record refuses (NaN, ...)
                if not isolate:
                    raise
                if len(judged) > 1:
                    return [r for c, j in zip(conversations, judged) for r in self._records_of([c], [j])]
                return [self.unscored(conversations[0], f"{type(e).__name__}: {e}", judged[0].attempts)]
        records = []
        for closed, one, fields in zip(conversations, judged, calibrated):
            try:
                records.append(self._scored(closed, one, fields))
            except ValueError as e:  # a record checks its values when built (stream/records.py)
                if not isolate:
                    raise
                records.append(self.unscored(closed, f"{type(e).__name__}: {e}", one.attempts))
        return records

    def _calibrated_fields(self, predictions: dict[str, Prediction], main_id: str) -> list[dict[str, Any]]:
        """Each row's calibrated fields of a score record (``main_id`` the main question), as Python numbers converted
        once for all rows (numpy's per-call cost, not the arithmetic, is most of a row's)."""
        columns = {q: (p.probabilities.tolist(), p.expected_value.tolist()) for q, p in predictions.items()}
        main_probabilities, main_expected = columns[main_id]
        p_dsat = predictions[main_id].prob_at_most(self.settings.dissatisfied_max_value).tolist()
        return [
            {
                "main_question_id": main_id,
                "main_probabilities": tuple(main_probabilities[row]),
                "main_expected_value": main_expected[row],
                "dissatisfaction_probability": p_dsat[row],
                "dimensions": tuple(DimensionPrediction(q, tuple(probs[row]), ev[row]) for q, (probs, ev) in columns.items()),
            }
            for row in range(len(p_dsat))
        ]

    def _scored(self, closed: ClosedConversation, judged: Judged, calibrated: dict[str, Any]) -> ScoreRecord:
        """The scored record of ``closed`` from its judge's answers and its ``calibrated`` fields."""
        rubric_score, p = judged.rubric_score, judged.provenance
        return self._record(
            closed,
            "scored",
            judged.attempts,
            netsat=rubric_score.netsat,
            netsat_lower=rubric_score.netsat_lower,
            netsat_upper=rubric_score.netsat_upper,
            rubrics_unasked=rubric_score.unasked,
            label=rubric_score.label,
            threshold_label=rubric_score.threshold_label,
            **calibrated,
            rubrics=tuple(RubricHit(rid, self._polarity[rid], float(s)) for rid, s in rubric_score.rubric_scores.items()),
            behaviours=judged.behaviours,
            judge_calls=p.calls,
            judge_prompt_tokens=p.prompt_tokens,
            judge_completion_tokens=p.completion_tokens,
            judge_cached_prompt_tokens=p.cached_prompt_tokens,
            judge_latency_s=p.latency_s,
            extra={"label_change_probability": rubric_score.change_probability} if rubric_score.change_probability else {},
        )

    def unscored(self, closed: ClosedConversation, reason: str, attempts: int) -> ScoreRecord:
        """The record of a conversation that could not be scored: ``reason`` without control characters, cut to
        `MAX_UNSCORED_REASON_CHARS` (it is stored and logged)."""
        return self._record(closed, "unscored", attempts, unscored_reason=unscored_reason(reason))

    def unsampled(self, closed: ClosedConversation, decision: SamplingDecision) -> ScoreRecord:
        """The record of a conversation sampling left out: counted and stored, never judged."""
        return self._record(
            closed, "unsampled", 0, inclusion_probability=decision.inclusion_probability, sampling_reason=decision.reason
        )

    def _record(self, closed: ClosedConversation, status: str, attempts: int, **outcome: Any) -> ScoreRecord:
        """A record stamped with this scorer's versions, the time and the injection attempts in users' turns; with
        ``scoring.injection_policy`` abstain, a scored conversation holding one is labelled uncertain."""
        signals = self._injection.conversation_signals((t.role, t.text) for t in closed.turns)
        if signals and status == "scored" and self.settings.injection_policy == "abstain" and outcome["label"] != "uncertain":
            outcome["extra"] = {**outcome.get("extra", {}), "label_before_injection_policy": outcome["label"]}
            outcome["label"] = "uncertain"
        return ScoreRecord(
            conversation=closed,
            status=status,  # type: ignore[arg-type]
            scorer_version=self.scorer_version,
            scorer_name=self.name,
            judge=self.judge_name,
            rubric_set_version=self.rubric_set.version,
            calibrator_version=self.calibrator_version,
            behaviour_set_version=self.behaviour_set_version,
            scored_at=time.time(),
            attempts=attempts,
            injection_signals=signals,
            **outcome,
        )

    # -- with retries -------------------------------------------------------

    def _backoff(self, attempt: int) -> float:
        cap = min(self.settings.retry_max_s, self.settings.retry_initial_s * 2 ** (attempt - 1))
        return self._rng.uniform(0, cap)

    async def _attempt(
        self, loop: asyncio.AbstractEventLoop, closed: ClosedConversation, attempt: int, with_behaviours: bool
    ) -> Judged:
        """`judge_once` (`_call`), within the judge budget when one is set: waits while it is spent (raises
        `BudgetWaitInterrupted` if the wait is called off), then settles with the calls and tokens the judge reported."""
        if self.budget is None:
            return await self._call(loop, closed, attempt, with_behaviours)
        reservation = await self.budget.acquire(transcript_chars(closed))
        judged: Judged | None = None
        try:
            judged = await self._call(loop, closed, attempt, with_behaviours)
            return judged
        finally:
            p = None if judged is None else judged.provenance
            self.budget.settle(reservation, None if p is None else Cost(p.calls, p.prompt_tokens + p.completion_tokens))

    async def _call(
        self, loop: asyncio.AbstractEventLoop, closed: ClosedConversation, attempt: int, with_behaviours: bool
    ) -> Judged:
        """`judge_once` in a thread, so a judge that waits (a network, a model) does not stop the worker; on the event
        loop when every judge it asks answers from memory (`answers_in_memory`): the thread's hand-offs cost more CPU
        than such a judge's answer (docs/benchmarks.md, "The worker's scoring CPU")."""
        if not self._in_memory:
            return await loop.run_in_executor(None, self.judge_once, closed, attempt, with_behaviours)
        judged = self.judge_once(closed, attempt, with_behaviours)
        await asyncio.sleep(0)  # let the other stage and the timers run between conversations, as a thread's await does
        return judged

    @property
    def scores_at_once(self) -> bool:
        """True when `score_many` is the cheaper way to score many conversations: every judge answers from memory and
        no judge budget can make a conversation wait, so nothing is gained by scoring them concurrently."""
        return self._in_memory and self.budget is None

    async def score(self, closed: ClosedConversation) -> ScoreRecord:
        """Score with retries (`_call`) if sampling picks it; always returns a record."""
        return (await self.score_many([closed]))[0]

    async def score_many(self, conversations: Sequence[ClosedConversation]) -> list[ScoreRecord]:
        """`score` for each of ``conversations`` in turn, the calibrator called once for all those judged (one call
        costs about as much as a row: docs/benchmarks.md, "The worker's scoring CPU"); a record for each, in order."""
        records: list[ScoreRecord | None] = [None] * len(conversations)
        sampled: list[tuple[int, ClosedConversation, dict[str, Any]]] = []
        for i, closed in enumerate(conversations):
            decision = self.sampling.decide(
                closed.conversation_id, closed.attributes, closed.negative_feedback, rated=bool(closed.feedback_ratings)
            )
            if decision.scored:
                fields = {"inclusion_probability": decision.inclusion_probability, "sampling_reason": decision.reason}
                sampled.append((i, closed, fields))
            else:
                records[i] = self.unsampled(self._redacted(closed) if self.redaction.stored else closed, decision)
        judged = await self._judged_many([(closed, fields) for _, closed, fields in sampled])
        for (i, _, _), record in zip(sampled, judged):
            records[i] = record
        done = [r for r in records if r is not None]
        for record in done:
            self.observe(record)
        return done

    async def score_shadow(self, closed: ClosedConversation, active: ScoreRecord) -> ScoreRecord:
        """Score a conversation the active scorer judged (``active``), as this shadow version: the same retries and
        budget, the active record's π and sampling reason, role ``shadow``; counted in the shadow metric only, so the
        rates and alerts stay the active version's. Behaviours are not asked again: they depend on the behaviour set
        and its judge, which every version shares, not on the rubric set or calibrator a shadow compares."""
        record = await self._judged(
            closed,
            with_behaviours=False,
            role=SHADOW,
            inclusion_probability=active.inclusion_probability,
            sampling_reason=active.sampling_reason,
        )
        self.metrics.shadow_conversations.labels(self.name, self.scorer_version, record.label or record.status).inc()
        return record

    def _redacted(self, closed: ClosedConversation) -> ClosedConversation:
        """``closed`` with the personal data of ``redaction.kinds`` replaced in every turn (counted by kind)."""
        if self._redactor is None:
            return closed
        turns, counts = self._redactor.redact_turns(closed.turns)
        for kind, n in counts.items():
            self.metrics.redactions.labels(kind).inc(n)
        return replace(closed, turns=turns)

    async def _judged(self, closed: ClosedConversation, with_behaviours: bool = True, **fields: Any) -> ScoreRecord:
        """`_judged_many` of one conversation."""
        return (await self._judged_many([(closed, fields)], with_behaviours))[0]

    async def _judged_many(
        self, conversations: Sequence[tuple[ClosedConversation, dict[str, Any]]], with_behaviours: bool = True
    ) -> list[ScoreRecord]:
        """Judge each conversation (the redacted text, with ``redaction.kinds``) in turn with retries, then calibrate
        all those the judge answered at once: a scored record, or an unscored one with the reason, for each, with its
        ``fields`` set (`_with_fields`)."""
        records: list[ScoreRecord | None] = [None] * len(conversations)
        judged: list[tuple[int, ClosedConversation, Judged, float]] = []
        for i, (closed, fields) in enumerate(conversations):
            started = time.perf_counter()
            redacted = self._redacted(closed)
            outcome = await self._judge_with_retries(redacted, with_behaviours)
            if isinstance(outcome, ScoreRecord):
                records[i] = self._with_fields(closed, outcome, fields)
                self.metrics.scoring_latency.observe(time.perf_counter() - started)
            else:
                judged.append((i, redacted, outcome, time.perf_counter() - started))
        if judged:
            started = time.perf_counter()
            scored = self._records_of([c for _, c, _, _ in judged], [j for _, _, j, _ in judged])
            share = (time.perf_counter() - started) / len(judged)  # each conversation's part of the one call
            for (i, _, _, took_s), record in zip(judged, scored):
                closed, fields = conversations[i]
                records[i] = self._with_fields(closed, record, fields)
                self.metrics.scoring_latency.observe(took_s + share)
        return [r for r in records if r is not None]

    def _with_fields(self, closed: ClosedConversation, record: ScoreRecord, fields: dict[str, Any]) -> ScoreRecord:
        """``record`` with ``fields`` set; it carries the redacted conversation with ``redaction.stored``, else ``closed``
        as it came. (One `replace` for all: each checks the whole record again.)"""
        if not self.redaction.stored and record.conversation is not closed:
            fields = {**fields, "conversation": closed}
        return replace(record, **fields) if fields else record

    async def _judge_with_retries(self, closed: ClosedConversation, with_behaviours: bool) -> Judged | ScoreRecord:
        """The judge's answers about ``closed``, retrying transient judge errors with backoff; or, when the judge cannot
        answer or ``scoring.deadline_s`` passes (across every attempt and backoff), its unscored record with the reason.
        A judge call the deadline gives up on is not waited for; its thread ends when the judge's own timeout does."""
        loop = asyncio.get_running_loop()
        deadline_s = self.settings.deadline_s
        deadline = time.monotonic() + deadline_s
        attempt = 0
        while True:
            attempt += 1
            try:
                return await asyncio.wait_for(
                    self._attempt(loop, closed, attempt, with_behaviours), max(0.0, deadline - time.monotonic())
                )
            except TimeoutError:
                self.metrics.judge_errors.labels(self.judge_name, DEADLINE_PASSED).inc()
                log.warning("scoring %s: deadline of %gs passed (attempt %d)", closed.conversation_id, deadline_s, attempt)
                return self.unscored(closed, f"{DEADLINE_PASSED}: not scored within scoring.deadline_s={deadline_s:g}s", attempt)
            except JudgeError as e:
                if e.transient and attempt < self.settings.max_attempts:
                    delay = min(self._backoff(attempt), max(0.0, deadline - time.monotonic()))
                    self.metrics.scoring_attempts.labels(type(e).__name__).inc()
                    log.warning(
                        "scoring %s failed (attempt %d/%d, retry in %.1fs): %s",
                        closed.conversation_id,
                        attempt,
                        self.settings.max_attempts,
                        delay,
                        e,
                    )
                    await asyncio.sleep(delay)
                    continue
                return self.unscored(closed, f"{type(e).__name__}: {e}", attempt)
            except (CalibrationError, ValueError) as e:
                return self.unscored(closed, f"{type(e).__name__}: {e}", attempt)

    def observe(self, record: ScoreRecord) -> None:
        """Count a finished record in the scoring metrics (the weighted ones with w = 1/π; docs/sampling.md)."""
        m = self.metrics
        attrs = m.attribute_values(record.conversation.attributes)
        decision = UNSAMPLED if record.status == "unsampled" else JUDGED
        m.conversations_sampled.labels(decision, record.sampling_reason, *attrs).inc()
        for kind in record.injection_signals:
            m.injection_suspected.labels(kind, *attrs).inc()
        if record.status == "unsampled":
            return
        if record.status == "unscored":
            reason = record.unscored_reason.split(":", 1)[0]
            self.metrics.conversations_unscored.labels(reason, *attrs).inc()
            return
        self.metrics.conversations_scored.labels(record.label, *attrs).inc()
        if record.conversation.feedback_ratings:
            feedback = FEEDBACK_RULES.label(record.conversation.feedback_ratings)
            m.user_feedback_conversations.labels(record.scorer_version, record.label, feedback, *attrs).inc()
        pi = record.inclusion_probability
        weight, sampling_variance = 1.0 / pi, (1.0 - pi) / (pi * pi)
        # Always incremented (by 0 when π = 1), so every rate's variance series exists wherever the rate does.
        m.scored_weight.labels(record.label, *attrs).inc(weight)
        m.scored_sampling_variance.labels(record.label, *attrs).inc(sampling_variance)
        if record.netsat is not None:  # None when early stopping left rubrics unasked: its range is stored instead
            self.metrics.netsat.labels(*attrs).observe(record.netsat)
        if record.dissatisfaction_probability is not None:
            self.metrics.calibrated_conversations.labels(*attrs).inc()
            self.metrics.calibrated_dissatisfaction.labels(*attrs).inc(record.dissatisfaction_probability)
            self.metrics.calibrated_dissatisfaction_squared.labels(*attrs).inc(record.dissatisfaction_probability**2)
            p = record.dissatisfaction_probability
            m.calibrated_weight.labels(*attrs).inc(weight)
            m.calibrated_dissatisfaction_weighted.labels(*attrs).inc(weight * p)
            m.calibrated_dissatisfaction_squared_weighted.labels(*attrs).inc(weight * p * p)
            m.calibrated_sampling_variance.labels(*attrs).inc(sampling_variance)
            m.calibrated_dissatisfaction_sampling_variance.labels(*attrs).inc(sampling_variance * p)
            m.calibrated_dissatisfaction_squared_sampling_variance.labels(*attrs).inc(sampling_variance * p * p)
        for d in record.dimensions:
            self.metrics.dimension.labels(d.question_id, *attrs).observe(d.expected_value)
        self._observe_behaviours(record, attrs, weight)

    def _observe_behaviours(self, record: ScoreRecord, attrs: tuple[str, ...], weight: float) -> None:
        """Count judged assistant turns and each behaviour's hits (0 included, so every rate has a series)."""
        m = self.metrics
        turns = len({b.turn_index for b in record.behaviours})
        hits = Counter(b.behaviour_id for b in record.behaviours if b.hit)
        m.behaviour_turns.labels(*attrs).inc(turns)
        m.behaviour_turns_weight.labels(*attrs).inc(weight * turns)
        m.behaviour_turns_squared_variance.labels(*attrs).inc((weight * turns) ** 2)
        for behaviour in dict.fromkeys(b.behaviour_id for b in record.behaviours):
            h = hits[behaviour]
            m.behaviour_hits.labels(behaviour, *attrs).inc(h)
            m.behaviour_hits_weight.labels(behaviour, *attrs).inc(weight * h)
            m.behaviour_hits_turns_variance.labels(behaviour, *attrs).inc(weight * weight * h * turns)
            m.behaviour_hits_squared_variance.labels(behaviour, *attrs).inc((weight * h) ** 2)
