"""The report's agreement-with-users table, read back from the real chDB engine: the scorer's labels against the
users' latest thumbs, per scorer version, with Wilson and bootstrap intervals."""

from __future__ import annotations

import re

import numpy as np
import pytest

from scorers.statistics import auroc, wilson_interval
from stream.feedback_labels import FeedbackLabelRules
from stream.records import FeedbackRow
from stream.report.agreement import MIN_PER_CLASS, agreement
from stream.report.data import Window, load_report
from stream.report.render import write_report
from tests.chdb_fixture import chdb_dsn, chdb_store, store_factory  # noqa: F401
from tests.integration.test_store import T0, scored, unscored, utc

DAY = Window(utc(T0 - 3600), utc(T0 + 86400))


def rating(cid: str, turn: int, value: str, at: float = T0) -> FeedbackRow:
    return FeedbackRow(cid, turn, value, "", at, {}, at + 1)


@pytest.fixture
def store(store_factory):
    """v1 scored 12 rated conversations: 6 rated down (4 labelled dsat), 6 rated up (5 labelled sat), one rated both
    ways, one unrated and one unscored rated down; v2 scored 2 others."""
    s = store_factory()
    down = [scored(f"d{i}", "dsat", -2.0 - i, 0.7, 1.8) for i in range(4)] + [
        scored(f"d{i}", "sat", 1.0 + i, 0.3, 3.0) for i in (4, 5)
    ]
    up = [scored(f"u{i}", "sat", 2.0 + i, 0.2, 3.2) for i in range(5)] + [scored("u5", "dsat", -1.5, 0.6, 2.0)]
    s.write_scores([*down, *up, scored("both", "sat", 1.0, 0.4, 2.9), scored("quiet", "dsat", -4.0, 0.9, 1.2), unscored("gone")])
    s.write_scores(
        [scored("w1", "dsat", -1.0, None, None, scorer_version="v2"), scored("w2", "sat", 1.0, None, None, scorer_version="v2")]
    )
    feedback = [rating(r.conversation.conversation_id, 1, "down") for r in down]
    feedback += [rating(r.conversation.conversation_id, 1, "up") for r in up]
    # "both": down on one turn, up on another; d0 was rated up first, then down (the latest rating counts)
    feedback += [rating("both", 1, "down"), rating("both", 3, "up"), rating("d0", 1, "up", at=T0 - 60), rating("gone", 1, "down")]
    feedback += [rating("w1", 1, "down"), rating("w2", 1, "up")]
    s.write_feedback(feedback)
    return s


def test_per_scorer_version_shares_and_aurocs_come_from_the_users_latest_ratings(store) -> None:
    by_version = {a.scorer_version: a for a in load_report(store, DAY).user_agreement}
    assert set(by_version) == {"v1", "v2"}
    v1 = by_version["v1"]
    assert (v1.rated_down, v1.rated_up, v1.conflicts) == (6, 6, 1)
    assert v1.dsat_when_rated_down == wilson_interval(4, 6)
    assert v1.sat_when_rated_up == wilson_interval(5, 6)
    netsat_up = [2.0, 3.0, 4.0, 5.0, 6.0, -1.5]
    netsat_down = [-2.0, -3.0, -4.0, -5.0, 5.0, 6.0]
    expected = auroc(netsat_up + netsat_down, [True] * 6 + [False] * 6)
    assert v1.auroc_netsat is not None and v1.auroc_netsat.estimate == pytest.approx(expected)
    assert v1.auroc_netsat.low <= expected <= v1.auroc_netsat.high
    p_sat = np.array([0.8] * 5 + [0.4] + [0.3] * 4 + [0.7] * 2)
    assert v1.auroc_calibrated is not None
    assert v1.auroc_calibrated.estimate == pytest.approx(auroc(p_sat, [True] * 6 + [False] * 6))
    v2 = by_version["v2"]  # one conversation per class: shares, but too few for an AUROC; no calibrator
    assert (v2.rated_down, v2.rated_up) == (1, 1) and v2.dsat_when_rated_down == wilson_interval(1, 1)
    assert v2.auroc_netsat is None and v2.auroc_calibrated is None


def test_conflicts_can_count_as_rated_down() -> None:
    rows = [
        {"threshold_label": "dsat", "netsat": -1.0, "dissatisfaction_probability": 0.7, "ratings": ["down", "up"]},
        {"threshold_label": "sat", "netsat": 1.0, "dissatisfaction_probability": 0.2, "ratings": ["up"]},
    ]
    excluded = agreement("v", rows, FeedbackLabelRules())
    assert (excluded.rated_down, excluded.rated_up, excluded.conflicts) == (0, 1, 1) and excluded.dsat_when_rated_down is None
    negative = agreement("v", rows, FeedbackLabelRules(on_conflict="negative"))
    assert (negative.rated_down, negative.conflicts) == (1, 0) and negative.dsat_when_rated_down == wilson_interval(1, 1)
    assert MIN_PER_CLASS > 1 and negative.auroc_netsat is None


def test_the_page_shows_the_table_or_says_nobody_rated(store, store_factory, tmp_path) -> None:
    page = write_report(load_report(store, DAY), tmp_path / "with").read_text(encoding="utf-8")
    table = re.search(r'<table id="user-agreement">.*?</table>', page, flags=re.DOTALL).group(0)
    ci = wilson_interval(4, 6)
    assert "<td>v1</td>" in table and f"67% ({ci.low:.0%} – {ci.high:.0%})" in table
    empty = store_factory()
    empty.write_scores([scored("c9", "sat", 1.0, 0.1, 3.0)])
    page = write_report(load_report(empty, DAY), tmp_path / "without").read_text(encoding="utf-8")
    assert "No scored conversation in this window has a user rating" in page and 'id="user-agreement"' not in page
