"""Alert rules as code: the committed files, promtool, amtool, a real Alertmanager, the runbooks.

Prometheus rules are checked and unit-tested by the real ``promtool``
(``dashboards/alerts/tests/*.test.yml``: fire and not-fire cases
for every alert). The Grafana-managed rules are held to the same unit tests:
their queries and math condition, translated back into a PromQL alert, must
fire in exactly the same cases with the same values. The Alertmanager example
is checked by ``amtool`` and its inhibition by a real Alertmanager.
"""

from __future__ import annotations

import concurrent.futures
import json
import math
import os
import re
import runpy
import shutil
import subprocess
import typing
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from dashboards import alert_files, datasources
from dashboards.alert_rules import (
    ALERT_NAMES,
    AlertWindows,
    AlertWindowsError,
    recording_names,
    rule_expressions,
    rules,
    rules_yaml,
)
from dashboards.alert_specs import SEVERITIES
from dashboards.grafana_alerts import CONDITION, EXPRESSION_UID, grafana_alerts_json, grafana_rule_groups, promql_expressions
from scorers.rubrics import Label
from stream.assembly import Outcome
from stream.feedback_labels import FeedbackLabel
from stream.metrics import UNSAMPLED, ServiceMetrics, metric_names
from tests.chdb_fixture import chdb_dsn, chdb_store, store_factory  # noqa: F401
from tests.infra import AlertmanagerFactory, alertmanager, wait_for  # noqa: F401

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / alert_files.RULES
UNIT_TESTS = sorted((REPO / "dashboards" / "alerts" / "tests").glob("*.yml"))
ALERTMANAGER = REPO / "deploy" / "production" / "alertmanager.yml"
RUNBOOKS = REPO / "docs" / "runbooks.md"
# Windows an end-to-end test can wait for (as in tests/integration/test_monitoring_e2e.py).
COMPRESSED = AlertWindows(
    short="20s", baseline="2m", for_="5s", min_conversations=10, min_lift=0.02, yesterday="1m", stall_for="30s"
)
METRIC = re.compile(r"\bconvowatch_[a-z0-9_]+")
RECORDED = re.compile(r"\bconvowatch:[a-z0-9_:]+")
WINDOW = re.compile(r"\[[^\]]+\](?: offset \w+)?")  # a range and its offset
# A guard against a hung tool, not a speed target. ``promtool test rules`` on the day-long group takes ~26 s on an idle
# 2-core host; on a CI host with `make lint` beside it and a quarter of the cores stolen it passed 120 s.
TOOL_TIMEOUT_S = 120
RULE_TESTS_TIMEOUT_S = 900


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not on PATH: apt-get install -y --no-install-recommends prometheus prometheus-alertmanager")
    return path


def _run(argv: list[str], cwd: Path = REPO, timeout_s: float = TOOL_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout_s)


def _ok(argv: list[str], cwd: Path = REPO, timeout_s: float = TOOL_TIMEOUT_S) -> str:
    done = _run(argv, cwd, timeout_s)
    assert done.returncode == 0, f"{' '.join(argv)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
    return done.stdout


def _alerting_rules(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for g in doc["groups"] for r in g["rules"] if "alert" in r]


def _grafana_rules(w: AlertWindows = AlertWindows()) -> list[dict[str, Any]]:
    return [r for g in grafana_rule_groups(w)["groups"] for r in g["rules"]]


# --- committed files ----------------------------------------------------------------------------


def test_committed_alert_files_match_their_generators() -> None:
    assert alert_files.check() == []
    assert RULES.read_text(encoding="utf-8") == rules_yaml(AlertWindows())
    assert json.loads((REPO / alert_files.GRAFANA_JSON).read_text(encoding="utf-8")) == grafana_rule_groups()
    provisioning = yaml.safe_load((REPO / alert_files.GRAFANA_PROVISIONING).read_text(encoding="utf-8"))
    assert provisioning == grafana_rule_groups()


def test_check_names_a_stale_or_missing_file(tmp_path: Path) -> None:
    alert_files.write(tmp_path)
    assert alert_files.check(tmp_path) == []
    (tmp_path / alert_files.RULES).write_text("groups: []\n", encoding="utf-8")
    (tmp_path / alert_files.GRAFANA_JSON).unlink()
    assert alert_files.check(tmp_path) == [
        f"{alert_files.RULES}: differs from its generator (run `convowatch dashboards build`)",
        f"{alert_files.GRAFANA_JSON}: missing (run `convowatch dashboards build`)",
    ]


