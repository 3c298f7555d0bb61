"""RUBICON rubric selection: choose SAT/DSAT rubrics from a pool by their judge ratings on labelled data.

Input everywhere: a ratings matrix ``R`` (``n_conversations × n_rubrics``,
unsigned judge ratings in [0, 10], column j = rubric j of the pool), boolean
``labels`` (True = satisfied) and the rubrics' ``polarities``. The *signed*
matrix ``S = R · sign`` (DSAT columns negated, as `scorers.rubrics.netsat_matrix`
does) is what sums into NetSAT: the NetSAT of a rubric subset I is
``S[:, I].sum(axis=1)``.

Losses (both normalised so that α means the same for any set size k):

* ``LossC`` (separation) = −(mean NetSAT of positives − mean NetSAT of
  negatives) / (10·k): the class-mean gap per rubric on the 0..10 scale, negated
  so lower is better; in [−1, 1]. (Not 1/gap: that explodes at a zero gap and
  flips sign when the gap is negative.) The empty set has LossC = 0.
* ``LossS`` (sharpness) compares each precision curve with a tanh target on
  its own side of θc, the midpoint of the two class means. On a grid of
  `GRID_POINTS` thresholds t spanning the observed NetSAT range [lo, hi]
  (its 5th..95th percentile, `GRID_TAIL`, so that a precision computed on one
  or two extreme conversations does not dominate; the full range if those
  coincide), with π the share of positives and w = `TANH_WIDTH` · (hi − lo):
  target⁺(t) = π + (1 − π)·tanh((t − θc)/w) for t ≥ θc (positive precision of
  ``NetSAT ≥ t`` should climb from the base rate at θc to 1 within a few w),
  target⁻(t) = (1 − π) + π·tanh((θc − t)/w) for t ≤ θc (likewise for negative
  precision of ``NetSAT ≤ t``). The raw loss is ½·(mean squared shortfall of
  the positive curve + mean squared shortfall of the negative curve), where the
  shortfall is max(0, target − precision): a curve already above its target
  (precision 1 right at θc) is what we want and costs nothing. LossS is the raw
  loss divided by the raw loss of an *uninformative* NetSAT (both precision
  curves flat at the base rates) on the same grid: 0 = both curves meet their
  targets, 1 = no better than no information (a constant NetSAT, and the empty
  set, have LossS = 1; an anti-informative one can exceed 1). Invariant to
  shifting or rescaling NetSAT, so it needs no per-k scaling.

With LossC on the per-rubric 0..10 scale (realistic gaps: 0.05-0.4) and LossS
on the no-information scale (0..1), α = 1 weighs "from no sharpness to full
sharpness" like a per-rubric gap of the whole scale; the default α grid
0, 0.1, 0.3, 1, 3 runs from ignoring sharpness to letting it dominate.

RUBICON (Biyani et al. 2024) fits "tanh curves centred at θc" to the two
precision curves; the half-tanh targets from the base rate, the one-sided
(shortfall) error, the grid over the central range, w = 0.1 of that range and
the no-information normalisation are this module's reading of it, chosen so
that a perfectly separated sample has LossS = 0 and the figures are
comparable across sets and data sets.

Selectors (all return a `Selection`; ``history`` holds the losses of the
growing set after each addition, whatever the method):

* `greedy_select`: Algorithm 1: start empty, repeatedly add the rubric whose
  addition minimises LossC + α·LossS, respecting separate SAT and DSAT
  budgets, until both budgets are filled (the paper fills them; the history
  shows whether late additions helped). Ties go to the lower column index.
* `brute_force_select`: rank rubrics by their individual class-mean gap, take
  the top ``n_sat`` SAT and ``n_dsat`` DSAT.
* `ucb_select`: a UCB bandit per slot (see its docstring): rubrics are arms,
  a pull rates the arm on a random stratified mini-batch, reward = decrease of
  LossC + α·LossS of (current set + arm) versus the current set on that batch.
* `select_alpha`: α by stratified k-fold cross-validation of `greedy_select`.

`to_rubric_set` turns a selection into a fitted `RubricSet` (θ and windows at
precision P on the training ratings) with metadata recording how it was made.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from scorers.errors import UserError
from scorers.learning.pool import RubricPool, to_rubric
from scorers.rubrics import DEFAULT_PRECISION, SCORE_MAX, SCORE_MIN, Polarity, RubricSet, fit_windows

SCORE_SPAN = SCORE_MAX - SCORE_MIN
TANH_WIDTH = 0.1  # tanh width w as a fraction of the observed NetSAT range
GRID_POINTS = 101  # thresholds on which the precision curves are compared with their targets
GRID_TAIL = 0.05  # the grid spans the 5th..95th percentile of NetSAT: precision of the few extreme conversations is noise
DEGENERATE_LOSS_S = 1.0  # LossS of a constant NetSAT (no threshold separates anything)
DEFAULT_ALPHAS: tuple[float, ...] = (0.0, 0.1, 0.3, 1.0, 3.0)
DEFAULT_FOLDS = 5
DEFAULT_BUDGET = 10  # n_SAT = n_DSAT = 10 in the paper


class LearningError(UserError, ValueError):
    """Data that rubric selection cannot learn from (NaN ratings, an empty class, too few examples for the folds, ...)."""


@dataclass(frozen=True)
class Step:
    """One addition to a growing rubric set and the losses of the set after it (on the selection data)."""

    index: int
    polarity: Polarity
    loss_c: float
    loss_s: float
    loss: float  # loss_c + alpha * loss_s


@dataclass(frozen=True)
class Selection:
    """Chosen pool columns in the order they were added.

    ``warnings`` says when a budget exceeded the rubrics available of that
    polarity (all of them were taken). ``metadata`` holds method details
    (for UCB: how many ratings it looked at).
    """

    indices: tuple[int, ...]
    polarities: tuple[Polarity, ...]
    alpha: float
    method: str
    history: tuple[Step, ...]
    warnings: tuple[str, ...] = ()
    metadata: Mapping[str, Any] = field(default_factory=dict)

    @property
    def n_sat(self) -> int:
        return sum(1 for p in self.polarities if p is Polarity.SAT)

    @property
    def n_dsat(self) -> int:
        return sum(1 for p in self.polarities if p is Polarity.DSAT)


@dataclass(frozen=True)
class CvRow:
    """Held-out figures of one α, averaged over the folds (``criterion`` = held-out LossC + LossS; lower is better)."""

    alpha: float
    criterion: float
    criterion_sd: float
    loss_c: float
    loss_s: float
    fold_criteria: tuple[float, ...]


# ---------------------------------------------------------------------------- validation


def _labels(labels: Any, n: int) -> np.ndarray:
    y = np.asarray(labels)
    if y.ndim != 1 or len(y) != n:
        raise LearningError(f"labels: expected {n} labels (one per conversation), got shape {y.shape}")
    if y.dtype != bool:
        if y.dtype.kind not in "iuf" or not np.all((y == 0) | (y == 1)):
            raise LearningError("labels: must be booleans (True = positive) or 0/1")
        y = y.astype(bool)
    n_pos = int(y.sum())
    if n_pos == 0 or n_pos == n:
        missing = "negative" if n_pos else "positive"
        raise LearningError(f"labels: no {missing} conversations ({n_pos} of {n} are positive); selection needs both classes")
    return y


def _polarities(polarities: Sequence[Polarity | str], m: int) -> tuple[Polarity, ...]:
    if len(polarities) != m:
        raise LearningError(f"polarities: expected {m} (one per rubric column), got {len(polarities)}")
    out = []
    for j, p in enumerate(polarities):
        try:
            out.append(Polarity(p))
        except ValueError:
            raise LearningError(f"polarities[{j}]: {p!r} is not 'sat' or 'dsat'") from None
    return tuple(out)


def _prepare(
    ratings: Any, labels: Any, polarities: Sequence[Polarity | str]
) -> tuple[np.ndarray, np.ndarray, tuple[Polarity, ...]]:
    """Validate the inputs; return the signed matrix S, boolean labels and polarities."""
    r = np.asarray(ratings, dtype=float)
    if r.ndim != 2 or r.shape[0] == 0 or r.shape[1] == 0:
        raise LearningError(f"ratings: expected a non-empty (n_conversations, n_rubrics) matrix, got shape {r.shape}")
    bad = np.argwhere(~np.isfinite(r))
    if len(bad):
        i, j = bad[0]
        raise LearningError(f"ratings: {len(bad)} value(s) are NaN or infinite (first at row {i}, column {j}); rate them again")
    out = np.argwhere((r < SCORE_MIN) | (r > SCORE_MAX))
    if len(out):
        i, j = out[0]
        raise LearningError(f"ratings: value {r[i, j]} at row {i}, column {j} is outside [{SCORE_MIN:g}, {SCORE_MAX:g}]")
    y = _labels(labels, r.shape[0])
    pols = _polarities(polarities, r.shape[1])
    signs = np.array([p.sign for p in pols])
    return r * signs, y, pols


def _budgets(pols: Sequence[Polarity], n_sat: int, n_dsat: int) -> tuple[dict[Polarity, int], tuple[str, ...]]:
    warnings = []
    budgets = {}
    for polarity, asked in ((Polarity.SAT, n_sat), (Polarity.DSAT, n_dsat)):
        if isinstance(asked, bool) or not isinstance(asked, (int, np.integer)) or asked < 0:
            raise LearningError(f"n_{polarity.value}: must be an integer >= 0, got {asked!r}")
        available = sum(1 for p in pols if p is polarity)
        if asked > available:
            warnings.append(
                f"asked for {asked} {polarity.value.upper()} rubrics but the pool has {available}: taking all {available}"
            )
        budgets[polarity] = min(int(asked), available)
    if budgets[Polarity.SAT] + budgets[Polarity.DSAT] == 0:
        raise LearningError(f"budgets: nothing to select (n_sat={n_sat}, n_dsat={n_dsat} with the pool's polarities)")
    return budgets, tuple(warnings)


def _alpha(alpha: float) -> float:
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float, np.floating)) or not math.isfinite(alpha) or alpha < 0:
        raise LearningError(f"alpha: must be a finite number >= 0, got {alpha!r}")
    return float(alpha)


# ---------------------------------------------------------------------------- losses


def _loss_c(s: np.ndarray, y: np.ndarray, k: int) -> float:
    if k == 0:
        return 0.0
    return -float(s[y].mean() - s[~y].mean()) / (SCORE_SPAN * k)


def _loss_s(
    s: np.ndarray, y: np.ndarray, theta: float | None = None, width: float = TANH_WIDTH, grid_points: int = GRID_POINTS
) -> float:
    lo, hi = (float(v) for v in np.quantile(s, [GRID_TAIL, 1.0 - GRID_TAIL]))
    spread = hi - lo
    if spread <= 1e-12 * max(1.0, abs(hi)):
        lo, hi = float(s.min()), float(s.max())  # most values tied: fall back to the full range
        spread = hi - lo
    if spread <= 1e-12 * max(1.0, abs(hi)):
        return DEGENERATE_LOSS_S
    if theta is None:
        theta = float((s[y].mean() + s[~y].mean()) / 2.0)
    t = np.linspace(lo, hi, grid_points)
    order = np.sort(s)
    pos, neg = np.sort(s[y]), np.sort(s[~y])
    n_above = len(s) - np.searchsorted(order, t, side="left")
    n_below = np.searchsorted(order, t, side="right")
    pos_above = len(pos) - np.searchsorted(pos, t, side="left")
    neg_below = np.searchsorted(neg, t, side="right")
    pi = len(pos) / len(s)
    w = width * spread
    upper, lower = t >= theta, t <= theta
    parts, reference = [], []
    if upper.any():
        rise = np.tanh((t[upper] - theta) / w)
        precision = pos_above[upper] / np.maximum(n_above[upper], 1)
        parts.append(float(np.mean(np.maximum(pi + (1.0 - pi) * rise - precision, 0.0) ** 2)))
        reference.append(float(np.mean(((1.0 - pi) * rise) ** 2)))  # precision flat at the base rate π
    if lower.any():
        rise = np.tanh((theta - t[lower]) / w)
        precision = neg_below[lower] / np.maximum(n_below[lower], 1)
        parts.append(float(np.mean(np.maximum((1.0 - pi) + pi * rise - precision, 0.0) ** 2)))
        reference.append(float(np.mean((pi * rise) ** 2)))
    uninformative = float(np.mean(reference)) if reference else 0.0
    if uninformative <= 0.0:
        return DEGENERATE_LOSS_S
    return float(np.mean(parts)) / uninformative


def _netsats_labels(netsats: Any, labels: Any) -> tuple[np.ndarray, np.ndarray]:
    s = np.asarray(netsats, dtype=float)
    if s.ndim != 1 or len(s) == 0:
        raise LearningError(f"netsats: expected a non-empty 1-D array, got shape {s.shape}")
    if not np.all(np.isfinite(s)):
        raise LearningError("netsats: must be finite (no NaN)")
    return s, _labels(labels, len(s))


def loss_c(netsats: Any, labels: Any, n_rubrics: int = 1) -> float:
    """Separation loss: −(mean positive − mean negative NetSAT) / (10 · n_rubrics); lower is better, in [−1, 1]."""
    s, y = _netsats_labels(netsats, labels)
    if n_rubrics < 1:
        raise LearningError(f"n_rubrics: must be >= 1, got {n_rubrics}")
    return _loss_c(s, y, n_rubrics)


def loss_s(
    netsats: Any, labels: Any, theta_c: float | None = None, width: float = TANH_WIDTH, grid_points: int = GRID_POINTS
) -> float:
    """Sharpness loss (module docstring): squared shortfall of the precision curves below tanh targets at θc.

    ``theta_c`` defaults to the midpoint of the two class means of ``netsats``;
    pass the training θc when scoring held-out data. ``width`` is the tanh
    width as a fraction of the observed NetSAT range.
    """
    s, y = _netsats_labels(netsats, labels)
    if not (width > 0 and math.isfinite(width)):
        raise LearningError(f"width: must be a finite number > 0, got {width!r}")
    if grid_points < 2:
        raise LearningError(f"grid_points: must be >= 2, got {grid_points}")
    return _loss_s(s, y, theta_c, width, grid_points)


def set_losses(ratings: Any, labels: Any, polarities: Sequence[Polarity | str], indices: Sequence[int]) -> tuple[float, float]:
    """(LossC, LossS) of the rubric subset ``indices`` of a ratings matrix."""
    S, y, _ = _prepare(ratings, labels, polarities)
    idx = list(indices)
    s = S[:, idx].sum(axis=1) if idx else np.zeros(len(y))
    return _loss_c(s, y, len(idx)), _loss_s(s, y)


def separations(ratings: Any, labels: Any, polarities: Sequence[Polarity | str]) -> np.ndarray:
    """Each rubric's own class-mean gap of its signed score (positive = it separates in the right direction)."""
    S, y, _ = _prepare(ratings, labels, polarities)
    return S[y].mean(axis=0) - S[~y].mean(axis=0)


