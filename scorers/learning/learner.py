"""RUBICON learning as one estimator: rate a rubric pool once, choose α, select, fit θ and windows, report.

`RubricLearner` is scikit-learn-like: hyperparameters in the constructor,
`fit` learns from labelled conversations and leaves its results in attributes
ending in ``_``:

* ``rubric_set_`` — the learned `RubricSet` (θ and windows at precision P on
  the training NetSATs), with metadata recording how it was made (selection
  method, α, budgets, per-step losses, pool hash, training data hash, judge
  identity, prompt versions, the learner's settings);
* ``report_`` — a `LearningReport`: the selected rubrics with their own
  separation, every pool rubric's separation, the α cross-validation table,
  the training-set metrics, what the judge cost, the wall time;
* ``ratings_`` — the pool-wide training ratings (`scorers.learning.score_cache.Ratings`)
  and ``labels_``; ``selected_ratings_`` are the columns of the learned set.

Steps of `fit`:

1. the data are checked *before* any judge call (both classes, at least
   ``folds`` conversations per class when α is cross-validated, conversations
   with turns, unique ids): a `LearningError` names the problem;
2. every pool rubric is rated on every training conversation once through
   `scorers.learning.score_cache.rate` (cached: selection, CV and the baselines reuse
   the answers, and a rerun asks the judge nothing);
3. α by stratified k-fold CV of greedy selection (`select_alpha`) for the
   ``greedy`` and ``ucb`` methods (UCB uses the α chosen for greedy); the
   ``brute_force`` baseline ranks rubrics by their own separation and has no α;
4. selection with the chosen method and the SAT/DSAT budgets;
5. θ and windows (`scorers.rubrics.fit_windows`) on the training NetSATs.

The pool is a `RubricPool` (Likert assertions; the usual case) or any sequence
of `Rubric`s with their own scales (e.g. LLM-Rubric's Q1-Q8 answered on 1-4,
which a recorded judge replays).

`write_report` writes ``report.json`` and ``precision_curves.png`` (positive
and negative precision against the NetSAT threshold with P, θ and the window
edges marked, and the NetSAT of each training conversation by class below).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from scorers.datasets.labelled import LabelledConversation
from scorers.json_file import write_json
from scorers.judges.base import Judge
from scorers.judges.prompt import PROMPT_VERSION as JUDGE_PROMPT_VERSION
from scorers.learning.pool import RubricPool, to_rubric
from scorers.learning.score_cache import Ratings, RatingStats, ScoreCache, judge_identity, rate
from scorers.learning.selection import (
    DEFAULT_ALPHAS,
    DEFAULT_BUDGET,
    DEFAULT_FOLDS,
    CvRow,
    LearningError,
    Selection,
    brute_force_select,
    greedy_select,
    select_alpha,
    selection_record,
    separations,
    to_rubric_set,
    training_data_hash,
    ucb_select,
)
from scorers.rubrics import (
    DEFAULT_PRECISION,
    Polarity,
    RubiconMetrics,
    Rubric,
    RubricSet,
    evaluate,
    fit_windows,
    netsat_matrix,
    precision_curves,
)

METHODS: tuple[str, ...] = ("greedy", "brute_force", "ucb")
REPORT_FILE = "report.json"
PLOT_FILE = "precision_curves.png"

Progress = Callable[[str, int, int], None]
"""Called as ``progress(stage, done, total)``; stages: ``rating`` (conversations), ``alpha-cv``, ``selection``."""


# ---------------------------------------------------------------------------- report


@dataclass(frozen=True)
class SelectedRubric:
    """A rubric of the learned set: its text, its own class-mean gap on the training data, and the set's losses after it joined.

    ``separation`` is the mean signed score of positives minus negatives (> 0:
    it points the right way); ``step`` is its 1-based position in the selection order.
    """

    id: str
    text: str
    polarity: str
    source: str
    separation: float
    step: int
    loss_c: float
    loss_s: float


@dataclass(frozen=True)
class LearningReport:
    """What `RubricLearner.fit` chose, why, and what it cost (see the module docstring)."""

    method: str
    alpha: float
    alpha_cv: tuple[CvRow, ...]
    selected: tuple[SelectedRubric, ...]
    pool_separations: Mapping[str, float]  # every pool rubric id -> its own separation
    warnings: tuple[str, ...]
    precision: float
    threshold: float
    dsat_upper: float | None
    sat_lower: float | None
    training: RubiconMetrics
    n_train: int
    n_positive: int
    judge: str
    rating: RatingStats
    wall_s: float
    training_data_hash: str
    pool_hash: str
    pool_size: int
    pool_name: str | None
    prompt_versions: Mapping[str, str]
    rubric_set_version: str
    settings: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe (NaN becomes None)."""
        return _json_safe(dataclasses.asdict(self))


