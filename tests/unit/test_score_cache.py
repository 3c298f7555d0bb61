"""The judge-answer cache and the ratings matrix, with the real recorded GPT-3.5 judge of the LLM-Rubric release.

The recorded judge answers by question id, and only the LLM-Rubric questions
Q0-Q8 (4 options, Q8 3), so the rubrics here are the release's Q1-Q8
dimension rubrics (`dimension_rubric_set`) rather than Likert pool rubrics;
`rate` takes both kinds. Two real judges stand in where a test needs to show
that the cache was (not) consulted: a recorded judge with an *empty* table
(any question put to it fails) and one whose table holds only some questions.
"""

from __future__ import annotations

import math
import sqlite3

import numpy as np
import pytest

from scorers.datasets.llm_rubric import dimension_rubric_set, load_real_conversations
from scorers.judges import RecordedJudge, load_answer_table
from scorers.judges.base import JudgeReplyError, UnknownConversation
from scorers.learning.pool import PoolRubric
from scorers.learning.score_cache import ScoreCache, ScoreCacheError, judge_identity, question_key, rate
from scorers.rubrics import netsat_matrix
from tests.data_paths import LLM_RUBRIC

REAL_TSV = LLM_RUBRIC / "gpt-3.5-turbo-16k_real_evaluations_FIXED.tsv"


@pytest.fixture(scope="module")
def table():
    return load_answer_table(REAL_TSV)


@pytest.fixture(scope="module")
def judge(table):
    return RecordedJudge(table, model="gpt-3.5-turbo-16k")


@pytest.fixture(scope="module")
def rubric_set():
    return dimension_rubric_set(LLM_RUBRIC / "questions.json")


@pytest.fixture(scope="module")
def conversations():
    texts = load_real_conversations(LLM_RUBRIC / "real_data.json")
    return [texts[k] for k in sorted(texts)[:6]]


def test_first_run_asks_each_conversation_once_and_matches_the_judge(tmp_path, judge, rubric_set, conversations):
    rubrics = rubric_set.rubrics
    seen = []
    with ScoreCache(tmp_path / "cache.sqlite") as cache:
        matrix, stats = rate(judge, rubrics, conversations, cache, progress=lambda done, total: seen.append((done, total)))
        assert len(cache) == len(conversations) * len(rubrics)
    assert matrix.shape == (6, 8)
    assert (stats.cache_hits, stats.cache_misses, stats.judge_requests) == (0, 48, 6)
    assert stats.judge_calls == 0 and stats.prompt_tokens == 0  # the recorded judge reports no calls or tokens
    assert seen == [(i, 6) for i in range(1, 7)]
    for i, conversation in enumerate(conversations):
        judgement = judge.judge(conversation, rubric_set.questions())
        expected = [r.rating(judgement.answers[r.id]) for r in rubrics]
        np.testing.assert_allclose(matrix[i], expected)
    np.testing.assert_allclose(netsat_matrix(matrix, rubric_set.polarities), rubric_set.netsats(judge, conversations))
    assert np.all((matrix >= 0) & (matrix <= 10))


def test_second_run_is_served_from_the_file_without_the_judge(tmp_path, judge, rubric_set, conversations):
    path = tmp_path / "cache.sqlite"
    with ScoreCache(path) as cache:
        first, _ = rate(judge, rubric_set.rubrics, conversations, cache)
    empty = RecordedJudge({}, model="gpt-3.5-turbo-16k")  # same identity, knows nothing: fails if asked anything
    assert judge_identity(empty) == judge_identity(judge)
    with ScoreCache(path) as reopened:
        second, stats = rate(empty, rubric_set.rubrics, conversations, reopened)
    np.testing.assert_array_equal(first, second)
    assert (stats.cache_hits, stats.cache_misses, stats.judge_requests) == (48, 0, 0)
    with ScoreCache(path) as reopened, pytest.raises(UnknownConversation):
        rate(empty, rubric_set.rubrics, conversations, reopened, judge_id="another judge")  # other identity: all misses


def test_only_misses_go_to_the_judge_in_one_call_per_conversation(tmp_path, table, judge, rubric_set, conversations):
    first_half, second_half = rubric_set.rubrics[:4], rubric_set.rubrics[4:]
    wanted = {r.id for r in second_half}
    partial = RecordedJudge({k: v for k, v in table.items() if k[1] in wanted}, model="gpt-3.5-turbo-16k")
    with ScoreCache(tmp_path / "cache.sqlite") as cache:
        rate(judge, first_half, conversations, cache)
        matrix, stats = rate(partial, rubric_set.rubrics, conversations, cache)  # Q1-Q4 cached; partial knows only Q5-Q8
        full, _ = rate(judge, rubric_set.rubrics, conversations, ScoreCache(tmp_path / "fresh.sqlite"))
    assert (stats.cache_hits, stats.cache_misses, stats.judge_requests) == (24, 24, 6)
    np.testing.assert_array_equal(matrix, full)


def test_batch_questions_splits_the_misses(tmp_path, judge, rubric_set, conversations):
    with ScoreCache(tmp_path / "cache.sqlite") as cache:
        _, stats = rate(judge, rubric_set.rubrics, conversations[:2], cache, batch_questions=3)
    assert stats.judge_requests == 2 * math.ceil(8 / 3) and stats.cache_misses == 16
    with ScoreCache(tmp_path / "c2.sqlite") as cache, pytest.raises(ValueError, match="batch_questions must be >= 1"):
        rate(judge, rubric_set.rubrics, conversations, cache, batch_questions=0)