# ---------------------------------------------------------------------------- selectors


def _step(S: np.ndarray, y: np.ndarray, total: np.ndarray, k: int, j: int, pol: Polarity, alpha: float) -> Step:
    lc, ls = _loss_c(total, y, k), _loss_s(total, y)
    return Step(index=j, polarity=pol, loss_c=lc, loss_s=ls, loss=lc + alpha * ls)


def _history(S: np.ndarray, y: np.ndarray, pols: Sequence[Polarity], indices: Sequence[int], alpha: float) -> tuple[Step, ...]:
    total = np.zeros(len(y))
    steps = []
    for k, j in enumerate(indices, start=1):
        total = total + S[:, j]
        steps.append(_step(S, y, total, k, j, pols[j], alpha))
    return tuple(steps)


def _greedy(
    S: np.ndarray, y: np.ndarray, pols: Sequence[Polarity], budgets: Mapping[Polarity, int], alpha: float
) -> tuple[list[int], list[Step]]:
    remaining = dict(budgets)
    chosen: list[int] = []
    steps: list[Step] = []
    total = np.zeros(len(y))
    while any(remaining.values()):
        candidates = [j for j in range(S.shape[1]) if j not in chosen and remaining[pols[j]] > 0]
        if not candidates:
            break
        k = len(chosen) + 1
        best_j, best_loss = -1, math.inf
        for j in candidates:
            s = total + S[:, j]
            value = _loss_c(s, y, k) + (alpha * _loss_s(s, y) if alpha else 0.0)
            if value < best_loss - 1e-12:
                best_j, best_loss = j, value
        chosen.append(best_j)
        remaining[pols[best_j]] -= 1
        total = total + S[:, best_j]
        steps.append(_step(S, y, total, k, best_j, pols[best_j], alpha))
    return chosen, steps


