"""Text generators for rubric learning, on real models.

`OpenAIGenerator` talks to a real llama-cpp-python server running the packaged
Gemma 3 270M (session fixture ``llama_server``); `LocalGenerator` runs the same
model in-process on llama.cpp. Gemma 3 270M is a *base* model: these tests check
plumbing (requests, token counts, determinism, errors, retries), never the
quality of the text. The one fault a real server cannot produce on demand (a
503 outage) comes from `ScriptedServer`, and the test says so.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from scorers.learning.generators import (
    Generation,
    GeneratorAuthError,
    GeneratorModelNotFound,
    GeneratorPromptTooLong,
    GeneratorUnavailable,
    LocalGenerator,
    OpenAIGenerator,
    TextGenerator,
)
from tests.servers import LlamaServer, Received, Reply, ScriptedServer, cache_dir, forward, free_port

PROMPT = "The capital of France is"
FAST_BACKOFF = dict(backoff_initial_s=0.01, backoff_max_s=0.05)
OPENAI_503 = b'{"error": {"message": "The server is overloaded or not ready yet.", "type": "server_error", "code": null}}'


def _upstream(server: LlamaServer) -> str:
    return server.url.removesuffix("/v1")


def _generator(url: str, server: LlamaServer, **kwargs: object) -> OpenAIGenerator:
    options: dict[str, object] = {"api_key": server.api_key, "max_retries": 0}
    options.update(kwargs)
    return OpenAIGenerator(base_url=url, model=server.model, **options)  # type: ignore[arg-type]


@pytest.fixture(autouse=True)
def _server_alive(request: pytest.FixtureRequest) -> Iterator[None]:
    """Tests using the real server fail with its log tail if it has died."""
    server = request.getfixturevalue("llama_server") if "llama_server" in request.fixturenames else None
    if server is not None:
        server.assert_alive()
    yield
    if server is not None:
        server.assert_alive()


# ---------------------------------------------------------------- OpenAI-compatible server


@pytest.mark.slow
def test_openai_generator_completes_a_prompt_deterministically(llama_server: LlamaServer) -> None:
    generator = _generator(llama_server.url, llama_server)
    assert isinstance(generator, TextGenerator)
    first = generator.generate(PROMPT, max_tokens=8, temperature=0.0)
    second = generator.generate(PROMPT, max_tokens=8, temperature=0.0)
    assert isinstance(first, Generation) and first.text.strip()
    assert 1 <= first.completion_tokens <= 8 and first.prompt_tokens > len(PROMPT.split())
    assert first.finish_reason in ("stop", "length") and first.latency_s > 0
    assert second.text == first.text  # greedy decoding


@pytest.mark.slow
def test_wrong_api_key_is_an_auth_error_not_retried_and_not_leaked(
    llama_server: LlamaServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    wrong_key = "wrong-" + str(llama_server.api_key)[::-1]
    with ScriptedServer(lambda i, r: forward(_upstream(llama_server), r)) as proxy:
        generator = _generator(proxy.url + "/v1", llama_server, api_key=wrong_key, max_retries=3, **FAST_BACKOFF)
        with pytest.raises(GeneratorAuthError) as err:
            generator.generate(PROMPT, max_tokens=4, temperature=0.0)
    assert len(proxy.received) == 1 and proxy.replies[0].status == 401  # the real server refused it once
    assert not err.value.transient
    assert wrong_key not in str(err.value) and wrong_key not in caplog.text and wrong_key not in repr(generator)


@pytest.mark.slow
def test_outage_is_retried_until_the_real_server_answers(llama_server: LlamaServer) -> None:
    """Double for the fault only: one 503 (OpenAI's body), then the requests go to the real server."""

    def respond(index: int, request: Received) -> Reply:
        return Reply(503, OPENAI_503) if index == 0 else forward(_upstream(llama_server), request)

    with ScriptedServer(respond) as proxy:
        generator = _generator(proxy.url + "/v1", llama_server, max_retries=2, **FAST_BACKOFF)
        generation = generator.generate(PROMPT, max_tokens=4, temperature=0.0)
    assert len(proxy.received) == 2 and proxy.replies[1].status == 200
    assert generation.completion_tokens >= 1


def test_refused_connection_is_a_transient_error_after_retries() -> None:
    """Real fault: nothing listens on the port."""
    generator = OpenAIGenerator(base_url=f"http://127.0.0.1:{free_port()}/v1", model="m", max_retries=1, **FAST_BACKOFF)
    with pytest.raises(GeneratorUnavailable, match=r"after 2 attempt\(s\): connection error") as err:
        generator.generate(PROMPT, max_tokens=4, temperature=0.0)
    assert err.value.transient


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"base_url": "localhost:8000"}, "base_url"),
        ({"model": ""}, "model"),
        ({"max_retries": -1}, "max_retries"),
        ({"timeout_s": 0}, "timeout_s"),
    ],
)
def test_bad_openai_settings_name_the_field(kwargs: dict[str, object], field: str) -> None:
    options: dict[str, object] = {"base_url": "http://127.0.0.1:1/v1", "model": "m"}
    options.update(kwargs)
    with pytest.raises(ValueError, match=field):
        OpenAIGenerator(**options)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("max_tokens", "temperature", "field"), [(0, 0.0, "max_tokens"), (4, -0.1, "temperature"), (4, 2.5, "temperature")]
)
def test_bad_call_arguments_name_the_field(max_tokens: int, temperature: float, field: str) -> None:
    generator = OpenAIGenerator(base_url="http://127.0.0.1:1/v1", model="m")
    with pytest.raises(ValueError, match=field):
        generator.generate(PROMPT, max_tokens=max_tokens, temperature=temperature)


