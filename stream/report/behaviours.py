"""The report's behaviours section: each ABC-Eval behaviour's rate per assistant turn, with its Wilson interval.

Read from ClickHouse: the ``behaviour_turns`` rows of the latest score of
each conversation in the report's scope. The rate is weighted by 1/π
(``inclusion_probability``), so sampling does not bias it; the 95 % Wilson
interval is computed on the judged turns (exact without sampling, an
approximation when strata are sampled at different rates). Without
``scoring.behaviours`` there are no rows and the section says so.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from scorers.behaviours import WEIGHTED_RATE_SQL, behaviour_rows_sql
from scorers.statistics import ConfidenceInterval, wilson_interval
from stream.report.text import html_text
from stream.store import ClickHouseStore


def _rates_sql(scores: str) -> str:
    return f"""SELECT b.behaviour_id AS behaviour,
       {WEIGHTED_RATE_SQL} AS rate,
       countIf(b.hit) AS hits,
       count() AS turns
FROM {behaviour_rows_sql(scores)}
GROUP BY behaviour
ORDER BY rate DESC, behaviour"""


@dataclass(frozen=True)
class BehaviourRate:
    """One behaviour over the report: its weighted rate, and the judged hits and turns behind it."""

    behaviour: str
    rate: float
    hits: int
    turns: int

    def interval(self) -> ConfidenceInterval:
        """95 % Wilson interval of the judged turns."""
        return wilson_interval(self.hits, self.turns)


def load_behaviour_rates(store: ClickHouseStore, scoped_scores_sql: str, scope: Mapping[str, Any]) -> tuple[BehaviourRate, ...]:
    """Per behaviour, the rate over the assistant turns of the conversations in ``scoped_scores_sql`` (a subquery)."""
    rows = store.query(_rates_sql(scoped_scores_sql), scope)
    return tuple(BehaviourRate(r["behaviour"], float(r["rate"]), int(r["hits"]), int(r["turns"])) for r in rows)


def behaviour_table(rates: tuple[BehaviourRate, ...]) -> str:
    """The page's table: per behaviour, its rate with the 95 % Wilson interval, hits and turns (highest rate first)."""
    if not rates:
        return '<p class="note">No behaviour rows in this window (scoring.behaviours is off, or nothing was judged).</p>'
    head = "<tr><th>behaviour</th><th>rate per assistant turn</th><th>95 % Wilson interval</th><th>hits</th><th>turns</th></tr>"
    rows = []
    for r in rates:
        ci = r.interval()
        cells = [f"{r.rate:.1%}", f"{ci.low:.1%} – {ci.high:.1%}", str(r.hits), str(r.turns)]
        rows.append(f"<tr><td>{html_text(r.behaviour)}</td>" + "".join(f'<td class="num">{c}</td>' for c in cells) + "</tr>")
    note = '<p class="note">Rates weighted by 1/π; the interval is that of the judged turns (docs/behaviours.md).</p>'
    return f'<table id="behaviours">{head}{"".join(rows)}</table>{note}'
