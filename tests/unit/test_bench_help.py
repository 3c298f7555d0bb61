"""Every benchmark script answers ``--help`` with its usage and does nothing else.

A script without an argument parser ran the whole benchmark on ``--help`` and overwrote its committed results file.
All scripts run in one child interpreter (their imports are shared), with ``bench/results`` checked before and after.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "bench"
SCRIPTS = sorted(p for p in BENCH.glob("*.py") if 'if __name__ == "__main__":' in p.read_text(encoding="utf-8"))
HELP_ALL = """
import contextlib, io, runpy, sys
sys.path[:0] = [sys.argv[1], sys.argv[2]]
for script in sys.argv[3:]:
    sys.argv = [script, "--help"]
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            runpy.run_path(script, run_name="__main__")
    except SystemExit as stop:
        code = stop.code
    else:
        code = "returned"
    print(f"{script}\\t{code}\\t{out.getvalue().startswith('usage:')}")
"""


def _results_state() -> dict[str, float]:
    return {p.name: p.stat().st_mtime for p in (BENCH / "results").iterdir()}


def test_every_benchmark_script_answers_help_without_running() -> None:
    assert len(SCRIPTS) > 15, SCRIPTS
    before = _results_state()
    done = subprocess.run(
        [sys.executable, "-c", HELP_ALL, str(REPO), str(BENCH), *map(str, SCRIPTS)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    answers = {Path(line.split("\t")[0]).name: line.split("\t")[1:] for line in done.stdout.splitlines() if "\t" in line}
    assert answers == {p.name: ["0", "True"] for p in SCRIPTS}
    assert _results_state() == before
