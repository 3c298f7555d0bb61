"""`ConversationScorer` with real parts: GPT-3.5's recorded answers on LLM-Rubric's real conversations, the
Q1-Q8 rubric set fitted on them, and a calibration network trained (briefly) on LLM-Rubric's synthetic data.

Conversations come from the replay source and the real assembler, as in the service. The only stand-in is
`FlakyJudge`, for the transient judge outage a real judge cannot produce on demand.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from scorers.behaviours import BehaviourSet, default_behaviour_set
from scorers.calibration import CalibrationNetwork
from scorers.conversation import Conversation
from scorers.datasets.llm_rubric import (
    QUESTIONS_FILE,
    dimension_rubric_set,
    load_real_conversations,
    load_split,
    satisfaction_labels,
)
from scorers.early_stopping import MOMENTS_KEY, ScoreMoments
from scorers.judges.base import (
    Answer,
    Judgement,
    JudgeUnavailable,
    Provenance,
    answers_in_memory,
    reply_errors_as_judge_errors,
)
from scorers.judges.recorded import RecordedJudge
from scorers.ordinal_calibration import OrdinalCalibrator
from scorers.questions import Question
from scorers.rubrics import RubricSet
from stream.assembly import ConversationAssembler
from stream.budget import BudgetedJudge, JudgeBudget
from stream.metrics import ServiceMetrics
from stream.records import ClosedConversation, ScoreRecord
from stream.replay.sources import llm_rubric_events
from stream.scoring import (
    MAX_UNSCORED_REASON_CHARS,
    NO_CALIBRATOR,
    ConversationScorer,
    judge_identity,
    scoring_questions,
    unscored_reason,
)
from stream.settings import AssemblySettings, BudgetSettings, ScoringSettings, SettingsError

DATA = Path(__file__).resolve().parents[2] / "data" / "llm-rubric"
REAL_ANSWERS = DATA / "gpt-3.5-turbo-16k_real_evaluations_FIXED.tsv"
QUESTIONS = DATA / QUESTIONS_FILE
FAST = dict(h1=16, h2=16, batch_size=32, learning_rate=1e-2, pretrain_epochs=3, finetune_epochs=3)
DIMENSIONS = [f"Q{i}" for i in range(9)]
RUBRICS = [f"Q{i}" for i in range(1, 9)]


# --- real components ----------------------------------------------------------------


@pytest.fixture(scope="module")
def judge() -> RecordedJudge:
    return RecordedJudge.from_tsv(REAL_ANSWERS)


@pytest.fixture(scope="module")
def unfitted() -> RubricSet:
    return dimension_rubric_set(QUESTIONS)


@pytest.fixture(scope="module")
def rubric_set(judge: RecordedJudge, unfitted: RubricSet) -> RubricSet:
    """The Q1-Q8 rubric set with θ and windows fitted on the real conversations' human Q0 labels."""
    labels = satisfaction_labels(load_split(DATA, "real"))
    ids = sorted(labels)
    netsats = unfitted.netsats(judge, (Conversation(i, ()) for i in ids))
    return unfitted.fit_windows(netsats, np.array([labels[i] for i in ids]))


@pytest.fixture(scope="module")
def calibrator() -> CalibrationNetwork:
    return CalibrationNetwork(**FAST, seed=0).fit(load_split(DATA, "synth"))


def _assemble_all(limit: int | None = None) -> dict[str, ClosedConversation]:
    """Real conversations replayed as events and assembled, as the worker does (the first ``limit`` to close)."""
    a = ConversationAssembler(AssemblySettings())
    states: dict[str, dict | None] = {}
    closed: dict[str, ClosedConversation] = {}
    for item in llm_rubric_events(DATA / "real_data.json"):
        cid = item.event.conversation_id
        step = a.apply(states.get(cid), item.event, 0, item.at)
        states[cid] = step.state
        if step.closed is not None:
            closed[cid] = step.closed
        if len(closed) == limit:
            break
    return closed


@pytest.fixture(scope="module")
def closed_conversations() -> dict[str, ClosedConversation]:
    """Three real conversations replayed as events and assembled, as the worker does."""
    closed = _assemble_all(limit=3)
    assert len(closed) == 3
    return closed


@pytest.fixture
def conversation(closed_conversations: dict[str, ClosedConversation]) -> ClosedConversation:
    return next(iter(closed_conversations.values()))


def fast_retries(**overrides: object) -> ScoringSettings:
    return ScoringSettings(
        **{"questions": QUESTIONS, "retry_initial_s": 0.001, "retry_max_s": 0.004, "max_attempts": 3, **overrides}
    )


