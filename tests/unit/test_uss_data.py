"""USS and LLM-Rubric converters on the real files: counts, per-turn ratings, labels, splits, and refusal of malformed files."""

from __future__ import annotations

import numpy as np
import pytest

from scorers.datasets.labelled import LabelledConversation, LabelledDataError, load_labelled_jsonl, write_labelled_jsonl
from scorers.datasets.llm_rubric import load_split, satisfaction_labels
from scorers.datasets.uss import (
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


@pytest.mark.parametrize(("name", "turns", "low"), [("MWOZ", 22108, 53), ("SGD", 25666, 37)])
def test_uss_turn_counts_low_overall_and_turn_ratings(name: str, turns: int, low: int) -> None:
    """Counts checked independently: 1,000 OVERALL lines per file, turns = non-blank lines minus those."""
    path = USS / f"{name}.txt"
    lines = path.read_text(encoding="utf-8").splitlines()
    assert sum(1 for line in lines if line.startswith("USER\tOVERALL\t")) == 1000
    assert sum(1 for line in lines if line.strip()) - 1000 == turns
    dialogues = read_uss(path)
    assert sum(len(d.conversation.turns) for d in dialogues) == turns
    assert sum(d.mean_overall <= 2.5 for d in dialogues) == low  # the data README's figure
    for d in dialogues:
        assert len(d.turn_ratings) == len(d.conversation.turns)
        for turn, ratings in zip(d.conversation.turns, d.turn_ratings):
            assert (turn.role == "user") == bool(ratings) and all(1 <= r <= 5 for r in ratings)
        assert lines[d.first_line - 1].split("\t")[1] == d.conversation.turns[0].text
        assert d.conversation.attributes == {"dataset": name, "first_line": str(d.first_line)}
    # the first MWOZ dialogue, by hand: 'USER<TAB>I'm looking for a cheap restaurant ...<TAB>Restaurant-Inform<TAB>3,3,3,3' on line 2
    if name == "MWOZ":
        first = dialogues[0]
        assert first.first_line == 2 and first.turn_ratings[:2] == ((3, 3, 3, 3), ())
        assert first.overall_ratings == (3, 3, 2, 3) and len(first.conversation.turns) == 13


def test_uss_labels_and_the_middle(uss_file):
    dialogues = read_uss(uss_file)
    labelled, middle = uss_labelled(dialogues)
    positives = [item for item in labelled if item.positive]
    negatives = [item for item in labelled if not item.positive]
    print(
        f"{uss_file.stem}: {len(positives)} positive (mean OVERALL >= 3.5), {len(negatives)} negative (< 3), {len(middle)} middle"
    )
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


NO_OVERALL = "the dialogue starting at line {} has no final USER OVERALL line"


@pytest.mark.parametrize(
    "content, message",
    [
        ("USER\thi\t3,3\n", r"x\.txt:1: expected 4 tab-separated fields"),
        ("USER\thi\t\t3,3\nSYSTEM\thello\n", r"x\.txt:2: expected 4 tab-separated fields"),
        ("BOT\thi\t\t3\nUSER\tOVERALL\t\t3\n", r"x\.txt:1: role 'BOT' is not one of"),
        ("BOT\thi\t\t3\n", r"x\.txt:1: role 'BOT' is not one of"),
        ("USER\thi\t\t3,9\nUSER\tOVERALL\t\t3\n", r"x\.txt:1: ratings '3,9' must be 1\.\.5"),
        ("USER\thi\t\t3,6\nUSER\tOVERALL\t\t3\n", r"x\.txt:1: ratings '3,6' must be 1\.\.5"),
        ("USER\thi\t\t3\nUSER\tOVERALL\t\t0\n", r"x\.txt:2: ratings '0' must be 1\.\.5"),
        ("USER\thi\t\tgood\nUSER\tOVERALL\t\t3\n", r"x\.txt:1: ratings 'good' are not comma-separated integers"),
        ("USER\thi\t\t 3,+4\nUSER\tOVERALL\t\t3\n", r"x\.txt:1: ratings ' 3,\+4' are not comma-separated integers"),
        ("USER\thi\t\t\nUSER\tOVERALL\t\t3\n", r"x\.txt:1: ratings '' are not comma-separated integers"),
        ("USER\thi\t\t3\nSYSTEM\tok\t\t4\nUSER\tOVERALL\t\t3\n", r"x\.txt:2: a SYSTEM line carries ratings '4'"),
        ("USER\thi\t\t3\nSYSTEM\tok\t\t \nUSER\tOVERALL\t\t3\n", r"x\.txt:2: a SYSTEM line carries ratings ' '"),
        ("USER\thi\t\t3\n\nUSER\tOVERALL\t\t3\n", r"x\.txt:2: " + NO_OVERALL.format(1)),
        ("USER\thi\t\t3,3\nSYSTEM\thello\t\t\n\nUSER\tnext\t\t3\n", r"x\.txt:3: " + NO_OVERALL.format(1)),
        ("USER\thi\t\t3\nSYSTEM\tbye\t\t\n", r"x\.txt:2: " + NO_OVERALL.format(1)),
        ("USER\thi\t\t3\nUSER\tOVERALL\t\t3\n\n\nUSER\tagain\t\t3\nSYSTEM\tok\t\t\n", r"x\.txt:6: " + NO_OVERALL.format(5)),
        ("USER\thi\t\t3\nUSER\tOVERALL\t\t3\nUSER\tmore\t\t3\n", r"x\.txt:3: a line after the dialogue's OVERALL line"),
        ("USER\tOVERALL\t\t3\n", r"x\.txt:1: OVERALL line before any turn"),
        ("USER\t \t\t3\nUSER\tOVERALL\t\t3\n", r"x\.txt:1: empty turn text"),
        ("USER\thi\t\t3\nSYSTEM\t\t\t\nUSER\tOVERALL\t\t3\n", r"x\.txt:2: empty turn text"),
        (
            "USER\thi\t\t3\nUSER\tOVERALL\t\t3\n\nUSER\tcaf\xe9\t\t3\n",
            r"x\.txt:4: not UTF-8 \(invalid continuation byte at byte 8\)",
        ),
        ("\n\n", r"x\.txt: no dialogues"),
        ("", r"x\.txt: no dialogues"),
    ],
)
def test_malformed_uss_files_are_refused_with_file_and_line(tmp_path, content, message):
    path = tmp_path / "x.txt"
    path.write_bytes(content.encode("latin-1"))  # latin-1: the one non-UTF-8 case keeps its raw byte
    with pytest.raises(UssFormatError, match=message):
        read_uss(path)


def test_a_minimal_uss_file_lf_or_crlf(tmp_path):
    lf = b"USER\thi\tgreet\t3,4\nSYSTEM\thello\t\t\nUSER\tOVERALL\t\t4,5\n\n\nUSER\tbye\t\t2\nUSER\tOVERALL\t\t1\n"
    path = tmp_path / "x.txt"
    path.write_bytes(lf)
    dialogues = read_uss(path)
    assert [d.id for d in dialogues] == ["x-0001", "x-0002"] and [d.first_line for d in dialogues] == [1, 6]
    assert [(t.role, t.text) for t in dialogues[0].conversation.turns] == [("user", "hi"), ("assistant", "hello")]
    assert (
        dialogues[0].turn_ratings == ((3, 4), ()) and dialogues[0].overall_ratings == (4, 5) and dialogues[0].mean_overall == 4.5
    )
    assert dialogues[1].turn_ratings == ((2,),) and dialogues[1].mean_overall == 1.0
    path.write_bytes(lf.replace(b"\n", b"\r\n"))
    assert read_uss(path) == dialogues  # CRLF: the same dialogues, no stray "\r" in texts or ratings


def test_an_unreadable_uss_file_is_a_format_error(tmp_path):
    with pytest.raises(UssFormatError, match=r"missing\.txt: cannot read"):
        read_uss(tmp_path / "missing.txt")


def test_llm_rubric_real_conversations_labelled_from_human_q0():
    items = llm_rubric_labelled(LLM_RUBRIC, "real")
    expected = satisfaction_labels(load_split(LLM_RUBRIC, "real"))
    assert len(items) == len(expected) == 223
    assert {i.conversation.id: i.positive for i in items} == expected
    assert all(isinstance(i, LabelledConversation) and i.conversation.turns for i in items)
    print(
        f"LLM-Rubric real: {sum(i.positive for i in items)} positive, {sum(not i.positive for i in items)} negative (mean Q0 <= 2)"
    )


def test_llm_rubric_synthetic_conversations_come_without_text():
    items = llm_rubric_labelled(LLM_RUBRIC, "synth")
    assert len(items) == len(satisfaction_labels(load_split(LLM_RUBRIC, "synth")))
    assert all(not i.conversation.turns for i in items)
    assert {True, False} == {i.positive for i in items}
