"""The Operations dashboard (Prometheus): is the pipeline healthy, fast and keeping up?

Events in (by type and outcome) and dead letters (by reason); assembly
(open conversations, closes by cause, owned partitions, consumer lag where
the broker reports it, closed against stored conversations, records the
broker lost); the judge (calls, errors, latency, tokens); scoring
(latency, retries, unscored); the sink (rows, errors, batch latency, close to
store latency); the judge budget (which limit holds scoring back, for how
long) and cost (tokens and cost per judged conversation); the scorer rollout (which versions the workers score
with, the shadow's label shares, refused rollouts). These metrics carry no product / model-version labels (they
are per process), so the dashboard has no such variables.
"""

from __future__ import annotations

from typing import Any

from dashboards import panels as p
from dashboards import promql

UID = "convowatch-operations"
TITLE = "convowatch / Operations"
W = "$__rate_interval"
LATENCY_QUANTILES = (0.5, 0.9, 0.99)


def dashboard() -> dict[str, Any]:
    """The Operations dashboard's JSON model."""
    board = p.new_dashboard(
        UID,
        TITLE,
        "Pipeline health: events, dead letters, assembly, consumer lag, judge calls/errors/latency/tokens, "
        "scoring and sink latency, rows written.",
    )
    board = p.with_rows(
        board,
        [
            ("Events and assembly", _events()),
            ("Judge", _judge()),
            ("Scoring and sink", _scoring_and_sink()),
            ("Judge budget and cost", _budget_and_cost()),
            ("Scorer rollout", _rollout()),
        ],
    )
    return p.finish(board)


def _latency(title: str, description: str, metric: str, by: str = "") -> Any:
    legend = f" {{{{{by}}}}}" if by else ""
    return p.time_series(
        title,
        description,
        [
            p.promql(promql.histogram_quantile(q, metric + "_bucket", W, by=by), f"p{round(q * 100)}{legend}")
            for q in LATENCY_QUANTILES
        ],
        "s",
        span=8,
    )


def _events() -> list:
    return [
        p.time_series(
            "Events / s by type and outcome",
            "Events consumed from the events topic per second.",
            [p.promql(promql.rate(promql.EVENTS, W, by="type, outcome"), "{{type}} {{outcome}}")],
            "cps",
        ),
        p.time_series(
            "Dead letters / s by reason",
            "Events sent to the dead-letter topic per second, by reason.",
            [p.promql(promql.rate(promql.DEAD_LETTERS, W, by="reason"), "{{reason}}")],
            "cps",
        ),
        p.time_series(
            "Open conversations",
            "Conversations being assembled, per worker.",
            [p.promql(promql.gauge_sum(promql.OPEN_CONVERSATIONS, by="instance"), "{{instance}}")],
            "short",
            span=8,
        ),
        p.time_series(
            "Conversations closed / s by cause",
            "Closes per second: end event, idle timeout, max turns.",
            [p.promql(promql.rate(promql.CONVERSATIONS_CLOSED, W, by="cause"), "{{cause}}")],
            "cps",
            span=8,
        ),
        p.time_series(
            "Assigned partitions",
            "Events-topic partitions each worker owns (a rebalance shows as a step).",
            [p.promql(promql.gauge_sum(promql.ASSIGNED_PARTITIONS, by="instance"), "{{instance}}")],
            "short",
            span=8,
        ),
        p.time_series(
            "Consumer lag (where the broker reports it)",
            "Messages between a partition's high watermark and the worker's position. Empty when the broker does not "
            "report watermarks.",
            [p.promql(promql.gauge_sum(promql.CONSUMER_LAG, by="topic, partition"), "{{topic}}/{{partition}}")],
            "short",
            span=16,
        ),
        p.time_series(
            "Reconciliation: conversations closed vs stored (per hour)",
            "Conversations the workers closed, score rows the sink wrote, and closed records dead-lettered, each over "
            "the hour before; the lines move together when nothing is lost (rows also count re-deliveries written "
            "again). A lasting gap with no lag is what went missing in between, e.g. after the broker lost data.",
            [
                p.promql(promql.increase(promql.CONVERSATIONS_CLOSED, "1h"), "closed"),
                p.promql(promql.increase(promql.SINK_ROWS, "1h", 'table="conversation_scores"'), "stored"),
                p.promql(promql.increase(promql.DEAD_LETTERS, "1h", 'reason="bad_closed_record"'), "dead-lettered"),
            ],
            "short",
            span=8,
        ),
        p.time_series(
            "Broker lost data",
            "Partitions a worker or the sink found with a log shorter than what it had consumed: the broker lost "
            "records (alert ConvowatchBrokerLostData, docs/runbooks.md).",
            [p.promql(promql.increase(promql.BROKER_LOST_DATA, W, by="topic"), "{{topic}}")],
            "short",
            span=8,
        ),
        p.time_series(
            "Partition refetches / s",
            "A worker fetched a partition again from the next offset to process: a later record arrived first (hole) or "
            "records waited while its agent idled (stall). Occasional ones after a restart or a rebalance are repairs; "
            "a steady rate means the consumer keeps losing its place (docs/budget.md).",
            [p.promql(promql.rate(promql.PARTITION_REFETCHES, W, by="topic, reason"), "{{topic}} {{reason}}")],
            "cps",
            span=8,
        ),
    ]


