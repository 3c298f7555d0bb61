"""RubricLearner end to end on real data with real judges.

Main data: the 223 real LLM-Rubric conversations labelled by their human
judges' mean Q0 (`llm_rubric_labelled`), split 50/50 per class, and the
recorded GPT-3.5 judge replaying the release's answer distributions. That
judge only knows the release's questions, so the candidate rubrics are Q1-Q8
on their own 1-4 scales (`dimension_rubric_set`), all SAT. A Likert
`RubricPool` with the packaged Gemma judge is in
tests/integration/test_rubric_learning_local_judge.py.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from scorers.conversation import Conversation
from scorers.datasets.labelled import LabelledConversation
from scorers.datasets.llm_rubric import dimension_rubric_set
from scorers.datasets.uss import llm_rubric_labelled, stratified_split
from scorers.judges import RecordedJudge, load_answer_table
from scorers.judges.prompt import PROMPT_VERSION
from scorers.learning.learner import PLOT_FILE, REPORT_FILE, RubricLearner, score_labelled, write_report
from scorers.learning.score_cache import ScoreCache, judge_identity
from scorers.learning.selection import DEFAULT_ALPHAS, LearningError, separations, training_data_hash
from scorers.rubrics import RubricSet, evaluate, fit_windows
from tests.data_paths import LLM_RUBRIC

MODEL = "gpt-3.5-turbo-16k"
PRECISION = 0.75  # Q1-Q8 separate weakly; at 0.9 the training data hold no window on one side


@pytest.fixture(scope="module")
def table():
    return load_answer_table(LLM_RUBRIC / "gpt-3.5-turbo-16k_real_evaluations_FIXED.tsv")


@pytest.fixture(scope="module")
def judge(table) -> RecordedJudge:
    return RecordedJudge(table, model=MODEL)


@pytest.fixture(scope="module")
def candidates():
    return dimension_rubric_set(LLM_RUBRIC / "questions.json").rubrics


@pytest.fixture(scope="module")
def split():
    return stratified_split(llm_rubric_labelled(LLM_RUBRIC), test_fraction=0.5, seed=0)


@pytest.fixture(scope="module")
def fitted(tmp_path_factory, judge, candidates, split):
    train, _ = split
    cache = ScoreCache(tmp_path_factory.mktemp("cache") / "scores.sqlite")
    calls: list[tuple[str, int, int]] = []
    learner = RubricLearner(n_sat=3, n_dsat=0, precision=PRECISION, seed=0)
    learner.fit(candidates, train, judge, cache, progress=lambda *a: calls.append(a))
    yield learner, cache, calls
    cache.close()


def _labels(items) -> np.ndarray:
    return np.array([i.positive for i in items])


def test_fit_learns_a_valid_rubric_set_with_windows_at_precision(fitted, judge, split, tmp_path):
    learner, _, _ = fitted
    train, _ = split
    rubric_set = learner.rubric_set_
    y = _labels(train)
    assert len(rubric_set.rubrics) == 3 and all(r.id in {f"Q{i}" for i in range(1, 9)} for r in rubric_set.rubrics)
    # Recompute NetSAT straight from the judge (no cache): θ and windows are the ones fit_windows gives at P.
    netsats = rubric_set.netsats(judge, [i.conversation for i in train])
    assert rubric_set.windows == fit_windows(netsats, y, PRECISION)
    w = rubric_set.windows
    assert w.dsat_upper is not None and w.sat_lower is not None, "both windows exist at this P on this data"
    assert np.mean(y[netsats >= w.sat_lower]) >= PRECISION
    assert np.mean(~y[netsats <= w.dsat_upper]) >= PRECISION
    assert learner.report_.training == evaluate(netsats, y, rubric_set)
    path = tmp_path / "learned.json"
    rubric_set.save(path)
    loaded = RubricSet.load(path)
    assert loaded.version == rubric_set.version and loaded.rubrics == rubric_set.rubrics  # 1-4 scales survive the file


def test_metadata_records_how_the_set_was_made(fitted, judge, candidates, split):
    learner, _, _ = fitted
    train, _ = split
    meta = learner.rubric_set_.metadata
    assert meta["selection"]["method"] == "greedy"
    assert meta["selection"]["alpha"] == learner.report_.alpha and learner.report_.alpha in DEFAULT_ALPHAS
    assert meta["training_data_hash"] == training_data_hash([i.conversation.content_hash() for i in train], list(_labels(train)))
    assert meta["judge"] == judge_identity(judge) == f"recorded|{MODEL}|{PROMPT_VERSION}"
    assert meta["prompt_versions"] == {"judge": PROMPT_VERSION}
    assert meta["pool"]["size"] == 8 and len(meta["pool"]["hash"]) == 16
    assert meta["learner"]["precision"] == PRECISION and meta["learner"]["folds"] == 5
    assert [row["alpha"] for row in meta["learner"]["alpha_cv"]] == list(DEFAULT_ALPHAS)


def test_report_lists_selected_rubrics_with_their_own_separation(fitted, candidates, split):
    learner, _, calls = fitted
    train, _ = split
    report = learner.report_
    gaps = separations(learner.ratings_.matrix, _labels(train), [r.polarity for r in candidates])
    assert [s.id for s in report.selected] == [r.id for r in learner.rubric_set_.rubrics]
    for s in report.selected:
        assert s.separation == pytest.approx(gaps[[r.id for r in candidates].index(s.id)])
    assert report.pool_separations.keys() == {r.id for r in candidates}
    # Greedy at α from CV starts with the rubric whose own gap is largest (LossC of one rubric is its gap).
    assert report.selected[0].separation == pytest.approx(max(report.pool_separations.values()))
    assert len(report.alpha_cv) == len(DEFAULT_ALPHAS)
    assert report.rating.conversations == len(train) and report.rating.cache_misses == len(train) * 8
    assert report.n_train == len(train) and report.n_positive == int(_labels(train).sum())
    assert ("rating", len(train), len(train)) in calls and ("selection", 1, 1) in calls


def test_a_second_fit_is_served_from_the_cache(fitted, candidates, split):
    learner, cache, _ = fitted
    train, _ = split
    knows_nothing = RecordedJudge({}, model=MODEL)  # same identity; raises if the learner asks it anything
    again = RubricLearner(n_sat=3, n_dsat=0, precision=PRECISION, seed=0).fit(candidates, train, knows_nothing, cache)
    assert again.rubric_set_.version == learner.rubric_set_.version
    assert again.report_.rating.judge_requests == 0 and again.report_.rating.cache_hits == len(train) * 8


def test_evaluate_on_the_held_out_split_matches_direct_scoring(fitted, judge, split):
    learner, cache, _ = fitted
    _, test = split
    metrics = learner.evaluate(learner.rubric_set_, test, judge, cache)
    netsats = learner.rubric_set_.netsats(judge, [i.conversation for i in test])
    assert metrics == evaluate(netsats, _labels(test), learner.rubric_set_)
    assert metrics.n == len(test)
    scored = score_labelled(learner.rubric_set_, test, judge, cache)
    np.testing.assert_allclose(scored.netsats, netsats)
    assert scored.ratings.stats.judge_requests == 0  # the evaluate call above cached every answer


@pytest.mark.parametrize("method", ["brute_force", "ucb"])
def test_baseline_methods(method, fitted, candidates, split):
    _, cache, _ = fitted
    train, _ = split
    learner = RubricLearner(n_sat=3, n_dsat=0, precision=PRECISION, method=method).fit(
        candidates, train, RecordedJudge({}, model=MODEL), cache
    )
    meta = learner.rubric_set_.metadata
    assert len(learner.rubric_set_.rubrics) == 3
    if method == "brute_force":
        assert meta["selection"]["method"] == "brute-force" and learner.report_.alpha_cv == ()
        top3 = sorted(learner.report_.pool_separations, key=lambda k: -learner.report_.pool_separations[k])[:3]
        assert {r.id for r in learner.rubric_set_.rubrics} == set(top3)
    else:
        assert meta["selection"]["method"] == "ucb" and len(learner.report_.alpha_cv) == len(DEFAULT_ALPHAS)
        assert meta["selection"]["details"]["distinct_ratings"] > 0


def test_budget_beyond_the_pool_is_a_warning(fitted, candidates, split):
    _, cache, _ = fitted
    train, _ = split
    learner = RubricLearner(n_sat=3, n_dsat=2, precision=PRECISION).fit(candidates, train, RecordedJudge({}, model=MODEL), cache)
    assert any("DSAT" in w and "has 0" in w for w in learner.report_.warnings)


def test_write_report_files(fitted, tmp_path):
    learner, _, _ = fitted
    paths = write_report(learner.report_, learner.rubric_set_, learner.selected_ratings_, learner.labels_, tmp_path / "report")
    assert paths["report"] == tmp_path / "report" / REPORT_FILE and paths["plot"] == tmp_path / "report" / PLOT_FILE
    doc = json.loads(paths["report"].read_text())
    assert [s["id"] for s in doc["selected"]] == [r.id for r in learner.rubric_set_.rubrics]
    assert doc["rubric_set"]["version"] == learner.rubric_set_.version and doc["precision"] == PRECISION
    assert len(doc["alpha_cv"]) == len(DEFAULT_ALPHAS) and "judge_calls" in doc["rating"]
    png = paths["plot"].read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000


# ---------------------------------------------------------------------------- bad data, refused before any judge call


def _refuses(learner: RubricLearner, items, match: str, candidates, tmp_path) -> None:
    with ScoreCache(tmp_path / "empty.sqlite") as cache, pytest.raises(LearningError, match=match):
        learner.fit(candidates, items, RecordedJudge({}, model=MODEL), cache)  # this judge fails if asked anything


def test_empty_class_is_refused(candidates, split, tmp_path):
    positives = [i for i in split[0] if i.positive]
    _refuses(RubricLearner(), positives, r"no negative conversations \(\d+ positive, 0 negative\)", candidates, tmp_path)


def test_fewer_examples_per_class_than_folds_is_refused(candidates, split, tmp_path):
    train, _ = split
    items = [i for i in train if i.positive][:10] + [i for i in train if not i.positive][:4]
    _refuses(RubricLearner(folds=5), items, "10 positive and 4 negative.*folds=5", candidates, tmp_path)
    # brute force does no cross-validation, so 4 negatives are enough
    with ScoreCache(tmp_path / "c.sqlite") as cache:
        RubricLearner(n_sat=2, n_dsat=0, method="brute_force").fit(
            candidates,
            items,
            RecordedJudge(load_answer_table(LLM_RUBRIC / "gpt-3.5-turbo-16k_real_evaluations_FIXED.tsv"), model=MODEL),
            cache,
        )


def test_conversations_without_text_or_with_duplicate_ids_are_refused(candidates, split, tmp_path):
    train, _ = split
    blank = [LabelledConversation(Conversation(i.conversation.id, ()), i.positive) for i in train]
    _refuses(RubricLearner(), blank, "has no turns", candidates, tmp_path)
    _refuses(RubricLearner(), train + train[:1], "duplicate conversation id", candidates, tmp_path)


def test_bad_settings_are_refused(candidates, split, tmp_path):
    train, _ = split
    _refuses(RubricLearner(method="random"), train, "method", candidates, tmp_path)
    _refuses(RubricLearner(n_sat=0, n_dsat=0), train, "nothing to select", candidates, tmp_path)
    _refuses(RubricLearner(precision=0.3), train, "precision", candidates, tmp_path)
    _refuses(RubricLearner(folds=1), train, "folds", candidates, tmp_path)
