"""What each convowatch alert compares, independent of the system that evaluates it.

An alert is a few PromQL *queries* (each under a short ref) and *clauses*
``(ref, op, ref or number)`` that must all hold, per label set, for ``for``.
The Prometheus rules (`dashboards.alert_rules`) join the clauses with ``and``
and read the recorded series; the Grafana rules (`dashboards.grafana_alerts`)
run each query on the Prometheus datasource and join the clauses in a math
expression (``$P > $T && $N >= 50``). Both are rendered from the same
`alert_specs` call, with a different `Lookup`, so they cannot drift apart.

Series are named by a key (``"dsat_short"``); `series` gives each key its
PromQL over the exported metrics (from `dashboards.promql`) and, when the
Prometheus rules record it, its recorded name with the window in it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from dashboards import promql as q
from dashboards.alert_windows import AlertWindows

Severity = Literal["page", "ticket"]
# A severity=page alert wakes someone up; a ticket is looked at during working hours.
SEVERITIES: tuple[Severity, ...] = ("page", "ticket")

DSAT_SPIKE = "ConvowatchDissatisfactionSpike"
DSAT_ABOVE_YESTERDAY = "ConvowatchDissatisfactionAboveYesterday"
UNCERTAIN_SURGE = "ConvowatchUncertainSurge"
JUDGE_ERRORS = "ConvowatchJudgeErrors"
PIPELINE_STALLED = "ConvowatchPipelineStalled"
DEAD_LETTER_SURGE = "ConvowatchDeadLetterSurge"
JUDGE_BUDGET_EXHAUSTED = "ConvowatchJudgeBudgetExhausted"
BEHAVIOUR_RISE = "ConvowatchBehaviourRise"
USER_AGREEMENT_DROP = "ConvowatchUserAgreementDrop"
BROKER_LOST_DATA = "ConvowatchBrokerLostData"
WORKER_STUCK = "ConvowatchWorkerStuck"
RECORDS_QUARANTINED = "ConvowatchRecordsQuarantined"
ALERT_NAMES = (
    DSAT_SPIKE,
    DSAT_ABOVE_YESTERDAY,
    UNCERTAIN_SURGE,
    BEHAVIOUR_RISE,
    USER_AGREEMENT_DROP,
    JUDGE_ERRORS,
    PIPELINE_STALLED,
    DEAD_LETTER_SURGE,
    RECORDS_QUARANTINED,
    JUDGE_BUDGET_EXHAUSTED,
    BROKER_LOST_DATA,
    WORKER_STUCK,
)

RUNBOOKS = "docs/runbooks.md"


def runbook_url(alert: str, base: str = RUNBOOKS) -> str:
    """Where an alert's runbook is: ``base#anchor``; the anchor is the heading's GitHub slug (the lowercased name)."""
    return f"{base}#{alert.lower()}"


@dataclass(frozen=True)
class Series:
    """A PromQL expression over the exported metrics, and the name the Prometheus rules record it under ("" = not recorded)."""

    expr: str
    record: str = ""


def series(w: AlertWindows) -> dict[str, Series]:
    """Every series the alerts read, by key, for windows ``w``."""
    by = q.BY_ATTRIBUTES
    short, base, ago = w.short, w.baseline, w.yesterday
    ashort, abase = w.agreement_short, w.agreement_baseline
    judge_errors = q.rate(q.JUDGE_ERRORS, short, by="judge")
    judge_ok = q.rate(q.JUDGE_LATENCY + "_count", short, by="judge")  # one observation per successful judgement
    judge_errors_n = q.increase(q.JUDGE_ERRORS, short, by="judge")
    judge_ok_n = q.increase(q.JUDGE_LATENCY + "_count", short, by="judge")
    unsampled = q.increase(q.SAMPLED, w.stall_for, 'decision="unsampled"')
    waiting = f'{q.CONSUMER_LAG}{{topic!~".*-changelog"}}'
    # `x or y * 0`: a judge that never succeeded has no latency series, one that never failed no error series;
    # count the missing side as 0 so both the ratio and the attempts exist for every judge that was used.
    return {
        "dsat_short": Series(q.calibrated_dsat_rate(short, by=by), f"convowatch:calibrated_dsat_rate:ratio_rate{short}"),
        "dsat_base": Series(q.calibrated_dsat_rate(base, by=by), f"convowatch:calibrated_dsat_rate:ratio_rate{base}"),
        "dsat_var_base": Series(q.calibrated_dsat_variance(base, by=by), f"convowatch:calibrated_dsat_variance:rate{base}"),
        "dsat_sampling_var_short": Series(
            q.calibrated_dsat_sampling_variance(short, by=by), f"convowatch:calibrated_dsat_sampling_variance:increase{short}"
        ),
        "calibrated_short": Series(q.calibrated_conversations(short, by=by), f"convowatch:calibrated_weight:increase{short}"),
        "dsat_ago": Series(
            q.calibrated_dsat_rate(short, by=by, offset=ago), f"convowatch:calibrated_dsat_rate:ratio_rate{short}_offset{ago}"
        ),
        "dsat_var_ago": Series(
            q.calibrated_dsat_variance(short, by=by, offset=ago), f"convowatch:calibrated_dsat_variance:rate{short}_offset{ago}"
        ),
        "dsat_sampling_var_ago": Series(
            q.calibrated_dsat_sampling_variance(short, by=by, offset=ago),
            f"convowatch:calibrated_dsat_sampling_variance:increase{short}_offset{ago}",
        ),
        "calibrated_ago": Series(
            q.calibrated_conversations(short, by=by, offset=ago), f"convowatch:calibrated_weight:increase{short}_offset{ago}"
        ),
        "uncertain_short": Series(q.label_share("uncertain", short, by=by), f"convowatch:uncertain_share:ratio_rate{short}"),
        "uncertain_base": Series(q.label_share("uncertain", base, by=by), f"convowatch:uncertain_share:ratio_rate{base}"),
        "uncertain_sampling_var_short": Series(
            q.label_share_sampling_variance("uncertain", short, by=by),
            f"convowatch:uncertain_share_sampling_variance:increase{short}",
        ),
        "scored_short": Series(q.scored_conversations(short, by=by), f"convowatch:conversations_scored_weight:increase{short}"),
        # Behaviours: the baseline ends where the short window starts, so the two are independent samples.
        "behaviour_short": Series(
            f"{q.behaviour_rate(short, by=by)} and on (behaviour) ({q.error_behaviours()})",
            f"convowatch:error_behaviour_rate:ratio_rate{short}",
        ),
        "behaviour_var_short": Series(q.behaviour_variance(short, by=by), f"convowatch:behaviour_rate_variance:increase{short}"),
        "behaviour_turns_short": Series(q.behaviour_turns(short, by=by), f"convowatch:behaviour_turns_weight:increase{short}"),
        "behaviour_base": Series(
            q.behaviour_rate(base, by=by, offset=short), f"convowatch:behaviour_rate:ratio_rate{base}_offset{short}"
        ),
        "behaviour_var_base": Series(
            q.behaviour_variance(base, by=by, offset=short), f"convowatch:behaviour_rate_variance:increase{base}_offset{short}"
        ),
        # Agreement with the users: the baseline ends where the short window starts, as for behaviours.
        "agreement_short": Series(q.user_agreement(ashort, by=by), f"convowatch:user_agreement:ratio_increase{ashort}"),
        "rated_short": Series(q.user_rated(ashort, by=by), f"convowatch:user_rated:increase{ashort}"),
        "agreement_base": Series(
            q.user_agreement(abase, by=by, offset=ashort), f"convowatch:user_agreement:ratio_increase{abase}_offset{ashort}"
        ),
        "rated_base": Series(q.user_rated(abase, by=by, offset=ashort), f"convowatch:user_rated:increase{abase}_offset{ashort}"),
        "judge_error_ratio": Series(
            f"({judge_errors} or {judge_ok} * 0) / (({judge_errors} or {judge_ok} * 0) + ({judge_ok} or {judge_errors} * 0))",
            f"convowatch:judge_errors:ratio_rate{short}",
        ),
        "judge_attempts": Series(
            f"({judge_errors_n} or {judge_ok_n} * 0) + ({judge_ok_n} or {judge_errors_n} * 0)",
            f"convowatch:judge_attempts:increase{short}",
        ),
        "dead_letter_ratio": Series(
            f"{q.rate(q.DEAD_LETTERS, short)} / {q.rate(q.EVENTS, short)}", f"convowatch:dead_letters:ratio_rate{short}"
        ),
        "events_short": Series(q.increase(q.EVENTS, short), f"convowatch:events:increase{short}"),
        "budget_wait_share": Series(q.budget_wait_share(short), f"convowatch:judge_budget_wait:ratio_rate{short}"),
        # Not recorded: each is read by one alert only.
        "closing_events": Series(q.increase(q.EVENTS, w.stall_for, 'outcome="closed"')),
        "lost_data": Series(q.increase(q.BROKER_LOST_DATA, w.lost_data_for, by="topic")),
        "quarantined": Series(q.increase(q.QUARANTINED, w.quarantined_for, by="stage")),
        # A process with records waiting (a table's changelog left out: it is read at recovery, not consumed) and no
        # sign of work: no event consumed, no judge retry, no budget wait, no row or failed write in the sink.
        "waiting": Series(f"max by (instance) ({waiting})"),
        "working": Series(
            f'sum by (instance) (increase({{__name__=~"{"|".join(q.WORK_COUNTERS)}"}}[{w.stall_for}])) '
            f"or max by (instance) ({waiting}) * 0"
        ),
        # Finished work: scored, stored unscored, or left out by sampling (also a decision on a closed conversation).
        "finished": Series(
            f"({q.increase(q.SCORED, w.stall_for)} or vector(0)) + ({q.increase(q.UNSCORED, w.stall_for)} or vector(0))"
            f" + ({unsampled} or vector(0))"
        ),
    }


Lookup = Callable[[str], str]
"""Series key -> PromQL text to put in an expression (a recorded name, or a parenthesised expression)."""


def unwrap(promql: str) -> str:
    """``promql`` without parentheses around the whole of it (``(a / b)`` -> ``a / b``; ``(a) + (b)`` unchanged)."""
    while promql.startswith("(") and promql.endswith(")"):
        depth = 0
        for i, ch in enumerate(promql):
            depth += {"(": 1, ")": -1}.get(ch, 0)
            if depth == 0 and i < len(promql) - 1:
                return promql  # the first parenthesis closes before the end
        promql = promql[1:-1]
    return promql


def recorded_lookup(w: AlertWindows) -> Lookup:
    """Recorded names where the Prometheus rules record the series, the expression otherwise."""
    table = series(w)
    return lambda key: table[key].record or f"({table[key].expr})"


def raw_lookup(w: AlertWindows) -> Lookup:
    """Always the expression over the exported metrics (for Grafana, which cannot assume the recording rules are loaded)."""
    table = series(w)
    return lambda key: f"({table[key].expr})"


Op = Literal[">", ">=", "<", "=="]


@dataclass(frozen=True)
class Clause:
    """``query[left] op right``; ``right`` is another query's ref or a number."""

    left: str
    op: Op
    right: str


