"""ABC-Eval behaviours: binary questions about each assistant turn, and their rates per turn.

ABC-Eval (Finch et al., ACL 2023) labels every chatbot response with binary
behaviours (ignore, irrelevant, self contradiction, lack of empathy, …) and
reports each as a rate per bot turn with a Wilson interval. A `BehaviourSet`
is the list of behaviours (a validated JSON file; ABC-Eval's 16 are the
default set, `default_behaviour_set`). `BehaviourScorer` asks a judge, for
each assistant turn, whether the turn shows each behaviour, with the
conversation *up to and including that turn* as context. Transcripts of
successive turns are prefixes of each other and the questions come last, so
a server's prompt cache serves every call but the first from the previous
one's prefix.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema

from scorers.conversation import Conversation
from scorers.errors import UserError
from scorers.json_file import json_path, loads_strict, write_json
from scorers.judges.base import Judge, Provenance
from scorers.questions import Question

SCHEMA_VERSION = 1
DEFAULT_SET = "abc_eval_behaviours.json"
DEFAULT_SET_NAME = "abc-eval"  # what settings and commands call the shipped set
YES, NO = "Y", "N"
STEM = "Does the assistant's last response (the final assistant turn above) show each behaviour below?"
HIT_PROBABILITY = 0.5  # a turn shows a behaviour when the judge's P(yes) is above this
VERSION_HEX_CHARS = 16


class BehaviourSetError(UserError, ValueError):
    """A behaviour-set file or document that cannot be used; names the field and the reason."""


@dataclass(frozen=True)
class Behaviour:
    """One binary behaviour of an assistant turn."""

    id: str
    label: str
    definition: str
    error: bool = True
    """A mistake of the assistant (ABC-Eval's errors): a significant rise of its rate alerts. False for behaviours
    that are neither good nor bad in themselves (follow-up, topic switch, ...)."""

    def question(self) -> Question:
        """The yes/no question a judge answers about the last assistant turn of a transcript."""
        return Question(
            id=f"behaviour.{self.id}",
            text=f"{STEM}\n{self.label}: {self.definition}",
            option_keys=(YES, NO),
            option_labels=("yes", "no"),
            stem=STEM,
            item=f"{self.label}: {self.definition}",
        )


@dataclass(frozen=True)
class BehaviourSet:
    """The behaviours judged on every assistant turn, with a content version."""

    name: str
    behaviours: tuple[Behaviour, ...]
    description: str = ""

    def __post_init__(self) -> None:
        ids = [b.id for b in self.behaviours]
        duplicated = sorted({i for i in ids if ids.count(i) > 1})
        if duplicated:
            raise BehaviourSetError(f"behaviours: duplicate ids {duplicated}")
        if not self.behaviours:
            raise BehaviourSetError("behaviours: a behaviour set needs at least one behaviour")

    @property
    def version(self) -> str:
        """Hash of the behaviours' ids, labels and definitions: changes whenever what is asked changes (``error`` is
        not asked, so it leaves the version alone)."""
        content = [[b.id, b.label, b.definition] for b in self.behaviours]
        return hashlib.sha256(json.dumps(content, ensure_ascii=False).encode()).hexdigest()[:VERSION_HEX_CHARS]

    def questions(self) -> list[Question]:
        return [b.question() for b in self.behaviours]

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "name": self.name,
            "description": self.description,
            "version": self.version,
            "behaviours": [
                {"id": b.id, "label": b.label, "definition": b.definition, **({} if b.error else {"error": False})}
                for b in self.behaviours
            ],
        }

    def save(self, path: str | Path) -> None:
        write_json(path, self.to_dict())

    @classmethod
    def from_dict(cls, doc: Any, source: str = "") -> BehaviourSet:
        """Validate a parsed document (schema, then the version) and build the set."""
        where = f"{source}: " if source else ""
        error = jsonschema.exceptions.best_match(_validator().iter_errors(doc))
        if error is not None:
            raise BehaviourSetError(f"{where}{json_path(error.absolute_path) or '(top level)'}: {error.message}")
        try:
            behaviour_set = cls(
                name=doc["name"],
                description=doc.get("description", ""),
                behaviours=tuple(
                    Behaviour(b["id"], b["label"], b["definition"], b.get("error", True)) for b in doc["behaviours"]
                ),
            )
        except BehaviourSetError as e:
            raise BehaviourSetError(f"{where}{e}") from None
        stored = doc.get("version")
        if stored is not None and stored != behaviour_set.version:
            raise BehaviourSetError(
                f"{where}version: {stored!r} does not match the content ({behaviour_set.version!r}): "
                "remove 'version' to accept the edit as a new version"
            )
        return behaviour_set

    @classmethod
    def load(cls, path: str | Path) -> BehaviourSet:
        """Read a behaviour-set file; refuses a bad file with the field and the reason."""
        try:
            doc = loads_strict(Path(path).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as e:
            raise BehaviourSetError(f"{path}: cannot read behaviour set: {e}") from None
        return cls.from_dict(doc, source=str(path))


def default_behaviour_set() -> BehaviourSet:
    """ABC-Eval's 16 behaviours, as shipped in ``scorers/data``."""
    text = resources.files("scorers").joinpath("data", DEFAULT_SET).read_text(encoding="utf-8")
    return BehaviourSet.from_dict(loads_strict(text), source=f"scorers/data/{DEFAULT_SET}")


