"""`convowatch summary` on a real chDB store: stored strings reach the terminal without their control characters."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from stream.store import ClickHouseStore
from tests.infra import convowatch
from tests.integration.test_store import scored

REPO = Path(__file__).resolve().parents[2]
HOSTILE_ID = "c1\x1b]0;pwned\x07"  # an OSC sequence that retitles the terminal, ended by BEL
HOSTILE_VALUE = "v\x1b[2J\x1b[H"  # clears the screen


def write_store(dsn: str) -> None:
    """One scored conversation whose id and attribute carry terminal escapes (child process: chDB is one-process)."""
    with ClickHouseStore(dsn) as store:
        store.migrate()
        store.write_scores([scored(HOSTILE_ID, "dsat", -3.0, 0.8, 1.5, attributes={"product": HOSTILE_VALUE})])


def test_summary_prints_control_characters_as_escapes(tmp_path: Path) -> None:
    dsn = f"chdb://{tmp_path / 'clickhouse'}"
    code = "import sys\nfrom tests.integration.test_summary_cli import write_store\nwrite_store(sys.argv[1])\n"
    subprocess.run([sys.executable, "-c", code, dsn], cwd=REPO, check=True, timeout=300)
    r = convowatch("summary", "--group-by", "product", env={"CONVOWATCH_STORE__DSN": dsn})
    assert r.returncode == 0, r.stderr
    assert "\x1b" not in r.stdout and "\x07" not in r.stdout
    assert "c1\\x1b]0;pwned\\x07" in r.stdout and "v\\x1b[2J\\x1b[H" in r.stdout