# ---------------------------------------------------------------- local llama.cpp model


@pytest.fixture(scope="module")
def local_generator() -> LocalGenerator:
    """The default local generator: the packaged Gemma 3 270M base model."""
    return LocalGenerator(cache_dir=cache_dir(), n_threads=2)


@pytest.mark.slow
def test_local_generator_greedy_is_deterministic_and_counts_tokens(local_generator: LocalGenerator) -> None:
    assert isinstance(local_generator, TextGenerator)
    assert not local_generator.uses_chat_template  # the base model ships none: BOS + raw prompt
    ids = local_generator.prompt_ids(PROMPT)
    assert ids[0] == local_generator._llm.token_bos()
    first = local_generator.generate(PROMPT, max_tokens=6, temperature=0.0)
    second = local_generator.generate(PROMPT, max_tokens=6, temperature=0.0)
    assert first.text == second.text and first.text.strip()
    assert first.prompt_tokens == len(ids)
    assert first.completion_tokens == 6 and first.finish_reason == "length"


@pytest.mark.slow
def test_local_sampling_is_seeded_per_call_and_reproducible(local_generator: LocalGenerator) -> None:
    def three_samples() -> list[str]:
        fresh = LocalGenerator(local_generator.source_path, cache_dir=cache_dir(), n_threads=2)
        return [fresh.generate(PROMPT, max_tokens=6, temperature=1.5).text for _ in range(3)]

    samples = three_samples()
    assert len(set(samples)) > 1  # each call draws from its own seeded stream
    assert three_samples() == samples  # a new instance with the same seed repeats the run


GEMMA_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<start_of_turn>{{ m['role'] }}\n{{ m['content'] }}<end_of_turn>\n"
    "{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)


@pytest.mark.slow
def test_a_chat_template_gets_the_real_bos_and_control_tokens(local_generator: LocalGenerator, monkeypatch) -> None:
    """The packaged base model has no template, so Gemma's own template shape is set on the instance."""
    monkeypatch.setattr(local_generator, "_chat_template", GEMMA_TEMPLATE)
    monkeypatch.setattr(local_generator, "uses_chat_template", True)
    llm = local_generator._llm
    start_of_turn = llm.tokenize(b"<start_of_turn>", add_bos=False, special=True)
    ids = local_generator.prompt_ids(PROMPT)
    assert ids[0] == llm.token_bos() and ids.count(llm.token_bos()) == 1  # `{{ bos_token }}` is the BOS token
    assert len(start_of_turn) == 1 and ids.count(start_of_turn[0]) == 2  # user turn, then the model's turn
    assert local_generator.generate(PROMPT, max_tokens=2, temperature=0.0).prompt_tokens == len(ids)


@pytest.mark.slow
def test_local_prompt_too_long_is_refused_before_generating(local_generator: LocalGenerator) -> None:
    too_long = "word " * local_generator.max_context_tokens
    with pytest.raises(GeneratorPromptTooLong, match="exceeds the context"):
        local_generator.generate(too_long, max_tokens=4, temperature=0.0)


def test_missing_local_model_is_model_not_found(tmp_path: Path) -> None:
    with pytest.raises(GeneratorModelNotFound, match="no such file"):
        LocalGenerator(tmp_path / "absent.gguf", cache_dir=tmp_path)
    not_a_model = tmp_path / "notes.txt"
    not_a_model.write_text("hello", encoding="utf-8")
    with pytest.raises(GeneratorModelNotFound, match="not a GGUF file"):
        LocalGenerator(not_a_model, cache_dir=tmp_path)
