"""A shadow version against the active one, on the conversations both scored (``convowatch scorers compare``).

The pairs are the active version's rows in ``conversation_scores`` joined with
the candidate's rows in ``shadow_scores`` (stream/rollout.py), for
conversations closed in a window; only pairs both versions scored count. On
them:

* how often the two agree on the label (Wilson interval) and Cohen's κ
  (bootstrap interval), with the 3 × 3 table of labels;
* each version's share of dissatisfied and uncertain labels (Wilson
  intervals), and the paired differences candidate − active of the
  dissatisfied share and of the mean calibrated P(dissatisfied) (bootstrap
  intervals, conversations resampled as pairs);
* where users rated the conversation, each version's agreement with them
  (`stream.report.agreement`), on the same conversations.

The pairs are the shadow's sample of the judged conversations, unweighted:
the shadow's share is drawn from the conversation id alone, so the pairs are a
simple random sample of the judged ones (whose own π is kept in both rows).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np

from scorers.rubrics import LABELS
from scorers.statistics import ConfidenceInterval, MetricError, bootstrap_ci, wilson_interval
from stream.feedback_labels import FeedbackLabelRules, ratings_sql
from stream.report.agreement import UserAgreement, agreement
from stream.store import ClickHouseStore

_PAIRS_SQL = """
SELECT a.conversation_id AS conversation_id,
       a.scorer_version AS active_version, s.scorer_version AS candidate_version,
       a.label AS active_label, s.label AS candidate_label,
       a.threshold_label AS active_threshold_label, s.threshold_label AS candidate_threshold_label,
       a.netsat AS active_netsat, s.netsat AS candidate_netsat,
       a.dissatisfaction_probability AS active_p, s.dissatisfaction_probability AS candidate_p,
       f.ratings AS ratings
FROM (
    SELECT * FROM {db}.conversation_scores FINAL
    WHERE scorer_name = {{active:String}} AND status = 'scored'
      AND closed_at >= {{since:DateTime64(6, 'UTC')}} AND closed_at < {{until:DateTime64(6, 'UTC')}}
) AS a
INNER JOIN (
    SELECT * FROM {db}.shadow_scores FINAL WHERE scorer_name = {{candidate:String}} AND status = 'scored'
) AS s ON a.conversation_id = s.conversation_id
LEFT JOIN ({ratings}) AS f ON a.conversation_id = f.conversation_id
ORDER BY conversation_id"""

_SHADOWED_SQL = """
SELECT status, count() AS n FROM {db}.shadow_scores FINAL
WHERE scorer_name = {{candidate:String}}
  AND closed_at >= {{since:DateTime64(6, 'UTC')}} AND closed_at < {{until:DateTime64(6, 'UTC')}}
GROUP BY status"""


@dataclass(frozen=True)
class VersionFigures:
    """One version's labels on the paired conversations, and its agreement with their users."""

    name: str
    scorer_versions: tuple[str, ...]  # the hashes under this name (several if the judge or settings changed)
    dsat_share: ConfidenceInterval
    uncertain_share: ConfidenceInterval
    mean_dissatisfaction_probability: float | None  # None: not calibrated
    users: UserAgreement | None  # None: no paired conversation has a user rating


@dataclass(frozen=True)
class ScorerComparison:
    """The candidate (shadow) against the active version, on the conversations both scored."""

    since: datetime
    until: datetime
    pairs: int
    shadow_unscored: int  # conversations the shadow tried and could not score, in the window
    label_agreement: ConfidenceInterval | None  # None: no pairs
    kappa: ConfidenceInterval | None  # None: fewer than 2 pairs, or one label throughout
    labels: dict[str, dict[str, int]]  # active label → candidate label → conversations
    dsat_share_difference: ConfidenceInterval | None  # candidate − active
    dissatisfaction_probability_difference: ConfidenceInterval | None  # candidate − active; None unless both calibrated
    active: VersionFigures | None
    candidate: VersionFigures | None

    def as_dict(self) -> dict[str, Any]:
        def ci(c: ConfidenceInterval | None) -> dict[str, float] | None:
            return None if c is None else c.as_dict()

        def version(v: VersionFigures | None) -> dict[str, Any] | None:
            if v is None:
                return None
            users = None
            if v.users is not None:
                u = v.users
                users = {
                    "rated_down": u.rated_down,
                    "rated_up": u.rated_up,
                    "conflicts": u.conflicts,
                    "dsat_when_rated_down": ci(u.dsat_when_rated_down),
                    "sat_when_rated_up": ci(u.sat_when_rated_up),
                    "auroc_netsat": ci(u.auroc_netsat),
                    "auroc_calibrated": ci(u.auroc_calibrated),
                }
            return {
                "name": v.name,
                "scorer_versions": list(v.scorer_versions),
                "dsat_share": ci(v.dsat_share),
                "uncertain_share": ci(v.uncertain_share),
                "mean_dissatisfaction_probability": v.mean_dissatisfaction_probability,
                "users": users,
            }

        return {
            "since": self.since.isoformat(),
            "until": self.until.isoformat(),
            "pairs": self.pairs,
            "shadow_unscored": self.shadow_unscored,
            "label_agreement": ci(self.label_agreement),
            "kappa": ci(self.kappa),
            "labels": self.labels,
            "dsat_share_difference": ci(self.dsat_share_difference),
            "dissatisfaction_probability_difference": ci(self.dissatisfaction_probability_difference),
            "active": version(self.active),
            "candidate": version(self.candidate),
        }


