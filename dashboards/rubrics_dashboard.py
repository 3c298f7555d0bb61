"""The Rubrics and conversations dashboard (ClickHouse): which DSAT rubrics fire, and on which conversations.

What counts as a DSAT *hit*: a rubric's stored ``score`` is its rating (the
expected option score of the judge's answer distribution, in [0, 10]),
negated for DSAT rubrics. Almost every probabilistic answer puts some mass on
"applies", so ``score < 0`` would count nearly every conversation; a hit here
is a rating of at least `DSAT_HIT_RATING` (5, the middle of the scale: the judge
expects the rubric to apply more than not), i.e. ``score <= -5``.

Panels read the latest score of each conversation (``latest_scores``, and
rubric rows joined on the same ``scored_at``). Hit counts are weighted by
1/π (``inclusion_probability``): the hits among all conversations that the
judged ones stand for, so sampling does not bias them (docs/sampling.md);
NetSAT's distribution and the tables show the judged conversations as they
are. Rows are filtered by the dashboard's time range on ``closed_at`` and by
the ``product`` / ``model_version`` variables. The worst-conversations table links each id to this dashboard
with ``var-conversation_id`` set; the drill-down row shows that
conversation's turns, scores, rubric scores and calibrated dimensions.
"""

from __future__ import annotations

from typing import Any

from grafana_foundation_sdk.builders import bargauge, histogram
from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.models import common

from dashboards import datasources
from dashboards import panels as p
from dashboards.clickhouse import Target
from scorers.rubrics import DSAT_HIT_RATING, dsat_hit_sql

UID = "convowatch-rubrics"
TITLE = "convowatch / Rubrics and conversations"
WORST_LIMIT = 50
NETSAT_BUCKET = 5
NETSAT_ROWS = 100_000  # the histogram panel buckets raw values; cap what one panel pulls


def variable_text(variable: str) -> str:
    """A ClickHouse string expression holding ``variable``'s value, whatever characters the value has.

    Grafana's ``percentencode`` format leaves only ``A-Z a-z 0-9 - _ . ~ %`` (encodeURIComponent, then
    ``!'()*`` too), none of which can end or escape a ClickHouse literal; ``decodeURLComponent`` gives the
    value back. ``singlequote`` was not safe: it leaves ``\\`` alone, which ClickHouse reads as an escape, so
    a stored id such as ``a\\' OR 1=1 --`` left its literal. A multi-value variable comes as ``{v1,v2}``.
    """
    return f"decodeURLComponent('${{{variable}:percentencode}}')"


def selected(column: str, variable: str) -> str:
    """True for rows whose ``column`` is one of the values of the multi-value ``variable`` (see `variable_text`).

    Grafana percent-encodes a multi-value selection as one text, ``{v1,v2}``: a row matches when its value is
    one of the comma-separated items. Values holding a comma cannot be told apart from two values, so
    selecting ``a,b`` also shows rows of ``a`` and of ``b``: never fewer rows than selected, never SQL.
    """
    text = variable_text(variable)
    items = f"substring({text}, 2, length({text}) - 2)"
    return (
        f"({column} = {text} OR (startsWith({text}, '{{') AND endsWith({text}, '}}')"
        f" AND position(concat(',', {items}, ','), concat(',', {column}, ',')) > 0))"
    )


CONVERSATION = variable_text("conversation_id")


def attribute_filter(alias: str = "") -> str:
    """Rows of the selected products and model versions (no condition at all when "All" is selected)."""
    col = f"{alias}." if alias else ""
    return (
        f"$__conditionalAll({selected(col + 'product', 'product')}, $product)"
        f" AND $__conditionalAll({selected(col + 'model_version', 'model_version')}, $model_version)"
    )


_CURRENT_RUBRIC_ROWS = """rubric_scores AS r FINAL
INNER JOIN latest_scores AS s
    ON r.conversation_id = s.conversation_id AND r.scorer_version = s.scorer_version AND r.scored_at = s.scored_at"""

