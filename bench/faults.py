"""The fault suite in full (issue 14, ``make bench``): 1,000 conversations through crashes and outages, then the count.

The scenario is tests/fault_suite.py's (its docstring says what happens and
what is checked), with `FULL`: 1,000 copies of the real LLM-Rubric
conversations, the worker killed (-9) 10 times and the sink 3 times at seeded
random moments between the replay's chunks, the sink stopped for 60 s, the
judge failing for 5 min (connection refused, HTTP 503, replies slower than the
worker's judge timeout, a third each) while the rest goes on; and the broker
faults of a 3-node Apache Kafka cluster (KRaft, each node broker and
controller; replication factor 3, ``min.insync.replicas=2``, ``acks=all``):
the leader of an events partition and of a changelog partition killed (-9) and
started again, the active controller killed and started again, the whole
cluster killed at once and started again on its files. The worker and sink
are the real ``convowatch run`` / ``convowatch sink`` processes with the Kafka
client defaults of stream/settings.py, each under a ``kafka.group_instance_id``
of its own (static membership, as the production units run it: a killed worker
started again takes its partitions back at once); the store is embedded
ClickHouse, the judge is the recorded GPT-3.5 answers served over HTTP.

Reports what reached the store (rows, scored, duplicates visible after FINAL,
conversations missing, conversations whose stored turns differ from those
sent, conversations left open, dead letters) and, per fault, the seconds until
the process it hit had caught up (a broker fault: also until every replica was
back in sync). Writes ``bench/results/faults.json`` (with the CPU model and the Kafka version).

Run from the repository root: ``.venv/bin/python bench/faults.py [--seed 1] [--quick] [--consumer batch]``
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "bench"):
    if str(path) not in sys.path:  # run as a script from a checkout, or imported as bench.faults
        sys.path.insert(0, str(path))

import pipeline_throughput  # noqa: E402
from results_file import cpu_model  # noqa: E402

from deploy.local.kafka import kafka_version  # noqa: E402
from tests.fault_suite import CLUSTER_OVERRIDES, CLUSTER_SIZE, FULL, SHORT, FaultReport, run_fault_suite  # noqa: E402
from tests.infra import kafka_cluster  # noqa: E402
from tests.pipeline import Pipeline  # noqa: E402

OUTPUT = ROOT / "bench" / "results" / "faults.json"
QUICK_OUTPUT = Path("/tmp/faults-quick.json")


def report(result: dict[str, Any]) -> None:
    stored = result["stored"]
    print(f"\n{result['plan']['conversations']} conversations in {result['seconds']:.0f} s")
    for key, value in stored.items():
        print(f"  {key:<28} {value}")
    print("recovery (s until caught up; a broker fault: and until every replica was in sync):")
    for r in result["recoveries"]:
        outage = f" after {r['seconds']:.0f} s down" if "seconds" in r else ""
        in_sync = f" {r['in_sync_s']:>7.1f}" if "in_sync_s" in r else ""
        print(f"  {r['fault']:<22}{outage:<20} {r['caught_up_s']:>7.1f}{in_sync}")
    print(f"judge requests: {result['judge_requests']}")


def run(seed: int, quick: bool, consumer: str) -> FaultReport:
    plan = dataclasses.replace(SHORT if quick else FULL, seed=seed)
    rubric_set, calibrator = pipeline_throughput.scoring_artifacts(pipeline_throughput.CACHE)
    with tempfile.TemporaryDirectory(prefix="convowatch-faults-") as tmp:
        root = Path(tmp)
        # A cluster of this run's own, on ports below the ephemeral range (its nodes are killed and started again on them).
        with kafka_cluster(root / "cluster", CLUSTER_SIZE, CLUSTER_OVERRIDES) as cluster:
            pipeline = Pipeline(root / "pipeline", cluster.bootstrap, rubric_set, calibrator)
            pipeline.extra_env["CONVOWATCH_KAFKA__CONSUMER"] = consumer
            try:
                return run_fault_suite(pipeline, rubric_set, plan, cluster)
            finally:
                pipeline.stop_all()


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=1, help="the faults' order and moments")
    ap.add_argument("--quick", action="store_true", help="the short form of make test, results to /tmp")
    ap.add_argument("--consumer", choices=("batch", "faust"), default="batch", help="the workers' kafka.consumer")
    args = ap.parse_args(argv)
    out = QUICK_OUTPUT if args.quick else OUTPUT
    result = {
        "benchmark": "faults",
        "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": " ".join([".venv/bin/python", "bench/faults.py", *(argv if argv is not None else sys.argv[1:])]),
        "machine": {"cpu": cpu_model(), "kafka": kafka_version()},
        "consumer": args.consumer,
        **run(args.seed, args.quick, args.consumer).as_dict(),
    }
    out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    report(result)
    stored = result["stored"]
    lost = stored["missing"] + stored["turns_differing"] + (stored["sent"] - stored["scored"])
    print(f"wrote {out}")
    return 0 if lost == 0 and stored["visible_duplicates"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
