"""PromQL over convowatch's metrics, shared by the dashboards and the alert rules.

Metric names are strings here on purpose (``dashboards`` imports nothing from
``stream``); tests hold them to what the running exporter serves. Every
function returns one PromQL expression. ``matchers`` is the inside of a label
selector, e.g. ``'product=~"$product"'`` on a dashboard or ``""`` in a rule.

The dissatisfaction rate is the *calibrated* one: the mean calibrated
P(dissatisfied) of the conversations in a window. It estimates the share of
conversations a human judge would call dissatisfied without the bias of
thresholded labels. Its standard error is the one of a sample mean,
``sqrt(var(P) / n)``, with ``var(P) = mean(P²) - mean(P)²`` from the
sum-of-squares counter; var(P) is at most ``p (1 - p)`` (the binomial bound,
reached when every P is 0 or 1), so a weak calibrator whose P barely varies
gets a narrow band around a rate that also barely moves.

Sampling (docs/sampling.md): the judge may score only a sample of the
conversations, each with inclusion probability π. Rates and label shares are
then *weighted* by w = 1/π (the Hájek ratio R = Σ w·y / Σ w over the judged
conversations), ``n`` is Σ w (the conversations the judged ones stand for), and
the standard error adds the sampling variance, linearised under Poisson
sampling: ``V = Σ (1-π)/π² · (y - R)² / (Σ w)²``, which expands into the
``*_sampling_variance_total`` counters. With π = 1 everywhere the weighted
counters equal the unweighted ones and V = 0: the formulas above, exactly.
"""

from __future__ import annotations

# The attribute labels the service attaches by default (metrics.label_attributes).
ATTRIBUTES = ("product", "model_version")
BY_ATTRIBUTES = "product, model_version"
# Dashboard template variables (multi-value, "All" = ".*").
DASHBOARD_MATCHERS = 'product=~"$product", model_version=~"$model_version"'

SCORED = "convowatch_conversations_scored_total"
UNSCORED = "convowatch_conversations_unscored_total"
NETSAT_BUCKET = "convowatch_netsat_bucket"
DIMENSION = "convowatch_dimension_expected_value"
EVENTS = "convowatch_events_total"
DEAD_LETTERS = "convowatch_dead_letters_total"
JUDGE_CALLS = "convowatch_judge_calls_total"
JUDGE_ERRORS = "convowatch_judge_errors_total"
# Sampling: volume by decision, and the 1/π-weighted sums rates are computed from.
SAMPLED = "convowatch_conversations_sampled_total"
INJECTION_SUSPECTED = "convowatch_injection_suspected_conversations_total"
SCORED_WEIGHT = "convowatch_conversations_scored_weight_total"
SCORED_SAMPLING_VARIANCE = "convowatch_conversations_scored_sampling_variance_total"
CALIBRATED_WEIGHT = "convowatch_calibrated_weight_total"
CALIBRATED_DSAT_WEIGHTED = "convowatch_calibrated_dissatisfaction_probability_weighted_total"
CALIBRATED_DSAT_SQUARED_WEIGHTED = "convowatch_calibrated_dissatisfaction_probability_squared_weighted_total"
CALIBRATED_SAMPLING_VARIANCE = "convowatch_calibrated_sampling_variance_total"
CALIBRATED_DSAT_SAMPLING_VARIANCE = "convowatch_calibrated_dissatisfaction_probability_sampling_variance_total"
CALIBRATED_DSAT_SQUARED_SAMPLING_VARIANCE = "convowatch_calibrated_dissatisfaction_probability_squared_sampling_variance_total"
# ABC-Eval behaviours per assistant turn (scoring.behaviours).
BEHAVIOUR_HITS = "convowatch_behaviour_hits_total"
BEHAVIOUR_TURNS = "convowatch_behaviour_turns_total"
BEHAVIOUR_HITS_WEIGHT = "convowatch_behaviour_hits_weight_total"
BEHAVIOUR_TURNS_WEIGHT = "convowatch_behaviour_turns_weight_total"
BEHAVIOUR_TURNS_SQUARED_VARIANCE = "convowatch_behaviour_turns_squared_variance_total"
BEHAVIOUR_HITS_TURNS_VARIANCE = "convowatch_behaviour_hits_turns_variance_total"
BEHAVIOUR_HITS_SQUARED_VARIANCE = "convowatch_behaviour_hits_squared_variance_total"
BEHAVIOUR_ERROR = "convowatch_behaviour_error"


def _by(by: str) -> str:
    return f" by ({by})" if by else ""


def _range(window: str, offset: str) -> str:
    """``[window]``, shifted back by ``offset`` when given (e.g. ``"1d"``: the same window yesterday)."""
    return f"[{window}] offset {offset}" if offset else f"[{window}]"


