"""ABC-Eval behaviour sets (validated files, the shipped default) and per-turn behaviour judging."""

from __future__ import annotations

import json
from collections.abc import Sequence

import pytest

from scorers import statistics
from scorers.behaviours import (
    NO,
    YES,
    BehaviourScorer,
    BehaviourSet,
    BehaviourSetError,
    default_behaviour_set,
)
from scorers.conversation import Conversation, Turn, render_transcript
from scorers.datasets.llm_rubric import load_real_conversations
from scorers.judges.base import Answer, Judgement, Provenance
from scorers.questions import Question
from tests.data_paths import LLM_RUBRIC


def test_the_default_set_is_abc_evals_sixteen_behaviours() -> None:
    behaviours = default_behaviour_set()
    assert len(behaviours.behaviours) == 16 and behaviours.name == "abc-eval"
    ids = {b.id for b in behaviours.behaviours}
    assert {"ignore", "irrelevant", "self_contradiction", "partner_contradiction", "lack_of_empathy", "antisocial"} <= ids
    questions = behaviours.questions()
    assert all(q.option_keys == (YES, NO) for q in questions)
    assert len({q.stem for q in questions}) == 1  # one stem: asked together, the options are stated once
    assert behaviours.version == default_behaviour_set().version


def test_save_and_load_round_trip(tmp_path) -> None:
    behaviours = default_behaviour_set()
    behaviours.save(tmp_path / "b.json")
    assert BehaviourSet.load(tmp_path / "b.json") == behaviours


def test_error_behaviours_are_abc_evals_errors_and_leave_the_version_alone() -> None:
    behaviours = default_behaviour_set()
    assert {b.id for b in behaviours.behaviours if not b.error} == {
        "preference_info",
        "life_info",
        "empathetic",
        "fact_usage",
        "follow_up",
        "topic_switch",
    }
    doc = _doc()
    assert BehaviourSet.from_dict(doc).behaviours[0].error  # omitted: an error
    flipped = _doc()
    flipped["behaviours"][0]["error"] = False
    assert not BehaviourSet.from_dict(flipped).behaviours[0].error
    assert BehaviourSet.from_dict(flipped).version == BehaviourSet.from_dict(doc).version


def _doc() -> dict:
    return {
        "schema_version": 1,
        "name": "mine",
        "behaviours": [{"id": "ignore", "label": "Ignore", "definition": "Does not respond to what the user just said."}],
    }


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d.update(colour="blue"), r"\(top level\): Additional properties are not allowed \('colour'"),
        (lambda d: d["behaviours"][0].update(weight=2), r"behaviours\[0\]: Additional properties are not allowed \('weight'"),
        (lambda d: d["behaviours"][0].update(error="yes"), r"behaviours\[0\]\.error: 'yes' is not of type 'boolean'"),
        (lambda d: d["behaviours"].append(dict(d["behaviours"][0])), r"duplicate ids \['ignore'\]"),
        (lambda d: d["behaviours"][0].update(id="Not an id"), r"behaviours\[0\]\.id: 'Not an id' does not match"),
        (lambda d: d.update(behaviours=[]), r"behaviours: \[\] should be non-empty"),
        (lambda d: d.update(schema_version=2), r"schema_version: 1 was expected"),
        (lambda d: d.update(version="0123456789abcdef"), r"does not match the content"),
    ],
)
def test_a_bad_behaviour_set_is_one_clear_error(tmp_path, edit, message: str) -> None:
    doc = _doc()
    edit(doc)
    path = tmp_path / "b.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(BehaviourSetError, match=message) as raised:
        BehaviourSet.load(path)
    assert str(raised.value).startswith(f"{path}: ")


def test_unreadable_files_are_refused(tmp_path) -> None:
    path = tmp_path / "b.json"
    path.write_text('{"name": "a", "name": "b"}')
    with pytest.raises(BehaviourSetError, match="duplicate JSON key"):
        BehaviourSet.load(path)
    with pytest.raises(BehaviourSetError, match="cannot read behaviour set"):
        BehaviourSet.load(tmp_path / "absent.json")


