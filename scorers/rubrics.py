"""RUBICON rubric sets: rubrics, NetSAT, confidence windows, metrics, the JSON file.

A *rubric* is a short assertion about a conversation, SAT ("the assistant gives
a working code fix") or DSAT ("the assistant repeats generic advice"). The judge
answers it on a scale whose options carry scores in [0, 10]; a rubric's
*rating* is the expected option score under the judge's answer distribution,
and its *score* is the rating, negated for DSAT rubrics. A conversation's
NetSAT is the sum of its rubric scores.

NetSAT becomes a label in two ways (see `ConfidenceWindows`):

* the binary label: ``sat`` when NetSAT >= threshold θ, else ``dsat``;
* the confident label: ``sat`` inside the window where positive precision on
  the fitting data is >= P, ``dsat`` inside the window where negative precision
  is >= P, ``uncertain`` (abstain) in between.

Pure functions (`netsat_matrix`, `precision_curves`, `fit_threshold`,
`fit_windows`, `evaluate`) work on score matrices so that rubric *learning*
code can use them without judges. ``labels`` arrays are booleans: True means a
positive (satisfied) conversation.

The file format is described in ``docs/rubric-set-format.md`` and checked by
``rubric_set.schema.json``.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import jsonschema
import numpy as np

from scorers.conversation import Conversation
from scorers.errors import UserError
from scorers.json_file import json_path, loads_strict, write_json
from scorers.judges.base import Answer, Judge, Judgement, JudgeReplyError
from scorers.questions import LIKERT_5, Question, likert_question

SCHEMA_VERSION = 1
SCORE_MIN, SCORE_MAX = 0.0, 10.0
DEFAULT_PRECISION = 0.9
STARTER_SET = "starter_rubric_set.json"  # in scorers/data: `starter_rubric_set()`, made by bench/starter_rubric_set.py
VERSION_HEX_CHARS = 16
# Rubrics a rubric-set file may hold: each is one judge question per conversation scored (LLM-Rubric asks 9; learned
# sets keep 10-20), so a file of 10,000 would make 10,000 judge calls per conversation once promoted.
MAX_RUBRICS_PER_SET = 100
RUBRIC_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:-]*$"  # ids end up in metric labels and table rows

Label = Literal["sat", "dsat", "uncertain"]
SAT: Label = "sat"
DSAT: Label = "dsat"
UNCERTAIN: Label = "uncertain"
LABELS: tuple[Label, ...] = (SAT, DSAT, UNCERTAIN)  # the label vocabulary: store, report and dashboards use this
# A DSAT rubric "hits" a conversation when the judge rates it at least the middle of the 0-10 scale (its signed
# score <= -5). Almost every probabilistic answer puts some mass on "applies", so score < 0 would flag nearly every
# conversation. The store's and the Rubrics dashboard's SQL use it through `dsat_hit_sql`.
DSAT_HIT_RATING = 5.0


def is_dsat_hit(polarity: str, score: float) -> bool:
    """Whether a rubric's signed score is a DSAT hit (`DSAT_HIT_RATING`)."""
    return polarity == DSAT and score <= -DSAT_HIT_RATING


def dsat_hit_sql(alias: str = "") -> str:
    """`is_dsat_hit` as an SQL condition on the ``polarity`` and ``score`` columns (of table ``alias``, if given),
    for the store's and the dashboards' queries of rubric scores."""
    col = f"{alias}." if alias else ""
    return f"{col}polarity = '{DSAT}' AND {col}score <= -{DSAT_HIT_RATING:g}"


class RubricSetError(UserError, ValueError):
    """A rubric, rubric set or rubric-set file that is not usable; says which field and why."""

    def __init__(self, field: str, reason: str, source: str | None = None) -> None:
        self.field = field
        self.reason = reason
        self.source = source
        where = f"{field}: " if field else ""
        super().__init__(f"{source}: {where}{reason}" if source else f"{where}{reason}")

    def within(self, prefix: str) -> RubricSetError:
        """The same error, its field path prefixed (``scale[2].score`` -> ``rubrics[3].scale[2].score``)."""
        joined = prefix if not self.field else f"{prefix}{'' if self.field.startswith('[') else '.'}{self.field}"
        return RubricSetError(joined, self.reason, self.source)


