"""Panel targets for the ClickHouse datasource plugin (``grafana-clickhouse-datasource``, v4).

grafana-foundation-sdk has builders for Grafana's core datasources only, so
this module adds the one the Rubrics dashboard needs: a raw-SQL query in the
shape the plugin's v4 editor saves (``editorType: "sql"``, ``rawSql``, a
``queryType`` of ``table`` or ``timeseries`` and the matching Grafana
``format``: 1 table, 0 time series). ``pluginVersion`` is set so the plugin
does not run its v3 migration on load. `Query` is a cog ``Dataquery`` and
`Target` a cog ``Builder``, so both plug into the SDK's panel builders
(``with_target``) like the SDK's own Prometheus query builder.

The SQL may use the plugin's macros (``$__timeFilter(col)``,
``$__timeInterval(col)``, ``$__conditionalAll(cond, $var)``, ...) and
template variables, always as ``decodeURLComponent('${name:percentencode}')``
(`dashboards.rubrics_dashboard.variable_text`: no value can leave that literal, which
``singlequote`` does not guarantee); tests/grafana_macros.py expands them the way
Grafana and the plugin document, to run the SQL on chDB.
"""

from __future__ import annotations

from typing import Literal, Self

from grafana_foundation_sdk.cog import builder as cogbuilder
from grafana_foundation_sdk.cog import variants as cogvariants
from grafana_foundation_sdk.models.dashboard import DataSourceRef

from dashboards import datasources

PLUGIN_VERSION = "4.0.0"  # the query model below is the plugin's v4 one
QueryType = Literal["table", "timeseries"]
_FORMAT: dict[str, int] = {"timeseries": 0, "table": 1}  # Grafana's data formats (sqlds)


class Query(cogvariants.Dataquery):
    """One raw-SQL query of the ClickHouse plugin."""

    def __init__(
        self,
        raw_sql: str = "",
        ref_id: str = "",
        query_type: QueryType = "table",
        datasource: DataSourceRef | None = None,
        hide: bool | None = None,
    ) -> None:
        self.raw_sql = raw_sql
        self.ref_id = ref_id
        self.query_type = query_type
        self.datasource = datasource
        self.hide = hide

    def to_json(self) -> dict[str, object]:
        payload: dict[str, object] = {
            "editorType": "sql",
            "format": _FORMAT[self.query_type],
            "pluginVersion": PLUGIN_VERSION,
            "queryType": self.query_type,
            "rawSql": self.raw_sql,
            "refId": self.ref_id,
        }
        if self.datasource is not None:
            payload["datasource"] = self.datasource
        if self.hide is not None:
            payload["hide"] = self.hide
        return payload


class Target(cogbuilder.Builder[Query]):
    """Builder for `Query`, in the SDK's fluent style: ``Target().sql("SELECT ...").ref_id("A")``."""

    def __init__(self) -> None:
        self._internal = Query(datasource=datasources.clickhouse())

    def build(self) -> Query:
        return self._internal

    def sql(self, raw_sql: str) -> Self:
        """The SQL text, macros and template variables included."""
        self._internal.raw_sql = raw_sql
        return self

    def ref_id(self, ref_id: str) -> Self:
        self._internal.ref_id = ref_id
        return self

    def table(self) -> Self:
        """Return rows as a table (the default)."""
        self._internal.query_type = "table"
        return self

    def time_series(self) -> Self:
        """Return a time series: the first column is the time (alias ``time``), then an optional group column."""
        self._internal.query_type = "timeseries"
        return self

    def datasource(self, datasource: DataSourceRef) -> Self:
        self._internal.datasource = datasource
        return self

    def hide(self, hide: bool) -> Self:
        self._internal.hide = hide
        return self
