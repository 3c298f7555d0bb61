"""Shared session fixtures: real models and real servers, started once per test session."""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Iterator

import pytest

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
