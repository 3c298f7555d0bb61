"""Judge answers cached on disk, and the ratings matrix that rubric selection learns from.

Judge calls are what rubric learning costs, so each (judge, rubric,
conversation) is asked once: `ScoreCache` is a SQLite file (stdlib ``sqlite3``)
keyed by

* the judge's identity (`judge_identity`: backend name, model, judge prompt
  version and questions per call: anything that can change an answer),
* the rubric's *question key* (`question_key`: SHA-256 of the question text
  and its options as the judge reads them; polarity and id do not change the
  answer, so a rubric renamed or flipped reuses it),
* the conversation's `Conversation.content_hash()` (roles and texts),

and stores the answer probabilities exactly as the judge gave them.
`answer_all` gathers any questions' answers through it, asking the judge only
for the misses: all missing questions of one conversation go in one
``judge.judge`` call (split into chunks of ``batch_questions`` if given), so a
backend that asks several questions per request batches them. `rate` builds
on it the ``n_conversations × n_rubrics`` matrix of ratings in [0, 10]
(`Rubric.rating`: expected option score) that rubric learning uses; a
calibrator's questions go through it for `convowatch calibrate adapt --labels`.
Answers are written after each call, so an interrupted run keeps what it paid
for.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np

from scorers.conversation import Conversation
from scorers.errors import UserError
from scorers.judges.base import Answer, Judge, JudgeReplyError
from scorers.judges.prompt import MULTI_PROMPT_VERSION, PROMPT_VERSION
from scorers.learning.pool import PoolRubric, to_rubric
from scorers.questions import Question
from scorers.rubrics import Rubric

_SCHEMA = """
CREATE TABLE IF NOT EXISTS answers (
    judge TEXT NOT NULL,
    question TEXT NOT NULL,
    conversation TEXT NOT NULL,
    probabilities TEXT NOT NULL,
    created REAL NOT NULL,
    PRIMARY KEY (judge, question, conversation)
) WITHOUT ROWID
"""

Progress = Callable[[int, int], None]  # (conversations done, conversations total)


class ScoreCacheError(UserError, RuntimeError):
    """The cache file cannot be opened or holds an unusable row; names the file."""


def judge_identity(judge: Judge) -> str:
    """What distinguishes one judge's answers from another's: ``name|model|prompt version|questions per call``
    (a multi-question judge adds its prompt's version, and ``|fmt=grammar`` when constrained; limited prompt
    reuse adds ``|reuse=none`` or ``|reuse=within_conversation``)."""
    model = getattr(judge, "model", "") or ""
    per_call = getattr(judge, "questions_per_call", None)
    parts = [judge.name, str(model), PROMPT_VERSION]
    if per_call is not None:
        parts.append(f"qpc={per_call}")
    answer_format = getattr(judge, "answer_format", "lines")
    if per_call not in (None, 1):
        parts.append(MULTI_PROMPT_VERSION)
        if answer_format != "lines":
            parts.append(f"fmt={answer_format}")
    reuse = getattr(judge, "prompt_reuse", "any")
    if reuse != "any":
        parts.append(f"reuse={reuse}")
    return "|".join(parts)


def question_key(item: Rubric | Question) -> str:
    """SHA-256 (16 hex) of the question the judge reads (a rubric's, or a plain question): text, option keys and
    labels. The id is not part of it: a renamed rubric or question reuses its answers."""
    q = item.question() if isinstance(item, Rubric) else item
    canonical = json.dumps([q.text, list(q.option_keys), list(q.option_labels)], ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:16]


class ScoreCache:
    """Answer probabilities keyed by (judge identity, question key, conversation content hash) in a SQLite file."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(self.path)
            self._db.execute(_SCHEMA)
            self._db.commit()
        except (OSError, sqlite3.Error) as e:
            raise ScoreCacheError(f"{self.path}: cannot open the score cache: {e}") from e

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> ScoreCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __len__(self) -> int:
        return int(self._db.execute("SELECT COUNT(*) FROM answers").fetchone()[0])

    def get_many(self, judge: str, conversation: str, questions: Sequence[str]) -> dict[str, tuple[float, ...]]:
        """Cached probabilities for the given question keys of one conversation (absent keys are misses)."""
        out: dict[str, tuple[float, ...]] = {}
        wanted = list(dict.fromkeys(questions))
        for start in range(0, len(wanted), 500):  # SQLite's bound-parameter limit
            chunk = wanted[start : start + 500]
            marks = ",".join("?" * len(chunk))
            rows = self._db.execute(
                f"SELECT question, probabilities FROM answers WHERE judge = ? AND conversation = ? AND question IN ({marks})",
                (judge, conversation, *chunk),
            ).fetchall()
            for question, text in rows:
                out[question] = self._decode(text, judge, question, conversation)
        return out

    def put_many(self, judge: str, conversation: str, answers: dict[str, tuple[float, ...]]) -> None:
        """Store (or replace) probabilities for question keys of one conversation, in one transaction."""
        now = time.time()
        with self._db:
            self._db.executemany(
                "INSERT OR REPLACE INTO answers (judge, question, conversation, probabilities, created) VALUES (?, ?, ?, ?, ?)",
                [(judge, q, conversation, json.dumps(list(p)), now) for q, p in answers.items()],
            )

    def _decode(self, text: str, judge: str, question: str, conversation: str) -> tuple[float, ...]:
        try:
            probs = tuple(float(p) for p in json.loads(text))
        except (TypeError, ValueError) as e:
            raise ScoreCacheError(
                f"{self.path}: row ({judge!r}, {question}, {conversation}) is not a list of numbers: {e}"
            ) from e
        return probs


@dataclass(frozen=True)
class RatingStats:
    """What building a ratings matrix cost.

    ``cache_hits``/``cache_misses`` count distinct (conversation, question)
    cells; ``judge_requests`` counts ``judge.judge`` invocations; ``judge_calls``
    and tokens add up the judges' `Provenance` (a recorded judge reports 0
    calls); ``judge_latency_s`` sums their latencies, ``wall_s`` is the
    elapsed time of `rate`.
    """

    conversations: int
    rubrics: int
    cache_hits: int
    cache_misses: int
    judge_requests: int
    judge_calls: int
    prompt_tokens: int
    completion_tokens: int
    judge_latency_s: float
    wall_s: float


class Ratings(NamedTuple):
    """`rate`'s result: ``matrix[i, j]`` = rating of conversation i on rubric j, and the cost."""

    matrix: np.ndarray
    stats: RatingStats


class Answers(NamedTuple):
    """`answer_all`'s result: ``by_conversation[i][question id]`` = the probabilities of conversation i's answer,
    and the cost (``stats.rubrics`` counts the questions)."""

    by_conversation: list[dict[str, tuple[float, ...]]]
    stats: RatingStats


AnswerCheck = Callable[[Question, Answer], object]  # raises `JudgeReplyError` for an answer that must not be cached


def answer_all(
    judge: Judge,
    questions: Sequence[Question],
    conversations: Sequence[Conversation],
    cache: ScoreCache,
    batch_questions: int | None = None,
    progress: Progress | None = None,
    judge_id: str | None = None,
    check: AnswerCheck | None = None,
) -> Answers:
    """Every question's answer about every conversation, asking ``judge`` only for cache misses.

    Questions are cached by `question_key`, so questions that read the same share one answer. All missing
    questions of one conversation go in one ``judge.judge`` call (chunks of ``batch_questions`` if given).
    ``judge_id`` overrides `judge_identity`. An answer whose length is not its question's number of options,
    or that ``check`` refuses, is a `JudgeReplyError` and is not cached; a judge failure (`JudgeError`)
    propagates after the answers already received are stored.
    """
    if batch_questions is not None and batch_questions < 1:
        raise ValueError(f"batch_questions must be >= 1 or None, got {batch_questions}")
    started = time.perf_counter()
    ids = [q.id for q in questions]
    if len(set(ids)) != len(ids):
        raise ValueError(f"question ids must be unique, got duplicates {sorted({i for i in ids if ids.count(i) > 1})}")
    keys = [question_key(q) for q in questions]
    first_with_key: dict[str, Question] = {}
    for key, question in zip(keys, questions):
        first_with_key.setdefault(key, question)
    identity = judge_id or judge_identity(judge)

    out: list[dict[str, tuple[float, ...]]] = []
    hits = misses = requests = calls = prompt_tokens = completion_tokens = 0
    latency = 0.0
    answered: dict[str, dict[str, tuple[float, ...]]] = {}  # per conversation hash, across duplicate conversations
    for i, conversation in enumerate(conversations):
        chash = conversation.content_hash()
        if chash not in answered:
            found = cache.get_many(identity, chash, list(first_with_key))
            hits += len(found)
            missing = [k for k in first_with_key if k not in found]
            misses += len(missing)
            size = batch_questions or max(len(missing), 1)
            for start in range(0, len(missing), size):
                chunk = missing[start : start + size]
                asked = [first_with_key[k] for k in chunk]
                judgement = judge.judge(conversation, asked)
                requests += 1
                p = judgement.provenance
                calls += p.calls
                prompt_tokens += p.prompt_tokens
                completion_tokens += p.completion_tokens
                latency += p.latency_s
                fresh: dict[str, tuple[float, ...]] = {}
                for key, question in zip(chunk, asked):
                    answer = judgement.answers.get(question.id)
                    if answer is None:
                        raise JudgeReplyError(
                            f"judge {identity!r} returned no answer to {question.id!r} for conversation {conversation.id!r}"
                        )
                    if check is not None:
                        check(question, answer)  # before caching
                    if len(answer.probabilities) != len(question.option_keys):
                        raise JudgeReplyError(
                            f"{question.id!r}: answer has {len(answer.probabilities)} probabilities "
                            f"but the question has {len(question.option_keys)} options"
                        )
                    fresh[key] = answer.probabilities
                cache.put_many(identity, chash, fresh)
                found.update(fresh)
            answered[chash] = found
        out.append({q.id: answered[chash][key] for q, key in zip(questions, keys)})
        if progress is not None:
            progress(i + 1, len(conversations))
    stats = RatingStats(
        conversations=len(conversations),
        rubrics=len(questions),
        cache_hits=hits,
        cache_misses=misses,
        judge_requests=requests,
        judge_calls=calls,
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        judge_latency_s=latency,
        wall_s=time.perf_counter() - started,
    )
    return Answers(out, stats)


def rate(
    judge: Judge,
    rubrics: Sequence[PoolRubric | Rubric],
    conversations: Sequence[Conversation],
    cache: ScoreCache,
    batch_questions: int | None = None,
    progress: Progress | None = None,
    judge_id: str | None = None,
) -> Ratings:
    """Ratings in [0, 10] of every conversation on every rubric, asking ``judge`` only for cache misses.

    ``rubrics`` are pool rubrics (rated on the Likert scale, `to_rubric`) or
    `Rubric`s with their own scale; their ids are the question ids the judge
    sees. The asking and caching are `answer_all`'s; an answer that does not
    fit its rubric's scale is a `JudgeReplyError` and is not cached.
    """
    as_rubrics = [to_rubric(r) if isinstance(r, PoolRubric) else r for r in rubrics]
    by_id = {r.id: r for r in as_rubrics}  # a rubric's question has its id; answer_all refuses duplicates
    answers = answer_all(
        judge,
        [r.question() for r in as_rubrics],
        conversations,
        cache,
        batch_questions=batch_questions,
        progress=progress,
        judge_id=judge_id,
        check=lambda question, answer: by_id[question.id].rating(answer),
    )
    matrix = np.empty((len(conversations), len(as_rubrics)), dtype=float)
    for i, found in enumerate(answers.by_conversation):
        for j, rubric in enumerate(as_rubrics):
            matrix[i, j] = rubric.rating(Answer(question_id=rubric.id, probabilities=found[rubric.id]))
    return Ratings(matrix, answers.stats)
