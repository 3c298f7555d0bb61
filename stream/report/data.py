"""The data of `convowatch report`: the Overview and Quality views of a time window, read from ClickHouse.

For people without Grafana. Everything is read through `ClickHouseStore.query`
with the parameterised SQL constants below (user input only ever travels as
query parameters), one score per conversation: the ``latest_scores`` view and
``FINAL`` on the other tables, so re-delivered or re-scored conversations are
counted once. Conversations belong to the window by ``closed_at``
(``since <= closed_at < until``), like the dashboards' time filter.

The time axis runs from the first to the last conversation closed in the
window, so a window much longer than the traffic in it does not squeeze the
traffic into one bar; the bucket is the smallest round size that keeps the
axis within ``max_buckets`` buckets (30-60 for most spans).

`load_report` reads; `stream.report.render.write_report` draws the images (`stream.report.charts`)
and the page (`stream.report.page`); `convowatch report` (stream/commands/cli.py) runs both.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypedDict

from scorers.errors import UserError
from scorers.questions import load_questions
from scorers.rubrics import is_dsat_hit
from stream.records import RubricHit
from stream.report.agreement import UserAgreement, load_user_agreement
from stream.report.behaviours import BehaviourRate, load_behaviour_rates
from stream.report.cost import JudgeCost, load_judge_costs
from stream.sampling import hajek_sampling_variance
from stream.settings import PriceSettings
from stream.store import ClickHouseStore

MAX_BUCKETS = 60
WORST = 20
Z95 = 1.959964  # two-sided 95% normal quantile
HISTOGRAM_BIN_WIDTH = 0.05  # of calibrated expected answers (answer scale 1..K)
DSAT_HITS_SHOWN = 5
WEAKEST_SAT_SHOWN = 3
# Round bucket sizes (seconds), smallest first; past the last one, whole weeks.
ROUND_BUCKETS_S = (
    1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800,
    3600, 7200, 10800, 21600, 43200, 86400, 172800, 604800,
)  # fmt: skip
_WEEK_S = 604800
_UTC = UTC
_EARLIEST = datetime(1970, 1, 1, tzinfo=_UTC)
_LATEST = datetime(2262, 1, 1, tzinfo=_UTC)
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": _WEEK_S}

IMAGES = {
    "overview": "overview.png",
    "breakdown": "breakdown.png",
    "quality": "quality.png",
    "distributions": "quality-distributions.png",
}
PAGE = "index.html"


class ReportError(UserError, ValueError):
    """A report that cannot be made as asked (bad window, unusable output directory, empty store); says why."""


# --- SQL --------------------------------------------------------------------------------------------------

# The conversations in the report: latest score per conversation, closed in the window, optional filters
# (an empty array means no filter). Every query reads its scores from here.
SCOPED_SCORES = """(
    SELECT * FROM latest_scores
    WHERE closed_at >= {since:DateTime64(6, 'UTC')} AND closed_at < {until:DateTime64(6, 'UTC')}
      AND (empty({products:Array(String)}) OR has({products:Array(String)}, product))
      AND (empty({model_versions:Array(String)}) OR has({model_versions:Array(String)}, model_version))
)"""

DATABASE_EXISTS_SQL = "SELECT count() AS n FROM system.databases WHERE name = {database:String}"

EXTENT_SQL = (
    "SELECT count() AS conversations, min(closed_at) AS first_closed, max(closed_at) AS last_closed FROM "
    + SCOPED_SCORES
    + " AS s"
)

# Label counts and the 1/π-weighted sums per time bucket, product and model version (unsampled rows count
# as volume only). The sums add up, so the totals, the per-bucket series and the breakdowns all come from these rows.
COUNTS_SQL = (
    """SELECT
    intDiv(toUnixTimestamp(closed_at), {bucket_s:UInt32}) * {bucket_s:UInt32} AS bucket,
    product,
    model_version,
    count() AS conversations,
    countIf(status = 'scored') AS scored,
    countIf(status = 'unscored') AS unscored,
    countIf(status = 'unsampled') AS unsampled,
    countIf(status = 'scored' AND label = 'sat') AS sat,
    countIf(status = 'scored' AND label = 'dsat') AS dsat,
    countIf(status = 'scored' AND label = 'uncertain') AS uncertain,
    countIf(dissatisfaction_probability IS NOT NULL) AS calibrated,
    sumIf(1 / inclusion_probability, status = 'scored') AS scored_weight,
    sumIf(1 / inclusion_probability, status = 'scored' AND label = 'sat') AS sat_weight,
    sumIf(1 / inclusion_probability, status = 'scored' AND label = 'dsat') AS dsat_weight,
    sumIf(1 / inclusion_probability, status = 'scored' AND label = 'uncertain') AS uncertain_weight,
    sumIf(1 / inclusion_probability, dissatisfaction_probability IS NOT NULL) AS calibrated_weight,
    sum(ifNull(dissatisfaction_probability, 0) / inclusion_probability) AS dsat_probability_sum,
    sum(pow(ifNull(dissatisfaction_probability, 0), 2) / inclusion_probability) AS dsat_probability_sq_sum,
    sumIf((1 - inclusion_probability) / pow(inclusion_probability, 2), dissatisfaction_probability IS NOT NULL) AS sampling_s0,
    sum((1 - inclusion_probability) / pow(inclusion_probability, 2) * ifNull(dissatisfaction_probability, 0)) AS sampling_s1,
    sum((1 - inclusion_probability) / pow(inclusion_probability, 2) * pow(ifNull(dissatisfaction_probability, 0), 2)) AS sampling_s2
