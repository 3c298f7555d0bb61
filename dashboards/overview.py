"""The Overview dashboard (Prometheus): how many conversations, how satisfied, how sure.

Headline numbers over the dashboard's range, then over time: volume (scored,
unscored and left out by sampling), the shares of sat / dsat / uncertain labels, the *calibrated*
dissatisfaction rate with its 95 % band (the unbiased estimate of the share
a human would call dissatisfied and its standard error, see
`dashboards.promql`), the yield (share of conversations the rubric set dared
to label), and the same rate and volume by model version and by product.
Rates and shares weight each judged conversation by 1/π, so sampling does not
bias them; their bands include the sampling error (docs/sampling.md).
"""

from __future__ import annotations

from typing import Any

from dashboards import panels as p
from dashboards import promql
from scorers.rubrics import LABELS

UID = "convowatch-overview"
TITLE = "convowatch / Overview"
M = promql.DASHBOARD_MATCHERS
W = "$__rate_interval"  # per-point window of the time-series panels
RANGE = "$__range"  # the whole dashboard range, for the headline numbers
DSAT_LEGEND, UPPER, LOWER = "calibrated P(dsat)", "upper 95%", "lower 95%"
AGREEMENT_WINDOW = "1d"  # users rate few conversations: a rolling day, as the ConvowatchUserAgreementDrop alert


def dashboard() -> dict[str, Any]:
    """The Overview dashboard's JSON model."""
    board = p.new_dashboard(
        UID,
        TITLE,
        "Conversation volume, label shares, the calibrated dissatisfaction rate with its 95% band, yield, "
        "and breakdowns by model version and product.",
    )
    board = p.with_attribute_variables(board, promql.SCORED)
    board = p.with_rows(
        board,
        [
            ("Over the selected range", _headline()),
            ("Over time", _over_time()),
            ("By model version and product", _breakdowns()),
            ("Agreement with users", _agreement()),
        ],
    )
    return p.finish(board)


def _headline() -> list:
    return [
        p.single_stat(
            "Conversations",
            "Conversations closed and processed in the range (scored, stored unscored or unsampled).",
            p.promql_instant(promql.increase(promql.SAMPLED, RANGE, M), "conversations"),
            "short",
            decimals=0,
        ),
        p.single_stat(
            "Calibrated dissatisfaction rate",
            "Mean calibrated P(user dissatisfied) over the range: the estimated share of dissatisfied "
            "conversations (not the share of dsat labels).",
            p.promql_instant(promql.calibrated_dsat_rate(RANGE, M), DSAT_LEGEND),
            "percentunit",
            decimals=1,
        ),
        p.single_stat(
            "Yield",
            "Share of scored conversations the rubric set labelled (sat or dsat, not uncertain).",
            p.promql_instant(promql.yield_share(RANGE, M), "yield"),
            "percentunit",
            decimals=1,
        ),
        p.single_stat(
            "Dissatisfied-label share",
            "Share of scored conversations labelled dsat by the rubric set.",
            p.promql_instant(promql.label_share("dsat", RANGE, M), "dsat"),
            "percentunit",
            decimals=1,
        ),
    ]


