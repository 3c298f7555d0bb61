"""Labels from user feedback: the stored conversations users rated, as labelled conversations.

Chat products collect thumbs up/down for free (``feedback`` events, stored in
the ``feedback`` table). `labelled_from_store` turns them into the labelled
conversations `convowatch learn` learns from, read from ClickHouse with a time
window (by ``closed_at``, like the report) and attribute filters:

* each rated turn counts with its latest rating (a user who changed their mind
  counts once, as they left it);
* a conversation with a thumbs-down and no thumbs-up is negative, one with a
  thumbs-up and no thumbs-down positive;
* one with both is a *conflict*: excluded and counted (``on_conflict=exclude``,
  the default), or negative (``on_conflict=negative``: any thumbs-down makes a
  conversation negative).

Scores of whole conversations (``rating`` events on a declared 1..K scale,
stored in ``conversation_ratings``) are answers, not thumbs: `answers_from_store`
reads the latest score of each rated conversation as its users' answer to a
calibrator question with K options, for ``convowatch calibrate adapt
--from-store``; ratings on another scale are left out and counted.

Both results carry the query, its parameters and a hash of the data it
returned, for the metadata of whatever is learned from them.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

from scorers.conversation import Conversation, Turn, as_role
from scorers.datasets.answer_labels import AnswerLabels
from scorers.datasets.labelled import LabelledConversation
from scorers.datasets.llm_rubric import Label
from stream.contract import NEGATIVE_RATINGS, RATINGS

if TYPE_CHECKING:
    from stream.store import ClickHouseStore

OnConflict = Literal["exclude", "negative"]
FeedbackLabel = Literal["positive", "negative", "conflict"]
POSITIVE_RATINGS: frozenset[str] = frozenset(RATINGS) - NEGATIVE_RATINGS
USERS = "users"  # the annotator of stored conversation scores: a calibrator learns one offset for them


def ratings_sql(feedback_table: str) -> str:
    """Each rated conversation's ratings (``conversation_id``, ``ratings``): the latest rating of each rated turn."""
    return f"""SELECT conversation_id, groupArray(rating) AS ratings FROM (
        SELECT conversation_id, turn_index, argMax(rating, timestamp) AS rating
        FROM {feedback_table} FINAL GROUP BY conversation_id, turn_index
    ) GROUP BY conversation_id"""


# Conversations closed in the window whose attributes match. User input only travels as parameters; the
# attribute filter is one `attributes[{kN}] = {vN}` per filter.
_WINDOW = """SELECT conversation_id, turns, attributes FROM {db}.conversations FINAL
    WHERE closed_at >= {{since:DateTime64(6, 'UTC')}} AND closed_at < {{until:DateTime64(6, 'UTC')}}{filters}"""

# ... joined with each rated turn's latest rating.
LABELLED_CONVERSATIONS_SQL = """
SELECT c.conversation_id AS conversation_id, c.turns AS turns, c.attributes AS attributes, f.ratings AS ratings
FROM ({window}) AS c
INNER JOIN ({ratings}) AS f ON c.conversation_id = f.conversation_id
ORDER BY conversation_id"""

# ... joined with each conversation's latest score and its scale.
SCORED_CONVERSATIONS_SQL = """
SELECT c.conversation_id AS conversation_id, c.turns AS turns, c.attributes AS attributes, r.score AS score, r.scale AS scale
FROM ({window}) AS c
INNER JOIN (
    SELECT conversation_id, argMax(score, timestamp) AS score, argMax(scale, timestamp) AS scale
    FROM {db}.conversation_ratings FINAL GROUP BY conversation_id
) AS r ON c.conversation_id = r.conversation_id
ORDER BY conversation_id"""


@dataclass(frozen=True)
class FeedbackLabelRules:
    """How a conversation's turn ratings become one label."""

    on_conflict: OnConflict = "exclude"

    def label(self, ratings: Sequence[str]) -> FeedbackLabel:
        """The label of a conversation whose rated turns have these (latest) ratings; "conflict" is excluded."""
        negative = any(r in NEGATIVE_RATINGS for r in ratings)
        positive = any(r in POSITIVE_RATINGS for r in ratings)
        if negative and positive:
            return "negative" if self.on_conflict == "negative" else "conflict"
        return "negative" if negative else "positive"


@dataclass(frozen=True)
class StoreLabels:
    """Labelled conversations read from the store, what was left out, and where they came from."""

    conversations: list[LabelledConversation]
    conflicts: int  # rated both up and down, excluded by the rules
    query: str
    parameters: dict[str, str]
    data_sha256: str

    def metadata(self) -> dict[str, Any]:
        """For the metadata of a rubric set or calibrator learned from these labels."""
        return {
            "source": "store",
            "query": " ".join(self.query.split()),
            "query_parameters": self.parameters,
            "data_sha256": self.data_sha256,
            "conversations": len(self.conversations),
            "positive": sum(1 for c in self.conversations if c.positive),
            "conflicts_excluded": self.conflicts,
        }


