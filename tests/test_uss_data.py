"""USS and LLM-Rubric converters on the real files: counts, labels, splits, and refusal of malformed files."""

from __future__ import annotations

import numpy as np
import pytest

from scorers.labelled import LabelledConversation, LabelledDataError, load_labelled_jsonl, write_labelled_jsonl
from scorers.llm_rubric_data import load_split, satisfaction_labels
from scorers.uss_data import (
    UssFormatError,
    llm_rubric_labelled,
    read_uss,
    stratified_split,
    uss_labelled,
)
from tests.data_paths import LLM_RUBRIC, SHARED_DATA

USS = SHARED_DATA / "uss"


def _raw_overall_means(path) -> list[float]:
    """An independent, minimal reading of the OVERALL lines, to check the reader's counts against."""
    means = []
    for line in path.read_text(encoding="utf-8").splitlines():
        fields = line.split("\t")
        if fields[:2] == ["USER", "OVERALL"]:
            ratings = [int(v) for v in fields[3].split(",")]
            means.append(sum(ratings) / len(ratings))
    return means


@pytest.fixture(scope="module", params=["MWOZ", "SGD"])
def uss_file(request):
    return USS / f"{request.param}.txt"


def test_each_uss_file_has_1000_dialogues_with_their_turns(uss_file):
    dialogues = read_uss(uss_file)
    assert len(dialogues) == 1000
    assert len({d.id for d in dialogues}) == 1000 and dialogues[0].id == f"{uss_file.stem}-0001"
    lines = [line for line in uss_file.read_text(encoding="utf-8").splitlines() if line.strip()]
    assert sum(len(d.conversation.turns) for d in dialogues) == len(lines) - 1000  # every line but OVERALL is a turn
    assert all(d.conversation.turns[0].role == "user" for d in dialogues)
    assert {t.role for d in dialogues for t in d.conversation.turns} == {"user", "assistant"}
    for d in dialogues:
        assert 3 <= len(d.overall_ratings) <= 7 and all(1 <= r <= 5 for r in d.overall_ratings)
        assert d.mean_overall == pytest.approx(np.mean(d.overall_ratings))
    assert [d.mean_overall for d in dialogues] == pytest.approx(_raw_overall_means(uss_file))


def test_uss_labels_and_the_middle(uss_file):
    dialogues = read_uss(uss_file)
    labelled, middle = uss_labelled(dialogues)
    positives = [item for item in labelled if item.positive]
    negatives = [item for item in labelled if not item.positive]
    print(f"{uss_file.stem}: {len(positives)} positive (mean OVERALL >= 3.5), {len(negatives)} negative (< 3), {len(middle)} middle")
    means = _raw_overall_means(uss_file)
    assert len(negatives) == sum(m < 3 for m in means) > 0
    assert len(positives) == sum(m >= 3.5 for m in means) > 0
    assert len(middle) == sum(3 <= m < 3.5 for m in means)
    assert len(positives) + len(negatives) + len(middle) == 1000
    mean_of = {d.id: d.mean_overall for d in dialogues}
    assert all(mean_of[i.conversation.id] >= 3.5 for i in positives)
    assert all(mean_of[i.conversation.id] < 3.0 for i in negatives)
    assert all(3.0 <= d.mean_overall < 3.5 for d in middle)


def test_uss_labelled_round_trips_through_the_labelled_jsonl_format(tmp_path):
    labelled, _ = uss_labelled(read_uss(USS / "MWOZ.txt"))
    path = tmp_path / "mwoz.jsonl"
    assert write_labelled_jsonl(path, labelled) == len(labelled)
    assert load_labelled_jsonl(path) == labelled


def test_uss_labelled_refuses_crossed_thresholds():
    with pytest.raises(LabelledDataError, match="negative_below \\(4.0\\) must be <= positive_at_least \\(3.5\\)"):
        uss_labelled([], negative_below=4.0)


