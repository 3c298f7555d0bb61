"""Shared session fixtures: real models and real servers, started once per test session."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.pipeline import Pipeline
from tests.servers import LlamaServer, gemma_gguf_path, start_llama_server

LLAMA_MODEL_ALIAS = "gemma-3-270m-test"


@pytest.fixture(scope="session")
def gemma_gguf() -> Path:
    """The packaged Gemma 3 270M GGUF (assembled once, cached across sessions)."""
    return gemma_gguf_path()


@pytest.fixture(scope="session")
def llama_server(gemma_gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    """llama-cpp-python's OpenAI-compatible server on Gemma 3 270M, requiring a random API key."""
    try:
        import llama_cpp.server  # noqa: F401
    except ImportError as e:
        pytest.fail(f"llama-cpp-python[server] is not installed ({e}); `make install` builds it")
    api_key = secrets.token_hex(16)
    server = start_llama_server(
        gemma_gguf,
        tmp_path_factory.mktemp("llama-server"),
        api_key=api_key,
        model_alias=LLAMA_MODEL_ALIAS,
        chat_format="gemma",  # the base model ships no chat template
    )
    try:
        yield server
    finally:
        server.stop()


# Real infrastructure (tansu broker, Prometheus, Alertmanager) and the one chDB engine of this process.
from tests.chdb_fixture import chdb_dsn, chdb_store, store_factory  # noqa: E402,F401
from tests.infra import alertmanager, kafka_broker, prometheus_factory  # noqa: E402,F401


@pytest.fixture(scope="session")
def scoring_artifacts(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(rubric set, calibrator) made by the scoring-core commands from LLM-Rubric's synthetic data, as the demo does."""
    import subprocess
    import sys

    from tests.pipeline import LLM_RUBRIC_DATA, REPO

    out = tmp_path_factory.mktemp("scoring-artifacts")
    cw = [sys.executable, "-m", "stream.commands.cli"]
    synth_answers = LLM_RUBRIC_DATA / "gpt-3.5-turbo-16k_synth_evaluations_FIXED.tsv"
    env = {
        **__import__("os").environ,
        "CONVOWATCH_JUDGE__BACKEND": "recorded",
        "CONVOWATCH_JUDGE__RECORDED_ANSWERS": str(synth_answers),
    }
    steps = [
        [
            "data",
            "llm-rubric",
            "--data-dir",
            str(LLM_RUBRIC_DATA),
            "--split",
            "synth",
            "--labelled-out",
            str(out / "synth.jsonl"),
            "--rubric-set-out",
            str(out / "unfitted.json"),
        ],
        [
            "rubrics",
            "fit",
            "--rubric-set",
            str(out / "unfitted.json"),
            "--labelled",
            str(out / "synth.jsonl"),
            "--out",
            str(out / "rubricset.json"),
        ],
        [
            "calibrate",
            "train",
            "--judge-answers",
            str(synth_answers),
            "--human-labels",
            str(LLM_RUBRIC_DATA / "human_judges_synth_all_FIXED_ANON.tsv"),
            "--questions",
            str(LLM_RUBRIC_DATA / "questions.json"),
            "--grid",
            "none",
            "--out",
            str(out / "calibrator"),
        ],
    ]
    for step in steps:
        subprocess.run(cw + step, cwd=REPO, env=env, check=True, capture_output=True, timeout=600)
    return out / "rubricset.json", out / "calibrator"


@pytest.fixture
def pipeline(tmp_path: Path, kafka_broker: str, scoring_artifacts: tuple[Path, Path]) -> Iterator[Pipeline]:
    """An isolated pipeline (its own topics, groups and store) on the session broker, scoring with those artifacts;
    its processes are stopped afterwards. Modules that need another set-up define their own."""
    rubric_set, calibrator = scoring_artifacts
    p = Pipeline(tmp_path, kafka_broker, rubric_set, calibrator)
    try:
        yield p
    finally:
        p.stop_all()


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark ``redteam`` the tests tests/integration/test_redteam.py's map names (issue 54's red-team suite)."""
    from tests.integration.test_redteam import in_suite, suite

    entries = suite()
    for item in items:
        if in_suite(item.nodeid, entries):
            item.add_marker(pytest.mark.redteam)