def test_rendering_is_deterministic_and_names_windows() -> None:
    assert rules_yaml(COMPRESSED) == rules_yaml(COMPRESSED)
    assert grafana_alerts_json(COMPRESSED) == grafana_alerts_json(COMPRESSED)
    assert "convowatch:calibrated_dsat_rate:ratio_rate10m" in recording_names()
    assert "convowatch:calibrated_dsat_rate:ratio_rate20s" in recording_names(COMPRESSED)
    assert "convowatch:calibrated_dsat_rate:ratio_rate20s_offset1m" in recording_names(COMPRESSED)
    assert not any("10m" in name or "6h" in name for name in recording_names(COMPRESSED))
    spike = next(r for r in _alerting_rules(rules(COMPRESSED)) if r["alert"] == "ConvowatchDissatisfactionSpike")
    assert spike["for"] == "5s"
    assert "convowatch:calibrated_weight:increase20s >= 10" in spike["expr"]
    assert "convowatch:calibrated_dsat_sampling_variance:increase20s" in spike["expr"]


# --- promtool -----------------------------------------------------------------------------------


def test_promtool_checks_the_committed_and_a_compressed_rule_file(tmp_path: Path) -> None:
    out = _ok([_tool("promtool"), "check", "rules", str(RULES)])
    assert f"SUCCESS: {len(recording_names()) + len(ALERT_NAMES)} rules found" in out
    compressed = tmp_path / "compressed.rules.yml"
    compressed.write_text(rules_yaml(COMPRESSED), encoding="utf-8")
    _ok([_tool("promtool"), "check", "rules", str(compressed)])


def test_promtool_refuses_a_broken_rule_file(tmp_path: Path) -> None:
    """The check above can fail: an alert reading an undefined PromQL function is refused."""
    broken = tmp_path / "broken.rules.yml"
    broken.write_text(rules_yaml().replace("clamp_min(", "clamp_minimum("), encoding="utf-8")
    done = _run([_tool("promtool"), "check", "rules", str(broken)])
    assert done.returncode != 0 and "clamp_minimum" in done.stdout + done.stderr


def _promtool_test_rules(tests_dir: Path, unit_tests: list[Path]) -> None:
    """``promtool test rules`` on ``unit_tests``, one process per test group, as many at once as there are cores.

    promtool runs a file's groups one after another on one core; the day-long dissatisfaction group alone takes
    ~26 s of the ~46 s on the 2-core Intel host. Each group is written beside the others under ``tests_dir`` so
    that its ``rule_files`` path stays what it is.
    """
    argvs = []
    for path in unit_tests:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
        for i, group in enumerate(doc["tests"]):
            part = tests_dir / f"{path.name.removesuffix('.test.yml')}.{i}.test.yml"
            part.write_text(yaml.safe_dump({**doc, "tests": [group]}, sort_keys=False), encoding="utf-8")
            argvs.append([_tool("promtool"), "test", "rules", str(part)])
    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        outs = list(pool.map(lambda argv: _ok(argv, timeout_s=RULE_TESTS_TIMEOUT_S), argvs))
    assert len(outs) > len(unit_tests) and all("SUCCESS" in out for out in outs)


def test_promtool_unit_tests_pass(tmp_path: Path) -> None:
    assert UNIT_TESTS, "no promtool unit tests under dashboards/alerts/tests"
    shutil.copy(REPO / "dashboards" / "alerts" / "convowatch.rules.yml", tmp_path / "convowatch.rules.yml")
    (tmp_path / "tests").mkdir()
    _promtool_test_rules(tmp_path / "tests", UNIT_TESTS)


def test_unit_test_file_is_what_its_model_writes() -> None:
    """The expectations in the promtool tests come from make_unit_tests.py's model of the rules."""
    model = runpy.run_path(str(REPO / "dashboards" / "alerts" / "tests" / "make_unit_tests.py"))
    written = model["files"]()
    assert sorted(written) == UNIT_TESTS
    for path, text in written.items():
        assert path.read_text(encoding="utf-8") == text, path.name