def sample(metrics: ServiceMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def score(scorer: ConversationScorer, closed: ClosedConversation) -> ScoreRecord:
    return asyncio.run(scorer.score(closed))


class FlakyJudge:
    """Raises `JudgeUnavailable` (transient) for its first ``failures`` calls, then answers with the real judge.

    A stand-in for a fault: a real judge cannot be made to fail transiently and then recover on demand.
    """

    def __init__(self, judge: RecordedJudge, failures: int) -> None:
        self.inner = judge
        self.name = judge.name
        self.model = judge.model
        self.failures = failures
        self.calls = 0

    def judge(self, conversation: Conversation, questions: Sequence[Question]) -> Judgement:
        self.calls += 1
        if self.calls <= self.failures:
            raise JudgeUnavailable(f"judge outage (call {self.calls} of {self.failures} failing)")
        return self.inner.judge(conversation, questions)


class RecordingRandom(random.Random):
    """A real `random.Random` that remembers the ranges it was asked to draw from, and what it drew."""

    def __init__(self, seed: int) -> None:
        super().__init__(seed)
        self.draws: list[tuple[float, float, float]] = []

    def uniform(self, a: float, b: float) -> float:
        x = super().uniform(a, b)
        self.draws.append((a, b, x))
        return x


# --- scored --------------------------------------------------------------------------


def test_a_real_conversation_is_scored(judge, rubric_set, calibrator, conversation) -> None:
    metrics = ServiceMetrics()
    scorer = ConversationScorer(judge, rubric_set, calibrator, fast_retries(), metrics)
    record = score(scorer, conversation)

    assert record.status == "scored" and record.attempts == 1 and record.unscored_reason == ""
    assert record.conversation == conversation
    assert record.judge == judge_identity(judge) == "recorded:gpt-3.5-turbo-16k_real_evaluations_FIXED"
    assert (record.rubric_set_version, record.calibrator_version) == (rubric_set.version, calibrator.version_)

    assert [d.question_id for d in record.dimensions] == DIMENSIONS
    for d in record.dimensions:
        assert sum(d.probabilities) == pytest.approx(1.0)
        values = range(1, len(d.probabilities) + 1)
        assert d.expected_value == pytest.approx(sum(p * v for p, v in zip(d.probabilities, values)))
    assert record.main_question_id == "Q0" and len(record.main_probabilities) == 4
    assert sum(record.main_probabilities) == pytest.approx(1.0)
    assert record.main_probabilities == record.dimensions[0].probabilities
    assert record.dissatisfaction_probability == pytest.approx(record.main_probabilities[0] + record.main_probabilities[1])
    assert record.main_expected_value == pytest.approx(record.dimensions[0].expected_value)

    assert [h.rubric_id for h in record.rubrics] == RUBRICS
    assert all(h.polarity == "sat" and 0.0 <= h.score <= 10.0 for h in record.rubrics)
    assert record.netsat == pytest.approx(sum(h.score for h in record.rubrics))
    assert record.netsat == pytest.approx(rubric_set.netsat(judge.judge(conversation.to_conversation(), rubric_set.questions())))
    assert record.label in ("sat", "dsat", "uncertain") and record.threshold_label in ("sat", "dsat")
    assert ScoreRecord.from_json(record.to_json()) == record


def test_scoring_updates_the_metrics(judge, rubric_set, calibrator, conversation) -> None:
    metrics = ServiceMetrics()
    scorer = ConversationScorer(judge, rubric_set, calibrator, fast_retries(), metrics)
    record = score(scorer, conversation)
    attrs = {"product": "llm-rubric-demo", "model_version": conversation.attributes["model_version"]}
    name = scorer.judge_name

    assert sample(metrics, "convowatch_conversations_scored_total", label=record.label, **attrs) == 1
    assert sample(metrics, "convowatch_calibrated_conversations_total", **attrs) == 1
    assert sample(metrics, "convowatch_calibrated_dissatisfaction_probability_total", **attrs) == pytest.approx(
        record.dissatisfaction_probability
    )
    assert sample(metrics, "convowatch_calibrated_dissatisfaction_probability_squared_total", **attrs) == pytest.approx(
        record.dissatisfaction_probability**2
    )
    assert sample(metrics, "convowatch_netsat_count", **attrs) == 1
    # no convowatch_netsat_sum: see tests/unit/test_service_metrics.py (negative buckets)
    assert sample(metrics, "convowatch_netsat_bucket", le="+Inf", **attrs) == 1
    for d in record.dimensions:
        assert sample(metrics, "convowatch_dimension_expected_value_sum", dimension=d.question_id, **attrs) == pytest.approx(
            d.expected_value
        )
    assert sample(metrics, "convowatch_judge_latency_seconds_count", judge=name) == 1
    assert sample(metrics, "convowatch_judge_calls_total", judge=name) == 0  # a recorded judge makes no requests
    assert sample(metrics, "convowatch_scoring_latency_seconds_count") == 1
    assert sample(metrics, "convowatch_scoring_retries_total", reason="JudgeUnavailable") is None

    score(scorer, conversation)
    assert sample(metrics, "convowatch_conversations_scored_total", label=record.label, **attrs) == 2
    assert sample(metrics, "convowatch_scoring_latency_seconds_count") == 2


def test_without_a_calibrator_only_rubrics_are_scored(judge, rubric_set, conversation) -> None:
    metrics = ServiceMetrics()
    record = score(ConversationScorer(judge, rubric_set, None, fast_retries(questions=None), metrics), conversation)
    assert record.status == "scored" and record.calibrator_version == NO_CALIBRATOR
    assert record.dimensions == () and record.main_probabilities == ()
    assert record.dissatisfaction_probability is None and record.main_expected_value is None
    assert [h.rubric_id for h in record.rubrics] == RUBRICS
    attrs = {"product": "llm-rubric-demo", "model_version": conversation.attributes["model_version"]}
    assert sample(metrics, "convowatch_calibrated_conversations_total", **attrs) is None


def test_a_calibrator_needing_undefined_questions_is_refused(judge, rubric_set, calibrator) -> None:
    with pytest.raises(SettingsError, match=r"needs questions \['Q0'\].*scoring\.questions"):
        ConversationScorer(judge, rubric_set, calibrator, fast_retries(questions=None), ServiceMetrics())


def test_scorer_version_follows_the_components(judge, rubric_set, unfitted, calibrator) -> None:
    def version(j=judge, rs=rubric_set, cal=calibrator) -> str:
        return ConversationScorer(j, rs, cal, fast_retries(), ServiceMetrics()).scorer_version

    base = version()
    assert version() == base  # deterministic
    other_calibrator = CalibrationNetwork(**{**FAST, "pretrain_epochs": 1, "finetune_epochs": 1}, seed=1).fit(
        load_split(DATA, "synth")
    )
    others = {
        "unfitted rubric set": version(rs=unfitted),
        "no calibrator": version(cal=None),
        "other calibrator": version(cal=other_calibrator),
        "other judge model": version(j=RecordedJudge(judge.table, model="another-model")),
    }
    assert base not in others.values(), others
    assert len(set(others.values())) == len(others), others


def test_scored_records_differ_across_conversations(judge, rubric_set, calibrator, closed_conversations) -> None:
    scorer = ConversationScorer(judge, rubric_set, calibrator, fast_retries(), ServiceMetrics())
    records = [score(scorer, c) for c in closed_conversations.values()]
    assert [r.conversation_id for r in records] == list(closed_conversations)
    assert len({r.main_probabilities for r in records}) == 3
    assert len({r.netsat for r in records}) == 3


def test_trusted_judges_aggregate_the_calibrated_prediction(judge, rubric_set, calibrator, conversation) -> None:
    trusted = list(calibrator.judges_[:3])
    record = score(
        ConversationScorer(judge, rubric_set, calibrator, fast_retries(trusted_judges=trusted), ServiceMetrics()), conversation
    )
    shared = score(ConversationScorer(judge, rubric_set, calibrator, fast_retries(), ServiceMetrics()), conversation)
    assert record.status == "scored" and sum(record.main_probabilities) == pytest.approx(1.0)
    assert record.dissatisfaction_probability == pytest.approx(record.main_probabilities[0] + record.main_probabilities[1])
    assert record.main_probabilities != shared.main_probabilities  # the trusted judges' weights, not the shared ones
    x = calibrator.features_from_judgement(
        judge.judge(conversation.to_conversation(), scoring_questions(rubric_set, calibrator, QUESTIONS))
    )
    expected = np.mean([calibrator.predict_proba(x, "Q0", j).probabilities[0] for j in trusted], axis=0)  # the mixture
    assert record.main_probabilities == pytest.approx(tuple(expected))


def test_the_default_ordinal_calibrator_scores_every_ordinal_dimension(judge, rubric_set, conversation) -> None:
    synth = load_split(DATA, "synth")
    ordinal = OrdinalCalibrator(questions=DIMENSIONS[:-1]).fit(synth)  # Q8 is not ordinal
    trusted = list(ordinal.judges_[:3])
    record = score(
        ConversationScorer(judge, rubric_set, ordinal, fast_retries(trusted_judges=trusted), ServiceMetrics()), conversation
    )
    assert record.status == "scored" and record.calibrator_version == ordinal.version_
    assert [d.question_id for d in record.dimensions] == DIMENSIONS[:-1]
    x = ordinal.features_from_judgement(
        judge.judge(conversation.to_conversation(), scoring_questions(rubric_set, ordinal, QUESTIONS))
    )
    expected = np.mean([ordinal.predict_proba(x, "Q0", j).probabilities[0] for j in trusted], axis=0)
    assert record.main_probabilities == pytest.approx(tuple(expected))
    assert record.dissatisfaction_probability == pytest.approx(expected[0] + expected[1])


def test_an_unknown_trusted_judge_is_refused_at_start_up(judge, rubric_set, calibrator) -> None:
    """A typo in scoring.trusted_judges would make every conversation unscored: refuse it before any is scored."""
    with pytest.raises(SettingsError, match="nobody"):
        ConversationScorer(judge, rubric_set, calibrator, fast_retries(trusted_judges=["nobody"]), ServiceMetrics())


# --- unscored ----------------------------------------------------------------------------


def test_unknown_conversation_is_unscored_at_once(judge, rubric_set, calibrator, conversation) -> None:
    metrics = ServiceMetrics()
    flaky = FlakyJudge(judge, failures=0)
    unknown = ClosedConversation(
        conversation_id="not-in-the-recording",
        turns=conversation.turns,
        attributes=dict(conversation.attributes),
        close_cause="end",
        closed_at=conversation.closed_at,
        first_event_at=conversation.first_event_at,
        last_event_at=conversation.last_event_at,
    )
    scorer = ConversationScorer(flaky, rubric_set, calibrator, fast_retries(max_attempts=5), metrics)
    record = score(scorer, unknown)
    assert record.status == "unscored" and record.attempts == 1 and flaky.calls == 1
    assert record.unscored_reason.startswith("UnknownConversation: ")
    assert "not-in-the-recording" in record.unscored_reason
    assert record.netsat is None and record.dimensions == () and record.rubrics == () and record.label == ""
    assert record.scorer_version == scorer.scorer_version
    attrs = {"product": "llm-rubric-demo", "model_version": conversation.attributes["model_version"]}
    assert sample(metrics, "convowatch_conversations_unscored_total", reason="UnknownConversation", **attrs) == 1
    assert sample(metrics, "convowatch_judge_errors_total", judge=scorer.judge_name, error="UnknownConversation") == 1
    assert sample(metrics, "convowatch_scoring_retries_total", reason="UnknownConversation") is None
    assert ScoreRecord.from_json(record.to_json()) == record


class BrokenUsageJudge:
    """Answers with the real judge but reports a fractional call count, as a broken wrapper's usage might.

    A stand-in for a fault: the recorded judge reports no usage at all, and no real server here misreports it.
    """

    def __init__(self, judge: RecordedJudge) -> None:
        self.inner, self.name, self.model = judge, judge.name, judge.model

    def judge(self, conversation: Conversation, questions: Sequence[Question]) -> Judgement:
        j = self.inner.judge(conversation, questions)
        return replace(j, provenance=replace(j.provenance, calls=1.5))


def test_a_record_with_a_bad_value_is_unscored_at_the_scorer(judge, rubric_set, calibrator, conversation) -> None:
    """Records check their values when built: the scorer stores why, instead of the sink failing to write it."""
    metrics = ServiceMetrics()
    record = score(ConversationScorer(BrokenUsageJudge(judge), rubric_set, calibrator, fast_retries(), metrics), conversation)
    assert record.status == "unscored" and record.attempts == 1
    assert record.unscored_reason.startswith("RecordError: score record for conversation ")
    assert "judge_calls = 1.5 is not a count" in record.unscored_reason
    assert ScoreRecord.from_json(record.to_json()) == record


def test_transient_failures_are_retried_until_the_judge_recovers(judge, rubric_set, calibrator, conversation) -> None:
    metrics = ServiceMetrics()
    flaky = FlakyJudge(judge, failures=2)
    scorer = ConversationScorer(flaky, rubric_set, calibrator, fast_retries(max_attempts=3), metrics)
    record = score(scorer, conversation)
    assert record.status == "scored" and record.attempts == 3 and flaky.calls == 3
    steady = score(ConversationScorer(judge, rubric_set, calibrator, fast_retries(), ServiceMetrics()), conversation)
    assert record.main_probabilities == steady.main_probabilities and record.netsat == steady.netsat
    assert sample(metrics, "convowatch_scoring_retries_total", reason="JudgeUnavailable") == 2
    assert sample(metrics, "convowatch_judge_errors_total", judge=scorer.judge_name, error="JudgeUnavailable") == 2
    assert sample(metrics, "convowatch_judge_latency_seconds_count", judge=scorer.judge_name) == 1


class ThreadNoting:
    """Answers with the real judge and notes the thread of each call; ``answers_in_memory`` as given."""

    def __init__(self, judge: RecordedJudge, in_memory: bool) -> None:
        self.inner, self.name, self.model = judge, judge.name, judge.model
        self.answers_in_memory = in_memory
        self.threads: list[int] = []

    def judge(self, conversation: Conversation, questions: Sequence[Question]) -> Judgement:
        self.threads.append(threading.get_ident())
        return self.inner.judge(conversation, questions)


@pytest.mark.parametrize("in_memory", [True, False])
def test_a_judge_that_answers_from_memory_is_called_on_the_event_loop_any_other_in_a_thread(
    judge, rubric_set, calibrator, conversation, in_memory
) -> None:
    noting = ThreadNoting(judge, in_memory)
    scorer = ConversationScorer(noting, rubric_set, calibrator, fast_retries(), ServiceMetrics())

    async def scored_on() -> tuple[ScoreRecord, int]:
        return await scorer.score(conversation), threading.get_ident()

    record, loop_thread = asyncio.run(scored_on())
    assert record.status == "scored" and noting.threads
    assert all((t == loop_thread) is in_memory for t in noting.threads)
    steady = score(ConversationScorer(judge, rubric_set, calibrator, fast_retries(), ServiceMetrics()), conversation)
    assert record.main_probabilities == steady.main_probabilities and record.netsat == steady.netsat


def calibrated_numbers(record: ScoreRecord) -> list[float]:
    """Every number the calibrator gave ``record``."""
    numbers = [*record.main_probabilities, record.main_expected_value or 0.0, record.dissatisfaction_probability or 0.0]
    return numbers + [x for d in record.dimensions for x in (*d.probabilities, d.expected_value)]


def without_calibrated_numbers(record: ScoreRecord) -> ScoreRecord:
    """``record`` with no scoring time and its calibrated numbers zeroed (the rest compares exactly)."""
    return replace(
        record,
        scored_at=0.0,
        main_probabilities=tuple(0.0 for _ in record.main_probabilities),
        main_expected_value=None if record.main_expected_value is None else 0.0,
        dissatisfaction_probability=None if record.dissatisfaction_probability is None else 0.0,
        dimensions=tuple(
            replace(d, probabilities=tuple(0.0 for _ in d.probabilities), expected_value=0.0) for d in record.dimensions
        ),
    )


def test_conversations_scored_together_get_the_records_and_metrics_each_would_get_alone(
    judge, rubric_set, calibrator, closed_conversations
) -> None:
    """`score_many` (a poll at once, one calibrator call) against `score` one by one: the same records, in order, and
    the same counts, for judged, unsampled and unscored conversations alike."""
    known = list(closed_conversations.values())
    unknown = replace(known[0], conversation_id="not-in-the-recording")
    conversations = [*known[:1], unknown, *known[1:]]
    settings = fast_retries(sampling={"default_rate": 0.6, "salt": "together"})

    def scorer() -> ConversationScorer:
        return ConversationScorer(judge, rubric_set, calibrator, settings, ServiceMetrics(), rng=random.Random(7))

    together, alone = scorer(), scorer()
    assert together.scores_at_once
    many = asyncio.run(together.score_many(conversations))
    one_by_one = [score(alone, c) for c in conversations]
    assert {r.status for r in many} == {"scored", "unsampled", "unscored"}
    # The network computes in float32: a row's numbers may differ in the 8th digit with the batch it is in.
    assert [without_calibrated_numbers(r) for r in many] == [without_calibrated_numbers(r) for r in one_by_one]
    for r, r1 in zip(many, one_by_one):
        assert calibrated_numbers(r) == pytest.approx(calibrated_numbers(r1), abs=1e-6)

    def counts(s: ConversationScorer) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        return {
            (x.name, tuple(sorted(x.labels.items()))): x.value
            for family in s.metrics.registry.collect()
            if "latency" not in family.name  # times differ
            for x in family.samples
        }

    assert counts(together).keys() == counts(alone).keys()
    assert all(v == pytest.approx(counts(alone)[k], rel=1e-6) for k, v in counts(together).items())
    assert sample(together.metrics, "convowatch_scoring_latency_seconds_count") == sum(r.status != "unsampled" for r in many)


class AnswerDroppingJudge:
    """The recorded judge, but for one conversation it leaves out a question's answer (a stand-in for a judge whose
    reply lacks an answer: the recorded judge always has them all). It answers from memory, as the recorded one."""

    answers_in_memory = True

    def __init__(self, judge: RecordedJudge, conversation_id: str, question_id: str) -> None:
        self.inner, self.name, self.model = judge, judge.name, judge.model
        self.conversation_id, self.question_id = conversation_id, question_id

    def judge(self, conversation: Conversation, questions: Sequence[Question]) -> Judgement:
        j = self.inner.judge(conversation, questions)
        if conversation.id != self.conversation_id:
            return j
        return replace(j, answers={q: a for q, a in j.answers.items() if q != self.question_id})


def test_a_conversation_the_calibrator_cannot_predict_is_unscored_and_the_rest_of_its_poll_scored(
    judge, rubric_set, calibrator, closed_conversations
) -> None:
    conversations = list(closed_conversations.values())
    assert len(conversations) >= 3
    broken = conversations[1].conversation_id
    only_calibrator_reads = next(q for q in calibrator.question_ids_ if q not in {r.id for r in rubric_set.rubrics})
    dropping = AnswerDroppingJudge(judge, broken, only_calibrator_reads)
    scorer = ConversationScorer(dropping, rubric_set, calibrator, fast_retries(), ServiceMetrics())
    assert scorer.scores_at_once
    records = asyncio.run(scorer.score_many(conversations))
    assert [r.conversation_id for r in records] == [c.conversation_id for c in conversations]
    assert [r.status for r in records] == ["unscored" if c.conversation_id == broken else "scored" for c in conversations]
    assert records[1].unscored_reason.startswith("CalibrationError: ") and "lacks answers" in records[1].unscored_reason
    alone = ConversationScorer(judge, rubric_set, calibrator, fast_retries(), ServiceMetrics())
    for record, closed in zip(records, conversations):
        if record.status == "scored":
            assert calibrated_numbers(record) == pytest.approx(calibrated_numbers(score(alone, closed)), abs=1e-6)


def test_only_a_judge_answering_from_memory_without_a_budget_scores_at_once(judge, rubric_set, calibrator) -> None:
    def scorer(j: Any, **overrides: Any) -> ConversationScorer:
        return ConversationScorer(j, rubric_set, calibrator, fast_retries(**overrides), ServiceMetrics())

    assert scorer(judge).scores_at_once
    assert not scorer(FlakyJudge(judge, failures=0)).scores_at_once  # it may wait: scored concurrently
    assert not scorer(judge, budget={"calls_per_minute": 10}).scores_at_once  # the budget may make one wait


def test_only_a_judge_that_says_so_counts_as_answering_from_memory(judge) -> None:
    assert answers_in_memory(judge)  # the recorded judge: a table lookup
    assert not answers_in_memory(FlakyJudge(judge, failures=0))  # says nothing: it may wait
    # The budget's wrapper passes other attributes through to the judge it wraps, but it may wait for the budget.
    assert not answers_in_memory(BudgetedJudge(judge, JudgeBudget(BudgetSettings(calls_per_minute=10)), 1.0))


def test_backoff_is_exponential_with_full_jitter_and_capped(judge, rubric_set, calibrator, conversation) -> None:
    rng = RecordingRandom(7)
    settings = fast_retries(retry_initial_s=0.002, retry_max_s=0.006, max_attempts=6)
    scorer = ConversationScorer(FlakyJudge(judge, failures=5), rubric_set, calibrator, settings, ServiceMetrics(), rng=rng)
    started = time.perf_counter()
    record = score(scorer, conversation)
    elapsed = time.perf_counter() - started
    assert record.status == "scored" and record.attempts == 6
    assert [(a, b) for a, b, _ in rng.draws] == [(0, 0.002), (0, 0.004), (0, 0.006), (0, 0.006), (0, 0.006)]
    assert all(0 <= x <= b <= settings.retry_max_s for _, b, x in rng.draws)
    assert elapsed < 5.0  # five sleeps of at most 6 ms each, plus the work


def test_transient_failures_past_max_attempts_are_unscored(judge, rubric_set, calibrator, conversation) -> None:
    metrics = ServiceMetrics()
    flaky = FlakyJudge(judge, failures=10)
    scorer = ConversationScorer(flaky, rubric_set, calibrator, fast_retries(max_attempts=4), metrics)
    record = score(scorer, conversation)
    assert record.status == "unscored" and record.attempts == 4 and flaky.calls == 4
    assert record.unscored_reason == "JudgeUnavailable: judge outage (call 4 of 10 failing)"
    assert sample(metrics, "convowatch_scoring_retries_total", reason="JudgeUnavailable") == 3  # the last failure is not retried
    assert sample(metrics, "convowatch_judge_errors_total", judge=scorer.judge_name, error="JudgeUnavailable") == 4
    attrs = {"product": "llm-rubric-demo", "model_version": conversation.attributes["model_version"]}
    assert sample(metrics, "convowatch_conversations_unscored_total", reason="JudgeUnavailable", **attrs) == 1
    assert sample(metrics, "convowatch_conversations_scored_total", label="sat", **attrs) is None


def test_every_turn_of_the_real_conversation_reaches_the_judge(conversation) -> None:
    """The assembled conversation is the real one: same turns, in order, as real_data.json holds them."""
    real = load_real_conversations(DATA / "real_data.json")[conversation.conversation_id]
    assert [(t.role, t.text) for t in conversation.to_conversation().turns] == [(t.role, t.text) for t in real.turns]


# --- early stopping --------------------------------------------------------------------


def test_early_stopping_keeps_the_labels_and_records_what_it_skipped(judge, rubric_set) -> None:
    """All 223 real conversations scored with every rubric, and one rubric per round with early stopping."""
    full_metrics, early_metrics = ServiceMetrics(), ServiceMetrics()
    full_scorer = ConversationScorer(judge, rubric_set, None, fast_retries(questions=None), full_metrics)
    early_scorer = ConversationScorer(judge, rubric_set, None, fast_retries(questions=None, rubrics_per_round=1), early_metrics)
    assert early_scorer.scorer_version == full_scorer.scorer_version  # same judge, rubric set and calibrator
    conversations = _assemble_all()
    skipped = 0
    for closed in conversations.values():
        full, early = score(full_scorer, closed), score(early_scorer, closed)
        assert early.status == full.status == "scored", early.unscored_reason
        assert (early.label, early.threshold_label) == (full.label, full.threshold_label)
        asked = {h.rubric_id for h in early.rubrics}
        assert asked | set(early.rubrics_unasked) == set(RUBRICS) and not asked & set(early.rubrics_unasked)
        assert early.netsat_lower <= full.netsat <= early.netsat_upper
        assert (early.netsat is None) == bool(early.rubrics_unasked)
        assert full.rubrics_unasked == () and full.netsat_lower == full.netsat_upper == full.netsat
        skipped += len(early.rubrics_unasked)
    assert sample(early_metrics, "convowatch_rubric_questions_total", outcome="skipped") == skipped
    assert sample(full_metrics, "convowatch_rubric_questions_total", outcome="asked") == len(RUBRICS) * len(conversations)
    assert skipped > 0


def test_early_stopping_still_asks_every_question_the_calibrator_reads(judge, rubric_set, calibrator, conversation) -> None:
    """This calibrator reads Q0–Q8 and the rubrics are Q1–Q8: nothing can be skipped, and P(dsat) is unchanged."""
    full = score(ConversationScorer(judge, rubric_set, calibrator, fast_retries(), ServiceMetrics()), conversation)
    early = score(
        ConversationScorer(judge, rubric_set, calibrator, fast_retries(rubrics_per_round=1), ServiceMetrics()), conversation
    )
    assert early.rubrics_unasked == () and early.netsat == pytest.approx(full.netsat)
    assert early.dissatisfaction_probability == pytest.approx(full.dissatisfaction_probability)
    assert early.judge_calls == full.judge_calls == 0  # the recorded judge makes no requests


def test_approximate_early_stopping_needs_rounds_and_moments_and_versions_its_scores(judge, rubric_set) -> None:
    """Real answers on the real conversations; the moments are fitted on those answers (this checks the wiring only:
    bench/early_stopping.py measures the mode on held-out conversations)."""
    approximate = fast_retries(questions=None, rubrics_per_round=1, max_label_change_probability=0.05)
    with pytest.raises(
        SettingsError, match="score_moments.*needs the rubric scores' moments: refit it with `convowatch rubrics fit`"
    ):
        ConversationScorer(judge, rubric_set, None, approximate, ServiceMetrics())
    with pytest.raises(SettingsError, match="needs scoring.rubrics_per_round"):
        ConversationScorer(
            judge, rubric_set, None, fast_retries(questions=None, max_label_change_probability=0.05), ServiceMetrics()
        )
    ids = [r.id for r in rubric_set.rubrics]
    conversations = _assemble_all()
    scores = [
        score(ConversationScorer(judge, rubric_set, None, fast_retries(questions=None), ServiceMetrics()), c)
        for c in conversations.values()
    ]
    table = np.array([[{h.rubric_id: h.score for h in r.rubrics}[i] for i in ids] for r in scores])
    with_moments = replace(rubric_set, metadata={MOMENTS_KEY: ScoreMoments.fit(ids, table).to_dict()})
    exact = ConversationScorer(judge, with_moments, None, fast_retries(questions=None, rubrics_per_round=1), ServiceMetrics())
    scorer = ConversationScorer(judge, with_moments, None, approximate, ServiceMetrics())
    assert scorer.scorer_version != exact.scorer_version  # approximate labels are another scorer's
    records = [score(scorer, c) for c in conversations.values()]
    stopped = [r for r in records if "label_change_probability" in r.extra]
    assert stopped and all(0 < r.extra["label_change_probability"] <= 0.05 and r.rubrics_unasked for r in stopped)
    assert sum(len(r.rubrics) for r in records) < sum(len(r.rubrics) for r in (score(exact, c) for c in conversations.values()))


# --- behaviours ------------------------------------------------------------------------


class BehaviourAnsweringJudge:
    """The recorded judge for the rubric and calibrator questions; for behaviour questions a rule on the text:
    a turn "asks back" when it contains a question mark. A stand-in with known answers for the plumbing (the
    recorded GPT-3.5 answers have no behaviour questions); what a real judge detects is measured in the bench."""

    def __init__(self, judge: RecordedJudge) -> None:
        self.inner = judge
        self.name = judge.name
        self.model = judge.model
        self.behaviour_calls = 0

    def judge(self, conversation: Conversation, questions: Sequence[Question]) -> Judgement:
        if not questions[0].id.startswith("behaviour."):
            return self.inner.judge(conversation, questions)
        self.behaviour_calls += 1
        asks_back = "?" in conversation.turns[-1].text
        answers = {
            q.id: Answer(q.id, (0.8, 0.2) if q.id == "behaviour.follow_up" and asks_back else (0.1, 0.9)) for q in questions
        }
        return Judgement(conversation.id, answers, Provenance(self.name, self.model, prompt_tokens=50, calls=1))


def test_behaviours_are_judged_per_assistant_turn_stored_and_counted(judge, rubric_set, conversation) -> None:
    behaviour_set = BehaviourSet.from_dict(
        {
            "schema_version": 1,
            "name": "two",
            "behaviours": [
                {"id": "follow_up", "label": "Follow-up", "definition": "Asks the user a question back."},
                {"id": "antisocial", "label": "Antisocial", "definition": "Insulting, hateful or grossly vulgar."},
            ],
        }
    )
    metrics = ServiceMetrics()
    answering = BehaviourAnsweringJudge(judge)
    plain = ConversationScorer(judge, rubric_set, None, fast_retries(questions=None), ServiceMetrics())
    scorer = ConversationScorer(answering, rubric_set, None, fast_retries(questions=None), metrics, behaviour_set=behaviour_set)
    record = score(scorer, conversation)

    assistant = [t for t in conversation.turns if t.role == "assistant"]
    assert len(assistant) >= 2 and answering.behaviour_calls == len(assistant)
    assert record.behaviour_set_version == behaviour_set.version and plain.score_once(conversation).behaviour_set_version == ""
    assert scorer.scorer_version != plain.scorer_version  # behaviour rows belong to the version that asked them
    assert [(b.turn_index, b.behaviour_id) for b in record.behaviours] == [
        (t.index, b) for t in assistant for b in ("follow_up", "antisocial")
    ]
    follow_ups = [b.hit for b in record.behaviours if b.behaviour_id == "follow_up"]
    assert follow_ups == ["?" in t.text for t in assistant]
    assert not any(b.hit for b in record.behaviours if b.behaviour_id == "antisocial")
    assert record.judge_calls == len(assistant) and record.judge_prompt_tokens == 50 * len(assistant)
    assert record.netsat == plain.score_once(conversation).netsat  # the rubric score is unchanged
    assert ScoreRecord.from_json(record.to_json()) == record

    attrs = {"product": "llm-rubric-demo", "model_version": conversation.attributes["model_version"]}
    assert sample(metrics, "convowatch_behaviour_turns_total", **attrs) == len(assistant)
    assert sample(metrics, "convowatch_behaviour_hits_total", behaviour="follow_up", **attrs) == sum(follow_ups)
    assert sample(metrics, "convowatch_behaviour_hits_total", behaviour="antisocial", **attrs) == 0  # the series exists
    assert sample(metrics, "convowatch_judge_calls_total", judge=scorer.judge_name) == len(assistant)
    assert sample(metrics, "convowatch_judge_latency_seconds_count", judge=scorer.judge_name) == 1  # one per conversation


def test_a_separate_behaviour_judge_answers_the_behaviours_and_stays_out_of_the_scores_judge_cost(
    judge, rubric_set, conversation
) -> None:
    behaviours = BehaviourAnsweringJudge(judge)  # stands in for the local model: what it detects is not the point here
    behaviours.name, behaviours.model = "local", "model.gguf"
    metrics = ServiceMetrics()
    settings = fast_retries(questions=None)
    scorer = ConversationScorer(
        judge, rubric_set, None, settings, metrics, behaviour_set=default_behaviour_set(), behaviour_judge=behaviours
    )
    same_judge = ConversationScorer(
        BehaviourAnsweringJudge(judge), rubric_set, None, settings, ServiceMetrics(), behaviour_set=default_behaviour_set()
    )
    record = score(scorer, conversation)
    assistant = [t for t in conversation.turns if t.role == "assistant"]
    assert behaviours.behaviour_calls == len(assistant) and len(record.behaviours) == 16 * len(assistant)
    alone = ConversationScorer(judge, rubric_set, None, settings, ServiceMetrics()).score_once(conversation)
    assert (record.judge_calls, record.judge_prompt_tokens) == (alone.judge_calls, alone.judge_prompt_tokens)
    assert sample(metrics, "convowatch_judge_calls_total", judge="local:model.gguf") == len(assistant)
    assert sample(metrics, "convowatch_judge_calls_total", judge=scorer.judge_name) == alone.judge_calls
    assert record.judge == scorer.judge_name == same_judge.judge_name
    assert scorer.scorer_version != same_judge.scorer_version  # who answered the behaviours is part of the version
    shadow = scorer.for_version(rubric_set, None, "other")
    assert shadow.behaviour_judge is behaviours and shadow.scorer_version == scorer.scorer_version


def test_a_shadow_does_not_ask_the_behaviour_questions_again(judge, rubric_set, conversation) -> None:
    answering = BehaviourAnsweringJudge(judge)
    scorer = ConversationScorer(
        answering, rubric_set, None, fast_retries(questions=None), ServiceMetrics(), behaviour_set=default_behaviour_set()
    )
    active = score(scorer, conversation)
    asked = answering.behaviour_calls
    assert asked > 0 and active.behaviours
    shadow = asyncio.run(scorer.for_version(rubric_set, None, "v2").score_shadow(conversation, active))
    assert shadow.status == "scored" and shadow.behaviours == () and answering.behaviour_calls == asked
    assert shadow.netsat == active.netsat


def test_behaviour_rate_judges_a_stable_hash_chosen_share_of_conversations(judge, rubric_set) -> None:
    ids = [f"conversation-{i}" for i in range(4000)]
    settings = fast_retries(questions=None, behaviour_rate=0.25)
    scorer = ConversationScorer(judge, rubric_set, None, settings, ServiceMetrics(), behaviour_set=default_behaviour_set())
    chosen = {i for i in ids if scorer.judges_behaviours_of(i)}
    assert 0.23 < len(chosen) / len(ids) < 0.27
    again = ConversationScorer(judge, rubric_set, None, settings, ServiceMetrics(), behaviour_set=default_behaviour_set())
    assert chosen == {i for i in ids if again.judges_behaviours_of(i)}  # the same on every worker
    sampled = fast_retries(questions=None, behaviour_rate=0.25, sampling={"default_rate": 0.25})
    judged = ConversationScorer(judge, rubric_set, None, sampled, ServiceMetrics()).sampling
    in_both = [i for i in ids if judged.decide(i, {}, False, rated=False).scored and i in chosen]
    assert 0.03 < len(in_both) / len(ids) < 0.10  # independent of conversation sampling (0.25 × 0.25)
    everything = fast_retries(questions=None)
    every = ConversationScorer(judge, rubric_set, None, everything, ServiceMetrics(), behaviour_set=default_behaviour_set())
    assert all(every.judges_behaviours_of(i) for i in ids[:100])
    assert not ConversationScorer(judge, rubric_set, None, everything, ServiceMetrics()).judges_behaviours_of(ids[0])


def test_a_conversation_left_out_by_behaviour_rate_is_scored_without_behaviour_questions(
    judge, rubric_set, closed_conversations
) -> None:
    answering = BehaviourAnsweringJudge(judge)
    metrics = ServiceMetrics()
    settings = fast_retries(questions=None, behaviour_rate=0.5)
    scorer = ConversationScorer(answering, rubric_set, None, settings, metrics, behaviour_set=default_behaviour_set())
    out = [c for c in closed_conversations.values() if not scorer.judges_behaviours_of(c.conversation_id)]
    kept = [c for c in closed_conversations.values() if scorer.judges_behaviours_of(c.conversation_id)]
    assert out and kept, "the three conversations should fall on both sides of 0.5"
    for closed in out:
        record = score(scorer, closed)
        assert record.status == "scored" and record.behaviours == () and answering.behaviour_calls == 0
    assert sample(
        metrics, "convowatch_behaviour_turns_total", product="llm-rubric-demo", model_version=out[0].attributes["model_version"]
    ) in (None, 0)
    record = score(scorer, kept[0])
    assert record.behaviours and answering.behaviour_calls == sum(t.role == "assistant" for t in kept[0].turns)


def test_behaviour_counts_are_weighted_by_the_inclusion_probability(judge, rubric_set, conversation) -> None:
    metrics = ServiceMetrics()
    settings = fast_retries(questions=None, sampling={"default_rate": 0.5, "salt": "take-it"})
    scorer = ConversationScorer(
        BehaviourAnsweringJudge(judge), rubric_set, None, settings, metrics, behaviour_set=default_behaviour_set()
    )
    record = score(scorer, conversation)
    assert record.status == "scored" and record.inclusion_probability == 0.5  # the salt was chosen to keep it
    attrs = {"product": "llm-rubric-demo", "model_version": conversation.attributes["model_version"]}
    turns = sample(metrics, "convowatch_behaviour_turns_total", **attrs)
    assert turns == len({b.turn_index for b in record.behaviours}) > 0
    assert sample(metrics, "convowatch_behaviour_turns_weight_total", **attrs) == pytest.approx(2 * turns)
    hits = sample(metrics, "convowatch_behaviour_hits_total", behaviour="follow_up", **attrs)
    assert sample(metrics, "convowatch_behaviour_hits_weight_total", behaviour="follow_up", **attrs) == pytest.approx(2 * hits)
    # The variance sums of one conversation (a cluster): (t/π)², h·t/π², (h/π)² with weight 1/π = 2.
    assert hits > 0
    assert sample(metrics, "convowatch_behaviour_turns_squared_variance_total", **attrs) == pytest.approx((2 * turns) ** 2)
    assert sample(metrics, "convowatch_behaviour_hits_turns_variance_total", behaviour="follow_up", **attrs) == pytest.approx(
        4 * hits * turns
    )
    assert sample(metrics, "convowatch_behaviour_hits_squared_variance_total", behaviour="follow_up", **attrs) == pytest.approx(
        (2 * hits) ** 2
    )
    assert sample(metrics, "convowatch_behaviour_hits_squared_variance_total", behaviour="antisocial", **attrs) == 0
    # Which behaviours a rise alerts on: the set's errors.
    assert sample(metrics, "convowatch_behaviour_error", behaviour="ignore") == 1
    assert sample(metrics, "convowatch_behaviour_error", behaviour="follow_up") == 0


# --- whatever the judge does (issue 54, item 2) -------------------------------------


class HostileJudge:
    """Raises what a judge reading a reply of the wrong shape used to let out (not a `JudgeError`), with a long,
    control-character-laden message. A stand-in for a fault: the real judges now turn these into `JudgeReplyError`
    themselves (tests/integration/test_judge_hostile_replies.py); this is the scorer's last line for any other judge."""

    def __init__(self, judge: RecordedJudge, error: type[Exception]) -> None:
        self.inner, self.name, self.model, self.error = judge, judge.name, judge.model, error

    def judge(self, conversation: Conversation, questions: Sequence[Question]) -> Judgement:
        raise self.error("\x1b[2J'choices'" + "x" * 5000)


@pytest.mark.parametrize("error", [KeyError, TypeError, AttributeError, IndexError, ValueError, ZeroDivisionError])
def test_any_exception_from_the_judge_is_unscored_with_a_bounded_reason(
    judge, rubric_set, calibrator, conversation, error
) -> None:
    metrics = ServiceMetrics()
    scorer = ConversationScorer(HostileJudge(judge, error), rubric_set, calibrator, fast_retries(), metrics)
    record = score(scorer, conversation)
    assert record.status == "unscored" and record.attempts == 1
    assert record.unscored_reason.startswith(f"JudgeReplyError: judge {scorer.judge_name!r}'s answers could not be read ")
    assert error.__name__ in record.unscored_reason
    assert len(record.unscored_reason) <= MAX_UNSCORED_REASON_CHARS and record.unscored_reason.isprintable()
    assert sample(metrics, "convowatch_judge_errors_total", judge=scorer.judge_name, error="JudgeReplyError") == 1


def test_an_unscored_reason_is_cut_to_the_one_bound_and_printable() -> None:
    reason = unscored_reason("E: " + "\x00\x1b" + "y" * 10_000)
    assert len(reason) == MAX_UNSCORED_REASON_CHARS and reason.isprintable() and reason.endswith("…")
    assert unscored_reason("short") == "short"


@pytest.mark.parametrize("passing", [KeyboardInterrupt, asyncio.CancelledError, SystemExit])
def test_the_judge_boundary_lets_cancellation_and_interrupts_through(passing: type[BaseException]) -> None:
    with pytest.raises(passing), reply_errors_as_judge_errors("judge 'm'"):
        raise passing()


class SlowJudge:
    """Answers with the real judge after ``delay_s``: a stand-in for a judge that hangs (no real one hangs on demand)."""

    def __init__(self, judge: RecordedJudge, delay_s: float) -> None:
        self.inner, self.name, self.model, self.delay_s = judge, judge.name, judge.model, delay_s

    def judge(self, conversation: Conversation, questions: Sequence[Question]) -> Judgement:
        time.sleep(self.delay_s)
        return self.inner.judge(conversation, questions)


def test_a_conversation_past_its_deadline_is_unscored_without_waiting_for_the_judge(
    judge, rubric_set, calibrator, conversation
) -> None:
    metrics = ServiceMetrics()
    scorer = ConversationScorer(SlowJudge(judge, 0.8), rubric_set, calibrator, fast_retries(deadline_s=0.2), metrics)

    async def timed() -> tuple[ScoreRecord, float]:  # timed inside the loop: asyncio.run waits for the judge's thread
        started = time.monotonic()
        return await scorer.score(conversation), time.monotonic() - started

    record, took_s = asyncio.run(timed())
    assert took_s < 0.6
    assert record.status == "unscored" and record.unscored_reason.startswith("DeadlinePassed: ")
    assert "scoring.deadline_s=0.2s" in record.unscored_reason
    attrs = {"product": "llm-rubric-demo", "model_version": conversation.attributes["model_version"]}
    assert sample(metrics, "convowatch_conversations_unscored_total", reason="DeadlinePassed", **attrs) == 1


def test_the_deadline_spans_every_retry_and_backoff(judge, rubric_set, calibrator, conversation) -> None:
    """A judge down for good with long backoffs: the deadline, not max_attempts x backoff, bounds the wait."""
    flaky = FlakyJudge(judge, failures=1_000)
    settings = fast_retries(max_attempts=50, retry_initial_s=5.0, retry_max_s=5.0, deadline_s=0.3)
    started = time.monotonic()
    record = score(ConversationScorer(flaky, rubric_set, calibrator, settings, ServiceMetrics()), conversation)
    assert time.monotonic() - started < 1.0
    assert record.status == "unscored" and record.unscored_reason.startswith("DeadlinePassed: ")
    assert flaky.calls >= 1


def test_the_default_scores_several_conversations_at_once_with_a_deadline() -> None:
    defaults = ScoringSettings()
    assert defaults.concurrency > 1 and 0 < defaults.deadline_s <= 3600
