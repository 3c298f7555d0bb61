"""The exception hierarchy: every error convowatch raises on purpose derives from `ConvowatchError`.

::

    ConvowatchError
    ├── UserError        your input, files or configuration are wrong (fix them and run again)
    └── ServiceError     something convowatch depends on failed, refused or called the work off
        └── ModelError   a judge or generator model failed; ``transient`` ones are worth retrying
            ├── ModelUnavailable     unreachable, or kept failing after retries (transient)
            ├── ModelAuthError       refused the credentials
            ├── ModelNotFound        does not serve the model, or the local model cannot be loaded
            ├── ModelReplyError      replied, but not in a usable form
            └── ModelPromptTooLong   the prompt does not fit the model's context

Each concrete class sits under one of these and keeps the built-in base it had
(``class RubricSetError(UserError, ValueError)``), so ``except ValueError``
still catches it. Judges (`scorers.judges.base`) and generators
(`scorers.learning.generators`) are one family: ``JudgeAuthError`` and
``GeneratorAuthError`` are both `ModelAuthError`, and so on.

The command line (`stream.commands.cli`) prints any `ConvowatchError` as one
``convowatch: error: <message>`` line and exits with code 2; the service
decides per class (a transient `ModelError` is retried, a bad record is
dead-lettered). This module imports nothing, so any layer may use it.
"""

from __future__ import annotations


class ConvowatchError(Exception):
    """Root of every error convowatch raises on purpose; the message says what went wrong and, where it can, what to do."""


class UserError(ConvowatchError):
    """Your input, files or configuration are wrong: the message names the file, line, field or setting."""


class ServiceError(ConvowatchError):
    """Something convowatch depends on failed, refused or called the work off (model, store, broker, Grafana, a server)."""


class ModelError(ServiceError):
    """A judge or generator model failed. ``transient`` failures are worth retrying later."""

    transient: bool = False


class ModelUnavailable(ModelError):
    """The model could not be reached or kept failing (timeouts, 429, 5xx) after retries."""

    transient = True


class ModelAuthError(ModelError):
    """The model's endpoint refused the credentials (bad or missing API key)."""


class ModelNotFound(ModelError):
    """The endpoint does not serve the requested model, or the local model cannot be loaded."""


class ModelReplyError(ModelError):
    """The model replied, but not in a usable form."""


class ModelPromptTooLong(ModelError):
    """The prompt cannot be made to fit the model's context."""