def _over_time() -> list:
    rate_panel = p.time_series(
        "Calibrated dissatisfaction rate (95% band)",
        "Mean calibrated P(dissatisfied) of the conversations scored in each window (weighted by 1/π), with a 95% band: "
        "p ± 1.96·sqrt(var(P)/n + sampling variance) over the window's n = Σ 1/π calibrated conversations. "
        "Few conversations per window, or a low sampling rate, give a wide band.",
        [
            p.promql(promql.calibrated_dsat_rate(W, M), DSAT_LEGEND),
            p.promql(promql.calibrated_dsat_band(W, M, upper=True), UPPER),
            p.promql(promql.calibrated_dsat_band(W, M, upper=False), LOWER),
        ],
        "percentunit",
        min_value=0,
        max_value=1,
    ).interval("1m")
    return [
        p.time_series(
            "Conversation volume",
            "Conversations per second: scored (any label), stored unscored (judge failed) and unsampled (not judged).",
            [
                p.promql(promql.rate(promql.SCORED, W, M), "scored"),
                p.promql(promql.rate(promql.UNSCORED, W, M), "unscored"),
                p.promql(promql.rate(promql.SAMPLED, W, f'decision="unsampled", {M}'), "unsampled"),
            ],
            "cps",
        ),
        p.time_series(
            "Label shares",
            "Shares of scored conversations labelled sat, dsat and uncertain by the rubric set's windows.",
            [p.promql(promql.label_share(label, W, M), label) for label in LABELS],
            "percentunit",
            min_value=0,
            max_value=1,
        ),
        p.confidence_band(rate_panel, UPPER, LOWER),
        p.time_series(
            "Yield (share not uncertain)",
            "Share of scored conversations outside the abstention zone. A falling yield means the judge separates "
            "conversations less well (drift).",
            [p.promql(promql.yield_share(W, M), "yield")],
            "percentunit",
            min_value=0,
            max_value=1,
        ),
    ]


def _breakdowns() -> list:
    return [
        p.time_series(
            "Calibrated dissatisfaction rate by model version",
            "Mean calibrated P(dissatisfied) per model version.",
            [p.promql(promql.calibrated_dsat_rate(W, M, by="model_version"), "{{model_version}}")],
            "percentunit",
            min_value=0,
            max_value=1,
        ).interval("1m"),
        p.time_series(
            "Calibrated dissatisfaction rate by product",
            "Mean calibrated P(dissatisfied) per product.",
            [p.promql(promql.calibrated_dsat_rate(W, M, by="product"), "{{product}}")],
            "percentunit",
            min_value=0,
            max_value=1,
        ).interval("1m"),
        p.time_series(
            "Volume by model version",
            "Conversations per second per model version (judged or not).",
            [p.promql(promql.rate(promql.SAMPLED, W, M, by="model_version"), "{{model_version}}")],
            "cps",
        ),
        p.time_series(
            "Volume by product",
            "Conversations per second per product (judged or not).",
            [p.promql(promql.rate(promql.SAMPLED, W, M, by="product"), "{{product}}")],
            "cps",
        ),
        p.time_series(
            "Yield by model version",
            "Share of scored conversations labelled (not uncertain), per model version.",
            [p.promql(promql.yield_share(W, M, by="model_version"), "{{model_version}}")],
            "percentunit",
            min_value=0,
            max_value=1,
        ),
        p.time_series(
            "Dissatisfied-label share by model version",
            "Share of scored conversations labelled dsat, per model version.",
            [p.promql(promql.label_share("dsat", W, M, by="model_version"), "{{model_version}}")],
            "percentunit",
            min_value=0,
            max_value=1,
        ),
    ]


def _agreement() -> list:
    return [
        p.time_series(
            "Agreement with user feedback (rolling day)",
            "Share of the conversations users rated while open (thumbs on any turn, the latest rating of each) and "
            "the scorer labelled sat or dsat where the label matches the feedback: dsat with thumbs-down only, sat "
            "with thumbs-up only; per scorer version, over the day before each point. A fall says the judge drifted, "
            "the product changed or a prompt broke (alert ConvowatchUserAgreementDrop). Late feedback (after the "
            "close) is not counted here; the report and the Rubrics dashboard's AUROC use all of it.",
            [p.promql(promql.user_agreement(AGREEMENT_WINDOW, M), "{{scorer_version}}")],
            "percentunit",
            min_value=0,
            max_value=1,
        ),
        p.time_series(
            "Rated conversations by label and feedback (per hour)",
            "Scored conversations users rated while open, by the scorer's label and the users' feedback (positive: "
            "thumbs-up only, negative: thumbs-down only, conflict: both), per hour: the counts behind the agreement.",
            [p.promql(promql.increase(promql.USER_FEEDBACK, "1h", M, by="label, feedback"), "{{label}} / {{feedback}}")],
            "short",
        ),
    ]
