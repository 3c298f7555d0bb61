"""Conversations with a binary satisfaction label, read from JSONL.

One JSON object per line::

    {"conversation_id": "c1", "label": "positive",
     "turns": [{"role": "user", "text": "..."}, {"role": "assistant", "text": "..."}],
     "attributes": {"product": "help-bot"}}

``label`` is ``"positive"`` / ``"negative"`` (also accepted: true/false, 1/0).
``turns`` may be omitted only for conversations a recorded judge already knows
(it answers by id and never reads the text). Every problem is reported with its
line number; nothing is silently skipped.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scorers.conversation import Conversation, ConversationError, Turn, as_role
from scorers.errors import UserError

_LABELS = {"positive": True, "negative": False, True: True, False: False}


class LabelledDataError(UserError, ValueError):
    """A labelled-conversations file that cannot be used; names the line and field."""


@dataclass(frozen=True)
class LabelledConversation:
    conversation: Conversation
    positive: bool


def parse_conversation(obj: Any, where: str) -> Conversation:
    """A line's ``conversation_id``, ``turns`` and ``attributes`` as a `Conversation` (shared by the labelled-file
    formats)."""
    if not isinstance(obj, dict):
        raise LabelledDataError(f"{where}: expected a JSON object")
    conversation_id = obj.get("conversation_id")
    if not isinstance(conversation_id, str) or not conversation_id:
        raise LabelledDataError(f"{where}: conversation_id must be a non-empty string")
    raw_turns = obj.get("turns", [])
    if not isinstance(raw_turns, list):
        raise LabelledDataError(f"{where}: turns must be a list")
    attributes = obj.get("attributes", {})
    if not isinstance(attributes, dict) or not all(isinstance(v, str) for v in attributes.values()):
        raise LabelledDataError(f"{where}: attributes must be an object of strings")
    turns = []
    for i, t in enumerate(raw_turns):
        if not isinstance(t, dict) or not isinstance(t.get("text"), str):
            raise LabelledDataError(f"{where}: turns[{i}] needs 'role' and a string 'text'")
        try:
            turns.append(Turn(role=as_role(t.get("role")), text=t["text"]))
        except ConversationError as e:
            raise LabelledDataError(f"{where}: turns[{i}]: {e}") from e
    return Conversation(conversation_id, tuple(turns), attributes)


def _parse_line(obj: Any, where: str) -> LabelledConversation:
    conversation = parse_conversation(obj, where)
    label = obj.get("label")
    if isinstance(label, bool) or label in ("positive", "negative") or (isinstance(label, int) and label in (0, 1)):
        positive = _LABELS[label]
    else:
        raise LabelledDataError(f"{where}: label must be 'positive' or 'negative' (or true/false, 1/0), got {label!r}")
    return LabelledConversation(conversation, positive)


def jsonl_objects(path: str | Path) -> Iterator[tuple[str, Any]]:
    """Each non-blank line's JSON value with where it is (``file:line``); `LabelledDataError` if unreadable."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise LabelledDataError(f"{path}: cannot read: {e}") from e
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise LabelledDataError(f"{path}:{n}: not valid JSON: {e.msg}") from e
        yield f"{path}:{n}", obj


def load_labelled_jsonl(path: str | Path) -> list[LabelledConversation]:
    """Read and validate a labelled-conversations JSONL file (see module docstring)."""
    out: list[LabelledConversation] = []
    seen: set[str] = set()
    for where, obj in jsonl_objects(path):
        item = _parse_line(obj, where)
        if item.conversation.id in seen:
            raise LabelledDataError(f"{where}: duplicate conversation_id {item.conversation.id!r}")
        seen.add(item.conversation.id)
        out.append(item)
    if not out:
        raise LabelledDataError(f"{path}: no conversations")
    return out


def write_labelled_jsonl(path: str | Path, items: Iterable[LabelledConversation]) -> int:
    """Write labelled conversations in the format `load_labelled_jsonl` reads; returns the count."""
    n = 0
    with Path(path).open("w", encoding="utf-8") as f:
        for item in items:
            c = item.conversation
            obj = {
                "conversation_id": c.id,
                "label": "positive" if item.positive else "negative",
                "turns": [{"role": t.role, "text": t.text} for t in c.turns],
                "attributes": dict(c.attributes),
            }
            f.write(json.dumps(obj, ensure_ascii=False) + "\n")
            n += 1
    return n


def require_both_classes(items: Sequence[LabelledConversation], where: str) -> None:
    """Refuse data with only positives or only negatives: thresholds and windows need both."""
    n_pos = sum(1 for i in items if i.positive)
    if n_pos == 0 or n_pos == len(items):
        raise LabelledDataError(f"{where}: needs both positive and negative conversations, got {n_pos} of {len(items)} positive")
