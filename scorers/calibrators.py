"""The calibrators convowatch has, behind one protocol, and what they share; loading whichever one a directory holds.

`OrdinalCalibrator` (the default of ``convowatch calibrate train``: it transfers
from synthetic to real conversations better, `bench/calibration_transfer.py`)
and LLM-Rubric's `CalibrationNetwork` both turn a judge's answer distributions
into predicted human answers (`Prediction`); the worker, the CLI and model
selection use only what `Calibrator` lists. This module does not import torch:
only the network needs it, so a worker with the ordinal calibrator never loads it
(about 180 MB of memory and 1.5 s of start-up, docs/benchmarks.md).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from scorers.datasets.llm_rubric import RubricData
from scorers.errors import UserError
from scorers.judges.base import Judgement

METADATA_FILE = "calibrator.json"  # every calibrator directory's description: its format, parameters, version
PROVENANCE_FILE = "provenance.json"  # where an adapted calibrator's labels came from (not part of its version)
VERSION_HEX_CHARS = 16
ORDINAL_FORMAT = "convowatch-ordinal-calibrator"
NETWORK_FORMAT = "convowatch-llm-rubric-calibrator"


class CalibrationError(UserError, ValueError):
    """Bad input to a calibrator (unknown question, wrong feature width, unfitted model)."""


class CalibrationFileError(CalibrationError):
    """A saved calibrator that cannot be loaded: missing, corrupted, or inconsistent with its metadata."""


def require_answers(judgement: Judgement, question_ids: Sequence[str]) -> None:
    """A calibrator reads these questions' answers: refuse a judgement that lacks any of them."""
    missing = [q for q in question_ids if q not in judgement.answers]
    if missing:
        raise CalibrationError(
            f"judgement for {judgement.conversation_id!r} lacks answers to {missing}; the calibrator needs {tuple(question_ids)}"
        )


@dataclass(frozen=True)
class Prediction:
    """Predicted answer distributions for one question (rows = conversations).

    ``probabilities`` has shape ``(n, K)``; ``values`` are the options' numeric
    values (1..K). The expected value minimises expected squared error; it is
    only meaningful for ordinal questions (not LLM-Rubric's Q8).
    """

    question: str
    probabilities: np.ndarray
    values: np.ndarray

    @property
    def expected_value(self) -> np.ndarray:
        return self.probabilities @ self.values

    @property
    def variance(self) -> np.ndarray:
        mean = self.expected_value
        return self.probabilities @ (self.values**2) - mean**2

    @property
    def entropy(self) -> np.ndarray:
        """Shannon entropy in nats."""
        p = self.probabilities
        with np.errstate(divide="ignore", invalid="ignore"):
            terms = np.where(p > 0, p * np.log(p), 0.0)
        return -terms.sum(axis=-1)

    def prob_at_most(self, value: float) -> np.ndarray:
        """P(y ≤ value), e.g. the share of dissatisfied users P(Q0 ≤ 2)."""
        return self.probabilities[:, self.values <= value].sum(axis=-1)


class Calibrator(Protocol):
    """A fitted (or fittable) calibrator, scikit-learn style."""

    main_question: str
    version_: str

    @property
    def question_ids_(self) -> tuple[str, ...]: ...  # the questions the judge must answer
    @property
    def n_options_(self) -> dict[str, int]: ...
    @property
    def judges_(self) -> tuple[str, ...]: ...

    def get_params(self) -> dict[str, Any]: ...
    def clone(self, **overrides: Any) -> Calibrator: ...
    def fit(self, data: RubricData) -> Calibrator: ...
    def predict_proba(self, x: Any, question: str | None = None, judge: Any = None) -> Prediction: ...
    def predict_judgement(
        self, judgement: Judgement, judges: Sequence[str] | None = None, questions: Sequence[str] | None = None
    ) -> dict[str, Prediction]: ...
    def predict_judgements(
        self, judgements: Sequence[Judgement], judges: Sequence[str] | None = None, questions: Sequence[str] | None = None
    ) -> dict[str, Prediction]: ...  # row i for judgements[i]
    def save(self, path: str | Path) -> Path: ...


def load_calibrator(path: str | Path) -> Calibrator:
    """Load the calibrator saved in directory ``path``, whichever kind its ``calibrator.json`` names."""
    meta_path = Path(path) / METADATA_FILE
    try:
        kind = json.loads(meta_path.read_text(encoding="utf-8")).get("format")
    except (OSError, json.JSONDecodeError, UnicodeDecodeError, AttributeError) as e:
        raise CalibrationFileError(f"{path}: cannot read calibrator: {e}") from e
    if kind == ORDINAL_FORMAT:
        from scorers.ordinal_calibration import OrdinalCalibrator

        return OrdinalCalibrator.load(path)
    if kind == NETWORK_FORMAT:
        from scorers.calibration import CalibrationNetwork  # torch

        return CalibrationNetwork.load(path)
    raise CalibrationFileError(f"{meta_path}: format {kind!r} is neither {ORDINAL_FORMAT} nor {NETWORK_FORMAT}")
