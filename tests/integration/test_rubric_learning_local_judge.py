"""RubricLearner on a Likert `RubricPool` with the packaged Gemma judge (`LocalJudge`), a real model.

The judge is weak (plumbing-grade), but it is a real judge answering real pool
rubrics on real LLM-Rubric conversations: the pool path end to end.
"""

from __future__ import annotations

import numpy as np
import pytest

from scorers.datasets.uss import llm_rubric_labelled, stratified_split
from scorers.judges.local import LocalJudge
from scorers.learning.learner import RubricLearner
from scorers.learning.pool import RubricPool, seed_pool
from scorers.learning.score_cache import ScoreCache
from scorers.rubrics import fit_windows, netsat_matrix
from tests import servers
from tests.data_paths import LLM_RUBRIC


@pytest.fixture(scope="module")
def split():
    return stratified_split(llm_rubric_labelled(LLM_RUBRIC), test_fraction=0.5, seed=0)


def _labels(items) -> np.ndarray:
    return np.array([i.positive for i in items])


def test_a_likert_pool_with_the_local_judge(tmp_path, split):
    """Packaged Gemma 270M (plumbing-grade) rates 3 seed-pool rubrics on the 4 shortest real conversations (pool path)."""
    train, _ = split
    short = sorted(train, key=lambda i: sum(len(t.text) for t in i.conversation.turns))
    items = [i for i in short if i.positive][:2] + [i for i in short if not i.positive][:2]
    full = seed_pool()
    sat = [j for j, r in enumerate(full.rubrics) if r.polarity.value == "sat"][:1]
    dsat = [j for j, r in enumerate(full.rubrics) if r.polarity.value == "dsat"][:2]
    pool: RubricPool = full.subset(sat + dsat)
    judge = LocalJudge(cache_dir=servers.cache_dir())
    with ScoreCache(tmp_path / "scores.sqlite") as cache:
        learner = RubricLearner(n_sat=1, n_dsat=1, precision=0.9, folds=2).fit(pool, items, judge, cache)
    rubric_set = learner.rubric_set_
    assert len(rubric_set.rubrics) == 2 and {r.polarity.value for r in rubric_set.rubrics} == {"sat", "dsat"}
    assert rubric_set.metadata["pool"]["hash"] == pool.content_hash()
    assert rubric_set.metadata["rubric_sources"] == {r.id: pool.rubrics[pool.index(r.id)].source for r in rubric_set.rubrics}
    assert learner.report_.rating.judge_calls > 0 and learner.report_.rating.cache_misses == 4 * 3
    netsats = netsat_matrix(learner.selected_ratings_, rubric_set.polarities)
    assert rubric_set.windows == fit_windows(netsats, _labels(items), 0.9)
