"""The service's Prometheus metrics (prefix ``convowatch_``), and the label policy.

Dashboards and alert rules name these metrics as strings; tests hold them to
what this module exports. Attribute labels (product, model version, ...) come
from an allow-list; each keeps at most ``max_label_values`` distinct values
(the others are reported as ``other``) and together at most
``max_label_combinations`` combinations (`AttributeLabels`), given by volume
over a window and re-evaluated, so cardinality stays bounded whatever
producers send and the busiest values hold the slots.

Unbiased dissatisfaction rate in PromQL (calibrated probabilities, not labels),
weighted by 1/π so that sampling (stream/sampling.py) does not bias it::

    sum(rate(convowatch_calibrated_dissatisfaction_probability_weighted_total[5m]))
      / sum(rate(convowatch_calibrated_weight_total[5m]))

The unweighted counters (``convowatch_conversations_scored_total``,
``convowatch_calibrated_conversations_total``, ...) count judge work; the
``*_weight*`` and ``*_sampling_variance*`` counters are what rates and their
standard errors are computed from (docs/sampling.md).
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, start_http_server

OTHER = "other"
MISSING = "none"

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
# NetSAT ranges over ±10 per rubric; 10-20 rubrics give roughly ±200. NetSAT can be negative, so (as
# OpenMetrics requires) the histogram exports no _sum: use histogram_quantile, or ClickHouse for means.
NETSAT_BUCKETS = tuple(float(b) for b in range(-100, 101, 10))
# Calibrated expected answers on 1..K scales (LLM-Rubric uses K = 4).
DIMENSION_BUCKETS = (1.0, 1.25, 1.5, 1.75, 2.0, 2.25, 2.5, 2.75, 3.0, 3.25, 3.5, 3.75, 4.0, 4.5, 5.0)


# Metrics built without settings (tests, tools) re-evaluate label slots as often as metrics.label_slot_window_s's default.
DEFAULT_LABEL_SLOT_WINDOW_S = 900.0
# Values a slot table counts per slot it has (space-saving: any value above 1/(this × slots) of a window's traffic is
# counted, however many distinct junk values arrive; memory stays this × slots entries).
TRACKED_VALUES_PER_SLOT = 4


class LabelSlots:
    """At most ``capacity`` values hold a slot; the others are reported merged. Slots go by volume, not arrival:

    every value's volume in the current window is counted (space-saving, `TRACKED_VALUES_PER_SLOT` × capacity
    counters), and `reevaluate` gives the slots to the values with the most volume in the window that ended (a
    value with none loses its slot). Between re-evaluations a free slot goes to the first value that asks, as
    before; a full table reports new values merged until the next re-evaluation. So a junk burst that took every
    slot holds them for at most one window once real traffic outweighs it.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.slots: set[object] = set()
        self._volume: dict[object, int] = {}
        self._max_tracked = capacity * TRACKED_VALUES_PER_SLOT

    def admit(self, value: object) -> bool:
        """Count one use of ``value``; True if it holds a slot (now or newly given a free one)."""
        self._count(value)
        if value in self.slots:
            return True
        if len(self.slots) < self.capacity:
            self.slots.add(value)
            return True
        return False

    def reevaluate(self) -> None:
        """Give the slots to the values with the most volume in the window that ended, and start a new window."""
        ranked = sorted(self._volume.items(), key=lambda kv: kv[1], reverse=True)
        self.slots = {value for value, _ in ranked[: self.capacity]}
        self._volume = {}

    def _count(self, value: object) -> None:
        if value in self._volume:
            self._volume[value] += 1
        elif len(self._volume) < self._max_tracked:
            self._volume[value] = 1
        else:  # space-saving: the least-counted value makes room, its count carried over (an overestimate)
            least = min(self._volume, key=self._volume.__getitem__)
            self._volume[value] = self._volume.pop(least) + 1