def _json_safe(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, np.generic):
        return _json_safe(value.item())
    return value


# ---------------------------------------------------------------------------- candidates


@dataclass(frozen=True)
class _Candidates:
    rubrics: tuple[Rubric, ...]
    sources: tuple[str, ...]
    pool: RubricPool | None
    hash: str
    name: str | None
    prompt_versions: Mapping[str, str]


def _candidates(pool: RubricPool | Sequence[Rubric]) -> _Candidates:
    if isinstance(pool, RubricPool):
        return _Candidates(
            tuple(to_rubric(r) for r in pool.rubrics),
            tuple(r.source for r in pool.rubrics),
            pool,
            pool.content_hash(),
            pool.metadata.get("name"),
            dict(pool.prompt_versions),
        )
    rubrics = tuple(pool)
    if not rubrics:
        raise LearningError("pool: no candidate rubrics")
    for i, r in enumerate(rubrics):
        if not isinstance(r, Rubric):
            raise LearningError(f"pool[{i}]: expected a Rubric (or pass a RubricPool), got {type(r).__name__}")
    ids = [r.id for r in rubrics]
    if len(set(ids)) != len(ids):
        raise LearningError(f"pool: duplicate rubric ids {sorted({i for i in ids if ids.count(i) > 1})}")
    content = [[r.id, r.text, r.polarity.value, list(r.scale.keys), list(r.scale.scores)] for r in rubrics]
    digest = hashlib.sha256(json.dumps(content, ensure_ascii=False).encode("utf-8")).hexdigest()[:16]
    return _Candidates(rubrics, ("manual",) * len(rubrics), None, digest, None, {})


# ---------------------------------------------------------------------------- the estimator


