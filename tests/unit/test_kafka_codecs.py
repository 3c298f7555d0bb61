"""Both Kafka clients of the service read every codec a producer may compress with (pyproject's codec packages).

The worker reads with aiokafka, the sink with kafka-python; either, missing a codec's library, crashes on the first
batch so compressed (tests/integration/test_real_producers.py publishes each codec for real)."""

from __future__ import annotations

import aiokafka.codec
import kafka.codec
import pytest


@pytest.mark.parametrize("client", [aiokafka.codec, kafka.codec], ids=["aiokafka (worker)", "kafka-python (sink)"])
@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_the_client_can_decompress_the_codec(client, codec: str) -> None:
    assert getattr(client, f"has_{codec}")(), f"{client.__name__} cannot read {codec} batches: install the codec packages"
