"""`convowatch report` shows producers' strings without their control characters (issue 54): a NUL, ESC or BEL in a
conversation id, an attribute or a rubric id reaches neither the HTML page nor a chart label, and so neither the
terminal (matplotlib warned of each missing glyph on stderr, the raw character in the warning). Real chDB store."""

from __future__ import annotations

import re

import pytest
from matplotlib.text import Text

from stream.records import RubricHit
from stream.report import charts
from stream.report.data import load_report
from stream.report.render import write_report
from stream.report.text import html_text, printable
from tests.chdb_fixture import chdb_dsn, chdb_store, store_factory  # noqa: F401
from tests.integration.test_report import DAY, at, dims
from tests.integration.test_store import T0, scored

CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")  # every C0 but tab and newline, DEL and C1
HOSTILE = "\x00\x1b[2J\x1b]0;owned\x07"  # NUL, clear the screen, retitle the terminal


def hostile_records():
    """Conversations whose every producer-set string carries control characters."""
    a = {"product": f"shop{HOSTILE}", "model_version": f"v1{HOSTILE}"}
    b = {"product": "shop", "model_version": f"v2\x1b[31m{HOSTILE}"}
    hits = (RubricHit(f"dsat.rude{HOSTILE}", "dsat", -8.0),)
    return [
        at(scored(f"c1{HOSTILE}", "sat", 12.0, 0.10, 3.6, attributes=a, dimensions=dims(3.5, 3.0)), T0 + 600),
        at(scored(f"c2{HOSTILE}", "dsat", -9.0, 0.90, 1.4, attributes=a, rubrics=hits, dimensions=dims(1.5)), T0 + 3600),
        at(scored(f"c3{HOSTILE}", "uncertain", 1.0, 0.40, 2.6, attributes=b, dimensions=dims(2.5, 2.5)), T0 + 7200),
    ]


def test_printable_drops_control_characters_and_keeps_the_rest() -> None:
    assert printable(f"v1{HOSTILE} ünï $x") == "v1[2J]0;owned ünï $x"
    assert html_text('<b a="1">\x1b') == "&lt;b a=&quot;1&quot;&gt;"


def test_no_control_character_reaches_the_page_the_charts_or_stderr(
    store_factory, tmp_path, capfd: pytest.CaptureFixture[str]
) -> None:
    store = store_factory()
    store.write_scores(hostile_records())
    data = load_report(store, DAY, product=f"shop{HOSTILE}")
    capfd.readouterr()
    page = write_report(data, tmp_path)
    captured = capfd.readouterr()
    text = page.read_text(encoding="utf-8")
    assert "c1[2J]0;owned" in text and "dsat.rude[2J]0;owned" in text  # the values are shown, printable
    assert CONTROL.findall(text) == []
    assert CONTROL.findall(captured.err) == [] and CONTROL.findall(captured.out) == []
    labels = [
        t.get_text()
        for figure in charts.figures(data).values()
        if figure is not None
        for t in figure.findobj(match=Text)
        if isinstance(t, Text)
    ]
    assert any("v1[2J]0;owned" in label for label in labels)
    assert [label for label in labels if CONTROL.search(label)] == []
