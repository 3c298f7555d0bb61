"""A team's labels file (`calibrate adapt --labels`): what it accepts, one clear error per bad line, and the
calibration data it makes with the judge's answers."""

from __future__ import annotations

import json

import numpy as np
import pytest

from scorers.datasets.answer_labels import DEFAULT_ANNOTATOR, calibration_data, load_answer_labels
from scorers.datasets.labelled import LabelledDataError
from scorers.datasets.llm_rubric import Label, RubricDataError

N_OPTIONS = {"Q0": 4, "Q8": 3}
TURNS = [{"role": "user", "text": "my order is late"}, {"role": "assistant", "text": "It ships tomorrow."}]


def _line(conversation_id: str = "c1", **fields) -> dict:
    return {"conversation_id": conversation_id, "turns": TURNS, "labels": [{"question": "Q0", "answer": 2}], **fields}


def _write(tmp_path, *lines) -> str:
    path = tmp_path / "labels.jsonl"
    path.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n", encoding="utf-8")
    return str(path)


def test_reads_conversations_and_each_persons_answers(tmp_path):
    second = _line(
        "c2",
        attributes={"product": "help-bot"},
        labels=[
            {"question": "Q0", "answer": 4, "annotator": "ana"},
            {"question": "Q0", "answer": 3, "annotator": "ben"},
            {"question": "Q8", "answer": 3, "annotator": "ana"},
        ],
    )
    got = load_answer_labels(_write(tmp_path, _line(), "", second), N_OPTIONS)
    assert [c.id for c in got.conversations] == ["c1", "c2"]
    assert got.conversations[1].attributes == {"product": "help-bot"} and got.conversations[0].turns[1].text == TURNS[1]["text"]
    assert got.labels == (
        Label("c1", "Q0", DEFAULT_ANNOTATOR, 2),
        Label("c2", "Q0", "ana", 4),
        Label("c2", "Q0", "ben", 3),
        Label("c2", "Q8", "ana", 3),
    )


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", r"labels.jsonl:1: not valid JSON"),
        (["a list"], r"labels.jsonl:1: expected a JSON object"),
        (_line(conversation_id=""), "conversation_id must be a non-empty string"),
        (_line(turns=[]), "'c1' has no turns"),
        (_line(labels=[]), "labels must be a non-empty list"),
        (_line(labels={"Q0": 2}), "labels must be a non-empty list"),
        (_line(labels=["Q0=2"]), r"labels\[0\]: expected an object"),
        (_line(labels=[{"question": "Q9", "answer": 1}]), r"question 'Q9' is not one of the calibrator's: Q0, Q8"),
        (_line(labels=[{"question": "Q8", "answer": 4}]), r"answer to Q8 must be a whole number in 1..3, got 4"),
        (_line(labels=[{"question": "Q0", "answer": 0}]), r"in 1..4, got 0"),
        (_line(labels=[{"question": "Q0", "answer": 2.5}]), r"got 2.5"),
        (_line(labels=[{"question": "Q0", "answer": "2"}]), r"got '2'"),
        (_line(labels=[{"question": "Q0", "answer": True}]), r"got True"),
        (_line(labels=[{"question": "Q0", "answer": 2, "annotator": ""}]), "annotator must be a non-empty string"),
        (_line(labels=[{"question": "Q0", "answer": 2, "rater": "ana"}]), r"unknown fields \['rater'\]"),
        (
            _line(labels=[{"question": "Q0", "answer": 2}, {"question": "Q0", "answer": 3}]),
            r"labels\[1\]: 'team' already answered Q0",
        ),
    ],
)
def test_a_bad_line_is_one_clear_error_with_its_line_number(tmp_path, line, message):
    with pytest.raises(LabelledDataError, match=message) as e:
        load_answer_labels(_write(tmp_path, line), N_OPTIONS)
    assert "labels.jsonl:1" in str(e.value)


def test_duplicate_conversations_and_empty_files_are_refused(tmp_path):
    with pytest.raises(LabelledDataError, match=r"labels.jsonl:2: duplicate conversation_id 'c1'"):
        load_answer_labels(_write(tmp_path, _line(), _line()), N_OPTIONS)
    with pytest.raises(LabelledDataError, match="no conversations"):
        load_answer_labels(_write(tmp_path, ""), N_OPTIONS)
    with pytest.raises(LabelledDataError, match="cannot read"):
        load_answer_labels(tmp_path / "missing.jsonl", N_OPTIONS)


def test_calibration_data_puts_each_conversations_answers_in_the_calibrators_order(tmp_path):
    labelled = load_answer_labels(_write(tmp_path, _line(), _line("c2")), N_OPTIONS)
    answers = [{"Q8": (0.1, 0.2, 0.7), "Q0": (0.4, 0.3, 0.2, 0.1)}, {"Q0": (0.0, 0.0, 0.5, 0.5), "Q8": (1.0, 0.0, 0.0)}]
    data = calibration_data(labelled, answers, N_OPTIONS, ("Q0", "Q8"))
    np.testing.assert_allclose(data.features["c1"], [0.4, 0.3, 0.2, 0.1, 0.1, 0.2, 0.7])
    np.testing.assert_allclose(data.features["c2"], [0.0, 0.0, 0.5, 0.5, 1.0, 0.0, 0.0])
    assert data.labels == labelled.labels
    with pytest.raises(RubricDataError, match=r"'c2': the judge gave no answer for Q8"):
        calibration_data(labelled, [answers[0], {"Q0": answers[1]["Q0"]}], N_OPTIONS, ("Q0", "Q8"))
    with pytest.raises(RubricDataError, match=r"'c1': the judge gave 2 probabilities for Q8 \(3 options\)"):
        calibration_data(labelled, [{**answers[0], "Q8": (0.5, 0.5)}, answers[1]], N_OPTIONS, ("Q0", "Q8"))
