"""The sink's Kafka client (kafka-python) checks record checksums with the C extension, not its Python fallback."""

from __future__ import annotations

from kafka.record import util


def test_kafka_python_checks_record_crcs_in_c() -> None:
    # Without the `crc32c` package kafka-python falls back to a pure-Python CRC-32C: ~70 µs per 350-byte record,
    # ~20 % of the sink's CPU in a profile of bench/pipeline_throughput.py (docs/benchmarks.md).
    assert util.crc32c_c is not None, "pip install crc32c (a dependency in pyproject.toml)"
    assert util.calc_crc32c(memoryview(b"123456789")) == 0xE3069283  # the CRC-32C check value
