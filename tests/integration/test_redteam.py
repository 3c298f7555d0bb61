"""The red-team suite of issue 54: one or more tests per attack of its "Why" list, marked ``redteam`` (``pytest -m
redteam`` runs them; tests/conftest.py marks each test this map names, so this is the one place that lists them).

- Poison pills stop the worker for good (turn_index 2**31 - 1, 1,000,000, forty 32 KB turns, 3,797 DEL field names):
  `tests/integration/test_poison_pills.py`, `tests/unit/test_adversarial_events.py`,
  `tests/integration/test_adversarial_scoring.py`
- A judge reply of the wrong shape crashes the worker: `tests/integration/test_judge_hostile_replies.py`,
  `tests/integration/test_adversarial_scoring.py`
- A conversation id injects SQL into the Grafana dashboards: `tests/integration/test_dashboard_injection.py`
- Chat control tokens reach the judge: `tests/integration/test_control_tokens.py`
- Injection flags are easy to dodge:
  `tests/unit/test_injection.py::test_obfuscated_injections_are_found_after_normalising`,
  `tests/unit/test_injection.py::test_the_users_tools_and_assistants_turns_are_read_not_the_systems`
- Secrets in error bodies: `tests/integration/test_judge_secrets.py`, `tests/unit/test_secret_scrub.py`
- DEBUG logs of the sink print conversation text: `tests/integration/test_log_privacy.py`
- One slow judge answer holds everything behind it:
  `tests/integration/test_slow_judge.py::test_the_conversations_behind_a_slow_judge_answer_are_scored_before_it_answers`,
  `tests/integration/test_slow_judge.py::test_a_slow_conversation_does_not_take_every_judge_call_in_flight`
- Metric label slots go to whichever values come first: `tests/unit/test_label_slots.py`
- A 10,000-rubric set is accepted; a 60,000-key set takes 56 s to register: `tests/unit/test_rubric_set_limits.py`
- The registry follows a symlinked calibrator: `tests/unit/test_registry_symlinks.py`
- Existing state directories are not tightened: `tests/unit/test_state_permissions.py`
- `convowatch report` writes raw NUL/ESC: `tests/integration/test_report_control_chars.py`

The full run of every attack on a live worker, sink, broker and chDB, counted, is bench/redteam.py (tests/redteam.py;
`test_redteam_bench` here, skipped unless the bench runs it).
"""

from __future__ import annotations

import ast
import json
import os
import re
from pathlib import Path

import pytest

from tests.pipeline import Pipeline

ROOT = Path(__file__).resolve().parents[2]
BENCH_OUT_ENV = "CONVOWATCH_BENCH_REDTEAM_OUT"  # where test_redteam_bench writes its figures


def suite() -> list[str]:
    """The tests the map above names: ``path`` (every test of the module) or ``path::name``."""
    return re.findall(r"`(tests/[\w/]+\.py(?:::\w+)?)`", __doc__ or "")


def in_suite(nodeid: str, entries: list[str]) -> bool:
    """Whether the test ``nodeid`` (parameters included) is one ``entries`` names."""
    bare = nodeid.split("[", 1)[0]
    return any(bare == e or bare.startswith(e + "::") for e in entries)


def test_every_test_the_map_names_exists() -> None:
    """A renamed or moved test would silently leave the suite: each entry names a module and, if given, a test
    function defined in it."""
    entries = suite()
    assert len(entries) >= 15, entries
    for entry in entries:
        path, _, name = entry.partition("::")
        source = ROOT / path
        assert source.is_file(), entry
        if name:
            defined = {n.name for n in ast.walk(ast.parse(source.read_text())) if isinstance(n, ast.FunctionDef)}
            assert name in defined, entry


@pytest.mark.skipif(not os.environ.get(BENCH_OUT_ENV), reason=f"bench/redteam.py runs it (sets {BENCH_OUT_ENV})")
def test_redteam_bench(tmp_path: Path, kafka_broker: str, scoring_artifacts: tuple[Path, Path]) -> None:
    """bench/redteam.py: every attack on a live pipeline (tests/redteam.py), then the slow judge at the defaults
    (tests/integration/test_slow_judge.py's measurement, 60 s an answer); the figures go to the file it names."""
    from tests.integration.test_slow_judge import BENCH_DELAY_S, measure_slow_judge
    from tests.redteam import run_attacks

    rubric_set, calibrator = scoring_artifacts
    attacked = Pipeline(tmp_path / "attacks", kafka_broker, rubric_set, calibrator)
    try:
        result = run_attacks(attacked)
    finally:
        attacked.stop_all()
    slow = Pipeline(tmp_path / "slow-judge", kafka_broker, rubric_set, calibrator)
    try:
        result["slow_judge"] = measure_slow_judge(slow, BENCH_DELAY_S, timeout_s=1800)
    finally:
        slow.stop_all()
    Path(os.environ[BENCH_OUT_ENV]).write_text(json.dumps(result, indent=2) + "\n")
