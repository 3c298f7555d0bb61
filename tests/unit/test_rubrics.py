"""RUBICON rubric sets: NetSAT arithmetic, confidence windows, metrics, the JSON file."""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import re
from pathlib import Path

import jsonschema
import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from scorers.conversation import Conversation
from scorers.datasets.llm_rubric import dimension_rubric_set, load_real_conversations
from scorers.judges import RecordedJudge
from scorers.judges.base import Answer, Judgement, JudgeReplyError, Provenance
from scorers.questions import likert_question
from scorers.rubrics import (
    LIKERT_SCALE,
    RUBRIC_ID_PATTERN,
    UNFITTED,
    ConfidenceWindows,
    Polarity,
    Rubric,
    RubricSet,
    RubricSetError,
    Scale,
    evaluate,
    fit_threshold,
    fit_windows,
    netsat_matrix,
    precision_curves,
    schema,
)
from tests.data_paths import LLM_RUBRIC as DATA

ROOT = Path(__file__).resolve().parents[2]
REAL_TSV = DATA / "gpt-3.5-turbo-16k_real_evaluations_FIXED.tsv"
PROVENANCE = Provenance(judge="hand", model="hand")

FIX = Rubric("fix", "The assistant gives a working code fix.", Polarity.SAT)
CLEAR = Rubric("clear", "The assistant explains the cause clearly.", "sat")
GENERIC = Rubric("generic", "The assistant repeats generic advice.", Polarity.DSAT)
TURNS = Rubric(
    "turns",
    "Is the number of turns appropriate?",
    Polarity.SAT,
    Scale(keys=("1", "2", "3"), labels=("fewer would do", "more are needed", "reasonable"), scores=(0, 0, 10)),
)


def _judgement(**probs: tuple[float, ...]) -> Judgement:
    return Judgement("c1", {qid: Answer(qid, p) for qid, p in probs.items()}, PROVENANCE)


# ---------------------------------------------------------------------------- rubrics and NetSAT


def test_default_scale_is_likert_0_to_10_and_asked_as_an_assertion():
    assert FIX.scale == LIKERT_SCALE
    assert LIKERT_SCALE.keys == ("1", "2", "3", "4", "5")
    assert LIKERT_SCALE.scores == (0.0, 2.5, 5.0, 7.5, 10.0)
    assert FIX.question() == likert_question("fix", FIX.text)


def test_non_likert_scale_is_asked_as_its_own_question():
    q = TURNS.question()
    assert q.id == "turns" and q.text == TURNS.text
    assert q.option_keys == ("1", "2", "3") and q.option_labels[2] == "reasonable"


def test_rating_is_expected_score_renormalised_over_covered_mass():
    assert FIX.rating(Answer("fix", (0, 0, 0.5, 0.5, 0))) == pytest.approx(6.25)
    # Only 40% of the mass on the options: renormalised, (0.2*0 + 0.2*10) / 0.4.
    assert FIX.rating(Answer("fix", (0.2, 0, 0, 0, 0.2))) == pytest.approx(5.0)
    # Q8-style scale: options 1 and 2 are both bad.
    assert TURNS.rating(Answer("turns", (0.3, 0.2, 0.5))) == pytest.approx(5.0)


def test_dsat_score_is_negated_rating():
    answer = Answer("generic", (0, 0, 0, 1, 0))
    assert GENERIC.rating(answer) == pytest.approx(7.5)
    assert GENERIC.score(answer) == pytest.approx(-7.5)
    assert FIX.score(Answer("fix", (0, 0, 0, 1, 0))) == pytest.approx(7.5)


def test_zero_covered_mass_and_wrong_option_count_are_reply_errors():
    with pytest.raises(JudgeReplyError, match="no probability mass"):
        FIX.score(Answer("fix", (0, 0, 0, 0, 0)))
    with pytest.raises(JudgeReplyError, match="4 probabilities but the scale has 5"):
        FIX.score(Answer("fix", (0.25, 0.25, 0.25, 0.25)))


