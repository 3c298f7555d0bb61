"""The report's judge cost table: token sums read back from the real chDB engine, priced, on the page."""

from __future__ import annotations

import dataclasses
import re

import pytest

from stream.report.data import PAGE, Window, load_report
from stream.report.render import write_report
from stream.settings import PriceSettings
from tests.chdb_fixture import chdb_dsn, chdb_store, store_factory  # noqa: F401
from tests.integration.test_store import T0, scored, unscored, utc

DAY = Window(utc(T0 - 3600), utc(T0 + 86400))
PRICE = PriceSettings(prompt_per_million=2.0, cached_prompt_per_million=0.5, completion_per_million=8.0, currency="EUR")


def spent(record, calls: int, prompt: int, cached: int, completion: int, judge: str = "openai:qwen"):
    return dataclasses.replace(
        record,
        judge=judge,
        judge_calls=calls,
        judge_prompt_tokens=prompt,
        judge_cached_prompt_tokens=cached,
        judge_completion_tokens=completion,
    )


@pytest.fixture
def store(store_factory):
    s = store_factory()
    s.write_scores(
        [
            spent(scored("c1", "sat", 3.0, 0.1, 3.5), 9, 9000, 6000, 9),
            spent(scored("c2", "dsat", -3.0, 0.8, 1.5), 9, 11000, 8000, 9),
            spent(scored("c3", "sat", 2.0, 0.2, 3.0), 1, 1500, 0, 30, judge="openai:other"),
            unscored("c4"),  # failed attempts report no tokens: not in the figures
        ]
    )
    # c1 scored again (a redelivery): the latest score counts once
    s.write_scores([spent(scored("c1", "sat", 3.0, 0.1, 3.5, scored_at=T0 + 200), 9, 9000, 6000, 9)])
    return s


def test_tokens_per_conversation_and_cost_per_thousand_come_from_the_scored_rows(store) -> None:
    data = load_report(store, DAY, price=PRICE)
    costs = {c.judge: c for c in data.judge_costs}
    qwen = costs["openai:qwen"]
    assert (qwen.conversations, qwen.calls, qwen.prompt_tokens, qwen.cached_prompt_tokens, qwen.completion_tokens) == (
        2,
        18,
        20_000,
        14_000,
        18,
    )
    assert qwen.per_conversation(qwen.prompt_tokens) == 10_000
    # cached prompt tokens at 0.5, the other 6,000 prompt tokens at 2, completion at 8 (per million)
    cost = (6_000 * 2.0 + 14_000 * 0.5 + 18 * 8.0) / 1e6
    assert qwen.cost(PRICE) == pytest.approx(cost)
    assert qwen.cost_per_thousand(PRICE) == pytest.approx(cost / 2 * 1000)
    assert costs["openai:other"].cost_per_thousand(PRICE) == pytest.approx((1500 * 2.0 + 30 * 8.0) / 1e6 * 1000)


def test_the_page_shows_the_cost_table_with_the_currency_or_tokens_only_without_a_price(store, tmp_path) -> None:
    page = write_report(load_report(store, DAY, price=PRICE), tmp_path / "priced").read_text(encoding="utf-8")
    table = re.search(r'<table id="judge-cost">.*?</table>', page, flags=re.DOTALL).group(0)
    assert "cost / 1,000 conv. (EUR)" in table and "openai:qwen" in table
    assert f"{(6_000 * 2.0 + 14_000 * 0.5 + 18 * 8.0) / 1e6 / 2 * 1000:,.4f}" in table
    unpriced = write_report(load_report(store, DAY), tmp_path / "tokens").read_text(encoding="utf-8")
    assert "No price table" in unpriced and "cost /" not in unpriced
    assert "10,000.0" in unpriced  # prompt tokens per conversation of openai:qwen
    assert (tmp_path / "tokens" / PAGE).exists()
