"""The report's agreement-with-users section: does the scorer still agree with the people it scores for?

For the scored conversations in the report's scope that users rated (thumbs on any turn; the latest rating of
each turn, labelled by `stream.feedback_labels.FeedbackLabelRules`: rated down, rated up, or both and left
out), per scorer version: the share of conversations rated down that the scorer labelled dissatisfied (its
θ label), the share rated up that it labelled satisfied, both with Wilson intervals, and the AUROC with which
NetSAT and the calibrated P(satisfied) = 1 − P(dissatisfied) separate rated-up from rated-down conversations,
with bootstrap intervals. A drop next to the usual level says the judge drifted, the product changed, or a
prompt broke.

Why per class and AUROC rather than one agreement rate: sampling can judge every conversation rated down
(`scoring.sampling.always_score_negative_feedback`) and only a share of the rest, so the mix of classes among
judged conversations is not the users' mix; rates within a class and AUROC do not depend on it. Within a class
the shares are not weighted by 1/π (a class sampled at one rate needs no weight).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from scorers.statistics import ConfidenceInterval, auroc, bootstrap_ci, wilson_interval
from stream.feedback_labels import FeedbackLabelRules, ratings_sql
from stream.report.text import html_text
from stream.store import ClickHouseStore

# Below this many conversations in either class, no AUROC (its interval would say nothing).
MIN_PER_CLASS = 5


def _rated_scores_sql(scores: str) -> str:
    return f"""SELECT s.scorer_version AS scorer_version, s.threshold_label AS threshold_label, s.netsat AS netsat,
       s.dissatisfaction_probability AS dissatisfaction_probability, f.ratings AS ratings
FROM {scores} AS s
INNER JOIN ({ratings_sql("feedback")}) AS f ON s.conversation_id = f.conversation_id
WHERE s.status = 'scored'
ORDER BY scorer_version, s.conversation_id"""


@dataclass(frozen=True)
class UserAgreement:
    """One scorer version against the users who rated its conversations."""

    scorer_version: str
    rated_down: int
    rated_up: int
    conflicts: int  # rated both up and down: left out
    dsat_when_rated_down: ConfidenceInterval | None  # None: nobody rated down
    sat_when_rated_up: ConfidenceInterval | None  # None: nobody rated up
    auroc_netsat: ConfidenceInterval | None  # None: fewer than MIN_PER_CLASS in a class with a NetSAT
    auroc_calibrated: ConfidenceInterval | None  # None: as above, or no calibrator


def agreement(scorer_version: str, rows: Sequence[Mapping[str, Any]], rules: FeedbackLabelRules) -> UserAgreement:
    """The figures of one scorer version from its rated, scored conversations (``threshold_label``, ``netsat``,
    ``dissatisfaction_probability``, ``ratings``)."""
    kept = [(r, label == "positive") for r in rows if (label := rules.label(r["ratings"])) != "conflict"]
    down = [r for r, positive in kept if not positive]
    up = [r for r, positive in kept if positive]

    def share(items: list[Mapping[str, Any]], label: str) -> ConfidenceInterval | None:
        return wilson_interval(sum(r["threshold_label"] == label for r in items), len(items)) if items else None

    def separation(column: str, sign: float) -> ConfidenceInterval | None:
        pairs = [(sign * r[column], positive) for r, positive in kept if r[column] is not None]
        y = np.array([positive for _, positive in pairs], dtype=bool)
        if int(y.sum()) < MIN_PER_CLASS or int((~y).sum()) < MIN_PER_CLASS:
            return None
        scores = np.array([s for s, _ in pairs], dtype=float)
        return bootstrap_ci(lambda s, t: auroc(s, t.astype(bool)), scores, y, seed=0)

    return UserAgreement(
        scorer_version=scorer_version,
        rated_down=len(down),
        rated_up=len(up),
        conflicts=len(rows) - len(kept),
        dsat_when_rated_down=share(down, "dsat"),
        sat_when_rated_up=share(up, "sat"),
        auroc_netsat=separation("netsat", 1.0),
        auroc_calibrated=separation("dissatisfaction_probability", -1.0),
    )


def load_user_agreement(
    store: ClickHouseStore, scoped_scores_sql: str, scope: Mapping[str, Any], rules: FeedbackLabelRules | None = None
) -> tuple[UserAgreement, ...]:
    """Per scorer version, its agreement with the users' ratings of the conversations in ``scoped_scores_sql``."""
    by_version: dict[str, list[dict[str, Any]]] = {}
    for row in store.query(_rated_scores_sql(scoped_scores_sql), scope):
        by_version.setdefault(row["scorer_version"], []).append(row)
    return tuple(agreement(version, rows, rules or FeedbackLabelRules()) for version, rows in by_version.items())


def agreement_table(rows: tuple[UserAgreement, ...]) -> str:
    """The page's table: per scorer version, the users' ratings and how the scorer labelled them."""
    if not rows:
        return '<p class="note">No scored conversation in this window has a user rating (feedback events).</p>'
    head = (
        "<tr><th>scorer version</th><th>rated down</th><th>labelled dsat when rated down</th><th>rated up</th>"
        "<th>labelled sat when rated up</th><th>AUROC of NetSAT</th><th>AUROC of calibrated P(sat)</th>"
        "<th>rated both ways (left out)</th></tr>"
    )
    out = []
    for a in rows:
        cells = [
            str(a.rated_down),
            _share(a.dsat_when_rated_down),
            str(a.rated_up),
            _share(a.sat_when_rated_up),
            _auroc(a.auroc_netsat),
            _auroc(a.auroc_calibrated),
            str(a.conflicts),
        ]
        out.append(f"<tr><td>{html_text(a.scorer_version)}</td>" + "".join(f'<td class="num">{c}</td>' for c in cells) + "</tr>")
    note = (
        '<p class="note">Shares with 95 % Wilson intervals, AUROC (users\' rated-up against rated-down) with 95 % '
        f"bootstrap intervals, shown from {MIN_PER_CLASS} conversations per class (stream/report/agreement.py).</p>"
    )
    return f'<table id="user-agreement">{head}{"".join(out)}</table>{note}'


def _share(ci: ConfidenceInterval | None) -> str:
    return "—" if ci is None else f"{ci.estimate:.0%} ({ci.low:.0%} – {ci.high:.0%})"


def _auroc(ci: ConfidenceInterval | None) -> str:
    return "—" if ci is None else f"{ci.estimate:.2f} ({ci.low:.2f} – {ci.high:.2f})"
