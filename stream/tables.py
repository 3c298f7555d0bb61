"""The ClickHouse tables: each column once, with its type and where its value comes from.

A `Table` lists the columns the sink inserts, each with its ClickHouse type and a function
that reads the value from a record; the insert's column names and every row are built from
that list, and the type says how a value is converted (epoch seconds to DateTime64 ticks, a
tuple to an array). `MIGRATIONS` is the history that creates the tables on a server; it is
append-only, so it cannot be generated from the declarations, and a test checks that a
freshly migrated database has exactly the declared columns and types.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any, Generic, TypeVar

from stream.records import SHADOW, BehaviourHit, DimensionPrediction, FeedbackRow, RatingRow, RubricHit, ScoreRecord

T = TypeVar("T")

TIMESTAMP = "DateTime64(6, 'UTC')"
LOW_CARDINALITY = "LowCardinality(String)"
_TURNS = f"Array(Tuple(index UInt32, role {LOW_CARDINALITY}, text String, timestamp {TIMESTAMP}))"


@dataclass(frozen=True)
class Column(Generic[T]):
    """One inserted column: its name, its ClickHouse type, and how to read its value from a ``T``."""

    name: str
    type: str
    read: Callable[[T], Any]

    def value(self, item: T) -> Any:
        return _to_clickhouse(self.type, self.read(item))


@dataclass(frozen=True)
class Table(Generic[T]):
    """A table the sink inserts ``T`` rows into; ``server_columns`` are filled by ClickHouse (DEFAULT, MATERIALIZED)."""

    name: str
    columns: tuple[Column[T], ...]
    server_columns: tuple[str, ...] = ()

    @property
    def column_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    def row(self, item: T) -> list[Any]:
        return [c.value(item) for c in self.columns]


def _to_clickhouse(column_type: str, value: Any) -> Any:
    """What clickhouse-connect inserts for ``value`` in a column of ``column_type``."""
    if value is None:
        return None
    if column_type == TIMESTAMP:
        return _ticks(value)
    if column_type in ("Float64", "Nullable(Float64)"):
        return float(value)
    if column_type == "Array(Float64)":
        return [float(x) for x in value]
    if column_type.startswith("Array("):
        return list(value)
    return value


def _ticks(t: float) -> int:
    """Epoch seconds as DateTime64(6) ticks (clickhouse-connect writes ints as raw ticks)."""
    return round(t * 1_000_000)


def _field(name: str, column_type: str) -> Column[Any]:
    """A column holding the record's field of the same name."""
    return Column(name, column_type, attrgetter(name))


# Rows of the score tables are built from a ScoreRecord (and, for the per-question and per-rubric
# tables, one of its parts); the conversation's own columns are read through `.conversation`.
Scored = tuple[ScoreRecord, T]


def _attribute(name: str) -> Callable[[ScoreRecord], str]:
    return lambda r: r.conversation.attributes.get(name, "")


def _conversation(name: str, column_type: str) -> Column[ScoreRecord]:
    return Column(name, column_type, lambda r: getattr(r.conversation, name))


def _of_record(column: Column[ScoreRecord]) -> Column[Scored[Any]]:
    """The same column in a table whose rows are (record, part) pairs."""
    return Column(column.name, column.type, lambda pair: column.read(pair[0]))


def _of_part(name: str, column_type: str) -> Column[Scored[Any]]:
    return Column(name, column_type, lambda pair: getattr(pair[1], name))


_ID = _field("conversation_id", "String")
_SCORER_VERSION = _field("scorer_version", LOW_CARDINALITY)
_PRODUCT = Column[ScoreRecord]("product", LOW_CARDINALITY, _attribute("product"))
_MODEL_VERSION = Column[ScoreRecord]("model_version", LOW_CARDINALITY, _attribute("model_version"))
_CLOSED_AT = _conversation("closed_at", TIMESTAMP)
_SCORED_AT = _field("scored_at", TIMESTAMP)
_N_TURNS = Column[ScoreRecord]("n_turns", "UInt32", lambda r: len(r.conversation.turns))
_ATTRIBUTES = _conversation("attributes", "Map(String, String)")
_INCLUSION_PROBABILITY = _field("inclusion_probability", "Float64")

CONVERSATIONS = Table[ScoreRecord](
    "conversations",
    (
        _ID,
        _CLOSED_AT,
        _conversation("close_cause", LOW_CARDINALITY),
        _conversation("first_event_at", TIMESTAMP),
        _conversation("last_event_at", TIMESTAMP),
        _N_TURNS,
        _conversation("missing_turn_indices", "Array(UInt32)"),
        _ATTRIBUTES,
        _PRODUCT,
        _MODEL_VERSION,
        Column("content_hash", "String", lambda r: r.conversation.content_hash()),
        Column("turns", _TURNS, lambda r: [(t.index, t.role, t.text, _ticks(t.timestamp)) for t in r.conversation.turns]),
    ),
)