@dataclass(frozen=True)
class AlertSpec:
    """One alert: its queries (ref -> PromQL), the clauses that must all hold, and what a human reads."""

    name: str
    severity: Severity
    labels: tuple[str, ...]
    """Labels the alert carries per firing series (besides severity)."""
    queries: dict[str, str]
    clauses: tuple[Clause, ...]
    summary: str
    description: str
    """Text with ``{ref:fmt}`` placeholders: each system renders them as its own template syntax."""

    @property
    def value_ref(self) -> str:
        """The query whose value the alert reports (Prometheus' ``$value``: the first clause's left side)."""
        return self.clauses[0].left


def _points(share: float) -> str:
    return f"{share * 100:g} points"


def _percent(share: float) -> str:
    return f"{share * 100:g}%"


def _spike_threshold(base: str, var: str, n: str, sampling_var: str, w: AlertWindows) -> str:
    """base + max(min_lift, z * stderr), stderr = sqrt(var(P) / n + the short rate's sampling variance):
    a rise that is both large and significant. n = Σ 1/π; with π = 1 the sampling variance is 0."""
    return f"{base} + clamp_min({w.z:g} * sqrt({var} / {n} + {sampling_var}), {w.min_lift:g})"


def _yesterday_threshold(
    ago: str, var_ago: str, n: str, n_ago: str, sampling_var: str, sampling_var_ago: str, w: AlertWindows
) -> str:
    """Two-sample version: both windows are short, so both means carry error: sqrt(var * (1/n + 1/n_ago)),
    plus the sampling variance of each."""
    return (
        f"{ago} + clamp_min({w.z:g} * sqrt({var_ago} * (1 / {n} + 1 / {n_ago}) + {sampling_var} + {sampling_var_ago}), "
        f"{w.min_lift:g})"
    )


