"""RUBICON selection on synthetic score matrices whose right answer is known by construction."""

from __future__ import annotations

import math

import numpy as np
import pytest

from scorers.learning.pool import PoolRubric, RubricPool
from scorers.learning.selection import (
    DEFAULT_ALPHAS,
    LearningError,
    brute_force_select,
    greedy_select,
    loss_c,
    loss_s,
    select_alpha,
    separations,
    set_losses,
    stratified_folds,
    to_rubric_set,
    training_data_hash,
    ucb_select,
)
from scorers.rubrics import Polarity, RubricSet, evaluate, fit_windows, netsat_matrix

N = 160
INFORMATIVE = {3: "sat", 11: "sat", 17: "dsat"}  # column -> polarity of the rubrics that carry signal


def _labels(n: int = N) -> np.ndarray:
    return np.arange(n) % 2 == 0


def _noise_with_signal(seed: int = 0, n: int = N) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """20 noise rubrics (10 SAT, 10 DSAT) plus 3 informative ones at known columns."""
    rng = np.random.default_rng(seed)
    y = _labels(n)
    m = 23
    polarities = ["sat"] * 12 + ["dsat"] * 11
    R = rng.normal(5.0, 2.0, (n, m))
    shift = np.where(y, 1.8, -1.8)
    for j, polarity in INFORMATIVE.items():
        R[:, j] += shift if polarity == "sat" else -shift
    return np.clip(R, 0.0, 10.0), y, polarities


def _wide_vs_sharp(seed: int = 0, n: int = N) -> tuple[np.ndarray, np.ndarray]:
    """Column 0: larger class-mean gap but heavily overlapping classes; column 1: smaller gap, no overlap."""
    rng = np.random.default_rng(seed)
    y = _labels(n)

    def bimodal(p_high: float, size: int) -> np.ndarray:  # exactly a share p_high in 8..10, the rest in 0..2
        high = rng.permutation(np.arange(size) < round(p_high * size))
        return np.where(high, rng.uniform(8, 10, size), rng.uniform(0, 2, size))

    wide = np.empty(n)
    wide[y], wide[~y] = bimodal(0.55, int(y.sum())), bimodal(0.12, int((~y).sum()))
    sharp = np.where(y, rng.uniform(6.5, 7.5, n), rng.uniform(3.5, 4.5, n))
    return np.column_stack([wide, sharp]), y


# ---------------------------------------------------------------------------- losses


def test_loss_c_is_the_negated_per_rubric_gap_on_the_ten_point_scale():
    netsats = np.array([10.0, 8.0, 2.0, 0.0])
    labels = np.array([True, True, False, False])
    assert loss_c(netsats, labels) == pytest.approx(-0.8)
    assert loss_c(netsats, labels, n_rubrics=2) == pytest.approx(-0.4)
    assert loss_c(netsats[::-1], labels) == pytest.approx(0.8)  # wrong direction: positive loss


def test_loss_s_is_zero_when_separated_one_when_constant_and_scale_free():
    y = _labels()
    rng = np.random.default_rng(1)
    separated = np.where(y, rng.uniform(6, 9, N), rng.uniform(1, 4, N))
    assert loss_s(separated, y) == 0.0
    assert loss_s(np.full(N, 3.0), y) == 1.0
    overlapping = np.where(y, rng.normal(6, 3, N), rng.normal(4, 3, N))
    value = loss_s(overlapping, y)
    assert 0.05 < value < 1.0
    assert loss_s(overlapping * 4.0 - 7.0, y) == pytest.approx(value)  # invariant to shifting and rescaling NetSAT
    assert loss_s(-overlapping, y) > 1.0  # anti-informative: worse than no information


def test_loss_s_around_one_for_uninformative_scores():
    values = []
    for seed in range(10):
        rng = np.random.default_rng(seed)
        values.append(loss_s(rng.uniform(0, 10, 400), _labels(400)))
    assert 0.6 < float(np.mean(values)) < 1.4


def test_loss_s_uses_the_given_theta():
    y = _labels()
    rng = np.random.default_rng(2)
    s = np.where(y, rng.uniform(6, 9, N), rng.uniform(1, 4, N))
    assert loss_s(s, y, theta_c=5.0) == 0.0
    assert loss_s(s, y, theta_c=1.5) > 0.0  # θ inside the negatives: negative precision cannot climb in time


