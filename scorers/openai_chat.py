"""An OpenAI-compatible chat endpoint under the shared retry policy (`ChatEndpoint`).

`OpenAIJudge` (`scorers.judges.openai_http`) and `OpenAIGenerator`
(`scorers.learning.generators`) differ in what they ask and read, not in how they
reach the endpoint or survive failures, so both hold a `ChatEndpoint`:

- 429, 408, 5xx, timeouts and connection errors are retried with exponential
  backoff and full jitter (delay before retry r uniform in
  ``[0, min(backoff_max_s, backoff_initial_s * 2**r)]``), at most
  ``max_retries`` times, then ``errors.unavailable``; each retry logs a warning.
- Not retried: 401/403 (``errors.auth``), 404 or a ``model_not_found`` error
  code (``errors.model_not_found``), other 4xx (``errors.rejected``), and
  anything else, including a reply that is not a chat completion
  (``errors.reply``).

What a server says in an error goes into messages, logs and (as ``unscored_reason``) ClickHouse only as
`scorers.secret_scrub` describes it: an HTTP error as its status, error type, length and SHA-256 prefix plus a short
excerpt, the API key removed in every form the scrubber knows (encoded, cut), control characters dropped; a 401/403
reply is not kept at all. The errors raised do not chain the client's exception (``from None``): its message holds
the whole body, and a logged traceback would print it.

Each caller names its own exception classes and its role word ("judge",
"generator") in a `ChatErrors`, so messages read ``judge 'm' at <url> ...``.
The openai client is built with ``max_retries=0`` so this is the only policy.
"""

from __future__ import annotations

import contextlib
import logging
import random
import time
from collections.abc import Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import openai
from openai.types.chat import ChatCompletion

from scorers.errors import ModelAuthError, ModelError, ModelNotFound, ModelReplyError, ModelUnavailable
from scorers.secret_scrub import describe_error_body, safe_excerpt

# Sent when the endpoint needs no key: the openai client refuses to run without one,
# and falling back to OPENAI_API_KEY from the environment would bypass our settings.
NO_API_KEY = "no-key"
RETRYABLE_STATUS = frozenset({408, 429})  # plus every 5xx
MAX_DETAIL_CHARS = 300  # of a server's error text kept in an error message


@dataclass(frozen=True)
class ChatErrors:
    """The exception classes one caller raises, and the word naming it in messages."""

    role: str
    unavailable: type[ModelUnavailable]
    auth: type[ModelAuthError]
    model_not_found: type[ModelNotFound]
    rejected: type[ModelError]
    reply: type[ModelReplyError]


def require(ok: bool, field: str, value: object, rule: str) -> None:
    """Raise ``ValueError("<field> must be <rule>, got <value>")`` unless ``ok`` (argument checks)."""
    if not ok:
        raise ValueError(f"{field} must be {rule}, got {value!r}")


