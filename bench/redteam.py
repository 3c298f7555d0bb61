"""Issue 54's red-team benchmark: every attack end to end on the real components, and what it achieved, counted.

A real worker and sink (``convowatch -v``) on Apache Kafka (the test fixtures' broker) with the embedded ClickHouse
take the poison pills, the judge replies of the wrong shape, the error bodies echoing the API key, the chat control
tokens, the canaries and the SQL-injecting conversation ids between real LLM-Rubric conversations; then the slow-judge
measurement at the default settings (a 60 s answer). What is counted, and how each count could find something, is in
tests/redteam.py; the test is ``tests/integration/test_redteam.py::test_redteam_bench``, run here through pytest for
its fixtures (in this process).

Run: ``.venv/bin/python bench/redteam.py`` (about 10 min on 2 cores); writes bench/results/redteam.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "bench"):
    if str(path) not in sys.path:  # run as a script from a checkout, or imported as bench.redteam
        sys.path.insert(0, str(path))

import pytest  # noqa: E402
from results_file import write_results  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "redteam.json"
TEST = "tests/integration/test_redteam.py::test_redteam_bench"
OUT_ENV = "CONVOWATCH_BENCH_REDTEAM_OUT"
MUST_BE_ZERO = ("worker_crashes", "blocked_partitions", "key_fragments_found", "injected_sql_rows", "extra_control_tokens")


def failed(result: dict) -> list[str]:
    """The counts issue 54 wants at 0 that are not, and a canary line in any log."""
    bad = [name for name in MUST_BE_ZERO if result[name]]
    return bad + [f"canary_log_lines.{role}" for role, n in result["canary_log_lines"].items() if n]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the attacks, write their figures (with the date and host) to ``--out``; exit 1 if any count is not 0."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=RESULTS, help="results file (default: %(default)s)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="redteam-") as tmp:
        figures = Path(tmp) / "figures.json"
        os.environ[OUT_ENV] = str(figures)
        if pytest.main(["-q", TEST, f"--basetemp={tmp}/pt", "-p", "no:cacheprovider"]) != 0:
            raise SystemExit(f"{TEST} failed")
        result = json.loads(figures.read_text())
    result["not_zero"] = failed(result)
    write_results(args.out, result)
    print(json.dumps(result, indent=2))
    return 1 if result["not_zero"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
