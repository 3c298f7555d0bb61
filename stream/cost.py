"""What the judge's tokens cost under a price table (``judge.price``).

Prices are per million tokens. Cached prompt tokens (the part of the prompt a
server served from its prompt cache, reported in ``cached_prompt_tokens``) are
priced at the cached rate, the rest of the prompt at the prompt rate, and
completion tokens at the completion rate. Cost is linear in the token counts,
so the cost of a sum of conversations is the cost of their summed tokens: the
worker's counter and the report (from ClickHouse sums) agree.
"""

from __future__ import annotations

from stream.settings import PriceSettings

TOKENS_PER_PRICE_UNIT = 1_000_000  # prices are quoted per million tokens


def judge_cost(price: PriceSettings, prompt_tokens: float, cached_prompt_tokens: float, completion_tokens: float) -> float:
    """Cost of the given token counts (``cached_prompt_tokens`` is part of ``prompt_tokens``), in ``price.currency``."""
    cached_rate = price.prompt_per_million if price.cached_prompt_per_million is None else price.cached_prompt_per_million
    cached = min(cached_prompt_tokens, prompt_tokens)
    return (
        (prompt_tokens - cached) * price.prompt_per_million
        + cached * cached_rate
        + completion_tokens * price.completion_per_million
    ) / TOKENS_PER_PRICE_UNIT
