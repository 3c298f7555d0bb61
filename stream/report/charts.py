"""The report's images: Overview (volume, calibrated dissatisfaction, yield), breakdowns, Quality dimensions.

Matplotlib's object API on the Agg canvas (no pyplot, no global state), so
drawing works in any process without a display. Text that comes from the
data (product, model version, question names) is shown literally: ``$`` is
escaped so that matplotlib does not read it as mathtext.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.dates as mdates
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator, PercentFormatter

from stream.report.data import Counts, ReportData, describe_seconds
from stream.report.text import printable

DPI = 100
MAX_SERIES = 6  # model versions drawn as lines (the busiest)
MAX_BARS = 15  # values per breakdown chart (the busiest)
MIN_ANSWER_SPAN = 0.6  # narrowest answer-scale range a dimension chart shows
LABEL_COLORS = {"sat": "#2a9d5c", "dsat": "#d1495b", "uncertain": "#e9a23b", "unscored": "#9aa5b1", "unsampled": "#d5dbe1"}
LABEL_NAMES = {
    "sat": "sat",
    "dsat": "dsat",
    "uncertain": "uncertain (abstained)",
    "unscored": "unscored (judge failed)",
    "unsampled": "unsampled (not judged)",
}
# Series colours chosen apart from the label colours (no green/red/amber), so a line never reads as a label.
SERIES_COLORS = ("#1f5fa8", "#7b4fa0", "#8c564b", "#17a2b8", "#d45fb4", "#4d4d4d")
RATE_COLOR = "#b83245"
NO_CALIBRATION = "no calibrated scores in this window\n(the scorer has no calibrator)"


def figures(data: ReportData) -> dict[str, Figure | None]:
    """The report's figures by image key (None: nothing to draw, e.g. no calibrated dimensions)."""
    return {
        "overview": overview(data),
        "breakdown": breakdown(data),
        "quality": quality(data),
        "distributions": distributions(data),
    }


def save(figure: Figure, path: Path) -> None:
    """Write ``figure`` as a PNG with the Agg canvas."""
    FigureCanvasAgg(figure)
    figure.savefig(path, dpi=DPI, format="png")


# --- Overview ---------------------------------------------------------------------------------------------


def overview(data: ReportData) -> Figure:
    """Volume by label, calibrated dissatisfaction rate (95% band), the rate per model version, yield; over time."""
    buckets = data.buckets()
    starts = mdates.date2num([t for t, _ in buckets])
    counts = [c for _, c in buckets]
    width = data.bucket_s / 86400.0
    centres = starts + width / 2
    per = describe_seconds(data.bucket_s)

    fig = _figure(12, 13.5)
    volume, rate, by_version, yield_ax = fig.subplots(4, 1, sharex=True)
    fig.suptitle(f"Overview · {_window_text(data)}", fontsize=13, fontweight="bold")

    bottom = np.zeros(len(counts))
    for key in LABEL_COLORS:  # conversations as stored: judged ones by label, then unscored and unsampled
        values = np.array([getattr(c, key) for c in counts], dtype=float)
        volume.bar(
            starts + width * 0.05,
            values,
            width=width * 0.9,
            bottom=bottom,
            align="edge",
            color=LABEL_COLORS[key],
            label=LABEL_NAMES[key],
            linewidth=0,
        )
        bottom += values
    volume.set_title(f"Conversations closed per {per}, by label")
    volume.set_ylabel("conversations")
    volume.yaxis.set_major_locator(MaxNLocator(integer=True))
    _legend(volume)

    totals = data.totals
    if totals.calibrated:
        p = np.array([_nan(c.calibrated_dsat_rate) for c in counts])
        band = [c.calibrated_dsat_interval or (math.nan, math.nan) for c in counts]
        rate.fill_between(
            centres,
            [b[0] for b in band],
            [b[1] for b in band],
            color=RATE_COLOR,
            alpha=0.18,
            linewidth=0,
            label="95% interval ±1.96·√(var(P)/n)",
        )
        rate.plot(
            centres, p, color=RATE_COLOR, marker="o", markersize=3.5, linewidth=1.6, label=f"mean P(dissatisfied) per {per}"
        )
        lo, hi = totals.calibrated_dsat_interval  # type: ignore[misc]
        rate.axhline(
            totals.calibrated_dsat_rate,
            color="#444444",
            linestyle="--",
            linewidth=1,
            label=f"whole window {totals.calibrated_dsat_rate:.1%} ({lo:.1%}–{hi:.1%})",
        )
        rate.set_ylim(0, min(1.0, max(np.nanmax([b[1] for b in band]), totals.calibrated_dsat_rate) * 1.15 + 0.02))
        _legend(rate)

        series = data.series_by_model_version()
        shown = list(series)[:MAX_SERIES]
        top = 0.0
        for color, mv in zip(SERIES_COLORS, shown):
            pts = series[mv]
            values = np.array([_nan(c.calibrated_dsat_rate) for _, c in pts])
            whole = sum((c for _, c in pts), Counts())
            if whole.calibrated == 0:
                continue
            by_version.plot(
                centres,
                values,
                color=color,
                marker="o",
                markersize=3,
                linewidth=1.3,
                label=f"{_text(mv)}: {whole.calibrated_dsat_rate:.1%} (n={whole.calibrated})",
            )
            top = max(top, float(np.nanmax(values)))
        by_version.set_ylim(0, min(1.0, top * 1.15 + 0.02))
        note = f" (busiest {len(shown)} of {len(series)})" if len(series) > len(shown) else ""
        by_version.set_title(f"Calibrated dissatisfaction rate by model version{note}")
        _legend(by_version, title="model version: window rate")
    else:
        for ax in (rate, by_version):
            _no_data(ax, NO_CALIBRATION)
        by_version.set_title("Calibrated dissatisfaction rate by model version")
    rate.set_title("Calibrated dissatisfaction rate (estimated share of conversations a human would rate dissatisfied)")
    for ax in (rate, by_version):
        ax.set_ylabel("P(dissatisfied)")
        ax.yaxis.set_major_formatter(PercentFormatter(1.0, decimals=0))

    y = np.array([_nan(c.yield_rate) for c in counts])
    yield_ax.plot(centres, y, color="#1f5fa8", marker="o", markersize=3.5, linewidth=1.6, label=f"yield per {per}")
    if totals.yield_rate is not None:
        yield_ax.axhline(
            totals.yield_rate, color="#444444", linestyle="--", linewidth=1, label=f"whole window {totals.yield_rate:.1%}"
        )
    yield_ax.set_ylim(0, 1.04)
    yield_ax.yaxis.set_major_formatter(PercentFormatter(1.0, decimals=0))
    yield_ax.set_title("Yield: share of scored conversations with a confident label (sat or dsat, not uncertain)")
    yield_ax.set_ylabel("yield")
    _legend(yield_ax)

    _time_axis(yield_ax, starts[0], starts[-1] + width)
    for ax in (volume, rate, by_version, yield_ax):
        ax.grid(axis="y", alpha=0.3)
    return fig