def greedy_select(
    ratings: Any,
    labels: Any,
    polarities: Sequence[Polarity | str],
    n_sat: int = DEFAULT_BUDGET,
    n_dsat: int = DEFAULT_BUDGET,
    alpha: float = 0.0,
) -> Selection:
    """RUBICON Algorithm 1: greedily add the rubric minimising LossC + α·LossS until both budgets are filled."""
    S, y, pols = _prepare(ratings, labels, polarities)
    alpha = _alpha(alpha)
    budgets, warnings = _budgets(pols, n_sat, n_dsat)
    chosen, steps = _greedy(S, y, pols, budgets, alpha)
    return Selection(tuple(chosen), tuple(pols[j] for j in chosen), alpha, "greedy", tuple(steps), warnings)


def brute_force_select(
    ratings: Any,
    labels: Any,
    polarities: Sequence[Polarity | str],
    n_sat: int = DEFAULT_BUDGET,
    n_dsat: int = DEFAULT_BUDGET,
) -> Selection:
    """Rank rubrics by their own class-mean gap (`separations`); take the top ``n_sat`` SAT and ``n_dsat`` DSAT.

    The result lists the picks by decreasing separation (both polarities
    interleaved); the history holds the losses of the growing set with α = 0.
    """
    S, y, pols = _prepare(ratings, labels, polarities)
    budgets, warnings = _budgets(pols, n_sat, n_dsat)
    gaps = S[y].mean(axis=0) - S[~y].mean(axis=0)
    picked: list[int] = []
    for polarity in (Polarity.SAT, Polarity.DSAT):
        columns = [j for j in range(S.shape[1]) if pols[j] is polarity]
        columns.sort(key=lambda j: (-gaps[j], j))
        picked.extend(columns[: budgets[polarity]])
    picked.sort(key=lambda j: (-gaps[j], j))
    steps = _history(S, y, pols, picked, 0.0)
    metadata = {"separations": [float(gaps[j]) for j in picked]}
    return Selection(tuple(picked), tuple(pols[j] for j in picked), 0.0, "brute-force", steps, warnings, metadata)