def test_stratified_split_is_balanced_disjoint_and_seeded():
    labelled, _ = uss_labelled(read_uss(USS / "SGD.txt"))
    train, test = stratified_split(labelled, test_fraction=0.5, n_per_class=40, seed=3)
    assert len(train) == len(test) == 40
    assert sum(i.positive for i in train) == sum(i.positive for i in test) == 20
    assert not {i.conversation.id for i in train} & {i.conversation.id for i in test}
    again = stratified_split(labelled, test_fraction=0.5, n_per_class=40, seed=3)
    assert again == (train, test)
    other = stratified_split(labelled, test_fraction=0.5, n_per_class=40, seed=4)
    assert {i.conversation.id for i in other[0]} != {i.conversation.id for i in train}
    full_train, full_test = stratified_split(labelled, test_fraction=0.25, seed=0)
    assert len(full_train) + len(full_test) == len(labelled)
    n_pos = sum(i.positive for i in labelled)
    assert sum(i.positive for i in full_test) == round(n_pos * 0.25)


def test_stratified_split_refuses_what_it_cannot_do():
    labelled, _ = uss_labelled(read_uss(USS / "MWOZ.txt"))
    with pytest.raises(LabelledDataError, match="asked for 500 positive conversations, only 189 available"):
        stratified_split(labelled, n_per_class=500)
    with pytest.raises(LabelledDataError, match="test_fraction must be in \\(0, 1\\)"):
        stratified_split(labelled, test_fraction=1.0)
    tiny = [labelled[0], next(i for i in labelled if i.positive != labelled[0].positive)]
    with pytest.raises(LabelledDataError, match="cannot be split"):
        stratified_split(tiny)


@pytest.mark.parametrize(
    "content, message",
    [
        ("USER\thi\t\t3,3\nUSER\tOVERALL\t\t3\n\n", None),
        ("USER\thi\t3,3\n", r"x.txt:1: expected 4 tab-separated fields"),
        ("BOT\thi\t\t3\nUSER\tOVERALL\t\t3\n", r"x.txt:1: role 'BOT' is not one of"),
        ("USER\thi\t\t3,9\nUSER\tOVERALL\t\t3\n", r"x.txt:1: ratings '3,9' must be 1..5"),
        ("USER\thi\t\tgood\nUSER\tOVERALL\t\t3\n", r"x.txt:1: ratings 'good' are not comma-separated integers"),
        ("USER\thi\t\t3\nSYSTEM\tok\t\t4\nUSER\tOVERALL\t\t3\n", r"x.txt:2: SYSTEM lines carry no ratings"),
        ("USER\thi\t\t3\n\nUSER\tOVERALL\t\t3\n", r"x.txt:2: dialogue starting at line 1 has no final USER OVERALL line"),
        ("USER\thi\t\t3\nSYSTEM\tbye\t\t\n", r"dialogue starting at line 1 has no final USER OVERALL line"),
        ("USER\tOVERALL\t\t3\n", r"x.txt:1: OVERALL line without any turns"),
        ("\n\n", r"x.txt: no dialogues"),
    ],
)
def test_malformed_uss_files_are_refused_with_file_and_line(tmp_path, content, message):
    path = tmp_path / "x.txt"
    path.write_text(content, encoding="utf-8")
    if message is None:
        [dialogue] = read_uss(path)
        assert dialogue.id == "x-0001" and dialogue.overall_ratings == (3,)
        return
    with pytest.raises(UssFormatError, match=message):
        read_uss(path)


def test_llm_rubric_real_conversations_labelled_from_human_q0():
    items = llm_rubric_labelled(LLM_RUBRIC, "real")
    expected = satisfaction_labels(load_split(LLM_RUBRIC, "real"))
    assert len(items) == len(expected) == 223
    assert {i.conversation.id: i.positive for i in items} == expected
    assert all(isinstance(i, LabelledConversation) and i.conversation.turns for i in items)
    print(f"LLM-Rubric real: {sum(i.positive for i in items)} positive, {sum(not i.positive for i in items)} negative (mean Q0 <= 2)")


def test_llm_rubric_synthetic_conversations_come_without_text():
    items = llm_rubric_labelled(LLM_RUBRIC, "synth")
    assert len(items) == len(satisfaction_labels(load_split(LLM_RUBRIC, "synth")))
    assert all(not i.conversation.turns for i in items)
    assert {True, False} == {i.positive for i in items}