def test_identical_conversations_are_asked_once(tmp_path, judge, rubric_set, conversations):
    twice = [conversations[0], conversations[0]]
    with ScoreCache(tmp_path / "cache.sqlite") as cache:
        matrix, stats = rate(judge, rubric_set.rubrics, twice, cache)
    assert stats.judge_requests == 1 and stats.cache_misses == 8
    np.testing.assert_array_equal(matrix[0], matrix[1])


def test_a_judge_failure_keeps_the_answers_already_paid_for(tmp_path, judge, rubric_set, conversations):
    from scorers.conversation import Conversation, Turn

    unknown = Conversation("not-in-the-release", (Turn("user", "hello"),))
    with ScoreCache(tmp_path / "cache.sqlite") as cache:
        with pytest.raises(UnknownConversation, match="not-in-the-release"):
            rate(judge, rubric_set.rubrics, [*conversations[:3], unknown], cache)
        assert len(cache) == 3 * 8


def test_answers_that_do_not_fit_the_scale_are_refused_and_not_cached(tmp_path, judge, conversations):
    # A Likert pool rubric has 5 options; the recorded judge only has 4 probabilities for Q1.
    likert = PoolRubric("Q1", "The assistant sounds natural.", "sat", "manual")
    with ScoreCache(tmp_path / "cache.sqlite") as cache:
        with pytest.raises(JudgeReplyError, match="answer has 4 probabilities but the scale has 5 options"):
            rate(judge, [likert], conversations[:1], cache)
        assert len(cache) == 0


def test_keys_and_identities(judge, rubric_set):
    q1 = rubric_set.rubrics[0]
    from dataclasses import replace

    assert question_key(q1) == question_key(replace(q1, id="renamed", polarity="dsat"))  # the judge reads neither
    assert question_key(q1) != question_key(replace(q1, text=q1.text + " Really."))
    identity = judge_identity(judge)
    assert identity.startswith("recorded|gpt-3.5-turbo-16k|judge-v")


def test_unusable_cache_files_are_reported(tmp_path, judge, rubric_set, conversations):
    path = tmp_path / "cache.sqlite"
    with ScoreCache(path) as cache:
        rate(judge, rubric_set.rubrics[:1], conversations[:1], cache)
    with sqlite3.connect(path) as db:
        db.execute("UPDATE answers SET probabilities = 'garbage'")
    with ScoreCache(path) as cache, pytest.raises(ScoreCacheError, match="is not a list of numbers"):
        rate(judge, rubric_set.rubrics[:1], conversations[:1], cache)
    (tmp_path / "not-a-db.sqlite").write_text("plain text, not SQLite" * 100)
    with pytest.raises(ScoreCacheError, match="cannot open the score cache"):
        ScoreCache(tmp_path / "not-a-db.sqlite")


def test_a_grammar_constrained_multi_question_judge_has_its_own_identity() -> None:
    from scorers.judges.openai_http import OpenAIJudge

    def identity(**kw: object) -> str:
        return judge_identity(OpenAIJudge(base_url="http://127.0.0.1:1/v1", model="m", **kw))

    assert identity(questions_per_call=5, answer_format="grammar") != identity(questions_per_call=5)
    assert identity(questions_per_call=5, answer_format="grammar").endswith("|qpc=5|multi-v3|fmt=grammar")
    assert identity(questions_per_call=5).endswith("|qpc=5|multi-v3")  # the multi-question prompt's version keys it
    assert identity(answer_format="grammar") == identity()  # one question per call: the format is not used


def test_answer_all_gives_plain_questions_answers_by_id_and_reuses_them(tmp_path, judge, table, conversations):
    """A calibrator's questions (Q0 with its own options, not a rubric): answered once, then from the cache."""
    from scorers.learning.score_cache import answer_all
    from scorers.questions import load_questions

    questions = [q for qid, q in load_questions(LLM_RUBRIC / "questions.json").items() if qid in ("Q0", "Q8")]
    path = tmp_path / "cache.sqlite"
    with ScoreCache(path) as cache:
        first = answer_all(judge, questions, conversations, cache)
    assert (first.stats.cache_misses, first.stats.judge_requests, first.stats.rubrics) == (12, 6, 2)
    for found, conversation in zip(first.by_conversation, conversations):
        assert found == {q.id: table[(conversation.id, q.id)][: len(q.option_keys)] for q in questions}
    empty = RecordedJudge({}, model="gpt-3.5-turbo-16k")  # same identity, answers nothing: any miss would fail
    with ScoreCache(path) as cache:
        again = answer_all(empty, questions, conversations, cache)
    assert again.by_conversation == first.by_conversation and again.stats.cache_hits == 12


def test_answer_all_refuses_an_answer_with_the_wrong_number_of_options(tmp_path, conversations):
    """A judge whose reply does not fit the question's options. The recorded judge refuses such answers itself and
    the real servers' replies are parsed per option, so a scripted judge stands in for a broken backend."""
    from scorers.judges.base import Answer, Judgement, Provenance
    from scorers.learning.score_cache import answer_all
    from scorers.questions import Question

    class TwoProbabilities:
        name = "scripted"

        def judge(self, conversation, questions):
            answers = {q.id: Answer(q.id, (0.5, 0.5)) for q in questions}
            return Judgement(conversation_id=conversation.id, answers=answers, provenance=Provenance(judge=self.name, model=""))

    three = Question(id="Q0", text="Overall?", option_keys=("1", "2", "3"), option_labels=("bad", "ok", "good"))
    with ScoreCache(tmp_path / "cache.sqlite") as cache:
        with pytest.raises(JudgeReplyError, match="answer has 2 probabilities but the question has 3 options"):
            answer_all(TwoProbabilities(), [three], conversations[:1], cache)
        assert len(cache) == 0