def test_netsat_and_score_on_a_hand_computed_judgement():
    rubric_set = RubricSet((FIX, GENERIC, TURNS), ConfidenceWindows(threshold=5.0, dsat_upper=0.0, sat_lower=10.0))
    judgement = _judgement(
        fix=(0, 0, 0, 0.5, 0.5),  # 8.75
        generic=(0.5, 0.5, 0, 0, 0),  # 1.25 -> -1.25
        turns=(0, 0.4, 0.4),  # 5.0 (renormalised over 0.8)
    )
    assert rubric_set.netsat(judgement) == pytest.approx(8.75 - 1.25 + 5.0)
    scored = rubric_set.score(judgement)
    assert scored.netsat == pytest.approx(12.5)
    assert scored.rubric_scores == pytest.approx({"fix": 8.75, "generic": -1.25, "turns": 5.0})
    assert scored.label == "sat" and scored.threshold_label == "sat"
    assert scored.rubric_set_version == rubric_set.version
    assert [q.id for q in rubric_set.questions()] == ["fix", "generic", "turns"]


def test_netsat_needs_an_answer_for_every_rubric():
    rubric_set = RubricSet((FIX, GENERIC))
    with pytest.raises(JudgeReplyError, match="no answer for rubric 'generic'"):
        rubric_set.netsat(_judgement(fix=(0, 0, 1, 0, 0)))


def test_netsat_matrix_matches_per_judgement_netsat():
    rubric_set = RubricSet((FIX, GENERIC, TURNS))
    ratings = np.array([[8.75, 1.25, 5.0], [0.0, 10.0, 10.0]])
    assert netsat_matrix(ratings, rubric_set.polarities) == pytest.approx([12.5, 0.0])
    assert netsat_matrix(ratings, ["sat", "dsat", "sat"]) == pytest.approx([12.5, 0.0])


@pytest.mark.parametrize(
    ("ratings", "polarities", "match"),
    [
        (np.zeros((2, 3)), ["sat", "sat"], r"shape \(n, 2\)"),
        (np.full((1, 2), 10.5), ["sat", "dsat"], r"within \[0, 10\]"),
        (np.array([[np.nan, 1.0]]), ["sat", "dsat"], "finite"),
        (np.zeros((1, 2)), ["sat", "good"], "'good' is not a valid Polarity"),
    ],
)
def test_netsat_matrix_refuses_bad_input(ratings, polarities, match):
    with pytest.raises(RubricSetError, match=match):
        netsat_matrix(ratings, polarities)


ratings_matrices = st.integers(1, 6).flatmap(
    lambda k: st.tuples(
        st.lists(st.lists(st.floats(0, 10), min_size=k, max_size=k), min_size=1, max_size=8),
        st.lists(st.lists(st.floats(0, 10), min_size=k, max_size=k), min_size=1, max_size=8),
        st.lists(st.sampled_from(list(Polarity)), min_size=k, max_size=k),
    )
)


@given(ratings_matrices)
def test_netsat_is_linear_and_dsat_flips_sign(case):
    a, b, polarities = case
    n = min(len(a), len(b))
    x, y = np.array(a[:n]), np.array(b[:n])
    mid = netsat_matrix((x + y) / 2, polarities)
    assert mid == pytest.approx((netsat_matrix(x, polarities) + netsat_matrix(y, polarities)) / 2, abs=1e-9)
    flipped = [Polarity.DSAT if p is Polarity.SAT else Polarity.SAT for p in polarities]
    assert netsat_matrix(x, flipped) == pytest.approx(-netsat_matrix(x, polarities), abs=1e-9)


# ---------------------------------------------------------------------------- windows


def test_precision_curves_by_hand():
    netsats = np.array([0.0, 1.0, 2.0, 3.0])
    labels = np.array([False, True, False, True])
    curves = precision_curves(netsats, labels, np.array([0.0, 1.5, 3.0, 4.0]))
    # >= t: {all} 2/4, {2, 3} 1/2, {3} 1/1, {} undefined
    assert curves.positive[:3] == pytest.approx([0.5, 0.5, 1.0]) and math.isnan(curves.positive[3])
    # <= t: {0} 1/1, {0, 1} 1/2, {all} 2/4, {all} 2/4
    assert curves.negative == pytest.approx([1.0, 0.5, 0.5, 0.5])


def test_threshold_is_midpoint_of_class_means():
    assert fit_threshold(np.array([0.0, 2.0, 10.0, 20.0]), np.array([0, 0, 1, 1])) == pytest.approx(8.0)