def increase(metric: str, window: str, matchers: str = "", by: str = "", offset: str = "") -> str:
    """How much a counter grew over ``window`` (``offset`` earlier), summed (per ``by`` group)."""
    return f"sum{_by(by)}(increase({metric}{{{matchers}}}{_range(window, offset)}))"


def rate(metric: str, window: str, matchers: str = "", by: str = "", offset: str = "") -> str:
    """A counter's per-second rate over ``window`` (``offset`` earlier), summed (per ``by`` group)."""
    return f"sum{_by(by)}(rate({metric}{{{matchers}}}{_range(window, offset)}))"


def calibrated_dsat_rate(window: str, matchers: str = "", by: str = "", offset: str = "") -> str:
    """Calibrated dissatisfaction rate: the 1/π-weighted mean calibrated P(dsat) of the conversations scored in ``window``
    (``offset`` earlier)."""
    return f"{rate(CALIBRATED_DSAT_WEIGHTED, window, matchers, by, offset)} / {rate(CALIBRATED_WEIGHT, window, matchers, by, offset)}"


def _and_behaviour(by: str) -> str:
    return f"behaviour, {by}" if by else "behaviour"


def behaviour_rate(window: str, matchers: str = "", by: str = "", offset: str = "") -> str:
    """Each behaviour's share of the assistant turns judged in ``window`` (1/π-weighted), by ``behaviour`` (and ``by``)."""
    hits = rate(BEHAVIOUR_HITS_WEIGHT, window, matchers, _and_behaviour(by), offset)
    return f"{hits} / ignoring(behaviour) group_left {rate(BEHAVIOUR_TURNS_WEIGHT, window, matchers, by, offset)}"


def behaviour_variance(window: str, matchers: str = "", by: str = "", offset: str = "") -> str:
    """Variance of ``behaviour_rate`` R = H / T over ``window``: (S_hh - 2R·S_ht + R²·S_tt) / T², the linearised
    variance of a ratio over conversations (h hits and t turns each, weight 1/π). It treats a conversation's turns
    as one cluster, which they are (a model that ignores one user tends to ignore them all), and includes sampling."""

    def inc(metric: str, group: str) -> str:
        return increase(metric, window, matchers, group, offset)

    r = f"({behaviour_rate(window, matchers, by, offset)})"
    per_behaviour = _and_behaviour(by)
    spread = (
        f"{inc(BEHAVIOUR_HITS_SQUARED_VARIANCE, per_behaviour)} - 2 * {r} * {inc(BEHAVIOUR_HITS_TURNS_VARIANCE, per_behaviour)}"
        f" + {r} ^ 2 * ignoring(behaviour) group_left {inc(BEHAVIOUR_TURNS_SQUARED_VARIANCE, by)}"
    )
    # `^` binds tighter than `/`; parentheses right after group_left would be read as its label list.
    return f"clamp_min({spread}, 0) / ignoring(behaviour) group_left {inc(BEHAVIOUR_TURNS_WEIGHT, by)} ^ 2"


def behaviour_turns(window: str, matchers: str = "", by: str = "") -> str:
    """Σ 1/π over the assistant turns judged in ``window``, with a ``behaviour`` label per behaviour (so it joins the rates)."""
    labelled = f"0 * {increase(BEHAVIOUR_HITS_WEIGHT, window, matchers, _and_behaviour(by))}"
    return f"{labelled} + ignoring(behaviour) group_left {increase(BEHAVIOUR_TURNS_WEIGHT, window, matchers, by)}"


def error_behaviours() -> str:
    """One series per behaviour the configured sets mark as an error (``convowatch_behaviour_error`` is 1)."""
    return f"max by (behaviour) ({BEHAVIOUR_ERROR}) == 1"


# Agreement with the users: scored conversations users rated while open, by scorer version, label and feedback.
USER_FEEDBACK = "convowatch_user_feedback_conversations_total"
CONFIDENT_RATED = 'label=~"sat|dsat", feedback=~"positive|negative"'


def _and(matchers: str, extra: str) -> str:
    return f"{extra}, {matchers}" if matchers else extra


def _per_scorer(by: str) -> str:
    return f"scorer_version, {by}" if by else "scorer_version"


def user_rated(window: str, matchers: str = "", by: str = "", offset: str = "") -> str:
    """n of ``user_agreement``: rated conversations in ``window`` with a confident label and one-sided feedback,
    per scorer version (and ``by``)."""
    return increase(USER_FEEDBACK, window, _and(matchers, CONFIDENT_RATED), _per_scorer(by), offset)


