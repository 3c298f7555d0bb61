"""Draw a report: the images (`charts`, matplotlib) and the page (`page`) from a `ReportData`.

Separate from `data` so that loading a report from the store never loads matplotlib.
"""

from __future__ import annotations

from pathlib import Path

from stream.report import charts
from stream.report import page as page_module
from stream.report.data import IMAGES, PAGE, ReportData, ReportError


def write_report(data: ReportData, out_dir: str | Path) -> Path:
    """Draw the images and write the page into ``out_dir`` (created if missing); returns the page's path.

    Images of an earlier report in the same directory are removed first, so the page never sits
    next to stale pictures; with no data the page says so and there are no images.
    """
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
        for name in IMAGES.values():
            (out / name).unlink(missing_ok=True)
    except OSError as e:
        raise ReportError(f"cannot use {out} as the report directory: {e}") from e
    written: dict[str, str] = {}
    if not data.empty:
        for key, figure in charts.figures(data).items():
            if figure is not None:
                charts.save(figure, out / IMAGES[key])
                written[key] = IMAGES[key]
    page = out / PAGE
    try:
        page.write_text(page_module.render(data, written), encoding="utf-8")
    except OSError as e:
        raise ReportError(f"cannot write {page}: {e}") from e
    return page