FROM """
    + SCOPED_SCORES
    + """ AS s
GROUP BY bucket, product, model_version
ORDER BY bucket, product, model_version"""
)

# The calibrated dimension predictions of the scores in the report (joined on scored_at: exactly the
# rows written with the current score).
_CURRENT_DIMENSIONS = (
    """dimension_predictions AS d FINAL
INNER JOIN (SELECT conversation_id, scorer_version, scored_at FROM """
    + SCOPED_SCORES
    + """ WHERE status = 'scored') AS s
    ON d.conversation_id = s.conversation_id AND d.scorer_version = s.scorer_version AND d.scored_at = s.scored_at"""
)

DIMENSION_SERIES_SQL = (
    """SELECT
    intDiv(toUnixTimestamp(d.closed_at), {bucket_s:UInt32}) * {bucket_s:UInt32} AS bucket,
    d.question_id AS question_id,
    d.model_version AS model_version,
    count() AS n,
    avg(d.expected_value) AS mean,
    quantileExactInclusive(0.1)(d.expected_value) AS p10,
    quantileExactInclusive(0.9)(d.expected_value) AS p90
FROM """
    + _CURRENT_DIMENSIONS
    + """
GROUP BY bucket, question_id, model_version
ORDER BY question_id, model_version, bucket"""
)

DIMENSION_SUMMARY_SQL = (
    """SELECT
    d.question_id AS question_id,
    count() AS n,
    avg(d.expected_value) AS mean,
    quantileExactInclusive(0.1)(d.expected_value) AS p10,
    quantileExactInclusive(0.9)(d.expected_value) AS p90,
    max(length(d.probabilities)) AS n_options
FROM """
    + _CURRENT_DIMENSIONS
    + """
GROUP BY question_id
ORDER BY question_id"""
)

DIMENSION_HISTOGRAM_SQL = (
    """SELECT
    d.question_id AS question_id,
    d.model_version AS model_version,
    floor(d.expected_value / {bin_width:Float64}) AS bin,
    count() AS n
FROM """
    + _CURRENT_DIMENSIONS
    + """
GROUP BY question_id, model_version, bin
ORDER BY question_id, model_version, bin"""
)

WORST_SQL = (
    """SELECT conversation_id, scorer_version, closed_at, product, model_version, label, netsat,
       dissatisfaction_probability, main_expected_value, n_turns
FROM """
    + SCOPED_SCORES
    + """ AS s
WHERE status = 'scored'
ORDER BY dissatisfaction_probability DESC NULLS LAST, netsat ASC NULLS LAST, conversation_id
LIMIT {worst:UInt32}"""
)

# Rubric rows of the current scores of the given conversations, most negative first.
WORST_RUBRICS_SQL = """SELECT r.conversation_id AS conversation_id, r.rubric_id AS rubric_id, r.polarity AS polarity, r.score AS score
FROM rubric_scores AS r FINAL
INNER JOIN (SELECT conversation_id, scorer_version, scored_at FROM latest_scores WHERE conversation_id IN {ids:Array(String)}) AS s
    ON r.conversation_id = s.conversation_id AND r.scorer_version = s.scorer_version AND r.scored_at = s.scored_at
