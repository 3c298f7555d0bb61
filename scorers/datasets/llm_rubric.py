"""The LLM-Rubric release as plain data: judge features per conversation, human label tuples.

The release (Hashemi et al., ACL 2024; ``../shared/data/llm-rubric/``) has, per
split (``real`` / ``synth``), an LLM evaluations TSV (one row per conversation
and question, option probabilities) and a human judgments TSV (one row per
conversation and human judge, one column per question, 0 = not applicable).

* Features: ``x`` for a conversation is the concatenation of the LLM's
  probability vectors for the questions in order (Q0..Q8 by default), exactly
  as recorded: not renormalised. A question the LLM was not asked (Q2-Q5 when
  no references were shown) is the all-zero vector, as in the paper. (The
  released files do hold answers to Q2-Q5 for every conversation, and the
  authors' code uses them as they are; so does this loader. Zeroing them for
  the no-reference synthetic system changed 5-fold CV Q0 RMSE by 0.002,
  within noise.)
* Labels: one `Label` per (conversation, question, human judge) with an answer
  in 1..K. Answers coded 0 (not applicable) and empty cells are not labels.

Every loader takes paths, so the same code reads any files of this shape.
"""

from __future__ import annotations

import ast
import csv
import hashlib
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from scorers.conversation import Conversation, ConversationError
from scorers.errors import UserError
from scorers.judges.recorded import AnswerTableError, load_answer_table
from scorers.questions import QuestionError, load_questions
from scorers.rubrics import Polarity, Rubric, RubricSet, Scale

QUESTION_IDS: tuple[str, ...] = ("Q0", "Q1", "Q2", "Q3", "Q4", "Q5", "Q6", "Q7", "Q8")
MAIN_QUESTION = "Q0"
# Q2-Q5 ask about the references; they are not asked when none were shown.
OPTIONAL_QUESTIONS: frozenset[str] = frozenset({"Q2", "Q3", "Q4", "Q5"})
NOT_APPLICABLE = 0

SPLIT_FILES: dict[str, tuple[str, str]] = {
    "real": ("gpt-3.5-turbo-16k_real_evaluations_FIXED.tsv", "human_judges_real_convs_FIXED_ANON.tsv"),
    "synth": ("gpt-3.5-turbo-16k_synth_evaluations_FIXED.tsv", "human_judges_synth_all_FIXED_ANON.tsv"),
}
QUESTIONS_FILE = "questions.json"
TEXT_ID_COLUMN = "text_id"
JUDGE_COLUMN = "annotator_id"


class RubricDataError(UserError, ValueError):
    """A data file that cannot be used; the message names the file, line and field."""


@dataclass(frozen=True)
class Label:
    """One human judge's answer (1..K) to one question about one conversation."""

    text_id: str
    question: str
    judge: str
    answer: int


