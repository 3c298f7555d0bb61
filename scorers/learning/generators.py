"""Generative LLM backends for rubric learning: a prompt in, text out.

Judges (`scorers.judges`) read answer *distributions*; rubric learning needs
*text* (reasons, rubric assertions). `TextGenerator` is that second protocol,
with two backends matching the judge layer's:

- `OpenAIGenerator`: any OpenAI-compatible ``/chat/completions`` endpoint
  (OpenAI, vLLM, llama.cpp server). The prompt is sent as one user message.
  Failures follow the judge's policy (`scorers.openai_chat`): 429, 408,
  5xx, timeouts and connection errors are retried with exponential backoff and
  full jitter (delay before retry r uniform in ``[0, min(backoff_max_s,
  backoff_initial_s * 2**r)]``) at most ``max_retries`` times, then
  `GeneratorUnavailable` (transient); 401/403 give `GeneratorAuthError`, 404 or
  ``model_not_found`` give `GeneratorModelNotFound`, other 4xx
  `GeneratorError`, a reply with no choices `GeneratorReplyError`; none of
  those is retried. The openai client's own retries are off. The API key is
  handed to the client and never put in messages, logs or ``repr``.
- `LocalGenerator`: a GGUF model run in-process on llama.cpp (CPU), loaded as
  `scorers.judges.local` loads its model (default: the packaged Gemma 3 270M
  *base* model, far too weak to follow the rubric-learning prompts —
  plumbing-grade, for tests and demos). When the GGUF carries a chat template
  the prompt is one user message of it; otherwise the raw prompt follows the
  BOS token. Temperature 0 is greedy decoding (deterministic); a higher
  temperature samples with llama.cpp's sampler seeded from ``seed`` and a
  per-instance call counter, so a run is reproducible and no global RNG is
  touched.

A reply's text is returned as the model wrote it, with its token counts,
wall time (including retries) and finish reason (``"length"`` when
``max_tokens`` cut it). Judging whether the text is usable is the caller's job
(`scorers.learning.generation`).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import openai
from openai.types.chat import ChatCompletion

from scorers.errors import ModelAuthError, ModelError, ModelNotFound, ModelPromptTooLong, ModelReplyError, ModelUnavailable
from scorers.judges.local import (
    DEFAULT_MAX_CONTEXT_TOKENS,
    LocalModelError,
    default_cache_dir,
    encode,
    lead_token_ids,
    load_llama,
    resolve_model,
)
from scorers.openai_chat import ChatEndpoint, ChatErrors, require

log = logging.getLogger(__name__)


class GeneratorError(ModelError, RuntimeError):
    """Base class for generator failures (`JudgeError`'s twin). ``transient`` failures are worth retrying later."""


class GeneratorUnavailable(GeneratorError, ModelUnavailable):
    """The generator could not be reached or kept failing (timeouts, 429, 5xx) after retries (transient)."""


class GeneratorAuthError(GeneratorError, ModelAuthError):
    """The generator refused the credentials (bad or missing API key)."""


class GeneratorModelNotFound(GeneratorError, ModelNotFound):
    """The generator does not serve the requested model, or the local model cannot be loaded."""


class GeneratorReplyError(GeneratorError, ModelReplyError):
    """The generator answered, but with no usable completion (no choices)."""


class GeneratorPromptTooLong(GeneratorError, ModelPromptTooLong):
    """The prompt plus ``max_tokens`` does not fit the local model's context."""


@dataclass(frozen=True)
class Generation:
    """One completion: its text and what it cost."""

    text: str
    prompt_tokens: int
    completion_tokens: int
    latency_s: float
    finish_reason: str | None = None


@runtime_checkable
class TextGenerator(Protocol):
    """Anything that completes a prompt with text."""

    name: str

    def generate(self, prompt: str, *, max_tokens: int, temperature: float) -> Generation:
        """Complete ``prompt`` with at most ``max_tokens`` tokens; raise a `GeneratorError` on failure."""
        ...


_ERRORS = ChatErrors(
    role="generator",
    unavailable=GeneratorUnavailable,
    auth=GeneratorAuthError,
    model_not_found=GeneratorModelNotFound,
    rejected=GeneratorError,
    reply=GeneratorReplyError,
)


def _check_call(max_tokens: int, temperature: float) -> None:
    require(isinstance(max_tokens, int) and max_tokens >= 1, "max_tokens", max_tokens, "an int >= 1")
    require(0.0 <= temperature <= 2.0, "temperature", temperature, "in [0, 2]")


class OpenAIGenerator:
    """Completes prompts through an OpenAI-compatible ``/chat/completions`` endpoint (module docstring)."""

    def __init__(
        self,
        *,
        base_url: str,
        model: str,
        api_key: str | None = None,
        timeout_s: float = 120.0,
        max_retries: int = 5,
        backoff_initial_s: float = 0.5,
        backoff_max_s: float = 30.0,
        seed: int | None = None,
        extra_body: Mapping[str, Any] | None = None,
        name: str = "openai",
        rng: random.Random | None = None,
    ) -> None:
        """``seed`` is sent with every request (servers that honour it sample reproducibly);
        ``extra_body`` adds server-specific JSON fields; ``rng`` seeds the backoff jitter."""
        self.endpoint = ChatEndpoint(
            base_url=base_url,
            model=model,
            errors=_ERRORS,
            log=log,
            api_key=api_key,
            timeout_s=timeout_s,
            max_retries=max_retries,
            backoff_initial_s=backoff_initial_s,
            backoff_max_s=backoff_max_s,
            rng=rng,
        )
        self.name = name
        self.base_url = base_url
        self.model = model
        self.seed = seed
        self.extra_body = dict(extra_body or {})

    def __repr__(self) -> str:
        return f"OpenAIGenerator(base_url={self.base_url!r}, model={self.model!r})"

    def close(self) -> None:
        """Close the HTTP connection pool."""
        self.endpoint.close()

    def __enter__(self) -> OpenAIGenerator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def generate(self, prompt: str, *, max_tokens: int, temperature: float) -> Generation:
        """One chat completion of ``prompt`` under the retry policy."""
        _check_call(max_tokens, temperature)
        started = time.perf_counter()
        completion = self._complete(prompt, max_tokens, temperature)
        latency = time.perf_counter() - started
        if not completion.choices:
            raise GeneratorReplyError(f"generator {self.model!r} replied with no choices")
        choice = completion.choices[0]
        usage = completion.usage
        return Generation(
            text=choice.message.content or "",
            prompt_tokens=usage.prompt_tokens if usage else 0,
            completion_tokens=usage.completion_tokens if usage else 0,
            latency_s=latency,
            finish_reason=choice.finish_reason,
        )

    def _complete(self, prompt: str, max_tokens: int, temperature: float) -> ChatCompletion:
        return self.endpoint.complete(
            {
                "messages": [{"role": "user", "content": prompt}],
                "max_tokens": max_tokens,
                "temperature": temperature,
                "seed": self.seed if self.seed is not None else openai.omit,
                "extra_body": self.extra_body or None,
            }
        )[0]


class LocalGenerator:
    """Completes prompts with a local GGUF model (llama.cpp, CPU); see the module docstring.

    ``model_path``: a ``.gguf`` file; None uses the packaged Gemma 3 270M base
    model. ``max_context_tokens`` caps prompt + completion below the model's
    own limit. ``n_threads``: llama.cpp threads (None = its default). Calls are
    serialised (one model, one lock).
    """

    def __init__(
        self,
        model_path: Path | None = None,
        *,
        cache_dir: Path | None = None,
        max_context_tokens: int = DEFAULT_MAX_CONTEXT_TOKENS,
        n_threads: int | None = None,
        seed: int = 0,
        repetition_penalty: float = 1.0,
        name: str = "local",
    ) -> None:
        require(max_context_tokens >= 1, "max_context_tokens", max_context_tokens, ">= 1")
        require(repetition_penalty > 0, "repetition_penalty", repetition_penalty, "> 0")
        if n_threads is not None:
            require(n_threads >= 1, "n_threads", n_threads, ">= 1")
        self.name = name
        self.cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        self.seed = seed
        self.repetition_penalty = repetition_penalty
        try:
            self.source_path = resolve_model(model_path, self.cache_dir, "local generator")
            self._llm = load_llama(self.source_path, max_context_tokens, n_threads)
        except LocalModelError as e:
            raise GeneratorModelNotFound(str(e)) from e
        self.model = self.source_path.name
        self.max_context_tokens = int(self._llm.n_ctx())
        self._chat_template = self._llm.metadata.get("tokenizer.chat_template")
        self.uses_chat_template = bool(self._chat_template)
        self._lock = threading.Lock()
        self._calls = 0

    def __repr__(self) -> str:
        return f"LocalGenerator(model={self.model!r}, chat_template={self.uses_chat_template})"

    def _special_text(self, token: int) -> str:
        """A token's text with control tokens spelled out (``<bos>``), as a chat template's variables need it."""
        return self._llm.detokenize([token], special=True).decode("utf-8", errors="replace") if token >= 0 else ""

    def prompt_ids(self, prompt: str) -> list[int]:
        """The token ids the model reads for ``prompt`` (chat template, or BOS + raw prompt)."""
        if self.uses_chat_template:
            from llama_cpp.llama_chat_format import Jinja2ChatFormatter

            eos, bos = self._special_text(self._llm.token_eos()), self._special_text(self._llm.token_bos())
            formatter = Jinja2ChatFormatter(self._chat_template, eos_token=eos, bos_token=bos)
            text = formatter(messages=[{"role": "user", "content": prompt}]).prompt
            # The template writes the control tokens itself; the user's prompt inside it stays plain text.
            return list(self._llm.tokenize(text.encode("utf-8"), add_bos=False, special=True))
        return lead_token_ids(self._llm) + encode(self._llm, prompt)

    def generate(self, prompt: str, *, max_tokens: int, temperature: float) -> Generation:
        """Complete ``prompt`` (greedy at temperature 0); `GeneratorPromptTooLong` if it cannot fit."""
        _check_call(max_tokens, temperature)
        started = time.perf_counter()
        ids = self.prompt_ids(prompt)
        if len(ids) + max_tokens > self.max_context_tokens:
            raise GeneratorPromptTooLong(
                f"prompt of {len(ids)} tokens + max_tokens {max_tokens} exceeds the context of "
                f"{self.max_context_tokens} tokens of {self.model}"
            )
        import llama_cpp

        with self._lock:
            self._calls += 1
            self._llm.reset()
            self._llm.set_seed(self.seed * 1_000_003 + self._calls)
            sampling = (
                dict(temp=temperature, top_k=0, top_p=1.0, min_p=0.0)
                if temperature > 0
                else dict(temp=0.0, top_k=1, top_p=1.0, min_p=0.0)
            )
            new: list[int] = []
            stopped = False
            for token in self._llm.generate(ids, reset=True, repeat_penalty=self.repetition_penalty, **sampling):
                if llama_cpp.llama_vocab_is_eog(self._llm._model.vocab, token):
                    stopped = True
                    break
                new.append(token)
                if len(new) >= max_tokens:
                    break
        text = self._llm.detokenize(new, special=False).decode("utf-8", errors="replace")
        return Generation(
            text=text,
            prompt_tokens=len(ids),
            completion_tokens=len(new),
            latency_s=time.perf_counter() - started,
            finish_reason="stop" if stopped or len(new) < max_tokens else "length",
        )