HITS = "round(sum(1 / s.inclusion_probability), 1) AS hits"  # each judged conversation stands for 1/π

TOP_RUBRICS_SQL = f"""SELECT r.rubric_id AS rubric, {HITS}
FROM {_CURRENT_RUBRIC_ROWS}
WHERE {dsat_hit_sql("r")}
  AND $__timeFilter(r.closed_at)
  AND {attribute_filter("r")}
GROUP BY rubric
ORDER BY hits DESC, rubric
LIMIT 15"""

HITS_OVER_TIME_SQL = f"""SELECT $__timeInterval(r.closed_at) AS time, r.rubric_id AS rubric, {HITS}
FROM {_CURRENT_RUBRIC_ROWS}
WHERE {dsat_hit_sql("r")}
  AND $__timeFilter(r.closed_at)
  AND {attribute_filter("r")}
GROUP BY time, rubric
ORDER BY time, rubric"""

NETSAT_SQL = f"""SELECT netsat
FROM latest_scores
WHERE status = 'scored' AND netsat IS NOT NULL
  AND $__timeFilter(closed_at)
  AND {attribute_filter()}
LIMIT {NETSAT_ROWS}"""

WORST_SQL = f"""SELECT
    s.conversation_id AS conversation_id,
    s.closed_at AS closed_at,
    s.product AS product,
    s.model_version AS model_version,
    s.label AS label,
    round(s.netsat, 2) AS netsat,
    round(s.dissatisfaction_probability, 3) AS p_dissatisfied,
    h.dsat_hits AS dsat_hits
FROM latest_scores AS s
LEFT JOIN (
    SELECT conversation_id, scorer_version, scored_at,
           arrayStringConcat(
               arrayMap(x -> concat(x.2, ' ', toString(round(x.1, 1))), arraySort(groupArray((score, rubric_id)))),
               '; ') AS dsat_hits
    FROM rubric_scores FINAL
    WHERE {dsat_hit_sql()} AND $__timeFilter(closed_at)
    GROUP BY conversation_id, scorer_version, scored_at
) AS h ON h.conversation_id = s.conversation_id AND h.scorer_version = s.scorer_version AND h.scored_at = s.scored_at
WHERE s.status = 'scored'
  AND $__timeFilter(s.closed_at)
  AND {attribute_filter("s")}
ORDER BY p_dissatisfied DESC NULLS LAST, netsat ASC NULLS LAST, conversation_id
LIMIT {WORST_LIMIT}"""

# The selected conversation's current score (what latest_scores holds for it), without scanning the whole view.
_SELECTED_SCORE = f"""(
    SELECT conversation_id, scorer_version, scored_at
    FROM conversation_scores FINAL
    WHERE conversation_id = {CONVERSATION}
    ORDER BY version DESC
    LIMIT 1
) AS s"""

TURNS_SQL = f"""SELECT
    tupleElement(t, 'index') AS turn,
    tupleElement(t, 'role') AS role,
    tupleElement(t, 'timestamp') AS at,
    tupleElement(t, 'text') AS text
FROM conversations FINAL
ARRAY JOIN turns AS t
WHERE conversation_id = {CONVERSATION}
ORDER BY turn"""

SCORES_SQL = f"""SELECT
    scorer_version, status, label,
    round(netsat, 2) AS netsat,
    round(dissatisfaction_probability, 3) AS p_dissatisfied,
    round(main_expected_value, 2) AS calibrated_satisfaction,
    judge, rubric_set_version, calibrator_version, scored_at, unscored_reason
FROM conversation_scores FINAL
WHERE conversation_id = {CONVERSATION}
ORDER BY scored_at DESC"""