def user_agreement(window: str, matchers: str = "", by: str = "", offset: str = "") -> str:
    """Share of ``user_rated`` where the scorer agrees with the users: dissatisfied with a thumbs-down only, satisfied
    with a thumbs-up only. Uncertain labels and conflicting feedback are left out (their counts are in the metric)."""
    group = _per_scorer(by)
    n = user_rated(window, matchers, by, offset)
    both_down = increase(USER_FEEDBACK, window, _and(matchers, 'label="dsat", feedback="negative"'), group, offset)
    both_up = increase(USER_FEEDBACK, window, _and(matchers, 'label="sat", feedback="positive"'), group, offset)
    # `x or n * 0`: a window with no agreeing pair of one kind has no series for it; count it as 0.
    return f"(({both_down} or {n} * 0) + ({both_up} or {n} * 0)) / {n}"


def calibrated_conversations(window: str, matchers: str = "", by: str = "", offset: str = "") -> str:
    """n of the calibrated rate: Σ 1/π, the conversations the calibrated ones in ``window`` stand for."""
    return increase(CALIBRATED_WEIGHT, window, matchers, by, offset)


def calibrated_dsat_variance(window: str, matchers: str = "", by: str = "", offset: str = "") -> str:
    """Variance of P(dsat) across the conversations in ``window`` (``offset`` earlier): mean(P²) - mean(P)², weighted, never below 0."""
    mean_sq = f"{rate(CALIBRATED_DSAT_SQUARED_WEIGHTED, window, matchers, by, offset)} / {rate(CALIBRATED_WEIGHT, window, matchers, by, offset)}"
    p = f"({calibrated_dsat_rate(window, matchers, by, offset)})"
    return f"clamp_min({mean_sq} - {p} ^ 2, 0)"


def calibrated_dsat_sampling_variance(window: str, matchers: str = "", by: str = "", offset: str = "") -> str:
    """Sampling variance of the calibrated rate R over ``window``: (S2 - 2R·S1 + R²·S0) / (Σw)², S_k = Σ (1-π)/π² · P^k."""

    def inc(metric: str) -> str:
        return increase(metric, window, matchers, by, offset)

    r = f"({calibrated_dsat_rate(window, matchers, by, offset)})"
    spread = (
        f"{inc(CALIBRATED_DSAT_SQUARED_SAMPLING_VARIANCE)} - 2 * {r} * {inc(CALIBRATED_DSAT_SAMPLING_VARIANCE)}"
        f" + {r} ^ 2 * {inc(CALIBRATED_SAMPLING_VARIANCE)}"
    )
    return f"clamp_min({spread}, 0) / {inc(CALIBRATED_WEIGHT)} ^ 2"


def calibrated_dsat_stderr(window: str, matchers: str = "", by: str = "") -> str:
    """Standard error of the calibrated dissatisfaction rate over ``window``: sqrt(var(P) / n + sampling variance)."""
    return (
        f"sqrt(({calibrated_dsat_variance(window, matchers, by)}) / {calibrated_conversations(window, matchers, by)}"
        f" + {calibrated_dsat_sampling_variance(window, matchers, by)})"
    )


def calibrated_dsat_band(window: str, matchers: str = "", by: str = "", z: float = 1.96, upper: bool = True) -> str:
    """One edge of the rate's confidence band: p ± z·stderr (z = 1.96: 95 %)."""
    sign = "+" if upper else "-"
    return f"({calibrated_dsat_rate(window, matchers, by)}) {sign} {z:g} * {calibrated_dsat_stderr(window, matchers, by)}"


def _with_label(label: str, matchers: str) -> str:
    return f'label="{label}", {matchers}' if matchers else f'label="{label}"'


def label_share(label: str, window: str, matchers: str = "", by: str = "") -> str:
    """1/π-weighted share of scored conversations labelled ``label`` (sat, dsat or uncertain) in ``window``."""
    return f"{rate(SCORED_WEIGHT, window, _with_label(label, matchers), by)} / {rate(SCORED_WEIGHT, window, matchers, by)}"


def scored_conversations(window: str, matchers: str = "", by: str = "") -> str:
    """n of a label share: Σ 1/π, the conversations the scored ones in ``window`` stand for."""
    return increase(SCORED_WEIGHT, window, matchers, by)


def label_share_sampling_variance(label: str, window: str, matchers: str = "", by: str = "") -> str:
    """Sampling variance of ``label_share``: ((1-R)²·B_label + R²·(B - B_label)) / (Σw)², B = Σ (1-π)/π² (y is 0 or 1)."""
    share = f"({label_share(label, window, matchers, by)})"
    of_label = increase(SCORED_SAMPLING_VARIANCE, window, _with_label(label, matchers), by)
    others = f"({increase(SCORED_SAMPLING_VARIANCE, window, matchers, by)} - {of_label})"
    return f"((1 - {share}) ^ 2 * {of_label} + {share} ^ 2 * {others}) / {scored_conversations(window, matchers, by)} ^ 2"


