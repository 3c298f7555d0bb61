"""No conversation id, product or model version can change what a dashboard's SQL does (issue 54, item 3).

Every ClickHouse query of every dashboard is expanded the way Grafana documents its variable formats
(tests/grafana_macros.py: ``percentencode`` is encodeURIComponent with ``!'()*`` encoded too, a
multi-value selection as ``{v1,v2}``; ``singlequote`` leaves ``\\`` alone) and run on the real chDB
engine against rows written by the real store, whose ids and attributes are hostile: quotes,
backslashes, comments, UNION, newlines, unicode, 256 characters. Each drill-down panel must return
exactly the selected conversation's rows, each filtered panel exactly the selected products' rows.
On the dashboards that used ``${conversation_id:singlequote}`` the stored id ``a-sqli\\' OR 1=1 --``
returned every conversation's turns. Last, the provisioned Grafana datasource is the read-only user whose
DDL deploy/production/README.md documents, and ClickHouse's parser accepts that DDL.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from dashboards import catalog
from dashboards.datasources import CLICKHOUSE_UID
from stream.contract import MAX_CONVERSATION_ID_CHARS
from stream.records import ClosedConversation, DimensionPrediction, RubricHit, ScoreRecord, TurnRecord
from tests.chdb_fixture import chdb_dsn, chdb_store, store_factory  # noqa: F401
from tests.grafana_macros import ALL, MacroError, expand_sql, percentencode, singlequote, sqlstring

T0 = 1_707_480_000.0  # 2024-02-09 12:00 UTC
START = datetime.fromtimestamp(T0 - 3600, tz=UTC)
END = datetime.fromtimestamp(T0 + 3600, tz=UTC)

# on the singlequote dashboards this id made "Turns" return the server version and every stored conversation id
_UNION = "u\\' UNION ALL SELECT 0 AS turn, currentUser(), now64(3), concat(version(), conversation_id) FROM conversations --"
HOSTILE_IDS = [
    "a-sqli\\' OR 1=1 --",  # the issue's id: singlequote gives 'a-sqli\\' OR 1=1 --'
    "x' OR '1'='1",
    "ends-in-backslash\\",
    "\\",
    "c/* comment */ -- # ;",
    "line1\nline2' OR 1=1\n--",
    "会話-🙂-ü\u200b-\u202e",
    "%27%20OR%201%3D1%20--",  # already percent-encoded: decoded once, not twice
    "{plain-0,plain-1}",  # the shape of a multi-value selection
    "$__timeFilter(x) ${product} $conversation_id",
    "tab\there\x00nul",
    (_UNION + " " + "x" * MAX_CONVERSATION_ID_CHARS)[:MAX_CONVERSATION_ID_CHARS],
]
PLAIN_IDS = ["plain-0", "plain-1"]
HOSTILE_PRODUCTS = ["p\\' OR 1=1 --", "p' OR product != '", "p,comma", "p}{"]
DRILL_DOWN_PANELS = ("Turns", "Scores", "Rubric scores", "Calibrated dimensions")


def conversations() -> list[tuple[str, str]]:
    """(conversation id, product) of every stored conversation: hostile and plain ids, hostile products."""
    ids = PLAIN_IDS + HOSTILE_IDS
    products = ["chat", "search", *HOSTILE_PRODUCTS]
    return [(cid, products[i % len(products)]) for i, cid in enumerate(ids)]


def record(i: int, cid: str, product: str) -> ScoreRecord:
    """A scored conversation whose every row (turns, rubric, dimension) carries a value unique to it."""
    closed_at = T0 + 60
    turns = (
        TurnRecord(0, "user", f"question of #{i}", closed_at - 50),
        TurnRecord(1, "assistant", f"answer #{i}", closed_at - 49),
    )
    conversation = ClosedConversation(
        conversation_id=cid,
        turns=turns,
        attributes={"product": product, "model_version": "m1"},
        close_cause="end",
        closed_at=closed_at,
        first_event_at=closed_at - 50,
        last_event_at=closed_at - 49,
    )
    return ScoreRecord(
        conversation=conversation,
        status="scored",
        scorer_version="v1",
        judge="recorded:test",
        rubric_set_version="rs1",
        calibrator_version="cal1",
        scored_at=T0 + 100,
        attempts=1,
        netsat=-float(i),
        label="dsat",
        threshold_label="dsat",
        main_question_id="Q0",
        main_probabilities=(0.25, 0.25, 0.25, 0.25),
        main_expected_value=2.0,
        dissatisfaction_probability=0.5,
        dimensions=(DimensionPrediction(f"Q{i}", (0.25, 0.25, 0.25, 0.25), 1.5),),
        rubrics=(RubricHit(f"D{i}", "dsat", -8.0),),
        inclusion_probability=1.0,
    )


@pytest.fixture
def hostile_store(store_factory):
    store = store_factory()
    store.write_scores([record(i, cid, product) for i, (cid, product) in enumerate(conversations())])
    return store


def run(store, panel: str, variables: dict[str, Any]) -> list[dict[str, Any]]:
    (expr,) = {q.expr for q in catalog.queries() if q.kind == "clickhouse" and q.panel == panel}
    values = {"product": ALL, "model_version": ALL, "conversation_id": "", **variables}
    return store.query(expand_sql(expr, start=START, end=END, variables=values, interval_s=600))


def test_grafanas_formats_are_expanded_as_its_format_registry_defines_them() -> None:
    # the examples of Grafana's "Advanced variable format options" page and its format registry
    assert percentencode(["foo()bar BAZ", "test2"]) == "%7Bfoo%28%29bar%20BAZ%2Ctest2%7D"
    assert percentencode("a!'()*~-_.b/€") == "a%21%27%28%29%2A~-_.b%2F%E2%82%AC"
    assert singlequote("a\\'b") == "'a\\\\'b'"  # the backslash is left alone: ClickHouse reads \\ then '
    assert sqlstring("it's \\\"") == "'it''s \\\\\"'"
    with pytest.raises(MacroError):
        percentencode("\ud800")  # a lone surrogate: encodeURIComponent raises URIError


def test_no_dashboard_sql_holds_a_quoting_format() -> None:
    """Only percentencode reaches SQL: the formats that quote leave some character able to end the literal."""
    for query in (q for q in catalog.queries() if q.kind == "clickhouse"):
        for fmt in ("singlequote", "doublequote", "sqlstring", "csv", "raw", "queryparam", "json"):
            assert f":{fmt}}}" not in query.expr, (query.dashboard, query.panel, fmt)


@pytest.mark.parametrize("cid", HOSTILE_IDS, ids=[f"id{i}" for i in range(len(HOSTILE_IDS))])
def test_drill_down_panels_show_exactly_the_selected_conversation(hostile_store, cid: str) -> None:
    i = [c for c, _ in conversations()].index(cid)
    turns = run(hostile_store, "Turns", {"conversation_id": cid})
    assert [(r["turn"], r["role"], r["text"]) for r in turns] == [
        (0, "user", f"question of #{i}"),
        (1, "assistant", f"answer #{i}"),
    ]
    scores = run(hostile_store, "Scores", {"conversation_id": cid})
    assert [(r["scorer_version"], r["netsat"]) for r in scores] == [("v1", -float(i))]
    assert [r["rubric"] for r in run(hostile_store, "Rubric scores", {"conversation_id": cid})] == [f"D{i}"]
    assert [r["dimension"] for r in run(hostile_store, "Calibrated dimensions", {"conversation_id": cid})] == [f"Q{i}"]


def test_every_clickhouse_query_runs_with_hostile_values_and_filters_exactly(hostile_store) -> None:
    stored = conversations()
    for j, cid in enumerate(HOSTILE_IDS):
        variables = {"product": [HOSTILE_PRODUCTS[j % len(HOSTILE_PRODUCTS)]], "model_version": ["m1"], "conversation_id": cid}
        for query in (q for q in catalog.queries() if q.kind == "clickhouse"):
            hostile_store.query(expand_sql(query.expr, start=START, end=END, variables=variables, interval_s=600))
    for product in HOSTILE_PRODUCTS:
        worst = run(hostile_store, "Worst recent conversations", {"product": [product]})
        assert sorted(r["conversation_id"] for r in worst) == sorted(c for c, p in stored if p == product), product
    two = [HOSTILE_PRODUCTS[0], HOSTILE_PRODUCTS[1]]
    worst = run(hostile_store, "Worst recent conversations", {"product": two})
    assert sorted(r["conversation_id"] for r in worst) == sorted(c for c, p in stored if p in two)
    assert run(hostile_store, "Worst recent conversations", {"product": ["no-such-product' OR 1=1 --"]}) == []


# --- the read-only user Grafana connects as -----------------------------------------------------------

ROOT = Path(__file__).resolve().parents[2]
DATASOURCES = ROOT / "deploy" / "grafana" / "provisioning" / "datasources" / "convowatch.yml"
PRODUCTION_README = ROOT / "deploy" / "production" / "README.md"


def documented_grafana_user_ddl() -> list[str]:
    """The statements of the ```sql block under "Grafana's ClickHouse user" in deploy/production/README.md."""
    text = PRODUCTION_README.read_text(encoding="utf-8")
    section = text.split("## Grafana's ClickHouse user", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```sql\n(.*?)```", section, re.S)
    assert block, "no ```sql block in the Grafana user section"
    return [" ".join(s.split()) for s in block.group(1).split(";") if s.strip()]


def test_the_provisioned_datasource_is_the_documented_read_only_user(hostile_store) -> None:
    (clickhouse,) = [s for s in yaml.safe_load(DATASOURCES.read_text())["datasources"] if s["uid"] == CLICKHOUSE_UID]
    user = clickhouse["jsonData"]["username"]
    assert user not in ("", "default")
    assert clickhouse["secureJsonData"]["password"] == "$CONVOWATCH_GRAFANA_CLICKHOUSE_PASSWORD"  # Grafana's env
    create, grant = documented_grafana_user_ddl()
    assert create.startswith(f"CREATE USER IF NOT EXISTS {user} ")
    assert "SETTINGS readonly = 1," in create and f"DEFAULT DATABASE {clickhouse['jsonData']['defaultDatabase']}" in create
    assert grant == f"GRANT SELECT ON {clickhouse['jsonData']['defaultDatabase']}.* TO {user}"
    for statement in (create, grant):  # ClickHouse's own parser accepts them (chDB cannot run them: it has no users)
        assert hostile_store.query(f"EXPLAIN AST {statement}")