def test_unit_tests_have_fire_and_not_fire_cases_for_every_alert() -> None:
    cases: dict[str, set[bool]] = {name: set() for name in ALERT_NAMES}
    for path in UNIT_TESTS:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
        assert doc["rule_files"] == ["../convowatch.rules.yml"]
        for test in doc["tests"]:
            for case in test.get("alert_rule_test", []):
                cases[case["alertname"]].add(bool(case.get("exp_alerts")))
    assert {name: sorted(seen) for name, seen in cases.items()} == {name: [False, True] for name in ALERT_NAMES}


def _grafana_as_promql(rule: dict[str, Any]) -> str:
    """A Grafana rule's condition as one PromQL expression: its math clauses over its queries, joined with ``and``."""
    queries = {d["refId"]: d["model"]["expr"] for d in rule["data"] if d["datasourceUid"] == datasources.PROMETHEUS_UID}
    (expression,) = [d["model"]["expression"] for d in rule["data"] if d["refId"] == rule["condition"]]
    clauses = []
    for conjunct in expression.split(" && "):
        m = re.fullmatch(r"\$(\w+) (>|>=|<|==) (\$\w+|[0-9.]+)", conjunct)
        assert m, f"{rule['title']}: unexpected math clause {conjunct!r}"
        right = f"({queries[m[3][1:]]})" if m[3].startswith("$") else m[3]
        clauses.append(f"({queries[m[1]]}) {m[2]} {right}")
    return "\nand\n".join(clauses)


def test_grafana_rules_fire_in_exactly_the_promtool_cases(tmp_path: Path) -> None:
    """The Prometheus unit tests, run against the Grafana rules' queries and conditions instead of the alert expressions."""
    doc = rules()
    grafana = {r["title"]: _grafana_as_promql(r) for r in _grafana_rules()}
    for rule in _alerting_rules(doc):
        rule["expr"] = grafana[rule["alert"]]
    (tmp_path / "convowatch.rules.yml").write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    (tmp_path / "tests").mkdir()
    _promtool_test_rules(tmp_path / "tests", UNIT_TESTS)


# --- Grafana rules ------------------------------------------------------------------------------


def test_grafana_rules_use_only_the_convowatch_prometheus_datasource_and_a_math_condition() -> None:
    doc = grafana_rule_groups()
    assert doc["apiVersion"] == 1
    (group,) = doc["groups"]
    assert {k: group[k] for k in ("orgId", "name", "folder", "interval")} == {
        "orgId": 1,
        "name": "convowatch",
        "folder": "convowatch",
        "interval": "1m",
    }
    assert [r["title"] for r in group["rules"]] == list(ALERT_NAMES)
    assert len({r["uid"] for r in group["rules"]}) == len(ALERT_NAMES)
    for rule in group["rules"]:
        refs = [d["refId"] for d in rule["data"]]
        assert len(refs) == len(set(refs)) and rule["condition"] == CONDITION == refs[-1]
        for d in rule["data"][:-1]:
            assert d["datasourceUid"] == datasources.PROMETHEUS_UID
            assert d["model"]["datasource"] == {"type": "prometheus", "uid": datasources.PROMETHEUS_UID}
            assert d["model"]["instant"] is True and d["model"]["refId"] == d["refId"]
        condition = rule["data"][-1]
        assert condition["datasourceUid"] == EXPRESSION_UID and condition["model"]["type"] == "math"
        assert set(re.findall(r"\$(\w+)", condition["model"]["expression"])) <= set(refs[:-1])
        assert rule["noDataState"] == "OK" and rule["for"] == "10m"


def _metrics_of_prometheus_alert(alert: dict[str, Any], recorded: dict[str, str]) -> set[str]:
    names = set(METRIC.findall(alert["expr"]))
    for name in RECORDED.findall(alert["expr"]):
        names |= set(METRIC.findall(recorded[name]))
    return names


@pytest.mark.parametrize("windows", [AlertWindows(), COMPRESSED], ids=["production", "compressed"])
def test_grafana_queries_read_the_same_metrics_and_windows_as_the_prometheus_alerts(windows: AlertWindows) -> None:
    doc = rules(windows)
    recorded = {r["record"]: r["expr"] for g in doc["groups"] for r in g["rules"] if "record" in r}
    prometheus = {a["alert"]: a for a in _alerting_rules(doc)}
    for rule in _grafana_rules(windows):
        alert = prometheus[rule["title"]]
        text = " ".join(d["model"]["expr"] for d in rule["data"] if d["datasourceUid"] == datasources.PROMETHEUS_UID)
        assert set(METRIC.findall(text)) == _metrics_of_prometheus_alert(alert, recorded), rule["title"]
        expanded = RECORDED.sub(lambda m: recorded[m[0]], alert["expr"])
        assert set(WINDOW.findall(text)) == set(WINDOW.findall(expanded)), rule["title"]
        assert rule["labels"] == alert["labels"] and rule["for"] == alert["for"]
        assert rule["annotations"]["runbook_url"] == alert["annotations"]["runbook_url"]
    assert set(promql_expressions(windows)) == {
        d["model"]["expr"] for r in _grafana_rules(windows) for d in r["data"] if d["datasourceUid"] == datasources.PROMETHEUS_UID
    }