class AttributeLabels:
    """Maps conversation attributes to bounded label values for the allow-listed keys.

    Each key keeps at most ``max_values`` distinct values (the others: ``other``), and the keys together at
    most ``max_combinations`` distinct combinations: a combination without a slot keeps its first key's value
    and reports the other keys as ``other`` (so products stay apart, their model versions merge). 50 products
    × 50 model versions made 242,659 series under the per-key cap alone; the caps bound the combinations in use.

    Slots go by volume over a window of ``slot_window_s`` (`LabelSlots`), re-evaluated at the end of each window:
    values that came first (a junk burst took every slot, 45 of 50 real model versions reported as ``other`` until
    a restart) lose their slots to the values with the most traffic. A displaced value's series stays exported
    (counters are never removed) but stops growing; each re-evaluation can add at most ``max_values`` values per
    key and ``max_combinations`` combinations to what was exported before.
    """

    def __init__(
        self,
        keys: Sequence[str],
        max_values: int,
        max_combinations: int | None = None,
        slot_window_s: float = DEFAULT_LABEL_SLOT_WINDOW_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.keys = tuple(keys)
        self.max_values = max_values
        self.max_combinations = max_combinations
        self.slot_window_s = slot_window_s
        self._clock = clock
        self._window_started = clock()
        self._value_slots = {k: LabelSlots(max_values) for k in self.keys}
        self._combination_slots = LabelSlots(max_combinations) if max_combinations is not None else None
        self._lock = threading.Lock()

    def values(self, attributes: Mapping[str, str]) -> tuple[str, ...]:
        """The label values for ``attributes``: each key's value if it holds a slot, else ``other``."""
        out = []
        with self._lock:
            self._reevaluate_if_due()
            for key in self.keys:
                value = str(attributes.get(key, MISSING)) or MISSING
                if value != MISSING and not self._value_slots[key].admit(value):
                    value = OTHER
                out.append(value)
            combination = tuple(out)
            if self._combination_slots is None or self._combination_slots.admit(combination):
                return combination
            return combination[:1] + tuple(OTHER if v != MISSING else v for v in combination[1:])

    def _reevaluate_if_due(self) -> None:
        now = self._clock()
        if now - self._window_started < self.slot_window_s:
            return
        self._window_started = now
        for slots in self._value_slots.values():
            slots.reevaluate()
        if self._combination_slots is not None:
            self._combination_slots.reevaluate()


# Values of convowatch_conversations_sampled_total's decision label.
JUDGED, UNSAMPLED = "judged", "unsampled"

# Labels the metrics below use themselves; attribute labels must not shadow them.
FIXED_LABELS = frozenset(
    {
        "type",
        "outcome",
        "reason",
        "cause",
        "decision",
        "label",
        "behaviour",
        "dimension",
        "judge",
        "kind",
        "currency",
        "limit",
        "error",
        "table",
        "le",
        "quantile",
    }
)
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


def check_attribute_keys(keys: Sequence[str]) -> None:
    """Refuse attribute label names that are not Prometheus label names or clash with the fixed labels."""
    for key in keys:
        if not _LABEL_NAME.fullmatch(key) or key.startswith("__"):
            raise ValueError(f"metrics.label_attributes: {key!r} is not a Prometheus label name ([a-zA-Z_][a-zA-Z0-9_]*)")
        if key in FIXED_LABELS:
            raise ValueError(
                f"metrics.label_attributes: {key!r} clashes with a label convowatch's metrics use ({sorted(FIXED_LABELS)})"
            )
    if len(set(keys)) != len(keys):
        raise ValueError(f"metrics.label_attributes: duplicate keys in {list(keys)}")


class ServiceMetrics:
    """All metrics of one process, registered in ``registry``."""

    def __init__(
        self,
        attribute_keys: Sequence[str] = ("product", "model_version"),
        max_label_values: int = 50,
        registry: CollectorRegistry | None = None,
        max_label_combinations: int | None = None,
        label_slot_window_s: float = DEFAULT_LABEL_SLOT_WINDOW_S,
    ) -> None:
        check_attribute_keys(attribute_keys)
        # No ``*_created`` sample per child (a process-wide switch of prometheus_client): in the text format each one is
        # a gauge series of its own in Prometheus, doubling every labelled counter's series. Nothing here reads them.
        disable_created_metrics()
        self.registry = registry or CollectorRegistry()
        self.attributes = AttributeLabels(attribute_keys, max_label_values, max_label_combinations, label_slot_window_s)
        attrs = list(self.attributes.keys)
        r = self.registry

        # events and assembly
        self.events = Counter("convowatch_events", "Events consumed, by type and outcome.", ["type", "outcome"], registry=r)
        self.dead_letters = Counter(
            "convowatch_dead_letters", "Events sent to the dead-letter topic, by reason.", ["reason"], registry=r
        )
        self.conversations_closed = Counter(
            "convowatch_conversations_closed", "Conversations closed, by cause.", ["cause"], registry=r
        )
        self.quarantined_records = Counter(
            "convowatch_quarantined_records",
            "Records a worker stage failed on twice, sent to the dead-letter topic (reason quarantined) so the partition "
            "goes on: a bug or a record no bound caught, by stage (stream/poll_stage.py; the error is in the dead letter).",
            ["stage"],
            registry=r,
        )
        self.open_conversations = Gauge(
            "convowatch_open_conversations", "Conversations being assembled on this worker.", registry=r
        )
        self.closed_forgotten_early = Counter(
            "convowatch_closed_conversations_forgotten_early",
            "Closed conversations forgotten before assembly.closed_retention_s because their partition remembered its "
            "share of assembly.max_closed_conversations (a redelivered turn of one opens it again).",
            registry=r,
        )
        self.assigned_partitions = Gauge(
            "convowatch_assigned_partitions", "Events-topic partitions this worker owns.", registry=r
        )
        self.consumer_lag = Gauge(
            "convowatch_consumer_lag",
            "Records not yet consumed: the broker's high-water mark minus this consumer's position.",
            ["topic", "partition"],
            registry=r,
        )
        self._lag_partitions: set[tuple[str, str]] = set()
        self.broker_lost_data = Counter(
            "convowatch_broker_lost_data",
            "Partitions whose records the broker was found to have lost: the group's committed offset gone or gone "
            "backwards (stream/broker_loss.py).",
            ["topic"],
            registry=r,
        )
        self.partition_refetches = Counter(
            "convowatch_partition_refetches",
            "Partitions fetched again from the next offset to process, by topic and reason "
            "(hole: a later record arrived first; stall: records waited while the agent idled).",
            ["topic", "reason"],
            registry=r,
        )

        # scoring
        self.conversations_scored = Counter(
            "convowatch_conversations_scored",
            "Conversations scored, by label (sat/dsat/uncertain) and attributes.",
            ["label", *attrs],
            registry=r,
        )
        self.conversations_unscored = Counter(
            "convowatch_conversations_unscored", "Conversations stored without scores, by reason.", ["reason", *attrs], registry=r
        )
        self.calibrated_conversations = Counter(
            "convowatch_calibrated_conversations", "Conversations with a calibrated main-question prediction.", attrs, registry=r
        )
        self.calibrated_dissatisfaction = Counter(
            "convowatch_calibrated_dissatisfaction_probability",
            "Sum of calibrated P(dissatisfied); divide its rate by convowatch_calibrated_conversations_total's.",
            attrs,
            registry=r,
        )
        # With the count and the sum, the spread of P(dsat) across conversations: the standard error of the rate.
        self.calibrated_dissatisfaction_squared = Counter(
            "convowatch_calibrated_dissatisfaction_probability_squared",
            "Sum of squared calibrated P(dissatisfied), for the variance of P across conversations.",
            attrs,
            registry=r,
        )
        # Agreement with the users: rated conversations (feedback while open) by the scorer's label and the users'.
        self.user_feedback_conversations = Counter(
            "convowatch_user_feedback_conversations",
            "Scored conversations users rated while open, by scorer version, the scorer's label and the users' "
            "(positive: only thumbs-up, negative: only thumbs-down, conflict: both; the latest rating of each turn).",
            ["scorer_version", "label", "feedback", *attrs],
            registry=r,
        )
        self.injection_suspected = Counter(
            "convowatch_injection_suspected_conversations",
            "Conversations whose users' turns hold an injection attempt (text written to steer the judge; "
            "scorers/injection.py), by kind; a conversation counts once per kind found.",
            ["kind", *attrs],
            registry=r,
        )
        self.redactions = Counter(
            "convowatch_redactions",
            "Personal data items replaced before a conversation's text left for the judge (redaction.kinds), by kind.",
            ["kind"],
            registry=r,
        )
        # Scorer rollout (stream/rollout.py): which versions score, what the shadow says, and refused changes.
        self.scorer_version_info = Gauge(
            "convowatch_scorer_version_info",
            "1 for each scorer version this worker scores with now, by role (active, shadow), registry name and hash.",
            ["role", "scorer_name", "scorer_version"],
            registry=r,
        )
        self.shadow_conversations = Counter(
            "convowatch_shadow_conversations",
            "Conversations a shadow version scored beside the active one, by its name, hash and outcome "
            "(its label, or unscored); they feed no other metric.",
            ["scorer_name", "scorer_version", "outcome"],
            registry=r,
        )
        self.rollout_changes = Counter(
            "convowatch_scorer_rollout_changes",
            "Changes of the registry's rollout this worker read, by outcome: applied, or refused (a version that cannot "
            "be loaded; the worker keeps scoring with the versions it has).",
            ["outcome"],
            registry=r,
        )
        # Sampling (stream/sampling.py): every finished conversation, judged or not, and the Horvitz–Thompson sums.
        self.conversations_sampled = Counter(
            "convowatch_conversations_sampled",
            "Closed conversations by sampling decision (judged, unsampled) and reason "
            "(rate, new_model_version, negative_feedback, rated).",
            ["decision", "reason", *attrs],
            registry=r,
        )
        self.scored_weight = Counter(
            "convowatch_conversations_scored_weight",
            "Sum of 1/π over scored conversations, by label: the conversations they stand for (label shares divide these).",
            ["label", *attrs],
            registry=r,
        )
        self.scored_sampling_variance = Counter(
            "convowatch_conversations_scored_sampling_variance",
            "Sum of (1-π)/π² over scored conversations, by label: the sampling variance of a label share.",
            ["label", *attrs],
            registry=r,
        )
        self.calibrated_weight = Counter(
            "convowatch_calibrated_weight", "Sum of 1/π over conversations with a calibrated P(dissatisfied).", attrs, registry=r
        )
        self.calibrated_dissatisfaction_weighted = Counter(
            "convowatch_calibrated_dissatisfaction_probability_weighted",
            "Sum of P(dissatisfied)/π; divide its rate by convowatch_calibrated_weight_total's for the unbiased rate.",
            attrs,
            registry=r,
        )
        self.calibrated_dissatisfaction_squared_weighted = Counter(
            "convowatch_calibrated_dissatisfaction_probability_squared_weighted",
            "Sum of P(dissatisfied)²/π, for the variance of P across conversations.",
            attrs,
            registry=r,
        )
        # Σ (1-π)/π² · P^k for k = 0, 1, 2: the sampling variance of the rate R expands to (S2 - 2R·S1 + R²·S0) / W².
        self.calibrated_sampling_variance = Counter(
            "convowatch_calibrated_sampling_variance",
            "Sum of (1-π)/π² over calibrated conversations (sampling-variance term S0).",
            attrs,
            registry=r,
        )
        self.calibrated_dissatisfaction_sampling_variance = Counter(
            "convowatch_calibrated_dissatisfaction_probability_sampling_variance",
            "Sum of (1-π)/π² · P(dissatisfied) over calibrated conversations (sampling-variance term S1).",
            attrs,
            registry=r,
        )
        self.calibrated_dissatisfaction_squared_sampling_variance = Counter(
            "convowatch_calibrated_dissatisfaction_probability_squared_sampling_variance",
            "Sum of (1-π)/π² · P(dissatisfied)² over calibrated conversations (sampling-variance term S2).",
            attrs,
            registry=r,
        )
        # ABC-Eval behaviours (scoring.behaviours): a behaviour's rate per assistant turn is hits / turns; the
        # weighted pair (1/π) is the unbiased rate under sampling, the plain pair gives n for Wilson intervals.
        self.behaviour_turns = Counter(
            "convowatch_behaviour_turns", "Assistant turns judged for behaviours (the rates' denominator).", attrs, registry=r
        )
        self.behaviour_hits = Counter(
            "convowatch_behaviour_hits",
            "Assistant turns that show a behaviour; every behaviour of the set has a series, 0 until it is seen.",
            ["behaviour", *attrs],
            registry=r,
        )
        self.behaviour_turns_weight = Counter(
            "convowatch_behaviour_turns_weight", "Sum of 1/π over assistant turns judged for behaviours.", attrs, registry=r
        )
        self.behaviour_hits_weight = Counter(
            "convowatch_behaviour_hits_weight",
            "Sum of 1/π over assistant turns that show a behaviour; divided by convowatch_behaviour_turns_weight_total.",
            ["behaviour", *attrs],
            registry=r,
        )
        # Σ h²/π², Σ h·t/π², Σ t²/π² over conversations (h hits, t turns in one conversation): the variance of a rate
        # R = Σ h/π / Σ t/π is (S_hh - 2R·S_ht + R²·S_tt) / (Σ t/π)², which treats a conversation's turns as one
        # cluster (they are not independent) and includes the sampling error (docs/behaviours.md).
        self.behaviour_turns_squared_variance = Counter(
            "convowatch_behaviour_turns_squared_variance",
            "Sum over conversations of (assistant turns judged / π)² (variance term S_tt).",
            attrs,
            registry=r,
        )
        self.behaviour_hits_turns_variance = Counter(
            "convowatch_behaviour_hits_turns_variance",
            "Sum over conversations of hits · turns / π² (variance term S_ht).",
            ["behaviour", *attrs],
            registry=r,
        )
        self.behaviour_hits_squared_variance = Counter(
            "convowatch_behaviour_hits_squared_variance",
            "Sum over conversations of (hits / π)² (variance term S_hh).",
            ["behaviour", *attrs],
            registry=r,
        )
        self.behaviour_error = Gauge(
            "convowatch_behaviour_error",
            "1 for a behaviour the set marks an error (a significant rise of its rate alerts), 0 otherwise.",
            ["behaviour"],
            registry=r,
        )
        self.netsat = Histogram("convowatch_netsat", "NetSAT of scored conversations.", attrs, buckets=NETSAT_BUCKETS, registry=r)
        self.dimension = Histogram(
            "convowatch_dimension_expected_value",
            "Calibrated expected answer per dimension (question).",
            ["dimension", *attrs],
            buckets=DIMENSION_BUCKETS,
            registry=r,
        )
        self.scoring_latency = Histogram(
            "convowatch_scoring_latency_seconds",
            "Time to score one conversation (judge included).",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.scoring_attempts = Counter(
            "convowatch_scoring_retries", "Scoring attempts that failed and were retried.", ["reason"], registry=r
        )

        # judge
        self.judge_calls = Counter("convowatch_judge_calls", "Judge requests made.", ["judge"], registry=r)
        self.judge_tokens = Counter(
            "convowatch_judge_tokens", "Judge tokens used (kind: prompt, completion, cached_prompt = part of prompt).",
            ["judge", "kind"], registry=r,
        )  # fmt: skip
        self.rubric_questions = Counter(
            "convowatch_rubric_questions",
            "Rubric questions per outcome: asked, or skipped by early stopping.",
            ["outcome"],
            registry=r,
        )
        self.judge_latency = Histogram(
            "convowatch_judge_latency_seconds", "Judge time per conversation.", ["judge"], buckets=LATENCY_BUCKETS, registry=r
        )
        self.judge_errors = Counter("convowatch_judge_errors", "Judge failures, by error type.", ["judge", "error"], registry=r)
        self.judge_cost = Counter(
            "convowatch_judge_cost",
            "Judge cost from judge.price (cached prompt tokens at the cached rate), in currency.",
            ["judge", "currency"],
            registry=r,
        )
        # judge budget (stream/budget.py); series exist for the configured limits only
        self.judge_budget_exhausted = Gauge(
            "convowatch_judge_budget_exhausted",
            "1 while scoring waits because this judge budget limit is spent.",
            ["limit"],
            registry=r,
        )
        self.judge_budget_wait = Counter(
            "convowatch_judge_budget_wait_seconds",
            "Seconds during which scoring waited for this judge budget limit (its rate: the share of time held back).",
            ["limit"],
            registry=r,
        )

        # sink
        self.sink_rows = Counter("convowatch_sink_rows", "Rows written to the store, by table.", ["table"], registry=r)
        self.sink_latency = Histogram(
            "convowatch_sink_latency_seconds", "Time to write one batch to the store.", buckets=LATENCY_BUCKETS, registry=r
        )
        self.sink_errors = Counter("convowatch_sink_errors", "Failed store writes (retried).", registry=r)
        self.end_to_store_latency = Histogram(
            "convowatch_close_to_store_latency_seconds",
            "From a conversation's close to its row in the store.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )

    def attribute_values(self, attributes: Mapping[str, str]) -> tuple[str, ...]:
        return self.attributes.values(attributes)

    def set_consumer_lag(self, lags: Mapping[tuple[str, int], int]) -> None:
        """Lag per assigned (topic, partition); partitions no longer reported (revoked, or no high-water mark
        from the broker) lose their series instead of keeping a stale value."""
        current = {(topic, str(partition)) for topic, partition in lags}
        for topic, partition in self._lag_partitions - current:
            self.consumer_lag.remove(topic, partition)
        for (topic, number), lag in lags.items():
            self.consumer_lag.labels(topic, str(number)).set(max(0, lag))
        self._lag_partitions = current

    def serve(self, host: str, port: int) -> int:
        """Expose ``/metrics`` on ``host:port`` (0 = pick a free port); returns the bound port."""
        server, _thread = start_http_server(port, addr=host, registry=self.registry)
        return int(server.server_address[1])


def metric_names(metrics: ServiceMetrics) -> Iterable[str]:
    """Every sample name this process can export (for tests that check dashboards)."""
    for collector in metrics.registry.collect():
        for sample in collector.samples:
            yield sample.name