RUBRIC_SCORES_SQL = f"""SELECT
    r.rubric_id AS rubric,
    r.polarity AS polarity,
    round(r.score, 2) AS score,
    ({dsat_hit_sql("r")}) AS dsat_hit
FROM rubric_scores AS r FINAL
INNER JOIN {_SELECTED_SCORE}
    ON r.conversation_id = s.conversation_id AND r.scorer_version = s.scorer_version AND r.scored_at = s.scored_at
ORDER BY score ASC, rubric"""

DIMENSIONS_SQL = f"""SELECT
    d.question_id AS dimension,
    round(d.expected_value, 2) AS expected_answer,
    arrayMap(x -> round(x, 3), d.probabilities) AS probabilities
FROM dimension_predictions AS d FINAL
INNER JOIN {_SELECTED_SCORE}
    ON d.conversation_id = s.conversation_id AND d.scorer_version = s.scorer_version AND d.scored_at = s.scored_at
ORDER BY dimension"""

# Users' feedback per conversation, as stream.feedback_labels reads it: the latest rating of each rated turn;
# a conversation rated both up and down is left out. `negative` is 1 when it was rated down.
_RATED_CONVERSATIONS = """(
    SELECT conversation_id, max(rating = 'down') AS negative
    FROM (
        SELECT conversation_id, turn_index, argMax(rating, timestamp) AS rating
        FROM feedback FINAL
        GROUP BY conversation_id, turn_index
    )
    GROUP BY conversation_id
    HAVING max(rating = 'down') != max(rating = 'up')
) AS f"""
MIN_RATED_PER_CLASS = 5  # fewer rated-down or rated-up conversations in an interval: no AUROC (it would say nothing)

USER_AUROC_SQL = f"""SELECT
    $__timeInterval(s.closed_at) AS time,
    s.scorer_version AS scorer_version,
    round(arrayAUC(groupArray(s.dissatisfaction_probability), groupArray(f.negative)), 3) AS auroc
FROM latest_scores AS s
INNER JOIN {_RATED_CONVERSATIONS} ON s.conversation_id = f.conversation_id
WHERE s.status = 'scored' AND s.dissatisfaction_probability IS NOT NULL
  AND $__timeFilter(s.closed_at)
  AND {attribute_filter("s")}
GROUP BY time, scorer_version
HAVING sum(f.negative) >= {MIN_RATED_PER_CLASS} AND count() - sum(f.negative) >= {MIN_RATED_PER_CLASS}
ORDER BY time, scorer_version"""

PRODUCTS_SQL = "SELECT DISTINCT product FROM conversation_scores ORDER BY product"
MODEL_VERSIONS_SQL = "SELECT DISTINCT model_version FROM conversation_scores ORDER BY model_version"

DRILL_DOWN_URL = f"/d/{UID}?var-conversation_id=${{__value.raw:percentencode}}&${{product:queryparam}}&${{model_version:queryparam}}&${{__url_time_range}}"


def dashboard() -> dict[str, Any]:
    """The Rubrics and conversations dashboard's JSON model."""
    board = p.new_dashboard(
        UID,
        TITLE,
        f"Most-firing DSAT rubrics (hit = rating ≥ {DSAT_HIT_RATING:g} of 10), NetSAT distribution, the worst recent "
        "conversations with their hits, and a drill-down into one conversation (variable conversation_id).",
        time_from="now-24h",
    )
    board = board.with_variable(p.clickhouse_variable("product", "Product", PRODUCTS_SQL))
    board = board.with_variable(p.clickhouse_variable("model_version", "Model version", MODEL_VERSIONS_SQL))
    board = board.with_variable(
        p.text_variable(
            "conversation_id",
            "Conversation id",
            "Conversation to show in the drill-down row (click an id in the worst-conversations table).",
        )
    )
    board = p.with_rows(
        board,
        [
            ("DSAT rubrics", _rubric_panels()),
            ("Conversations", _conversation_panels()),
            ("Agreement with users", [_user_auroc()]),
            ("Conversation $conversation_id", _drill_down()),
        ],
    )
    return p.finish(board)


