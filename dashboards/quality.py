"""The Quality dimensions dashboard (Prometheus): each calibrated dimension over time.

The calibrator predicts the distribution of a human's answer to every
question (dimension) on its 1..K scale; the service observes each
conversation's expected answer into the histogram
``convowatch_dimension_expected_value{dimension=...}``. This dashboard shows
its mean (``_sum / _count``) and p10 / p50 / p90 by model version, and the
distribution itself (bucket rates over time, bucket counts over the range),
one repeated row per dimension (variable ``dimension``). A NetSAT row shows
the rubric-set score's quantiles and distribution, and an Injection attempts
row the share of conversations whose users tried to steer the judge.

Histograms cannot carry weights, so under sampling (docs/sampling.md) these
panels describe the *judged* conversations: unbiased per product and model
version when one rate applies to it, not across strata sampled at different
rates (the Overview's rates are weighted).
"""

from __future__ import annotations

from typing import Any

from dashboards import panels as p
from dashboards import promql

UID = "convowatch-quality"
TITLE = "convowatch / Quality dimensions"
M = promql.DASHBOARD_MATCHERS
M_DIM = f'dimension=~"$dimension", {M}'
W = "$__rate_interval"
RANGE = "$__range"
QUANTILES = (0.1, 0.5, 0.9)
DIMENSION_BUCKET = promql.DIMENSION + "_bucket"


def dashboard() -> dict[str, Any]:
    """The Quality dimensions dashboard's JSON model."""
    board = p.new_dashboard(
        UID,
        TITLE,
        "Calibrated quality dimensions (expected human answer per question) over time: mean and quantiles by model "
        "version, and their distributions; NetSAT quantiles and distribution.",
    )
    board = p.with_attribute_variables(board, promql.SCORED)
    board = board.with_variable(p.prometheus_label_variable("dimension", "Dimension", f"{promql.DIMENSION}_count{{{M}}}"))
    all_dimensions = p.time_series(
        "Mean calibrated answer by dimension",
        "Mean of the calibrated expected answer (1..K scale, higher = better) of the conversations scored in each window.",
        [p.promql(promql.histogram_mean(promql.DIMENSION, W, M_DIM, by="dimension"), "{{dimension}}")],
        "none",
        span=24,
    )
    board = p.with_rows(
        board,
        [
            ("All dimensions", [all_dimensions]),
            ("NetSAT", _netsat()),
            ("Injection attempts", _injection()),
            # A repeated row: Grafana copies it and the panels under it once per selected dimension.
            (p.row("Dimension $dimension").repeat("dimension"), _dimension()),
        ],
    )
    return p.finish(board)


def _quantile_targets(bucket_metric: str, matchers: str, by: str, legend: str) -> list:
    return [
        p.promql(promql.histogram_quantile(q, bucket_metric, W, matchers, by=by), f"p{round(q * 100)}{legend}") for q in QUANTILES
    ]


def _netsat() -> list:
    return [
        p.time_series(
            "NetSAT quantiles (p10 / p50 / p90)",
            "Quantiles of the rubric set's NetSAT (Σ SAT ratings − Σ DSAT ratings) of the conversations scored in each window.",
            _quantile_targets(promql.NETSAT_BUCKET, M, "", ""),
            "none",
        ),
        p.bucket_heatmap(
            "NetSAT distribution over time",
            "Conversations per second into each NetSAT bucket (upper bound on the y axis).",
            p.promql_buckets(promql.rate(promql.NETSAT_BUCKET, W, M, by="le")),
            "none",
        ),
    ]


def _injection() -> list:
    """Conversations whose users' turns hold text written to steer the judge (scorers/injection.py)."""
    by_kind = promql.increase(promql.INJECTION_SUSPECTED, W, M, by="kind")
    return [
        p.time_series(
            "Share of conversations with an injection attempt, by kind",
            "Conversations whose users' turns hold an injection attempt of each kind, per conversation closed "
            "(judged or not). Their scores carry the kinds in injection_signals; with scoring.injection_policy "
            "abstain they are labelled uncertain.",
            [p.promql(f"{by_kind} / ignoring(kind) group_left {promql.increase(promql.SAMPLED, W, M)}", "{{kind}}")],
            "percentunit",
            span=24,
            min_value=0,
        ),
    ]


def _dimension() -> list:
    return [
        p.time_series(
            "$dimension: mean by model version",
            "Mean calibrated expected answer to $dimension, per model version.",
            [p.promql(promql.histogram_mean(promql.DIMENSION, W, M_DIM, by="model_version"), "{{model_version}}")],
            "none",
        ),
        p.time_series(
            "$dimension: p10 / p50 / p90 by model version",
            "Quantiles of the calibrated expected answer to $dimension, per model version (estimated from the histogram buckets).",
            _quantile_targets(DIMENSION_BUCKET, M_DIM, "model_version", " {{model_version}}"),
            "none",
        ),
        p.bucket_heatmap(
            "$dimension: distribution over time",
            "Conversations per second into each bucket of the expected answer to $dimension.",
            p.promql_buckets(promql.rate(DIMENSION_BUCKET, W, M_DIM, by="le")),
            "none",
        ),
        p.bucket_bars(
            "$dimension: distribution over the range",
            "Conversations per bucket (expected answer ≤ le) of $dimension over the whole range.",
            p.promql_buckets(promql.increase(DIMENSION_BUCKET, RANGE, M_DIM, by="le"), instant=True),
        ),
    ]