SCORES = Table[ScoreRecord](
    "conversation_scores",
    (
        _ID,
        _SCORER_VERSION,
        _field("status", LOW_CARDINALITY),
        _field("unscored_reason", "String"),
        _field("judge", LOW_CARDINALITY),
        _field("rubric_set_version", LOW_CARDINALITY),
        _field("calibrator_version", LOW_CARDINALITY),
        _SCORED_AT,
        _CLOSED_AT,
        _field("attempts", "UInt32"),
        _field("netsat", "Nullable(Float64)"),
        _field("netsat_lower", "Nullable(Float64)"),
        _field("netsat_upper", "Nullable(Float64)"),
        _field("rubrics_unasked", "Array(String)"),
        _field("label", LOW_CARDINALITY),
        _field("threshold_label", LOW_CARDINALITY),
        _field("main_question_id", LOW_CARDINALITY),
        _field("main_probabilities", "Array(Float64)"),
        _field("main_expected_value", "Nullable(Float64)"),
        _field("dissatisfaction_probability", "Nullable(Float64)"),
        _PRODUCT,
        _MODEL_VERSION,
        _ATTRIBUTES,
        _N_TURNS,
        _field("judge_calls", "UInt32"),
        _field("judge_prompt_tokens", "UInt64"),
        _field("judge_completion_tokens", "UInt64"),
        _field("judge_cached_prompt_tokens", "UInt64"),
        _field("judge_latency_s", "Float64"),
        _INCLUSION_PROBABILITY,
        _field("sampling_reason", LOW_CARDINALITY),
        _field("behaviour_set_version", LOW_CARDINALITY),
        _field("scorer_name", LOW_CARDINALITY),
        _field("injection_signals", f"Array({LOW_CARDINALITY})"),
        Column("extra", "String", lambda r: json.dumps(r.extra, sort_keys=True, ensure_ascii=False)),
    ),
    server_columns=("stored_at", "version"),
)

# A shadow version's scores (stream/rollout.py): the columns of conversation_scores, in a table of their own so
# that everything reading conversation_scores (latest_scores, the report, the dashboards) sees the active version only.
SHADOW_SCORES = Table[ScoreRecord]("shadow_scores", SCORES.columns, SCORES.server_columns)

_PER_PART_TAIL = tuple(_of_record(c) for c in (_PRODUCT, _MODEL_VERSION, _CLOSED_AT, _SCORED_AT))

DIMENSIONS = Table[Scored[DimensionPrediction]](
    "dimension_predictions",
    (
        _of_record(_ID),
        _of_record(_SCORER_VERSION),
        _of_part("question_id", LOW_CARDINALITY),
        _of_part("probabilities", "Array(Float64)"),
        _of_part("expected_value", "Float64"),
        *_PER_PART_TAIL,
    ),
)

RUBRICS = Table[Scored[RubricHit]](
    "rubric_scores",
    (
        _of_record(_ID),
        _of_record(_SCORER_VERSION),
        _of_part("rubric_id", LOW_CARDINALITY),
        _of_part("polarity", LOW_CARDINALITY),
        _of_part("score", "Float64"),
        *_PER_PART_TAIL,
    ),
)

BEHAVIOURS = Table[Scored[BehaviourHit]](
    "behaviour_turns",
    (
        _of_record(_ID),
        _of_record(_SCORER_VERSION),
        _of_part("turn_index", "UInt32"),
        _of_part("behaviour_id", LOW_CARDINALITY),
        _of_part("probability", "Float64"),
        _of_part("hit", "Bool"),
        _of_record(_INCLUSION_PROBABILITY),
        *_PER_PART_TAIL,
    ),
)

# The attribute columns of a user's feedback or rating row, read from the event's attributes.
_EVENT_ATTRIBUTES: tuple[Column[Any], ...] = (
    Column("attributes", "Map(String, String)", lambda f: {str(k): str(v) for k, v in f.attributes.items()}),
    Column("product", LOW_CARDINALITY, lambda f: str(f.attributes.get("product", ""))),
    Column("model_version", LOW_CARDINALITY, lambda f: str(f.attributes.get("model_version", ""))),
)

FEEDBACK = Table[FeedbackRow](
    "feedback",
    (
        _field("conversation_id", "String"),
        _field("turn_index", "Int32"),
        _field("timestamp", TIMESTAMP),
        _field("rating", LOW_CARDINALITY),
        _field("comment", "String"),
        *_EVENT_ATTRIBUTES,
        _field("received_at", TIMESTAMP),
    ),
)