# --- severities, runbooks, metric names ---------------------------------------------------------


def _anchors(markdown: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation except - and _ dropped, spaces to -."""
    headings = re.findall(r"^#+ (.+)$", markdown, flags=re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def test_every_alert_has_a_severity_and_a_runbook_whose_anchor_exists() -> None:
    anchors = _anchors(RUNBOOKS.read_text(encoding="utf-8"))
    prometheus = _alerting_rules(rules())
    assert [a["alert"] for a in prometheus] == list(ALERT_NAMES)
    for rule in prometheus + _grafana_rules():
        assert rule["labels"]["severity"] in SEVERITIES
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]
        base, anchor = rule["annotations"]["runbook_url"].split("#")
        assert base == "docs/runbooks.md" and anchor in anchors, rule["annotations"]["runbook_url"]
    assert {a["labels"]["severity"] for a in prometheus} == set(SEVERITIES)


def _fed_exporter() -> set[str]:
    """Sample names of a real ServiceMetrics after the events the stream package counts (same label values)."""
    m = ServiceMetrics()
    attrs = m.attribute_values({"product": "shop", "model_version": "v1"})
    m.events.labels("turn", "accepted").inc()
    m.events.labels("end", "closed").inc()
    m.dead_letters.labels("not_json").inc()
    m.conversations_scored.labels("uncertain", *attrs).inc()
    m.conversations_unscored.labels("JudgeUnavailable", *attrs).inc()
    m.calibrated_conversations.labels(*attrs).inc()
    m.calibrated_dissatisfaction.labels(*attrs).inc(0.3)
    m.calibrated_dissatisfaction_squared.labels(*attrs).inc(0.09)
    m.conversations_sampled.labels("unsampled", "rate", *attrs).inc()
    m.scored_weight.labels("uncertain", *attrs).inc(2)
    m.scored_sampling_variance.labels("uncertain", *attrs).inc(2)
    m.calibrated_weight.labels(*attrs).inc(2)
    m.calibrated_dissatisfaction_weighted.labels(*attrs).inc(0.6)
    m.calibrated_dissatisfaction_squared_weighted.labels(*attrs).inc(0.18)
    m.calibrated_sampling_variance.labels(*attrs).inc(2)
    m.calibrated_dissatisfaction_sampling_variance.labels(*attrs).inc(0.6)
    m.calibrated_dissatisfaction_squared_sampling_variance.labels(*attrs).inc(0.18)
    m.judge_latency.labels("recorded").observe(0.2)
    m.judge_errors.labels("recorded", "JudgeUnavailable").inc()
    m.judge_budget_wait.labels("tokens_per_day").inc(1)
    m.behaviour_turns_weight.labels(*attrs).inc(4)
    m.behaviour_turns_squared_variance.labels(*attrs).inc(16)
    m.behaviour_hits_weight.labels("ignore", *attrs).inc(1)
    m.behaviour_hits_turns_variance.labels("ignore", *attrs).inc(4)
    m.behaviour_hits_squared_variance.labels("ignore", *attrs).inc(1)
    m.behaviour_error.labels("ignore").set(1)
    m.user_feedback_conversations.labels("s1", "dsat", "negative", *attrs).inc()
    m.broker_lost_data.labels("convowatch.scores").inc()
    m.quarantined_records.labels("assemble").inc()
    m.set_consumer_lag({("convowatch.events", 0): 3})
    m.scoring_attempts.labels("JudgeUnavailable").inc()
    m.sink_rows.labels("conversation_scores").inc()
    return set(metric_names(m))


def test_every_metric_in_the_rules_is_exported() -> None:
    exported = _fed_exporter()
    for windows in (AlertWindows(), COMPRESSED):
        used = {name for expr in rule_expressions(windows) + promql_expressions(windows) for name in METRIC.findall(expr)}
        assert used and used <= exported, sorted(used - exported)


def test_label_values_in_the_rules_are_ones_the_service_emits() -> None:
    text = "\n".join(rule_expressions() + promql_expressions())
    assert set(re.findall(r'outcome="(\w+)"', text)) == {"closed"} <= set(typing.get_args(Outcome))
    assert set(re.findall(r'label="(\w+)"', text)) == {"uncertain", "sat", "dsat"} <= set(typing.get_args(Label))
    assert set(re.findall(r'label=~"([\w|]+)"', text)) == {"sat|dsat"}
    # the feedback values the scorer counts rated conversations under (FeedbackLabelRules, conflicts apart)
    assert set(re.findall(r'feedback="(\w+)"', text)) == {"positive", "negative"}
    assert set(re.findall(r'feedback=~"([\w|]+)"', text)) == {"positive|negative"}
    assert set(typing.get_args(FeedbackLabel)) == {"positive", "negative", "conflict"}
    assert set(re.findall(r'decision="(\w+)"', text)) == {UNSAMPLED}
    by = set(re.findall(r"by \(([^)]*)\)", text))
    assert by == {
        "product, model_version",
        "judge",
        "limit",
        "behaviour",
        "behaviour, product, model_version",
        "scorer_version, product, model_version",
        "topic",
        "stage",
        "instance",  # the scrape target, which Prometheus adds to every series
    }
    m = ServiceMetrics()
    assert "topic" in m.consumer_lag._labelnames
    assert m.broker_lost_data._labelnames == ("topic",)
    assert m.quarantined_records._labelnames == ("stage",)
    assert "judge" in m.judge_errors._labelnames and "judge" in m.judge_latency._labelnames
    assert {"product", "model_version"} <= set(m.calibrated_conversations._labelnames)
    assert {"behaviour", "product", "model_version"} <= set(m.behaviour_hits_squared_variance._labelnames)
    assert m.behaviour_error._labelnames == ("behaviour",)
    assert m.user_feedback_conversations._labelnames == ("scorer_version", "label", "feedback", "product", "model_version")


# --- AlertWindows -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"short": "10x"}, r"AlertWindows\.short: '10x' is not a Prometheus duration"),
        ({"baseline": "6 h"}, r"AlertWindows\.baseline: '6 h' is not a Prometheus duration"),
        ({"short": "1.5m"}, r"AlertWindows\.short: '1\.5m' is not a Prometheus duration"),
        ({"short": ""}, r"AlertWindows\.short: '' is not a Prometheus duration"),
        ({"for_": "m10"}, r"AlertWindows\.for_: 'm10' is not"),
        ({"stall_for": "0s"}, r"AlertWindows\.stall_for: '0s' must be longer than 0s"),
        ({"short": "6h"}, r"AlertWindows\.short \(6h\) must be shorter than baseline \(6h\)"),
        ({"short": "2h", "baseline": "1h"}, r"AlertWindows\.short \(2h\) must be shorter than baseline \(1h\)"),
        ({"yesterday": "5m"}, r"AlertWindows\.yesterday \(5m\) must be at least the short window \(10m\)"),
        ({"min_conversations": 0}, r"AlertWindows\.min_conversations: 0 must be a whole number >= 1"),
        ({"min_conversations": 10.5}, r"AlertWindows\.min_conversations: 10\.5 must be a whole number >= 1"),
        ({"judge_min_attempts": True}, r"AlertWindows\.judge_min_attempts: True must be a whole number >= 1"),
        ({"z": 0}, r"AlertWindows\.z: 0 must be > 0"),
        ({"z": math.nan}, r"AlertWindows\.z: nan must be a finite number"),
        ({"min_lift": 1.0}, r"AlertWindows\.min_lift: 1\.0 must be in \[0, 1\)"),
        ({"behaviour_min_lift": -0.1}, r"AlertWindows\.behaviour_min_lift: -0\.1 must be in \[0, 1\)"),
        ({"behaviour_min_turns": 0}, r"AlertWindows\.behaviour_min_turns: 0 must be a whole number >= 1"),
        ({"dead_letter_ratio": 0}, r"AlertWindows\.dead_letter_ratio: 0 must be in \(0, 1\)"),
        ({"judge_error_ratio": "0.1"}, r"AlertWindows\.judge_error_ratio: '0\.1' must be a finite number"),
    ],
)
def test_alert_windows_refuses_bad_values_naming_the_field(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(AlertWindowsError, match=message):
        AlertWindows(**kwargs)
    assert issubclass(AlertWindowsError, ValueError)


def test_alert_windows_accepts_compressed_and_compound_durations() -> None:
    w = AlertWindows(short="1m30s", baseline="1h30m", for_="0s", yesterday="1w")
    assert (w.seconds("short"), w.seconds("baseline"), w.seconds("for_"), w.seconds("yesterday")) == (90, 5400, 0, 604800)
    assert COMPRESSED.seconds("short") == 20


# --- Alertmanager -------------------------------------------------------------------------------


def test_amtool_checks_the_alertmanager_config() -> None:
    out = _ok([_tool("amtool"), "check-config", str(ALERTMANAGER)])
    assert "SUCCESS" in out


@pytest.mark.parametrize(
    ("labels", "receiver"),
    [
        (["severity=page", "alertname=ConvowatchDissatisfactionSpike", "product=shop", "model_version=v1"], "page"),
        (["severity=page", "alertname=ConvowatchPipelineStalled"], "page"),
        (["severity=ticket", "alertname=ConvowatchJudgeErrors", "judge=openai"], "ticket"),
        (["alertname=SomethingElse"], "ticket"),
    ],
)
def test_alertmanager_routes_by_severity(labels: list[str], receiver: str) -> None:
    out = _ok([_tool("amtool"), "config", "routes", "test", f"--config.file={ALERTMANAGER}", *labels])
    assert out.split() == [receiver]


def _post_alerts(url: str, alerts: list[dict[str, str]]) -> None:
    body = json.dumps([{"labels": labels, "annotations": {"summary": "test"}} for labels in alerts]).encode()
    request = urllib.request.Request(
        f"{url}/api/v2/alerts", data=body, headers={"Content-Type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 200


def _states(url: str) -> dict[tuple[str, str], str]:
    with urllib.request.urlopen(f"{url}/api/v2/alerts", timeout=10) as response:
        alerts = json.load(response)
    return {(a["labels"]["alertname"], a["labels"].get("model_version", "")): a["status"]["state"] for a in alerts}


def test_a_product_page_inhibits_its_tickets_only(alertmanager: AlertmanagerFactory, tmp_path: Path) -> None:
    """The production routing and inhibit rules in a real Alertmanager (receivers emptied: nothing leaves the machine)."""
    config = yaml.safe_load(ALERTMANAGER.read_text(encoding="utf-8"))
    config["receivers"] = [{"name": r["name"]} for r in config["receivers"]]
    path = tmp_path / "alertmanager.yml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    url = alertmanager.start(path)
    _post_alerts(
        url,
        [
            {"alertname": "ConvowatchDissatisfactionSpike", "severity": "page", "product": "shop", "model_version": "v1"},
            {
                "alertname": "ConvowatchDissatisfactionAboveYesterday",
                "severity": "ticket",
                "product": "shop",
                "model_version": "v1",
            },
            {"alertname": "ConvowatchUncertainSurge", "severity": "ticket", "product": "shop", "model_version": "v2"},
            {"alertname": "ConvowatchPipelineStalled", "severity": "page"},
            {"alertname": "ConvowatchDeadLetterSurge", "severity": "ticket"},
        ],
    )
    expected = {
        ("ConvowatchDissatisfactionSpike", "v1"): "active",
        ("ConvowatchDissatisfactionAboveYesterday", "v1"): "suppressed",  # same product and model version as the page
        ("ConvowatchUncertainSurge", "v2"): "active",  # another model version
        ("ConvowatchPipelineStalled", ""): "active",
        ("ConvowatchDeadLetterSurge", ""): "active",  # a page without a product inhibits nothing
    }
    wait_for(lambda: _states(url) == expected, timeout=15, what="Alertmanager to apply the inhibit rule")


# --- runbooks -----------------------------------------------------------------------------------


def test_runbook_queries_run_on_the_real_schema(store_factory) -> None:
    store = store_factory()
    blocks = re.findall(r"```sql\n(.*?)```", RUNBOOKS.read_text(encoding="utf-8"), flags=re.DOTALL)
    assert len(blocks) >= 4
    for sql in blocks:
        store.query(sql)  # raises on an unknown column or bad syntax