class RubricLearner:
    """Learn a RUBICON rubric set from a pool and labelled conversations (module docstring).

    ``n_sat``/``n_dsat``: selection budgets; ``precision``: P of the windows;
    ``alphas``: the α grid searched by ``folds``-fold CV (``seed`` draws the
    folds and UCB's mini-batches); ``method``: ``greedy`` (RUBICON's
    Algorithm 1), ``brute_force`` or ``ucb``; ``batch_questions`` caps the
    questions per judge call when rating (None: all of a conversation's misses
    in one call, which the judge may split itself).
    """

    def __init__(
        self,
        n_sat: int = DEFAULT_BUDGET,
        n_dsat: int = DEFAULT_BUDGET,
        precision: float = DEFAULT_PRECISION,
        alphas: Sequence[float] = DEFAULT_ALPHAS,
        folds: int = DEFAULT_FOLDS,
        seed: int = 0,
        method: str = "greedy",
        batch_questions: int | None = None,
    ) -> None:
        self.n_sat = n_sat
        self.n_dsat = n_dsat
        self.precision = precision
        self.alphas = tuple(alphas)
        self.folds = folds
        self.seed = seed
        self.method = method
        self.batch_questions = batch_questions

    def __repr__(self) -> str:
        return (
            f"RubricLearner(n_sat={self.n_sat}, n_dsat={self.n_dsat}, precision={self.precision}, alphas={self.alphas}, "
            f"folds={self.folds}, seed={self.seed}, method={self.method!r})"
        )

    def get_params(self) -> dict[str, Any]:
        return {
            "n_sat": self.n_sat,
            "n_dsat": self.n_dsat,
            "precision": self.precision,
            "alphas": list(self.alphas),
            "folds": self.folds,
            "seed": self.seed,
            "method": self.method,
            "batch_questions": self.batch_questions,
        }

    def _check_params(self) -> None:
        if self.method not in METHODS:
            raise LearningError(f"method: {self.method!r} is not one of {list(METHODS)}")
        for name in ("n_sat", "n_dsat"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise LearningError(f"{name}: must be an integer >= 0, got {value!r}")
        if self.n_sat + self.n_dsat == 0:
            raise LearningError("n_sat + n_dsat: nothing to select")
        if not (isinstance(self.precision, (int, float)) and 0.5 < self.precision <= 1.0):
            raise LearningError(f"precision: must be in (0.5, 1], got {self.precision!r}")
        if isinstance(self.folds, bool) or not isinstance(self.folds, int) or self.folds < 2:
            raise LearningError(f"folds: must be an integer >= 2, got {self.folds!r}")
        if not self.alphas:
            raise LearningError("alphas: need at least one candidate")
        if self.batch_questions is not None and self.batch_questions < 1:
            raise LearningError(f"batch_questions: must be >= 1 or None, got {self.batch_questions}")

    @property
    def _cross_validates(self) -> bool:
        return self.method in ("greedy", "ucb")

    def check_data(self, labelled: Sequence[LabelledConversation], where: str = "training data") -> np.ndarray:
        """The boolean labels, after refusing data `fit` cannot learn from (no judge call is made).

        Refused: no conversations, a conversation without turns (the score
        cache keys answers by conversation content), duplicate ids, an empty
        class, and fewer conversations per class than ``folds`` when α is
        cross-validated.
        """
        self._check_params()
        items = list(labelled)
        if not items:
            raise LearningError(f"{where}: no conversations")
        seen: set[str] = set()
        for i, item in enumerate(items):
            if not isinstance(item, LabelledConversation):
                raise LearningError(f"{where}[{i}]: expected a LabelledConversation, got {type(item).__name__}")
            cid = item.conversation.id
            if not item.conversation.turns:
                raise LearningError(f"{where}: conversation {cid!r} has no turns (the judge and the score cache need its text)")
            if cid in seen:
                raise LearningError(f"{where}: duplicate conversation id {cid!r}")
            seen.add(cid)
        y = np.array([item.positive for item in items], dtype=bool)
        n_pos, n_neg = int(y.sum()), int((~y).sum())
        for name, count in (("positive", n_pos), ("negative", n_neg)):
            if count == 0:
                raise LearningError(
                    f"{where}: no {name} conversations ({n_pos} positive, {n_neg} negative); learning needs both classes"
                )
        if self._cross_validates and min(n_pos, n_neg) < self.folds:
            raise LearningError(
                f"{where}: {n_pos} positive and {n_neg} negative conversations; every class needs at least "
                f"folds={self.folds} for the cross-validation of α (lower --folds or add labelled conversations)"
            )
        return y

    def fit(
        self,
        pool: RubricPool | Sequence[Rubric],
        labelled: Sequence[LabelledConversation],
        judge: Judge,
        cache: ScoreCache,
        progress: Progress | None = None,
    ) -> RubricLearner:
        """Rate, choose α, select, fit θ and windows; sets ``rubric_set_``, ``report_``, ``ratings_``, ``labels_``."""
        started = time.perf_counter()
        y = self.check_data(labelled)
        candidates = _candidates(pool)
        conversations = [item.conversation for item in labelled]
        polarities = tuple(r.polarity for r in candidates.rubrics)

        on_rating = (lambda done, total: progress("rating", done, total)) if progress else None
        ratings = rate(judge, candidates.rubrics, conversations, cache, batch_questions=self.batch_questions, progress=on_rating)
        matrix = ratings.matrix

        alpha = 0.0
        cv: tuple[CvRow, ...] = ()
        if self._cross_validates:
            alpha, cv = select_alpha(matrix, y, polarities, self.alphas, self.folds, self.seed, self.n_sat, self.n_dsat)
            if progress:
                progress("alpha-cv", 1, 1)
        selection = self._select(matrix, y, polarities, alpha)
        if progress:
            progress("selection", 1, 1)

        judge_id = judge_identity(judge)
        data_hash = training_data_hash([c.content_hash() for c in conversations], list(y))
        settings = {**self.get_params(), "alpha_cv": [dataclasses.asdict(row) for row in cv]}
        rubric_set = self._rubric_set(candidates, selection, matrix, y, judge_id, data_hash, {"learner": settings})
        gaps = separations(matrix, y, polarities)
        selected_matrix = matrix[:, list(selection.indices)]
        netsats = netsat_matrix(selected_matrix, rubric_set.polarities)
        w = rubric_set.windows
        self.report_ = LearningReport(
            method=self.method,
            alpha=selection.alpha,
            alpha_cv=tuple(cv),
            selected=tuple(
                SelectedRubric(
                    id=candidates.rubrics[s.index].id,
                    text=candidates.rubrics[s.index].text,
                    polarity=s.polarity.value,
                    source=candidates.sources[s.index],
                    separation=float(gaps[s.index]),
                    step=k,
                    loss_c=s.loss_c,
                    loss_s=s.loss_s,
                )
                for k, s in enumerate(selection.history, start=1)
            ),
            pool_separations={r.id: float(g) for r, g in zip(candidates.rubrics, gaps)},
            warnings=tuple(selection.warnings),
            precision=w.precision,
            threshold=w.threshold,
            dsat_upper=w.dsat_upper,
            sat_lower=w.sat_lower,
            training=evaluate(netsats, y, rubric_set),
            n_train=len(y),
            n_positive=int(y.sum()),
            judge=judge_id,
            rating=ratings.stats,
            wall_s=time.perf_counter() - started,
            training_data_hash=data_hash,
            pool_hash=candidates.hash,
            pool_size=len(candidates.rubrics),
            pool_name=candidates.name,
            prompt_versions=dict(rubric_set.metadata.get("prompt_versions", {})),
            rubric_set_version=rubric_set.version,
            settings=self.get_params(),
        )
        self.rubric_set_ = rubric_set
        self.selection_ = selection
        self.ratings_ = ratings
        self.labels_ = y
        self.selected_ratings_ = selected_matrix
        return self

    def _select(self, matrix: np.ndarray, y: np.ndarray, polarities: Sequence[Polarity], alpha: float) -> Selection:
        if self.method == "greedy":
            return greedy_select(matrix, y, polarities, self.n_sat, self.n_dsat, alpha)
        if self.method == "ucb":
            return ucb_select(matrix, y, polarities, self.n_sat, self.n_dsat, alpha, seed=self.seed)
        return brute_force_select(matrix, y, polarities, self.n_sat, self.n_dsat)

    def _rubric_set(
        self,
        candidates: _Candidates,
        selection: Selection,
        matrix: np.ndarray,
        y: np.ndarray,
        judge_id: str,
        data_hash: str,
        extra: Mapping[str, Any],
    ) -> RubricSet:
        versions = {"judge": JUDGE_PROMPT_VERSION}
        if candidates.pool is not None:
            return to_rubric_set(
                candidates.pool,
                selection,
                matrix,
                y,
                self.precision,
                judge=judge_id,
                training_data_hash=data_hash,
                prompt_versions=versions,
                metadata=extra,
            )
        # Rubrics with their own scales: the same record as `to_rubric_set` writes for a pool.
        idx = list(selection.indices)
        rubrics = tuple(candidates.rubrics[j] for j in idx)
        netsats = netsat_matrix(matrix[:, idx], [r.polarity for r in rubrics])
        recorded = {
            "selection": selection_record(selection, [r.id for r in candidates.rubrics]),
            "rubric_sources": {r.id: "manual" for r in rubrics},
            "pool": {"hash": candidates.hash, "size": len(candidates.rubrics), "name": None},
            "training_data_hash": data_hash,
            "n_train": int(len(y)),
            "n_train_positive": int(y.sum()),
            "judge": judge_id,
            "prompt_versions": versions,
        }
        return RubricSet(rubrics, fit_windows(netsats, y, self.precision), {**extra, **recorded})

    def evaluate(
        self,
        rubric_set: RubricSet,
        labelled_test: Sequence[LabelledConversation],
        judge: Judge,
        cache: ScoreCache,
        progress: Progress | None = None,
    ) -> RubiconMetrics:
        """RUBICON's metrics of ``rubric_set`` (its θ and windows) on held-out labelled conversations."""
        return score_labelled(rubric_set, labelled_test, judge, cache, self.batch_questions, progress).metrics


# ---------------------------------------------------------------------------- scoring held-out data


@dataclass(frozen=True)
class ScoredSample:
    """A rubric set applied to labelled conversations: NetSATs, labels, metrics and the rating cost."""

    netsats: np.ndarray
    labels: np.ndarray
    metrics: RubiconMetrics
    ratings: Ratings


def score_labelled(
    rubric_set: RubricSet,
    labelled: Sequence[LabelledConversation],
    judge: Judge,
    cache: ScoreCache,
    batch_questions: int | None = None,
    progress: Progress | None = None,
) -> ScoredSample:
    """Rate ``labelled`` on the set's rubrics (through the cache), then NetSAT and `evaluate` with the set's θ/windows."""
    items = list(labelled)
    if not items:
        raise LearningError("labelled: no conversations to evaluate on")
    y = np.array([item.positive for item in items], dtype=bool)
    if y.all() or not y.any():
        raise LearningError(f"labelled: evaluation needs both classes, got {int(y.sum())} positive of {len(y)}")
    on_rating = (lambda done, total: progress("rating", done, total)) if progress else None
    ratings = rate(judge, rubric_set.rubrics, [item.conversation for item in items], cache, batch_questions, on_rating)
    netsats = netsat_matrix(ratings.matrix, rubric_set.polarities)
    return ScoredSample(netsats, y, evaluate(netsats, y, rubric_set), ratings)


# ---------------------------------------------------------------------------- report files


def write_report(
    report: LearningReport,
    rubric_set: RubricSet,
    ratings: np.ndarray,
    labels: Sequence[bool] | np.ndarray,
    out_dir: str | Path,
) -> dict[str, Path]:
    """Write ``report.json`` and ``precision_curves.png`` into ``out_dir``; returns their paths.

    ``ratings`` are the training ratings of the set's rubrics (columns in
    ``rubric_set.rubrics`` order, e.g. ``learner.selected_ratings_``).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    y = np.asarray(labels, dtype=bool)
    netsats = netsat_matrix(np.asarray(ratings, dtype=float), rubric_set.polarities)
    doc = {
        **report.to_dict(),
        "rubric_set": {
            "version": rubric_set.version,
            "threshold": rubric_set.windows.threshold,
            "windows": {"dsat_upper": rubric_set.windows.dsat_upper, "sat_lower": rubric_set.windows.sat_lower},
            "precision": rubric_set.windows.precision,
        },
        "training_netsat": _json_safe(
            {
                "positive_mean": float(netsats[y].mean()),
                "negative_mean": float(netsats[~y].mean()),
                "min": float(netsats.min()),
                "max": float(netsats.max()),
            }
        ),
    }
    report_path = out / REPORT_FILE
    write_json(report_path, doc)
    plot_path = out / PLOT_FILE
    plot_precision_curves(netsats, y, rubric_set, plot_path, title=_plot_title(report, rubric_set))
    return {"report": report_path, "plot": plot_path}


def _plot_title(report: LearningReport, rubric_set: RubricSet) -> str:
    n_sat = sum(1 for r in rubric_set.rubrics if r.polarity is Polarity.SAT)
    method = report.method.replace("_", " ")
    return (
        f"Rubric set {rubric_set.version}: {n_sat} SAT + {len(rubric_set.rubrics) - n_sat} DSAT rubrics "
        f"({method}, α={report.alpha:g}), {report.n_train} training conversations"
    )


def plot_precision_curves(
    netsats: np.ndarray, labels: np.ndarray, rubric_set: RubricSet, path: str | Path, title: str = ""
) -> Path:
    """Precision of ``NetSAT ≥ t`` (positives) and ``NetSAT ≤ t`` (negatives) against t, windows shaded; PNG at ``path``."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    s = np.asarray(netsats, dtype=float)
    y = np.asarray(labels, dtype=bool)
    w = rubric_set.windows
    lo, hi = float(s.min()), float(s.max())
    pad = max(0.05 * (hi - lo), 0.5)
    thresholds = np.linspace(lo - pad, hi + pad, 400)
    curves = precision_curves(s, y, thresholds)

    fig = Figure(figsize=(9, 6.5), layout="constrained")
    FigureCanvasAgg(fig)
    top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=(3, 1.3))
    top.plot(thresholds, curves.positive, color="tab:green", lw=2, label="positive precision: P(satisfied | NetSAT ≥ t)")
    top.plot(thresholds, curves.negative, color="tab:red", lw=2, label="negative precision: P(dissatisfied | NetSAT ≤ t)")
    top.axhline(w.precision, color="0.3", ls="--", lw=1, label=f"target precision P = {w.precision:g}")
    top.axvline(w.threshold, color="black", lw=1.5, label=f"θ = {w.threshold:.1f}")
    if w.dsat_upper is not None:
        top.axvspan(lo - pad, w.dsat_upper, color="tab:red", alpha=0.08)
        top.axvline(w.dsat_upper, color="tab:red", ls=":", lw=1.5, label=f"dsat window: NetSAT ≤ {w.dsat_upper:.1f}")
    if w.sat_lower is not None:
        top.axvspan(w.sat_lower, hi + pad, color="tab:green", alpha=0.08)
        top.axvline(w.sat_lower, color="tab:green", ls=":", lw=1.5, label=f"sat window: NetSAT ≥ {w.sat_lower:.1f}")
    top.set_ylim(-0.02, 1.05)
    top.set_ylabel("precision")
    top.grid(alpha=0.3)
    top.legend(loc="lower center", fontsize=8, framealpha=0.9)
    if title:
        top.set_title(title, fontsize=10)
    missing = [name for name, edge in (("dsat", w.dsat_upper), ("sat", w.sat_lower)) if edge is None]
    if missing:
        top.text(
            0.01,
            0.97,
            f"no {' or '.join(missing)} window reaches P on this data",
            transform=top.transAxes,
            fontsize=8,
            va="top",
            color="0.3",
        )

    rng = np.random.default_rng(0)  # vertical jitter only, so that equal NetSATs stay visible
    ticks = []
    for row, (mask, name, color) in enumerate(((~y, "dissatisfied", "tab:red"), (y, "satisfied", "tab:green"))):
        values = s[mask]
        bottom.scatter(values, row + rng.uniform(-0.18, 0.18, len(values)), s=14, color=color, alpha=0.6)
        ticks.append(f"{name}\nn={len(values)}, mean {values.mean():.1f}")
    bottom.axvline(w.threshold, color="black", lw=1.5)
    for edge, color in ((w.dsat_upper, "tab:red"), (w.sat_lower, "tab:green")):
        if edge is not None:
            bottom.axvline(edge, color=color, ls=":", lw=1.5)
    bottom.set_yticks([0, 1], ticks, fontsize=8)
    bottom.set_ylim(-0.5, 1.5)
    bottom.set_xlabel("NetSAT threshold t  (NetSAT = Σ SAT ratings − Σ DSAT ratings); dots: training conversations")
    bottom.grid(alpha=0.3, axis="x")
    path = Path(path)
    fig.savefig(path, dpi=110)
    return path
