"""Building blocks the four dashboards share: targets, panels, template variables, the finished JSON.

Each function returns a grafana-foundation-sdk builder already set up the way
convowatch's dashboards look (datasource by uid, units, legend, size), so the
dashboard modules read as a list of panels with their queries. `finish`
turns a dashboard builder into the plain JSON model written to
``dashboards/json/`` (panel ids assigned in order, so the output is stable).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from grafana_foundation_sdk.builders import bargauge, heatmap, prometheus, stat, table, timeseries
from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.builders import dashboard as dash
from grafana_foundation_sdk.cog import builder as cogbuilder
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models.dashboard import (
    DashboardCursorSync,
    DashboardLinkType,
    DataSourceRef,
    DynamicConfigValue,
    VariableOption,
    VariableRefresh,
    VariableSort,
)
from grafana_foundation_sdk.models.heatmap import HeatmapColorMode, HeatmapColorScale
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

from dashboards import datasources

DEFAULT_TIME = ("now-6h", "now")
DEFAULT_REFRESH = "1m"
PROMETHEUS_ALL = ".*"  # "All" of a Prometheus variable is a regex matching every value (label matchers use =~)
REF_IDS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"

AnyTarget = cogbuilder.Builder[Any]  # a query builder of any datasource


# --- dashboards -------------------------------------------------------------------------------


def new_dashboard(uid: str, title: str, description: str, time_from: str = DEFAULT_TIME[0]) -> dash.Dashboard:
    """A dashboard with convowatch's defaults: tag, time range, refresh, shared crosshair, links to its siblings."""
    return (
        dash.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags(["convowatch"])
        .time(time_from, DEFAULT_TIME[1])
        .refresh(DEFAULT_REFRESH)
        .timezone("utc")
        .tooltip(DashboardCursorSync.CROSSHAIR)
        .editable()
        .link(
            dash.DashboardLink("convowatch")
            .type(DashboardLinkType.DASHBOARDS)
            .tags(["convowatch"])
            .as_dropdown(True)
            .include_vars(True)
            .keep_time(True)
        )
        .annotation(
            dash.AnnotationQuery()
            .name("Annotations & Alerts")
            .built_in(1)
            .type("dashboard")
            .enable(True)
            .hide(True)
            .icon_color("rgba(0, 211, 255, 1)")
            .datasource(DataSourceRef(type_val="grafana", uid="-- Grafana --"))
        )
    )


def finish(board: dash.Dashboard) -> dict[str, Any]:
    """The dashboard's JSON model as plain data, panels numbered 1, 2, ... in order."""
    model = json.loads(json.dumps(board.build(), cls=JSONEncoder))
    model["templating"].setdefault("list", [])  # Grafana expects the list even when there are no variables
    for number, panel in enumerate(model.get("panels", []), start=1):
        panel["id"] = number
    return model


def row(title: str) -> dash.Row:
    """An expanded row header; the panels added after it sit under it."""
    return dash.Row(title).collapsed(False)


def with_rows(board: dash.Dashboard, rows: Sequence[tuple[str | dash.Row, Sequence[Any]]]) -> dash.Dashboard:
    """``board`` with each (row title or row, its panels) appended in order."""
    for header, panels in rows:
        board = board.with_row(row(header) if isinstance(header, str) else header)
        for panel in panels:
            board = board.with_panel(panel)
    return board


def with_attribute_variables(board: dash.Dashboard, metric: str) -> dash.Dashboard:
    """``board`` with the ``product`` and ``model_version`` variables (model versions of the chosen products)."""
    board = board.with_variable(prometheus_label_variable("product", "Product", metric))
    return board.with_variable(prometheus_label_variable("model_version", "Model version", f'{metric}{{product=~"$product"}}'))


# --- targets ----------------------------------------------------------------------------------


def promql(expr: str, legend: str = "__auto", ref_id: str = "A") -> prometheus.Dataquery:
    """A Prometheus range query; ``legend`` is Grafana's legend template (``{{label}}``)."""
    return prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(ref_id).range().datasource(datasources.prometheus())