class ChatEndpoint:
    """The HTTP client of one model at an OpenAI-compatible ``base_url``, and `complete` under the retry policy."""

    def __init__(
        self,
        *,
        base_url: str,
        model: str,
        errors: ChatErrors,
        log: logging.Logger,
        api_key: str | None = None,
        timeout_s: float = 60.0,
        max_retries: int = 5,
        backoff_initial_s: float = 0.5,
        backoff_max_s: float = 30.0,
        rng: random.Random | None = None,
    ) -> None:
        """``rng`` seeds the backoff jitter; ValueError names a bad argument."""
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must be an http(s) URL, got {base_url!r}")
        if not model:
            raise ValueError("model must be a non-empty string")
        require(max_retries >= 0, "max_retries", max_retries, ">= 0")
        require(backoff_initial_s > 0, "backoff_initial_s", backoff_initial_s, "> 0")
        require(backoff_max_s > 0, "backoff_max_s", backoff_max_s, "> 0")
        require(timeout_s > 0, "timeout_s", timeout_s, "> 0")
        self.base_url = base_url
        self.model = model
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self._errors = errors
        self._log = log
        self._rng = rng or random.Random()
        self._api_key = api_key or ""
        self._client = openai.OpenAI(base_url=base_url, api_key=api_key or NO_API_KEY, timeout=timeout_s, max_retries=0)

    def close(self) -> None:
        """Close the HTTP connection pool."""
        self._client.close()

    def complete(
        self, create_kwargs: Mapping[str, Any], slots: AbstractContextManager[Any] | None = None
    ) -> tuple[ChatCompletion, int]:
        """``chat.completions.create(model=model, **create_kwargs)`` under the retry policy.

        Returns the completion and the number of attempts it took. ``slots`` (e.g. a
        semaphore) is held around each request only, never during a backoff sleep.
        """
        errors, attempts = self._errors, self.max_retries + 1
        for attempt in range(attempts):
            try:
                with slots if slots is not None else contextlib.nullcontext():
                    completion = self._client.chat.completions.create(model=self.model, **create_kwargs)
            except openai.APIError as e:
                reason = _transient_reason(
                    e, base_url=self.base_url, model=self.model, timeout_s=self.timeout_s, errors=errors, secret=self._api_key
                )
            else:
                if not isinstance(completion, ChatCompletion):
                    raise errors.reply(f"{errors.role} {self.model!r} sent a reply that is not a chat completion")
                return completion, attempt + 1
            if attempt + 1 == attempts:
                raise errors.unavailable(
                    f"{errors.role} {self.model!r} at {self.base_url} still failing after {attempts} attempt(s): {reason}"
                ) from None  # the client's exception holds the whole error body (module docstring)
            delay = self._rng.uniform(0.0, min(self.backoff_max_s, self.backoff_initial_s * 2**attempt))
            self._log.warning(
                "%s %r at %s: attempt %d/%d failed (%s); retrying in %.2fs",
                errors.role,
                self.model,
                self.base_url,
                attempt + 1,
                attempts,
                reason,
                delay,
            )
            time.sleep(delay)
        raise AssertionError("unreachable")  # pragma: no cover


def server_detail(message: str, secret: str = "") -> str:
    """A server's text fit to log and store: the API key removed in any form `scorers.secret_scrub.scrub` knows,
    control characters dropped, at most `MAX_DETAIL_CHARS` characters. Error text ends up in logs, on the scores
    topic and in ClickHouse (``unscored_reason``), so nothing a server says goes there unfiltered."""
    return safe_excerpt(message, secret, MAX_DETAIL_CHARS)


def _status_error_detail(e: openai.APIStatusError, secret: str) -> str:
    """An HTTP error reply as `describe_error_body` keeps it (status, type, length, digest, short excerpt)."""
    try:
        body: str | bytes = e.response.content
    except Exception:  # the body was not read (streamed): the client's message is all there is
        body = e.message
    return describe_error_body(e.status_code, body, secret)


def _transient_reason(
    e: openai.APIError, *, base_url: str, model: str, timeout_s: float, errors: ChatErrors, secret: str = ""
) -> str:
    """Describe a retryable failure, or raise the non-retryable error it maps to."""
    role = errors.role
    if isinstance(e, openai.APITimeoutError):
        return f"timed out after {timeout_s}s"
    if isinstance(e, openai.APIConnectionError):
        return f"connection error: {server_detail(str(e.__cause__ or e), secret)}"
    if isinstance(e, openai.APIStatusError):
        status = e.status_code
        detail = _status_error_detail(e, secret)
        if status in RETRYABLE_STATUS or status >= 500:
            return detail
        if status in (401, 403):
            # Not even filtered: a server may echo the key in a form the filter does not know (encoded, cut).
            raise errors.auth(f"{role} at {base_url} refused the API key (HTTP {status}; its reply is not kept)") from None
        if status == 404 or e.code == "model_not_found":
            raise errors.model_not_found(
                f"{role} at {base_url} does not serve model {model!r} ({detail}); "
                "check the model name and that base_url is the API root (e.g. ending in /v1)"
            ) from None
        raise errors.rejected(f"{role} at {base_url} rejected the request ({detail})") from None
    raise errors.reply(f"{role} {model!r} at {base_url} sent an unusable reply: {server_detail(str(e), secret)}") from None