def test_windows_perfectly_separable():
    netsats = np.array([0.0, 1.0, 2.0, 8.0, 9.0, 10.0])
    labels = np.array([False, False, False, True, True, True])
    windows = fit_windows(netsats, labels, precision=0.9)
    assert (windows.threshold, windows.dsat_upper, windows.sat_lower) == (5.0, 2.0, 8.0)
    assert evaluate(netsats, labels, windows).yield_rate == 1.0


# Negatives 0..8 and 13, positives 6.5 and 9..18 without 13: the classes overlap on [6.5, 13].
OVERLAP_NEG = [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 13.0]
OVERLAP_POS = [6.5, 9.0, 10.0, 11.0, 12.0, 14.0, 15.0, 16.0, 17.0, 18.0]


@pytest.mark.parametrize(
    ("precision", "dsat_upper", "sat_lower", "yield_rate"),
    [
        # P=0.9: <= 8 holds 9 negatives and 6.5 (9/10); >= 9 holds 9 positives and 13 (9/10).
        (0.9, 8.0, 9.0, 1.0),
        # P=0.95: the first all-negative prefix ends at 6, the first all-positive suffix starts at 14.
        (0.95, 6.0, 14.0, 12 / 20),
    ],
)
def test_windows_on_overlapping_classes(precision, dsat_upper, sat_lower, yield_rate):
    netsats = np.array(OVERLAP_NEG + OVERLAP_POS)
    labels = np.array([False] * 10 + [True] * 10)
    windows = fit_windows(netsats, labels, precision=precision)
    assert windows.threshold == pytest.approx((4.9 + 12.85) / 2)
    assert (windows.dsat_upper, windows.sat_lower, windows.precision) == (dsat_upper, sat_lower, precision)
    assert evaluate(netsats, labels, windows).yield_rate == pytest.approx(yield_rate)


def test_one_sided_windows_when_the_top_is_never_precise_enough():
    # The highest score is a negative, and every suffix from θ up is < 90% positive.
    netsats = np.array([0.0, 1.0, 2.0, 3.0, 20.0, 8.0, 9.0, 10.0, 11.0])
    labels = np.array([False] * 5 + [True] * 4)
    windows = fit_windows(netsats, labels, precision=0.9)
    assert windows.sat_lower is None
    assert windows.dsat_upper == 3.0
    assert windows.label(25.0) == "uncertain" and windows.label(3.0) == "dsat"
    assert evaluate(netsats, labels, windows).yield_rate == pytest.approx(4 / 9)


def test_no_windows_at_all_abstains_everywhere():
    netsats = np.array([1.0, 2.0, 3.0, 4.0])
    labels = np.array([True, False, True, False])
    windows = fit_windows(netsats, labels, precision=0.9)
    assert windows.dsat_upper is None and windows.sat_lower is None
    metrics = evaluate(netsats, labels, windows)
    assert metrics.yield_rate == 0.0 and math.isnan(metrics.confident_accuracy)


@pytest.mark.parametrize("labels", [[True, True, True], [False, False, False], [0, 0, 0]])
def test_one_class_data_is_refused(labels):
    with pytest.raises(RubricSetError, match=r"labels: need both positive and negative conversations, got \d of 3"):
        fit_windows(np.array([1.0, 2.0, 3.0]), np.array(labels))


@pytest.mark.parametrize(
    ("netsats", "labels", "match"),
    [
        ([1.0, 2.0], [True], "same length"),
        ([1.0, math.inf], [True, False], "finite"),
        ([1.0, 2.0], [2, 0], "booleans"),
        ([], [], "need both"),
    ],
)
def test_bad_labelled_data_is_refused(netsats, labels, match):
    with pytest.raises(RubricSetError, match=match):
        fit_windows(np.array(netsats), np.array(labels))


