"""Model selection for calibrators: folds by conversation, cross-validation, hyperparameter search.

Beside the estimator as scikit-learn keeps `model_selection` beside its estimators: the network's constructor
only stores parameters, and everything that chooses them lives here.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from scorers import statistics
from scorers.calibration import CalibrationNetwork
from scorers.calibrators import CalibrationError, Calibrator
from scorers.datasets.llm_rubric import Label, RubricData
from scorers.ordinal_calibration import MIN_ADAPTATION_CONVERSATIONS, OrdinalCalibrator

CV_CRITERIA = {"rmse": False, "nll": False, "pearson": True, "spearman": True}  # name -> higher is better


Folds = list[tuple[tuple[str, ...], tuple[str, ...]]]  # [(train_ids, test_ids), ...]


def conversation_folds(text_ids: Iterable[str], k: int, seed: int = 0) -> Folds:
    """Split conversations (not tuples) into ``k`` random folds: ``[(train_ids, test_ids), ...]``."""
    ids = sorted(set(text_ids))
    if k < 2 or k > len(ids):
        raise CalibrationError(f"need 2 <= k <= number of conversations ({len(ids)}), got k={k}")
    order = np.random.default_rng(seed).permutation(len(ids))
    folds = [sorted(ids[i] for i in part) for part in np.array_split(order, k)]
    return [(tuple(t for j, f in enumerate(folds) if j != i for t in f), tuple(folds[i])) for i in range(k)]


def group_folds(text_ids: Iterable[str], group: Callable[[str], str]) -> Folds:
    """Leave-one-group-out folds: each group's conversations are held out together, once.

    A split that imitates a shift (e.g. ``group`` = the dialogue system: every fold tests on an assistant
    variant the model never saw), where random folds test on conversations like the training ones.
    """
    ids = sorted(set(text_ids))
    groups = sorted({group(t) for t in ids})
    if len(groups) < 2:
        raise CalibrationError(f"need at least 2 groups to hold one out, got {groups}")
    return [(tuple(t for t in ids if group(t) != g), tuple(t for t in ids if group(t) == g)) for g in groups]


@dataclass(frozen=True)
class HeldOutPredictions:
    """Out-of-fold predictions of one question: one row per held-out label."""

    question: str
    text_ids: tuple[str, ...]
    judges: tuple[str, ...]
    answers: np.ndarray
    probabilities: np.ndarray
    fold: np.ndarray

    @property
    def expected_value(self) -> np.ndarray:
        return self.probabilities @ np.arange(1, self.probabilities.shape[1] + 1)

    def scores(self) -> dict[str, float]:
        """Agreement of expected values with the answers, plus NLL and one-vs-rest smECE."""
        out = statistics.agreement(self.answers, self.expected_value)
        p = self.probabilities[np.arange(len(self.answers)), self.answers - 1]
        out["nll"] = float(-np.mean(np.log(np.clip(p, 1e-12, None))))
        out["smece"] = statistics.smece_multiclass(self.probabilities, self.answers)
        return out


def predict_labels(model: Calibrator, data: RubricData, question: str | None = None) -> HeldOutPredictions:
    """Predict every label of ``question`` in ``data`` with its own judge's weights."""
    question = question or model.main_question
    labels: Sequence[Label] = data.labels_for(question)
    if not labels:
        raise CalibrationError(f"no labels for {question!r} to predict")
    x = np.stack([np.asarray(data.features[lab.text_id]) for lab in labels])
    pred = model.predict_proba(x, question, [lab.judge for lab in labels])
    return HeldOutPredictions(
        question=question,
        text_ids=tuple(lab.text_id for lab in labels),
        judges=tuple(lab.judge for lab in labels),
        answers=np.array([lab.answer for lab in labels]),
        probabilities=pred.probabilities,
        fold=np.zeros(len(labels), dtype=int),
    )


def cross_validate(
    model: Calibrator,
    data: RubricData,
    k: int = 5,
    seed: int = 0,
    question: str | None = None,
    folds: Folds | None = None,
) -> HeldOutPredictions:
    """Out-of-fold predictions of ``question`` (default: the main question), folds by conversation:
    ``k`` random ones with ``seed``, or the given ``folds`` (e.g. `group_folds`)."""
    question = question or model.main_question
    parts = []
    for i, (train_ids, test_ids) in enumerate(folds if folds is not None else conversation_folds(data.text_ids, k, seed)):
        fitted = model.clone().fit(data.subset(train_ids))
        test = data.subset(test_ids)
        if not test.labels_for(question):
            continue
        held = predict_labels(fitted, test, question)
        parts.append((held, i))
    return HeldOutPredictions(
        question=question,
        text_ids=tuple(t for h, _ in parts for t in h.text_ids),
        judges=tuple(j for h, _ in parts for j in h.judges),
        answers=np.concatenate([h.answers for h, _ in parts]),
        probabilities=np.concatenate([h.probabilities for h, _ in parts]),
        fold=np.concatenate([np.full(len(h.answers), i) for h, i in parts]),
    )


@dataclass(frozen=True)
class HyperparameterSearch:
    """Result of `select_hyperparameters`: the winner and every candidate's CV scores."""

    best_params: dict[str, Any]
    criterion: str
    results: list[dict[str, Any]] = field(default_factory=list)  # {"params": ..., "scores": ...}
    best_scores: dict[str, float] = field(default_factory=dict)


Grid = Mapping[str, Sequence[Any]] | Sequence[Mapping[str, Sequence[Any]]]