def promql_instant(expr: str, legend: str = "__auto", ref_id: str = "A") -> prometheus.Dataquery:
    """A Prometheus instant query (one value per series at the end of the range)."""
    return prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(ref_id).instant().datasource(datasources.prometheus())


def promql_buckets(expr: str, instant: bool = False) -> prometheus.Dataquery:
    """Histogram buckets (``sum by (le) (...)``) in Grafana's heatmap format: cumulative counts made per-bucket."""
    query = promql_instant(expr, "{{le}}") if instant else promql(expr, "{{le}}")
    return query.format(PromQueryFormat.HEATMAP)


def with_ref_ids(targets: Sequence[AnyTarget]) -> list[AnyTarget]:
    """Name the targets A, B, C, ... in order (Grafana needs them unique within a panel)."""
    if len(targets) > len(REF_IDS):
        raise ValueError(f"a panel has {len(targets)} targets; at most {len(REF_IDS)} are supported")
    return [t.ref_id(REF_IDS[i]) for i, t in enumerate(targets)]  # type: ignore[attr-defined]


# --- panels -----------------------------------------------------------------------------------


def _legend() -> common_builders.VizLegendOptions:
    return (
        common_builders.VizLegendOptions()
        .show_legend(True)
        .display_mode(common.LegendDisplayMode.LIST)
        .placement(common.LegendPlacement.BOTTOM)
        .calcs([])
    )


def time_series(
    title: str,
    description: str,
    targets: Sequence[AnyTarget],
    unit: str,
    *,
    span: int = 12,
    height: int = 8,
    min_value: float | None = None,
    max_value: float | None = None,
    datasource: str = datasources.PROMETHEUS_UID,
) -> timeseries.Panel:
    """A time-series panel of one or more targets."""
    panel = (
        timeseries.Panel()
        .title(title)
        .description(description)
        .datasource(_ref(datasource))
        .targets(with_ref_ids(targets))
        .unit(unit)
        .span(span)
        .height(height)
        .legend(_legend())
        .line_width(1)
        .fill_opacity(10)
        .show_points(common.VisibilityMode.NEVER)
    )
    if min_value is not None:
        panel = panel.min(min_value)
    if max_value is not None:
        panel = panel.max(max_value)
    return panel


def confidence_band(panel: timeseries.Panel, upper: str, lower: str) -> timeseries.Panel:
    """Shade between the series named ``upper`` and ``lower`` and draw both as thin dashed edges."""
    edge = [
        DynamicConfigValue(id_val="custom.lineStyle", value={"fill": "dash", "dash": [4, 4]}),
        DynamicConfigValue(id_val="custom.lineWidth", value=0),
    ]
    return panel.override_by_name(upper, [DynamicConfigValue(id_val="custom.fillBelowTo", value=lower), *edge]).override_by_name(
        lower, [DynamicConfigValue(id_val="custom.fillOpacity", value=0), *edge]
    )


