"""`make demo`'s broker is durable: killed (-9) while the demo's replay is being scored, then started again, it
loses nothing.

The demo's own steps (deploy/local/demo.py) on a state directory and ports of this test's: its stack's broker, its
worker and sink with its settings, its scorer registration, its learning half with the users' thumbs. Only the
behaviours are off (the local model would take minutes) and the rubric set and calibrator are the session's (made
by the same commands). The sink is not running during the replay, so every score waits on the broker when it dies
(and the users' thumbs, and the committed offsets); the fault suite (tests/fault_suite.py) kills the same broker while
conversations are open and the worker is mid-way through the events.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from deploy.local import demo, stack
from tests.infra import crash_and_restart, free_ports, restartable_ports
from tests.pipeline import Pipeline


def test_a_broker_restart_during_the_demos_replay_loses_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, scoring_artifacts: tuple[Path, Path]
) -> None:
    state = tmp_path / "demo"
    (kafka_port, controller_port), (worker_port, sink_port) = restartable_ports(2), free_ports(2)
    for name, value in {
        "STATE": state,
        "REGISTRY": state / "registry",
        "KAFKA_PORT": kafka_port,
        "WORKER_PORT": worker_port,
        "SINK_PORT": sink_port,
    }.items():
        monkeypatch.setattr(demo, name, value)
    settings_env = demo._settings_env
    no_behaviours = lambda: {k: v for k, v in settings_env().items() if "BEHAVIOUR" not in k}  # noqa: E731
    monkeypatch.setattr(demo, "_settings_env", no_behaviours)
    state.mkdir(parents=True)
    rubric_set, calibrator = scoring_artifacts
    shutil.copy(rubric_set, state / "rubricset.json")
    shutil.copytree(calibrator, state / "calibrator")
    cfg = demo.stack_config()
    cfg.kafka_controller_port = controller_port  # a port the restarted broker can bind again
    stack.start_kafka(cfg)
    try:
        demo.make_artifacts()  # already there: kept
        demo.register_active()
        demo.start_service("worker", "run", worker_port)
        demo._wait("partitions", lambda: demo._metric(worker_port, "convowatch_assigned_partitions") > 0, 120)
        path = state / "learning-half.jsonl"
        n = demo.write_half(path, learning_half=True)
        demo._cw("replay", "jsonl", str(path), env=demo._settings_env(), quiet=True)
        scored_at_crash = demo._metric(worker_port, "convowatch_conversations_scored_total")

        crash_and_restart(cfg)

        demo.start_service("sink", "sink", sink_port)
        demo._wait(
            "every conversation stored",
            lambda: demo._metric(sink_port, "convowatch_sink_rows_total", table="conversation_scores") >= n,
            300,
        )
        lost = demo._metric(worker_port, "convowatch_broker_lost_data_total") + demo._metric(
            sink_port, "convowatch_broker_lost_data_total"
        )
        demo.stop_service("sink")
        [stored] = Pipeline(state, f"127.0.0.1:{kafka_port}", None, None).query_store(
            "SELECT count() AS rows, uniqExact(conversation_id) AS conversations FROM convowatch.conversation_scores FINAL"
        )
    finally:
        for name in ("worker", "sink"):
            demo.stop_service(name)
        stack.stop(cfg, ["kafka"])
    print(f"{n} conversations; scored by the worker when the broker died: {scored_at_crash:.0f}")
    assert n > 100 and stored == {"rows": n, "conversations": n} and lost == 0