ORDER BY conversation_id, score, rubric_id"""

SCORERS_SQL = (
    """SELECT scorer_version, judge, rubric_set_version, calibrator_version, count() AS conversations
FROM """
    + SCOPED_SCORES
    + """ AS s
GROUP BY scorer_version, judge, rubric_set_version, calibrator_version
ORDER BY conversations DESC, scorer_version"""
)


# --- the window ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Window:
    """``since <= closed_at < until``, both UTC."""

    since: datetime
    until: datetime


def parse_time(text: str, option: str = "time") -> timedelta | datetime:
    """A duration back from now (``30m``, ``6h``, ``7d``, ``2w``, ``90s``) or an ISO 8601 time (naive = UTC)."""
    m = _DURATION.match(text)
    if m:
        seconds = float(m.group(1)) * _UNIT_S[m.group(2)]
        if seconds <= 0:
            raise ReportError(f"{option} {text!r}: a duration must be positive")
        try:
            return timedelta(seconds=seconds)
        except OverflowError:
            raise ReportError(f"{option} {text!r}: duration too long") from None
    try:
        t = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ReportError(
            f"{option} {text!r} is neither a duration back from now (30m, 6h, 7d, 2w) "
            "nor an ISO 8601 time (2024-02-09, 2024-02-09T12:00:00Z)"
        ) from None
    return (t.replace(tzinfo=_UTC) if t.tzinfo is None else t).astimezone(_UTC)


def resolve_window(since: str, until: str | None = None, now: datetime | None = None) -> Window:
    """The window ``--since``/``--until`` name (``until`` defaults to now); durations count back from ``now``."""
    now = (now or datetime.now(_UTC)).astimezone(_UTC)
    bounds = []
    for option, text in (("--since", since), ("--until", until)):
        spec = parse_time(text, option) if text is not None else now
        try:
            t = now - spec if isinstance(spec, timedelta) else spec
        except OverflowError:
            raise ReportError(f"{option} {text!r} reaches before year 1") from None
        if not _EARLIEST <= t <= _LATEST:
            raise ReportError(f"{option} {text!r} ({t.isoformat()}) is outside 1970-01-01 .. 2262-01-01")
        bounds.append(t)
    window = Window(*bounds)
    if window.since >= window.until:
        raise ReportError(
            f"--since {since!r} ({_iso(window.since)}) is not before --until {until or 'now'!r} ({_iso(window.until)})"
        )
    return window


def bucket_seconds(span_s: float, max_buckets: int = MAX_BUCKETS) -> int:
    """The smallest round bucket size that covers ``span_s`` seconds in at most ``max_buckets`` buckets."""
    if max_buckets < 2:
        raise ReportError(f"max_buckets {max_buckets} must be at least 2")
    # Epoch-aligned buckets over a span of S seconds number at most S / b + 1.
    for b in ROUND_BUCKETS_S:
        if span_s <= b * (max_buckets - 1):
            return b
    return _WEEK_S * math.ceil(span_s / (_WEEK_S * (max_buckets - 1)))


def describe_seconds(seconds: int) -> str:
    """``90`` -> ``"90 s"``, ``3600`` -> ``"1 hour"``, ``172800`` -> ``"2 days"``."""
    for unit_s, name in ((_WEEK_S, "week"), (86400, "day"), (3600, "hour"), (60, "minute")):
        if seconds % unit_s == 0:
            n = seconds // unit_s
            return f"{n} {name}{'s' if n != 1 else ''}"
    return f"{seconds} s"


# --- the data --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Counts:
    """Label counts of a set of conversations, and the 1/π-weighted sums its rates come from.

    Counts (``scored``, ``sat``, ...) are conversations as stored: judge work, and volume with
    ``unsampled`` (counted, not judged). Shares and rates weight each scored conversation by 1/π, its
    inclusion probability, so sampling does not bias them (docs/sampling.md); with π = 1 the weights are
    the counts.
    """

    conversations: int = 0
    scored: int = 0
    unscored: int = 0
    unsampled: int = 0  # left out by sampling: volume only
    sat: int = 0
    dsat: int = 0
    uncertain: int = 0
    calibrated: int = 0  # scored with a calibrator (have a P(dissatisfied))
    scored_weight: float = 0.0  # Σ 1/π over the scored
    sat_weight: float = 0.0
    dsat_weight: float = 0.0
    uncertain_weight: float = 0.0
    calibrated_weight: float = 0.0  # Σ 1/π over the calibrated
    dsat_probability_sum: float = 0.0  # Σ P/π
    dsat_probability_sq_sum: float = 0.0  # Σ P²/π, for the spread of P(dissatisfied) across conversations
    sampling_s0: float = 0.0  # Σ (1-π)/π² · P^k over the calibrated (k = 0, 1, 2): the rate's sampling variance
    sampling_s1: float = 0.0
    sampling_s2: float = 0.0

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Counts:
        values: dict[str, Any] = {f.name: (int if f.type == "int" else float)(row[f.name]) for f in fields(cls)}
        return cls(**values)

    def __add__(self, other: Counts) -> Counts:
        return Counts(**{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)})

    def share(self, label: str) -> float | None:
        """Weighted share of the scored conversations labelled ``label`` (sat, dsat, uncertain)."""
        return getattr(self, f"{label}_weight") / self.scored_weight if self.scored_weight else None

    @property
    def yield_rate(self) -> float | None:
        """Weighted share of the scored conversations with a confident label (not uncertain)."""
        return (self.sat_weight + self.dsat_weight) / self.scored_weight if self.scored_weight else None

    @property
    def calibrated_dsat_rate(self) -> float | None:
        """Weighted mean calibrated P(dissatisfied): the estimated share a human judge would call dissatisfied."""
        return self.dsat_probability_sum / self.calibrated_weight if self.calibrated_weight else None

    @property
    def calibrated_dsat_interval(self) -> tuple[float, float] | None:
        """95% interval of the calibrated rate, p ± 1.96·sqrt(var(P)/n + sampling variance), clipped to [0, 1].

        The standard error of a mean of n = Σ 1/π probabilities plus the sampling error, as on the dashboards
        (dashboards/promql.py): var(P) = mean(P²) - p² is at most p(1 - p), reached only when every P is 0 or 1.
        """
        p = self.calibrated_dsat_rate
        if p is None:
            return None
        variance = max(self.dsat_probability_sq_sum / self.calibrated_weight - p * p, 0.0)
        sampling = hajek_sampling_variance(p, self.calibrated_weight, self.sampling_s0, self.sampling_s1, self.sampling_s2)
        half = Z95 * math.sqrt(variance / self.calibrated_weight + sampling)
        return max(0.0, p - half), min(1.0, p + half)


def total(counts: Iterable[Counts]) -> Counts:
    out = Counts()
    for c in counts:
        out = out + c
    return out


@dataclass(frozen=True)
class GroupCounts:
    """Counts of one time bucket, product and model version."""

    bucket: datetime
    product: str
    model_version: str
    counts: Counts


@dataclass(frozen=True)
class DimensionPoint:
    """One calibrated dimension in one bucket for one model version: mean and p10/p90 of the expected answers."""

    bucket: datetime
    question_id: str
    model_version: str
    n: int
    mean: float
    p10: float
    p90: float


@dataclass(frozen=True)
class DimensionSummary:
    """One calibrated dimension over the whole report."""

    question_id: str
    n: int
    mean: float
    p10: float
    p90: float
    n_options: int


@dataclass(frozen=True)
class HistogramBin:
    """Conversations of one model version whose expected answer to a question is in [lower, lower + width)."""

    question_id: str
    model_version: str
    lower: float
    n: int


@dataclass(frozen=True)
class WorstRow:
    """A conversation with a high calibrated P(dissatisfied) / low NetSAT, with its rubric contributions."""

    conversation_id: str
    scorer_version: str
    closed_at: datetime
    product: str
    model_version: str
    label: str
    netsat: float | None
    dissatisfaction_probability: float | None
    main_expected_value: float | None
    n_turns: int
    dsat_hits: tuple[RubricHit, ...]  # DSAT rubric hits (rated >= DSAT_HIT_RATING), strongest first
    weakest_sat: tuple[RubricHit, ...]  # SAT rubrics with the lowest scores


@dataclass(frozen=True)
class ScorerRow:
    scorer_version: str
    judge: str
    rubric_set_version: str
    calibrator_version: str
    conversations: int


@dataclass(frozen=True)
class ReportData:
    """Everything the images and the page show, read from the store."""

    window: Window
    product: str | None
    model_version: str | None
    source: str  # the store, for the page (password redacted)
    generated_at: datetime
    first_closed: datetime | None
    last_closed: datetime | None
    bucket_s: int
    groups: tuple[GroupCounts, ...] = ()
    dimension_series: tuple[DimensionPoint, ...] = ()
    dimensions: tuple[DimensionSummary, ...] = ()
    histogram: tuple[HistogramBin, ...] = ()
    histogram_bin_width: float = HISTOGRAM_BIN_WIDTH
    worst: tuple[WorstRow, ...] = ()
    scorers: tuple[ScorerRow, ...] = ()
    dimension_names: Mapping[str, str] = field(default_factory=dict)
    judge_costs: tuple[JudgeCost, ...] = ()
    behaviour_rates: tuple[BehaviourRate, ...] = ()
    user_agreement: tuple[UserAgreement, ...] = ()
    price: PriceSettings | None = None  # judge.price: the cost columns of the judge cost table

    @property
    def totals(self) -> Counts:
        return total(g.counts for g in self.groups)

    @property
    def empty(self) -> bool:
        return self.totals.conversations == 0

    def buckets(self) -> list[tuple[datetime, Counts]]:
        """Every bucket from the first to the last conversation (empty ones too), with its counts."""
        if self.first_closed is None or self.last_closed is None:
            return []
        by_bucket: dict[datetime, Counts] = {}
        for g in self.groups:
            by_bucket[g.bucket] = by_bucket.get(g.bucket, Counts()) + g.counts
        start = _floor(self.first_closed, self.bucket_s)
        n = int((_floor(self.last_closed, self.bucket_s) - start).total_seconds()) // self.bucket_s + 1
        steps = [start + timedelta(seconds=i * self.bucket_s) for i in range(n)]
        return [(t, by_bucket.get(t, Counts())) for t in steps]

    def by(self, attribute: str) -> list[tuple[str, Counts]]:
        """Counts per value of ``product`` or ``model_version``, the busiest first."""
        out: dict[str, Counts] = {}
        for g in self.groups:
            key = getattr(g, attribute)
            out[key] = out.get(key, Counts()) + g.counts
        return sorted(out.items(), key=lambda kv: (-kv[1].conversations, kv[0]))

    def series_by_model_version(self) -> dict[str, list[tuple[datetime, Counts]]]:
        """Per model version (busiest first), its counts per bucket (every bucket of the axis)."""
        axis = [t for t, _ in self.buckets()]
        per: dict[str, dict[datetime, Counts]] = {}
        for g in self.groups:
            cell = per.setdefault(g.model_version, {})
            cell[g.bucket] = cell.get(g.bucket, Counts()) + g.counts
        return {mv: [(t, per[mv].get(t, Counts())) for t in axis] for mv, _ in self.by("model_version")}

    def dimension_label(self, question_id: str) -> str:
        name = self.dimension_names.get(question_id, "")
        return f"{question_id} · {name}" if name else question_id


def question_names(path: str | Path) -> dict[str, str]:
    """``question id -> short name`` from a questions file (LLM-Rubric's ``questions.json`` has ``name``; else '')."""
    questions = load_questions(path)  # validates the file (QuestionError names the problem)
    raw = json.loads(Path(path).read_text(encoding="utf-8"))["questions"]
    return {qid: str(raw[qid].get("name") or "") for qid in questions}


class _ReportBase(TypedDict):
    """The `ReportData` fields that do not depend on what the store holds."""

    window: Window
    product: str | None
    model_version: str | None
    source: str
    generated_at: datetime
    dimension_names: Mapping[str, str]
    price: PriceSettings | None


def load_report(
    store: ClickHouseStore,
    window: Window,
    product: str | None = None,
    model_version: str | None = None,
    *,
    max_buckets: int = MAX_BUCKETS,
    worst: int = WORST,
    dimension_names: Mapping[str, str] | None = None,
    price: PriceSettings | None = None,
) -> ReportData:
    """Read the report's numbers for the conversations closed in ``window`` (optionally one product / model version)."""
    if not store.query(DATABASE_EXISTS_SQL, {"database": store.database})[0]["n"]:
        raise ReportError(
            f"the store {store.dsn} has no database {store.database!r}: nothing has been stored there yet "
            "(is this the DSN the sink writes to?)"
        )
    scope = {
        "since": window.since,
        "until": window.until,
        "products": [] if product is None else [product],
        "model_versions": [] if model_version is None else [model_version],
    }
    extent = store.query(EXTENT_SQL, scope)[0]
    base = _ReportBase(
        window=window, product=product, model_version=model_version, source=f"{store.dsn} (database {store.database})",
        generated_at=datetime.now(_UTC), dimension_names=dict(dimension_names or {}), price=price,
    )  # fmt: skip
    if not extent["conversations"]:
        return ReportData(first_closed=None, last_closed=None, bucket_s=bucket_seconds(0, max_buckets), **base)
    first, last = _utc(extent["first_closed"]), _utc(extent["last_closed"])
    bucket_s = bucket_seconds((last - _floor(first, 1)).total_seconds(), max_buckets)
    binned = {**scope, "bucket_s": bucket_s}
    groups = tuple(
        GroupCounts(_from_epoch(r["bucket"]), r["product"], r["model_version"], Counts.from_row(r))
        for r in store.query(COUNTS_SQL, binned)
    )
    series = tuple(
        DimensionPoint(_from_epoch(r["bucket"]), r["question_id"], r["model_version"], int(r["n"]), r["mean"], r["p10"], r["p90"])
        for r in store.query(DIMENSION_SERIES_SQL, binned)
    )
    dimensions = tuple(
        DimensionSummary(r["question_id"], int(r["n"]), r["mean"], r["p10"], r["p90"], int(r["n_options"]))
        for r in store.query(DIMENSION_SUMMARY_SQL, scope)
    )
    histogram = tuple(
        HistogramBin(r["question_id"], r["model_version"], round(r["bin"] * HISTOGRAM_BIN_WIDTH, 10), int(r["n"]))
        for r in store.query(DIMENSION_HISTOGRAM_SQL, {**scope, "bin_width": HISTOGRAM_BIN_WIDTH})
    )
    scorers = tuple(
        ScorerRow(r["scorer_version"], r["judge"], r["rubric_set_version"], r["calibrator_version"], int(r["conversations"]))
        for r in store.query(SCORERS_SQL, scope)
    )
    return ReportData(
        first_closed=first, last_closed=last, bucket_s=bucket_s, groups=groups, dimension_series=series,
        dimensions=dimensions, histogram=histogram, worst=_worst(store, scope, worst), scorers=scorers,
        judge_costs=load_judge_costs(store, SCOPED_SCORES, scope),
        behaviour_rates=load_behaviour_rates(store, SCOPED_SCORES, scope),
        user_agreement=load_user_agreement(store, SCOPED_SCORES, scope), **base,
    )  # fmt: skip


def _worst(store: ClickHouseStore, scope: Mapping[str, Any], n: int) -> tuple[WorstRow, ...]:
    rows = store.query(WORST_SQL, {**scope, "worst": n}) if n > 0 else []
    rubrics: dict[str, list[RubricHit]] = {}
    if rows:
        for r in store.query(WORST_RUBRICS_SQL, {"ids": [w["conversation_id"] for w in rows]}):
            rubrics.setdefault(r["conversation_id"], []).append(RubricHit(r["rubric_id"], r["polarity"], r["score"]))
    out = []
    for w in rows:
        hits = rubrics.get(w["conversation_id"], [])  # most negative first
        out.append(
            WorstRow(
                conversation_id=w["conversation_id"], scorer_version=w["scorer_version"], closed_at=_utc(w["closed_at"]),
                product=w["product"], model_version=w["model_version"], label=w["label"], netsat=w["netsat"],
                dissatisfaction_probability=w["dissatisfaction_probability"], main_expected_value=w["main_expected_value"],
                n_turns=int(w["n_turns"]),
                dsat_hits=tuple(h for h in hits if is_dsat_hit(h.polarity, h.score))[:DSAT_HITS_SHOWN],
                weakest_sat=tuple(h for h in hits if h.polarity == "sat")[:WEAKEST_SAT_SHOWN],
            )
        )  # fmt: skip
    return tuple(out)


# --- writing ---------------------------------------------------------------------------------------------


# --- time helpers ----------------------------------------------------------------------------------------


def _utc(t: datetime) -> datetime:
    return t.replace(tzinfo=_UTC) if t.tzinfo is None else t.astimezone(_UTC)


def _from_epoch(seconds: int) -> datetime:
    return datetime.fromtimestamp(int(seconds), tz=_UTC)


def _floor(t: datetime, bucket_s: int) -> datetime:
    """The start of ``t``'s bucket (buckets are aligned to the epoch, as in the SQL)."""
    return _from_epoch(int(t.timestamp()) // bucket_s * bucket_s)


def _iso(t: datetime) -> str:
    return t.astimezone(_UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
