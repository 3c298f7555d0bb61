"""What one sink write costs the embedded store (chDB): `ClickHouseStore.write_scores` of small batches.

In the pipeline benchmark's latency phase the sink writes every ~0.1–0.2 s, a few records at a time, and py-spy puts
about half of its busy samples in chDB. This benchmark writes ``--writes`` batches of ``--records`` scored records
(9 dimensions and 8 rubric scores each, as the tests' `scored` helper makes them) to a fresh embedded store and
reports the wall and process CPU time per write, after ``--warmup`` writes. Each write is one insert per table that
has rows (conversations, conversation_scores, dimension_predictions, rubric_scores).

Run from the repository root: ``.venv/bin/python bench/store_write.py [--writes 150] [--records 10]``; figures to
bench/results/store_write.json.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "bench"):
    if str(path) not in sys.path:  # run as a script from a checkout
        sys.path.insert(0, str(path))

from results_file import write_results  # noqa: E402

from stream.records import DimensionPrediction, RubricHit  # noqa: E402
from stream.store import ClickHouseStore  # noqa: E402
from tests.integration.test_store import scored  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "store_write.json"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--writes", type=int, default=150)
    parser.add_argument("--records", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=5)
    args = parser.parse_args(argv)

    dimensions = tuple(DimensionPrediction(f"Q{i}", (0.1, 0.2, 0.3, 0.4), 3.0) for i in range(9))
    rubrics = tuple(RubricHit(f"r{i}", "sat" if i < 4 else "dsat", 5.0 if i < 4 else -5.0) for i in range(8))
    batches = [
        [scored(f"c{w}-{i}", "sat", 1.0, 0.3, 3.0, dimensions=dimensions, rubrics=rubrics) for i in range(args.records)]
        for w in range(args.warmup + args.writes)
    ]
    with tempfile.TemporaryDirectory() as tmp, ClickHouseStore(f"chdb://{tmp}", "bench") as store:
        store.migrate()
        for batch in batches[: args.warmup]:
            store.write_scores(batch)
        cpu, wall = time.process_time(), time.perf_counter()
        for batch in batches[args.warmup :]:
            store.write_scores(batch)
        wall_ms = (time.perf_counter() - wall) * 1e3 / args.writes
        cpu_ms = (time.process_time() - cpu) * 1e3 / args.writes
    print(f"{args.writes} writes of {args.records} records: {wall_ms:.1f} ms wall, {cpu_ms:.1f} ms CPU per write")
    write_results(
        RESULTS,
        {
            "writes": args.writes,
            "records_per_write": args.records,
            "ms_per_write": {"wall": round(wall_ms, 1), "cpu": round(cpu_ms, 1)},
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