CONVERSATION_RATINGS = Table[RatingRow](
    "conversation_ratings",
    (
        _field("conversation_id", "String"),
        _field("score", "UInt8"),
        _field("scale", "UInt8"),
        _field("comment", "String"),
        _field("timestamp", TIMESTAMP),
        *_EVENT_ATTRIBUTES,
        _field("received_at", TIMESTAMP),
    ),
)

TABLES: tuple[Table[Any], ...] = (
    CONVERSATIONS,
    SCORES,
    SHADOW_SCORES,
    DIMENSIONS,
    RUBRICS,
    BEHAVIOURS,
    FEEDBACK,
    CONVERSATION_RATINGS,
)


def score_rows(records: Sequence[ScoreRecord]) -> Iterator[tuple[Table[Any], list[list[Any]]]]:
    """Each score table with the rows ``records`` write to it (dimension, rubric and behaviour rows only for their
    parts); a shadow version's records write one ``shadow_scores`` row each and nothing else."""
    shadows = [r for r in records if r.role == SHADOW]
    if shadows:
        yield SHADOW_SCORES, [SHADOW_SCORES.row(r) for r in shadows]
        records = [r for r in records if r.role != SHADOW]
    yield CONVERSATIONS, [CONVERSATIONS.row(r) for r in records]
    yield SCORES, [SCORES.row(r) for r in records]
    yield DIMENSIONS, [DIMENSIONS.row((r, d)) for r in records for d in r.dimensions]
    yield RUBRICS, [RUBRICS.row((r, h)) for r in records for h in r.rubrics]
    yield BEHAVIOURS, [BEHAVIOURS.row((r, b)) for r in records for b in r.behaviours]


# --- migrations: the history that creates these tables ------------------------------------------

_TS, _LC = TIMESTAMP, LOW_CARDINALITY

# conversation_scores' version: a scored row beats an unscored one whatever their times (a later
# failed re-score must not hide a good score, nor orphan its dimension/rubric rows); among rows of
# the same status the later scored_at wins.
SCORED_BIT = 1 << 62
_SCORE_VERSION = f"bitOr(toUInt64(status = 'scored') * {SCORED_BIT}, toUInt64(toUnixTimestamp64Micro(scored_at)))"

# Each conversation's newest score row (any scorer version); recreated by migrations that add score columns.
_LATEST_SCORES_VIEW = """{db}.latest_scores AS
                SELECT * FROM {db}.conversation_scores FINAL
                ORDER BY conversation_id, version DESC
                LIMIT 1 BY conversation_id"""

