"""Scorer versions on the real components: a promotion during a live stream, shadow scoring, and a refused rollout.

One worker and one sink (real processes) on the session's Kafka broker, the embedded ClickHouse engine, the recorded
GPT-3.5 judge, and a scorer registry the worker reads every second. The 223 real LLM-Rubric conversations are sent
by this test, one every 0.1 s. v1 (the demo's rubric set and calibrator) is active with v2 (the same rubric set
re-windowed so that it calls every conversation dissatisfied) as its shadow on every judged conversation; a third of
the way in, `convowatch scorers promote v2`. Then a rollout naming an unknown version is written by hand.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from scorers.rubrics import ConfidenceWindows, RubricSet
from stream.registry import ROLLOUT_FILE, ScorerRegistry
from stream.replay.sources import ReplayItem, llm_rubric_events
from tests.infra import wait_for
from tests.integration.test_pipeline import N_REAL
from tests.pipeline import REPO, Pipeline

POLL_S = 1.0
LOAD_MARGIN_S = 5.0  # reading the rollout, loading a version, and a conversation in flight when it switched
GAP_S = 0.1  # between conversations sent
LATE = 10  # conversations sent after the refused rollout


@pytest.fixture
def registry(tmp_path: Path, scoring_artifacts: tuple[Path, Path]) -> ScorerRegistry:
    rubric_set, calibrator = scoring_artifacts
    everything_dsat = dataclasses.replace(RubricSet.load(rubric_set), windows=ConfidenceWindows(1000.0, dsat_upper=999.0))
    everything_dsat.save(tmp_path / "v2.json")
    registry = ScorerRegistry(tmp_path / "registry")
    registry.register("v1", rubric_set, calibrator)
    registry.register("v2", tmp_path / "v2.json", calibrator)
    registry.promote("v1")
    registry.start_shadow("v2", 1.0)
    return registry


@pytest.fixture
def pipeline(tmp_path: Path, kafka_broker: str, registry: ScorerRegistry) -> Iterator[Pipeline]:
    env = {"CONVOWATCH_SCORING__REGISTRY": str(registry.root), "CONVOWATCH_SCORING__REGISTRY_POLL_S": str(POLL_S)}
    p = Pipeline(tmp_path / "pipeline", kafka_broker, None, None, extra_env=env)
    try:
        yield p
    finally:
        p.stop_all()


def _conversations() -> list[list[ReplayItem]]:
    """The real conversations' events, each conversation's in order."""
    by_id: dict[str, list[ReplayItem]] = {}
    for item in llm_rubric_events():
        assert item.event is not None
        by_id.setdefault(item.event.conversation_id, []).append(item)
    return list(by_id.values())


def _renamed(items: list[ReplayItem], prefix: str) -> list[ReplayItem]:
    return [
        ReplayItem.of(dataclasses.replace(i.event, conversation_id=prefix + i.event.conversation_id))
        for i in items
        if i.event is not None
    ]


def _cli(pipeline: Pipeline, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "stream.commands.cli", *args],
        cwd=REPO,
        env={**os.environ, **pipeline.env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_promotion_mid_stream_loses_nothing_and_no_conversation_is_scored_by_two_active_versions(
    pipeline: Pipeline, registry: ScorerRegistry
) -> None:
    worker = pipeline.start_worker()
    sink = pipeline.start_sink()
    pipeline.wait_assigned([worker])
    assert worker.metric_sum("convowatch_scorer_version_info", role="active", scorer_name="v1") == 1
    assert worker.metric_sum("convowatch_scorer_version_info", role="shadow", scorer_name="v2") == 1

    conversations = _conversations()
    assert len(conversations) == N_REAL
    promoted_at = 0.0
    for i, items in enumerate(conversations):
        if i == N_REAL // 3:
            done = _cli(pipeline, "scorers", "promote", "v2")
            assert done.returncode == 0, done.stderr
            assert "v2 is now the active scorer version (was v1)" in done.stdout
            promoted_at = time.time()
        pipeline.produce((item.key, item.raw) for item in items)
        time.sleep(GAP_S)
    wait_for(
        lambda: sink.metric_sum("convowatch_sink_rows_total", table="conversation_scores") >= N_REAL,
        timeout=300,
        what="every conversation stored",
    )
    assert worker.metric_sum("convowatch_scorer_rollout_changes_total", outcome="applied") == 1
    assert worker.metric_sum("convowatch_scorer_version_info", role="active", scorer_name="v2") == 1
    assert worker.metric_sum("convowatch_scorer_version_info", role="shadow") == 0  # a promoted shadow stops shadowing

    # A rollout naming a version that does not exist: `promote` refuses it, and one written by hand is refused by
    # the worker, which keeps scoring with v2.
    refused = _cli(pipeline, "scorers", "promote", "v9")
    assert refused.returncode == 2 and "no version 'v9'" in refused.stderr and "registered: v1, v2" in refused.stderr
    (registry.root / ROLLOUT_FILE).write_text(json.dumps({"active": "v9"}))
    wait_for(
        lambda: worker.metric_sum("convowatch_scorer_rollout_changes_total", outcome="refused") == 1,
        timeout=30,
        what="the bad rollout refused",
    )
    late = [_renamed(items, "late-") for items in conversations[:LATE]]
    for items in late:
        pipeline.produce((item.key, item.raw) for item in items)
    wait_for(
        lambda: sink.metric_sum("convowatch_sink_rows_total", table="conversation_scores") >= N_REAL + LATE,
        timeout=120,
        what="the late conversations stored",
    )
    assert worker.metric_sum("convowatch_scorer_version_info", role="active", scorer_name="v2") == 1
    assert "scorer rollout refused" in worker.log.read_text() and "no version 'v9'" in worker.log.read_text()
    sink.terminate()  # the embedded store can be read by one process only

    rows = pipeline.query_store(
        "SELECT conversation_id, scorer_name, status, label, toUnixTimestamp64Micro(scored_at) / 1e6 AS scored_at "
        "FROM convowatch.conversation_scores"
    )
    ids = [r["conversation_id"] for r in rows]
    assert len(ids) == len(set(ids)) == N_REAL + LATE  # each conversation stored once, by one active version
    by_name = {name: {r["conversation_id"] for r in rows if r["scorer_name"] == name} for name in ("v1", "v2")}
    assert len(by_name["v1"]) >= N_REAL // 4 and len(by_name["v2"]) >= N_REAL // 2
    for r in rows:
        if r["scored_at"] < promoted_at:
            assert r["scorer_name"] == "v1", r
        elif r["scored_at"] > promoted_at + POLL_S + LOAD_MARGIN_S:
            assert r["scorer_name"] == "v2", r
    assert {r["label"] for r in rows if r["scorer_name"] == "v2" and r["status"] == "scored"} == {"dsat"}
    assert {r["conversation_id"] for r in rows if r["conversation_id"].startswith("late-")} <= by_name["v2"]

    # The shadow scored exactly the conversations v1 scored while v2 shadowed it, and fed no active metric.
    shadow = pipeline.query_store("SELECT conversation_id, scorer_name FROM convowatch.shadow_scores FINAL")
    assert {r["conversation_id"] for r in shadow} == by_name["v1"]
    assert {r["scorer_name"] for r in shadow} == {"v2"}
    assert worker.metric_sum("convowatch_shadow_conversations_total", scorer_name="v2") == len(by_name["v1"])
    assert (
        worker.metric_sum("convowatch_conversations_scored_total") + worker.metric_sum("convowatch_conversations_unscored_total")
        == N_REAL + LATE
    )

    compared = _cli(pipeline, "scorers", "compare", "--active", "v1", "--candidate", "v2", "--since", "1990-01-01", "--json")
    assert compared.returncode == 0, compared.stderr
    figures = json.loads(compared.stdout)
    v1_scored = sum(1 for r in rows if r["scorer_name"] == "v1" and r["status"] == "scored")
    assert figures["pairs"] == v1_scored and figures["candidate"]["dsat_share"]["estimate"] == 1.0
    same = sum(figures["labels"][label][label] for label in figures["labels"])
    assert figures["label_agreement"]["estimate"] == pytest.approx(same / v1_scored)
    text = _cli(pipeline, "scorers", "compare", "--active", "v1", "--candidate", "v2", "--since", "1990-01-01")
    assert f"{v1_scored} conversations scored by both" in text.stdout, text.stdout + text.stderr
