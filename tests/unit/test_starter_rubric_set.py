"""The starter rubric set: shipped, valid, fitted on real labels, and what a worker without a rubric set scores with."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from scorers.rubrics import STARTER_SET, RubricSet, starter_rubric_set
from stream.service import build_scorer, new_metrics
from stream.settings import Settings
from tests.data_paths import LLM_RUBRIC

ROOT = Path(__file__).resolve().parents[2]


def test_the_starter_set_is_the_generic_set_with_fitted_windows_and_says_what_it_is() -> None:
    starter = starter_rubric_set()
    assert starter == RubricSet.load(ROOT / "scorers" / "data" / STARTER_SET)
    assert len(starter.rubrics) == 8 and sorted({r.polarity.value for r in starter.rubrics}) == ["dsat", "sat"]
    assert starter.windows.dsat_upper is not None or starter.windows.sat_lower is not None  # fitted, not UNFITTED
    assert {"note", "judge", "fitted_on", "measured", "made_by"} <= set(starter.metadata)
    results = json.loads((ROOT / "bench" / "results" / "starter_rubric_set.json").read_text(encoding="utf-8"))
    assert results["shipped"]["version"] == starter.version  # the file is the benchmark's output


def test_a_worker_without_a_rubric_set_scores_with_the_starter_set_and_warns(caplog) -> None:
    settings = Settings(
        judge={"backend": "recorded", "recorded_answers": LLM_RUBRIC / "gpt-3.5-turbo-16k_real_evaluations_FIXED.tsv"},
        metrics={"port": 0},
    )
    with caplog.at_level(logging.WARNING, logger="stream.service"):
        scorer = build_scorer(settings, new_metrics(settings))
    assert scorer.rubric_set == starter_rubric_set()
    [warning] = [r.getMessage() for r in caplog.records if "starter set" in r.getMessage()]
    assert starter_rubric_set().version in warning and "convowatch rubrics fit" in warning
