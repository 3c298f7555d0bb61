"""The same alerts as Grafana-managed alert rules, for teams that alert in Grafana.

Built with the foundation SDK's alerting builders and serialised in Grafana's
alerting file-provisioning format (``apiVersion: 1``, ``groups`` with orgId,
name, folder, interval, rules): committed as
``dashboards/alerts/grafana/convowatch-alerts.json`` and as the provisioning
file ``deploy/grafana/provisioning/alerting/convowatch.yml``.

Each rule has one instant Prometheus query per ref of its `AlertSpec`
(datasource uid ``convowatch-prometheus``) and a math expression joining the
clauses per label set (``$P > $T && $N >= 50``), which is the rule's
condition: non-zero means firing. The queries read the exported metrics, not
the Prometheus recording rules (a Grafana-only team may not load them); they
are the Prometheus rules' series expressions, rendered from the same specs.

All of them translate faithfully: the same-time-yesterday comparison is plain
PromQL (``offset 1d``) evaluated by Prometheus, not a Grafana time shift.
Differences: the Prometheus rules show baseline values through ``query``
templates, Grafana through ``$values``; with no data (no traffic), Grafana
rules are OK, as a Prometheus rule with an empty result is.
"""

from __future__ import annotations

import json
import re
from typing import Any

from grafana_foundation_sdk.builders import alerting, expr, prometheus
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.alerting import RelativeTimeRange
from grafana_foundation_sdk.models.dashboard import DataSourceRef

from dashboards import datasources
from dashboards.alert_rules import dump_yaml
from dashboards.alert_specs import RUNBOOKS, AlertSpec, alert_specs, raw_lookup, runbook_url, unwrap
from dashboards.alert_windows import AlertWindows

ORG_ID = 1
FOLDER = "convowatch"
GROUP = "convowatch"
CONDITION = "C"
EXPRESSION_UID = "__expr__"  # Grafana's pseudo-datasource for server-side expressions
_PLACEHOLDER = re.compile(r"\{(\w+):([^{}]+)\}")
_PROVISIONED_RULE_KEYS = (
    "uid",
    "title",
    "condition",
    "data",
    "noDataState",
    "execErrState",
    "for",
    "annotations",
    "labels",
    "isPaused",
)


def _condition(spec: AlertSpec) -> str:
    def operand(text: str) -> str:
        return f"${text}" if text in spec.queries else text

    return " && ".join(f"${c.left} {c.op} {operand(c.right)}" for c in spec.clauses)


def _description(spec: AlertSpec) -> str:
    return _PLACEHOLDER.sub(lambda m: f"{{{{ $values.{m.group(1)}.Value | {m.group(2)} }}}}", spec.description)


def _rule(spec: AlertSpec, w: AlertWindows, runbooks: str) -> alerting.Rule:
    preview = RelativeTimeRange(from_val=int(w.seconds("baseline")), to=0)  # what the rule editor graphs; instant queries
    rule = (
        alerting.Rule(spec.name)
        .uid(spec.name.lower())
        .condition(CONDITION)
        .for_val(w.for_)
        .labels({"severity": spec.severity})
        .annotations(
            {"summary": spec.summary, "description": _description(spec), "runbook_url": runbook_url(spec.name, runbooks)}
        )
        .no_data_state("OK")
        .exec_err_state("Error")
        .is_paused(False)
    )
    for ref, promql in spec.queries.items():
        model = prometheus.Dataquery().expr(unwrap(promql)).instant().ref_id(ref).datasource(datasources.prometheus())
        rule.with_query(alerting.Query(ref).datasource_uid(datasources.PROMETHEUS_UID).model(model).relative_time_range(preview))
    math = (
        expr.TypeMath()
        .expression(_condition(spec))
        .ref_id(CONDITION)
        .datasource(DataSourceRef(type_val=EXPRESSION_UID, uid=EXPRESSION_UID))
    )
    return rule.with_query(alerting.Query(CONDITION).datasource_uid(EXPRESSION_UID).model(math))


def _specs(w: AlertWindows) -> list[AlertSpec]:
    specs = alert_specs(w, raw_lookup(w))
    for spec in specs:
        if CONDITION in spec.queries:
            raise ValueError(f"{spec.name}: query ref {CONDITION!r} is reserved for the condition")
    return specs


def grafana_rule_groups(windows: AlertWindows = AlertWindows(), runbooks: str = RUNBOOKS) -> dict[str, Any]:
    """The Grafana alerting provisioning document (``apiVersion: 1``, ``groups: [...]``) for ``windows``."""
    group = alerting.RuleGroup(GROUP).interval(int(windows.seconds("grafana_interval")))
    for spec in _specs(windows):
        group.with_rule(_rule(spec, windows, runbooks))
    built = json.loads(json.dumps(group.build(), cls=JSONEncoder))  # the SDK's API shape, as plain data
    rules = [{key: r[key] for key in _PROVISIONED_RULE_KEYS if key in r} for r in built["rules"]]
    return {
        "apiVersion": 1,
        "groups": [
            {"orgId": ORG_ID, "name": built["title"], "folder": FOLDER, "interval": windows.grafana_interval, "rules": rules}
        ],
    }


def grafana_alerts_json(windows: AlertWindows = AlertWindows(), runbooks: str = RUNBOOKS) -> str:
    """`grafana_rule_groups` as JSON text (deterministic)."""
    return json.dumps(grafana_rule_groups(windows, runbooks), indent=2, ensure_ascii=False) + "\n"


PROVISIONING_HEADER = (
    "# Grafana alerting provisioning: convowatch's alert rules (Grafana-managed). Generated by\n"
    "# dashboards/grafana_alerts.py: do not edit; regenerate with `convowatch dashboards build`.\n"
    "# Needs the Prometheus datasource with uid convowatch-prometheus (provisioning/datasources).\n"
)


def grafana_alerts_yaml(windows: AlertWindows = AlertWindows(), runbooks: str = RUNBOOKS) -> str:
    """`grafana_rule_groups` as a provisioning YAML file (``provisioning/alerting/*.yml``)."""
    return PROVISIONING_HEADER + dump_yaml(grafana_rule_groups(windows, runbooks))


def promql_expressions(windows: AlertWindows = AlertWindows()) -> list[str]:
    """Every PromQL expression in the Grafana rules, in rule order, each once."""
    seen: dict[str, None] = {}
    for group in grafana_rule_groups(windows)["groups"]:
        for rule in group["rules"]:
            for query in rule["data"]:
                if query["datasourceUid"] == datasources.PROMETHEUS_UID:
                    seen.setdefault(query["model"]["expr"], None)
    return list(seen)
