"""Conversations as the judges see them, and their rendering to a transcript.

A `Conversation` is an immutable, ordered list of `Turn`s plus free-form
attributes (product, model version, ...). `render_transcript` turns it into
the text a judge reads: each turn between an opening and a closing line
(``<<<user turn 0>>>`` … ``<<<end user turn 0>>>``), its text escaped
(`escape_text`: ``\\`` → ``\\``, ``<`` → ``\\<``) so that it cannot contain
``<<<`` and hence cannot close its own turn, open a turn of another role or
end the transcript early, and its control tokens neutralised
(`neutralise_control_tokens`: a word joiner after every ``<`` and ``[``) so that
no chat-template token (``<|im_end|>``, ``<end_of_turn>``, ``</s>``, ``[INST]``)
survives into the judge's prompt. `parse_transcript` reads a transcript back
into exactly its turns, for any text (a property test holds it).

Truncation policy (for conversations longer than a judge's context):
the first turn (it usually states the user's need) and the *last* turns are
always kept; turns are dropped from the middle, oldest first, and replaced by
one explicit marker line saying how many turns were omitted. If the first and
last turn alone are still too long, each kept turn's text is cut from its
middle with a marker. The last turns are never silently cut.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, cast

from scorers.errors import UserError

Role = Literal["user", "assistant", "system", "tool"]
ROLES: tuple[str, ...] = ("user", "assistant", "system", "tool")

_TURN_OPEN = "<<<{role} turn {index}>>>"
_TURN_CLOSE = "<<<end {role} turn {index}>>>"
_OMITTED = "<<<{n} turn(s) omitted here to fit the judge's context>>>"
_CUT = " [... {n} characters omitted ...] "
_ESCAPED = re.compile(r"\\(.)", re.DOTALL)
TOKEN_BREAK = "\u2060"  # WORD JOINER: invisible (Unicode category Cf), in no special token of any vocabulary
TOKEN_OPENERS = "<["  # the characters every control token of the judges' vocabularies starts with
_BLOCK = re.compile(r"<<<(?P<role>[a-z]+) turn (?P<index>\d+)>>>\n(?P<body>.*?)\n<<<end (?P=role) turn (?P=index)>>>", re.DOTALL)


class ConversationError(UserError, ValueError):
    """A conversation that cannot be built or rendered (bad role, empty, ...)."""


def as_role(value: object) -> Role:
    """``value`` as a `Role`; `ConversationError` if it is not one of `ROLES`."""
    if value not in ROLES:
        raise ConversationError(f"unknown role {value!r}; expected one of {ROLES}")
    return cast(Role, value)


@dataclass(frozen=True)
class Turn:
    """One message in a conversation."""

    role: Role
    text: str
    timestamp: datetime | None = None

    def __post_init__(self) -> None:
        as_role(self.role)
        if not isinstance(self.text, str):
            raise ConversationError(f"turn text must be a string, got {type(self.text).__name__}")


@dataclass(frozen=True)
class Conversation:
    """An ordered conversation with an id and attributes (product, model_version, ...)."""

    id: str
    turns: tuple[Turn, ...]
    attributes: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.id:
            raise ConversationError("conversation id must be a non-empty string")
        object.__setattr__(self, "turns", tuple(self.turns))
        object.__setattr__(self, "attributes", dict(self.attributes))

    @classmethod
    def from_messages(
        cls, id: str, messages: list[Mapping[str, Any]], attributes: Mapping[str, str] | None = None
    ) -> Conversation:
        """Build from OpenAI-style ``[{"role": ..., "content": ...}]`` messages."""
        turns = []
        for i, m in enumerate(messages):
            if "role" not in m or "content" not in m:
                raise ConversationError(f"message {i} of {id!r} needs 'role' and 'content'")
            turns.append(Turn(role=m["role"], text=m["content"]))
        return cls(id=id, turns=tuple(turns), attributes=attributes or {})

    def content_hash(self) -> str:
        """Stable hash of roles and texts (not timestamps or attributes): a cache key."""
        return content_hash((t.role, t.text) for t in self.turns)


def content_hash(turns: Iterable[tuple[str, str]]) -> str:
    """`Conversation.content_hash` of the (role, text) pairs of a conversation's turns, in order."""
    payload = json.dumps([[role, text] for role, text in turns], ensure_ascii=False)
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()[:16]


def neutralise_control_tokens(text: str) -> str:
    """``text`` with a `TOKEN_BREAK` (an invisible word joiner) after every ``<`` and ``[`` (`TOKEN_OPENERS`).

    Why: llama.cpp's server (``judge serve``) and OpenAI-compatible servers tokenize the rendered chat template
    with special tokens on, so ``<|im_end|>``, ``<end_of_turn>``, ``</s>`` or ``[INST]`` written in a turn would
    become the template's own control tokens and end the judge's message early or open an assistant turn. Every
    control token of Qwen's, Gemma's and Llama's vocabularies starts with ``<`` or ``[``, and none holds a word
    joiner, so after this no substring of the text is one, whatever its case or spacing; the judge still reads
    the same characters. This is the one rule for every text that enters a judge's or generator's prompt
    (`restore_control_tokens` undoes it)."""
    for opener in TOKEN_OPENERS:
        text = text.replace(opener, opener + TOKEN_BREAK)
    return text