class Polarity(StrEnum):
    """Whether agreeing with a rubric means the user was satisfied (SAT) or not (DSAT)."""

    SAT = "sat"
    DSAT = "dsat"

    @property
    def sign(self) -> float:
        return 1.0 if self is Polarity.SAT else -1.0


# ---------------------------------------------------------------------------- rubrics


@dataclass(frozen=True)
class Scale:
    """A rubric's answer options: ``keys[i]`` means ``labels[i]`` and scores ``scores[i]`` in [0, 10].

    Scores need not be monotone in the keys: LLM-Rubric's Q8 ("appropriate
    number of turns") has 1 = "fewer would do" and 2 = "more are needed", both
    bad, and 3 = "reasonable".
    """

    keys: tuple[str, ...]
    labels: tuple[str, ...]
    scores: tuple[float, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "keys", tuple(self.keys))
        object.__setattr__(self, "labels", tuple(self.labels))
        object.__setattr__(self, "scores", tuple(float(s) for s in self.scores))
        if len(self.keys) < 2:
            raise RubricSetError("scale", f"needs at least 2 options, got {len(self.keys)}")
        if not len(self.keys) == len(self.labels) == len(self.scores):
            raise RubricSetError("scale", "keys, labels and scores must have the same length")
        seen: set[str] = set()
        for i, (key, score) in enumerate(zip(self.keys, self.scores)):
            if not key or key != key.strip():
                raise RubricSetError(f"scale[{i}].key", f"{key!r} must be non-empty without surrounding spaces")
            if key in seen:
                raise RubricSetError(f"scale[{i}].key", f"duplicate option key {key!r}")
            seen.add(key)
            if not (SCORE_MIN <= score <= SCORE_MAX):  # also refuses NaN
                raise RubricSetError(f"scale[{i}].score", f"{score} is outside [{SCORE_MIN:g}, {SCORE_MAX:g}]")

    @classmethod
    def linear(cls, keys: Sequence[str], labels: Sequence[str] | None = None) -> Scale:
        """Ordinal options, worst first, spread evenly over [0, 10] (a 4-option scale: 0, 3.33, 6.67, 10)."""
        step = (SCORE_MAX - SCORE_MIN) / (len(keys) - 1) if len(keys) > 1 else 0.0
        return cls(tuple(keys), tuple(labels or keys), tuple(SCORE_MIN + i * step for i in range(len(keys))))

    @property
    def is_likert(self) -> bool:
        """True for the 5-point agreement scale (whatever its scores): its rubrics are assertions."""
        return (self.keys, self.labels) == LIKERT_SCALE_KEYS_LABELS


LIKERT_SCALE_KEYS_LABELS = (tuple(k for k, _ in LIKERT_5), tuple(v for _, v in LIKERT_5))
LIKERT_SCALE = Scale.linear(*LIKERT_SCALE_KEYS_LABELS)  # "1".."5" -> 0, 2.5, 5, 7.5, 10