def test_set_losses_and_separations_agree_with_the_definitions():
    R, y, pols = _noise_with_signal()
    gaps = separations(R, y, pols)
    assert set(np.argsort(-gaps)[:3]) == set(INFORMATIVE)
    lc, ls = set_losses(R, y, pols, [3, 17])
    netsats = netsat_matrix(R[:, [3, 17]], [pols[3], pols[17]])
    assert lc == pytest.approx(loss_c(netsats, y, n_rubrics=2))
    assert ls == pytest.approx(loss_s(netsats, y))
    assert set_losses(R, y, pols, []) == (0.0, 1.0)


# ---------------------------------------------------------------------------- selectors


@pytest.mark.parametrize("alpha", [0.0, 0.3, 3.0])
def test_greedy_picks_the_informative_rubrics_among_noise(alpha):
    R, y, pols = _noise_with_signal()
    selection = greedy_select(R, y, pols, n_sat=2, n_dsat=1, alpha=alpha)
    assert set(selection.indices) == set(INFORMATIVE)
    assert selection.polarities == tuple(Polarity(pols[j]) for j in selection.indices)
    assert (selection.n_sat, selection.n_dsat) == (2, 1)
    assert selection.method == "greedy" and selection.alpha == alpha and selection.warnings == ()
    assert [s.index for s in selection.history] == list(selection.indices)
    for step in selection.history:
        assert step.loss == pytest.approx(step.loss_c + alpha * step.loss_s)


def test_greedy_fills_the_budgets_informative_rubrics_first():
    R, y, pols = _noise_with_signal(seed=3)
    selection = greedy_select(R, y, pols, n_sat=5, n_dsat=5, alpha=0.3)
    assert len(selection.indices) == 10 and len(set(selection.indices)) == 10
    assert (selection.n_sat, selection.n_dsat) == (5, 5)
    assert set(selection.indices[:3]) == set(INFORMATIVE)
    # noise additions dilute the per-rubric gap: the loss rises once the signal is used up
    assert selection.history[-1].loss > selection.history[2].loss


def test_brute_force_picks_the_informative_rubrics_by_their_own_separation():
    R, y, pols = _noise_with_signal(seed=4)
    selection = brute_force_select(R, y, pols, n_sat=2, n_dsat=1)
    assert set(selection.indices) == set(INFORMATIVE)
    gaps = selection.metadata["separations"]
    assert gaps == sorted(gaps, reverse=True) and min(gaps) > 2.0


def test_sharpness_term_prefers_the_sharp_rubric_over_the_wide_overlapping_one():
    R, y = _wide_vs_sharp()
    pols = ["sat", "sat"]
    wide_c, wide_s = set_losses(R, y, pols, [0])
    sharp_c, sharp_s = set_losses(R, y, pols, [1])
    assert wide_c < sharp_c  # the wide rubric separates the class means more
    assert sharp_s == 0.0 < wide_s  # but only the sharp one gives clean precision curves
    assert greedy_select(R, y, pols, n_sat=1, n_dsat=0, alpha=0.0).indices == (0,)
    for alpha in (0.3, 1.0, 3.0):
        assert greedy_select(R, y, pols, n_sat=1, n_dsat=0, alpha=alpha).indices == (1,)
    # brute force ranks by the gap alone, so it keeps the wide one
    assert brute_force_select(R, y, pols, n_sat=1, n_dsat=0).indices == (0,)


def test_ucb_finds_the_informative_arms_from_mini_batches():
    R, y, pols = _noise_with_signal(seed=5)
    selection = ucb_select(R, y, pols, n_sat=2, n_dsat=1, batch_size=16, seed=7)
    assert set(selection.indices) == set(INFORMATIVE)
    assert selection.method == "ucb"
    assert 0 < selection.metadata["distinct_ratings"] < R.size  # it never needed the whole matrix
    again = ucb_select(R, y, pols, n_sat=2, n_dsat=1, batch_size=16, seed=7)
    assert again.indices == selection.indices and again.metadata == selection.metadata