def restore_control_tokens(text: str) -> str:
    """The text `neutralise_control_tokens` neutralised (each opener is followed by exactly the break it added)."""
    for opener in TOKEN_OPENERS:
        text = text.replace(opener + TOKEN_BREAK, opener)
    return text


def escape_text(text: str) -> str:
    """A turn's text as the transcript shows it: ``\\`` and ``<`` escaped as ``\\\\`` and ``\\<``, then its control
    tokens neutralised (`neutralise_control_tokens`). Every ``<`` of the result follows an escaping backslash, so
    it never contains ``<<``, let alone a ``<<<`` delimiter: whatever a turn says, only the renderer opens and
    closes turns, and no chat-template token reaches the judge (`parse_transcript` undoes both)."""
    return neutralise_control_tokens(text.replace("\\", "\\\\").replace("<", "\\<"))


def unescape_text(body: str) -> str:
    """The text `escape_text` escaped."""
    return _ESCAPED.sub(r"\1", restore_control_tokens(body))


def _render_turn(index: int, turn: Turn, body: str | None = None) -> str:
    """One turn's block; ``body`` is its already escaped (and possibly cut) text, by default all of it."""
    body = escape_text(turn.text) if body is None else body
    return f"{_TURN_OPEN.format(role=turn.role, index=index)}\n{body}\n{_TURN_CLOSE.format(role=turn.role, index=index)}"


def _escaped_prefix(text: str, budget: int) -> str:
    """The longest start of ``text`` whose escaped form is at most ``budget`` characters."""
    used = 0
    for i, ch in enumerate(text):
        used += len(escape_text(ch))
        if used > budget:
            return text[:i]
    return text


def _cut_middle(text: str, keep: int) -> str:
    """``text`` escaped, cut in its middle (never inside an escape) so that it takes at most about ``keep``
    characters besides the marker that says how many characters were left out."""
    if len(escape_text(text)) <= keep:
        return escape_text(text)
    head = _escaped_prefix(text, keep // 2)
    tail = _escaped_prefix(text[::-1], keep - keep // 2)[::-1]
    return escape_text(head) + _CUT.format(n=len(text) - len(head) - len(tail)) + escape_text(tail)


def render_transcript(conversation: Conversation, max_chars: int | None = None) -> str:
    """Render turns with unambiguous delimiters, truncated to ``max_chars`` per the module policy."""
    if not conversation.turns:
        raise ConversationError(f"conversation {conversation.id!r} has no turns")
    blocks = [_render_turn(i, t) for i, t in enumerate(conversation.turns)]
    full = "\n".join(blocks)
    if max_chars is None or len(full) <= max_chars:
        return full

    n = len(blocks)
    # Keep turn 0 and as many of the last turns as fit; drop from the middle.
    kept_tail: list[int] = []
    budget = max_chars - len(blocks[0]) - len(_OMITTED.format(n=n)) - 2
    for i in range(n - 1, 0, -1):
        cost = len(blocks[i]) + 1
        if cost > budget:
            break
        kept_tail.insert(0, i)
        budget -= cost
    if kept_tail:
        omitted = (kept_tail[0] - 1) if kept_tail else 0
        parts = [blocks[0]]
        if omitted:
            parts.append(_OMITTED.format(n=omitted))
        parts += [blocks[i] for i in kept_tail]
        return "\n".join(parts)

    # Even first + last do not fit: keep both, each cut in its middle.
    first, last = conversation.turns[0], conversation.turns[-1]
    overhead = len(_render_turn(0, first, "")) + len(_render_turn(n - 1, last, "")) + len(_OMITTED.format(n=n)) + 2
    per_turn = max((max_chars - overhead) // 2 - len(_CUT.format(n=10**9)), 0)
    parts = [_render_turn(0, first, _cut_middle(first.text, per_turn))]
    if n > 2:
        parts.append(_OMITTED.format(n=n - 2))
    if n > 1:
        parts.append(_render_turn(n - 1, last, _cut_middle(last.text, per_turn)))
    return "\n".join(parts)


def parse_transcript(transcript: str) -> list[tuple[int, Role, str]]:
    """The turns (index, role, text) of a transcript `render_transcript` made without truncation: its inverse,
    which the property tests use to show that no text can forge the structure. `ConversationError` if the text
    is not such a transcript."""
    turns: list[tuple[int, Role, str]] = []
    position = 0
    for match in _BLOCK.finditer(transcript):
        separator = transcript[position : match.start()]
        if separator != ("\n" if turns else ""):
            raise ConversationError(f"not a transcript: {separator[:40]!r} between turn blocks")
        turns.append((int(match["index"]), as_role(match["role"]), unescape_text(match["body"])))
        position = match.end()
    if not turns or position != len(transcript):
        raise ConversationError("not a transcript: it does not end with a turn block")
    return turns