def _rubric_panels() -> list:
    top = (
        bargauge.Panel()
        .title("Most-firing DSAT rubrics")
        .description(
            f"DSAT rubrics by the number of conversations they hit (rating ≥ {DSAT_HIT_RATING:g}) in the range, "
            "each judged conversation weighted by 1/π (the conversations it stands for under sampling)."
        )
        .datasource(datasources.clickhouse())
        .targets(p.with_ref_ids([Target().sql(TOP_RUBRICS_SQL).table()]))
        .unit("short")
        .min(0)
        .span(10)
        .height(10)
        .orientation(common.VizOrientation.HORIZONTAL)
        .display_mode(common.BarGaugeDisplayMode.GRADIENT)
        .show_unfilled(True)
        .reduce_options(common_builders.ReduceDataOptions().values(True).calcs([]).fields("/^hits$/"))
    )
    over_time = p.time_series(
        "DSAT rubric hits over time",
        "Conversations hit per rubric and interval (closed_at), weighted by 1/π.",
        [Target().sql(HITS_OVER_TIME_SQL).time_series()],
        "short",
        span=14,
        height=10,
        datasource=datasources.CLICKHOUSE_UID,
    )
    return [top, over_time]


def _conversation_panels() -> list:
    netsat = (
        histogram.Panel()
        .title("NetSAT distribution")
        .description(f"NetSAT of the latest score of each conversation closed in the range (buckets of {NETSAT_BUCKET}).")
        .datasource(datasources.clickhouse())
        .targets(p.with_ref_ids([Target().sql(NETSAT_SQL).table()]))
        .bucket_size(NETSAT_BUCKET)
        .combine(True)
        .fill_opacity(60)
        .span(8)
        .height(10)
    )
    worst = p.table_panel(
        "Worst recent conversations",
        f"Highest calibrated P(dissatisfied), then lowest NetSAT, with their DSAT hits (rubric and score, rating ≥ "
        f"{DSAT_HIT_RATING:g}). Click an id to drill down.",
        [Target().sql(WORST_SQL).table()],
        span=16,
        height=10,
    )
    worst = p.link_column(worst, "conversation_id", "Show this conversation", DRILL_DOWN_URL)
    return [netsat, worst]


def _user_auroc() -> Any:
    return p.time_series(
        "AUROC of P(dissatisfied) against user feedback",
        "How well the calibrated P(dissatisfied) separates conversations users rated down from those they rated up "
        "(latest rating of each turn; both: left out), per scorer version and interval of closed_at: 0.5 is chance, "
        f"1 perfect. Shown when an interval has at least {MIN_RATED_PER_CLASS} of each; choose a wide interval (e.g. 1d) "
        "when few users rate. The Overview's agreement panel and the ConvowatchUserAgreementDrop alert use the labels.",
        [Target().sql(USER_AUROC_SQL).time_series()],
        "none",
        span=24,
        height=8,
        datasource=datasources.CLICKHOUSE_UID,
    )


def _drill_down() -> list:
    return [
        p.table_panel(
            "Turns",
            "The selected conversation's turns in order (conversations table).",
            [Target().sql(TURNS_SQL).table()],
            span=24,
            height=12,
        ),
        p.table_panel(
            "Scores",
            "Every score of the selected conversation (one per scorer version).",
            [Target().sql(SCORES_SQL).table()],
            span=24,
            height=5,
        ),
        p.table_panel(
            "Rubric scores",
            "The current score's rubric scores (DSAT negative), strongest DSAT first.",
            [Target().sql(RUBRIC_SCORES_SQL).table()],
            span=12,
            height=10,
        ),
        p.table_panel(
            "Calibrated dimensions",
            "The current score's calibrated answer distribution per question.",
            [Target().sql(DIMENSIONS_SQL).table()],
            span=12,
            height=10,
        ),
    ]