@dataclass(frozen=True)
class Rubric:
    """One rubric. On the Likert scale ``text`` is an assertion; on any other scale it is the question asked.

    ``polarity`` may be given as a `Polarity` or its value (``"sat"``/``"dsat"``).
    """

    id: str
    text: str
    polarity: Polarity
    scale: Scale = LIKERT_SCALE

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not re.fullmatch(RUBRIC_ID_PATTERN, self.id):
            raise RubricSetError("id", f"{self.id!r} does not match {RUBRIC_ID_PATTERN}")
        if not isinstance(self.text, str) or not self.text.strip():
            raise RubricSetError("text", "must be a non-empty string")
        try:
            object.__setattr__(self, "polarity", Polarity(self.polarity))
        except ValueError:
            raise RubricSetError("polarity", f"{self.polarity!r} is not one of {[p.value for p in Polarity]}") from None

    def question(self) -> Question:
        """The multiple-choice question the judge answers for this rubric (id = rubric id)."""
        if self.scale.is_likert:
            return likert_question(self.id, self.text)
        return Question(id=self.id, text=self.text, option_keys=self.scale.keys, option_labels=self.scale.labels)

    def rating(self, answer: Answer) -> float:
        """Expected option score in [0, 10], renormalised over the covered mass (no mass: `JudgeReplyError`)."""
        if len(answer.probabilities) != len(self.scale.keys):
            raise JudgeReplyError(
                f"rubric {self.id!r}: answer has {len(answer.probabilities)} probabilities "
                f"but the scale has {len(self.scale.keys)} options"
            )
        return answer.expected_value(self.scale.scores)

    def score(self, answer: Answer) -> float:
        """The rubric's contribution to NetSAT: the rating, negated for DSAT."""
        return self.polarity.sign * self.rating(answer)


# ---------------------------------------------------------------------------- windows


@dataclass(frozen=True)
class ConfidenceWindows:
    """The threshold θ and the two confidence windows around it, fitted at precision P.

    ``netsat <= dsat_upper`` is the dsat window, ``netsat >= sat_lower`` the sat
    window; None means that side has no window (no threshold reached P). The
    windows must satisfy ``dsat_upper < threshold <= sat_lower``: they never
    overlap, and a confident label always agrees with the binary label.
    """

    threshold: float
    dsat_upper: float | None = None
    sat_lower: float | None = None
    precision: float = DEFAULT_PRECISION

    def __post_init__(self) -> None:
        for name, optional in (("threshold", False), ("dsat_upper", True), ("sat_lower", True), ("precision", False)):
            value = getattr(self, name)
            if value is None and optional:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise RubricSetError(name, f"must be a finite number, got {value!r}")
            object.__setattr__(self, name, float(value))
        if not 0.0 < self.precision <= 1.0:
            raise RubricSetError("precision", f"{self.precision} is outside (0, 1]")
        if self.dsat_upper is not None and not self.dsat_upper < self.threshold:
            raise RubricSetError("windows.dsat_upper", f"{self.dsat_upper} must be < threshold {self.threshold}")
        if self.sat_lower is not None and not self.threshold <= self.sat_lower:
            raise RubricSetError("windows.sat_lower", f"{self.sat_lower} must be >= threshold {self.threshold}")

    def label(self, netsat: float) -> Label:
        """``sat`` / ``dsat`` inside a window (bounds inclusive), else ``uncertain``."""
        if self.sat_lower is not None and netsat >= self.sat_lower:
            return SAT
        if self.dsat_upper is not None and netsat <= self.dsat_upper:
            return DSAT
        return UNCERTAIN

    def binary_label(self, netsat: float) -> Label:
        """``sat`` when netsat >= threshold, else ``dsat`` (never abstains)."""
        return SAT if netsat >= self.threshold else DSAT

    def labels(self, netsats: np.ndarray) -> np.ndarray:
        """`label` of every value, as a string array."""
        s = np.asarray(netsats, dtype=float)
        sat = np.zeros(s.shape, bool) if self.sat_lower is None else s >= self.sat_lower
        dsat = np.zeros(s.shape, bool) if self.dsat_upper is None else s <= self.dsat_upper
        return np.where(sat, SAT, np.where(dsat, DSAT, UNCERTAIN))


UNFITTED = ConfidenceWindows(threshold=0.0)  # no windows: abstains on everything until fitted


# ---------------------------------------------------------------------------- pure functions


def _polarity_signs(polarities: Sequence[Polarity | str]) -> np.ndarray:
    try:
        return np.array([Polarity(p).sign for p in polarities], dtype=float)
    except ValueError as e:
        raise RubricSetError("polarities", str(e)) from None