def breakdown(data: ReportData) -> Figure:
    """Per model version and per product: calibrated dissatisfaction rate with 95% error bars, and the label mix."""
    fig = _figure(13, 4.2 + 0.9 * max(len(data.by("model_version")[:MAX_BARS]), len(data.by("product")[:MAX_BARS])))
    axes = fig.subplots(2, 2)
    fig.suptitle(f"Breakdown · {_window_text(data)}", fontsize=13, fontweight="bold")
    for column, (attribute, title) in enumerate((("model_version", "model version"), ("product", "product"))):
        groups = data.by(attribute)
        shown = groups[:MAX_BARS]
        more = f" (busiest {len(shown)} of {len(groups)})" if len(groups) > len(shown) else ""
        names = [f"{_text(v) or '(none)'}\nn={c.conversations}" for v, c in shown]
        _rate_bars(axes[0][column], shown, names)
        axes[0][column].set_title(f"Calibrated dissatisfaction rate by {title}{more}")
        _label_mix(axes[1][column], shown, names)
        axes[1][column].set_title(f"Labels by {title} (share of all conversations){more}")
    handles, labels = axes[1][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=4, frameon=False)
    return fig


def _rate_bars(ax, groups: Sequence[tuple[str, Counts]], names: list[str]) -> None:
    y = np.arange(len(groups))
    rates = np.array([_nan(c.calibrated_dsat_rate) for _, c in groups])
    if np.all(np.isnan(rates)):
        _no_data(ax, NO_CALIBRATION)
        return
    intervals = [c.calibrated_dsat_interval or (math.nan, math.nan) for _, c in groups]
    err = np.array([[r - lo for r, (lo, _) in zip(rates, intervals)], [hi - r for r, (_, hi) in zip(rates, intervals)]])
    ax.barh(y, np.nan_to_num(rates), color=RATE_COLOR, alpha=0.75, height=0.6)
    ax.errorbar(rates, y, xerr=err, fmt="none", ecolor="#222222", elinewidth=1.2, capsize=4)
    right = float(np.nanmax([hi for _, hi in intervals]))
    for yi, r, (_, hi) in zip(y, rates, intervals):
        if not math.isnan(r):
            ax.text(hi + right * 0.02, yi, f"{r:.1%}  [{intervals[int(yi)][0]:.1%}–{hi:.1%}]", va="center", fontsize=9)
    ax.set_xlim(0, min(1.0, right * 1.45 + 0.01))
    ax.set_yticks(y, names)
    ax.invert_yaxis()
    ax.xaxis.set_major_formatter(PercentFormatter(1.0))
    ax.set_xlabel("mean calibrated P(dissatisfied), 95% interval")
    ax.grid(axis="x", alpha=0.3)