class ScriptedJudge:
    """Answers behaviour questions from the transcript it is shown: "ignore" when the last assistant turn
    says "whatever", "redundant" when it repeats the previous assistant turn. A stand-in with known
    answers for the plumbing; what a real judge detects is measured on real data, not here."""

    name = "scripted"
    model = "scripted"

    def __init__(self) -> None:
        self.seen: list[Conversation] = []

    def judge(self, conversation: Conversation, questions: Sequence[Question]) -> Judgement:
        self.seen.append(conversation)
        said = [t.text for t in conversation.turns if t.role == "assistant"]
        shows = {"ignore": said[-1] == "whatever", "redundant": len(said) > 1 and said[-1] == said[-2]}
        answers = {q.id: Answer(q.id, (0.9, 0.1) if shows.get(q.id.split(".", 1)[1]) else (0.2, 0.7)) for q in questions}
        return Judgement(conversation.id, answers, Provenance(self.name, self.model, latency_s=0.5, prompt_tokens=100, calls=1))


def test_every_assistant_turn_is_judged_on_the_conversation_up_to_it() -> None:
    conversation = Conversation(
        "c1",
        (
            Turn("user", "my order is late"),
            Turn("assistant", "whatever"),
            Turn("user", "please help"),
            Turn("assistant", "whatever"),
            Turn("user", "?"),
            Turn("assistant", "I have refunded it."),
        ),
    )
    judge = ScriptedJudge()
    result = BehaviourScorer(default_behaviour_set()).score(judge, conversation)
    assert [t.turn_index for t in result.turns] == [1, 3, 5]
    assert [len(c.turns) for c in judge.seen] == [2, 4, 6]  # each call ends with the turn it asks about
    hits = [t.hits() for t in result.turns]
    assert [h["ignore"] for h in hits] == [True, True, False]
    assert [h["redundant"] for h in hits] == [False, True, False]
    assert result.turns[0].probabilities["ignore"] == pytest.approx(0.9)
    assert result.turns[0].probabilities["antisocial"] == pytest.approx(0.2 / 0.9)  # renormalised over yes/no
    assert (result.provenance.calls, result.provenance.prompt_tokens) == (3, 300)
    assert result.behaviour_set_version == default_behaviour_set().version


def test_one_turn_is_judged_on_the_conversation_up_to_it_and_only_assistant_turns_are_asked() -> None:
    conversation = Conversation("c1", (Turn("user", "hi"), Turn("assistant", "whatever"), Turn("user", "rude!")))
    judge = ScriptedJudge()
    turn, provenance = BehaviourScorer(default_behaviour_set()).score_turn(judge, conversation, 1)
    assert turn.turn_index == 1 and turn.hits()["ignore"] and provenance.calls == 1
    assert [t.text for t in judge.seen[0].turns] == ["hi", "whatever"]  # the user's reaction after it is not shown
    for index in (0, 2, 3, -1):
        with pytest.raises(ValueError, match=f"turn {index} is not an assistant turn"):
            BehaviourScorer(default_behaviour_set()).score_turn(judge, conversation, index)


def test_successive_turns_transcripts_are_prefixes_of_each_other() -> None:
    """What makes per-turn judging cache-friendly: turn t's prompt starts with turn t−1's transcript."""
    conversation = next(iter(load_real_conversations(LLM_RUBRIC / "real_data.json").values()))
    rendered = [render_transcript(Conversation("c", conversation.turns[: i + 1])) for i in range(len(conversation.turns))]
    assert len(rendered) > 3
    assert all(later.startswith(earlier) for earlier, later in zip(rendered, rendered[1:]))


def test_wilson_interval_and_two_proportion_z_test_match_their_textbook_values() -> None:
    none = statistics.wilson_interval(0, 10)
    assert (none.estimate, none.low) == (0.0, 0.0) and none.high == pytest.approx(0.2775, abs=1e-4)
    half = statistics.wilson_interval(5, 10)
    assert (half.low, half.high) == (pytest.approx(0.2366, abs=1e-4), pytest.approx(0.7634, abs=1e-4))
    z, p = statistics.two_proportion_z(10, 100, 20, 100)
    assert z == pytest.approx(1.980, abs=1e-3) and p == pytest.approx(0.0239, abs=1e-4)
    assert statistics.two_proportion_z(0, 50, 0, 50) == (0.0, 1.0)
    with pytest.raises(statistics.MetricError):
        statistics.wilson_interval(3, 2)
