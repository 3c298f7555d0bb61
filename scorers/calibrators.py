"""The calibrators convowatch has, behind one protocol, and loading whichever one a directory holds.

`OrdinalCalibrator` (the default of ``convowatch calibrate train``: it transfers
from synthetic to real conversations better, `bench/calibration_transfer.py`)
and LLM-Rubric's `CalibrationNetwork` both turn a judge's answer distributions
into predicted human answers; the worker, the CLI and model selection use only
what `Calibrator` lists.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from scorers.calibration import FORMAT_NAME as NETWORK_FORMAT
from scorers.calibration import METADATA_FILE, CalibrationFileError, CalibrationNetwork, Prediction
from scorers.datasets.llm_rubric import RubricData
from scorers.judges.base import Judgement
from scorers.ordinal_calibration import FORMAT_NAME as ORDINAL_FORMAT
from scorers.ordinal_calibration import OrdinalCalibrator


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
    def save(self, path: str | Path) -> Path: ...


def load_calibrator(path: str | Path) -> Calibrator:
    """Load the calibrator saved in directory ``path``, whichever kind its ``calibrator.json`` names."""
    meta_path = Path(path) / METADATA_FILE
    try:
        kind = json.loads(meta_path.read_text(encoding="utf-8")).get("format")
    except (OSError, json.JSONDecodeError, UnicodeDecodeError, AttributeError) as e:
        raise CalibrationFileError(f"{path}: cannot read calibrator: {e}") from e
    if kind == ORDINAL_FORMAT:
        return OrdinalCalibrator.load(path)
    if kind == NETWORK_FORMAT:
        return CalibrationNetwork.load(path)
    raise CalibrationFileError(f"{meta_path}: format {kind!r} is neither {ORDINAL_FORMAT} nor {NETWORK_FORMAT}")