def single_stat(
    title: str, description: str, target: AnyTarget, unit: str, *, span: int = 6, height: int = 4, decimals: int | None = None
) -> stat.Panel:
    """One number: the last value of one (instant) target."""
    panel = (
        stat.Panel()
        .title(title)
        .description(description)
        .datasource(_ref(datasources.PROMETHEUS_UID))
        .targets(with_ref_ids([target]))
        .unit(unit)
        .span(span)
        .height(height)
        .reduce_options(common_builders.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
        .graph_mode(common.BigValueGraphMode.NONE)
        .color_mode(common.BigValueColorMode.VALUE)
    )
    return panel.decimals(decimals) if decimals is not None else panel


def bucket_heatmap(
    title: str, description: str, target: AnyTarget, unit: str, *, span: int = 12, height: int = 8
) -> heatmap.Panel:
    """Histogram buckets over time (Prometheus heatmap format): colour = rate into each bucket."""
    return (
        heatmap.Panel()
        .title(title)
        .description(description)
        .datasource(_ref(datasources.PROMETHEUS_UID))
        .targets(with_ref_ids([target]))
        .unit(unit)
        .span(span)
        .height(height)
        .calculate(False)
        .rows_frame(heatmap.RowsHeatmapOptions().layout(common.HeatmapCellLayout.LE).value("conversations/s"))
        .color(
            heatmap.HeatmapColorOptions()
            .mode(HeatmapColorMode.SCHEME)
            .scheme("Oranges")
            .fill("dark-orange")
            .scale(HeatmapColorScale.EXPONENTIAL)
            .exponent(0.5)
            .steps(64)
            .reverse(False)
        )
        .cell_gap(1)
        .y_axis(heatmap.YAxisConfig().unit(unit))
    )


def bucket_bars(
    title: str,
    description: str,
    target: AnyTarget,
    *,
    span: int = 12,
    height: int = 8,
    datasource: str = datasources.PROMETHEUS_UID,
) -> bargauge.Panel:
    """One bar per bucket or category (e.g. conversations per histogram bucket over the range)."""
    return (
        bargauge.Panel()
        .title(title)
        .description(description)
        .datasource(_ref(datasource))
        .targets(with_ref_ids([target]))
        .unit("short")
        .span(span)
        .height(height)
        .orientation(common.VizOrientation.HORIZONTAL)
        .display_mode(common.BarGaugeDisplayMode.GRADIENT)
        .reduce_options(common_builders.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
        .show_unfilled(True)
        .min(0)
    )


def table_panel(
    title: str,
    description: str,
    targets: Sequence[AnyTarget],
    *,
    span: int = 24,
    height: int = 10,
    datasource: str = datasources.CLICKHOUSE_UID,
) -> table.Panel:
    """A table of query rows."""
    return (
        table.Panel()
        .title(title)
        .description(description)
        .datasource(_ref(datasource))
        .targets(with_ref_ids(targets))
        .span(span)
        .height(height)
        .show_header(True)
        .cell_height(common.TableCellHeight.SM)
    )


def link_column(panel: table.Panel, column: str, title: str, url: str) -> table.Panel:
    """Make every cell of ``column`` a data link (``url`` may use ``${__value.raw}`` and ``${__url_time_range}``)."""
    link = {"title": title, "url": url, "targetBlank": False}
    return panel.override_by_name(column, [DynamicConfigValue(id_val="links", value=[link])])


def _ref(uid: str) -> DataSourceRef:
    return datasources.prometheus() if uid == datasources.PROMETHEUS_UID else datasources.clickhouse()


# --- template variables -----------------------------------------------------------------------


def prometheus_label_variable(name: str, label: str, metric_selector: str) -> dash.QueryVariable:
    """A multi-value variable over a label's values (``label_values``); All = any value."""
    return (
        dash.QueryVariable(name)
        .label(label)
        .datasource(datasources.prometheus())
        .query(f"label_values({metric_selector}, {name})")
        .multi(True)
        .include_all(True)
        .all_value(PROMETHEUS_ALL)
        .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(VariableSort.ALPHABETICAL_CASE_INSENSITIVE_ASC)
        .current(_all_option())
    )


def clickhouse_variable(name: str, label: str, sql: str) -> dash.QueryVariable:
    """A multi-value variable whose options are the rows of ``sql``; All = ``$__all`` (see ``$__conditionalAll``)."""
    return (
        dash.QueryVariable(name)
        .label(label)
        .datasource(datasources.clickhouse())
        .query(sql)
        .multi(True)
        .include_all(True)
        .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(VariableSort.ALPHABETICAL_CASE_INSENSITIVE_ASC)
        .current(_all_option())
    )


def text_variable(name: str, label: str, description: str) -> dash.TextBoxVariable:
    """A free-text variable (empty by default)."""
    return dash.TextBoxVariable(name).label(label).description(description).default_value("")


def _all_option() -> VariableOption:
    return VariableOption(selected=True, text="All", value="$__all")
