"""A cumulative-link calibrator: few parameters, so that what it learns on synthetic data carries over.

LLM-Rubric's network (`scorers.calibration`) fits the synthetic conversations
well (Pearson 0.46 in cross-validation) and transfers badly to the real ones
(0.17, below the plain per-judge mean). This model has a dozen shared
parameters instead of thousands:

    P(y ≤ k | x, judge a) = σ(c_k − w·z(x) − b_a)

* ``z(x)`` is one number per input question: the judge LLM's expected answer
  (its option probabilities renormalised), or, for a nominal question such as
  LLM-Rubric's Q8, the probabilities of every option but the last. Each
  feature is standardised with the mean and SD of the training conversations,
  or, after `adapt_features`, of unlabelled conversations of the target domain
  (the judge's answers on production traffic need no human label).
  A question the LLM was not asked (an all-zero block) gets the mean.
* ``c_1 < … < c_{K−1}`` are the shared cut points; ``w`` the shared weights;
  ``b_a`` each human judge's offset, shrunk towards 0 by ``judge_shrinkage``
  (an L2 penalty), so a judge with few labels stays near the average judge and
  an unseen judge is predicted with ``b = 0``.

The fit is maximum penalised likelihood (L-BFGS, analytic gradient): convex,
deterministic, no seed. One model is fitted per predicted question; only
ordinal questions can be predicted. `OrdinalCalibrator.adapt` refits on a
team's own labels with the penalty centred on the fitted parameters
(docs/calibration.md).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import ArrayLike
from scipy.optimize import minimize
from scipy.special import expit

from scorers.calibrators import (
    METADATA_FILE,
    ORDINAL_FORMAT,
    VERSION_HEX_CHARS,
    CalibrationError,
    CalibrationFileError,
    Prediction,
    require_answers,
)
from scorers.datasets.llm_rubric import RubricData
from scorers.json_file import write_json
from scorers.judges.base import Judgement

# The two penalties' grid searched by cross-validation (`convowatch calibrate train`, the transfer benchmark).
PENALTY_GRID: dict[str, list[float]] = {
    "weight_decay": [0.01, 0.1, 1.0, 10.0, 100.0],
    "judge_shrinkage": [0.1, 1.0, 10.0, 100.0, 1000.0],
}
FORMAT_VERSION = 1

MIN_SD = 1e-6  # a feature constant over the training conversations is centred, not scaled
MIN_PROBABILITY = 1e-12
MAX_ITERATIONS = 1000
MIN_ADAPTATION_CONVERSATIONS = 10  # fewer labelled conversations cannot say anything the prior does not


class _LinkModel:
    """The fitted parameters of one predicted question."""

    def __init__(self, weights: np.ndarray, cuts: np.ndarray, offsets: dict[str, float]) -> None:
        self.weights = weights
        self.cuts = cuts
        self.offsets = offsets

    def as_json(self) -> dict[str, Any]:
        return {"weights": self.weights.tolist(), "cuts": self.cuts.tolist(), "offsets": self.offsets}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> _LinkModel:
        cuts = np.asarray(data["cuts"], dtype=np.float64)
        if cuts.ndim != 1 or np.any(np.diff(cuts) <= 0):
            raise ValueError("cut points must be an increasing list")
        offsets = {str(k): float(v) for k, v in data["offsets"].items()}
        return cls(np.asarray(data["weights"], dtype=np.float64), cuts, offsets)

    def probabilities(self, z: np.ndarray, judges: Sequence[str | None]) -> np.ndarray:
        eta = z @ self.weights
        if any(j is not None for j in judges):
            eta = eta + np.array([self.offsets.get(j, 0.0) if j is not None else 0.0 for j in judges])
        at_most = expit(self.cuts[None, :] - eta[:, None])
        # P(answer = i) = P(<= i) - P(<= i-1), with P(<= 0) = 0 and P(<= k) = 1 (in place: the worker calls this per
        # conversation and question, where numpy's per-call overhead is most of the cost)
        probabilities = np.empty((len(eta), len(self.cuts) + 1))
        probabilities[:, :-1] = at_most
        probabilities[:, -1] = 1.0
        probabilities[:, 1:] -= at_most
        return probabilities


def _answer_values(k: int) -> np.ndarray:
    """1..k as floats, read-only: every `Prediction` of a question shares it."""
    values = np.arange(1, k + 1, dtype=np.float64)
    values.flags.writeable = False
    return values


def _label_weights(data: RubricData, question: str, conversation_weights: Mapping[str, float]) -> np.ndarray:
    """Each label of ``question`` weighted as its conversation, rescaled to mean 1."""
    labels = data.labels_for(question)
    missing = sorted({lab.text_id for lab in labels} - set(conversation_weights))
    if missing:
        raise CalibrationError(f"no weight for {len(missing)} labelled conversations, e.g. {missing[:3]}")
    weights = np.array([conversation_weights[lab.text_id] for lab in labels], dtype=np.float64)
    if not np.all(np.isfinite(weights)) or np.any(weights < 0) or weights.sum() <= 0:
        raise CalibrationError("conversation weights must be finite, >= 0 and not all 0")
    return weights / weights.mean()


def _cuts(params: np.ndarray) -> np.ndarray:
    """Increasing cut points from ``[c_1, log(c_2 − c_1), …]``."""
    return params[0] + np.concatenate([[0.0], np.cumsum(np.exp(params[1:]))])


class _LinkProblem:
    """The penalised negative log-likelihood of one question's labels and its gradient.

    The penalty is ``Σ precision_i · (θ_i − centre_i)²`` over the parameter vector ``θ = [w, b, c_1,
    log gaps]``: towards 0 when fitting from scratch, towards a fitted model's parameters when adapting it.
    Each label's log-likelihood counts with its weight (1 unless importance-weighted, mean 1 if so).
    """

    def __init__(
        self,
        z: np.ndarray,
        y: np.ndarray,
        judge_index: np.ndarray,
        n_judges: int,
        k: int,
        precision: np.ndarray,
        centre: np.ndarray | None = None,
        weights: np.ndarray | None = None,
    ) -> None:
        self.z, self.y, self.judge_index, self.n_judges, self.k = z, y, judge_index, n_judges, k
        self.precision = precision
        self.centre = np.zeros_like(precision) if centre is None else centre
        self.weights = np.ones(len(y)) if weights is None else weights  # each label's weight in the likelihood

    def split(self, params: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(w, b, cut parameters)``."""
        d, m = self.z.shape[1], self.n_judges
        return params[:d], params[d : d + m], params[d + m :]

    def start(self) -> np.ndarray:
        """No weights, no offsets, cut points at the logits of the answers' cumulative shares."""
        share = np.array([(self.y <= level).mean() for level in range(1, self.k)]).clip(0.01, 0.99)
        cuts = np.log(share / (1 - share))
        gaps = np.log(np.maximum(np.diff(cuts), 0.1))
        return np.concatenate([np.zeros(self.z.shape[1] + self.n_judges), cuts[:1], gaps])

    def loss(self, params: np.ndarray) -> tuple[float, np.ndarray]:
        """Mean penalised NLL per label and its gradient."""
        w, b, cut_params = self.split(params)
        y, k, n = self.y, self.k, len(self.y)
        cuts = _cuts(cut_params)
        eta = self.z @ w + b[self.judge_index]
        has_upper, has_lower = y < k, y > 1
        upper, lower = np.minimum(y - 1, k - 2), np.maximum(y - 2, 0)  # the cut points around each answer
        f_upper = np.where(has_upper, expit(cuts[upper] - eta), 1.0)
        f_lower = np.where(has_lower, expit(cuts[lower] - eta), 0.0)
        p = np.maximum(f_upper - f_lower, MIN_PROBABILITY)
        d_upper = self.weights * f_upper * (1 - f_upper) / p
        d_lower = self.weights * f_lower * (1 - f_lower) / p
        away = params - self.centre
        value = -(self.weights * np.log(p)).sum() + float(self.precision @ away**2)
        d_eta = d_upper - d_lower
        d_cuts = np.bincount(upper[has_upper], -d_upper[has_upper], k - 1) + np.bincount(
            lower[has_lower], d_lower[has_lower], k - 1
        )
        # c_j = c_1 + Σ_{i≤j} exp(g_i): c_1 moves every cut, g_i the cuts from the i-th on
        d_gaps = np.exp(cut_params[1:]) * np.cumsum(d_cuts[::-1])[::-1][1:]
        grad = np.concatenate([self.z.T @ d_eta, np.bincount(self.judge_index, d_eta, self.n_judges), [d_cuts.sum()], d_gaps])
        return value / n, (grad + 2 * self.precision * away) / n


