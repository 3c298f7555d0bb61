"""The Behaviours dashboard: ABC-Eval behaviour rates per assistant turn, with Wilson intervals.

With ``scoring.behaviours`` set, the worker asks the judge, for every
assistant turn of a scored conversation, whether the turn shows each
behaviour of a set (ignore, irrelevant, self contradiction, …; docs/behaviours.md).
A behaviour's *rate* is the share of assistant turns that show it.

The ClickHouse panels read the ``behaviour_turns`` rows of each
conversation's latest score, weighted by 1/π (``inclusion_probability``) so
that sampling does not bias the rate. The table gives each behaviour's rate
over the range with the hits and turns behind it and a 95 % Wilson interval
(computed on the judged turns: under sampling at several rates it is only
approximate). The Prometheus panel shows the live rate from the weighted
counters. Rows are filtered by the dashboard's time range on ``closed_at``
and by the ``product`` / ``model_version`` variables.
"""

from __future__ import annotations

from typing import Any

from dashboards import datasources, promql
from dashboards import panels as p
from dashboards.clickhouse import Target
from dashboards.rubrics_dashboard import MODEL_VERSIONS_SQL, PRODUCTS_SQL, attribute_filter
from scorers.behaviours import WEIGHTED_RATE_SQL, behaviour_rows_sql

UID = "convowatch-behaviours"
TITLE = "convowatch / Behaviours"
Z_95 = 1.959964  # the normal quantile of a two-sided 95 % interval


def wilson_sql(hits: str, n: str, z: float = Z_95) -> tuple[str, str]:
    """ClickHouse expressions for the lower and upper edges of the Wilson score interval of ``hits`` in ``n``."""
    p_hat, z2 = f"({hits}) / ({n})", f"{z * z:.6f}"
    centre = f"({p_hat} + {z2} / (2 * ({n})))"
    half = f"{z:.6f} * sqrt({p_hat} * (1 - {p_hat}) / ({n}) + {z2} / (4 * ({n}) * ({n})))"
    scale = f"(1 + {z2} / ({n}))"
    return f"({centre} - {half}) / {scale}", f"({centre} + {half}) / {scale}"


_CURRENT_BEHAVIOUR_ROWS = behaviour_rows_sql("latest_scores")
_LOWER, _UPPER = wilson_sql("countIf(b.hit)", "count()")

RATES_SQL = f"""SELECT
    b.behaviour_id AS behaviour,
    round({WEIGHTED_RATE_SQL}, 4) AS rate,
    round({_LOWER}, 4) AS wilson_lower,
    round({_UPPER}, 4) AS wilson_upper,
    countIf(b.hit) AS hits,
    count() AS turns
FROM {_CURRENT_BEHAVIOUR_ROWS}
WHERE $__timeFilter(b.closed_at)
  AND {attribute_filter("b")}
GROUP BY behaviour
ORDER BY rate DESC, behaviour"""

RATE_OVER_TIME_SQL = f"""SELECT $__timeInterval(b.closed_at) AS time, b.behaviour_id AS behaviour, {WEIGHTED_RATE_SQL} AS rate
FROM {_CURRENT_BEHAVIOUR_ROWS}
WHERE $__timeFilter(b.closed_at)
  AND {attribute_filter("b")}
GROUP BY time, behaviour
ORDER BY time, behaviour"""

M = promql.DASHBOARD_MATCHERS
LIVE_RATE = promql.behaviour_rate("$__rate_interval", M)


def dashboard() -> dict[str, Any]:
    """The Behaviours dashboard's JSON model."""
    board = p.new_dashboard(
        UID,
        TITLE,
        "ABC-Eval behaviour rates per assistant turn (scoring.behaviours): each behaviour's rate over the range with "
        "its 95 % Wilson interval, over time, and live from Prometheus.",
        time_from="now-24h",
    )
    board = board.with_variable(p.clickhouse_variable("product", "Product", PRODUCTS_SQL))
    board = board.with_variable(p.clickhouse_variable("model_version", "Model version", MODEL_VERSIONS_SQL))
    rates = p.table_panel(
        "Behaviour rates with 95 % Wilson intervals",
        "Share of judged assistant turns that show each behaviour in the range (weighted by 1/π), the Wilson "
        "interval of the judged turns, and the hits and turns behind it.",
        [Target().sql(RATES_SQL).table()],
        span=24,
        height=10,
    )
    over_time = p.time_series(
        "Behaviour rate over time",
        "Share of the assistant turns of conversations closed in each interval that show each behaviour (weighted by 1/π).",
        [Target().sql(RATE_OVER_TIME_SQL).time_series()],
        "percentunit",
        span=12,
        height=10,
        min_value=0,
        datasource=datasources.CLICKHOUSE_UID,
    )
    live = p.time_series(
        "Behaviour rate (Prometheus)",
        "Hits per judged assistant turn from the worker counters (1/π-weighted), per behaviour.",
        [p.promql(LIVE_RATE, "{{behaviour}}")],
        "percentunit",
        span=12,
        height=10,
        min_value=0,
    )
    return p.finish(p.with_rows(board, [("Behaviour rates", [rates]), ("Over time", [over_time, live])]))