@dataclass(frozen=True)
class RubricData:
    """Features and labels for a set of conversations, ready for the calibration network.

    ``features[text_id]`` is the judge-LLM vector ``x`` (length ``sum(n_options)``);
    every label's conversation has features and every label's question is in
    ``question_ids`` with an answer in ``1..n_options[question]``.
    """

    question_ids: tuple[str, ...]
    n_options: Mapping[str, int]
    features: Mapping[str, np.ndarray]
    labels: tuple[Label, ...]
    dropped_labels: int = field(default=0, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "question_ids", tuple(self.question_ids))
        object.__setattr__(self, "labels", tuple(self.labels))
        missing = [q for q in self.question_ids if q not in self.n_options]
        if missing:
            raise RubricDataError(f"n_options has no entry for questions {missing}")
        width = self.input_size
        for tid, x in self.features.items():
            if np.shape(x) != (width,):
                raise RubricDataError(f"features[{tid!r}] has shape {np.shape(x)}, expected ({width},)")
        for lab in self.labels:
            if lab.text_id not in self.features:
                raise RubricDataError(f"label for conversation {lab.text_id!r} has no features")
            if lab.question not in self.n_options:
                raise RubricDataError(f"label question {lab.question!r} is not one of {self.question_ids}")
            if not 1 <= lab.answer <= self.n_options[lab.question]:
                raise RubricDataError(
                    f"label answer {lab.answer} for {lab.text_id!r}/{lab.question} is outside 1..{self.n_options[lab.question]}"
                )

    @property
    def input_size(self) -> int:
        return sum(self.n_options[q] for q in self.question_ids)

    @property
    def text_ids(self) -> tuple[str, ...]:
        """Conversations that carry at least one label, in first-seen order."""
        return tuple(dict.fromkeys(lab.text_id for lab in self.labels))

    @property
    def judges(self) -> tuple[str, ...]:
        """Human judges in sorted order."""
        return tuple(sorted({lab.judge for lab in self.labels}, key=_natural_key))

    def subset(self, text_ids: Iterable[str]) -> RubricData:
        """Only the labels (and features) of the given conversations."""
        keep = set(text_ids)
        return RubricData(
            question_ids=self.question_ids,
            n_options=self.n_options,
            features={t: x for t, x in self.features.items() if t in keep},
            labels=tuple(lab for lab in self.labels if lab.text_id in keep),
        )

    def restrict_questions(self, question_ids: Sequence[str]) -> RubricData:
        """Keep only some questions, both as input features and as labels."""
        unknown = [q for q in question_ids if q not in self.question_ids]
        if unknown:
            raise RubricDataError(f"unknown questions {unknown}; have {self.question_ids}")
        offsets = self.offsets()
        cols = np.concatenate([np.arange(offsets[q], offsets[q] + self.n_options[q]) for q in question_ids])
        return RubricData(
            question_ids=tuple(question_ids),
            n_options={q: self.n_options[q] for q in question_ids},
            features={t: np.asarray(x)[cols] for t, x in self.features.items()},
            labels=tuple(lab for lab in self.labels if lab.question in set(question_ids)),
        )

    def offsets(self) -> dict[str, int]:
        """Start of each question's block in ``x``."""
        out, pos = {}, 0
        for q in self.question_ids:
            out[q] = pos
            pos += self.n_options[q]
        return out

    def labels_for(self, question: str) -> tuple[Label, ...]:
        return tuple(lab for lab in self.labels if lab.question == question)

    def content_hash(self) -> str:
        """SHA-256 of the features and labels (recorded with a trained calibrator)."""
        h = hashlib.sha256()
        h.update(repr((self.question_ids, [self.n_options[q] for q in self.question_ids])).encode())
        for tid in sorted(self.features):
            h.update(tid.encode())
            h.update(np.asarray(self.features[tid], dtype=np.float64).tobytes())
        for lab in sorted(self.labels, key=lambda x: (x.text_id, x.question, x.judge, x.answer)):
            h.update(f"{lab.text_id}\t{lab.question}\t{lab.judge}\t{lab.answer}\n".encode())
        return h.hexdigest()


def _natural_key(s: str) -> tuple[int, str]:
    return (int(s), "") if s.isdigit() else (1 << 62, s)


def load_features(
    path: str | Path,
    n_options: Mapping[str, int],
    question_ids: Sequence[str] = QUESTION_IDS,
    optional_questions: Iterable[str] = OPTIONAL_QUESTIONS,
) -> dict[str, np.ndarray]:
    """Read an evaluations TSV into ``{text_id: x}``.

    ``x`` concatenates each question's probabilities (first ``n_options[q]``
    columns, not renormalised). A missing optional question is the zero
    vector; a missing required question, or probability mass beyond a
    question's options, is an error.
    """
    try:
        table = load_answer_table(path)
    except AnswerTableError as e:
        raise RubricDataError(str(e)) from e
    optional = set(optional_questions)
    by_text: dict[str, dict[str, tuple[float, ...]]] = {}
    for (tid, qid), answer in table.items():
        by_text.setdefault(tid, {})[qid] = answer
    out: dict[str, np.ndarray] = {}
    for tid, answers in by_text.items():
        parts: list[np.ndarray] = []
        for q in question_ids:
            width = n_options[q]
            probs = answers.get(q)
            if probs is None:
                if q not in optional:
                    raise RubricDataError(f"{path}: conversation {tid!r} has no answer for required question {q}")
                parts.append(np.zeros(width))
                continue
            if len(probs) < width:
                raise RubricDataError(f"{path}: {tid!r}/{q} has {len(probs)} probabilities, question has {width} options")
            if any(p > 0 for p in probs[width:]):
                raise RubricDataError(f"{path}: {tid!r}/{q} has probability mass beyond the question's {width} options")
            parts.append(np.asarray(probs[:width], dtype=np.float64))
        out[tid] = np.concatenate(parts)
    return out


