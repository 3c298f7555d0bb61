"""The report's judge cost section: tokens and calls per judged conversation, cost per 1,000 with ``judge.price``.

Read from ClickHouse (the token columns of the scored conversations' latest
scores, summed per judge); the price is applied to the sums, which is exact
because cost is linear in the token counts (stream/cost.py). Conversations
stored unscored or unsampled are not in the figures: their failed or skipped
attempts report no tokens.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from stream.cost import judge_cost
from stream.report.text import html_text
from stream.settings import PriceSettings
from stream.store import ClickHouseStore

PER_CONVERSATIONS = 1000  # the cost figure is per this many judged conversations

_JUDGE_COST_SQL = """SELECT judge, count() AS conversations, sum(judge_calls) AS calls,
       sum(judge_prompt_tokens) AS prompt_tokens, sum(judge_cached_prompt_tokens) AS cached_prompt_tokens,
       sum(judge_completion_tokens) AS completion_tokens
FROM {scoped} AS s
WHERE status = 'scored'
GROUP BY judge
ORDER BY conversations DESC, judge"""


@dataclass(frozen=True)
class JudgeCost:
    """One judge's token use over the report's scored conversations."""

    judge: str
    conversations: int
    calls: int
    prompt_tokens: int
    cached_prompt_tokens: int
    completion_tokens: int

    def per_conversation(self, total: int) -> float:
        return total / self.conversations

    def cost(self, price: PriceSettings) -> float:
        return judge_cost(price, self.prompt_tokens, self.cached_prompt_tokens, self.completion_tokens)

    def cost_per_thousand(self, price: PriceSettings) -> float:
        return self.cost(price) * PER_CONVERSATIONS / self.conversations


def load_judge_costs(store: ClickHouseStore, scoped_scores_sql: str, scope: Mapping[str, Any]) -> tuple[JudgeCost, ...]:
    """Per judge, token sums of the scored conversations in ``scoped_scores_sql`` (the report's scope, as a subquery)."""
    rows = store.query(_JUDGE_COST_SQL.format(scoped=scoped_scores_sql), scope)
    return tuple(
        JudgeCost(
            r["judge"],
            int(r["conversations"]),
            int(r["calls"]),
            int(r["prompt_tokens"]),
            int(r["cached_prompt_tokens"]),
            int(r["completion_tokens"]),
        )
        for r in rows
    )


def cost_table(costs: tuple[JudgeCost, ...], price: PriceSettings | None) -> str:
    """The page's table: per judge, calls and tokens per conversation, and (with a price) cost per 1,000 and in total."""
    priced = price is not None
    money = f" ({html_text(price.currency)})" if price is not None else ""
    head = (
        "<tr><th>judge</th><th>conversations</th><th>calls / conv.</th><th>prompt tokens / conv.</th>"
        "<th>of which cached</th><th>completion tokens / conv.</th>"
        + (f"<th>cost / {PER_CONVERSATIONS:,} conv.{money}</th><th>cost{money}</th>" if priced else "")
        + "</tr>"
    )
    rows = []
    for c in costs:
        cells = [html_text(c.judge), str(c.conversations)] + [
            f"{c.per_conversation(n):,.1f}" for n in (c.calls, c.prompt_tokens, c.cached_prompt_tokens, c.completion_tokens)
        ]
        if price is not None:
            cells += [f"{c.cost_per_thousand(price):,.4f}", f"{c.cost(price):,.4f}"]
        rows.append(
            "<tr>" + "".join(f'<td class="num">{v}</td>' if i else f"<td>{v}</td>" for i, v in enumerate(cells)) + "</tr>"
        )
    note = (
        ""
        if priced
        else (
            '<p class="note">No price table (judge.price): tokens only. Cached prompt tokens are part of the prompt tokens.</p>'
        )
    )
    return f'<table id="judge-cost">{head}{"".join(rows)}</table>{note}'