def _stratified_batch(rng: np.random.Generator, pos: np.ndarray, neg: np.ndarray, batch_size: int) -> np.ndarray:
    half = max(1, batch_size // 2)
    return np.concatenate(
        [rng.choice(pos, min(half, len(pos)), replace=False), rng.choice(neg, min(half, len(neg)), replace=False)]
    )


def ucb_select(
    ratings: Any,
    labels: Any,
    polarities: Sequence[Polarity | str],
    n_sat: int = DEFAULT_BUDGET,
    n_dsat: int = DEFAULT_BUDGET,
    alpha: float = 0.0,
    batch_size: int = 16,
    pulls_per_slot: int | None = None,
    exploration: float = 1.0,
    seed: int = 0,
) -> Selection:
    """Fill the set slot by slot, each slot chosen by a UCB bandit over the eligible rubrics.

    Arms are the rubrics not yet chosen whose polarity still has budget. A pull
    of arm a draws a stratified mini-batch (``batch_size/2`` positives and
    negatives, without replacement) and rewards
    ``L(current set) − L(current set + a)`` on that batch, L = LossC + α·LossS.
    Each arm is pulled once, then the arm maximising
    ``mean reward + exploration · sd · sqrt(2 ln t / pulls)`` (UCB1; ``sd`` is
    the standard deviation of all rewards seen in this slot, which keeps the
    bonus on the reward's scale as the set grows). After ``pulls_per_slot``
    pulls (default 4 × the number of arms) the arm with the highest mean reward
    joins the set. Deterministic for a given ``seed``.

    The bandit only ever looks at mini-batches, so it needs fewer ratings than
    the other selectors when rubrics are rated lazily: ``metadata`` records
    ``ratings_looked_at`` (pulls × batch) and ``distinct_ratings`` (distinct
    (conversation, rubric) cells, the judge cost with a cache).
    """
    S, y, pols = _prepare(ratings, labels, polarities)
    alpha = _alpha(alpha)
    budgets, warnings = _budgets(pols, n_sat, n_dsat)
    if batch_size < 2:
        raise LearningError(f"batch_size: must be >= 2 (one conversation per class), got {batch_size}")
    if pulls_per_slot is not None and pulls_per_slot < 1:
        raise LearningError(f"pulls_per_slot: must be >= 1, got {pulls_per_slot}")
    if not (exploration >= 0 and math.isfinite(exploration)):
        raise LearningError(f"exploration: must be a finite number >= 0, got {exploration!r}")
    rng = np.random.default_rng(seed)
    pos, neg = np.flatnonzero(y), np.flatnonzero(~y)
    remaining = dict(budgets)
    chosen: list[int] = []
    total = np.zeros(len(y))
    seen = np.zeros(S.shape, dtype=bool)
    looked_at = 0

    def batch_loss(s: np.ndarray, yb: np.ndarray, k: int) -> float:
        return _loss_c(s, yb, k) + (alpha * _loss_s(s, yb) if alpha else 0.0)

    while any(remaining.values()):
        arms = [j for j in range(S.shape[1]) if j not in chosen and remaining[pols[j]] > 0]
        if not arms:
            break
        pulls = np.zeros(len(arms))
        sums = np.zeros(len(arms))
        rewards: list[float] = []
        k = len(chosen)
        for t in range(1, (pulls_per_slot or 4 * len(arms)) + 1):
            if t <= len(arms):
                a = t - 1
            else:
                sd = float(np.std(rewards)) if len(rewards) > 1 else 0.0
                bonus = exploration * sd * np.sqrt(2.0 * math.log(t) / pulls)
                a = int(np.argmax(sums / pulls + bonus))
            rows = _stratified_batch(rng, pos, neg, batch_size)
            yb = y[rows]
            j = arms[a]
            before = batch_loss(total[rows], yb, k)
            after = batch_loss(total[rows] + S[rows, j], yb, k + 1)
            reward = before - after
            rewards.append(reward)
            pulls[a] += 1
            sums[a] += reward
            seen[rows, j] = True
            if chosen:
                seen[np.ix_(rows, np.asarray(chosen))] = True
            looked_at += len(rows)
        means = np.where(pulls > 0, sums / np.maximum(pulls, 1), -math.inf)
        best = arms[int(np.argmax(means))]
        chosen.append(best)
        remaining[pols[best]] -= 1
        total = total + S[:, best]
    steps = _history(S, y, pols, chosen, alpha)
    metadata = {"ratings_looked_at": looked_at, "distinct_ratings": int(seen.sum()), "batch_size": batch_size, "seed": seed}
    return Selection(tuple(chosen), tuple(pols[j] for j in chosen), alpha, "ucb", steps, warnings, metadata)


# ---------------------------------------------------------------------------- α by cross-validation


def stratified_folds(labels: Any, folds: int = DEFAULT_FOLDS, seed: int = 0) -> np.ndarray:
    """Fold number (0..folds-1) of each conversation; each class spread evenly over the folds at random."""
    y = np.asarray(labels, dtype=bool)
    if isinstance(folds, bool) or not isinstance(folds, (int, np.integer)) or folds < 2:
        raise LearningError(f"folds: must be an integer >= 2, got {folds!r}")
    for name, count in (("positive", int(y.sum())), ("negative", int((~y).sum()))):
        if count < folds:
            raise LearningError(
                f"labels: {count} {name} conversation(s) is fewer than the {folds} folds; every held-out fold needs both classes"
            )
    rng = np.random.default_rng(seed)
    out = np.empty(len(y), dtype=int)
    for members in (np.flatnonzero(y), np.flatnonzero(~y)):
        shuffled = rng.permutation(members)
        out[shuffled] = np.arange(len(shuffled)) % folds
    return out


def select_alpha(
    ratings: Any,
    labels: Any,
    polarities: Sequence[Polarity | str],
    alphas: Sequence[float] = DEFAULT_ALPHAS,
    folds: int = DEFAULT_FOLDS,
    seed: int = 0,
    n_sat: int = DEFAULT_BUDGET,
    n_dsat: int = DEFAULT_BUDGET,
) -> tuple[float, tuple[CvRow, ...]]:
    """α for `greedy_select` by stratified k-fold CV on the training data; returns (α, one `CvRow` per α).

    For each fold, greedy selection with that α runs on the other folds; the
    chosen set is scored on the held-out fold by LossC + LossS (unit weight,
    whatever α was used in training, so all α are judged by the same yardstick;
    LossS uses the training folds' θc). The α with the lowest mean held-out
    criterion wins; ties go to the smaller α.
    """
    S, y, pols = _prepare(ratings, labels, polarities)
    grid = [_alpha(a) for a in alphas]
    if not grid:
        raise LearningError("alphas: need at least one candidate")
    budgets, _ = _budgets(pols, n_sat, n_dsat)
    fold_of = stratified_folds(y, folds, seed)
    rows = []
    for alpha in grid:
        criteria, lcs, lss = [], [], []
        for f in range(folds):
            train, test = fold_of != f, fold_of == f
            chosen, _ = _greedy(S[train], y[train], pols, budgets, alpha)
            s_train = S[train][:, chosen].sum(axis=1)
            theta = float((s_train[y[train]].mean() + s_train[~y[train]].mean()) / 2.0)
            s_test = S[test][:, chosen].sum(axis=1)
            lc, ls = _loss_c(s_test, y[test], len(chosen)), _loss_s(s_test, y[test], theta)
            criteria.append(lc + ls)
            lcs.append(lc)
            lss.append(ls)
        rows.append(
            CvRow(
                alpha=alpha,
                criterion=float(np.mean(criteria)),
                criterion_sd=float(np.std(criteria)),
                loss_c=float(np.mean(lcs)),
                loss_s=float(np.mean(lss)),
                fold_criteria=tuple(float(c) for c in criteria),
            )
        )
    best = min(rows, key=lambda r: (round(r.criterion, 12), r.alpha))
    return best.alpha, tuple(rows)


# ---------------------------------------------------------------------------- output


def training_data_hash(conversation_keys: Sequence[str], labels: Sequence[bool]) -> str:
    """SHA-256 (16 hex) of the (conversation key, label) pairs, order-free: names the training data in metadata.

    Use `Conversation.content_hash()` (or ids, for recorded judges) as keys.
    """
    if len(conversation_keys) != len(labels):
        raise LearningError(f"training_data_hash: {len(conversation_keys)} keys but {len(labels)} labels")
    lines = sorted(f"{k}\t{int(bool(v))}\n" for k, v in zip(conversation_keys, labels))
    return hashlib.sha256("".join(lines).encode("utf-8")).hexdigest()[:16]


def selection_record(selection: Selection, candidate_ids: Sequence[str]) -> dict[str, Any]:
    """The ``selection`` entry a learned rubric set records: method, α, sizes, each greedy step (by the rubric id of
    its column in ``candidate_ids``), warnings and the method's details."""
    return {
        "method": selection.method,
        "alpha": selection.alpha,
        "n_sat": selection.n_sat,
        "n_dsat": selection.n_dsat,
        "steps": [
            {"rubric": candidate_ids[s.index], "loss_c": s.loss_c, "loss_s": s.loss_s, "loss": s.loss} for s in selection.history
        ],
        "warnings": list(selection.warnings),
        **({"details": dict(selection.metadata)} if selection.metadata else {}),
    }


def to_rubric_set(
    pool: RubricPool,
    selection: Selection,
    ratings_train: Any,
    labels: Any,
    precision: float = DEFAULT_PRECISION,
    *,
    judge: str,
    training_data_hash: str,
    prompt_versions: Mapping[str, str] | None = None,
    metadata: Mapping[str, Any] | None = None,
) -> RubricSet:
    """The selected rubrics as a `RubricSet` with θ and windows fitted at ``precision`` on the training ratings.

    ``ratings_train`` is the pool-wide ratings matrix the selection was made
    on (columns = ``pool.rubrics``). Metadata record the method, α, budgets,
    per-step losses, warnings, the pool's hash, the training data hash, the
    judge and the prompt versions (the pool's, updated by ``prompt_versions``);
    ``metadata`` adds free entries (they cannot replace these).
    """
    S, y, pols = _prepare(ratings_train, labels, pool.polarities)
    if not selection.indices:
        raise LearningError("selection: no rubrics were selected")
    for j, p in zip(selection.indices, selection.polarities):
        if not 0 <= j < len(pool):
            raise LearningError(f"selection: column {j} is outside the pool of {len(pool)} rubrics")
        if pols[j] is not p:
            raise LearningError(
                f"selection: column {j} ({pool.rubrics[j].id!r}) is {pols[j].value} in the pool, {p.value} in the selection"
            )
    idx = list(selection.indices)
    netsats = S[:, idx].sum(axis=1)
    rubrics = tuple(to_rubric(pool.rubrics[j]) for j in idx)
    versions = dict(pool.prompt_versions)
    versions.update(prompt_versions or {})
    recorded = {
        "selection": selection_record(selection, [r.id for r in pool.rubrics]),
        "rubric_sources": {pool.rubrics[j].id: pool.rubrics[j].source for j in idx},
        "pool": {"hash": pool.content_hash(), "size": len(pool), "name": pool.metadata.get("name")},
        "training_data_hash": training_data_hash,
        "n_train": int(len(y)),
        "n_train_positive": int(y.sum()),
        "judge": judge,
        "prompt_versions": versions,
    }
    extra = dict(metadata or {})
    clash = sorted(set(extra) & set(recorded))
    if clash:
        raise LearningError(f"metadata: keys {clash} are recorded by to_rubric_set itself")
    return RubricSet(rubrics, fit_windows(netsats, y, precision), {**extra, **recorded})