def load_labels(
    path: str | Path,
    n_options: Mapping[str, int],
    question_ids: Sequence[str] = QUESTION_IDS,
    text_id_column: str = TEXT_ID_COLUMN,
    judge_column: str = JUDGE_COLUMN,
) -> list[Label]:
    """Read a human judgments TSV into label tuples.

    Cells holding 0 (not applicable) or nothing are skipped; any other value
    must be an integer (``"3"`` or ``"3.0"``) in ``1..n_options[q]``.
    """
    path = Path(path)
    try:
        handle = path.open(encoding="utf-8", newline="")
    except OSError as e:
        raise RubricDataError(f"{path}: cannot open: {e}") from e
    labels: list[Label] = []
    with handle:
        reader = csv.DictReader(handle, delimiter="\t")
        header = reader.fieldnames or []
        missing = [c for c in (text_id_column, judge_column, *question_ids) if c not in header]
        if missing:
            raise RubricDataError(f"{path}: header lacks columns {missing}; got {header}")
        for line_no, row in enumerate(reader, start=2):
            tid = (row[text_id_column] or "").strip()
            judge = (row[judge_column] or "").strip()
            if not tid or not judge:
                raise RubricDataError(f"{path}:{line_no}: empty {text_id_column!r} or {judge_column!r}")
            for q in question_ids:
                answer = _parse_answer(row[q], path, line_no, q)
                if answer is None or answer == NOT_APPLICABLE:
                    continue
                if not 1 <= answer <= n_options[q]:
                    raise RubricDataError(f"{path}:{line_no}: {q}={row[q]!r} is outside 1..{n_options[q]} (0 = not applicable)")
                labels.append(Label(text_id=tid, question=q, judge=judge, answer=answer))
    if not labels:
        raise RubricDataError(f"{path}: no labels")
    return labels


def _parse_answer(cell: str | None, path: Path, line_no: int, column: str) -> int | None:
    if cell is None:
        raise RubricDataError(f"{path}:{line_no}: row is short; no value for {column}")
    text = cell.strip()
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        raise RubricDataError(f"{path}:{line_no}: {column}={cell!r} is not a number") from None
    if not math.isfinite(value) or value != int(value):
        raise RubricDataError(f"{path}:{line_no}: {column}={cell!r} is not a whole answer number")
    return int(value)


def load_n_options(questions_path: str | Path, question_ids: Sequence[str] = QUESTION_IDS) -> dict[str, int]:
    """Option counts per question from a ``questions.json`` (Q8 has 3 options)."""
    try:
        questions = load_questions(questions_path)
    except QuestionError as e:
        raise RubricDataError(str(e)) from e
    missing = [q for q in question_ids if q not in questions]
    if missing:
        raise RubricDataError(f"{questions_path}: no definition for questions {missing}")
    return {q: questions[q].n_options for q in question_ids}


def build_data(
    features: Mapping[str, np.ndarray],
    labels: Sequence[Label],
    n_options: Mapping[str, int],
    question_ids: Sequence[str] = QUESTION_IDS,
) -> RubricData:
    """Join features and labels; labels of conversations without features are dropped (and counted)."""
    kept = tuple(lab for lab in labels if lab.text_id in features)
    with_labels = {lab.text_id for lab in kept}
    data = RubricData(
        question_ids=tuple(question_ids),
        n_options={q: n_options[q] for q in question_ids},
        features={t: x for t, x in features.items() if t in with_labels},
        labels=kept,
        dropped_labels=len(labels) - len(kept),
    )
    return data


def load_split(
    data_dir: str | Path,
    split: str,
    question_ids: Sequence[str] = QUESTION_IDS,
) -> RubricData:
    """Load ``real`` or ``synth`` from an LLM-Rubric release directory.

    25 synthetic conversations have human labels but no LLM evaluations; their
    labels are dropped (``RubricData.dropped_labels`` counts them), as the
    authors' code does.
    """
    if split not in SPLIT_FILES:
        raise RubricDataError(f"unknown split {split!r}; expected one of {sorted(SPLIT_FILES)}")
    data_dir = Path(data_dir)
    evaluations, judgments = SPLIT_FILES[split]
    n_options = load_n_options(data_dir / QUESTIONS_FILE, question_ids)
    features = load_features(data_dir / evaluations, n_options, question_ids)
    labels = load_labels(data_dir / judgments, n_options, question_ids)
    return build_data(features, labels, n_options, question_ids)