def yield_share(window: str, matchers: str = "", by: str = "") -> str:
    """Yield: share of scored conversations that got a label (not uncertain)."""
    return f"1 - ({label_share('uncertain', window, matchers, by)})"


def histogram_quantile(q: float, bucket_metric: str, window: str, matchers: str = "", by: str = "") -> str:
    """Quantile ``q`` of a histogram over ``window`` (``le`` is always kept)."""
    keep = f"le, {by}" if by else "le"
    return f"histogram_quantile({q:g}, sum by ({keep}) (rate({bucket_metric}{{{matchers}}}[{window}])))"


def histogram_mean(metric: str, window: str, matchers: str = "", by: str = "") -> str:
    """Mean of a histogram with a ``_sum`` over ``window`` (not the NetSAT histogram: it has no ``_sum``)."""
    return f"{rate(metric + '_sum', window, matchers, by)} / {rate(metric + '_count', window, matchers, by)}"


# --- operations metrics (added for the Operations dashboard) ------------------------------------

CONVERSATIONS_CLOSED = "convowatch_conversations_closed_total"
OPEN_CONVERSATIONS = "convowatch_open_conversations"
ASSIGNED_PARTITIONS = "convowatch_assigned_partitions"
CONSUMER_LAG = "convowatch_consumer_lag"
PARTITION_REFETCHES = "convowatch_partition_refetches_total"
SCORING_LATENCY = "convowatch_scoring_latency_seconds"
SCORING_RETRIES = "convowatch_scoring_retries_total"
JUDGE_TOKENS = "convowatch_judge_tokens_total"
JUDGE_LATENCY = "convowatch_judge_latency_seconds"
SINK_ROWS = "convowatch_sink_rows_total"
SINK_ERRORS = "convowatch_sink_errors_total"
SINK_LATENCY = "convowatch_sink_latency_seconds"
CLOSE_TO_STORE_LATENCY = "convowatch_close_to_store_latency_seconds"
BROKER_LOST_DATA = "convowatch_broker_lost_data_total"
QUARANTINED = "convowatch_quarantined_records_total"


# --- scorer rollout (stream/rollout.py) ------------------------------------------------------------

SCORER_VERSION_INFO = "convowatch_scorer_version_info"
SHADOW_CONVERSATIONS = "convowatch_shadow_conversations_total"
ROLLOUT_CHANGES = "convowatch_scorer_rollout_changes_total"


def shadow_outcome_share(window: str) -> str:
    """Each shadow version's share of conversations per outcome (label, or unscored) over ``window``."""
    by_outcome = rate(SHADOW_CONVERSATIONS, window, by="scorer_name, outcome")
    return f"{by_outcome} / ignoring (outcome) group_left {rate(SHADOW_CONVERSATIONS, window, by='scorer_name')}"


def gauge_sum(metric: str, matchers: str = "", by: str = "") -> str:
    """A gauge summed over the processes that export it (per ``by`` group)."""
    return f"sum{_by(by)}({metric}{{{matchers}}})"


# --- judge budget and cost (the worker's stream/budget.py and judge.price) --------------------------

JUDGE_BUDGET_EXHAUSTED = "convowatch_judge_budget_exhausted"
JUDGE_BUDGET_WAIT = "convowatch_judge_budget_wait_seconds_total"
JUDGE_COST = "convowatch_judge_cost_total"
# One judge latency observation per conversation the judge answered: the "per conversation" of tokens and cost.
JUDGED = "convowatch_judge_latency_seconds_count"


def budget_wait_share(window: str, matchers: str = "") -> str:
    """Share of ``window`` during which the judge budget held scoring back, per limit, on the worker held back most
    (budgets are per worker, so a sum over workers would not be a share)."""
    return f"max by (limit) (rate({JUDGE_BUDGET_WAIT}{{{matchers}}}[{window}]))"


def per_judged_conversation(metric: str, window: str, by: str, scale: float = 1.0) -> str:
    """A counter's rate per judged conversation (× ``scale``), per ``by`` (which includes ``judge``)."""
    factor = f"{scale:g} * " if scale != 1 else ""
    return f"{factor}{rate(metric, window, by=by)} / on (judge) group_left {rate(JUDGED, window, by='judge')}"


# Counters that grow whenever a worker or the sink does work (events consumed, judge calls retried, budget waits,
# rows written or failed): read by the alert on a process that does nothing while records wait.
WORK_COUNTERS = (EVENTS, SCORING_RETRIES, JUDGE_BUDGET_WAIT, SINK_ROWS, SINK_ERRORS)