class OrdinalCalibrator:
    """Proportional-odds calibration of judge-LLM answers to human answers, scikit-learn style.

    ``fit(data)`` learns from a `RubricData`; ``predict_proba(x, question,
    judge)`` returns a `Prediction` like `CalibrationNetwork`'s, so model
    selection and the benchmarks treat both alike; ``adapt(data, strength)``
    returns a copy refitted on a team's own labels.

    ``questions`` are predicted (default: the main question only; `convowatch
    calibrate train` passes every ordinal one), ``input_questions`` are read
    (default: every question of the data), ``nominal_inputs`` are read as
    option shares, not expected answers, and cannot be predicted.
    ``weight_decay`` and ``judge_shrinkage`` are the L2 penalties on w and b.
    """

    PARAM_NAMES = ("main_question", "questions", "input_questions", "nominal_inputs", "weight_decay", "judge_shrinkage")

    def __init__(
        self,
        *,
        main_question: str = "Q0",
        questions: Sequence[str] | None = None,
        input_questions: Sequence[str] | None = None,
        nominal_inputs: Sequence[str] = ("Q8",),
        weight_decay: float = 1.0,
        judge_shrinkage: float = 10.0,
    ) -> None:
        self.main_question = main_question
        self.questions = None if questions is None else tuple(questions)
        self.input_questions = None if input_questions is None else tuple(input_questions)
        self.nominal_inputs = tuple(nominal_inputs)
        self.weight_decay = weight_decay
        self.judge_shrinkage = judge_shrinkage
        if weight_decay < 0 or judge_shrinkage < 0:
            raise CalibrationError(f"weight_decay and judge_shrinkage must be >= 0, got {weight_decay} and {judge_shrinkage}")
        self._models: dict[str, _LinkModel] = {}
        self._layout: dict[str, int] = {}  # the questions of a feature row x, in order, and their option counts
        self._blocks: list[tuple[str, int, int]] = []  # each input question, its start in x, its options
        self._values: dict[str, np.ndarray] = {}  # each question's answer values, 1..k
        self._columns, self._take = np.zeros(0, dtype=np.intp), np.zeros(0, dtype=np.intp)  # made by `_set_layout`
        self._member = self._weighted = np.zeros((0, 0))
        self._mean = np.zeros(0)
        self._sd = np.ones(0)
        self.training_data_hash_ = ""
        self.adaptation_: list[dict[str, Any]] = []  # each `adapt` that made this model: strength, labels, data hash
        self.version_ = ""

    def get_params(self) -> dict[str, Any]:
        """Constructor arguments as plain JSON-able data."""
        out = {name: getattr(self, name) for name in self.PARAM_NAMES}
        return {k: list(v) if isinstance(v, tuple) else v for k, v in out.items()}

    def clone(self, **overrides: Any) -> OrdinalCalibrator:
        """An unfitted copy with some parameters changed."""
        return OrdinalCalibrator(**{**self.get_params(), **overrides})

    @property
    def is_fitted(self) -> bool:
        return bool(self._models)

    @property
    def question_ids_(self) -> tuple[str, ...]:
        """The questions the judge must answer: the model's inputs."""
        return tuple(q for q, _, _ in self._blocks)

    @property
    def n_options_(self) -> dict[str, int]:
        return dict(self._layout)

    def _set_layout(self, layout: Mapping[str, int], inputs: Sequence[str]) -> None:
        self._layout = dict(layout)
        starts = dict(zip(self._layout, np.cumsum([0, *self._layout.values()])))
        self._blocks = [(q, int(starts[q]), self._layout[q]) for q in inputs]
        self._values = {q: _answer_values(k) for q, k in self._layout.items()}
        # `raw_features` as a few matrix products (the worker calls it per conversation, where numpy's per-call
        # overhead is most of the cost): the input columns of x, each column's block, each option's value in its
        # block, and where each feature is in [expected answers per block | option shares].
        self._columns = np.array([start + i for _, start, k in self._blocks for i in range(k)], dtype=np.intp)
        self._member = np.zeros((len(self._columns), len(self._blocks)))
        self._weighted = np.zeros_like(self._member)
        take: list[int] = []
        first = 0
        for b, (question, _, k) in enumerate(self._blocks):
            self._member[first : first + k, b] = 1.0
            if question in self.nominal_inputs:
                take.extend(len(self._blocks) + first + i for i in range(k - 1))  # every option's share but the last
            else:
                self._weighted[first : first + k, b] = self._values[question]
                take.append(b)
            first += k
        self._take = np.array(take, dtype=np.intp)

    @property
    def judges_(self) -> tuple[str, ...]:
        """Human judges with a fitted offset (for any predicted question)."""
        return tuple(sorted({j for m in self._models.values() for j in m.offsets}))

    # -- features ------------------------------------------------------------

    def raw_features(self, x: ArrayLike) -> np.ndarray:
        """The unstandardised inputs of feature rows ``x`` (each input question's expected answer, or a nominal
        one's option shares): one row per conversation, NaN where the LLM was not asked the question."""
        x = np.atleast_2d(np.asarray(x, dtype=np.float64))
        width = max((start + k for _, start, k in self._blocks), default=0)
        if x.shape[1] < width:
            raise CalibrationError(f"feature rows have {x.shape[1]} values, expected at least {width}")
        p = x[:, self._columns]
        with np.errstate(invalid="ignore", divide="ignore"):
            totals = p @ self._member  # each block's total mass
            expected = np.where(totals > 0, (p @ self._weighted) / totals, np.nan)
            spread = totals @ self._member.T  # each option's block total
            shares = np.where(spread > 0, p / spread, np.nan)
        return np.concatenate([expected, shares], axis=1)[:, self._take]

    def _standardised_features(self, x: ArrayLike) -> np.ndarray:
        """The model's inputs for feature rows ``x``: the raw features, standardised (NaN -> the mean)."""
        return self._standardise(self.raw_features(x))

    def _standardise(self, raw: np.ndarray) -> np.ndarray:
        z = (raw - self._mean) / self._sd
        return np.where(np.isnan(z), 0.0, z)

    def _set_scale(self, raw: np.ndarray) -> None:
        with np.errstate(invalid="ignore"):
            mean = np.nanmean(raw, axis=0)
            sd = np.nanstd(raw, axis=0)
        self._mean = np.where(np.isnan(mean), 0.0, mean)
        self._sd = np.where(np.isnan(sd) | (sd < MIN_SD), 1.0, sd)

    def adapt_features(self, x: ArrayLike) -> OrdinalCalibrator:
        """Standardise features with unlabelled rows of the target domain (no labels are used)."""
        self._require_fitted()
        raw = self.raw_features(x)
        if len(raw) < 2:
            raise CalibrationError(f"need at least 2 unlabelled conversations to adapt to, got {len(raw)}")
        self._set_scale(raw)
        self.version_ = self._compute_version()
        return self

    # -- fitting -------------------------------------------------------------

    def fit(self, data: RubricData, conversation_weights: Mapping[str, float] | None = None) -> OrdinalCalibrator:
        """Fit one cumulative-link model per predicted question on ``data``'s labels.

        ``conversation_weights`` (text id -> weight ≥ 0, e.g. `scorers.domain_weights.importance_weights`)
        weights every label of a conversation in the likelihood; they are rescaled to mean 1 over each
        question's labels, so the penalties keep their meaning.
        """
        inputs = self.input_questions or data.question_ids
        unknown = [q for q in (*inputs, self.main_question, *(self.questions or ())) if q not in data.question_ids]
        if unknown:
            raise CalibrationError(f"unknown questions {unknown}; the data has {data.question_ids}")
        self._set_layout({q: data.n_options[q] for q in data.question_ids}, inputs)
        conversations = list(data.features)
        self._set_scale(self.raw_features(np.stack([data.features[t] for t in conversations])))
        targets = self.questions or (self.main_question,)
        nominal = [q for q in targets if q in self.nominal_inputs]
        if nominal:
            raise CalibrationError(f"questions {nominal} are not ordinal: a cumulative-link model cannot predict them")
        models = {}
        for question in targets:
            if not data.labels_for(question):
                raise CalibrationError(f"no labels for {question!r} to fit")
            weights = None if conversation_weights is None else _label_weights(data, question, conversation_weights)
            models[question] = self._fit_one(*self._labelled_rows(data, question), data.n_options[question], weights=weights)
        self._models = models
        self.training_data_hash_ = data.content_hash()
        self.version_ = self._compute_version()
        return self

    def _labelled_rows(self, data: RubricData, question: str) -> tuple[np.ndarray, np.ndarray, list[str]]:
        """Standardised features, answers and human judges of ``data``'s labels of ``question``."""
        labels = data.labels_for(question)
        z = self._standardised_features(np.stack([data.features[lab.text_id] for lab in labels]))
        return z, np.array([lab.answer for lab in labels]), [lab.judge for lab in labels]

    def _fit_one(
        self,
        z: np.ndarray,
        y: np.ndarray,
        judges: list[str],
        k: int,
        prior: _LinkModel | None = None,
        strength: float = 0.0,
        weights: np.ndarray | None = None,
    ) -> _LinkModel:
        """Fit from scratch, or, with ``prior``, pulled towards its parameters with precision ``strength``."""
        names = sorted(set(judges) | (set(prior.offsets) if prior is not None else set()))
        d, m = z.shape[1], len(names)
        if prior is None:
            precision = np.concatenate([np.full(d, self.weight_decay), np.full(m, self.judge_shrinkage), np.zeros(k - 1)])
            centre = None
        else:
            precision = np.concatenate([np.full(d, strength), np.full(m, self.judge_shrinkage), np.full(k - 1, strength)])
            gaps = np.log(np.diff(prior.cuts))
            centre = np.concatenate([prior.weights, [prior.offsets.get(n, 0.0) for n in names], prior.cuts[:1], gaps])
        problem = _LinkProblem(z, y, np.array([names.index(j) for j in judges]), m, k, precision, centre, weights)
        start = problem.start() if centre is None else centre
        result = minimize(problem.loss, start, jac=True, method="L-BFGS-B", options={"maxiter": MAX_ITERATIONS})
        if not result.success or not np.all(np.isfinite(result.x)):
            raise CalibrationError(f"the cumulative-link fit did not converge: {result.message}")
        w, b, cut_params = problem.split(result.x)
        return _LinkModel(w, _cuts(cut_params), {name: float(v) for name, v in zip(names, b)})

    def adapt(self, data: RubricData, strength: float) -> OrdinalCalibrator:
        """A copy refitted on a team's own labels, every parameter pulled towards this model's.

        ``strength`` is the prior's precision per parameter against the labels' summed log-likelihood:
        with a few labels the copy stays near this model, with many it follows the labels. The feature
        scale is kept, so the weights keep their meaning. Judges' offsets are shrunk as in `fit`
        (towards their offset here, or 0 for a new judge). Questions without labels in ``data`` are kept.
        """
        self._require_fitted()
        if strength <= 0:
            raise CalibrationError(f"the adaptation strength must be > 0, got {strength}")
        conversations = len({lab.text_id for lab in data.labels if lab.question == self.main_question})
        if conversations < MIN_ADAPTATION_CONVERSATIONS:
            raise CalibrationError(
                f"adapting needs at least {MIN_ADAPTATION_CONVERSATIONS} conversations labelled on "
                f"{self.main_question}, got {conversations}"
            )
        if [(q, data.n_options[q]) for q in data.question_ids] != list(self._layout.items()):
            raise CalibrationError(
                f"the labels' questions {list(data.question_ids)} are not the calibrator's {list(self._layout)}"
            )
        adapted = OrdinalCalibrator.load_metadata(self._metadata())
        for question, model in self._models.items():
            if data.labels_for(question):
                rows = self._labelled_rows(data, question)
                adapted._models[question] = self._fit_one(*rows, self._layout[question], model, strength)
        adapted.adaptation_ = [
            *self.adaptation_,
            {"strength": strength, "conversations": conversations, "data_hash": data.content_hash()},
        ]
        adapted.version_ = adapted._compute_version()
        return adapted

    # -- prediction ----------------------------------------------------------

    def _require_fitted(self) -> None:
        if not self.is_fitted:
            raise CalibrationError("the calibrator is not fitted: call fit(data) first")

    def predict_proba(
        self, x: ArrayLike, question: str | None = None, judge: str | None | Sequence[str | None] = None
    ) -> Prediction:
        """Each row's answer distribution for ``question`` (default: the main question), for ``judge``."""
        self._require_fitted()
        return self._predict(self._standardised_features(x), question or self.main_question, judge)

    def _predict(self, z: np.ndarray, question: str, judge: str | None | Sequence[str | None]) -> Prediction:
        """`predict_proba` from standardised features (computed once when several questions are predicted)."""
        if question not in self._models:
            raise CalibrationError(f"no model for {question!r}; fitted: {sorted(self._models)}")
        judges = [judge] * len(z) if judge is None or isinstance(judge, str) else list(judge)
        if len(judges) != len(z):
            raise CalibrationError(f"{len(judges)} judges for {len(z)} feature rows")
        return Prediction(question, self._models[question].probabilities(z, judges), self._values[question])

    def predict_all(self, x: ArrayLike, judge: str | None | Sequence[str | None] = None) -> dict[str, Prediction]:
        """Every fitted question's prediction."""
        self._require_fitted()
        z = self._standardised_features(x)
        return {q: self._predict(z, q, judge) for q in self._models}

    def judge_offsets(self, question: str | None = None) -> Mapping[str, float]:
        """Each human judge's fitted offset ``b_a`` (higher: answers higher than the average judge)."""
        self._require_fitted()
        return dict(self._models[question or self.main_question].offsets)

    def features_from_judgement(self, judgement: Judgement) -> np.ndarray:
        """``x`` for one conversation from a judge's `Judgement` (questions the model does not read are zeros)."""
        self._require_fitted()
        require_answers(judgement, self.question_ids_)
        inputs = set(self.question_ids_)
        row: list[float] = []
        for question, k in self._layout.items():
            row.extend(judgement.probability_vector([question], self._layout) if question in inputs else [0.0] * k)
        return np.asarray(row, dtype=np.float64)

    def predict_judgement(
        self, judgement: Judgement, judges: Sequence[str] | None = None, questions: Sequence[str] | None = None
    ) -> dict[str, Prediction]:
        """Per-question predictions for one judged conversation (one row each): `predict_judgements` of one."""
        return self.predict_judgements([judgement], judges, questions)

    def predict_judgements(
        self, judgements: Sequence[Judgement], judges: Sequence[str] | None = None, questions: Sequence[str] | None = None
    ) -> dict[str, Prediction]:
        """Per-question predictions for judged conversations, row i for ``judgements[i]`` (one call for many rows
        costs little more than for one: numpy's per-call overhead is most of a row's cost).

        With ``judges`` the predictions are the mixture over that trusted set; without, the average
        judge's (no offset).
        """
        self._require_fitted()
        if not judgements:
            raise CalibrationError("no judgements to predict")
        z = self._standardised_features(np.stack([self.features_from_judgement(j) for j in judgements]))
        wanted = list(questions or self._models)
        if not judges:
            return {q: self._predict(z, q, None) for q in wanted}
        unknown = [j for j in judges if j not in self.judges_]
        if unknown:
            raise CalibrationError(f"judges {unknown} were not in the training data; known: {self.judges_}")
        out = {}
        for q in wanted:
            parts = [self._predict(z, q, j) for j in judges]
            out[q] = Prediction(q, np.mean([p.probabilities for p in parts], axis=0), parts[0].values)
        return out

    # -- persistence ---------------------------------------------------------

    def _metadata(self) -> dict[str, Any]:
        return {
            "format": ORDINAL_FORMAT,
            "format_version": FORMAT_VERSION,
            "hyperparameters": self.get_params(),
            "layout": [[q, k] for q, k in self._layout.items()],
            "scale": {"mean": self._mean.tolist(), "sd": self._sd.tolist()},
            "models": {q: m.as_json() for q, m in self._models.items()},
            "training_data_hash": self.training_data_hash_,
            "adaptations": self.adaptation_,
        }

    def _compute_version(self) -> str:
        return hashlib.sha256(json.dumps(self._metadata(), sort_keys=True).encode()).hexdigest()[:VERSION_HEX_CHARS]

    def save(self, path: str | Path) -> Path:
        """Write ``calibrator.json`` (every parameter, in plain JSON) into directory ``path``."""
        self._require_fitted()
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        write_json(path / METADATA_FILE, {**self._metadata(), "version": self.version_})
        return path

    @classmethod
    def load(cls, path: str | Path) -> OrdinalCalibrator:
        """Load a calibrator saved by `save`; any mismatch raises `CalibrationFileError`."""
        meta_path = Path(path) / METADATA_FILE
        try:
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
            raise CalibrationFileError(f"{path}: cannot read calibrator: {e}") from e
        try:
            model = cls.load_metadata(meta)
        except CalibrationFileError as e:
            raise CalibrationFileError(f"{meta_path}: {e}") from e
        if model.version_ != meta.get("version"):
            raise CalibrationFileError(
                f"{meta_path}: version {meta.get('version')!r} does not match its content ({model.version_})"
            )
        return model

    @classmethod
    def load_metadata(cls, meta: Any) -> OrdinalCalibrator:
        """A calibrator from the plain data `save` writes (without checking its version)."""
        if not isinstance(meta, dict) or meta.get("format") != ORDINAL_FORMAT:
            raise CalibrationFileError(f"not a {ORDINAL_FORMAT} file")
        if meta.get("format_version") != FORMAT_VERSION:
            raise CalibrationFileError(f"format_version {meta.get('format_version')!r}, expected {FORMAT_VERSION}")
        try:
            model = cls(**meta["hyperparameters"])
            layout = {str(q): int(k) for q, k in meta["layout"]}
            model._set_layout(layout, model.input_questions or tuple(layout))
            model._mean = np.asarray(meta["scale"]["mean"], dtype=np.float64)
            model._sd = np.asarray(meta["scale"]["sd"], dtype=np.float64)
            model._models = {str(q): _LinkModel.from_json(m) for q, m in meta["models"].items()}
            model.training_data_hash_ = str(meta["training_data_hash"])
            model.adaptation_ = [dict(a) for a in meta["adaptations"]]
        except (TypeError, ValueError, KeyError, AttributeError, CalibrationError) as e:
            raise CalibrationFileError(f"inconsistent calibrator: {e!r}") from e
        width = len(model.raw_features(np.zeros((1, sum(layout.values()))))[0])
        shapes = [len(model._mean), len(model._sd), *(len(m.weights) for m in model._models.values())]
        if not model._models or any(n != width for n in shapes):
            raise CalibrationFileError(f"scale and weights do not match the {width} features of its layout")
        model.version_ = model._compute_version()
        return model
