"""The report's one HTML page: window, totals, the images, breakdown and dimension tables, the worst conversations.

Self-contained (inline CSS, no scripts; the images sit beside it). Every value
from the store goes through `stream.report.text.html_text` (control characters dropped, then
`html.escape`), ids and rubric names included.
Totals carry ``data-total="..."`` attributes so that tools (and tests) can
read the numbers without scraping text.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from scorers.rubrics import LABELS
from stream.records import RubricHit
from stream.report.agreement import agreement_table
from stream.report.behaviours import behaviour_table
from stream.report.cost import cost_table
from stream.report.data import Counts, ReportData, WorstRow, describe_seconds
from stream.report.text import html_text

MAX_VERSION_COLUMNS = 6

_CSS = """
body { font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; margin: 2em auto; max-width: 1320px;
       padding: 0 1em; color: #1d2329; line-height: 1.45; }
h1 { margin-bottom: 0.2em; } h2 { margin-top: 1.8em; border-bottom: 1px solid #d9dee3; padding-bottom: 0.2em; }
.meta { color: #4a5561; margin-top: 0; }
table { border-collapse: collapse; margin: 0.8em 0 1.2em; font-size: 0.92em; }
th, td { border: 1px solid #d9dee3; padding: 0.3em 0.6em; text-align: left; vertical-align: top; }
th { background: #f2f4f6; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
td.id { font-family: ui-monospace, Menlo, Consolas, monospace; font-size: 0.9em; word-break: break-all; }
img { max-width: 100%; border: 1px solid #e3e7eb; margin: 0.5em 0; }
.nodata { font-size: 1.2em; padding: 1em; background: #fff6e0; border: 1px solid #f0d9a0; }
.note { color: #5b6670; font-size: 0.88em; }
.sat { color: #1f7a46; } .dsat { color: #b3283f; font-weight: 600; } .uncertain { color: #a86d00; }
"""


def render(data: ReportData, images: Mapping[str, str]) -> str:
    """The page for ``data``; ``images`` maps image keys (overview, breakdown, quality, distributions) to file names."""
    title = f"convowatch report · {_window(data)}"
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{html_text(title)}</title><style>{_CSS}</style></head><body>",
        "<h1>convowatch quality report</h1>",
        f'<p class="meta">{_meta(data)}</p>',
    ]
    if data.empty:
        parts.append(
            '<p class="nodata" id="no-data">No data: no conversation closed in this window'
            f"{html_text(_filters(data))}. Widen the window (--since/--until) or check the filters.</p>"
        )
    else:
        parts += [
            "<h2>Totals</h2>", _totals(data.totals),
            "<h2>Overview</h2>", _image(images, "overview", "Conversations per bucket by label, calibrated dissatisfaction rate "
                                        "with its 95% band, the rate per model version, and yield over time"),
            _image(images, "breakdown", "Calibrated dissatisfaction rate and label mix per model version and per product"),
            "<h3>By model version</h3>", _breakdown(data.by("model_version"), "model version", "by-model-version"),
            "<h3>By product</h3>", _breakdown(data.by("product"), "product", "by-product"),
            "<h2>Quality dimensions</h2>", _quality(data, images),
            "<h2>Worst conversations</h2>", _worst(data),
            "<h2>Scorers</h2>", _scorers(data),
            "<h2>Agreement with your users</h2>", agreement_table(data.user_agreement),
            "<h2>Behaviours</h2>", behaviour_table(data.behaviour_rates),
            "<h2>Judge cost</h2>", cost_table(data.judge_costs, data.price),
            f'<p class="note">{_DEFINITIONS}</p>',
        ]  # fmt: skip
    parts.append("</body></html>\n")
    return "\n".join(parts)


_DEFINITIONS = (
    "<b>sat / dsat / uncertain</b>: the rubric set's label from NetSAT and its confidence windows (uncertain = the "
    "scorer abstained); shares are of the scored conversations. <b>Yield</b>: share of scored conversations with a "
    "confident label. <b>Calibrated dissatisfaction rate</b>: the mean calibrated P(dissatisfied), i.e. the estimated "
    "share of conversations a human judge would rate dissatisfied; its 95% interval is p ± 1.96·√(var(P)/n), the standard "
    "error of a mean of n calibrated probabilities. <b>Unscored</b>: the judge could not score the conversation (reason in ClickHouse). "
    "One score per conversation (its latest, deduplicated with FINAL), conversations placed in time by when they closed."
)


def _meta(data: ReportData) -> str:
    lines = [f"Window <b>{html_text(_window(data))}</b>{html_text(_filters(data))}"]
    if data.first_closed is not None and data.last_closed is not None:
        lines.append(
            f"Conversations closed from {data.first_closed:%Y-%m-%d %H:%M:%S} to {data.last_closed:%Y-%m-%d %H:%M:%S} UTC; "
            f"charts cover that span in buckets of {html_text(describe_seconds(data.bucket_s))}"
        )
    lines.append(f"Generated {data.generated_at:%Y-%m-%d %H:%M:%S} UTC from {html_text(data.source)}")
    return "<br>".join(lines)


def _window(data: ReportData) -> str:
    return f"{data.window.since:%Y-%m-%d %H:%M:%S} → {data.window.until:%Y-%m-%d %H:%M:%S} UTC"


def _filters(data: ReportData) -> str:
    out = ""
    for name, value in (("product", data.product), ("model version", data.model_version)):
        if value is not None:
            out += f", {name} {value!r}"
    return out


def _totals(t: Counts) -> str:
    rows = [
        ("conversations", "Conversations", t.conversations, ""),
        ("scored", "Scored", t.scored, _pct(t.scored / t.conversations if t.conversations else None) + " of conversations"),
        ("unscored", "Unscored (judge failed)", t.unscored, _pct(t.unscored / t.conversations if t.conversations else None)
         + " of conversations"),
        ("unsampled", "Unsampled (not judged)", t.unsampled, _pct(t.unsampled / t.conversations if t.conversations else None)
         + " of conversations"),
        ("sat", "sat", t.sat, _pct(t.share("sat")) + " of scored (weighted by 1/π)"),
        ("dsat", "dsat", t.dsat, _pct(t.share("dsat")) + " of scored (weighted by 1/π)"),
        ("uncertain", "uncertain (abstained)", t.uncertain, _pct(t.share("uncertain")) + " of scored (weighted by 1/π)"),
    ]  # fmt: skip
    body = [
        f'<tr><th>{html_text(label)}</th><td class="num" data-total="{key}">{n}</td><td>{html_text(note)}</td></tr>'
        for key, label, n, note in rows
    ]
    body.append(
        f'<tr><th>Yield</th><td class="num" data-total="yield">{_pct(t.yield_rate)}</td>'
        "<td>share of scored conversations not uncertain</td></tr>"
    )
    body.append(
        f'<tr><th>Calibrated dissatisfaction rate</th><td class="num" data-total="calibrated_dsat_rate">'
        f"{_pct(t.calibrated_dsat_rate)}</td><td>95% interval {_interval(t)} over "
        f'<span data-total="calibrated">{t.calibrated}</span> calibrated conversations</td></tr>'
    )
    return '<table id="totals">' + "".join(body) + "</table>"


def _image(images: Mapping[str, str], key: str, alt: str) -> str:
    name = images.get(key)
    return f'<p><img src="{html_text(name)}" alt="{html_text(alt)}"></p>' if name else ""


def _breakdown(groups: Sequence[tuple[str, Counts]], name: str, table_id: str) -> str:
    head = (
        f"<tr><th>{html_text(name)}</th><th>conversations</th><th>scored</th><th>sat</th><th>dsat</th><th>uncertain</th>"
        "<th>unscored</th><th>yield</th><th>calibrated dissatisfaction rate (95% interval)</th></tr>"
    )
    rows = []
    for value, c in groups:
        rows.append(
            f'<tr><td>{html_text(value) or "<i>(none)</i>"}</td><td class="num">{c.conversations}</td><td class="num">{c.scored}</td>'
            f'<td class="num">{_pct(c.share("sat"))}</td><td class="num">{_pct(c.share("dsat"))}</td>'
            f'<td class="num">{_pct(c.share("uncertain"))}</td><td class="num">{c.unscored}</td>'
            f'<td class="num">{_pct(c.yield_rate)}</td><td class="num">{_pct(c.calibrated_dsat_rate)} ({_interval(c)})</td></tr>'
        )
    return f'<table id="{table_id}">{head}{"".join(rows)}</table>'


def _quality(data: ReportData, images: Mapping[str, str]) -> str:
    if not data.dimensions:
        return '<p class="note">No calibrated dimension predictions in this window (the scorer has no calibrator).</p>'
    versions = [mv for mv, _ in data.by("model_version")][:MAX_VERSION_COLUMNS]
    means: dict[tuple[str, str], tuple[float, int]] = {}
    for p in data.dimension_series:  # bucket means weighted by their counts = the exact mean per model version
        s, n = means.get((p.question_id, p.model_version), (0.0, 0))
        means[(p.question_id, p.model_version)] = (s + p.mean * p.n, n + p.n)
    head = (
        "<tr><th>dimension</th><th>answers</th><th>n</th><th>mean</th><th>p10</th><th>p90</th>"
        + "".join(f"<th>mean · {html_text(mv) or '(none)'}</th>" for mv in versions)
        + "</tr>"
    )
    rows = []
    for d in data.dimensions:
        cells = "".join(
            f'<td class="num">{_num(means[(d.question_id, mv)][0] / means[(d.question_id, mv)][1])}</td>'
            if means.get((d.question_id, mv), (0, 0))[1]
            else '<td class="num">–</td>'
            for mv in versions
        )
        rows.append(
            f'<tr><td>{html_text(data.dimension_label(d.question_id))}</td><td>1–{d.n_options}</td><td class="num">{d.n}</td>'
            f'<td class="num">{_num(d.mean)}</td><td class="num">{_num(d.p10)}</td><td class="num">{_num(d.p90)}</td>{cells}</tr>'
        )
    return "\n".join([
        _image(images, "quality", "Each calibrated dimension over time by model version: mean and 10th-90th percentile band"),
        _image(images, "distributions", "Distribution of each calibrated dimension per model version"),
        '<p class="note">Calibrated expected answer to each question (1 = the worst option).</p>',
        f'<table id="dimensions">{head}{"".join(rows)}</table>',
    ])  # fmt: skip


def _worst(data: ReportData) -> str:
    if not data.worst:
        return '<p class="note">No scored conversation in this window.</p>'
    head = (
        "<tr><th>conversation</th><th>closed (UTC)</th><th>product</th><th>model version</th><th>label</th><th>NetSAT</th>"
        "<th>P(dissatisfied)</th><th>calibrated satisfaction</th><th>turns</th><th>DSAT rubric hits</th>"
        "<th>weakest SAT rubrics</th></tr>"
    )
    rows = [_worst_row(data, w) for w in data.worst]
    return (
        '<p class="note">Highest calibrated P(dissatisfied) first, then lowest NetSAT. Look them up in ClickHouse: '
        "<code>SELECT turns FROM conversations FINAL WHERE conversation_id = '…'</code>.</p>"
        f'<table id="worst">{head}{"".join(rows)}</table>'
    )


def _worst_row(data: ReportData, w: WorstRow) -> str:
    label_class = w.label if w.label in LABELS else ""
    return (
        f'<tr data-conversation-id="{html_text(w.conversation_id)}"><td class="id">{html_text(w.conversation_id)}</td>'
        f"<td>{w.closed_at:%Y-%m-%d %H:%M:%S}</td><td>{html_text(w.product)}</td><td>{html_text(w.model_version)}</td>"
        f'<td class="{label_class}">{html_text(w.label)}</td><td class="num">{_num(w.netsat)}</td>'
        f'<td class="num">{_pct(w.dissatisfaction_probability)}</td><td class="num">{_num(w.main_expected_value)}</td>'
        f'<td class="num">{w.n_turns}</td><td>{_hits(data, w.dsat_hits)}</td><td>{_hits(data, w.weakest_sat)}</td></tr>'
    )


def _hits(data: ReportData, hits: Sequence[RubricHit]) -> str:
    if not hits:
        return "–"
    return "<br>".join(f"{html_text(data.dimension_label(h.rubric_id))} {h.score:+.1f}" for h in hits)


def _scorers(data: ReportData) -> str:
    head = "<tr><th>scorer version</th><th>judge</th><th>rubric set</th><th>calibrator</th><th>conversations</th></tr>"
    rows = [
        f'<tr><td class="id">{html_text(s.scorer_version)}</td><td>{html_text(s.judge)}</td><td class="id">{html_text(s.rubric_set_version)}'
        f'</td><td class="id">{html_text(s.calibrator_version)}</td><td class="num">{s.conversations}</td></tr>'
        for s in data.scorers
    ]
    return f'<table id="scorers">{head}{"".join(rows)}</table>'


def _interval(c: Counts) -> str:
    ci = c.calibrated_dsat_interval
    return "–" if ci is None else f"{ci[0]:.1%}–{ci[1]:.1%}"


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{x:.1%}"


def _num(x: float | None) -> str:
    return "–" if x is None else f"{x:.2f}"