# ---------------------------------------------------------------------------
# RUBICON view of the same release: Q1-Q8 as SAT rubrics, satisfaction from Q0

DIMENSION_QUESTIONS: tuple[str, ...] = ("Q1", "Q2", "Q3", "Q4", "Q5", "Q6", "Q7", "Q8")
# Q8 ("appropriate number of turns") is not ordinal: 1 = fewer would do, 2 = more needed, 3 = appropriate.
Q8_SCORES: tuple[float, ...] = (0.0, 0.0, 10.0)
NEGATIVE_MAX_MEAN_Q0 = 2.0  # a conversation whose judges' mean Q0 is <= 2 counts as dissatisfied
REAL_CONVERSATIONS_FILE = "real_data.json"


def dimension_rubric_set(questions_path: str | Path, question_ids: Sequence[str] = DIMENSION_QUESTIONS) -> RubricSet:
    """An (unfitted) rubric set with each LLM-Rubric dimension question as a SAT rubric.

    Ordinal questions spread their options evenly over [0, 10]; Q8 scores only
    its "appropriate" option as good.
    """
    try:
        questions = load_questions(questions_path)
    except QuestionError as e:
        raise RubricDataError(str(e)) from e
    rubrics = []
    for qid in question_ids:
        if qid not in questions:
            raise RubricDataError(f"{questions_path}: no definition for question {qid}")
        q = questions[qid]
        scale = Scale(q.option_keys, q.option_labels, Q8_SCORES) if qid == "Q8" else Scale.linear(q.option_keys, q.option_labels)
        rubrics.append(Rubric(id=qid, text=q.text, polarity=Polarity.SAT, scale=scale))
    return RubricSet(tuple(rubrics), metadata={"source": "LLM-Rubric questions Q1-Q8 as SAT rubrics"})


def synthetic_dialogue_system(text_id: str) -> str:
    """The dialogue system (V1–V5) of a synthetic conversation: its id's prefix (``V3_17`` -> ``V3``).

    The synthetic texts are not published; this is all that is known of how they differ.
    """
    system, sep, number = text_id.partition("_")
    if not sep or not system.startswith("V") or not number:
        raise RubricDataError(f"{text_id!r} is not a synthetic conversation id (V<system>_<n>)")
    return system


def mean_answers(data: RubricData, question: str = MAIN_QUESTION) -> dict[str, float]:
    """Each conversation's mean human answer to ``question`` (conversations without one are absent)."""
    answers: dict[str, list[int]] = {}
    for lab in data.labels_for(question):
        answers.setdefault(lab.text_id, []).append(lab.answer)
    return {tid: float(np.mean(a)) for tid, a in answers.items()}


def satisfaction_labels(data: RubricData, negative_max: float = NEGATIVE_MAX_MEAN_Q0) -> dict[str, bool]:
    """``{text_id: positive}``: negative when the judges' mean Q0 is <= ``negative_max``."""
    return {tid: mean > negative_max for tid, mean in mean_answers(data).items()}


def load_real_conversations(path: str | Path) -> dict[str, Conversation]:
    """The real conversations (``real_data.json``) as `Conversation`s keyed by ``_id``.

    ``messages`` is stored as a Python-literal string in the release; the
    assistant variant is kept as attribute ``dialogue_version``.
    """
    path = Path(path)
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise RubricDataError(f"{path}: cannot read: {e}") from e
    out: dict[str, Conversation] = {}
    for i, item in enumerate(raw):
        try:
            messages = item["messages"]
            if isinstance(messages, str):
                messages = ast.literal_eval(messages)
            out[item["_id"]] = Conversation.from_messages(
                item["_id"],
                messages,
                {"dialogue_version": str(item.get("dialogue_version", "")), "topic": str(item.get("topic", ""))},
            )
        except (KeyError, TypeError, ValueError, SyntaxError, ConversationError) as e:
            raise RubricDataError(f"{path}: conversation [{i}]: {e}") from e
    return out