def _judge() -> list:
    calls = promql.rate(promql.JUDGE_CALLS, W, by="judge")
    errors = promql.rate(promql.JUDGE_ERRORS, W, by="judge")
    return [
        p.time_series("Judge calls / s", "Judge requests per second, by judge.", [p.promql(calls, "{{judge}}")], "reqps", span=8),
        p.time_series(
            "Judge error rate",
            "Judge failures per judge request (all error types).",
            [p.promql(f"{errors} / {calls}", "{{judge}}")],
            "percentunit",
            span=8,
            min_value=0,
        ),
        p.time_series(
            "Judge errors / s by error",
            "Judge failures per second, by error type.",
            [p.promql(promql.rate(promql.JUDGE_ERRORS, W, by="judge, error"), "{{judge}} {{error}}")],
            "cps",
            span=8,
        ),
        _latency("Judge latency", "Judge time per conversation: p50 / p90 / p99 per judge.", promql.JUDGE_LATENCY, by="judge"),
        p.time_series(
            "Judge tokens / s",
            "Tokens per second, by judge and kind (prompt / completion; cached_prompt is the part of prompt the judge server served from its prompt cache).",
            [p.promql(promql.rate(promql.JUDGE_TOKENS, W, by="judge, kind"), "{{judge}} {{kind}}")],
            "short",
            span=16,
        ),
    ]


def _scoring_and_sink() -> list:
    return [
        _latency("Scoring latency", "Time to score one conversation (judge included): p50 / p90 / p99.", promql.SCORING_LATENCY),
        _latency("Sink batch latency", "Time to write one batch to the store: p50 / p90 / p99.", promql.SINK_LATENCY),
        _latency(
            "Close to store latency",
            "From a conversation's close to its row in the store: p50 / p90 / p99.",
            promql.CLOSE_TO_STORE_LATENCY,
        ),
        p.time_series(
            "Sink rows / s by table",
            "Rows written to the store per second, by table.",
            [p.promql(promql.rate(promql.SINK_ROWS, W, by="table"), "{{table}}")],
            "short",
            span=8,
        ),
        p.time_series(
            "Sink errors / s",
            "Failed store writes per second (retried).",
            [p.promql(promql.rate(promql.SINK_ERRORS, W), "errors")],
            "cps",
            span=8,
        ),
        p.time_series(
            "Scoring retries and unscored / s",
            "Scoring attempts retried (by reason) and conversations stored unscored (by reason), per second.",
            [
                p.promql(promql.rate(promql.SCORING_RETRIES, W, by="reason"), "retry {{reason}}"),
                p.promql(promql.rate(promql.UNSCORED, W, by="reason"), "unscored {{reason}}"),
            ],
            "cps",
            span=8,
        ),
    ]


def _budget_and_cost() -> list:
    return [
        p.time_series(
            "Judge budget exhausted",
            "1 while a worker's scoring waits because this budget limit is spent "
            "(scoring.budget); conversations wait in the closed topic meanwhile.",
            [p.promql(promql.gauge_sum(promql.JUDGE_BUDGET_EXHAUSTED, by="instance, limit"), "{{instance}} {{limit}}")],
            "short",
            span=12,
            min_value=0,
        ),
        p.time_series(
            "Time held back by the judge budget",
            "Share of the time each worker's scoring waited for a budget "
            "limit (the alert ConvowatchJudgeBudgetExhausted fires above 50 % for 10m).",
            [p.promql(promql.rate(promql.JUDGE_BUDGET_WAIT, W, by="instance, limit"), "{{instance}} {{limit}}")],
            "percentunit",
            span=12,
            min_value=0,
        ),
        p.time_series(
            "Judge cost per 1,000 conversations",
            "Judge cost (judge.price: cached prompt tokens at the cached "
            "rate) per 1,000 conversations the judge answered. Empty without a price table.",
            [
                p.promql(
                    promql.per_judged_conversation(promql.JUDGE_COST, W, by="judge, currency", scale=1000),
                    "{{judge}} {{currency}}",
                )
            ],
            "short",
            span=12,
            min_value=0,
        ),
        p.time_series(
            "Judge tokens per conversation",
            "Prompt, cached prompt (part of prompt) and completion tokens per conversation the judge answered.",
            [p.promql(promql.per_judged_conversation(promql.JUDGE_TOKENS, W, by="judge, kind"), "{{judge}} {{kind}}")],
            "short",
            span=12,
            min_value=0,
        ),
    ]


def _rollout() -> list:
    return [
        p.time_series(
            "Workers per scorer version",
            "Workers scoring with each registered version (docs/rollout.md), as active or shadow: a promotion shows as the "
            "workers moving from one version to the next within scoring.registry_poll_s.",
            [
                p.promql(
                    promql.gauge_sum(promql.SCORER_VERSION_INFO, by="role, scorer_name, scorer_version"),
                    "{{role}} {{scorer_name}} ({{scorer_version}})",
                )
            ],
            "short",
            span=8,
        ),
        p.time_series(
            "Shadow version: share of conversations by label",
            "What the shadow version says about the conversations it scores beside the active one; compare with the "
            "active version's label shares on the Overview, and in full with `convowatch scorers compare`.",
            [p.promql(promql.shadow_outcome_share(W), "{{scorer_name}} {{outcome}}")],
            "percentunit",
            span=8,
            min_value=0,
            max_value=1,
        ),
        p.time_series(
            "Rollout changes / s",
            "Rollouts the workers read from the registry: applied, or refused (a version that cannot be loaded; the "
            "worker keeps scoring with the versions it has and logs why).",
            [p.promql(promql.rate(promql.ROLLOUT_CHANGES, W, by="outcome"), "{{outcome}}")],
            "cps",
            span=8,
        ),
    ]
