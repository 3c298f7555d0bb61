"""Judges: backends that answer multiple-choice questions about a conversation."""

from scorers.judges.base import (
    Answer,
    Judge,
    JudgeAuthError,
    JudgeError,
    Judgement,
    JudgeModelNotFound,
    JudgeReplyError,
    JudgeUnavailable,
    Provenance,
    UnknownConversation,
)
from scorers.judges.recorded import RecordedJudge, load_answer_table

__all__ = [
    "Answer",
    "Judge",
    "JudgeAuthError",
    "JudgeError",
    "Judgement",
    "JudgeModelNotFound",
    "JudgeReplyError",
    "JudgeUnavailable",
    "Provenance",
    "RecordedJudge",
    "UnknownConversation",
    "load_answer_table",
]
