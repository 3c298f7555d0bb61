"""A team's own conversations with its people's answers to the calibrator's questions, read from JSONL.

What `convowatch calibrate adapt --labels FILE` reads. One JSON object per line::

    {"conversation_id": "c1",
     "turns": [{"role": "user", "text": "..."}, {"role": "assistant", "text": "..."}],
     "attributes": {"product": "help-bot"},
     "labels": [{"question": "Q0", "answer": 2, "annotator": "ana"},
                {"question": "Q1", "answer": 3, "annotator": "ana"}]}

``turns`` and ``attributes`` are those of the labelled-conversations format (`scorers.datasets.labelled`);
``turns`` are required (the judge reads them, and its answers are cached by them). Each label is one person's
answer to one question: ``answer`` is the option's number, 1..K in the question's option order (the judge's
answers come from asking the judge, not from this file); ``annotator`` names who answered (default
``"team"``), so the calibrator learns each person's offset. A conversation may carry answers from several
annotators, never two from the same annotator to the same question. Every problem is reported with its line
number; nothing is silently skipped.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from scorers.conversation import Conversation
from scorers.datasets.labelled import LabelledDataError, jsonl_objects, parse_conversation
from scorers.datasets.llm_rubric import Label, RubricData, RubricDataError, build_data

DEFAULT_ANNOTATOR = "team"


@dataclass(frozen=True)
class AnswerLabels:
    """Labelled conversations (in file order) and their labels."""

    conversations: tuple[Conversation, ...]
    labels: tuple[Label, ...]


def load_answer_labels(path: str | Path, n_options: Mapping[str, int]) -> AnswerLabels:
    """Read and validate a labels file against the questions a calibrator knows (``n_options``: id → options)."""
    conversations: list[Conversation] = []
    labels: list[Label] = []
    seen: set[str] = set()
    for where, obj in jsonl_objects(path):
        conversation = parse_conversation(obj, where)
        if conversation.id in seen:
            raise LabelledDataError(f"{where}: duplicate conversation_id {conversation.id!r}")
        if not conversation.turns:
            raise LabelledDataError(f"{where}: conversation {conversation.id!r} has no turns (the judge is asked about them)")
        seen.add(conversation.id)
        conversations.append(conversation)
        labels.extend(_labels(obj.get("labels"), conversation.id, n_options, where))
    if not conversations:
        raise LabelledDataError(f"{path}: no conversations")
    return AnswerLabels(tuple(conversations), tuple(labels))


def _labels(raw: Any, conversation_id: str, n_options: Mapping[str, int], where: str) -> list[Label]:
    if not isinstance(raw, list) or not raw:
        raise LabelledDataError(f"{where}: labels must be a non-empty list of {{question, answer, annotator}} objects")
    out: list[Label] = []
    answered: set[tuple[str, str]] = set()
    for i, item in enumerate(raw):
        at = f"{where}: labels[{i}]"
        if not isinstance(item, dict):
            raise LabelledDataError(f"{at}: expected an object with question, answer and (optional) annotator")
        unknown = sorted(set(item) - {"question", "answer", "annotator"})
        if unknown:
            raise LabelledDataError(f"{at}: unknown fields {unknown}")
        question, answer = item.get("question"), item.get("answer")
        annotator = item.get("annotator", DEFAULT_ANNOTATOR)
        if not isinstance(question, str) or question not in n_options:
            raise LabelledDataError(f"{at}: question {question!r} is not one of the calibrator's: {', '.join(n_options)}")
        k = n_options[question]
        if isinstance(answer, bool) or not isinstance(answer, int) or not 1 <= answer <= k:
            raise LabelledDataError(f"{at}: answer to {question} must be a whole number in 1..{k}, got {answer!r}")
        if not isinstance(annotator, str) or not annotator.strip():
            raise LabelledDataError(f"{at}: annotator must be a non-empty string, got {annotator!r}")
        if (question, annotator) in answered:
            raise LabelledDataError(f"{at}: {annotator!r} already answered {question} for this conversation")
        answered.add((question, annotator))
        out.append(Label(text_id=conversation_id, question=question, judge=annotator, answer=answer))
    return out


def calibration_data(
    labelled: AnswerLabels,
    answers: Sequence[Mapping[str, Sequence[float]]],
    n_options: Mapping[str, int],
    question_ids: Sequence[str],
) -> RubricData:
    """The labels with the judge's answers about each conversation (``answers[i]``: question id → probabilities,
    for ``labelled.conversations[i]``) as calibration data, questions in ``question_ids`` order."""
    if len(answers) != len(labelled.conversations):
        raise ValueError(f"{len(answers)} judge answers for {len(labelled.conversations)} conversations")
    features = {}
    for conversation, found in zip(labelled.conversations, answers):
        parts = []
        for q in question_ids:
            probabilities = found.get(q)
            if probabilities is None or len(probabilities) != n_options[q]:
                got = "no answer" if probabilities is None else f"{len(probabilities)} probabilities"
                raise RubricDataError(f"conversation {conversation.id!r}: the judge gave {got} for {q} ({n_options[q]} options)")
            parts.append(np.asarray(probabilities, dtype=np.float64))
        features[conversation.id] = np.concatenate(parts)
    return build_data(features, labelled.labels, n_options, question_ids)