def load_behaviour_set(name_or_path: str | Path) -> BehaviourSet:
    """The shipped set for ``'abc-eval'``, else the behaviour-set file at that path."""
    if str(name_or_path) == DEFAULT_SET_NAME:
        return default_behaviour_set()
    return BehaviourSet.load(name_or_path)


def schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of behaviour-set files."""
    return json.loads(resources.files("scorers").joinpath("behaviour_set.schema.json").read_text(encoding="utf-8"))


@functools.cache
def _validator() -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(schema())


@dataclass(frozen=True)
class TurnBehaviours:
    """The judge's P(yes) for every behaviour of one assistant turn (``turn_index`` counts all turns from 0)."""

    turn_index: int
    probabilities: dict[str, float]

    def hits(self) -> dict[str, bool]:
        return {b: shows(p) for b, p in self.probabilities.items()}


def shows(probability: float) -> bool:
    """Whether a turn shows a behaviour the judge gives this P(yes)."""
    return probability > HIT_PROBABILITY


# For the report's and the dashboards' queries of the store's ``behaviour_turns`` rows (aliased ``b``): each
# behaviour's share of hits, every row weighted by 1/π so that sampling does not bias it.
WEIGHTED_RATE_SQL = "sum(b.hit / b.inclusion_probability) / sum(1 / b.inclusion_probability)"


def behaviour_rows_sql(scores: str) -> str:
    """``behaviour_turns`` rows (as ``b``) of exactly the scores in ``scores`` (a table, view or subquery, as ``s``)."""
    return f"""behaviour_turns AS b FINAL
INNER JOIN {scores} AS s
    ON b.conversation_id = s.conversation_id AND b.scorer_version = s.scorer_version AND b.scored_at = s.scored_at"""


@dataclass(frozen=True)
class ConversationBehaviours:
    """Every assistant turn's behaviours, and what judging them cost."""

    conversation_id: str
    behaviour_set_version: str
    turns: tuple[TurnBehaviours, ...]
    provenance: Provenance


class BehaviourScorer:
    """Asks a judge a behaviour set's questions about every assistant turn of a conversation."""

    def __init__(self, behaviour_set: BehaviourSet) -> None:
        self.behaviour_set = behaviour_set
        self._questions = behaviour_set.questions()

    def score(self, judge: Judge, conversation: Conversation) -> ConversationBehaviours:
        """One judge call per assistant turn (the judge may group the questions into one request)."""
        turns, calls = [], []
        for index, turn in enumerate(conversation.turns):
            if turn.role == "assistant":
                behaviours, provenance = self.score_turn(judge, conversation, index)
                turns.append(behaviours)
                calls.append(provenance)
        provenance = Provenance.total(calls) if calls else Provenance(judge.name, getattr(judge, "model", ""))
        return ConversationBehaviours(conversation.id, self.behaviour_set.version, tuple(turns), provenance)

    def score_turn(self, judge: Judge, conversation: Conversation, index: int) -> tuple[TurnBehaviours, Provenance]:
        """The behaviours of assistant turn ``index``, judged on the conversation up to it (nothing after it)."""
        if not 0 <= index < len(conversation.turns) or conversation.turns[index].role != "assistant":
            raise ValueError(f"{conversation.id}: turn {index} is not an assistant turn")
        prefix = Conversation(conversation.id, conversation.turns[: index + 1], conversation.attributes)
        judgement = judge.judge(prefix, self._questions)
        probabilities = {
            b.id: _yes_probability(judgement.answers[q.id].probabilities)
            for b, q in zip(self.behaviour_set.behaviours, self._questions)
        }
        return TurnBehaviours(index, probabilities), judgement.provenance


def _yes_probability(probabilities: Sequence[float]) -> float:
    """P(yes) renormalised over the two options (the judge's mass outside them says nothing here)."""
    yes, no = probabilities[0], probabilities[1]
    return yes / (yes + no) if yes + no > 0 else 0.5