def _share_threshold(base: str, n: str, sampling_var: str, w: AlertWindows) -> str:
    """base + max(min_lift, z * sqrt(p (1 - p) / n + sampling variance)): the uncertain label is yes/no, so the
    binomial error is exact; sampling adds its own."""
    return f"{base} + clamp_min({w.z:g} * sqrt({base} * (1 - {base}) / {n} + {sampling_var}), {w.uncertain_min_lift:g})"


def _two_sample_threshold(base: str, var: str, var_base: str, min_lift: float, w: AlertWindows) -> str:
    """base + max(min_lift, z * sqrt(var + var_base)): a two-sample z-test of two independent windows."""
    return f"{base} + clamp_min({w.z:g} * sqrt({var} + {var_base}), {min_lift:g})"


def _drop_threshold(base: str, n: str, n_base: str, w: AlertWindows) -> str:
    """base - max(min_drop, z * sqrt(p (1 - p) (1/n + 1/n_base))): a two-sample z-test of two shares under the null
    hypothesis that both equal the baseline's."""
    return f"{base} - clamp_min({w.z:g} * sqrt({base} * (1 - {base}) * (1 / {n} + 1 / {n_base})), {w.agreement_min_drop:g})"


def alert_specs(w: AlertWindows, s: Lookup) -> list[AlertSpec]:
    """Every convowatch alert for windows ``w``, its queries written with lookup ``s``."""
    attrs = q.ATTRIBUTES
    pct, count = "humanizePercentage", 'printf "%.0f"'
    return [
        AlertSpec(
            DSAT_SPIKE,
            "page",
            attrs,
            {
                "P": s("dsat_short"),
                "T": _spike_threshold(s("dsat_base"), s("dsat_var_base"), s("calibrated_short"), s("dsat_sampling_var_short"), w),
                "N": s("calibrated_short"),
                "B": s("dsat_base"),
            },
            (Clause("P", ">", "T"), Clause("N", ">=", str(w.min_conversations))),
            "Dissatisfaction spike on {{ $labels.product }} {{ $labels.model_version }}",
            f"Calibrated dissatisfaction rate over the last {w.short}: {{P:{pct}}} over {{N:{count}}} conversations, "
            f"significantly above its {w.baseline} baseline of {{B:{pct}}} "
            f"(threshold: baseline + max({_points(w.min_lift)}, {w.z:g} standard errors), for {w.for_}).",
        ),
        AlertSpec(
            DSAT_ABOVE_YESTERDAY,
            "ticket",
            attrs,
            {
                "P": s("dsat_short"),
                "T": _yesterday_threshold(
                    s("dsat_ago"),
                    s("dsat_var_ago"),
                    s("calibrated_short"),
                    s("calibrated_ago"),
                    s("dsat_sampling_var_short"),
                    s("dsat_sampling_var_ago"),
                    w,
                ),
                "N": s("calibrated_short"),
                "Y": s("calibrated_ago"),
                "B": s("dsat_ago"),
            },
            (Clause("P", ">", "T"), Clause("N", ">=", str(w.min_conversations)), Clause("Y", ">=", str(w.min_conversations))),
            "Dissatisfaction above yesterday on {{ $labels.product }} {{ $labels.model_version }}",
            f"Calibrated dissatisfaction rate over the last {w.short}: {{P:{pct}}} over {{N:{count}}} conversations; "
            f"the same window {w.yesterday} ago: {{B:{pct}}} over {{Y:{count}}} conversations "
            f"(threshold: that + max({_points(w.min_lift)}, {w.z:g} standard errors of the difference), for {w.for_}).",
        ),
        AlertSpec(
            UNCERTAIN_SURGE,
            "ticket",
            attrs,
            {
                "P": s("uncertain_short"),
                "T": _share_threshold(s("uncertain_base"), s("scored_short"), s("uncertain_sampling_var_short"), w),
                "N": s("scored_short"),
                "B": s("uncertain_base"),
            },
            (Clause("P", ">", "T"), Clause("N", ">=", str(w.uncertain_min_conversations))),
            "Uncertain share surging on {{ $labels.product }} {{ $labels.model_version }} (judge drift?)",
            f"Share of scored conversations labelled uncertain over the last {w.short}: {{P:{pct}}} of {{N:{count}}}, "
            f"against {{B:{pct}}} over {w.baseline} (threshold: baseline + max({_points(w.uncertain_min_lift)}, "
            f"{w.z:g} standard errors), for {w.for_}). The judge may have stopped separating conversations.",
        ),
        AlertSpec(
            BEHAVIOUR_RISE,
            "ticket",
            ("behaviour", *attrs),
            {
                "P": s("behaviour_short"),
                "T": _two_sample_threshold(
                    s("behaviour_base"), s("behaviour_var_short"), s("behaviour_var_base"), w.behaviour_min_lift, w
                ),
                "N": s("behaviour_turns_short"),
                "B": s("behaviour_base"),
            },
            (Clause("P", ">", "T"), Clause("N", ">=", str(w.behaviour_min_turns))),
            "Behaviour {{ $labels.behaviour }} rising on {{ $labels.product }} {{ $labels.model_version }}",
            f"Share of assistant turns showing {{{{ $labels.behaviour }}}} over the last {w.short}: {{P:{pct}}} of "
            f"{{N:{count}}} turns, significantly above the {w.baseline} before it: {{B:{pct}}} (threshold: that + "
            f"max({_points(w.behaviour_min_lift)}, {w.z:g} standard errors of the difference, conversations as clusters), "
            f"for {w.for_}).",
        ),
        AlertSpec(
            USER_AGREEMENT_DROP,
            "ticket",
            ("scorer_version", *attrs),
            {
                "P": s("agreement_short"),
                "T": _drop_threshold(s("agreement_base"), s("rated_short"), s("rated_base"), w),
                "N": s("rated_short"),
                "M": s("rated_base"),
                "B": s("agreement_base"),
            },
            (
                Clause("P", "<", "T"),
                Clause("N", ">=", str(w.agreement_min_conversations)),
                Clause("M", ">=", str(w.agreement_min_conversations)),
            ),
            "Scorer {{ $labels.scorer_version }} agrees less with the users of {{ $labels.product }} {{ $labels.model_version }}",
            f"The scorer's label matched the users' feedback on {{P:{pct}}} of {{N:{count}}} rated conversations over the "
            f"last {w.agreement_short}, against {{B:{pct}}} of {{M:{count}}} over the {w.agreement_baseline} before it "
            f"(threshold: that - max({_points(w.agreement_min_drop)}, {w.z:g} standard errors of the difference), "
            f"for {w.for_}). The judge may have drifted, the product changed, or a prompt broke.",
        ),
        AlertSpec(
            JUDGE_ERRORS,
            "ticket",
            ("judge",),
            {"P": s("judge_error_ratio"), "N": s("judge_attempts")},
            (Clause("P", ">", f"{w.judge_error_ratio:g}"), Clause("N", ">=", str(w.judge_min_attempts))),
            "Judge {{ $labels.judge }} is failing",
            f"{{P:{pct}}} of {{N:{count}}} judge attempts failed over the last {w.short} "
            f"(threshold {_percent(w.judge_error_ratio)}, for {w.for_}). Failed attempts are retried; "
            "conversations that run out of attempts are stored unscored.",
        ),
        AlertSpec(
            PIPELINE_STALLED,
            "page",
            (),
            {"E": s("closing_events"), "S": s("finished")},
            (Clause("E", ">", "0"), Clause("S", "==", "0")),
            "convowatch pipeline stalled: conversations close but none is scored",
            f"{{E:{count}}} conversations closed over the last {w.stall_for} and none was scored, stored unscored "
            f"or left unsampled (for {w.for_}). Quality monitoring is blind until scoring resumes.",
        ),
        AlertSpec(
            DEAD_LETTER_SURGE,
            "ticket",
            (),
            {"P": s("dead_letter_ratio"), "N": s("events_short")},
            (Clause("P", ">", f"{w.dead_letter_ratio:g}"), Clause("N", ">=", str(w.dead_letter_min_events))),
            "Dead letters surging",
            f"Dead letters over the last {w.short}: {{P:{pct}}} of the {{N:{count}}} consumed events "
            f"(threshold {_percent(w.dead_letter_ratio)}, for {w.for_}). Producers may be sending events that break the contract.",
        ),
        AlertSpec(
            RECORDS_QUARANTINED,
            "ticket",
            ("stage",),
            {"Q": s("quarantined")},
            (Clause("Q", ">", "0"),),
            "The {{ $labels.stage }} stage quarantined records",
            f"The {{{{ $labels.stage }}}} stage failed twice on {{Q:{count}}} record(s) over the last {w.quarantined_for} "
            "and sent them to the dead-letter topic (reason quarantined) so its partitions go on: a bug, or a record no "
            "bound of the event contract caught. Those records are not monitored; the dead letters say which error (runbook).",
        ),
        AlertSpec(
            JUDGE_BUDGET_EXHAUSTED,
            "ticket",
            ("limit",),
            {"P": s("budget_wait_share")},
            (Clause("P", ">", f"{w.budget_wait_share:g}"),),
            "Judge budget {{ $labels.limit }} is holding scoring back",
            f"A worker waited for the judge budget ({{{{ $labels.limit }}}}) {{P:{pct}}} of the last {w.short} "
            f"(threshold {_percent(w.budget_wait_share)}, for {w.for_}). Conversations wait in the closed topic: none is "
            "lost, but scores arrive late and the closed topic's lag grows.",
        ),
        AlertSpec(
            BROKER_LOST_DATA,
            "page",
            ("topic",),
            {"L": s("lost_data")},
            (Clause("L", ">", "0"),),
            "The Kafka broker lost records of {{ $labels.topic }}",
            f"A worker or the sink found the log of {{{{ $labels.topic }}}} shorter than what it had consumed "
            f"({{L:{count}}} time(s) over the last {w.lost_data_for}): the broker lost records (a restart without "
            "durable storage, or a lost disk). Conversations and scores from before the loss that were not yet processed "
            "are gone; reconcile and replay from the source (runbook).",
        ),
        AlertSpec(
            WORKER_STUCK,
            "page",
            ("instance",),
            {"L": s("waiting"), "E": s("working")},
            (Clause("L", ">", "0"), Clause("E", "==", "0")),
            "convowatch process {{ $labels.instance }} does nothing while records wait",
            f"{{L:{count}}} records wait in a partition {{{{ $labels.instance }}}} reads, and over the last {w.stall_for} it "
            f"consumed no event, retried no judge call, waited for no budget and wrote nothing (for {w.for_}). A worker "
            "the consumer group evicted can stay stuck; restart it: nothing is lost, it resumes from its committed "
            "offsets (runbook).",
        ),
    ]
