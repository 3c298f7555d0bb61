"""The report's behaviours table: rates per assistant turn read back from the real chDB engine, with Wilson intervals."""

from __future__ import annotations

import dataclasses
import re

import pytest

from scorers.statistics import wilson_interval
from stream.records import BehaviourHit
from stream.report.data import Window, load_report
from stream.report.render import write_report
from tests.chdb_fixture import chdb_dsn, chdb_store, store_factory  # noqa: F401
from tests.integration.test_store import T0, scored, utc

DAY = Window(utc(T0 - 3600), utc(T0 + 86400))


def turns(*hits: tuple[int, str, bool]) -> tuple[BehaviourHit, ...]:
    return tuple(BehaviourHit(t, b, 0.9 if hit else 0.1, hit) for t, b, hit in hits)


@pytest.fixture
def store(store_factory):
    s = store_factory()
    s.write_scores(
        [
            scored("c1", "sat", 3.0, 0.1, 3.5, behaviours=turns((1, "ignore", True), (3, "ignore", False), (5, "ignore", False))),
            # sampled at π = 0.25: its one turn stands for four
            dataclasses.replace(
                scored("c2", "dsat", -3.0, 0.8, 1.5, behaviours=turns((1, "ignore", True))), inclusion_probability=0.25
            ),
            scored("c3", "sat", 2.0, 0.2, 3.0),  # judged without behaviours
        ]
    )
    # c1 scored again without hits (a re-score): only the latest score's rows count
    s.write_scores([scored("c1", "sat", 3.0, 0.1, 3.5, scored_at=T0 + 200, behaviours=turns((1, "ignore", False)))])
    return s


def test_rates_come_from_the_latest_scores_weighted_by_inclusion_probability(store) -> None:
    [rate] = load_report(store, DAY).behaviour_rates
    # c1's one current turn (no hit, weight 1) and c2's turn (hit, weight 4): 4 / 5
    assert (rate.behaviour, rate.rate, rate.hits, rate.turns) == ("ignore", pytest.approx(0.8), 1, 2)
    assert rate.interval() == wilson_interval(1, 2)


def test_the_page_shows_each_rate_with_its_wilson_interval_or_says_there_are_none(store, store_factory, tmp_path) -> None:
    page = write_report(load_report(store, DAY), tmp_path / "with").read_text(encoding="utf-8")
    table = re.search(r'<table id="behaviours">.*?</table>', page, flags=re.DOTALL).group(0)
    ci = wilson_interval(1, 2)
    assert "<td>ignore</td>" in table and "80.0%" in table and f"{ci.low:.1%} – {ci.high:.1%}" in table
    empty = store_factory()
    empty.write_scores([scored("c9", "sat", 1.0, 0.1, 3.0)])
    page = write_report(load_report(empty, DAY), tmp_path / "without").read_text(encoding="utf-8")
    assert "No behaviour rows in this window" in page and '<table id="behaviours">' not in page
