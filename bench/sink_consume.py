"""How fast does the sink's Kafka client (kafka-python) read records, with its CRC-32C in C and without?

kafka-python checks every fetched batch's CRC-32C; without the `crc32c` package it does so in pure Python, which
was ~20 % of the sink's CPU in a py-spy profile of bench/pipeline_throughput.py. This benchmark publishes
`N_RECORDS` turn events of ~350 bytes to Apache Kafka (KRaft, one node: the embedded stack's) started here, then reads
them back as the sink polls (500 records at a time; no consumer group), best of 3 reads, once with the C extension
and once with it hidden (a child process each).

Run: ``.venv/bin/python bench/sink_consume.py`` (about a minute); figures to bench/results/sink_consume.json.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, str(ROOT))

from kafka import KafkaConsumer, KafkaProducer  # noqa: E402

from deploy.local.stack import stop  # noqa: E402

N_RECORDS = 22_000
RUNS = 3
TOPIC = "sink-consume"
VALUE = (
    b'{"schema_version":1,"type":"turn","conversation_id":"c-000123","timestamp":"2026-11-27T05:00:00Z",'
    b'"turn_index":3,"role":"user","text":"' + b"x" * 200 + b'"}'
)
RESULTS = ROOT / "bench" / "results" / "sink_consume.json"


def best_consume_rate(bootstrap: str) -> float:
    """Records/s of the fastest of `RUNS` reads of the topic from its start."""
    best = 0.0
    for _ in range(RUNS):
        consumer = KafkaConsumer(
            TOPIC, bootstrap_servers=[bootstrap], auto_offset_reset="earliest", enable_auto_commit=False, max_poll_records=500
        )
        got, started = 0, time.perf_counter()
        while got < N_RECORDS:
            got += sum(len(records) for records in consumer.poll(timeout_ms=1000).values())
        best = max(best, got / (time.perf_counter() - started))
        consumer.close()
    return best


def child(bootstrap: str, with_c: bool) -> float:
    """The best consume rate in a fresh interpreter, with kafka-python's CRC-32C in C or its Python fallback."""
    hide = "" if with_c else "import sys; sys.modules['crc32c'] = None; "  # kafka-python then uses its own
    code = (
        f"{hide}import sys; sys.path.insert(0, {str(ROOT / 'bench')!r}); sys.path.insert(0, {str(ROOT)!r}); "
        "from kafka.record import util; import sink_consume; "
        f"assert (util.crc32c_c is not None) == {with_c}; print(sink_consume.best_consume_rate({bootstrap!r}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=600)
    return float(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, default=RESULTS, help="where the figures go (default: %(default)s)")
    args = parser.parse_args(argv)
    import pipeline_throughput
    from results_file import cpu_model  # bench/, beside this script; imported here to keep the timed children light

    from deploy.local.kafka import kafka_version

    stack = pipeline_throughput.start_broker(Path(tempfile.mkdtemp(prefix="convowatch-bench-sink-")))
    bootstrap = stack.bootstrap
    try:
        producer = KafkaProducer(bootstrap_servers=[bootstrap], linger_ms=5)
        for i in range(N_RECORDS):
            producer.send(TOPIC, key=b"c-%06d" % (i % 2000), value=VALUE)
        producer.flush()
        producer.close()
        rates = {"python_fallback": child(bootstrap, with_c=False), "c_extension": child(bootstrap, with_c=True)}
    finally:
        stop(stack.cfg, ["kafka"])
    for name, rate in rates.items():
        print(f"kafka-python consume, CRC-32C {name.replace('_', ' ')}: {rate:,.0f} records/s")
    args.results.write_text(
        json.dumps(
            {
                "benchmark": "sink_consume",
                "command": ".venv/bin/python bench/sink_consume.py",
                "machine": {"cpu": cpu_model(), "kafka": kafka_version()},
                "records": N_RECORDS,
                "record_bytes": len(VALUE),
                "best_of": RUNS,
                "records_per_s": {k: round(v) for k, v in rates.items()},
            },
            indent=2,
        )
        + "\n",
        encoding="utf-8",
    )


if __name__ == "__main__":
    main()
