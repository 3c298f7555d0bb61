"""How long do the conversations behind one slow judge answer wait? (issue 54, item 2)

A real worker on Apache Kafka (the test fixtures' broker) scores 8 real LLM-Rubric conversations through the
OpenAI-compatible API; the judge is a small HTTP server answering in the OpenAI chat format, every call about one
conversation after 60 s (a stand-in for a judge that hangs on one conversation: that fault cannot be produced for
real on demand). Reported: the slow conversation's and the others' end -> scored latency (the score record's
``scored_at`` minus the time all events were produced), at the default settings. The measurement is
``tests/integration/test_slow_judge.py::measure_slow_judge``, run here through pytest for its fixtures.

Run: ``.venv/bin/python bench/slow_judge.py`` (about 6 min on 2 cores); writes bench/results/slow_judge.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from results_file import write_results

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "slow_judge.json"
TEST = "tests/integration/test_slow_judge.py::test_slow_judge_bench"
OUT_ENV = "CONVOWATCH_BENCH_SLOW_JUDGE_OUT"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the measurement and write its figures (with the date and host) to ``--out``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=RESULTS, help="results file (default: %(default)s)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="slow-judge-") as tmp:
        figures = Path(tmp) / "figures.json"
        command = [sys.executable, "-m", "pytest", "-q", TEST, f"--basetemp={tmp}/pt", "-p", "no:cacheprovider"]
        subprocess.run(command, cwd=ROOT, env={**os.environ, OUT_ENV: str(figures)}, check=True)
        result = json.loads(figures.read_text())
    print(json.dumps(result, indent=2))
    write_results(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