MIGRATIONS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "0001_initial",
        (
            f"""CREATE TABLE IF NOT EXISTS {{db}}.conversations (
                conversation_id String,
                closed_at {_TS},
                close_cause {_LC},
                first_event_at {_TS},
                last_event_at {_TS},
                n_turns UInt32,
                missing_turn_indices Array(UInt32),
                attributes Map(String, String),
                product {_LC},
                model_version {_LC},
                content_hash String,
                turns {_TURNS}
            ) ENGINE = ReplacingMergeTree(closed_at) ORDER BY conversation_id""",
            f"""CREATE TABLE IF NOT EXISTS {{db}}.conversation_scores (
                conversation_id String,
                scorer_version {_LC},
                status {_LC},
                unscored_reason String,
                judge {_LC},
                rubric_set_version {_LC},
                calibrator_version {_LC},
                scored_at {_TS},
                closed_at {_TS},
                attempts UInt32,
                netsat Nullable(Float64),
                label {_LC},
                threshold_label {_LC},
                main_question_id {_LC},
                main_probabilities Array(Float64),
                main_expected_value Nullable(Float64),
                dissatisfaction_probability Nullable(Float64),
                product {_LC},
                model_version {_LC},
                attributes Map(String, String),
                n_turns UInt32,
                judge_calls UInt32,
                judge_prompt_tokens UInt64,
                judge_completion_tokens UInt64,
                judge_latency_s Float64,
                extra String,
                stored_at {_TS} DEFAULT now64(6),
                version UInt64 MATERIALIZED {_SCORE_VERSION}
            ) ENGINE = ReplacingMergeTree(version) ORDER BY (conversation_id, scorer_version)""",
            f"""CREATE TABLE IF NOT EXISTS {{db}}.dimension_predictions (
                conversation_id String,
                scorer_version {_LC},
                question_id {_LC},
                probabilities Array(Float64),
                expected_value Float64,
                product {_LC},
                model_version {_LC},
                closed_at {_TS},
                scored_at {_TS}
            ) ENGINE = ReplacingMergeTree(scored_at) ORDER BY (conversation_id, scorer_version, question_id)""",
            f"""CREATE TABLE IF NOT EXISTS {{db}}.rubric_scores (
                conversation_id String,
                scorer_version {_LC},
                rubric_id {_LC},
                polarity {_LC},
                score Float64,
                product {_LC},
                model_version {_LC},
                closed_at {_TS},
                scored_at {_TS}
            ) ENGINE = ReplacingMergeTree(scored_at) ORDER BY (conversation_id, scorer_version, rubric_id)""",
            f"""CREATE TABLE IF NOT EXISTS {{db}}.feedback (
                conversation_id String,
                turn_index Int32,
                timestamp {_TS},
                rating {_LC},
                comment String,
                attributes Map(String, String),
                product {_LC},
                model_version {_LC},
                received_at {_TS}
            ) ENGINE = ReplacingMergeTree(received_at) ORDER BY (conversation_id, turn_index, timestamp)""",
            "CREATE VIEW IF NOT EXISTS " + _LATEST_SCORES_VIEW,
        ),
    ),
    (
        "0002_judge_cost",
        (
            """ALTER TABLE {db}.conversation_scores
                ADD COLUMN IF NOT EXISTS netsat_lower Nullable(Float64) AFTER netsat,
                ADD COLUMN IF NOT EXISTS netsat_upper Nullable(Float64) AFTER netsat_lower,
                ADD COLUMN IF NOT EXISTS rubrics_unasked Array(String) AFTER netsat_upper,
                ADD COLUMN IF NOT EXISTS judge_cached_prompt_tokens UInt64 AFTER judge_completion_tokens""",
            "CREATE OR REPLACE VIEW " + _LATEST_SCORES_VIEW,  # the view's * was expanded when it was created
        ),
    ),
    (
        "0003_sampling",
        (
            # Rows written before sampling were all judged: π = 1. Status 'unsampled' needs no DDL (a String).
            f"""ALTER TABLE {{db}}.conversation_scores
                ADD COLUMN IF NOT EXISTS inclusion_probability Float64 DEFAULT 1 AFTER judge_latency_s,
                ADD COLUMN IF NOT EXISTS sampling_reason {_LC} AFTER inclusion_probability""",
            "CREATE OR REPLACE VIEW " + _LATEST_SCORES_VIEW,
        ),
    ),
    (
        "0004_behaviours",
        (
            f"""ALTER TABLE {{db}}.conversation_scores
                ADD COLUMN IF NOT EXISTS behaviour_set_version {_LC} AFTER sampling_reason""",
            f"""CREATE TABLE IF NOT EXISTS {{db}}.behaviour_turns (
                conversation_id String,
                scorer_version {_LC},
                turn_index UInt32,
                behaviour_id {_LC},
                probability Float64,
                hit Bool,
                inclusion_probability Float64,
                product {_LC},
                model_version {_LC},
                closed_at {_TS},
                scored_at {_TS}
            ) ENGINE = ReplacingMergeTree(scored_at) ORDER BY (conversation_id, scorer_version, turn_index, behaviour_id)""",
            "CREATE OR REPLACE VIEW " + _LATEST_SCORES_VIEW,
        ),
    ),
    (
        "0005_scorer_rollout",
        (
            f"""ALTER TABLE {{db}}.conversation_scores
                ADD COLUMN IF NOT EXISTS scorer_name {_LC} AFTER behaviour_set_version""",
            "CREATE OR REPLACE VIEW " + _LATEST_SCORES_VIEW,
            # The same columns and engine; a later migration adding a score column adds it to both tables.
            "CREATE TABLE IF NOT EXISTS {db}.shadow_scores AS {db}.conversation_scores",
        ),
    ),
    (
        "0006_conversation_ratings",
        (
            f"""CREATE TABLE IF NOT EXISTS {{db}}.conversation_ratings (
                conversation_id String,
                score UInt8,
                scale UInt8,
                comment String,
                timestamp {_TS},
                attributes Map(String, String),
                product {_LC},
                model_version {_LC},
                received_at {_TS}
            ) ENGINE = ReplacingMergeTree(received_at) ORDER BY (conversation_id, timestamp)""",
        ),
    ),
    (
        "0007_injection_signals",
        (
            *(
                f"""ALTER TABLE {{db}}.{table}
                ADD COLUMN IF NOT EXISTS injection_signals Array({_LC}) AFTER scorer_name"""
                for table in ("conversation_scores", "shadow_scores")
            ),
            "CREATE OR REPLACE VIEW " + _LATEST_SCORES_VIEW,
        ),
    ),
)

MIGRATIONS_TABLE = f"""CREATE TABLE IF NOT EXISTS {{db}}.schema_migrations (
    id String,
    applied_at {_TS} DEFAULT now64(6)
) ENGINE = ReplacingMergeTree(applied_at) ORDER BY id"""