def _reference_windows(s: list[float], y: list[bool], precision: float, theta: float) -> tuple:
    """Windows by brute force, straight from the definition."""

    def share(selected: list[bool], want: bool) -> float:
        return sum(v == want for v in selected) / len(selected)

    values = sorted(set(s))
    sat = [t for t in values if t >= theta and share([b for a, b in zip(s, y) if a >= t], True) >= precision]
    dsat = [t for t in values if t < theta and share([b for a, b in zip(s, y) if a <= t], False) >= precision]
    return (max(dsat) if dsat else None), (min(sat) if sat else None)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(-20, 40), st.booleans()), min_size=2, max_size=40),
    st.sampled_from([0.6, 0.75, 0.9, 1.0]),
)
def test_fitted_windows_reach_precision_on_the_fitting_data_and_are_widest(points, precision):
    s = [float(v) for v, _ in points]
    y = [b for _, b in points]
    assume(any(y) and not all(y))
    netsats, labels = np.array(s), np.array(y)
    windows = fit_windows(netsats, labels, precision=precision)
    assert (windows.dsat_upper, windows.sat_lower) == _reference_windows(s, y, precision, windows.threshold)
    predicted = windows.labels(netsats)
    if windows.sat_lower is not None:
        assert windows.threshold <= windows.sat_lower
        assert labels[predicted == "sat"].mean() >= precision
    if windows.dsat_upper is not None:
        assert windows.dsat_upper < windows.threshold
        assert (~labels[predicted == "dsat"]).mean() >= precision


# ---------------------------------------------------------------------------- labels and metrics

WINDOWS = ConfidenceWindows(threshold=5.0, dsat_upper=2.0, sat_lower=8.0, precision=0.9)


@pytest.mark.parametrize(
    ("netsat", "label", "binary"),
    [
        (-100.0, "dsat", "dsat"),
        (2.0, "dsat", "dsat"),
        (2.0001, "uncertain", "dsat"),
        (4.9999, "uncertain", "dsat"),
        (5.0, "uncertain", "sat"),
        (7.9999, "uncertain", "sat"),
        (8.0, "sat", "sat"),
        (100.0, "sat", "sat"),
    ],
)
def test_labels_at_window_boundaries(netsat, label, binary):
    assert WINDOWS.label(netsat) == label
    assert WINDOWS.binary_label(netsat) == binary
    assert WINDOWS.labels(np.array([netsat]))[0] == label
    assert RubricSet((FIX,), WINDOWS).label(netsat) == label


def test_unfitted_set_abstains_on_everything():
    assert RubricSet((FIX,)).windows == UNFITTED
    assert {UNFITTED.label(v) for v in (-50.0, 0.0, 50.0)} == {"uncertain"}


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"threshold": 5.0, "dsat_upper": 5.0}, "windows.dsat_upper"),
        ({"threshold": 5.0, "sat_lower": 4.0}, "windows.sat_lower"),
        ({"threshold": 5.0, "precision": 0.0}, "precision"),
        ({"threshold": 5.0, "precision": 1.5}, "precision"),
        ({"threshold": math.nan}, "threshold"),
    ],
)
def test_inconsistent_windows_are_refused(kwargs, field):
    with pytest.raises(RubricSetError) as info:
        ConfidenceWindows(**kwargs)
    assert info.value.field == field


def test_evaluate_by_hand():
    netsats = np.array([-5.0, 0.0, 2.0, 3.0, 6.0, 9.0])
    labels = np.array([False, False, True, False, True, True])
    windows = ConfidenceWindows(threshold=2.5, dsat_upper=0.0, sat_lower=6.0)
    m = evaluate(netsats, labels, windows)
    # Predicted sat (>= 2.5): 3 (neg), 6, 9 -> TP 2, FP 1, FN 1 (the positive at 2).
    assert (m.n, m.n_positive) == (6, 3)
    assert m.delta_netsat == pytest.approx(17 / 3 - (-2 / 3))
    assert m.accuracy == pytest.approx(4 / 6)
    assert m.precision == pytest.approx(2 / 3) and m.recall == pytest.approx(2 / 3) and m.f1 == pytest.approx(2 / 3)
    # Confident: -5, 0 (dsat, both right) and 6, 9 (sat, both right).
    assert m.yield_rate == pytest.approx(4 / 6) and m.confident_accuracy == 1.0
    assert evaluate(netsats, labels, RubricSet((FIX,), windows)) == m