def netsat_matrix(ratings: np.ndarray, polarities: Sequence[Polarity | str]) -> np.ndarray:
    """NetSAT per conversation from unsigned ratings ``[n_conversations, n_rubrics]`` in [0, 10]."""
    r = np.asarray(ratings, dtype=float)
    signs = _polarity_signs(polarities)
    if r.ndim != 2 or r.shape[1] != len(signs):
        raise RubricSetError("ratings", f"expected shape (n, {len(signs)}), got {r.shape}")
    if not np.all((r >= SCORE_MIN) & (r <= SCORE_MAX)):
        raise RubricSetError("ratings", f"must be finite and within [{SCORE_MIN:g}, {SCORE_MAX:g}]")
    return r @ signs


def _check_labelled(netsats: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    s = np.asarray(netsats, dtype=float)
    y = np.asarray(labels)
    if s.ndim != 1 or y.shape != s.shape:
        raise RubricSetError("netsats", f"netsats {s.shape} and labels {y.shape} must be 1-D of the same length")
    if not np.all(np.isfinite(s)):
        raise RubricSetError("netsats", "must be finite")
    if y.dtype != bool:
        if not np.all((y == 0) | (y == 1)):
            raise RubricSetError("labels", "must be booleans (True = positive) or 0/1")
        y = y.astype(bool)
    if y.all() or not y.any():
        raise RubricSetError("labels", f"need both positive and negative conversations, got {int(y.sum())} of {len(y)}")
    return s, y


@dataclass(frozen=True)
class PrecisionCurves:
    """At each threshold t: precision of ``netsat >= t`` for positives and of ``netsat <= t`` for negatives.

    NaN where the side is empty (no conversation at or beyond t).
    """

    thresholds: np.ndarray
    positive: np.ndarray
    negative: np.ndarray


def precision_curves(netsats: np.ndarray, labels: np.ndarray, thresholds: np.ndarray) -> PrecisionCurves:
    """Positive and negative precision curves over ``thresholds`` (the basis of windows and sharpness loss)."""
    s, y = _check_labelled(netsats, labels)
    t = np.asarray(thresholds, dtype=float)
    all_sorted, pos_sorted, neg_sorted = np.sort(s), np.sort(s[y]), np.sort(s[~y])
    n_above = len(s) - np.searchsorted(all_sorted, t, side="left")
    pos_above = len(pos_sorted) - np.searchsorted(pos_sorted, t, side="left")
    n_below = np.searchsorted(all_sorted, t, side="right")
    neg_below = np.searchsorted(neg_sorted, t, side="right")
    with np.errstate(invalid="ignore", divide="ignore"):
        positive = np.where(n_above > 0, pos_above / n_above, np.nan)
        negative = np.where(n_below > 0, neg_below / n_below, np.nan)
    return PrecisionCurves(thresholds=t, positive=positive, negative=negative)


def fit_threshold(netsats: np.ndarray, labels: np.ndarray) -> float:
    """θ = midpoint of the mean NetSAT of positives and of negatives.

    This is RUBICON's θc: rubric selection shapes the precision curves around
    it, it is closed-form and has no ties, and it moves little when a few
    conversations change (accuracy-maximising cuts jump between gaps in small
    samples). It ignores class imbalance; the windows carry the precision.
    """
    s, y = _check_labelled(netsats, labels)
    return float((s[y].mean() + s[~y].mean()) / 2.0)


def fit_windows(
    netsats: np.ndarray,
    labels: np.ndarray,
    precision: float = DEFAULT_PRECISION,
    threshold: float | None = None,
) -> ConfidenceWindows:
    """Fit θ (`fit_threshold` unless given) and the widest windows whose precision on this data is >= P.

    Window edges are observed NetSAT values. The sat window is ``[t, ∞)`` for
    the smallest t >= θ whose positive precision is >= P; the dsat window is
    ``(-∞, t]`` for the largest t < θ whose negative precision is >= P. Each is
    searched on its own side of θ, so they cannot overlap. No such t: None.
    """
    s, y = _check_labelled(netsats, labels)
    theta = fit_threshold(s, y) if threshold is None else float(threshold)
    candidates = np.unique(s)
    curves = precision_curves(s, y, candidates)
    sat_ok = (candidates >= theta) & (curves.positive >= precision)
    dsat_ok = (candidates < theta) & (curves.negative >= precision)
    return ConfidenceWindows(
        threshold=theta,
        dsat_upper=float(candidates[dsat_ok].max()) if dsat_ok.any() else None,
        sat_lower=float(candidates[sat_ok].min()) if sat_ok.any() else None,
        precision=precision,
    )


@dataclass(frozen=True)
class RubiconMetrics:
    """RUBICON's evaluation figures. Precision, recall and F1 treat *satisfied* (label True) as positive.

    ``accuracy``/``precision``/``recall``/``f1`` are for the binary threshold
    classifier on all conversations; ``yield_rate`` (YR@P) is the share outside
    the uncertainty window; ``confident_accuracy`` is the accuracy of the
    window labels on those conversations (NaN if none). ``precision`` is NaN
    when nothing is predicted satisfied.
    """

    n: int
    n_positive: int
    delta_netsat: float
    yield_rate: float
    accuracy: float
    precision: float
    recall: float
    f1: float
    confident_accuracy: float


def evaluate(netsats: np.ndarray, labels: np.ndarray, rule: ConfidenceWindows | RubricSet) -> RubiconMetrics:
    """Score a labelled sample with a rubric set's (or a bare) threshold and windows."""
    s, y = _check_labelled(netsats, labels)
    windows = rule.windows if isinstance(rule, RubricSet) else rule
    predicted_sat = s >= windows.threshold
    tp = int(np.sum(predicted_sat & y))
    precision = tp / int(predicted_sat.sum()) if predicted_sat.any() else math.nan
    recall = tp / int(y.sum())
    f1 = 0.0 if precision + recall == 0 else 2 * precision * recall / (precision + recall)
    confident = windows.labels(s)
    decided = confident != UNCERTAIN
    confident_correct = (confident[decided] == SAT) == y[decided]
    return RubiconMetrics(
        n=len(s),
        n_positive=int(y.sum()),
        delta_netsat=float(s[y].mean() - s[~y].mean()),
        yield_rate=float(decided.mean()),
        accuracy=float(np.mean(predicted_sat == y)),
        precision=float(precision),
        recall=float(recall),
        f1=float(f1),
        confident_accuracy=float(confident_correct.mean()) if decided.any() else math.nan,
    )


# ---------------------------------------------------------------------------- rubric sets


@dataclass(frozen=True)
class RubricScore:
    """A conversation scored by a rubric set: NetSAT, signed per-rubric scores, both labels."""

    rubric_set_version: str
    netsat: float
    rubric_scores: Mapping[str, float]
    label: Label
    threshold_label: Label


@dataclass(frozen=True)
class RubricSet:
    """Rubrics with their threshold and windows; ``metadata`` is free-form and not part of `version`.

    A set built without windows (`UNFITTED`) abstains on every conversation
    until `fit_windows` is called; its binary label (θ = 0) means nothing yet.
    """

    rubrics: tuple[Rubric, ...]
    windows: ConfidenceWindows = UNFITTED
    metadata: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "rubrics", tuple(self.rubrics))
        object.__setattr__(self, "metadata", dict(self.metadata))
        if not self.rubrics:
            raise RubricSetError("rubrics", "a rubric set needs at least one rubric")
        first_index: dict[str, int] = {}
        for i, rubric in enumerate(self.rubrics):
            if rubric.id in first_index:
                first = first_index[rubric.id]
                raise RubricSetError(f"rubrics[{i}].id", f"duplicate id {rubric.id!r} (also rubrics[{first}])")
            first_index[rubric.id] = i

    @property
    def threshold(self) -> float:
        return self.windows.threshold

    @property
    def precision(self) -> float:
        return self.windows.precision

    @property
    def polarities(self) -> tuple[Polarity, ...]:
        return tuple(r.polarity for r in self.rubrics)

    @functools.cached_property
    def version(self) -> str:
        """Content hash of rubrics (order-free), threshold and windows; metadata excluded."""
        content = {
            "rubrics": sorted((_rubric_content(r) for r in self.rubrics), key=lambda r: r["id"]),
            "threshold": self.windows.threshold,
            "precision": self.windows.precision,
            "windows": {"dsat_upper": self.windows.dsat_upper, "sat_lower": self.windows.sat_lower},
        }
        canonical = json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:VERSION_HEX_CHARS]

    def questions(self) -> tuple[Question, ...]:
        """The questions to put to a judge, in rubric order."""
        return tuple(r.question() for r in self.rubrics)

    def answer_for(self, judgement: Judgement, rubric: Rubric) -> Answer:
        """``rubric``'s answer in ``judgement``; `JudgeReplyError` if the judge gave none."""
        answer = judgement.answers.get(rubric.id)
        if answer is None:
            raise JudgeReplyError(f"judgement of {judgement.conversation_id!r} has no answer for rubric {rubric.id!r}")
        return answer

    def netsat(self, judgement: Judgement) -> float:
        """Σ SAT ratings − Σ DSAT ratings for one judged conversation."""
        return float(sum(r.score(self.answer_for(judgement, r)) for r in self.rubrics))

    def rubric_scores(self, judge: Judge, conversations: Iterable[Conversation]) -> np.ndarray:
        """Each conversation's signed rubric scores (conversations × rubrics, in rubric order), asking ``judge`` this
        set's questions; a row sums to the conversation's NetSAT."""
        questions = list(self.questions())
        judgements = (judge.judge(c, questions) for c in conversations)
        rows = [[r.score(self.answer_for(j, r)) for r in self.rubrics] for j in judgements]
        return np.array(rows, dtype=float).reshape(len(rows), len(self.rubrics))

    def netsats(self, judge: Judge, conversations: Iterable[Conversation]) -> np.ndarray:
        """NetSAT of each conversation, asking ``judge`` this set's questions (in iteration order)."""
        return np.array([float(sum(row)) for row in self.rubric_scores(judge, conversations)], dtype=float)

    def label(self, netsat: float) -> Label:
        return self.windows.label(netsat)

    def score(self, judgement: Judgement) -> RubricScore:
        scores = {r.id: r.score(self.answer_for(judgement, r)) for r in self.rubrics}
        netsat = float(sum(scores.values()))
        return RubricScore(
            rubric_set_version=self.version,
            netsat=netsat,
            rubric_scores=scores,
            label=self.windows.label(netsat),
            threshold_label=self.windows.binary_label(netsat),
        )

    def fit_windows(self, netsats: np.ndarray, labels: np.ndarray, precision: float = DEFAULT_PRECISION) -> RubricSet:
        """A copy with θ and windows fitted on labelled NetSATs (see the module function)."""
        return dataclasses.replace(self, windows=fit_windows(netsats, labels, precision))

    # -- file format ------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "version": self.version,
            "threshold": self.windows.threshold,
            "precision": self.windows.precision,
            "windows": {"dsat_upper": self.windows.dsat_upper, "sat_lower": self.windows.sat_lower},
            "rubrics": [_rubric_to_dict(r) for r in self.rubrics],
            "metadata": dict(self.metadata),
        }

    def save(self, path: str | Path) -> None:
        """Write the JSON file (atomically: a reader never sees half a file)."""
        try:
            write_json(path, self.to_dict())
        except (TypeError, ValueError) as e:
            raise RubricSetError("metadata", f"must be JSON-serialisable: {e}") from None

    @classmethod
    def from_dict(cls, doc: Any, source: str | None = None) -> RubricSet:
        """Validate a parsed document (schema, then semantic rules) and build the set."""
        try:
            return _from_dict(doc)
        except RubricSetError as e:
            raise RubricSetError(e.field, e.reason, source) from None

    @classmethod
    def load(cls, path: str | Path) -> RubricSet:
        """Read a rubric-set file; refuses bad files with the field path and reason."""
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
            doc = loads_strict(text)
        except (OSError, UnicodeDecodeError, ValueError) as e:
            raise RubricSetError("", f"cannot read rubric set: {e}", str(path)) from None
        return cls.from_dict(doc, source=str(path))


