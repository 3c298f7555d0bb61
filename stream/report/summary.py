"""What `convowatch summary` prints: label counts, per-variant rates, the worst conversations and behaviour rates.

One score per conversation (the ``latest_scores`` view, or one scorer version's rows). Rates and means weight each
scored conversation by 1/π, its inclusion probability (Hájek: Σ y/π / Σ 1/π over the scored rows;
docs/sampling.md), so they stay unbiased under sampling.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from scorers.rubrics import LABELS, dsat_hit_sql
from stream.records import RubricHit
from stream.report.behaviours import BehaviourRate, load_behaviour_rates
from stream.store import ClickHouseStore


@dataclass(frozen=True)
class VariantSummary:
    """Scores of the conversations sharing one value of the grouping attribute."""

    variant: str
    n: int  # every conversation, unsampled ones included
    n_scored: int  # conversations the judge scored
    # Rates and means weight each scored conversation by 1/π (its inclusion probability): unbiased under sampling.
    dsat_rate: float | None  # share of scored conversations labelled dsat
    uncertain_rate: float | None  # share of scored conversations the rubric set abstained on
    calibrated_satisfaction: float | None  # mean calibrated expected answer to the main question
    calibrated_dissatisfaction: float | None  # mean calibrated P(dissatisfied)


@dataclass(frozen=True)
class WorstConversation:
    """A conversation with a high calibrated P(dissatisfied) / low NetSAT, and the DSAT rubrics it hit."""

    conversation_id: str
    scorer_version: str
    netsat: float | None
    label: str
    dissatisfaction_probability: float | None
    dsat_hits: tuple[RubricHit, ...]


@dataclass(frozen=True)
class Summary:
    """Label counts (and unscored, unsampled), per-variant scores and the worst conversations, one (latest) score per conversation."""

    by_label: dict[str, int]
    group_by: str
    variants: tuple[VariantSummary, ...]
    worst: tuple[WorstConversation, ...]
    behaviours: tuple[BehaviourRate, ...]  # per behaviour, its rate per judged assistant turn (none: not judged)


def summarize(
    store: ClickHouseStore,
    worst: int = 5,
    group_by: str = "dialogue_version",
    scorer_version: str | None = None,
    top_rubrics: int = 3,
) -> Summary:
    """Label counts, per-``group_by``-attribute scores and the ``worst`` conversations.

    One score per conversation: the latest (``latest_scores``), or the given scorer version's.
    Conversations without the ``group_by`` attribute form the ``''`` variant. Worst = highest
    calibrated P(dissatisfied), then lowest NetSAT; each with its ``top_rubrics`` strongest DSAT hits.
    """
    db = store.database
    if scorer_version is None:
        source, params = f"{db}.latest_scores", {}
    else:
        source, params = (
            f"(SELECT * FROM {db}.conversation_scores FINAL WHERE scorer_version = {{sv:String}})",
            {"sv": scorer_version},
        )
    counts = store.query(
        f"""SELECT countIf(status = 'scored' AND label = 'sat') AS sat,
                   countIf(status = 'scored' AND label = 'dsat') AS dsat,
                   countIf(status = 'scored' AND label = 'uncertain') AS uncertain,
                   countIf(status = 'unscored') AS unscored,
                   countIf(status = 'unsampled') AS unsampled
            FROM {source}""",
        params,
    )[0]
    variant_rows = store.query(
        f"""SELECT attributes[{{key:String}}] AS variant,
                   count() AS n,
                   countIf(status = 'scored') AS n_scored,
                   {_weighted_share("label = 'dsat'")} AS dsat_rate,
                   {_weighted_share("label = 'uncertain'")} AS uncertain_rate,
                   {_weighted_mean("main_expected_value")} AS calibrated_satisfaction,
                   {_weighted_mean("dissatisfaction_probability")} AS calibrated_dissatisfaction
            FROM {source} GROUP BY variant ORDER BY variant""",
        {**params, "key": group_by},
    )
    worst_rows = store.query(
        f"""SELECT conversation_id, scorer_version, scored_at, netsat, label, dissatisfaction_probability
            FROM {source} WHERE status = 'scored'
            ORDER BY dissatisfaction_probability DESC NULLS LAST, netsat ASC NULLS LAST, conversation_id
            LIMIT {{n:UInt32}}""",
        {**params, "n": worst},
    )
    hits: dict[tuple[str, str], list[dict[str, Any]]] = {}
    if worst_rows and top_rubrics > 0:
        for h in store.query(
            f"""SELECT conversation_id, scorer_version, scored_at, rubric_id, polarity, score
                FROM {db}.rubric_scores FINAL
                WHERE conversation_id IN {{ids:Array(String)}} AND {dsat_hit_sql()}
                ORDER BY conversation_id, scorer_version, score ASC, rubric_id""",
            {"ids": [w["conversation_id"] for w in worst_rows]},
        ):
            hits.setdefault((h["conversation_id"], h["scorer_version"]), []).append(h)
    worst_out = []
    for w in worst_rows:
        key = (w["conversation_id"], w["scorer_version"])
        # only the rubric rows written with this score (same scored_at), strongest first
        own = [h for h in hits.get(key, []) if h["scored_at"] == w["scored_at"]][:top_rubrics]
        worst_out.append(
            WorstConversation(
                conversation_id=w["conversation_id"],
                scorer_version=w["scorer_version"],
                netsat=w["netsat"],
                label=w["label"],
                dissatisfaction_probability=w["dissatisfaction_probability"],
                dsat_hits=tuple(RubricHit(h["rubric_id"], h["polarity"], h["score"]) for h in own),
            )
        )
    return Summary(
        by_label={k: int(counts[k]) for k in (*LABELS, "unscored", "unsampled")},
        group_by=group_by,
        variants=tuple(
            VariantSummary(
                variant=v["variant"],
                n=int(v["n"]),
                n_scored=int(v["n_scored"]),
                dsat_rate=_float_or_none(v["dsat_rate"]),
                uncertain_rate=_float_or_none(v["uncertain_rate"]),
                calibrated_satisfaction=_float_or_none(v["calibrated_satisfaction"]),
                calibrated_dissatisfaction=_float_or_none(v["calibrated_dissatisfaction"]),
            )
            for v in variant_rows
        ),
        worst=tuple(worst_out),
        behaviours=load_behaviour_rates(store, source, params),
    )


def _weighted_share(condition: str) -> str:
    """SQL: the 1/π-weighted share of scored rows meeting ``condition``."""
    return (
        f"sumIf(1 / inclusion_probability, status = 'scored' AND {condition})"
        " / nullIf(sumIf(1 / inclusion_probability, status = 'scored'), 0)"
    )


def _weighted_mean(column: str) -> str:
    """SQL: the 1/π-weighted mean of a Nullable column over the scored rows where it is set."""
    where = f"status = 'scored' AND {column} IS NOT NULL"
    return f"sumIf({column} / inclusion_probability, {where}) / nullIf(sumIf(1 / inclusion_probability, {where}), 0)"


def _float_or_none(x: Any) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else float(x)
