"""The judge protocol: a conversation and questions in, answer distributions out.

Every backend (OpenAI-compatible HTTP, local llama.cpp, recorded replay)
returns a `Judgement`: for each question, one probability per option *as the
model gave it* (not renormalised: the mass the options failed to cover is
information, LLM-Rubric §3), the covered mass, and provenance.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from typing import Protocol, runtime_checkable

from scorers.conversation import Conversation
from scorers.errors import ModelAuthError, ModelError, ModelNotFound, ModelReplyError, ModelUnavailable
from scorers.questions import Question


class JudgeError(ModelError, RuntimeError):
    """Base class for judge failures (`GeneratorError`'s twin). ``transient`` failures are worth retrying later."""


class JudgeUnavailable(JudgeError, ModelUnavailable):
    """The judge could not be reached or kept failing (timeouts, 429, 5xx) after retries (transient)."""


class JudgeAuthError(JudgeError, ModelAuthError):
    """The judge refused the credentials (bad or missing API key)."""


class JudgeModelNotFound(JudgeError, ModelNotFound):
    """The judge does not serve the requested model."""


class JudgeReplyError(JudgeError, ModelReplyError):
    """The judge replied, but not in a usable form (no logprobs, wrong number of answer lines, ...)."""


class UnknownConversation(JudgeError):
    """A recorded judge has no answers for this conversation or question."""


MAX_REPLY_ERROR_DETAIL_CHARS = 300  # of an exception's text kept in the `JudgeReplyError` it becomes


def error_excerpt(text: str, limit: int = MAX_REPLY_ERROR_DETAIL_CHARS) -> str:
    """``text`` fit for a message that is logged and stored: control characters dropped, at most ``limit``
    characters."""
    text = "".join(ch if ch.isprintable() else " " for ch in text)
    return text if len(text) <= limit else text[: limit - 1] + "…"


@contextmanager
def reply_errors_as_judge_errors(who: str, scrub: Callable[[str], str] = error_excerpt) -> Iterator[None]:
    """The boundary where a judge asks and reads its reply: any `Exception` raised inside that is not a `JudgeError`
    (a KeyError, TypeError, AttributeError, IndexError, ValueError, ... from a reply of the wrong shape) leaves as a
    `JudgeReplyError` naming ``who`` and the exception (its text through ``scrub``: bounded, no secrets), so the scorer
    retries it or stores the conversation unscored instead of crashing. BaseExceptions that are not `Exception`
    (CancelledError, KeyboardInterrupt, SystemExit) pass through untouched."""
    try:
        yield
    except JudgeError:
        raise
    except Exception as e:
        # Not chained (``from None``): the exception's text may hold the whole reply, and a logged traceback prints it.
        raise JudgeReplyError(f"{who} sent an unusable reply ({type(e).__name__}: {scrub(str(e))})") from None


@dataclass(frozen=True)
class Answer:
    """A judge's distribution over one question's options (in the question's option order)."""

    question_id: str
    probabilities: tuple[float, ...]

    def __post_init__(self) -> None:
        probs = tuple(float(p) for p in self.probabilities)
        object.__setattr__(self, "probabilities", probs)
        if any(not math.isfinite(p) or p < 0.0 for p in probs):
            raise JudgeReplyError(f"{self.question_id}: probabilities must be finite and >= 0, got {probs}")
        if sum(probs) > 1.0 + 1e-6:
            raise JudgeReplyError(f"{self.question_id}: probabilities sum to {sum(probs):.6f} > 1")

    @property
    def covered_mass(self) -> float:
        """Probability mass the options received (1 - mass on other tokens)."""
        return float(sum(self.probabilities))

    def expected_value(self, values: Sequence[float]) -> float:
        """Expected option value under the distribution renormalised over the covered mass.

        Raises `JudgeReplyError` when the options received no mass at all.
        """
        mass = self.covered_mass
        if mass <= 0.0:
            raise JudgeReplyError(f"{self.question_id}: no probability mass on any option")
        return sum(p * v for p, v in zip(self.probabilities, values)) / mass


@dataclass(frozen=True)
class Provenance:
    """Who answered and at what cost."""

    judge: str
    model: str
    latency_s: float = 0.0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    calls: int = 0
    cached_prompt_tokens: int = 0  # part of prompt_tokens the server reports it served from its prompt cache

    @classmethod
    def total(cls, provenances: Sequence[Provenance]) -> Provenance:
        """Several calls as one: the first's judge and model, every count (and the latency) summed."""
        if not provenances:
            raise ValueError("no provenance to total")
        first = provenances[0]
        counts = {f.name: sum(getattr(p, f.name) for p in provenances) for f in fields(cls) if f.name not in ("judge", "model")}
        return cls(judge=first.judge, model=first.model, **counts)


@dataclass(frozen=True)
class Judgement:
    """All answers of one judge about one conversation."""

    conversation_id: str
    answers: Mapping[str, Answer]
    provenance: Provenance
    extra: Mapping[str, str] = field(default_factory=dict)

    def probability_vector(self, question_ids: Sequence[str], n_options: Mapping[str, int]) -> list[float]:
        """Concatenate answer distributions in ``question_ids`` order (calibration input ``x``)."""
        out: list[float] = []
        for qid in question_ids:
            probs = self.answers[qid].probabilities
            width = n_options[qid]
            out.extend(list(probs[:width]) + [0.0] * (width - len(probs)))
        return out


@runtime_checkable
class Judge(Protocol):
    """Anything that can answer multiple-choice questions about a conversation.

    A judge whose ``judge`` only reads memory (no network, no model to wait for) may say so with a class attribute
    ``answers_in_memory = True`` (`answers_in_memory`): the worker then calls it on its event loop instead of a thread.
    """

    name: str

    def judge(self, conversation: Conversation, questions: Sequence[Question]) -> Judgement:
        """Answer every question about ``conversation``; raise a `JudgeError` on failure."""
        ...


def answers_in_memory(judge: Judge) -> bool:
    """Whether ``judge`` answers from memory without waiting on anything (its ``answers_in_memory`` attribute; False
    when it has none): such a judge is cheaper to call directly than through a thread."""
    return getattr(judge, "answers_in_memory", False) is True