def test_select_alpha_returns_a_grid_value_and_one_row_per_alpha():
    R, y, pols = _noise_with_signal(seed=6)
    alpha, table = select_alpha(R, y, pols, n_sat=3, n_dsat=3, folds=5, seed=0)
    assert alpha in DEFAULT_ALPHAS
    assert [row.alpha for row in table] == list(DEFAULT_ALPHAS)
    for row in table:
        assert len(row.fold_criteria) == 5
        assert row.criterion == pytest.approx(float(np.mean(row.fold_criteria)))
        assert row.criterion == pytest.approx(row.loss_c + row.loss_s)
    assert min(table, key=lambda r: r.criterion).criterion == next(r.criterion for r in table if r.alpha == alpha)


def test_select_alpha_chooses_sharpness_when_held_out_data_reward_it():
    R, y = _wide_vs_sharp(seed=1, n=200)
    alpha, table = select_alpha(R, y, ["sat", "sat"], n_sat=1, n_dsat=0, seed=0)
    assert alpha > 0.0
    by_alpha = {row.alpha: row for row in table}
    assert by_alpha[0.0].criterion > by_alpha[alpha].criterion


def test_stratified_folds_spread_each_class_evenly():
    y = _labels(53)
    folds = stratified_folds(y, 5, seed=3)
    for f in range(5):
        assert 5 <= int(np.sum(y & (folds == f))) <= 6
        assert 5 <= int(np.sum(~y & (folds == f))) <= 6
    assert not np.array_equal(folds, stratified_folds(y, 5, seed=4))


# ---------------------------------------------------------------------------- errors


def test_nan_and_out_of_range_ratings_are_refused_with_their_position():
    R, y, pols = _noise_with_signal()
    R[7, 4] = math.nan
    with pytest.raises(LearningError, match=r"NaN or infinite \(first at row 7, column 4\)"):
        greedy_select(R, y, pols)
    R[7, 4] = 11.0
    with pytest.raises(LearningError, match="value 11.0 at row 7, column 4 is outside"):
        brute_force_select(R, y, pols)


def test_an_empty_class_is_refused():
    R, _, pols = _noise_with_signal()
    with pytest.raises(LearningError, match=r"no negative conversations \(160 of 160 are positive\)"):
        greedy_select(R, np.ones(N, bool), pols)
    with pytest.raises(LearningError, match="no positive conversations"):
        ucb_select(R, np.zeros(N, bool), pols)


def test_fewer_examples_per_class_than_folds_is_refused():
    R, y, pols = _noise_with_signal()
    y = np.zeros(N, bool)
    y[:4] = True
    with pytest.raises(LearningError, match=r"4 positive conversation\(s\) is fewer than the 5 folds"):
        select_alpha(R, y, pols, folds=5)
    with pytest.raises(LearningError, match="folds: must be an integer >= 2"):
        stratified_folds(_labels(), 1)


def test_budgets_beyond_the_pool_take_what_exists_and_warn():
    R, y, pols = _noise_with_signal()
    selection = greedy_select(R, y, pols, n_sat=20, n_dsat=2)
    assert selection.n_sat == 12 and selection.n_dsat == 2
    assert selection.warnings == ("asked for 20 SAT rubrics but the pool has 12: taking all 12",)
    with pytest.raises(LearningError, match="nothing to select"):
        greedy_select(R, y, pols, n_sat=0, n_dsat=0)
    with pytest.raises(LearningError, match="n_sat: must be an integer >= 0"):
        greedy_select(R, y, pols, n_sat=-1)