def test_evaluate_precision_is_undefined_when_nothing_is_predicted_satisfied():
    m = evaluate(np.array([1.0, 2.0]), np.array([True, False]), ConfidenceWindows(threshold=10.0))
    assert math.isnan(m.precision) and math.isnan(m.f1)
    assert m.recall == 0.0 and m.accuracy == 0.5


def test_rubric_set_fit_windows_returns_a_new_set():
    rubric_set = RubricSet((FIX, GENERIC), metadata={"judge": "gpt"})
    fitted = rubric_set.fit_windows(np.array([0.0, 1.0, 9.0, 10.0]), np.array([0, 0, 1, 1]), precision=0.9)
    assert rubric_set.windows == UNFITTED
    assert (fitted.threshold, fitted.windows.dsat_upper, fitted.windows.sat_lower) == (5.0, 1.0, 9.0)
    assert fitted.rubrics == rubric_set.rubrics and fitted.metadata == {"judge": "gpt"}
    assert fitted.version != rubric_set.version


# ---------------------------------------------------------------------------- version and file


def test_version_ignores_metadata_and_rubric_order_but_not_content():
    base = RubricSet((FIX, GENERIC, TURNS), WINDOWS, metadata={"a": 1, "b": 2})
    assert RubricSet((TURNS, FIX, GENERIC), WINDOWS, metadata={"b": 2, "a": 1}).version == base.version
    assert RubricSet((FIX, GENERIC, TURNS), WINDOWS, metadata={"created_at": "now"}).version == base.version
    assert re.fullmatch(r"[0-9a-f]{16}", base.version)
    ordinal_turns = Rubric("turns", TURNS.text, Polarity.SAT, Scale(TURNS.scale.keys, TURNS.scale.labels, (0, 5, 10)))
    changed = [
        RubricSet((FIX, GENERIC, TURNS), dataclasses.replace(WINDOWS, threshold=5.5)),
        RubricSet((FIX, GENERIC, TURNS), dataclasses.replace(WINDOWS, precision=0.8)),
        RubricSet((FIX, GENERIC, TURNS), dataclasses.replace(WINDOWS, sat_lower=9.0)),
        RubricSet((FIX, Rubric("generic", GENERIC.text, Polarity.SAT), TURNS), WINDOWS),
        RubricSet((FIX, Rubric("generic", GENERIC.text + " Twice.", Polarity.DSAT), TURNS), WINDOWS),
        RubricSet((FIX, GENERIC, ordinal_turns), WINDOWS),
    ]
    assert len({base.version, *(c.version for c in changed)}) == len(changed) + 1


def test_save_load_round_trip(tmp_path):
    rubric_set = RubricSet(
        (FIX, GENERIC, TURNS),
        ConfidenceWindows(threshold=4.25, dsat_upper=None, sat_lower=8.5, precision=0.9),
        metadata={"judge": "gpt-3.5", "prompt_version": "3", "training_data_sha256": "ab" * 32},
    )
    path = tmp_path / "set.json"
    rubric_set.save(path)
    loaded = RubricSet.load(path)
    assert loaded == rubric_set
    assert loaded.version == rubric_set.version == json.loads(path.read_text())["version"]
    assert "scale" not in json.loads(path.read_text())["rubrics"][0]  # Likert default is not written out
    assert not list(tmp_path.glob("*.tmp"))


def test_unserialisable_metadata_is_refused_on_save(tmp_path):
    with pytest.raises(RubricSetError, match="metadata: must be JSON-serialisable"):
        RubricSet((FIX,), metadata={"when": object()}).save(tmp_path / "x.json")


def test_a_file_without_version_is_hashed_on_load(tmp_path):
    doc = RubricSet((FIX, GENERIC), WINDOWS).to_dict()
    del doc["version"]
    path = tmp_path / "hand.json"
    path.write_text(json.dumps(doc))
    assert RubricSet.load(path).version == RubricSet((FIX, GENERIC), WINDOWS).version


def _good_doc() -> dict:
    return RubricSet((FIX, GENERIC, TURNS), WINDOWS, metadata={"judge": "x"}).to_dict()


def _set(path: tuple, value):
    def edit(doc: dict) -> None:
        target = doc
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return edit


def _drop(*path):
    def edit(doc: dict) -> None:
        target = doc
        for key in path[:-1]:
            target = target[key]
        del target[path[-1]]

    return edit