def _label_mix(ax, groups: Sequence[tuple[str, Counts]], names: list[str]) -> None:
    y = np.arange(len(groups))
    left = np.zeros(len(groups))
    for key in LABEL_COLORS:  # conversations as stored: judged ones by label, then unscored and unsampled
        share = np.array([getattr(c, key) / c.conversations if c.conversations else 0.0 for _, c in groups])
        ax.barh(
            y, share, left=left, color=LABEL_COLORS[key], label=LABEL_NAMES[key], height=0.6, edgecolor="white", linewidth=0.5
        )
        for yi, s, x0 in zip(y, share, left):
            if s >= 0.07:
                ax.text(x0 + s / 2, yi, f"{s:.0%}", ha="center", va="center", fontsize=8.5, color="white", fontweight="bold")
        left += share
    ax.set_xlim(0, 1)
    ax.set_yticks(y, names)
    ax.invert_yaxis()
    ax.xaxis.set_major_formatter(PercentFormatter(1.0))


# --- Quality ----------------------------------------------------------------------------------------------


def quality(data: ReportData) -> Figure | None:
    """Each calibrated dimension over time by model version: the mean, and the p10-p90 band of conversations."""
    if not data.dimensions:
        return None
    buckets = [t for t, _ in data.buckets()]
    index = {t: i for i, t in enumerate(buckets)}
    width = data.bucket_s / 86400.0
    starts = mdates.date2num(buckets)
    centres = starts + width / 2
    versions = _versions(data, {p.model_version for p in data.dimension_series})
    fig, axes = _grid(len(data.dimensions), share_x=True)
    fig.suptitle(
        f"Quality dimensions over time (calibrated expected answer per {describe_seconds(data.bucket_s)}) · {_window_text(data)}",
        fontsize=13,
        fontweight="bold",
    )
    for ax, dim in zip(axes, data.dimensions):
        for color, mv in zip(SERIES_COLORS, versions):
            mean, lo, hi = (np.full(len(buckets), np.nan) for _ in range(3))
            for p in data.dimension_series:
                if p.question_id == dim.question_id and p.model_version == mv and p.bucket in index:
                    i = index[p.bucket]
                    mean[i], lo[i], hi[i] = p.mean, p.p10, p.p90
            ax.fill_between(centres, lo, hi, color=color, alpha=0.13, linewidth=0)
            ax.plot(centres, mean, color=color, marker="o", markersize=2.5, linewidth=1.4, label=_text(mv) or "(none)")
        shown = [p for p in data.dimension_series if p.question_id == dim.question_id and p.model_version in versions]
        _answer_axis(
            ax, dim.n_options, "y", min((p.p10 for p in shown), default=dim.p10), max((p.p90 for p in shown), default=dim.p90)
        )
        ax.set_title(_text(data.dimension_label(dim.question_id)), fontsize=10.5)
        ax.grid(alpha=0.3)
    for ax in axes[-min(len(axes), 3) :]:
        _time_axis(ax, starts[0], starts[-1] + width)
    _series_legend(fig, axes[0], versions, data, "line: mean; band: 10th–90th percentile of conversations")
    return fig


def distributions(data: ReportData) -> Figure | None:
    """Histogram of each calibrated dimension's expected answer, per model version (share of its conversations)."""
    if not data.dimensions:
        return None
    versions = _versions(data, {b.model_version for b in data.histogram})
    w = data.histogram_bin_width
    fig, axes = _grid(len(data.dimensions), share_x=False)
    fig.suptitle(
        f"Quality dimensions: distribution of the calibrated expected answer · {_window_text(data)}",
        fontsize=13,
        fontweight="bold",
    )
    for ax, dim in zip(axes, data.dimensions):
        edges = np.arange(1.0, dim.n_options + w + 1e-9, w)
        for color, mv in zip(SERIES_COLORS, versions):
            bins = [b for b in data.histogram if b.question_id == dim.question_id and b.model_version == mv]
            n = sum(b.n for b in bins)
            if not n:
                continue
            values = np.zeros(len(edges) - 1)
            for b in bins:
                i = min(max(int(round((b.lower - 1.0) / w)), 0), len(values) - 1)
                values[i] += b.n / n
            ax.stairs(values, edges, color=color, linewidth=1.5, label=_text(mv) or "(none)", fill=False)
            ax.stairs(values, edges, color=color, alpha=0.08, fill=True)
        occupied = [b.lower for b in data.histogram if b.question_id == dim.question_id and b.model_version in versions and b.n]
        _answer_axis(ax, dim.n_options, "x", min(occupied, default=dim.p10), max(occupied, default=dim.p90) + w)
        ax.yaxis.set_major_formatter(PercentFormatter(1.0, decimals=0))
        ax.set_ylim(bottom=0)
        ax.set_title(_text(data.dimension_label(dim.question_id)) + f"  (n={dim.n}, mean {dim.mean:.2f})", fontsize=10.5)
        ax.grid(alpha=0.3)
    for ax in axes[::3]:
        ax.set_ylabel("share of conversations")
    _series_legend(fig, axes[0], versions, data, f"bins of {w:g} on the answer scale")
    return fig