def _in_window(
    template: str, store: ClickHouseStore, since: datetime, until: datetime, where: Mapping[str, str] | None, **parts: str
) -> tuple[str, dict[str, Any]]:
    """``template`` with the window's subquery filled in, and its parameters."""
    filters = "".join(f" AND attributes[{{k{i}:String}}] = {{v{i}:String}}" for i in range(len(where or {})))
    window = _WINDOW.format(db=store.database, filters=filters)
    parameters: dict[str, Any] = {"since": since, "until": until}
    for i, (key, value) in enumerate((where or {}).items()):
        parameters[f"k{i}"], parameters[f"v{i}"] = key, value
    return template.format(db=store.database, window=window, **parts), parameters


def _shown(parameters: Mapping[str, Any]) -> dict[str, str]:
    return {k: (v.isoformat() if isinstance(v, datetime) else v) for k, v in parameters.items()}


def _conversation(row: Mapping[str, Any], digest: Any, *label: Any) -> Conversation:
    """A stored conversation, its turns in order; adds it (and ``label``) to the data hash."""
    turns = sorted(row["turns"], key=lambda t: t["index"])
    texts = [[t["role"], t["text"]] for t in turns]
    digest.update(json.dumps([row["conversation_id"], texts, *label]).encode())
    return Conversation(
        row["conversation_id"], tuple(Turn(role=as_role(role), text=text) for role, text in texts), dict(row["attributes"])
    )


def labelled_from_store(
    store: ClickHouseStore,
    since: datetime,
    until: datetime,
    where: Mapping[str, str] | None = None,
    rules: FeedbackLabelRules | None = None,
) -> StoreLabels:
    """The rated conversations closed in ``[since, until)`` whose attributes equal ``where``, labelled by ``rules``."""
    rules = rules or FeedbackLabelRules()
    sql, parameters = _in_window(
        LABELLED_CONVERSATIONS_SQL, store, since, until, where, ratings=ratings_sql(f"{store.database}.feedback")
    )
    rows = store.query(sql, parameters)
    digest = hashlib.sha256()
    conversations, conflicts = [], 0
    for row in rows:
        conversation = _conversation(row, digest, sorted(row["ratings"]))
        label = rules.label(row["ratings"])
        if label == "conflict":
            conflicts += 1
            continue
        conversations.append(LabelledConversation(conversation, label == "positive"))
    return StoreLabels(conversations, conflicts, sql, _shown(parameters), digest.hexdigest())


@dataclass(frozen=True)
class StoreAnswers:
    """Users' scores of stored conversations as answers to one question, what was left out, and where they came from."""

    labels: AnswerLabels
    question: str
    other_scale: int  # conversations rated on a scale other than the question's options: left out
    query: str
    parameters: dict[str, str]
    data_sha256: str

    def metadata(self) -> dict[str, Any]:
        """For the provenance of a calibrator adapted to these answers."""
        scores = [label.answer for label in self.labels.labels]
        return {
            "source": "store",
            "query": " ".join(self.query.split()),
            "query_parameters": self.parameters,
            "data_sha256": self.data_sha256,
            "question": self.question,
            "conversations": len(self.labels.conversations),
            "scores": {str(k): scores.count(k) for k in sorted(set(scores))},
            "other_scale_excluded": self.other_scale,
        }


def answers_from_store(
    store: ClickHouseStore,
    since: datetime,
    until: datetime,
    question: str,
    n_options: int,
    where: Mapping[str, str] | None = None,
) -> StoreAnswers:
    """The conversations closed in ``[since, until)`` (attributes equal to ``where``) that users scored on a 1..
    ``n_options`` scale, each with its latest score as annotator ``users``' answer to ``question``."""
    sql, parameters = _in_window(SCORED_CONVERSATIONS_SQL, store, since, until, where)
    rows = store.query(sql, parameters)
    digest = hashlib.sha256()
    conversations, labels, other_scale = [], [], 0
    for row in rows:
        if int(row["scale"]) != n_options:
            other_scale += 1
            continue
        conversation = _conversation(row, digest, int(row["score"]))
        conversations.append(conversation)
        labels.append(Label(text_id=conversation.id, question=question, judge=USERS, answer=int(row["score"])))
    labelled = AnswerLabels(tuple(conversations), tuple(labels))
    return StoreAnswers(labelled, question, other_scale, sql, _shown(parameters), digest.hexdigest())
