"""`convowatch scorers` and a worker's start-up with a scorer registry, run as real subprocesses.

The rollout during a live stream is tests/integration/test_rollout_pipeline.py; here: the commands' output, their
refusals (one clear error each, exit code 2) and the rollout file they leave.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.infra import convowatch


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return {"CONVOWATCH_SCORING__REGISTRY": str(tmp_path / "registry")}


def ok(*args: str | Path, env: dict[str, str]) -> str:
    done = convowatch(*args, env=env)
    assert done.returncode == 0, done.stderr
    return done.stdout


def refused(*args: str | Path, env: dict[str, str]) -> str:
    done = convowatch(*args, env=env)
    assert done.returncode == 2, (done.stdout, done.stderr)
    return done.stderr


def test_register_promote_shadow_list_and_their_refusals(env: dict[str, str], scoring_artifacts, tmp_path: Path) -> None:
    rubric_set, calibrator = scoring_artifacts
    assert "no scorer registry is configured: set scoring.registry" in refused("scorers", "list", env={})
    assert "no versions" in ok("scorers", "list", env=env)
    out = ok("scorers", "register", "v1", "--rubric-set", rubric_set, "--calibrator", calibrator, env=env)
    assert out.startswith("registered v1: rubric set ") and ", calibrator " in out
    assert "'v1' is already registered" in refused("scorers", "register", "v1", "--rubric-set", rubric_set, env=env)
    (tmp_path / "not-a-calibrator").mkdir()
    assert "cannot read calibrator" in refused(
        "scorers", "register", "v2", "--rubric-set", rubric_set, "--calibrator", tmp_path / "not-a-calibrator", env=env
    )
    assert "version name" in refused("scorers", "register", "../v2", "--rubric-set", rubric_set, env=env)
    assert "no active version" in refused("scorers", "shadow", "v1", "--rate", "0.5", env=env)
    assert "v1 is now the active scorer version (was none)" in ok("scorers", "promote", "v1", env=env)
    assert "no version 'v3'" in refused("scorers", "promote", "v3", env=env)
    assert "both the active version and its shadow" in refused("scorers", "shadow", "v1", "--rate", "0.5", env=env)
    ok("scorers", "register", "v2", "--rubric-set", rubric_set, env=env)  # no calibrator: labels and NetSAT only
    assert "give NAME and --rate" in refused("scorers", "shadow", "v2", env=env)
    assert "--off takes no NAME" in refused("scorers", "shadow", "v2", "--off", env=env)
    assert "0<x<=1" in refused("scorers", "shadow", "v2", "--rate", "0", env=env)
    assert "v2 shadows v1 on 20% of judged conversations" in ok("scorers", "shadow", "v2", "--rate", "0.2", env=env)
    assert json.loads(ok("scorers", "list", "--json", env=env)) == {
        "versions": ["v1", "v2"],
        "active": "v1",
        "shadow": "v2",
        "shadow_rate": 0.2,
    }
    assert ok("scorers", "list", env=env).split("\n")[:2] == [f"{'v1':<32} active", f"{'v2':<32} shadow on 20%"]
    ok("scorers", "shadow", "--off", env=env)
    store = {**env, "CONVOWATCH_STORE__DSN": f"chdb://{tmp_path / 'clickhouse'}"}
    assert "no active or no shadow version" in refused("scorers", "compare", "--since", "1d", env=store)


def test_a_worker_with_a_registry_needs_an_active_version_and_no_rubric_set_setting(
    env: dict[str, str], scoring_artifacts
) -> None:
    rubric_set, _ = scoring_artifacts
    unreachable = {**env, "CONVOWATCH_KAFKA__BOOTSTRAP_SERVERS": "127.0.0.1:1", "CONVOWATCH_METRICS__PORT": "0"}
    assert "has no active version" in refused("run", env=unreachable)
    both = {**unreachable, "CONVOWATCH_RUBRIC_SET": str(rubric_set)}
    assert "unset rubric_set and calibrator" in refused("run", env=both)