BAD_DOCS = {
    "bad polarity": (_set(("rubrics", 1, "polarity"), "good"), "rubrics[1].polarity", "'good' is not one of ['sat', 'dsat']"),
    "missing threshold": (_drop("threshold"), "(top level)", "'threshold' is a required property"),
    "score above 10": (_set(("rubrics", 2, "scale", 2, "score"), 11), "rubrics[2].scale[2].score", "maximum of 10"),
    "negative score": (_set(("rubrics", 2, "scale", 0, "score"), -1), "rubrics[2].scale[0].score", "minimum of 0"),
    "score not a number": (
        _set(("rubrics", 2, "scale", 0, "score"), "high"),
        "rubrics[2].scale[0].score",
        "not of type 'number'",
    ),
    "duplicate option key": (_set(("rubrics", 2, "scale", 1, "key"), "1"), "rubrics[2].scale[1].key", "duplicate option key '1'"),
    "one-option scale": (_set(("rubrics", 2, "scale"), [{"key": "1", "score": 0}]), "rubrics[2].scale", "too short"),
    "duplicate rubric id": (_set(("rubrics", 1, "id"), "fix"), "rubrics[1].id", "duplicate id 'fix' (also rubrics[0])"),
    "bad rubric id": (_set(("rubrics", 0, "id"), "has space"), "rubrics[0].id", "does not match"),
    "blank text": (_set(("rubrics", 0, "text"), "   "), "rubrics[0].text", "non-empty"),
    "misspelt field": (_set(("rubrics", 0, "polartiy"), "sat"), "rubrics[0]", "'polartiy' was unexpected"),
    "no rubrics": (_set(("rubrics",), []), "rubrics", "should be non-empty"),
    "windows overlap": (_set(("windows", "dsat_upper"), 9.0), "windows.dsat_upper", "must be < threshold 5.0"),
    "sat window below threshold": (_set(("windows", "sat_lower"), 4.0), "windows.sat_lower", "must be >= threshold 5.0"),
    "precision above 1": (_set(("precision",), 1.5), "precision", "maximum of 1"),
    "windows missing a side": (_drop("windows", "sat_lower"), "windows", "'sat_lower' is a required property"),
    "hand-edited text": (_set(("rubrics", 0, "text"), "Edited."), "version", "does not match the content"),
    "hand-edited threshold": (_set(("threshold",), 5.5), "version", "does not match the content"),
    "newer schema": (_set(("schema_version",), 2), "schema_version", "reads version 1, the file has 2"),
    "metadata not an object": (_set(("metadata",), ["x"]), "metadata", "not of type 'object'"),
}


@pytest.mark.parametrize("case", BAD_DOCS, ids=list(BAD_DOCS))
def test_bad_files_are_refused_naming_the_field(tmp_path, case):
    edit, field, reason = BAD_DOCS[case]
    doc = _good_doc()
    edit(doc)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(RubricSetError) as info:
        RubricSet.load(path)
    assert info.value.field == field
    assert reason in info.value.reason
    assert str(info.value).startswith(f"{path}: {field}: ")


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("{not json", "Expecting property name"),
        ('{"threshold": 1, "threshold": 2}', "duplicate JSON key(s) ['threshold']"),
        ('{"threshold": NaN}', "NaN is not valid JSON"),
    ],
)
def test_unreadable_files_are_refused(tmp_path, text, reason):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(RubricSetError, match=re.escape(reason)):
        RubricSet.load(path)


def test_missing_file_is_refused(tmp_path):
    with pytest.raises(RubricSetError, match="cannot read rubric set"):
        RubricSet.load(tmp_path / "absent.json")


def test_schema_is_valid_draft_2020_12_and_agrees_with_the_code():
    doc = schema()
    jsonschema.Draft202012Validator.check_schema(doc)
    assert doc["properties"]["schema_version"] == {"const": 1}
    assert doc["$defs"]["rubric"]["properties"]["id"]["pattern"] == RUBRIC_ID_PATTERN
    assert doc["$defs"]["rubric"]["properties"]["polarity"]["enum"] == [p.value for p in Polarity]