# The paper's grid (§4): every (h1, h2) pair in {10, 25, 50, 100}², two batch sizes, two Adam rates.
PAPER_GRID: dict[str, list[Any]] = {
    "h1": [10, 25, 50, 100],
    "h2": [10, 25, 50, 100],
    "batch_size": [32, 64],
    "learning_rate": [1e-3, 3e-3],
}
# A 6-candidate subset for quick runs and CI: the hidden sizes that CV preferred on LLM-Rubric's data.
SMALL_GRID: dict[str, list[Any]] = {"h1": [10, 25, 50], "h2": [25, 50], "learning_rate": [1e-3]}
NAMED_GRIDS: dict[str, dict[str, list[Any]]] = {"paper": PAPER_GRID, "small": SMALL_GRID}


def parameter_grid(grid: Grid) -> list[dict[str, Any]]:
    """All combinations of a ``{name: [values]}`` grid (or of each grid in a list), in a stable order."""
    grids = [grid] if isinstance(grid, Mapping) else list(grid)
    out: list[dict[str, Any]] = []
    for g in grids:
        names = list(g)
        out.extend(dict(zip(names, combo)) for combo in itertools.product(*(g[n] for n in names)))
    return out


def cv_scores(model: Calibrator, data: RubricData, k: int = 5, seed: int = 0, folds: Folds | None = None) -> dict[str, float]:
    """Scores of `cross_validate` (a top-level function so executors can run it in other processes)."""
    return cross_validate(model, data, k=k, seed=seed, folds=folds).scores()


def select_hyperparameters(
    data: RubricData,
    grid: Grid,
    base: Calibrator | None = None,
    k: int = 5,
    seed: int = 0,
    criterion: str = "rmse",
    repeats: int = 1,
    executor: Executor | None = None,
    on_candidate: Callable[[int, int, dict[str, Any], dict[str, float]], None] | None = None,
    folds: Folds | None = None,
) -> HyperparameterSearch:
    """K-fold CV (folds by conversation) over ``grid``; pick the best by ``criterion``.

    ``grid`` is ``{name: [values]}`` or a list of such grids (searched in turn),
    like scikit-learn's ``param_grid``.

    ``criterion`` is one of rmse, nll (lower is better), pearson, spearman
    (higher is better) on the pooled out-of-fold predictions of the main
    question. With ``repeats`` > 1 each candidate is cross-validated with that
    many fold splits and model seeds and its scores are averaged, which makes
    the choice less sensitive to one split's noise. ``folds`` replaces the
    random folds with fixed ones (`group_folds`; ``k`` and the fold seed are
    then unused). ``executor`` (e.g. a
    ``ProcessPoolExecutor``) runs the CV jobs in parallel; results do not
    depend on it. ``on_candidate(i, n, params, scores)`` reports progress.
    """
    if criterion not in CV_CRITERIA:
        raise CalibrationError(f"criterion must be one of {sorted(CV_CRITERIA)}, got {criterion!r}")
    if repeats < 1:
        raise CalibrationError(f"repeats must be >= 1, got {repeats}")
    base = base or CalibrationNetwork()
    base_seed = base.get_params().get("seed")  # a seeded model gets a new seed per repeat; a convex fit has none
    candidates = parameter_grid(grid)
    if not candidates:
        raise CalibrationError("empty hyperparameter grid")
    jobs = [
        (base.clone(**params, **({} if base_seed is None else {"seed": base_seed + r})), seed + r)
        for params in candidates
        for r in range(repeats)
    ]
    if executor is None:
        futures = None
    else:
        futures = [executor.submit(cv_scores, model, data, k, fold_seed, folds) for model, fold_seed in jobs]
    results = []
    for i, params in enumerate(candidates):
        runs = []
        for r in range(repeats):
            j = i * repeats + r
            runs.append(futures[j].result() if futures is not None else cv_scores(jobs[j][0], data, k, jobs[j][1], folds))
        scores = {name: float(np.mean([run[name] for run in runs])) for name in runs[0]}
        results.append({"params": params, "scores": scores})
        if on_candidate is not None:
            on_candidate(i, len(candidates), params, scores)
    sign = -1.0 if CV_CRITERIA[criterion] else 1.0

    def key(r: dict[str, Any]) -> float:
        v = r["scores"][criterion]
        return math.inf if math.isnan(v) else sign * v

    best = min(results, key=key)
    return HyperparameterSearch(
        best_params={**base.get_params(), **best["params"]}, criterion=criterion, results=results, best_scores=best["scores"]
    )


ADAPTATION_STRENGTHS: tuple[float, ...] = (1.0, 10.0, 100.0, 1000.0)


def select_adaptation_strength(
    model: OrdinalCalibrator, data: RubricData, strengths: Sequence[float] = ADAPTATION_STRENGTHS, k: int = 5, seed: int = 0
) -> tuple[float, dict[float, float]]:
    """The strength whose adapted copies best predict held-out labels of ``data`` (k folds by conversation,
    RMSE of the main question), and every strength's RMSE. Only ``data`` is used: a team's own labels."""
    question = model.main_question
    folds = conversation_folds([lab.text_id for lab in data.labels_for(question)], k, seed)
    smallest = min(len(train) for train, _ in folds)
    if smallest < MIN_ADAPTATION_CONVERSATIONS:
        raise CalibrationError(
            f"too few labelled conversations to choose an adaptation strength by {k}-fold CV "
            f"(a fold trains on {smallest}, adapting needs {MIN_ADAPTATION_CONVERSATIONS}); give the strength instead"
        )
    scores = {}
    for strength in strengths:
        errors = []
        for train_ids, test_ids in folds:
            held = predict_labels(model.adapt(data.subset(train_ids), strength), data.subset(test_ids), question)
            errors.append(held.expected_value - held.answers)
        scores[strength] = float(np.sqrt(np.mean(np.concatenate(errors) ** 2)))
    return min(scores, key=lambda s: scores[s]), scores