# --- helpers ----------------------------------------------------------------------------------------------


def _figure(width_in: float, height_in: float) -> Figure:
    fig = Figure(figsize=(width_in, height_in), layout="constrained", dpi=DPI)
    FigureCanvasAgg(fig)
    return fig


def _grid(n: int, share_x: bool) -> tuple[Figure, list]:
    cols = min(3, n)
    rows = math.ceil(n / cols)
    fig = _figure(5.0 * cols, 1.2 + 3.1 * rows)
    axes = fig.subplots(rows, cols, sharex=share_x, squeeze=False).ravel().tolist()
    for ax in axes[n:]:
        ax.remove()
    return fig, axes[:n]


def _versions(data: ReportData, present: set[str]) -> list[str]:
    return [mv for mv, _ in data.by("model_version") if mv in present][:MAX_SERIES]


def _series_legend(fig: Figure, ax, versions: list[str], data: ReportData, note: str) -> None:
    handles, labels = ax.get_legend_handles_labels()
    if not handles:
        return
    all_versions = {g.model_version for g in data.groups}
    more = f"; busiest {len(versions)} of {len(all_versions)}" if len(all_versions) > len(versions) else ""
    fig.legend(
        handles,
        labels,
        loc="outside lower center",
        ncol=min(len(handles), 6),
        frameon=False,
        title=f"model version ({note}{more})",
    )


def _answer_axis(ax, n_options: int, which: str, low: float, high: float) -> None:
    """The answer scale (1..K) zoomed to the data in [low, high], at least ``MIN_ANSWER_SPAN`` wide.

    Calibrated expected answers often vary by tenths of a point; on the whole 1..K scale a real
    change would be a flat line.
    """
    top = max(n_options, 2)
    pad = max((MIN_ANSWER_SPAN - (high - low)) / 2, 0.0) + 0.05
    lo, hi = max(1.0, low - pad), min(float(top), high + pad)
    if hi - lo < MIN_ANSWER_SPAN:  # against an end of the scale: widen the other way
        lo, hi = (1.0, 1.0 + MIN_ANSWER_SPAN) if lo <= 1.0 else (top - MIN_ANSWER_SPAN, float(top))
    limits = (lo - 0.03, hi + 0.03)
    locator = MaxNLocator(nbins=6, steps=[1, 2, 2.5, 5, 10])
    if which == "y":
        ax.set_ylim(*limits)
        ax.yaxis.set_major_locator(locator)
        ax.set_ylabel(f"expected answer (1–{top})")
    else:
        ax.set_xlim(*limits)
        ax.xaxis.set_major_locator(locator)
        ax.set_xlabel("calibrated expected answer (1 = worst option)")


def _time_axis(ax, left: float, right: float) -> None:
    locator = mdates.AutoDateLocator(minticks=4, maxticks=10)
    ax.xaxis.set_major_locator(locator)
    ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator))
    ax.set_xlim(left, right)
    ax.set_xlabel("closed at (UTC)")


def _legend(ax, title: str | None = None) -> None:
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, fontsize=9, title=title, title_fontsize=9)


def _no_data(ax, message: str) -> None:
    ax.text(0.5, 0.5, message, transform=ax.transAxes, ha="center", va="center", color="#666666", fontsize=11)


def _window_text(data: ReportData) -> str:
    w = data.window
    text = f"{w.since:%Y-%m-%d %H:%M} → {w.until:%Y-%m-%d %H:%M} UTC"
    for name, value in (("product", data.product), ("model version", data.model_version)):
        if value is not None:
            text += f" · {name} {_text(value) or '(none)'}"
    return text


def _text(s: str) -> str:
    """Data text shown literally: control characters dropped (matplotlib warns of each missing glyph on stderr, the
    raw character in the warning), ``$`` escaped (it would start mathtext)."""
    return printable(s).replace("$", r"\$")


def _nan(x: float | None) -> float:
    return math.nan if x is None else x