def test_malformed_inputs_are_refused():
    R, y, pols = _noise_with_signal()
    with pytest.raises(LearningError, match="expected 23 \\(one per rubric column\\), got 2"):
        greedy_select(R, y, ["sat", "dsat"])
    with pytest.raises(LearningError, match=r"polarities\[0\]: 'good' is not"):
        greedy_select(R, y, ["good"] + pols[1:])
    with pytest.raises(LearningError, match="expected 160 labels"):
        greedy_select(R, y[:10], pols)
    with pytest.raises(LearningError, match="labels: must be booleans"):
        greedy_select(R, np.where(y, 2, 0), pols)
    with pytest.raises(LearningError, match="non-empty \\(n_conversations, n_rubrics\\) matrix"):
        greedy_select(np.zeros((0, 3)), [], ["sat"] * 3)
    with pytest.raises(LearningError, match="alpha: must be a finite number >= 0"):
        greedy_select(R, y, pols, alpha=-0.1)
    with pytest.raises(LearningError, match="alphas: need at least one"):
        select_alpha(R, y, pols, alphas=())
    with pytest.raises(LearningError, match="batch_size: must be >= 2"):
        ucb_select(R, y, pols, batch_size=1)


# ---------------------------------------------------------------------------- rubric sets


def _pool_for(pols: list[str]) -> RubricPool:
    return RubricPool(
        tuple(PoolRubric(f"gen.{p}.{j:03d}", f"Synthetic assertion number {j}.", p, "generated") for j, p in enumerate(pols)),
        prompt_versions={"summarise": "summarise-v1"},
        metadata={"name": "synthetic"},
    )


def test_to_rubric_set_fits_windows_and_records_how_it_was_made(tmp_path):
    R, y, pols = _noise_with_signal(seed=8)
    pool = _pool_for(pols)
    selection = greedy_select(R, y, pols, n_sat=2, n_dsat=1, alpha=0.3)
    data_hash = training_data_hash([f"c{i}" for i in range(N)], list(y))
    rubric_set = to_rubric_set(
        pool,
        selection,
        R,
        y,
        precision=0.9,
        judge="recorded|gpt|judge-v1",
        training_data_hash=data_hash,
        prompt_versions={"extract": "extract-v2"},
        metadata={"domain": "synthetic"},
    )
    assert [r.id for r in rubric_set.rubrics] == [pool.rubrics[j].id for j in selection.indices]
    netsats = netsat_matrix(R[:, list(selection.indices)], rubric_set.polarities)
    assert rubric_set.windows == fit_windows(netsats, y, 0.9)
    metrics = evaluate(netsats, y, rubric_set)
    assert metrics.yield_rate > 0.3 and metrics.confident_accuracy >= 0.9  # windows hold precision P on their data
    meta = rubric_set.metadata
    assert meta["selection"]["method"] == "greedy" and meta["selection"]["alpha"] == 0.3
    assert [s["rubric"] for s in meta["selection"]["steps"]] == [r.id for r in rubric_set.rubrics]
    assert meta["training_data_hash"] == data_hash and meta["judge"] == "recorded|gpt|judge-v1"
    assert meta["prompt_versions"] == {"summarise": "summarise-v1", "extract": "extract-v2"}
    assert meta["pool"] == {"hash": pool.content_hash(), "size": 23, "name": "synthetic"}
    assert meta["n_train"] == N and meta["n_train_positive"] == N // 2 and meta["domain"] == "synthetic"
    path = tmp_path / "learned.json"
    rubric_set.save(path)
    assert RubricSet.load(path).version == rubric_set.version


def test_to_rubric_set_refuses_a_selection_that_does_not_match_the_pool():
    R, y, pols = _noise_with_signal()
    pool = _pool_for(pols)
    selection = greedy_select(R, y, pols, n_sat=1, n_dsat=1)
    flipped = _pool_for(["dsat" if p == "sat" else "sat" for p in pols])
    with pytest.raises(
        LearningError, match="is dsat in the pool, sat in the selection|is sat in the pool, dsat in the selection"
    ):
        to_rubric_set(flipped, selection, R, y, judge="j", training_data_hash="h")
    with pytest.raises(LearningError, match="recorded by to_rubric_set itself"):
        to_rubric_set(pool, selection, R, y, judge="j", training_data_hash="h", metadata={"judge": "other"})


def test_training_data_hash_is_order_free_and_label_sensitive():
    keys, labels = ["a", "b", "c"], [True, False, True]
    h = training_data_hash(keys, labels)
    assert h == training_data_hash(keys[::-1], labels[::-1])
    assert h != training_data_hash(keys, [True, True, True])
    with pytest.raises(LearningError, match="3 keys but 2 labels"):
        training_data_hash(keys, labels[:2])
