"""Labelled-conversation JSONL: round trip and clear, line-numbered errors."""

import pytest

from scorers.conversation import Conversation, Turn
from scorers.datasets.labelled import (
    LabelledConversation,
    LabelledDataError,
    load_labelled_jsonl,
    require_both_classes,
    write_labelled_jsonl,
)


def test_round_trip(tmp_path):
    items = [
        LabelledConversation(Conversation("a", (Turn("user", "hi"), Turn("assistant", "hello")), {"product": "p"}), True),
        LabelledConversation(Conversation("b", ()), False),
    ]
    path = tmp_path / "l.jsonl"
    assert write_labelled_jsonl(path, items) == 2
    assert load_labelled_jsonl(path) == items


@pytest.mark.parametrize(
    "line, message",
    [
        ("not json", ":1: not valid JSON"),
        ("[1, 2]", ":1: expected a JSON object"),
        ('{"label": "positive"}', ":1: conversation_id"),
        ('{"conversation_id": "a", "label": "great"}', ":1: label must be"),
        ('{"conversation_id": "a", "label": 2}', ":1: label must be"),
        ('{"conversation_id": "a", "label": 1, "turns": {}}', ":1: turns must be a list"),
        ('{"conversation_id": "a", "label": 1, "turns": [{"role": "bot", "text": "x"}]}', ":1: turns\\[0\\]: unknown role"),
        ('{"conversation_id": "a", "label": 1, "turns": [{"role": "user"}]}', ":1: turns\\[0\\] needs"),
        ('{"conversation_id": "a", "label": 1, "attributes": {"n": 3}}', ":1: attributes must be"),
    ],
)
def test_bad_lines_are_refused_with_their_line_number(tmp_path, line, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(line + "\n")
    with pytest.raises(LabelledDataError, match=message):
        load_labelled_jsonl(path)


def test_duplicates_empty_and_one_class_files_are_refused(tmp_path):
    path = tmp_path / "l.jsonl"
    path.write_text('{"conversation_id": "a", "label": 1}\n\n{"conversation_id": "a", "label": 0}\n')
    with pytest.raises(LabelledDataError, match=":3: duplicate conversation_id 'a'"):
        load_labelled_jsonl(path)
    path.write_text("\n")
    with pytest.raises(LabelledDataError, match="no conversations"):
        load_labelled_jsonl(path)
    path.write_text('{"conversation_id": "a", "label": true}\n{"conversation_id": "b", "label": "positive"}\n')
    with pytest.raises(LabelledDataError, match="needs both positive and negative conversations, got 2 of 2"):
        require_both_classes(load_labelled_jsonl(path), "x")


def test_invalid_utf8_is_refused(tmp_path):
    path = tmp_path / "l.jsonl"
    path.write_bytes(b'{"conversation_id": "\xff", "label": 1}\n')
    with pytest.raises(LabelledDataError, match="cannot read"):
        load_labelled_jsonl(path)
