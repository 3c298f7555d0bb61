"""A judge that replays stored answer distributions.

The LLM-Rubric release ships GPT-3.5's answer distributions for every
(conversation, question) pair as TSV (``text_id, criterion, sample_llm,
answer1_prob .. answerK_prob``). Replaying them is a real judge for those
conversations: same answers, no model needed.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

from scorers.conversation import Conversation
from scorers.errors import UserError
from scorers.judges.base import (
    Answer,
    Judgement,
    JudgeReplyError,
    Provenance,
    UnknownConversation,
    reply_errors_as_judge_errors,
)
from scorers.questions import Question

AnswerTable = Mapping[tuple[str, str], tuple[float, ...]]


class AnswerTableError(UserError, ValueError):
    """A recorded-answers file that cannot be read; the message names the line and field."""


def load_answer_table(path: str | Path) -> dict[tuple[str, str], tuple[float, ...]]:
    """Read an LLM-Rubric evaluations TSV into ``{(conversation_id, question_id): probabilities}``."""
    path = Path(path)
    try:
        handle = path.open(encoding="utf-8", newline="")
    except OSError as e:
        raise AnswerTableError(f"{path}: cannot open: {e}") from e
    table: dict[tuple[str, str], tuple[float, ...]] = {}
    with handle:
        reader = csv.DictReader(handle, delimiter="\t")
        header = reader.fieldnames or []
        prob_cols = sorted(
            (c for c in header if c.startswith("answer") and c.endswith("_prob")),
            key=lambda c: int(c[len("answer") : -len("_prob")]),
        )
        missing = {"text_id", "criterion"} - set(header)
        if missing or not prob_cols:
            raise AnswerTableError(f"{path}: header needs text_id, criterion and answerN_prob columns; got {header}")
        for line_no, row in enumerate(reader, start=2):
            try:
                probs = tuple(float(row[c]) for c in prob_cols)
            except (TypeError, ValueError) as e:
                raise AnswerTableError(f"{path}:{line_no}: answer probabilities must be numbers: {e}") from e
            if any(not math.isfinite(p) or p < 0 for p in probs):
                raise AnswerTableError(f"{path}:{line_no}: probabilities must be finite and >= 0")
            key = (row["text_id"], row["criterion"])
            if key in table:
                raise AnswerTableError(f"{path}:{line_no}: duplicate answers for {key}")
            table[key] = probs
    if not table:
        raise AnswerTableError(f"{path}: no rows")
    return table


class RecordedJudge:
    """Replays a table of answer distributions; unknown conversations or questions are errors."""

    answers_in_memory = True  # a table lookup: nothing to wait for

    def __init__(self, table: AnswerTable, name: str = "recorded", model: str = "recorded") -> None:
        self.table = table
        self.name = name
        self.model = model

    @classmethod
    def from_tsv(cls, path: str | Path, model: str | None = None) -> RecordedJudge:
        """Load an LLM-Rubric evaluations TSV; ``model`` defaults to the file's stem."""
        path = Path(path)
        return cls(load_answer_table(path), name="recorded", model=model or path.stem)

    def judge(self, conversation: Conversation, questions: Sequence[Question]) -> Judgement:
        """The recorded answers to ``questions`` about ``conversation``; only a `JudgeError` leaves it (a table of the
        wrong shape: `JudgeReplyError`)."""
        with reply_errors_as_judge_errors(f"recorded judge {self.model!r}"):
            return self._judge(conversation, questions)

    def _judge(self, conversation: Conversation, questions: Sequence[Question]) -> Judgement:
        answers: dict[str, Answer] = {}
        for q in questions:
            probs = self.table.get((conversation.id, q.id))
            if probs is None:
                raise UnknownConversation(
                    f"recorded judge {self.model!r} has no answer for conversation {conversation.id!r}, question {q.id!r}"
                )
            if any(p > 0 for p in probs[q.n_options :]):
                raise JudgeReplyError(
                    f"recorded answer for {conversation.id!r}/{q.id} has mass beyond the question's {q.n_options} options"
                )
            answers[q.id] = Answer(question_id=q.id, probabilities=probs[: q.n_options])
        return Judgement(
            conversation_id=conversation.id,
            answers=answers,
            provenance=Provenance(judge=self.name, model=self.model, calls=0),
        )