def _rubric_content(rubric: Rubric) -> dict[str, Any]:
    scale = rubric.scale
    return {
        "id": rubric.id,
        "text": rubric.text,
        "polarity": rubric.polarity.value,
        "scale": [{"key": k, "label": lab, "score": s} for k, lab, s in zip(scale.keys, scale.labels, scale.scores)],
    }


def _rubric_to_dict(rubric: Rubric) -> dict[str, Any]:
    out = _rubric_content(rubric)
    if rubric.scale == LIKERT_SCALE:
        del out["scale"]  # the default; keeps hand-read files short
    return out


def starter_rubric_set() -> RubricSet:
    """The generic rubric set shipped in ``scorers/data`` as a starting point (its metadata says for which judge
    its θ and windows were fitted, and what they measured); `convowatch run` uses it when none is configured."""
    text = resources.files("scorers").joinpath("data", STARTER_SET).read_text(encoding="utf-8")
    return RubricSet.from_dict(loads_strict(text), source=f"scorers/data/{STARTER_SET}")


def schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of rubric-set files."""
    return json.loads(resources.files("scorers").joinpath("rubric_set.schema.json").read_text(encoding="utf-8"))


@functools.cache
def _validator() -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(schema())


def _from_dict(doc: Any) -> RubricSet:
    if isinstance(doc, dict) and doc.get("schema_version") not in (None, SCHEMA_VERSION):
        raise RubricSetError(
            "schema_version", f"this convowatch reads version {SCHEMA_VERSION}, the file has {doc['schema_version']!r}"
        )
    if isinstance(doc, dict) and isinstance(doc.get("rubrics"), list) and len(doc["rubrics"]) > MAX_RUBRICS_PER_SET:
        raise RubricSetError(
            "rubrics",
            f"{len(doc['rubrics'])} rubrics; a set holds at most {MAX_RUBRICS_PER_SET} (each is a judge question "
            "asked of every conversation scored): keep the rubrics that tell conversations apart (convowatch learn selects them)",
        )
    error = jsonschema.exceptions.best_match(_validator().iter_errors(doc))
    if error is not None:
        raise RubricSetError(json_path(error.absolute_path) or "(top level)", error.message)

    rubrics = []
    for i, raw in enumerate(doc["rubrics"]):
        try:
            scale = LIKERT_SCALE
            if "scale" in raw:
                scale = Scale(
                    keys=tuple(o["key"] for o in raw["scale"]),
                    labels=tuple(o.get("label", o["key"]) for o in raw["scale"]),
                    scores=tuple(o["score"] for o in raw["scale"]),
                )
            rubrics.append(Rubric(id=raw["id"], text=raw["text"], polarity=raw["polarity"], scale=scale))
        except RubricSetError as e:
            raise e.within(f"rubrics[{i}]") from None
    windows = ConfidenceWindows(
        threshold=doc["threshold"],
        dsat_upper=doc["windows"]["dsat_upper"],
        sat_lower=doc["windows"]["sat_lower"],
        precision=doc["precision"],
    )
    rubric_set = RubricSet(rubrics=tuple(rubrics), windows=windows, metadata=doc.get("metadata", {}))
    stored = doc.get("version")
    if stored is not None and stored != rubric_set.version:
        raise RubricSetError(
            "version",
            f"{stored!r} does not match the content (hash {rubric_set.version!r}): the file was edited after it "
            "was saved; remove 'version' to accept the edit as a new version",
        )
    return rubric_set