def cohen_kappa(a: Sequence[str] | np.ndarray, b: Sequence[str] | np.ndarray) -> float:
    """Cohen's κ of two raters' labels; NaN when chance agreement is 1 (both always gave one and the same label)."""
    a, b = np.asarray(a), np.asarray(b)
    observed = float(np.mean(a == b))
    expected = sum(float(np.mean(a == label)) * float(np.mean(b == label)) for label in np.union1d(a, b))
    return float("nan") if expected >= 1 else (observed - expected) / (1 - expected)


def compare(
    active: str,
    candidate: str,
    rows: Sequence[Mapping[str, Any]],
    since: datetime,
    until: datetime,
    shadow_unscored: int = 0,
    rules: FeedbackLabelRules | None = None,
) -> ScorerComparison:
    """The comparison from the paired rows (`_PAIRS_SQL`'s columns)."""
    rules = rules or FeedbackLabelRules()
    n = len(rows)
    table: dict[str, dict[str, int]] = {a: {c: 0 for c in LABELS} for a in LABELS}
    for r in rows:
        table[r["active_label"]][r["candidate_label"]] += 1
    if n == 0:
        return ScorerComparison(since, until, 0, shadow_unscored, None, None, table, None, None, None, None)
    a_labels = np.array([r["active_label"] for r in rows])
    c_labels = np.array([r["candidate_label"] for r in rows])
    kappa = None
    if n >= 2 and not np.isnan(cohen_kappa(a_labels, c_labels)):
        try:
            kappa = bootstrap_ci(cohen_kappa, a_labels, c_labels, seed=0)
        except MetricError:
            kappa = None
    a_dsat, c_dsat = (a_labels == "dsat").astype(float), (c_labels == "dsat").astype(float)
    p_pairs = [(r["active_p"], r["candidate_p"]) for r in rows if r["active_p"] is not None and r["candidate_p"] is not None]
    p_difference = None
    if p_pairs:
        pa, pc = (np.array(x, dtype=float) for x in zip(*p_pairs))
        p_difference = bootstrap_ci(lambda x, y: float(np.mean(y - x)), pa, pc, seed=0)
    rated = [r for r in rows if r["ratings"]]

    def figures(side: str, name: str, labels: np.ndarray) -> VersionFigures:
        probabilities = [r[f"{side}_p"] for r in rows if r[f"{side}_p"] is not None]
        users = None
        if rated:
            columns = ("threshold_label", "netsat")
            side_rows = [{**{c: r[f"{side}_{c}"] for c in columns}, "dissatisfaction_probability": r[f"{side}_p"],
                          "ratings": r["ratings"]} for r in rated]  # fmt: skip
            users = agreement(name, side_rows, rules)
        return VersionFigures(
            name=name,
            scorer_versions=tuple(sorted({r[f"{side}_version"] for r in rows})),
            dsat_share=wilson_interval(int(np.sum(labels == "dsat")), n),
            uncertain_share=wilson_interval(int(np.sum(labels == "uncertain")), n),
            mean_dissatisfaction_probability=float(np.mean(probabilities)) if probabilities else None,
            users=users,
        )

    return ScorerComparison(
        since=since,
        until=until,
        pairs=n,
        shadow_unscored=shadow_unscored,
        label_agreement=wilson_interval(int(np.sum(a_labels == c_labels)), n),
        kappa=kappa,
        labels=table,
        dsat_share_difference=bootstrap_ci(lambda x, y: float(np.mean(y - x)), a_dsat, c_dsat, seed=0),
        dissatisfaction_probability_difference=p_difference,
        active=figures("active", active, a_labels),
        candidate=figures("candidate", candidate, c_labels),
    )


def load_comparison(store: ClickHouseStore, active: str, candidate: str, since: datetime, until: datetime) -> ScorerComparison:
    """Compare the candidate's shadow scores with the active version's, for conversations closed in [since, until)."""
    db = store.database
    parameters = {"active": active, "candidate": candidate, "since": since, "until": until}
    rows = store.query(_PAIRS_SQL.format(db=db, ratings=ratings_sql(f"{db}.feedback")), parameters)
    statuses = {r["status"]: int(r["n"]) for r in store.query(_SHADOWED_SQL.format(db=db), parameters)}
    return compare(active, candidate, rows, since, until, shadow_unscored=statuses.get("unscored", 0))
