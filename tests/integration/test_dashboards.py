"""The Grafana dashboards as code: committed JSON == generator, queries name real metrics and run on real chDB, push.

No Grafana server can be installed on these machines, so the dashboards are
proven piece by piece: the JSON is what the generator makes; every PromQL
expression names only metrics and labels the real exporter (`ServiceMetrics`)
serves and passes ``promtool``'s parser; every SQL query, expanded the way
the ClickHouse plugin expands macros and variables, runs on the real chDB
engine against rows written by the real store and returns the expected rows.
The push is tested against a closed port and a silent socket (real faults)
and against `GrafanaStandIn`, a small imitation of Grafana's HTTP API.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from dashboards import catalog
from dashboards.datasources import CLICKHOUSE_UID, PROMETHEUS_UID
from dashboards.push import DEFAULT_FOLDER, PushError, PushTargetError, folder_uid, push
from scorers.datasets.llm_rubric import REAL_CONVERSATIONS_FILE, load_real_conversations
from scorers.rubrics import DSAT_HIT_RATING as HIT_RATING
from scorers.statistics import auroc, wilson_interval
from stream.metrics import ServiceMetrics, metric_names
from stream.records import (
    BehaviourHit,
    ClosedConversation,
    DimensionPrediction,
    FeedbackRow,
    RubricHit,
    ScoreRecord,
    TurnRecord,
)
from tests.chdb_fixture import chdb_dsn, chdb_store, store_factory  # noqa: F401
from tests.data_paths import LLM_RUBRIC
from tests.grafana_macros import ALL, expand_promql, expand_sql
from tests.infra import convowatch
from tests.servers import LOCALHOST, Received, Reply, ScriptedServer
from tests.unit.test_service_metrics import every_series

ROOT = Path(__file__).resolve().parents[2]
UIDS = {"convowatch-overview", "convowatch-quality", "convowatch-rubrics", "convowatch-behaviours", "convowatch-operations"}
T0 = 1_707_480_000.0  # 2024-02-09 12:00 UTC
START = datetime.fromtimestamp(T0 - 3600, tz=UTC)
END = datetime.fromtimestamp(T0 + 3600, tz=UTC)


def all_panels(model: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in catalog.flat_panels(model["panels"]) if p["type"] != "row"]


# --- generated JSON -----------------------------------------------------------------------------


def test_committed_json_is_what_the_generator_makes() -> None:
    assert catalog.check(catalog.DEFAULT_DIR) == []
    for uid, model in catalog.dashboards().items():
        text = (catalog.DEFAULT_DIR / f"{uid}.json").read_text(encoding="utf-8")
        assert text == json.dumps(json.loads(text), indent=2, sort_keys=True, ensure_ascii=False) + "\n"
        assert json.loads(text) == model


def test_generation_is_deterministic() -> None:
    first = {uid: catalog.render(m) for uid, m in catalog.dashboards().items()}
    assert first == {uid: catalog.render(m) for uid, m in catalog.dashboards().items()}


def test_uids_are_the_stable_ones_and_ids_are_unique() -> None:
    models = catalog.dashboards()
    assert set(models) == UIDS
    for uid, model in models.items():
        assert model["uid"] == uid
        ids = [p["id"] for p in catalog.flat_panels(model["panels"])]
        assert len(ids) == len(set(ids)), uid
        for panel in all_panels(model):
            refs = [t["refId"] for t in panel["targets"]]
            assert refs and len(refs) == len(set(refs)), (uid, panel["title"])


def test_every_panel_and_query_names_one_of_the_two_datasources() -> None:
    for uid, model in catalog.dashboards().items():
        for panel in all_panels(model):
            assert panel["datasource"]["uid"] in (PROMETHEUS_UID, CLICKHOUSE_UID), (uid, panel["title"])
            for target in panel["targets"]:
                assert target["datasource"] == panel["datasource"], (uid, panel["title"])
        for variable in model["templating"]["list"]:
            if variable["type"] == "query":
                assert variable["datasource"]["uid"] in (PROMETHEUS_UID, CLICKHOUSE_UID), (uid, variable["name"])
    rubrics = catalog.dashboards()["convowatch-rubrics"]
    assert {p["datasource"]["uid"] for p in all_panels(rubrics)} == {CLICKHOUSE_UID}


def test_queries_cover_every_target_and_query_variable() -> None:
    queries = catalog.queries()
    targets = sum(len(p["targets"]) for m in catalog.dashboards().values() for p in all_panels(m))
    variables = sum(v["type"] == "query" for m in catalog.dashboards().values() for v in m["templating"]["list"])
    assert len(queries) == targets + variables
    assert {q.kind for q in queries if q.dashboard == "convowatch-rubrics"} == {"clickhouse"}
    assert {q.kind for q in queries if q.dashboard == "convowatch-behaviours"} == {"clickhouse", "prometheus"}
    assert {q.kind for q in queries if q.dashboard not in ("convowatch-rubrics", "convowatch-behaviours")} == {"prometheus"}
    assert all(q.expr.strip() for q in queries)


def test_drill_down_link_targets_this_dashboard_with_the_conversation_variable() -> None:
    rubrics = catalog.dashboards()["convowatch-rubrics"]
    table = next(p for p in all_panels(rubrics) if p["title"] == "Worst recent conversations")
    (override,) = [o for o in table["fieldConfig"]["overrides"] if o["matcher"]["options"] == "conversation_id"]
    (link,) = override["properties"][0]["value"]
    # any id is one URL parameter: percent-encoded, not raw
    assert link["url"].startswith("/d/convowatch-rubrics?var-conversation_id=${__value.raw:percentencode}&")
    names = {v["name"]: v for v in rubrics["templating"]["list"]}
    assert names["conversation_id"]["type"] == "textbox"
    assert names["product"]["includeAll"] and names["product"]["multi"]


def test_provisioning_files_create_the_datasources_and_folder_the_dashboards_use() -> None:
    provisioning = ROOT / "deploy" / "grafana" / "provisioning"
    sources = yaml.safe_load((provisioning / "datasources" / "convowatch.yml").read_text())["datasources"]
    by_uid = {s["uid"]: s for s in sources}
    assert set(by_uid) == {PROMETHEUS_UID, CLICKHOUSE_UID}
    assert by_uid[PROMETHEUS_UID]["type"] == "prometheus" and by_uid[PROMETHEUS_UID]["url"] == "http://127.0.0.1:9090"
    clickhouse = by_uid[CLICKHOUSE_UID]
    assert clickhouse["type"] == "grafana-clickhouse-datasource"
    assert {k: clickhouse["jsonData"][k] for k in ("host", "port", "protocol", "defaultDatabase")} == {
        "host": "127.0.0.1",
        "port": 8123,
        "protocol": "http",
        "defaultDatabase": "convowatch",
    }
    assert clickhouse["secureJsonData"]["password"].startswith("$")  # from Grafana's environment, not the file
    (provider,) = yaml.safe_load((provisioning / "dashboards" / "convowatch.yml").read_text())["providers"]
    assert provider["type"] == "file" and provider["options"]["path"] == "$CONVOWATCH_DASHBOARDS_DIR"
    assert provider["folderUid"] == folder_uid(DEFAULT_FOLDER)  # the folder `dashboards push` uses too


# --- PromQL: real metric names, real labels, promtool's parser -----------------------------------


def exported() -> tuple[set[str], set[str]]:
    metrics = ServiceMetrics()
    every_series(metrics)
    names = set(metric_names(metrics))
    labels = {name for family in metrics.registry.collect() for s in family.samples for name in s.labels}
    return names, labels | {"instance", "job"}  # Prometheus adds these when it scrapes


def referenced_labels(expr: str) -> set[str]:
    out = set()
    for group in re.findall(r"\bby \(([^)]*)\)", expr):
        out |= {x.strip() for x in group.split(",") if x.strip()}
    for selector in re.findall(r"\{([^{}]*)\}", expr):
        out |= set(re.findall(r"(\w+)\s*(?:=~|!~|!=|=)", selector))
    return out


def test_every_promql_names_only_exported_metrics_and_labels() -> None:
    names, labels = exported()
    prometheus_queries = [q for q in catalog.queries() if q.kind == "prometheus"]
    assert len(prometheus_queries) > 40
    for q in prometheus_queries:
        used = set(re.findall(r"\bconvowatch_\w+", q.expr))
        assert used, (q.panel, q.expr)
        assert used <= names, (q.panel, sorted(used - names))
        assert referenced_labels(q.expr) <= labels, (q.panel, sorted(referenced_labels(q.expr) - labels))


def test_a_misspelt_metric_would_be_caught() -> None:
    names, _ = exported()
    assert "convowatch_conversations_scored_total" in names
    assert "convowatch_conversations_scored" not in names  # counters export _total: the check is not vacuous
    assert "convowatch_consumer_lag" in names


def test_every_expanded_promql_parses_with_promtool(tmp_path: Path) -> None:
    rules = [
        {"record": f"convowatch:dashboard_query_{i}", "expr": expand_promql(q.expr, range_s=3600, interval_s=60)}
        for i, q in enumerate(q for q in catalog.queries() if q.kind == "prometheus")
    ]
    path = tmp_path / "queries.rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard-queries", "rules": rules}]}), encoding="utf-8")
    result = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules)} rules found" in result.stdout


def test_expand_promql_replaces_every_variable() -> None:
    text = expand_promql(
        'sum(rate(m{product=~"$product", d=~"${dimension}"}[$__rate_interval])) + sum(increase(m[$__range]))',
        range_s=7200,
        interval_s=30,
        scrape_interval_s=15,
    )
    assert text == 'sum(rate(m{product=~".*", d=~".*"}[60s])) + sum(increase(m[7200s]))'
    assert (
        expand_promql('label_values(m{a=~"$a"}, b)', range_s=600, interval_s=15)
        == 'count by (b) (last_over_time(m{a=~".*"}[600s]))'
    )


# --- SQL on the real chDB engine ----------------------------------------------------------------


def real_conversations(n: int) -> list[tuple[str, list[tuple[str, str]]]]:
    """The first ``n`` real LLM-Rubric conversations: (id, [(role, text), ...])."""
    conversations = load_real_conversations(LLM_RUBRIC / REAL_CONVERSATIONS_FILE)
    return [(cid, [(t.role, t.text) for t in c.turns]) for cid, c in list(conversations.items())[:n]]


def record(
    cid: str,
    turns: list[tuple[str, str]],
    product: str,
    label: str,
    netsat: float,
    p_dsat: float,
    rubrics: dict[str, float],
    *,
    closed_at: float = T0 + 60,
    scored_at: float = T0 + 100,
    scorer_version: str = "v1",
    behaviours: tuple[BehaviourHit, ...] = (),
    inclusion_probability: float = 1.0,
) -> ScoreRecord:
    conversation = ClosedConversation(
        conversation_id=cid,
        turns=tuple(TurnRecord(i, role, text, closed_at - 50 + i) for i, (role, text) in enumerate(turns)),
        attributes={"product": product, "model_version": "m1" if product == "chat" else "m2"},
        close_cause="end",
        closed_at=closed_at,
        first_event_at=closed_at - 50,
        last_event_at=closed_at - 50 + len(turns),
    )
    return ScoreRecord(
        conversation=conversation,
        status="scored",
        scorer_version=scorer_version,
        judge="recorded:test",
        rubric_set_version="rs1",
        calibrator_version="cal1",
        scored_at=scored_at,
        attempts=1,
        netsat=netsat,
        label=label,
        threshold_label="dsat" if netsat < 0 else "sat",
        main_question_id="Q0",
        main_probabilities=(0.25, 0.25, 0.25, 0.25),
        main_expected_value=4 * (1 - p_dsat),
        dissatisfaction_probability=p_dsat,
        dimensions=(DimensionPrediction("Q1", (0.1, 0.2, 0.3, 0.4), 3.0), DimensionPrediction("Q2", (0.4, 0.3, 0.2, 0.1), 2.0)),
        rubrics=tuple(RubricHit(rid, "dsat" if rid.startswith("D") else "sat", score) for rid, score in rubrics.items()),
        behaviours=behaviours,
        inclusion_probability=inclusion_probability,
    )


def shows(turn: int, behaviour: str, hit: bool) -> BehaviourHit:
    return BehaviourHit(turn, behaviour, 0.9 if hit else 0.1, hit)


@pytest.fixture
def scored_store(store_factory):
    """A store holding real conversations scored by hand: which rows each panel must return is known."""
    (c0, t0), (c1, t1), (c2, t2), (c3, t3), (c4, t4), (c5, t5) = real_conversations(6)
    store = store_factory()
    store.write_scores(
        [
            record(
                c0,
                t0,
                "chat",
                "dsat",
                -12.0,
                0.9,
                {"D1": -8.0, "D2": -6.0, "D3": -2.0, "S1": 3.0},
                behaviours=tuple(shows(t, b, t == 1 and b == "ignore") for t in (1, 3) for b in ("ignore", "redundant")),
            ),
            record(c1, t1, "chat", "uncertain", -3.0, 0.6, {"D1": -7.0, "D2": -1.0, "S1": 5.0}),
            # judged with π = 0.5: its turn stands for two
            record(
                c2,
                t2,
                "search",
                "sat",
                8.0,
                0.2,
                {"D1": -1.0, "D2": -0.5, "S1": 9.5},
                behaviours=(shows(1, "ignore", True), shows(1, "redundant", True)),
                inclusion_probability=0.5,
            ),
            record(c3, t3, "search", "sat", 9.0, 0.1, {"D1": -HIT_RATING, "S1": 9.0}),  # exactly at the hit threshold
            # outside the dashboard range: its hits must not count
            record(
                c5,
                t5,
                "chat",
                "dsat",
                -15.0,
                0.95,
                {"D2": -9.0},
                closed_at=T0 - 86_400,
                scored_at=T0 - 86_000,
                behaviours=(shows(1, "ignore", True),),
            ),
        ]
    )
    # an older score of c2 by another scorer version, with hits: latest_scores ignores it
    old = record(c2, t2, "search", "dsat", -9.0, 0.8, {"D2": -9.0}, scored_at=T0 + 10, scorer_version="v0")
    store.write_scores([replace(old, behaviours=(shows(1, "ignore", True), shows(3, "ignore", True)))])
    store.write_scores(
        [
            ScoreRecord(
                conversation=record(c4, t4, "chat", "sat", 0, 0, {}).conversation,
                status="unscored",
                scorer_version="v1",
                judge="recorded:test",
                rubric_set_version="rs1",
                calibrator_version="cal1",
                scored_at=T0 + 100,
                attempts=3,
                unscored_reason="JudgeUnavailable: connection refused",
            )
        ]
    )
    return store, (c0, c1, c2, c3, c4, c5), (t0, t1, t2, t3, t4, t5)


def run(store, panel: str, variables: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    (expr,) = {q.expr for q in catalog.queries() if q.kind == "clickhouse" and q.panel == panel}  # variables repeat
    values = {"product": ALL, "model_version": ALL, "conversation_id": "", **(variables or {})}
    return store.query(expand_sql(expr, start=START, end=END, variables=values, interval_s=600))


def test_every_sql_query_runs_on_chdb(scored_store) -> None:
    store, ids, _ = scored_store
    sql_queries = [q for q in catalog.queries() if q.kind == "clickhouse"]
    assert len(sql_queries) >= 10
    for selection in ({"product": ALL, "model_version": ALL}, {"product": ["chat", "o'brien"], "model_version": "m1"}):
        for q in sql_queries:
            sql = expand_sql(q.expr, start=START, end=END, variables={**selection, "conversation_id": ids[0]}, interval_s=600)
            assert "$" not in sql, (q.panel, sql)
            store.query(sql)  # raises StoreError (with ClickHouse's message) on an unknown table/column or a syntax error


def test_variables_list_products_and_model_versions(scored_store) -> None:
    store, _, _ = scored_store
    assert [r["product"] for r in run(store, "variable product")] == ["chat", "search"]
    assert [r["model_version"] for r in run(store, "variable model_version")] == ["m1", "m2"]


def test_most_firing_dsat_rubrics_count_current_hits_in_range(scored_store) -> None:
    store, _, _ = scored_store
    assert run(store, "Most-firing DSAT rubrics") == [{"rubric": "D1", "hits": 3}, {"rubric": "D2", "hits": 1}]
    assert run(store, "Most-firing DSAT rubrics", {"product": ["chat"]}) == [
        {"rubric": "D1", "hits": 2},
        {"rubric": "D2", "hits": 1},
    ]
    over_time = run(store, "DSAT rubric hits over time")
    assert {(r["rubric"], r["hits"]) for r in over_time} == {("D1", 3), ("D2", 1)}  # all in one 10-minute interval


def test_netsat_distribution_has_one_value_per_scored_conversation_in_range(scored_store) -> None:
    store, _, _ = scored_store
    assert sorted(r["netsat"] for r in run(store, "NetSAT distribution")) == [-12.0, -3.0, 8.0, 9.0]
    assert sorted(r["netsat"] for r in run(store, "NetSAT distribution", {"model_version": ["m2"]})) == [8.0, 9.0]


def test_worst_conversations_come_first_with_their_hits(scored_store) -> None:
    store, (c0, c1, c2, c3, _, _), _ = scored_store
    rows = run(store, "Worst recent conversations")
    assert [r["conversation_id"] for r in rows] == [c0, c1, c2, c3]
    assert rows[0]["dsat_hits"] == "D1 -8; D2 -6"  # strongest first, D3 (rating 2) below the threshold
    assert rows[1]["dsat_hits"] == "D1 -7"
    assert rows[2]["dsat_hits"] == ""  # c2's hit belongs to its older score
    assert rows[3]["dsat_hits"] == f"D1 -{HIT_RATING:g}"
    assert rows[0]["p_dissatisfied"] == 0.9 and rows[0]["label"] == "dsat" and rows[0]["product"] == "chat"


def test_behaviour_rates_are_weighted_with_wilson_intervals_of_the_judged_turns(scored_store) -> None:
    store, _, _ = scored_store
    rows = run(store, "Behaviour rates with 95 % Wilson intervals")
    # ignore: c0's turn 1 (π = 1) and c2's turn 1 (π = 0.5) of c0's two turns and c2's one → (1 + 2) / (1 + 1 + 2)
    assert [(r["behaviour"], r["rate"], r["hits"], r["turns"]) for r in rows] == [
        ("ignore", 0.75, 2, 3),
        ("redundant", 0.5, 1, 3),
    ]
    for row in rows:
        interval = wilson_interval(row["hits"], row["turns"])
        assert (row["wilson_lower"], row["wilson_upper"]) == (
            pytest.approx(interval.low, abs=1e-4),
            pytest.approx(interval.high, abs=1e-4),
        )
    assert [
        (r["behaviour"], r["rate"]) for r in run(store, "Behaviour rates with 95 % Wilson intervals", {"product": ["chat"]})
    ] == [
        ("ignore", 0.5),
        ("redundant", 0.0),
    ]
    over_time = run(store, "Behaviour rate over time")
    assert {(r["behaviour"], r["rate"]) for r in over_time} == {("ignore", 0.75), ("redundant", 0.5)}  # one interval


def test_user_auroc_separates_rated_down_from_rated_up_with_the_latest_rating_of_each_turn(store_factory) -> None:
    """The AUROC panel, on chDB: P(dsat) of conversations rated down against those rated up, per interval."""
    store = store_factory()
    conversations = real_conversations(14)
    p_dsat = [0.9, 0.8, 0.7, 0.4, 0.3, 0.65, 0.2, 0.1, 0.5, 0.35, 0.6, 0.25, 0.95, 0.05]
    store.write_scores([record(cid, turns, "chat", "uncertain", 0.0, p, {}) for (cid, turns), p in zip(conversations, p_dsat)])
    ids = [cid for cid, _ in conversations]
    down, up = ids[:6], ids[6:12]  # ids[12]: rated both ways (left out); ids[13]: not rated
    rows = [FeedbackRow(cid, 1, "down", "", T0 + 70) for cid in down] + [FeedbackRow(cid, 1, "up", "", T0 + 70) for cid in up]
    rows += [FeedbackRow(ids[12], 1, "up", "", T0 + 70), FeedbackRow(ids[12], 3, "down", "", T0 + 71)]
    rows += [FeedbackRow(down[0], 3, "up", "", T0 + 60), FeedbackRow(down[0], 3, "down", "", T0 + 80)]  # changed their mind
    store.write_feedback(rows)
    (result,) = run(store, "AUROC of P(dissatisfied) against user feedback")
    expected = auroc(np.array(p_dsat[:12]), np.array([True] * 6 + [False] * 6))
    assert (result["scorer_version"], result["auroc"]) == ("v1", pytest.approx(expected, abs=5e-4))
    assert 0.5 < expected < 1  # the drawn probabilities separate the two classes, but not perfectly
    store.write_feedback([FeedbackRow(cid, 5, "up", "", T0 + 90) for cid in down[:2]])  # two rated-down now rated both ways
    assert run(store, "AUROC of P(dissatisfied) against user feedback") == []  # 4 rated down < 5: no figure


def test_drill_down_shows_the_selected_conversation(scored_store) -> None:
    store, (c0, _, c2, _, _, _), (t0, *_) = scored_store
    turns = run(store, "Turns", {"conversation_id": c0})
    assert [(r["turn"], r["role"], r["text"]) for r in turns] == [(i, role, text) for i, (role, text) in enumerate(t0)]
    scores = run(store, "Scores", {"conversation_id": c2})
    assert [(r["scorer_version"], r["label"]) for r in scores] == [("v1", "sat"), ("v0", "dsat")]
    rubric_rows = run(store, "Rubric scores", {"conversation_id": c0})
    assert [(r["rubric"], r["score"], bool(r["dsat_hit"])) for r in rubric_rows] == [
        ("D1", -8.0, True),
        ("D2", -6.0, True),
        ("D3", -2.0, False),
        ("S1", 3.0, False),
    ]
    assert [r["rubric"] for r in run(store, "Rubric scores", {"conversation_id": c2})] == ["D1", "D2", "S1"]  # current score only
    dims = run(store, "Calibrated dimensions", {"conversation_id": c0})
    assert [(r["dimension"], r["expected_answer"]) for r in dims] == [("Q1", 3.0), ("Q2", 2.0)]
    assert run(store, "Turns", {"conversation_id": "no-such-conversation"}) == []
    # a quote in the textbox stays in its literal (percentencode; hostile ids: test_dashboard_injection.py)
    assert run(store, "Turns", {"conversation_id": "x' OR '1'='1"}) == []


# --- the CLI --------------------------------------------------------------------------------------


def test_build_and_check_commands(tmp_path: Path) -> None:
    out = tmp_path / "json"
    built = convowatch("dashboards", "build", "--out", out)
    assert built.returncode == 0, built.stderr
    assert sorted(p.name for p in out.iterdir()) == sorted(f"{uid}.json" for uid in UIDS)
    for path in out.iterdir():
        assert path.read_bytes() == (catalog.DEFAULT_DIR / path.name).read_bytes()
    ok = convowatch("dashboards", "check", "--dir", out)
    assert ok.returncode == 0, ok.stderr

    edited = out / "convowatch-overview.json"
    model = json.loads(edited.read_text())
    model["title"] = "edited by hand"
    edited.write_text(json.dumps(model, indent=2, sort_keys=True) + "\n")
    (out / "old-dashboard.json").write_text("{}\n")
    (out / "convowatch-operations.json").unlink()
    bad = convowatch("dashboards", "check", "--dir", out)
    assert bad.returncode == 1
    assert f"{edited}: differs from the generator" in bad.stderr
    assert "convowatch-operations.json: missing" in bad.stderr
    assert "old-dashboard.json: not generated" in bad.stderr
    assert "convowatch-quality.json" not in bad.stderr


def test_committed_directory_passes_check_via_the_cli() -> None:
    r = convowatch("dashboards", "check")
    assert r.returncode == 0, r.stderr
    assert "5 dashboards" in r.stdout


# --- push: real network faults --------------------------------------------------------------------


def closed_port() -> int:
    with socket.socket() as s:
        s.bind((LOCALHOST, 0))
        return s.getsockname()[1]  # closed when the with-block ends: connecting is refused


def test_push_to_a_closed_port_says_unreachable() -> None:
    port = closed_port()
    with pytest.raises(PushError, match=rf"Grafana at http://127.0.0.1:{port} is unreachable"):
        push(f"http://{LOCALHOST}:{port}", "secret-token", catalog.dashboards(), timeout_s=5)


def test_push_to_a_server_that_never_answers_times_out() -> None:
    with socket.socket() as listener:  # accepts connections (kernel backlog) but never replies
        listener.bind((LOCALHOST, 0))
        listener.listen(8)
        url = f"http://{LOCALHOST}:{listener.getsockname()[1]}"
        with pytest.raises(PushError, match=r"unreachable: no answer within 0.5 s"):
            push(url, "secret-token", catalog.dashboards(), timeout_s=0.5)


def test_push_refuses_a_url_that_is_not_http() -> None:
    with pytest.raises(PushTargetError, match="not an http"):
        push("grafana.example.com:3000", None, {})


# --- push: against a Grafana-API stand-in ------------------------------------------------------------


class GrafanaStandIn:
    """A stand-in for Grafana's HTTP API (``/api/health``, folders, ``/api/dashboards/db``), as a real local HTTP server.

    No Grafana server can be installed on these machines, so the auth,
    version and overwrite behaviour the push depends on is imitated here, as
    Grafana documents it: Bearer-token auth on everything but ``/api/health``
    (401 for a wrong token, 403 for a viewer), 404 for an unknown folder, and
    ``/api/dashboards/db`` refusing an existing uid (412) unless ``overwrite``
    is true, bumping the version when it is. Every POSTed payload is recorded.
    """

    def __init__(
        self, token: str = "good-token", version: str = "11.6.0", viewer: bool = False, dashboard_status: int | None = None
    ) -> None:
        self.token, self.version, self.viewer, self.dashboard_status = token, version, viewer, dashboard_status
        self.folders: dict[str, str] = {}
        self.dashboards: dict[str, dict[str, Any]] = {}
        self.posted: list[tuple[str, dict[str, Any]]] = []
        self.server = ScriptedServer(self.respond)

    def __enter__(self) -> GrafanaStandIn:
        self.server.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.__exit__(*exc)

    @property
    def url(self) -> str:
        return self.server.url

    def respond(self, _index: int, request: Received) -> Reply:
        if request.method == "GET" and request.path == "/api/health":
            return reply(200, {"commit": "abc123", "database": "ok", "version": self.version})
        if request.headers.get("authorization") != f"Bearer {self.token}":
            return reply(401, {"message": "invalid API key"})
        if self.viewer and request.method == "POST":
            return reply(403, {"message": "Access denied"})
        if request.method == "GET" and request.path.startswith("/api/folders/"):
            uid = request.path.rsplit("/", 1)[1]
            return (
                reply(200, {"uid": uid, "title": self.folders[uid]})
                if uid in self.folders
                else reply(404, {"message": "folder not found"})
            )
        body = json.loads(request.body or b"{}")
        self.posted.append((request.path, body))
        if request.method == "POST" and request.path == "/api/folders":
            self.folders[body["uid"]] = body["title"]
            return reply(200, {"uid": body["uid"], "title": body["title"]})
        if request.method == "POST" and request.path == "/api/dashboards/db":
            if self.dashboard_status:
                return reply(self.dashboard_status, {"message": "database is locked"})
            return self.save_dashboard(body)
        return reply(404, {"message": "not found"})

    def save_dashboard(self, body: dict[str, Any]) -> Reply:
        model, uid = body["dashboard"], body["dashboard"]["uid"]
        if body.get("folderUid") not in self.folders:
            return reply(400, {"message": "folder not found"})
        if uid in self.dashboards and not body.get("overwrite"):
            return reply(412, {"message": "A dashboard with the same uid already exists", "status": "name-exists"})
        version = self.dashboards.get(uid, {}).get("version", 0) + 1
        self.dashboards[uid] = {"model": model, "folder": body["folderUid"], "version": version}
        return reply(200, {"id": len(self.dashboards), "uid": uid, "url": f"/d/{uid}/x", "status": "success", "version": version})


def reply(status: int, body: dict[str, Any]) -> Reply:
    return Reply(status, json.dumps(body).encode())


def test_push_creates_the_folder_once_and_overwrites_by_uid() -> None:
    models = catalog.dashboards()
    with GrafanaStandIn() as grafana:
        first = push(grafana.url, "good-token", models)
        second = push(grafana.url, "good-token", models)
    assert [p.uid for p in first] == list(models) and {p.version for p in first} == {1}
    assert [p.uid for p in second] == list(models) and {p.version for p in second} == {2}
    assert grafana.folders == {"convowatch": "convowatch"}
    assert [path for path, _ in grafana.posted].count("/api/folders") == 1
    saves = [body for path, body in grafana.posted if path == "/api/dashboards/db"]
    assert len(saves) == 2 * len(models)
    assert all(b["overwrite"] is True and b["folderUid"] == "convowatch" and b["dashboard"]["id"] is None for b in saves)
    assert [b["dashboard"]["uid"] for b in saves] == list(models) * 2
    assert saves[0]["dashboard"]["panels"] == models[saves[0]["dashboard"]["uid"]]["panels"]
    assert set(grafana.dashboards) == set(models)  # one copy each


def test_push_into_another_folder() -> None:
    with GrafanaStandIn() as grafana:
        push(grafana.url, "good-token", catalog.dashboards(), folder="Quality monitoring")
    assert grafana.folders == {"Quality-monitoring": "Quality monitoring"}


def test_wrong_token_is_an_auth_error_that_does_not_echo_the_token() -> None:
    with GrafanaStandIn() as grafana:
        with pytest.raises(PushError, match="401 Unauthorized") as e:
            push(grafana.url, "wrong-token-value", catalog.dashboards())
        with pytest.raises(PushError, match="no token given: set CONVOWATCH_GRAFANA_TOKEN"):
            push(grafana.url, None, catalog.dashboards())
    assert "wrong-token-value" not in str(e.value)
    assert "CONVOWATCH_GRAFANA_TOKEN" in str(e.value)
    assert grafana.posted == []


def test_a_viewer_token_is_a_permission_error() -> None:
    with GrafanaStandIn(viewer=True) as grafana:
        with pytest.raises(PushError, match=r"403 Forbidden\): the token needs the Editor role"):
            push(grafana.url, "good-token", catalog.dashboards())
    assert grafana.dashboards == {}


def test_grafana_older_than_10_is_refused_before_anything_is_written() -> None:
    with GrafanaStandIn(version="9.5.3") as grafana:
        with pytest.raises(PushError, match=r"version 9.5.3; convowatch's dashboards need Grafana 10 or newer"):
            push(grafana.url, "good-token", catalog.dashboards())
    assert [r.path for r in grafana.server.received] == ["/api/health"]


def test_other_http_errors_name_the_status_and_grafanas_message() -> None:
    with GrafanaStandIn(dashboard_status=500) as grafana:
        with pytest.raises(
            PushError, match=r"failed while saving dashboard 'convowatch-overview' \(500 server error\): database is locked"
        ):
            push(grafana.url, "good-token", catalog.dashboards())
    with GrafanaStandIn(dashboard_status=422) as grafana:
        with pytest.raises(PushError, match=r"answered 422 while saving dashboard"):
            push(grafana.url, "good-token", catalog.dashboards())


def test_push_command_uses_the_token_from_the_environment() -> None:
    with GrafanaStandIn() as grafana:
        ok = convowatch("dashboards", "push", "--url", grafana.url, env={"CONVOWATCH_GRAFANA_TOKEN": "good-token"})
        bad = convowatch("dashboards", "push", "--url", grafana.url, env={"CONVOWATCH_GRAFANA_TOKEN": "leaked-if-printed"})
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.count("pushed convowatch-") == len(UIDS)
    assert bad.returncode == 2
    assert bad.stderr.startswith("convowatch: error: Grafana at") and "401" in bad.stderr
    assert "leaked-if-printed" not in bad.stdout + bad.stderr


def test_push_command_to_a_closed_port_is_one_error_line() -> None:
    r = convowatch("dashboards", "push", "--url", f"http://{LOCALHOST}:{closed_port()}", "--timeout", "5")
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and "is unreachable" in r.stderr, r.stderr


def test_the_dsat_hit_rule_and_its_sql_agree(store_factory) -> None:
    """`convowatch summary`/report (stream/) and the Rubrics dashboard take the DSAT-hit rule from scorers.rubrics:
    its SQL form, run on the engine, says what `is_dsat_hit` says."""
    from scorers.rubrics import dsat_hit_sql, is_dsat_hit

    store = store_factory()
    cases = [("dsat", -HIT_RATING), ("dsat", -HIT_RATING + 0.1), ("dsat", -10.0), ("dsat", 0.0), ("sat", -10.0), ("sat", 7.0)]
    for polarity, score in cases:
        [row] = store.query(
            f"SELECT ({dsat_hit_sql('r')}) AS hit FROM (SELECT {{p:String}} AS polarity, {{s:Float64}} AS score) AS r",
            {"p": polarity, "s": score},
        )
        assert bool(row["hit"]) == is_dsat_hit(polarity, score), (polarity, score)
    assert is_dsat_hit("dsat", -HIT_RATING) and not is_dsat_hit("dsat", -HIT_RATING + 0.1)
