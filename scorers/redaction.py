"""Redacting personal data from conversation text before it leaves for a judge.

A hosted judge is a third party: a product may not send it its users' e-mail
addresses, phone numbers, card numbers or the API keys users paste into a
chat. `Redactor` replaces each found item with a placeholder naming its kind
(``[EMAIL]``, ``[PHONE]``, ``[CARD]``, ``[KEY]``), so the judge still reads
that something was there:

* ``email``: an address ``local@domain.tld``;
* ``phone``: what Google's libphonenumber (the maintained ``phonenumbers``
  port) matches as a *valid* number, national numbers read in ``region``;
* ``card``: 13-19 digits, spaces or dashes between them allowed, passing the
  Luhn check (so order numbers and dates are left alone);
* ``key``: well-known secret formats — OpenAI ``sk-…``, AWS access key ids,
  GitHub, Slack and Google API tokens, ``Bearer`` tokens and PEM private keys.

Names and street addresses are not detected: no pattern finds them reliably,
and a model-based detector would be a second judge. The measured recall and
false positives on planted items are in docs/service.md (``bench/redaction.py``).

`RedactingJudge` puts a redactor in front of any judge, so the offline
commands (``learn``, ``rubrics``, ``calibrate``) keep the worker's promise too.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, TypeVar

import phonenumbers

from scorers.conversation import Conversation
from scorers.errors import UserError
from scorers.judges.base import Judge, Judgement
from scorers.questions import Question

REDACTION_KINDS = ("key", "email", "card", "phone")  # in the order they are applied
PLACEHOLDERS = {kind: f"[{kind.upper()}]" for kind in REDACTION_KINDS}

_EMAIL = re.compile(r"(?<![\w.%+-])[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}(?![\w-])")
_CARD = re.compile(r"(?<![\w.-])\d(?:[ -]?\d){12,18}(?![\w-])")
_KEYS = re.compile(
    "|".join(
        (
            r"-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?-----END [A-Z ]*PRIVATE KEY-----",
            r"\bsk-(?:proj-|ant-)?[A-Za-z0-9_-]{20,}",
            r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b",
            r"\bgh[pousr]_[A-Za-z0-9]{36,}\b",
            r"\bgithub_pat_[A-Za-z0-9_]{22,}\b",
            r"\bxox[abprs]-[A-Za-z0-9-]{10,}",
            r"\bAIza[0-9A-Za-z_-]{35}\b",
            r"\bBearer\s+[A-Za-z0-9._~+/-]{20,}=*",
        )
    )
)


class _HasText(Protocol):
    @property
    def text(self) -> str: ...


TurnT = TypeVar("TurnT", bound=_HasText)


class RedactionError(UserError, ValueError):
    """Redaction settings that cannot be used; the message names the setting."""


def luhn_valid(digits: str) -> bool:
    """The Luhn checksum every payment card number passes."""
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = int(ch) * (2 if i % 2 else 1)
        total += d - 9 if d > 9 else d
    return total % 10 == 0


@dataclass(frozen=True)
class Redacted:
    """A text with its personal data replaced, and how many items of each kind were."""

    text: str
    counts: Counter[str] = field(default_factory=Counter)


@dataclass(frozen=True)
class Redactor:
    """Replaces the personal data of ``kinds`` in texts; phone numbers without a country code are read in ``region``."""

    kinds: tuple[str, ...] = REDACTION_KINDS
    region: str = "US"

    def __post_init__(self) -> None:
        unknown = [k for k in self.kinds if k not in REDACTION_KINDS]
        if unknown:
            raise RedactionError(f"redaction kinds {unknown} are not among {list(REDACTION_KINDS)}")
        if self.region not in phonenumbers.SUPPORTED_REGIONS:
            raise RedactionError(f"phone region {self.region!r} is not a region code libphonenumber knows (e.g. US, GB, DE)")

    def redact(self, text: str) -> Redacted:
        counts: Counter[str] = Counter()
        for kind in REDACTION_KINDS:
            if kind in self.kinds:
                text, n = _REDACT[kind](self, text)
                if n:
                    counts[kind] += n
        return Redacted(text, counts)

    def redact_turns(self, turns: Iterable[TurnT]) -> tuple[tuple[TurnT, ...], Counter[str]]:
        """Each turn (a dataclass with a ``text``) with its text redacted, and how many items of each kind were
        replaced; a turn with nothing to replace is returned as it is."""
        counts: Counter[str] = Counter()
        redacted = []
        for turn in turns:
            done = self.redact(turn.text)
            counts.update(done.counts)
            redacted.append(replace(turn, text=done.text) if done.counts else turn)  # type: ignore[type-var]
        return tuple(redacted), counts

    def redact_conversation(self, conversation: Conversation) -> tuple[Conversation, Counter[str]]:
        """``conversation`` with every turn redacted, and how many items of each kind were replaced."""
        turns, counts = self.redact_turns(conversation.turns)
        return replace(conversation, turns=turns), counts

    def _phones(self, text: str) -> tuple[str, int]:
        matches = list(phonenumbers.PhoneNumberMatcher(text, self.region, leniency=phonenumbers.Leniency.VALID))
        for m in reversed(matches):
            text = text[: m.start] + PLACEHOLDERS["phone"] + text[m.end :]
        return text, len(matches)


def _cards(_: Redactor, text: str) -> tuple[str, int]:
    n = 0

    def card(m: re.Match[str]) -> str:
        nonlocal n
        digits = re.sub(r"[ -]", "", m.group())
        if 13 <= len(digits) <= 19 and luhn_valid(digits):
            n += 1
            return PLACEHOLDERS["card"]
        return m.group()

    return _CARD.sub(card, text), n


_REDACT = {
    "key": lambda _, text: _KEYS.subn(PLACEHOLDERS["key"], text),
    "email": lambda _, text: _EMAIL.subn(PLACEHOLDERS["email"], text),
    "card": _cards,
    "phone": Redactor._phones,
}


class RedactingJudge:
    """A judge that reads every conversation redacted.

    Other attributes are the wrapped judge's (name, model, questions per call), so answer caches keyed by the judge's
    identity are shared with the unwrapped judge.
    """

    def __init__(self, judge: Judge, redactor: Redactor) -> None:
        self._judge = judge
        self._redactor = redactor

    @classmethod
    def wrap(cls, judge: Judge, redactor: Redactor | None) -> Judge:
        """``judge`` behind ``redactor``; ``judge`` itself when redaction is off (``None``)."""
        return judge if redactor is None else cls(judge, redactor)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._judge, name)

    def judge(self, conversation: Conversation, questions: Sequence[Question]) -> Judgement:
        return self._judge.judge(self._redactor.redact_conversation(conversation)[0], questions)
