"""Redaction of personal data before text leaves for the judge: each kind, what is left alone, and the scorer's use.

The scorer tests use the real recorded judge behind `SpyJudge`, which only records what the judge was shown.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from scorers.conversation import Conversation
from scorers.judges.base import Judgement
from scorers.questions import Question
from scorers.redaction import PLACEHOLDERS, RedactingJudge, RedactionError, Redactor, luhn_valid
from stream.metrics import ServiceMetrics
from stream.records import ClosedConversation
from stream.scoring import ConversationScorer
from stream.settings import RedactionSettings
from tests.unit.test_scoring import closed_conversations as closed_conversations
from tests.unit.test_scoring import conversation as conversation
from tests.unit.test_scoring import fast_retries, sample
from tests.unit.test_scoring import judge as judge
from tests.unit.test_scoring import rubric_set as rubric_set
from tests.unit.test_scoring import unfitted as unfitted


@pytest.mark.parametrize(
    ("kind", "text", "expected"),
    [
        ("email", "write to jane.doe+news@mail.example.co.uk today", "write to [EMAIL] today"),
        ("email", "Is a@b.c an address?", "Is a@b.c an address?"),  # one-letter top-level domain: not one
        ("phone", "call (415) 555-2671 now", "call [PHONE] now"),
        ("phone", "or +44 20 7946 0958", "or [PHONE]"),
        ("phone", "order 1234567890123 of 2024-02-09 at 10:30", "order 1234567890123 of 2024-02-09 at 10:30"),
        ("card", "card 4111 1111 1111 1111 exp 12/27", "card [CARD] exp 12/27"),
        ("card", "card 4111-1111-1111-1112", "card 4111-1111-1111-1112"),  # fails Luhn: not a card
        ("card", "amex 378282246310005.", "amex [CARD]."),
        ("card", "app id 00000002-0000-0000-c000-000000000000", "app id 00000002-0000-0000-c000-000000000000"),  # a GUID
        ("key", "my key is sk-proj-abcdefghijklmnopqrstuvwx, help", "my key is [KEY], help"),
        ("key", "AKIAIOSFODNN7EXAMPLE and ghp_" + "a" * 36, "[KEY] and [KEY]"),
        ("key", "Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.abc", "Authorization: [KEY]"),
        ("key", "-----BEGIN RSA PRIVATE KEY-----\nMIIE\n-----END RSA PRIVATE KEY-----!", "[KEY]!"),
    ],
)
def test_each_kind_is_replaced_and_look_alikes_are_left(kind: str, text: str, expected: str) -> None:
    done = Redactor((kind,)).redact(text)
    assert done.text == expected
    assert done.counts[kind] == expected.count(PLACEHOLDERS[kind])


def test_only_the_configured_kinds_are_replaced_and_the_counts_add_up() -> None:
    text = "jane@example.com, 4111 1111 1111 1111, (415) 555-2671, sk-abcdefghijklmnopqrstuvwxyz"
    assert Redactor(("email",)).redact(text).text.startswith("[EMAIL], 4111")
    done = Redactor().redact(text)
    assert done.text == "[EMAIL], [CARD], [PHONE], [KEY]"
    assert dict(done.counts) == {"email": 1, "card": 1, "phone": 1, "key": 1}
    assert Redactor().redact(done.text).text == done.text  # placeholders are never redacted again


def test_national_numbers_are_read_in_the_configured_region() -> None:
    assert Redactor(("phone",), "GB").redact("ring 020 7946 0958").text == "ring [PHONE]"
    assert Redactor(("phone",), "US").redact("ring 020 7946 0958").text == "ring 020 7946 0958"


def test_bad_settings_are_refused_by_name() -> None:
    with pytest.raises(RedactionError, match="'names'"):
        Redactor(("names",))
    with pytest.raises(RedactionError, match="'XX'"):
        Redactor(("phone",), "XX")
    assert luhn_valid("79927398713") and not luhn_valid("79927398710")


class SpyJudge:
    """The real recorded judge; records the turn texts each call was shown."""

    def __init__(self, inner) -> None:
        self.inner, self.name, self.model, self.seen = inner, inner.name, inner.model, []

    def judge(self, conversation: Conversation, questions: list[Question]) -> Judgement:
        self.seen.append([t.text for t in conversation.turns])
        return self.inner.judge(conversation, questions)


def _with_pii(closed: ClosedConversation) -> ClosedConversation:
    first = closed.turns[0]
    return replace(closed, turns=(replace(first, text=first.text + " Reach me at jane@example.com."), *closed.turns[1:]))


@pytest.mark.parametrize("stored", [False, True])
def test_the_judge_sees_redacted_text_and_the_store_what_the_setting_says(judge, rubric_set, conversation, stored) -> None:
    spy, metrics = SpyJudge(judge), ServiceMetrics()
    settings = RedactionSettings(kinds=["email"], stored=stored)
    scorer = ConversationScorer(spy, rubric_set, None, fast_retries(), metrics, redaction=settings)
    closed = _with_pii(conversation)
    record = asyncio.run(scorer.score(closed))
    assert record.status == "scored" and spy.seen
    assert all("jane@example.com" not in text for call in spy.seen for text in call)
    assert any("[EMAIL]" in text for call in spy.seen for text in call)
    stored_text = record.conversation.turns[0].text
    assert ("[EMAIL]" in stored_text) == stored and ("jane@example.com" in stored_text) == (not stored)
    assert sample(metrics, "convowatch_redactions_total", kind="email") == 1
    unredacted = ConversationScorer(SpyJudge(judge), rubric_set, None, fast_retries(), ServiceMetrics())
    assert asyncio.run(unredacted.score(closed)).conversation == closed  # off by default


def test_the_offline_judge_reads_redacted_turns(judge, rubric_set, conversation) -> None:
    """`RedactingJudge` (what the offline commands' judge is with ``redaction.kinds``): the wrapped judge is shown every
    turn redacted, answers as it would unwrapped, and keeps its identity; without a redactor nothing is wrapped."""
    spy = SpyJudge(judge)
    redacting = RedactingJudge.wrap(spy, Redactor(("email", "card")))
    original = _with_pii(conversation).to_conversation()
    original = replace(original, turns=(*original.turns, replace(original.turns[-1], text="card 4111 1111 1111 1111")))
    questions = rubric_set.questions()
    got = redacting.judge(original, questions)
    assert got == judge.judge(original, questions)
    shown = spy.seen[-1]
    assert len(shown) == len(original.turns) and shown[-1] == "card [CARD]"
    assert "[EMAIL]" in shown[0] and "jane@example.com" not in shown[0]
    assert shown[1:-1] == [t.text for t in original.turns[1:-1]]  # turns without personal data pass unchanged
    assert Redactor(("email", "card")).redact_conversation(original)[1] == {"email": 1, "card": 1}
    assert (redacting.name, redacting.model) == (judge.name, judge.model)
    assert RedactingJudge.wrap(spy, None) is spy
