"""bench/alert_detection.py's alert arithmetic is the spike rule's: on the scenarios of the promtool unit tests'
model (make_unit_tests.py, which promtool holds to the committed rules), it fires at exactly the minutes the model
says; its calibrated binormal scorers have the AUROC they are built for."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "bench")]

import alert_detection as bench  # noqa: E402

from dashboards.alert_windows import AlertWindows  # noqa: E402
from scorers.statistics import auroc  # noqa: E402

MODEL = runpy.run_path(str(ROOT / "dashboards" / "alerts" / "tests" / "make_unit_tests.py"))


@pytest.mark.parametrize("product", ["shop", "daily", "small", "calm", "blip", "grown", "edge", "noisy", "noisier", "full"])
def test_the_bench_fires_where_the_rules_model_fires(product: str) -> None:
    s = MODEL["PRODUCTS"][product]  # judged with π = 1: no sampling variance
    fires = bench.firing(np.array(s["n"], float), np.array(s["dsat"], float), np.array(s["sq"], float), AlertWindows())
    states = MODEL["states"](lambda t: MODEL["spike"](product, t)[0], 1, len(s["n"]))
    assert [t for t in range(1, len(s["n"]) + 1) if fires[t - 1]] == [t for t, st in states.items() if st == "firing"]


def test_some_scenarios_fire_so_the_comparison_is_not_vacuous() -> None:
    s = MODEL["PRODUCTS"]["shop"]
    assert bench.firing(np.array(s["n"], float), np.array(s["dsat"], float), np.array(s["sq"], float), AlertWindows()).any()


@pytest.mark.parametrize("target", [0.6, 0.8, 0.95])
def test_binormal_scorers_have_their_auroc_and_are_calibrated(target: float) -> None:
    pool = bench.binormal_pool(target, 0.33, np.random.default_rng(1))
    assert auroc(pool.p, pool.humans_dsat) == pytest.approx(target, abs=0.02)
    assert pool.p.mean() == pytest.approx(pool.humans_dsat.mean(), abs=0.02)  # calibrated: mean P is the share
