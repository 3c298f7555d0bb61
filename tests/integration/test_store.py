"""The ClickHouse store against the real chDB engine (one engine for the session, a database per test)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from unittest import mock

import pytest

from stream.records import (
    BehaviourHit,
    ClosedConversation,
    DimensionPrediction,
    FeedbackRow,
    RatingRow,
    RecordError,
    RubricHit,
    ScoreRecord,
    TurnRecord,
)
from stream.report.summary import summarize
from stream.store import ClickHouseStore, StoreError, _chdb_dir
from stream.tables import MIGRATIONS, SCORES, SHADOW_SCORES
from stream.tables import TABLES as DECLARED_TABLES
from tests.chdb_fixture import chdb_dsn, chdb_store, store_factory  # noqa: F401

REPO = Path(__file__).resolve().parents[2]
T0 = 1_707_480_000.0  # 2024-02-09 12:00 UTC
TABLES = [
    "behaviour_turns",
    "conversation_ratings",
    "conversation_scores",
    "conversations",
    "dimension_predictions",
    "feedback",
    "latest_scores",
    "rubric_scores",
    "schema_migrations",
    "shadow_scores",
]


def utc(t: float) -> datetime:
    return datetime.fromtimestamp(t, tz=UTC)


def closed(
    cid: str, attributes: dict[str, str] | None = None, n_turns: int = 2, closed_at: float = T0 + 60
) -> ClosedConversation:
    turns = tuple(TurnRecord(i, ("user", "assistant")[i % 2], f"{cid} turn {i}", T0 + i + 0.25) for i in range(n_turns))
    return ClosedConversation(
        conversation_id=cid,
        turns=turns,
        attributes=dict(attributes or {}),
        close_cause="end",
        closed_at=closed_at,
        first_event_at=T0,
        last_event_at=T0 + n_turns,
    )


def scored(
    cid: str,
    label: str,
    netsat: float,
    p_dsat: float | None,
    ev: float | None,
    *,
    attributes: dict[str, str] | None = None,
    scorer_version: str = "v1",
    scored_at: float = T0 + 100,
    rubrics: tuple[RubricHit, ...] = (),
    dimensions: tuple[DimensionPrediction, ...] = (),
    behaviours: tuple[BehaviourHit, ...] = (),
) -> ScoreRecord:
    return ScoreRecord(
        conversation=closed(cid, attributes),
        status="scored",
        scorer_version=scorer_version,
        judge="recorded:test",
        rubric_set_version="rs1",
        calibrator_version="cal1" if ev is not None else "",
        scored_at=scored_at,
        attempts=1,
        netsat=netsat,
        label=label,
        threshold_label="dsat" if netsat < 0 else "sat",
        main_question_id="Q0" if ev is not None else "",
        main_probabilities=(0.25, 0.25, 0.25, 0.25) if ev is not None else (),
        main_expected_value=ev,
        dissatisfaction_probability=p_dsat,
        rubrics=rubrics,
        dimensions=dimensions,
        behaviours=behaviours,
    )


def unscored(
    cid: str, attributes: dict[str, str] | None = None, scored_at: float = T0 + 100, scorer_version: str = "v1"
) -> ScoreRecord:
    return ScoreRecord(
        conversation=closed(cid, attributes),
        status="unscored",
        scorer_version=scorer_version,
        judge="recorded:test",
        rubric_set_version="rs1",
        calibrator_version="cal1",
        scored_at=scored_at,
        attempts=3,
        unscored_reason="JudgeUnavailable: connection refused",
    )


def final_counts(store: ClickHouseStore) -> dict[str, int]:
    return {
        t: store.query(f"SELECT count() AS n FROM {t} FINAL")[0]["n"]
        for t in ("conversations", "conversation_scores", "dimension_predictions", "rubric_scores", "behaviour_turns")
    }


# --- schema -------------------------------------------------------------------------------------


def test_migrate_is_idempotent(store_factory) -> None:
    store = store_factory(migrate=False)
    assert store.migrate() == [m[0] for m in MIGRATIONS]
    tables = [r["name"] for r in store.query("SHOW TABLES")]
    assert tables == TABLES
    assert store.migrate() == []
    assert [r["name"] for r in store.query("SHOW TABLES")] == tables
    # the second run inserted no schema_migrations row (raw count, not FINAL)
    ids = [m[0] for m in MIGRATIONS]
    assert store.query("SELECT id FROM schema_migrations ORDER BY id") == [{"id": i} for i in ids]
    assert store.applied_migrations() == ids
    engines = {
        r["name"]: r["engine"] for r in store.query("SELECT name, engine FROM system.tables WHERE database = currentDatabase()")
    }
    assert all(
        engines[t] == "ReplacingMergeTree"
        for t in ("conversations", "conversation_scores", "dimension_predictions", "rubric_scores", "feedback")
    )


def test_the_migrated_tables_have_exactly_the_declared_columns_and_types(store_factory) -> None:
    """`stream.tables` declares what the sink inserts; the migrations must have built exactly that."""
    store = store_factory()
    for table in DECLARED_TABLES:
        rows = store.query(
            "SELECT name, type FROM system.columns WHERE database = currentDatabase() AND table = {t:String} ORDER BY position",
            {"t": table.name},
        )
        actual = {r["name"]: r["type"] for r in rows}
        declared = {c.name: c.type for c in table.columns}
        assert {n: t for n, t in actual.items() if n not in table.server_columns} == declared, table.name
        assert set(table.server_columns) <= set(actual), table.name


def test_the_schema_document_lists_every_declared_column_with_its_type() -> None:
    text = (REPO / "docs" / "clickhouse-schema.md").read_text(encoding="utf-8")
    assert SHADOW_SCORES.columns == SCORES.columns  # its types are documented as "as in conversation_scores"
    for table in DECLARED_TABLES:
        section = text.split(f"### `{table.name}`", 1)[1].split("\n### ", 1)[0]
        documented: dict[str, str] = {}
        for row in re.findall(r"^\| `.*$", section, flags=re.MULTILINE):
            names, types = (re.findall(r"`([^`]+)`", cell) for cell in row.split("|")[1:3])
            documented |= dict(zip(names, types if len(types) == len(names) else types * len(names)))
        for column in table.columns:
            assert column.name in documented, f"{table.name}.{column.name} is not in docs/clickhouse-schema.md"
            if table is not SHADOW_SCORES:
                assert documented[column.name].startswith(column.type), f"{table.name}.{column.name}: {documented[column.name]}"


def test_a_database_of_the_first_schema_is_upgraded_and_keeps_its_rows(store_factory, monkeypatch) -> None:
    """A store written before the judge-cost columns: the rows stay, the new columns read as NULL / empty / 0."""
    import stream.store as store_module

    store = store_factory(migrate=False)
    monkeypatch.setattr(store_module, "MIGRATIONS", MIGRATIONS[:1])
    assert store.migrate() == ["0001_initial"]
    # the old writer's row, with the old columns only
    store._command(
        "INSERT INTO conversation_scores (conversation_id, scorer_version, status, netsat, label, scored_at, closed_at) "
        "VALUES ('old-1', 'sv', 'scored', 3.5, 'sat', now64(6), now64(6))",
        "writing an old row",
    )
    monkeypatch.setattr(store_module, "MIGRATIONS", MIGRATIONS)
    assert store.migrate() == [m[0] for m in MIGRATIONS[1:]]
    [row] = store.query(
        "SELECT netsat, netsat_lower, netsat_upper, rubrics_unasked, judge_cached_prompt_tokens FROM latest_scores"
    )
    assert row == {
        "netsat": 3.5,
        "netsat_lower": None,
        "netsat_upper": None,
        "rubrics_unasked": [],
        "judge_cached_prompt_tokens": 0,
    }


def test_a_database_before_sampling_is_upgraded_and_its_rows_count_with_weight_one(store_factory, monkeypatch) -> None:
    """A store written by the 0002 schema: its rows stay, read as judged with π = 1, and the summary still counts them."""
    import stream.store as store_module

    store = store_factory(migrate=False)
    monkeypatch.setattr(store_module, "MIGRATIONS", MIGRATIONS[:2])
    assert store.migrate() == ["0001_initial", "0002_judge_cost"]
    store._command(  # the old writer's rows, with the 0002 columns only
        "INSERT INTO conversation_scores (conversation_id, scorer_version, status, netsat, label, dissatisfaction_probability, "
        "product, judge_cached_prompt_tokens, scored_at, closed_at) VALUES "
        "('old-dsat', 'sv', 'scored', -4, 'dsat', 0.9, 'p', 7, now64(6), now64(6)), "
        "('old-sat', 'sv', 'scored', 4, 'sat', 0.1, 'p', 7, now64(6), now64(6))",
        "writing old rows",
    )
    monkeypatch.setattr(store_module, "MIGRATIONS", MIGRATIONS)
    assert store.migrate() == [m[0] for m in MIGRATIONS[2:]]
    rows = store.query(
        "SELECT conversation_id, status, inclusion_probability, sampling_reason, behaviour_set_version, scorer_name, "
        "injection_signals FROM latest_scores ORDER BY conversation_id"
    )
    old = {
        "status": "scored",
        "inclusion_probability": 1.0,
        "sampling_reason": "",
        "behaviour_set_version": "",
        "scorer_name": "",
        "injection_signals": [],
    }
    assert rows == [{"conversation_id": "old-dsat", **old}, {"conversation_id": "old-sat", **old}]
    assert store.query("SELECT count() AS n FROM behaviour_turns") == [{"n": 0}]
    [v] = summarize(store, group_by="product").variants
    assert (v.n, v.n_scored, v.dsat_rate, v.calibrated_dissatisfaction) == (2, 2, 0.5, pytest.approx(0.5))


def test_a_second_store_on_the_same_database_sees_the_schema(store_factory) -> None:
    first = store_factory()
    second = store_factory(database=first.database, migrate=False)
    assert second.migrate() == []
    assert [r["name"] for r in second.query("SHOW TABLES")] == TABLES


# --- writes and reads ---------------------------------------------------------------------------


def test_write_and_read_back_every_field(store_factory) -> None:
    store = store_factory()
    conv = ClosedConversation(
        conversation_id="conv-1",
        turns=(
            TurnRecord(0, "user", "How do I sort a list? ü", T0 + 0.123456),
            TurnRecord(2, "assistant", "Use sorted(xs).", T0 + 2.5),
        ),
        attributes={"product": "chat", "model_version": "m-7", "dialogue_version": "2"},
        close_cause="idle_timeout",
        closed_at=T0 + 900.000001,
        first_event_at=T0 + 0.123456,
        last_event_at=T0 + 2.5,
        missing_turn_indices=(1,),
    )
    record = ScoreRecord(
        conversation=conv,
        status="scored",
        scorer_version="sv-3",
        judge="openai:qwen",
        rubric_set_version="rs-abc",
        calibrator_version="cal-def",
        scored_at=T0 + 1000.5,
        attempts=2,
        netsat=-7.5,
        netsat_lower=-7.5,
        netsat_upper=-7.5,
        rubrics_unasked=("s-late",),
        label="dsat",
        threshold_label="dsat",
        main_question_id="Q0",
        main_probabilities=(0.1, 0.2, 0.3, 0.4),
        main_expected_value=3.0,
        dissatisfaction_probability=0.625,
        dimensions=(DimensionPrediction("Q1", (0.5, 0.5), 1.5), DimensionPrediction("Q2", (0.0, 0.25, 0.75), 2.75)),
        rubrics=(RubricHit("s-fix", "sat", 7.5), RubricHit("d-generic", "dsat", -5.0)),
        behaviour_set_version="bs-1",
        behaviours=(BehaviourHit(2, "ignore", 0.75, True), BehaviourHit(2, "redundant", 0.125, False)),
        judge_calls=9,
        judge_prompt_tokens=1234,
        judge_completion_tokens=56,
        judge_cached_prompt_tokens=1100,
        judge_latency_s=4.25,
        inclusion_probability=0.25,
        sampling_reason="rate",
        scorer_name="2024-02-rubrics",
        injection_signals=("instruction", "forged_turn"),
        extra={"note": "x"},
    )
    assert store.write_scores([record]) == {
        "conversations": 1,
        "conversation_scores": 1,
        "dimension_predictions": 2,
        "rubric_scores": 2,
        "behaviour_turns": 2,
    }

    [c] = store.query("SELECT * FROM conversations FINAL")
    assert c == {
        "conversation_id": "conv-1",
        "closed_at": utc(T0 + 900.000001),
        "close_cause": "idle_timeout",
        "first_event_at": utc(T0 + 0.123456),
        "last_event_at": utc(T0 + 2.5),
        "n_turns": 2,
        "missing_turn_indices": [1],
        "attributes": {"product": "chat", "model_version": "m-7", "dialogue_version": "2"},
        "product": "chat",
        "model_version": "m-7",
        "content_hash": conv.to_conversation().content_hash(),
        "turns": [
            {"index": 0, "role": "user", "text": "How do I sort a list? ü", "timestamp": utc(T0 + 0.123456)},
            {"index": 2, "role": "assistant", "text": "Use sorted(xs).", "timestamp": utc(T0 + 2.5)},
        ],
    }
    [s] = store.query("SELECT * FROM conversation_scores FINAL")
    stored_at = s.pop("stored_at")  # set by the server at insert: when the row became visible
    assert abs(stored_at.timestamp() - time.time()) < 60
    assert s == {
        "conversation_id": "conv-1",
        "scorer_version": "sv-3",
        "status": "scored",
        "unscored_reason": "",
        "judge": "openai:qwen",
        "rubric_set_version": "rs-abc",
        "calibrator_version": "cal-def",
        "scored_at": utc(T0 + 1000.5),
        "closed_at": utc(T0 + 900.000001),
        "attempts": 2,
        "netsat": -7.5,
        "netsat_lower": -7.5,
        "netsat_upper": -7.5,
        "rubrics_unasked": ["s-late"],
        "label": "dsat",
        "threshold_label": "dsat",
        "main_question_id": "Q0",
        "main_probabilities": [0.1, 0.2, 0.3, 0.4],
        "main_expected_value": 3.0,
        "dissatisfaction_probability": 0.625,
        "product": "chat",
        "model_version": "m-7",
        "attributes": {"product": "chat", "model_version": "m-7", "dialogue_version": "2"},
        "n_turns": 2,
        "judge_calls": 9,
        "judge_prompt_tokens": 1234,
        "judge_completion_tokens": 56,
        "judge_cached_prompt_tokens": 1100,
        "judge_latency_s": 4.25,
        "inclusion_probability": 0.25,
        "sampling_reason": "rate",
        "behaviour_set_version": "bs-1",
        "scorer_name": "2024-02-rubrics",
        "injection_signals": ["instruction", "forged_turn"],
        "extra": '{"note": "x"}',
    }
    dims = store.query("SELECT * FROM dimension_predictions FINAL ORDER BY question_id")
    common = {"conversation_id": "conv-1", "scorer_version": "sv-3", "product": "chat", "model_version": "m-7"}
    times = {"closed_at": utc(T0 + 900.000001), "scored_at": utc(T0 + 1000.5)}
    assert dims == [
        {**common, "question_id": "Q1", "probabilities": [0.5, 0.5], "expected_value": 1.5, **times},
        {**common, "question_id": "Q2", "probabilities": [0.0, 0.25, 0.75], "expected_value": 2.75, **times},
    ]
    rubrics = store.query("SELECT * FROM rubric_scores FINAL ORDER BY rubric_id")
    assert rubrics == [
        {**common, "rubric_id": "d-generic", "polarity": "dsat", "score": -5.0, **times},
        {**common, "rubric_id": "s-fix", "polarity": "sat", "score": 7.5, **times},
    ]
    behaviours = store.query("SELECT * FROM behaviour_turns FINAL ORDER BY behaviour_id")
    turn = {"conversation_id": "conv-1", "scorer_version": "sv-3", "turn_index": 2}
    tail = {"inclusion_probability": 0.25, "product": "chat", "model_version": "m-7", **times}
    assert behaviours == [
        {**turn, "behaviour_id": "ignore", "probability": 0.75, "hit": True, **tail},
        {**turn, "behaviour_id": "redundant", "probability": 0.125, "hit": False, **tail},
    ]


def test_unscored_record_has_null_scores_and_a_conversation_row(store_factory) -> None:
    store = store_factory()
    assert store.write_scores([unscored("u1", {"product": "p"})]) == {
        "conversations": 1,
        "conversation_scores": 1,
        "dimension_predictions": 0,
        "rubric_scores": 0,
        "behaviour_turns": 0,
    }
    [row] = store.query(
        "SELECT status, unscored_reason, netsat, label, main_expected_value, dissatisfaction_probability, product FROM conversation_scores FINAL"
    )
    assert row == {
        "status": "unscored",
        "unscored_reason": "JudgeUnavailable: connection refused",
        "netsat": None,
        "label": "",
        "main_expected_value": None,
        "dissatisfaction_probability": None,
        "product": "p",
    }
    assert store.query("SELECT conversation_id FROM conversations FINAL") == [{"conversation_id": "u1"}]
    assert store.count_conversations() == 1


def test_duplicate_delivery_leaves_counts_unchanged(store_factory) -> None:
    store = store_factory()
    dims = tuple(DimensionPrediction(f"Q{i}", (0.5, 0.5), 1.5) for i in range(3))
    hits = (RubricHit("s1", "sat", 5.0), RubricHit("d1", "dsat", -2.5))
    turns = (BehaviourHit(1, "ignore", 0.8, True), BehaviourHit(1, "redundant", 0.1, False))
    batch = [scored(f"c{i}", "sat", 3.0, 0.2, 3.0, rubrics=hits, dimensions=dims, behaviours=turns) for i in range(5)]
    batch += [unscored("u")]
    store.write_scores(batch)
    once = final_counts(store)
    summary_once = summarize(store)
    store.write_scores(batch)  # the sink crashed before committing: the same records again
    store.write_scores(batch[2:4])
    assert store.query("SELECT count() AS n FROM conversation_scores")[0]["n"] > 6  # the raw table holds the copies ...
    assert (
        final_counts(store)
        == once
        == {"conversations": 6, "conversation_scores": 6, "dimension_predictions": 15, "rubric_scores": 10, "behaviour_turns": 10}
    )
    assert store.count_conversations() == 6  # ... reads see each conversation once
    assert summarize(store) == summary_once
    assert store.query("SELECT count() AS n FROM latest_scores")[0]["n"] == 6


def test_later_scored_record_replaces_unscored(store_factory) -> None:
    store = store_factory()
    store.write_scores([unscored("c", scored_at=T0 + 100)])
    assert store.query("SELECT status FROM conversation_scores FINAL") == [{"status": "unscored"}]
    store.write_scores([scored("c", "dsat", -4.0, 0.7, 1.5, scored_at=T0 + 200, rubrics=(RubricHit("d", "dsat", -4.0),))])
    rows = store.query("SELECT status, label, netsat, scored_at FROM conversation_scores FINAL")
    assert rows == [{"status": "scored", "label": "dsat", "netsat": -4.0, "scored_at": utc(T0 + 200)}]
    assert summarize(store).by_label == {"sat": 0, "dsat": 1, "uncertain": 0, "unscored": 0, "unsampled": 0}
    assert store.count_conversations() == 1


def test_a_later_failed_rescore_does_not_hide_a_score(store_factory) -> None:
    """A scored row outranks an unscored one whatever their times, so dimension/rubric rows never dangle."""
    store = store_factory()
    store.write_scores([scored("c", "sat", 6.0, 0.1, 3.5, scored_at=T0 + 100)])
    store.write_scores([unscored("c", scored_at=T0 + 500)])
    assert store.query("SELECT status, netsat FROM conversation_scores FINAL") == [{"status": "scored", "netsat": 6.0}]
    assert store.query("SELECT status FROM latest_scores") == [{"status": "scored"}]


def test_count_conversations_per_scorer_version(store_factory) -> None:
    store = store_factory()
    store.write_scores([scored("a", "sat", 1.0, None, None), scored("b", "sat", 1.0, None, None)])
    store.write_scores([scored("a", "sat", 1.0, None, None, scorer_version="v2", scored_at=T0 + 300)])
    assert store.count_conversations() == 2
    assert store.count_conversations("v1") == 2
    assert store.count_conversations("v2") == 1
    assert store.count_conversations("v9") == 0
    latest = store.query("SELECT conversation_id, scorer_version FROM latest_scores ORDER BY conversation_id")
    assert latest == [{"conversation_id": "a", "scorer_version": "v2"}, {"conversation_id": "b", "scorer_version": "v1"}]


def test_a_shadow_versions_records_go_to_shadow_scores_only(store_factory) -> None:
    """Shadow rows sit beside the active ones, never in what the report, summary and dashboards read."""
    store = store_factory()
    dims = (DimensionPrediction("Q0", (0.5, 0.5), 1.5),)
    hits = (RubricHit("d1", "dsat", -2.5),)
    active = [replace(scored(c, "sat", 3.0, 0.2, 3.0, dimensions=dims, rubrics=hits), scorer_name="v1") for c in "ab"]
    shadow = replace(
        scored("a", "dsat", -3.0, 0.8, 1.5, scorer_version="v2", dimensions=dims, rubrics=hits),
        scorer_name="candidate",
        role="shadow",
        inclusion_probability=0.5,
    )
    written = store.write_scores([*active, shadow])
    assert written["shadow_scores"] == 1 and written["conversation_scores"] == 2 and written["conversations"] == 2
    store.write_scores([shadow])  # re-delivered: deduplicated like the active rows
    assert final_counts(store) == {
        "conversations": 2,
        "conversation_scores": 2,
        "dimension_predictions": 2,
        "rubric_scores": 2,
        "behaviour_turns": 0,
    }
    assert store.query("SELECT scorer_name, label, inclusion_probability FROM shadow_scores FINAL") == [
        {"scorer_name": "candidate", "label": "dsat", "inclusion_probability": 0.5}
    ]
    assert {r["scorer_name"] for r in store.query("SELECT scorer_name FROM latest_scores")} == {"v1"}
    assert summarize(store).by_label["dsat"] == 0


# --- summary ------------------------------------------------------------------------------------


def _summary_fixture() -> list[list[ScoreRecord]]:
    dv0, dv1 = {"dialogue_version": "0"}, {"dialogue_version": "1"}
    first = [
        scored("a", "sat", 12.0, 0.1, 3.5, attributes=dv0, rubrics=(RubricHit("s1", "sat", 8.0), RubricHit("d1", "dsat", -0.0))),
        scored(
            "b",
            "dsat",
            -9.0,
            0.8,
            1.5,
            attributes=dv0,
            rubrics=(
                RubricHit("d1", "dsat", -6.0),
                RubricHit("d2", "dsat", -9.0),
                RubricHit("d3", "dsat", -3.0),
                RubricHit("d4", "dsat", -1.0),
                RubricHit("s1", "sat", 2.0),
            ),
        ),  # fmt: skip
        scored("c", "uncertain", 1.0, 0.4, 2.5, attributes=dv1),
        # d's first score hit d9; its re-score (below) does not, so d9 must not be reported
        scored("d", "dsat", -4.0, 0.3, 2.0, attributes=dv1, rubrics=(RubricHit("d9", "dsat", -10.0),)),
        unscored("e", attributes=dv1),
        scored("f", "sat", 5.0, None, None, attributes={"product": "p"}),  # no calibrator, no dialogue_version
        scored("g", "dsat", -20.0, 0.9, 1.0, attributes=dv0, rubrics=(RubricHit("d5", "dsat", -10.0),)),
    ]
    later = [
        scored("d", "dsat", -4.0, 0.8, 2.0, attributes=dv1, scored_at=T0 + 150, rubrics=(RubricHit("d1", "dsat", -5.0),)),
        scored("g", "sat", 7.0, 0.2, 3.0, attributes=dv0, scorer_version="v2", scored_at=T0 + 200),
    ]
    return [first, later]


def test_summary_matches_hand_computed_numbers(store_factory) -> None:
    store = store_factory()
    for batch in _summary_fixture():
        store.write_scores(batch)
    s = summarize(store, worst=3)  # latest score per conversation: g counts with its v2 score
    assert s.group_by == "dialogue_version"
    assert s.by_label == {
        "sat": 3,
        "dsat": 2,
        "uncertain": 1,
        "unscored": 1,
        "unsampled": 0,
    }  # sat a f g; dsat b d; uncertain c; unscored e
    by_variant = {v.variant: v for v in s.variants}
    assert [v.variant for v in s.variants] == ["", "0", "1"]
    f = by_variant[""]
    assert (f.n, f.n_scored, f.dsat_rate, f.calibrated_satisfaction, f.calibrated_dissatisfaction) == (1, 1, 0.0, None, None)
    v0 = by_variant["0"]  # a, b, g(v2)
    assert (v0.n, v0.n_scored) == (3, 3)
    assert v0.dsat_rate == pytest.approx(1 / 3)
    assert v0.calibrated_satisfaction == pytest.approx((3.5 + 1.5 + 3.0) / 3)
    assert v0.calibrated_dissatisfaction == pytest.approx((0.1 + 0.8 + 0.2) / 3)
    v1 = by_variant["1"]  # c, d (re-scored), e (unscored: counted in n, not in rates or means)
    assert (v1.n, v1.n_scored) == (3, 2)
    assert v1.dsat_rate == pytest.approx(1 / 2)
    assert v1.uncertain_rate == pytest.approx(1 / 2)
    assert v0.uncertain_rate == 0.0
    assert v1.calibrated_satisfaction == pytest.approx((2.5 + 2.0) / 2)
    assert v1.calibrated_dissatisfaction == pytest.approx((0.4 + 0.8) / 2)
    # worst: P(dsat) 0.8 ties between b and d, broken by the lower NetSAT (b: -9); then c (0.4)
    assert [w.conversation_id for w in s.worst] == ["b", "d", "c"]
    b, d, c = s.worst
    assert (b.netsat, b.label, b.dissatisfaction_probability) == (-9.0, "dsat", 0.8)
    # a hit is a DSAT rating >= 5 (score <= -5): b's d3 (-3) is not one
    assert b.dsat_hits == (RubricHit("d2", "dsat", -9.0), RubricHit("d1", "dsat", -6.0))
    assert d.dsat_hits == (RubricHit("d1", "dsat", -5.0),)  # not the stale d9 from d's first score
    assert c.dsat_hits == ()


def test_summary_for_one_scorer_version_and_another_attribute(store_factory) -> None:
    store = store_factory()
    for batch in _summary_fixture():
        store.write_scores(batch)
    s = summarize(store, worst=1, scorer_version="v1", group_by="product")
    assert s.by_label == {"sat": 2, "dsat": 3, "uncertain": 1, "unscored": 1, "unsampled": 0}  # g is dsat under v1
    assert [w.conversation_id for w in s.worst] == ["g"]
    assert s.worst[0].dsat_hits == (RubricHit("d5", "dsat", -10.0),)
    assert [(v.variant, v.n) for v in s.variants] == [("", 6), ("p", 1)]
    empty = summarize(store, scorer_version="nope")
    assert empty.by_label == {"sat": 0, "dsat": 0, "uncertain": 0, "unscored": 0, "unsampled": 0}
    assert empty.variants == () and empty.worst == ()


# --- feedback -----------------------------------------------------------------------------------


def test_feedback_rows_are_written_and_deduplicated(store_factory) -> None:
    store = store_factory()
    items = [
        FeedbackRow("c1", 1, "thumbs_down", "wrong answer", T0 + 5, {"product": "chat", "model_version": "m-7"}, T0 + 6),
        FeedbackRow("c1", 3, "thumbs_up", "", T0 + 9, {}, T0 + 10),
    ]
    assert store.write_feedback(items) == 2
    assert store.write_feedback(items[:1]) == 1  # redelivered
    rows = store.query("SELECT * FROM feedback FINAL ORDER BY turn_index")
    assert rows == [
        {
            "conversation_id": "c1", "turn_index": 1, "timestamp": utc(T0 + 5), "rating": "thumbs_down", "comment": "wrong answer",
            "attributes": {"product": "chat", "model_version": "m-7"}, "product": "chat", "model_version": "m-7", "received_at": utc(T0 + 6),
        },
        {
            "conversation_id": "c1", "turn_index": 3, "timestamp": utc(T0 + 9), "rating": "thumbs_up", "comment": "",
            "attributes": {}, "product": "", "model_version": "", "received_at": utc(T0 + 10),
        },
    ]  # fmt: skip
    assert store.write_feedback([]) == 0


def test_conversation_ratings_are_written_and_deduplicated(store_factory) -> None:
    store = store_factory()
    items = [
        RatingRow("c1", 2, 5, "slow", T0 + 5, {"product": "chat", "model_version": "m-7"}, T0 + 6),
        RatingRow("c1", 4, 5, "", T0 + 50, {}, T0 + 51),  # the user changed their mind
    ]
    assert store.write_ratings(items) == 2
    assert store.write_ratings(items[:1]) == 1  # redelivered
    rows = store.query("SELECT * FROM conversation_ratings FINAL ORDER BY timestamp")
    assert rows == [
        {"conversation_id": "c1", "score": 2, "scale": 5, "comment": "slow", "timestamp": utc(T0 + 5),
         "attributes": {"product": "chat", "model_version": "m-7"}, "product": "chat", "model_version": "m-7",
         "received_at": utc(T0 + 6)},
        {"conversation_id": "c1", "score": 4, "scale": 5, "comment": "", "timestamp": utc(T0 + 50), "attributes": {},
         "product": "", "model_version": "", "received_at": utc(T0 + 51)},
    ]  # fmt: skip
    with pytest.raises(RecordError, match="score 6 is not in 1..5"):
        RatingRow("c1", 6, 5, "", T0, {}, T0)


# --- batching and bad input ---------------------------------------------------------------------


def test_write_scores_is_one_insert_per_table(store_factory) -> None:
    store = store_factory()
    dims = tuple(DimensionPrediction(f"Q{i}", (0.1, 0.2, 0.3, 0.4), 3.0) for i in range(9))
    hits = tuple(RubricHit(f"r{i}", "sat" if i < 4 else "dsat", 5.0 if i < 4 else -5.0) for i in range(8))
    records = [scored(f"c{i:04d}", "sat", 1.0, 0.3, 3.0, dimensions=dims, rubrics=hits) for i in range(2000)]
    written = store.write_scores(records)
    assert written == {
        "conversations": 2000,
        "conversation_scores": 2000,
        "dimension_predictions": 18000,
        "rubric_scores": 16000,
        "behaviour_turns": 0,
    }
    # every INSERT gets the next block number: one insert per table leaves max_block_number = 1
    blocks = store.query(
        "SELECT table, max(max_block_number) AS b FROM system.parts WHERE database = currentDatabase() AND active "
        "AND table != 'schema_migrations' GROUP BY table ORDER BY table"
    )
    assert blocks == [
        {"table": t, "b": 1} for t in ("conversation_scores", "conversations", "dimension_predictions", "rubric_scores")
    ]
    assert final_counts(store) == written


def test_a_tables_column_types_are_asked_once_and_again_after_a_failed_insert(store_factory) -> None:
    """clickhouse-connect describes the table before every insert unless given its column types: the store asks once
    per table, and again after an insert fails (the table may have changed under it)."""
    store = store_factory()
    row = FeedbackRow("c1", 1, "thumbs_down", "wrong answer", T0 + 5, {}, T0 + 6)
    describes = mock.patch.object(store._client, "create_insert_context", wraps=store._client.create_insert_context)
    with describes as spy:  # a spy on the real client: every call still goes to chDB
        store.write_feedback([row])
        store.write_feedback([replace(row, turn_index=2)])
        assert spy.call_count == 1
        store._client.command(f"ALTER TABLE {store.database}.feedback DROP COLUMN comment")
        with pytest.raises(StoreError, match=r"writing 1 rows to \w+\.feedback"):
            store.write_feedback([replace(row, turn_index=3)])
        store._client.command(f"ALTER TABLE {store.database}.feedback ADD COLUMN comment String")
        store.write_feedback([replace(row, turn_index=4)])
        assert spy.call_count == 2  # asked again, and the insert with the new layout went through
    rows = store.query("SELECT turn_index, comment FROM feedback FINAL ORDER BY turn_index")
    assert rows == [
        {"turn_index": 1, "comment": ""},
        {"turn_index": 2, "comment": ""},
        {"turn_index": 4, "comment": "wrong answer"},
    ]


def test_times_before_1970_are_stored_and_read_back(store_factory) -> None:
    """The event contract accepts years from 1900: negative epoch seconds are DateTime64 ticks like any other."""
    store = store_factory()
    t = -631_151_999.75  # 1950-01-01T00:00:00.25Z
    conversation = replace(
        closed("old", n_turns=1),
        turns=(TurnRecord(0, "user", "hello from 1950", t),),
        closed_at=t + 60,
        first_event_at=t,
        last_event_at=t,
    )
    old = replace(unscored("old"), conversation=conversation)
    store.write_scores([old])
    store.write_feedback([FeedbackRow("old", 0, "down", "", t, {}, T0)])
    row = store.query("SELECT first_event_at, turns[1].4 AS turn_at FROM conversations FINAL")[0]
    assert row["first_event_at"] == row["turn_at"] == datetime(1950, 1, 1, 0, 0, 0, 250000, tzinfo=UTC)
    assert store.query("SELECT timestamp FROM feedback FINAL") == [
        {"timestamp": datetime(1950, 1, 1, 0, 0, 0, 250000, tzinfo=UTC)}
    ]


def test_query_is_read_only(store_factory) -> None:
    store = store_factory()
    for sql in ("DROP TABLE feedback", "INSERT INTO feedback (conversation_id) VALUES ('x')"):
        with pytest.raises(StoreError, match="readonly"):
            store.query(sql)
    assert "feedback" in [r["name"] for r in store.query("SHOW TABLES")]


def test_closed_store_refuses_use(store_factory) -> None:
    store = store_factory()
    store.close()
    store.close()  # idempotent
    with pytest.raises(StoreError, match="is closed"):
        store.count_conversations()


# --- opening ------------------------------------------------------------------------------------


def test_the_embedded_store_directory_is_created_owner_only(tmp_path: Path) -> None:
    tmp_path.chmod(0o755)  # pytest makes its directories 0700; the store must not rely on that
    made = _chdb_dir(f"chdb://{tmp_path / 'new' / 'store'}")
    assert made.stat().st_mode & 0o777 == 0o700  # it holds every conversation's text


def test_relative_chdb_dir_resolves_against_the_working_directory(chdb_store, monkeypatch) -> None:
    session_dir = chdb_store.chdb_path
    monkeypatch.chdir(session_dir.parent)
    with ClickHouseStore(f"chdb://{session_dir.name}", database=chdb_store.database) as store:
        assert store.chdb_path == session_dir
        assert store.migrate() == []


def test_open_from_settings(chdb_dsn) -> None:
    from stream.settings import StoreSettings

    with ClickHouseStore.open(StoreSettings(dsn=chdb_dsn, database="from_settings")) as store:
        assert store.database == "from_settings"
        assert store.migrate() == [m[0] for m in MIGRATIONS]


def test_second_directory_in_one_process_is_refused(chdb_store, tmp_path: Path) -> None:
    other = tmp_path / "other"
    with pytest.raises(StoreError, match=r"already has the chDB engine open on .*\(one chDB engine per process\)") as e:
        ClickHouseStore(f"chdb://{other}")
    assert str(other) in str(e.value)
    assert chdb_store.count_conversations() == 0  # the session engine is unharmed


def test_second_process_on_the_same_directory_is_refused(chdb_store) -> None:
    """A real second Python process tries to open the directory this test process holds."""
    code = (
        "import sys\n"
        "from stream.store import ClickHouseStore, StoreError\n"
        "try:\n"
        f"    ClickHouseStore({'chdb://' + str(chdb_store.chdb_path)!r})\n"
        "except StoreError as e:\n"
        "    print(e); sys.exit(3)\n"
        "print('opened'); sys.exit(0)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert proc.stdout.strip() == (
        f"the embedded store {chdb_store.chdb_path} is open in another process (pid {os.getpid()}) "
        "(only one process may open a chDB directory); stop it or use a ClickHouse server DSN"
    )


@pytest.mark.parametrize(
    "dsn, message",
    [
        ("ftp://x", r"store DSN 'ftp://x' has scheme 'ftp'; use chdb://DIR"),
        ("/var/lib/ch", r"has scheme '\(none\)'"),
        ("chdb://", r"names no directory"),
        ("chdb://dir?x=1", r"without \?options"),
    ],
)
def test_bad_dsn_is_refused_naming_the_problem(dsn: str, message: str) -> None:
    with pytest.raises(StoreError, match=message):
        ClickHouseStore(dsn)


def test_bad_database_name_is_refused() -> None:
    with pytest.raises(StoreError, match=r"database name 'x; DROP' is not a plain identifier"):
        ClickHouseStore("chdb:///tmp/never-opened", database="x; DROP")


def test_unreachable_server_names_host_and_hides_password() -> None:
    """Connection refused on a closed local port: a real network fault."""
    with pytest.raises(StoreError, match=r"cannot connect to the ClickHouse server at http://u:\*\*\*@127\.0\.0\.1:1") as e:
        ClickHouseStore("http://u:s3cret@127.0.0.1:1")
    assert "s3cret" not in str(e.value)


# --- the documented queries ---------------------------------------------------------------------


def _doc_sql_blocks() -> list[str]:
    text = (REPO / "docs" / "clickhouse-schema.md").read_text(encoding="utf-8")
    return re.findall(r"```sql\n(.*?)```", text, flags=re.DOTALL)


def test_every_documented_query_runs_on_the_real_schema(store_factory) -> None:
    store = store_factory()
    for batch in _summary_fixture():
        store.write_scores(batch)
    turns = tuple(BehaviourHit(i, "ignore", 0.9 if i == 1 else 0.2, i == 1) for i in (1, 3, 5))
    store.write_scores(
        [
            scored(
                "only-v2",
                "sat",
                2.0,
                0.1,
                3.0,
                scorer_version="v2",
                dimensions=(DimensionPrediction("Q1", (0.5, 0.5), 1.5),),
                behaviours=turns,
            )
        ]
    )
    store.write_feedback([FeedbackRow("b", 1, "thumbs_down", "useless", T0 + 5, {}, T0 + 6)])
    blocks = _doc_sql_blocks()
    assert len(blocks) >= 10
    results = [store.query(sql) for sql in blocks]
    empty = [sql for sql, rows in zip(blocks, results) if not rows]
    assert not empty, f"documented queries returning no rows on this fixture: {empty}"
    by_first_line = {sql.strip().splitlines()[0]: rows for sql, rows in zip(blocks, results)}
    assert by_first_line[
        "SELECT f.conversation_id, f.turn_index, f.rating, f.comment, s.label, s.dissatisfaction_probability"
    ] == [
        {
            "conversation_id": "b",
            "turn_index": 1,
            "rating": "thumbs_down",
            "comment": "useless",
            "label": "dsat",
            "dissatisfaction_probability": 0.8,
        }
    ]
    assert by_first_line["SELECT b.behaviour_id,"] == [
        {"behaviour_id": "ignore", "rate": pytest.approx(1 / 3), "hits": 1, "turns": 3}
    ]
    assert by_first_line["SELECT c.conversation_id, c.closed_at"] == [{"conversation_id": "only-v2", "closed_at": utc(T0 + 60)}]
