"""Multiple-choice questions put to a judge.

A `Question` has an id, a text and ordered answer options. Each option has a
*key* (the short token the judge answers with, e.g. ``"1"``) and a label
(what the option means). Judges return one probability per option, in order.

Questions that share a *stem* (e.g. every Likert rubric: "How much do you
agree with each statement below?") and their options can be asked together in
a compact form: the stem and the options once, then one short *item* per
question (`scorers.judges.prompt.multi_question_prompt`). ``text`` is always
the whole question, as it is asked alone.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from scorers.errors import UserError


class QuestionError(UserError, ValueError):
    """A question definition that is not usable (no options, duplicate keys, ...)."""


@dataclass(frozen=True)
class Question:
    """A multiple-choice question; ``option_keys[i]`` is answered to mean ``option_labels[i]``."""

    id: str
    text: str
    option_keys: tuple[str, ...]
    option_labels: tuple[str, ...]
    stem: str = ""  # shared with the other questions of its kind, stated once when asked together ("" = none)
    item: str = ""  # this question's own part under its stem (required with a stem)

    def __post_init__(self) -> None:
        object.__setattr__(self, "option_keys", tuple(self.option_keys))
        object.__setattr__(self, "option_labels", tuple(self.option_labels))
        if not self.id:
            raise QuestionError("question id must be non-empty")
        if len(self.option_keys) < 2:
            raise QuestionError(f"question {self.id!r}: needs at least 2 options")
        if len(self.option_keys) != len(self.option_labels):
            raise QuestionError(f"question {self.id!r}: {len(self.option_keys)} keys but {len(self.option_labels)} labels")
        if len(set(self.option_keys)) != len(self.option_keys):
            raise QuestionError(f"question {self.id!r}: duplicate option keys {self.option_keys}")
        if any(not k or k != k.strip() for k in self.option_keys):
            raise QuestionError(f"question {self.id!r}: option keys must be non-empty without spaces")
        if self.stem and not self.item.strip():
            raise QuestionError(f"question {self.id!r}: a question with a stem needs its item text")

    @property
    def n_options(self) -> int:
        return len(self.option_keys)

    def prompt_block(self) -> str:
        """The question and its options as the judge reads them."""
        lines = [self.text]
        for k, label in zip(self.option_keys, self.option_labels):
            lines.append(f"{k}. {label}" if label != k else f"{k}")
        return "\n".join(lines)


LIKERT_5 = (
    ("1", "Strongly disagree"),
    ("2", "Disagree"),
    ("3", "Neither agree nor disagree"),
    ("4", "Agree"),
    ("5", "Strongly agree"),
)


LIKERT_STEM = "How much do you agree with each statement below about the conversation?"


def likert_question(id: str, assertion: str) -> Question:
    """A 5-point Likert question about an assertion (RUBICON's rubric form)."""
    return Question(
        id=id,
        text=f"How much do you agree with this statement about the conversation?\nStatement: {assertion}",
        option_keys=tuple(k for k, _ in LIKERT_5),
        option_labels=tuple(v for _, v in LIKERT_5),
        stem=LIKERT_STEM,
        item=assertion,
    )


def load_questions(path: str | Path) -> dict[str, Question]:
    """Load questions from a JSON file shaped like LLM-Rubric's ``questions.json``.

    Shape: ``{"questions": {"Q0": {"text": ..., "options": {"1": "label", ...}}, ...}}``.
    """
    path = Path(path)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise QuestionError(f"{path}: cannot read questions: {e}") from e
    raw = doc.get("questions") if isinstance(doc, dict) else None
    if not isinstance(raw, dict) or not raw:
        raise QuestionError(f"{path}: expected an object with a non-empty 'questions' mapping")
    out: dict[str, Question] = {}
    for qid, q in raw.items():
        if not isinstance(q, dict) or not isinstance(q.get("text"), str) or not isinstance(q.get("options"), dict):
            raise QuestionError(f"{path}: questions.{qid}: needs 'text' (string) and 'options' (object)")
        out[qid] = Question(
            id=qid,
            text=q["text"],
            option_keys=tuple(str(k) for k in q["options"]),
            option_labels=tuple(str(v) for v in q["options"].values()),
        )
    return out
