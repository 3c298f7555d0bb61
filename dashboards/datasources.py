"""The two Grafana datasources every dashboard refers to, by fixed uid.

Dashboards name datasources by uid (not by name or an import-time input), so
the JSON imports unchanged wherever these uids exist: the provisioning file
``deploy/grafana/provisioning/datasources/convowatch.yml`` creates both with
exactly these uids.
"""

from __future__ import annotations

from typing import Literal

from grafana_foundation_sdk.models.dashboard import DataSourceRef

PROMETHEUS_UID = "convowatch-prometheus"
CLICKHOUSE_UID = "convowatch-clickhouse"
PROMETHEUS_TYPE = "prometheus"
CLICKHOUSE_TYPE = "grafana-clickhouse-datasource"  # the official ClickHouse plugin (v4)

Kind = Literal["prometheus", "clickhouse"]
KIND_BY_UID: dict[str, Kind] = {PROMETHEUS_UID: "prometheus", CLICKHOUSE_UID: "clickhouse"}


def prometheus() -> DataSourceRef:
    """A reference to convowatch's Prometheus datasource."""
    return DataSourceRef(type_val=PROMETHEUS_TYPE, uid=PROMETHEUS_UID)


def clickhouse() -> DataSourceRef:
    """A reference to convowatch's ClickHouse datasource."""
    return DataSourceRef(type_val=CLICKHOUSE_TYPE, uid=CLICKHOUSE_UID)