def test_documented_example_loads(tmp_path):
    text = (ROOT / "docs" / "rubric-set-format.md").read_text(encoding="utf-8")
    example = re.search(r"```json\n(.*?)```", text, re.S).group(1)
    path = tmp_path / "example.json"
    path.write_text(example)
    loaded = RubricSet.load(path)
    assert [r.polarity for r in loaded.rubrics] == [Polarity.SAT, Polarity.DSAT, Polarity.SAT]
    assert loaded.rubrics[2].scale.scores == (0.0, 0.0, 10.0)


# ---------------------------------------------------------------------------- real judge, real data


@pytest.fixture(scope="module")
def llm_rubric_set() -> RubricSet:
    """LLM-Rubric's Q1–Q8 as SAT rubrics: Q1–Q7 on 4-option ordinal scales, Q8 with 3 = the only good option."""
    return dimension_rubric_set(DATA / "questions.json")


@pytest.fixture(scope="module")
def real_conversations() -> list[Conversation]:
    return list(load_real_conversations(DATA / "real_data.json").values())


def test_netsats_scores_each_conversation_with_the_judge(llm_rubric_set, real_conversations):
    judge = RecordedJudge.from_tsv(REAL_TSV)
    first = real_conversations[:5]
    expected = [llm_rubric_set.netsat(judge.judge(c, llm_rubric_set.questions())) for c in first]
    assert llm_rubric_set.netsats(judge, iter(first)).tolist() == pytest.approx(expected)


def test_scoring_a_recorded_judgement_matches_the_file(llm_rubric_set, real_conversations):
    conversation = real_conversations[0]
    rubric_set = llm_rubric_set
    judgement = RecordedJudge.from_tsv(REAL_TSV).judge(conversation, rubric_set.questions())
    scored = rubric_set.score(judgement)

    expected = {}
    with REAL_TSV.open(encoding="utf-8", newline="") as handle:
        for row in csv.DictReader(handle, delimiter="\t"):
            if row["text_id"] == conversation.id and row["criterion"] != "Q0":
                p = [float(row[f"answer{k}_prob"]) for k in range(1, 5)]
                values = [0, 0, 10, 0] if row["criterion"] == "Q8" else [0, 10 / 3, 20 / 3, 10]
                expected[row["criterion"]] = sum(pi * v for pi, v in zip(p, values)) / sum(p)
    assert scored.rubric_scores == pytest.approx(expected)
    assert scored.netsat == pytest.approx(sum(expected.values()))
    assert 0.0 <= scored.netsat <= 80.0


def _human_satisfied() -> dict[str, bool]:
    """Real conversations' human overall-satisfaction answer (Q0 1–4; 0 = missing) as satisfied = Q0 >= 3."""
    with (DATA / "human_judges_real_convs_FIXED_ANON.tsv").open(encoding="utf-8", newline="") as handle:
        return {r["text_id"]: int(r["Q0"]) >= 3 for r in csv.DictReader(handle, delimiter="\t") if r["Q0"] != "0"}


def test_fitting_on_real_judgements_survives_a_file_round_trip(llm_rubric_set, real_conversations, tmp_path):
    judge = RecordedJudge.from_tsv(REAL_TSV)
    satisfied = _human_satisfied()
    judged = [c for c in real_conversations if c.id in satisfied]
    judgements = [judge.judge(c, llm_rubric_set.questions()) for c in judged]
    netsats = np.array([llm_rubric_set.netsat(j) for j in judgements])
    labels = np.array([satisfied[c.id] for c in judged])

    fitted = llm_rubric_set.fit_windows(netsats, labels, precision=0.9)
    predicted = fitted.windows.labels(netsats)
    if fitted.windows.sat_lower is not None:
        assert labels[predicted == "sat"].mean() >= 0.9
    if fitted.windows.dsat_upper is not None:
        assert (~labels[predicted == "dsat"]).mean() >= 0.9

    path = tmp_path / "llm-rubric-q1-q8.json"
    fitted.save(path)
    loaded = RubricSet.load(path)
    assert loaded.version == fitted.version
    assert [loaded.score(j) for j in judgements] == [fitted.score(j) for j in judgements]
    assert dataclasses.asdict(evaluate(netsats, labels, loaded)) == pytest.approx(
        dataclasses.asdict(evaluate(netsats, labels, fitted)), nan_ok=True
    )
