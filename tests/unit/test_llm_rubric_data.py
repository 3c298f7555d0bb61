"""The LLM-Rubric loader on the real release files, and its errors on malformed copies."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

from scorers.datasets.llm_rubric import (
    QUESTION_IDS,
    Label,
    RubricData,
    RubricDataError,
    build_data,
    load_features,
    load_labels,
    load_n_options,
    load_split,
    synthetic_dialogue_system,
)
from tests.data_paths import LLM_RUBRIC as DATA

REAL_EVALS = DATA / "gpt-3.5-turbo-16k_real_evaluations_FIXED.tsv"
REAL_HUMANS = DATA / "human_judges_real_convs_FIXED_ANON.tsv"
SYNTH_HUMANS = DATA / "human_judges_synth_all_FIXED_ANON.tsv"

pytestmark = pytest.mark.skipif(not DATA.is_dir(), reason=f"LLM-Rubric release not found at {DATA}")


@pytest.fixture(scope="module")
def n_options() -> dict[str, int]:
    return load_n_options(DATA / "questions.json")


def _rows(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    with path.open(encoding="utf-8", newline="") as f:
        reader = csv.DictReader(f, delimiter="\t")
        return list(reader.fieldnames or []), list(reader)


def _write(path: Path, header: list[str], rows: list[dict[str, str]]) -> Path:
    with path.open("w", encoding="utf-8", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=header, delimiter="\t")
        writer.writeheader()
        writer.writerows(rows)
    return path


def test_option_counts_come_from_questions_json(n_options):
    assert n_options == {**{q: 4 for q in QUESTION_IDS if q != "Q8"}, "Q8": 3}


def test_real_split_shape_and_features_are_the_recorded_probabilities(n_options):
    real = load_split(DATA, "real")
    assert len(real.features) == 223
    assert len(real.labels_for("Q0")) == 223
    assert real.input_size == 4 * 8 + 3
    assert len(real.judges) == 13
    # The first Q0 row of the file, not renormalised, sits at the start of x.
    _, rows = _rows(REAL_EVALS)
    first = next(r for r in rows if r["criterion"] == "Q0")
    x = real.features[first["text_id"]]
    assert np.allclose(x[:4], [float(first[f"answer{i}_prob"]) for i in range(1, 5)])
    q8 = next(r for r in rows if r["criterion"] == "Q8" and r["text_id"] == first["text_id"])
    assert np.allclose(x[-3:], [float(q8[f"answer{i}_prob"]) for i in range(1, 4)])


def test_zero_answers_and_empty_cells_are_not_labels(n_options):
    header, rows = _rows(SYNTH_HUMANS)
    labels = load_labels(SYNTH_HUMANS, n_options)
    expected = sum(1 for r in rows for q in QUESTION_IDS if r[q].strip() and float(r[q]) != 0)
    assert len(labels) == expected
    assert all(1 <= lab.answer <= n_options[lab.question] for lab in labels)
    zero_q0 = [r for r in rows if r["Q0"] == "0"]
    assert zero_q0, "the release has Q0 = 0 rows; the test relies on them"
    for r in zero_q0:
        assert Label(r["text_id"], "Q0", r["annotator_id"], 0) not in labels
        assert not any(x.text_id == r["text_id"] and x.question == "Q0" and x.judge == r["annotator_id"] for x in labels)


def test_synthetic_labels_without_llm_evaluations_are_dropped_and_counted():
    synth = load_split(DATA, "synth")
    assert synth.dropped_labels > 0
    assert set(synth.text_ids) <= set(synth.features)
    assert len(synth.judges) == 24


def test_every_synthetic_conversation_names_one_of_five_dialogue_systems():
    systems = [synthetic_dialogue_system(t) for t in load_split(DATA, "synth").text_ids]
    assert sorted(set(systems)) == ["V1", "V2", "V3", "V4", "V5"]
    assert min(systems.count(v) for v in set(systems)) >= 30
    for real_id in ("65c5b4b9f174b2897703736a", "V3", "V3_", "X1_2"):
        with pytest.raises(RubricDataError, match="not a synthetic conversation id"):
            synthetic_dialogue_system(real_id)


def test_missing_optional_question_is_a_zero_vector_and_missing_required_is_an_error(tmp_path, n_options):
    header, rows = _rows(REAL_EVALS)
    tid = rows[0]["text_id"]
    without_q3 = [r for r in rows if not (r["text_id"] == tid and r["criterion"] == "Q3")]
    feats = load_features(_write(tmp_path / "no_q3.tsv", header, without_q3), n_options)
    off = 4 * 3
    assert np.all(feats[tid][off : off + 4] == 0)
    assert feats[tid][:4].sum() > 0

    without_q0 = [r for r in rows if not (r["text_id"] == tid and r["criterion"] == "Q0")]
    with pytest.raises(RubricDataError, match="required question Q0"):
        load_features(_write(tmp_path / "no_q0.tsv", header, without_q0), n_options)


def test_mass_beyond_a_questions_options_is_an_error(tmp_path, n_options):
    header, rows = _rows(REAL_EVALS)
    for r in rows:
        if r["criterion"] == "Q8":
            r["answer4_prob"] = "0.1"
            break
    with pytest.raises(RubricDataError, match="beyond the question's 3 options"):
        load_features(_write(tmp_path / "q8.tsv", header, rows), n_options)


def test_non_numeric_probability_is_an_error_naming_the_line(tmp_path, n_options):
    header, rows = _rows(REAL_EVALS)
    rows[4]["answer2_prob"] = "high"
    with pytest.raises(RubricDataError, match=r":6: answer probabilities must be numbers"):
        load_features(_write(tmp_path / "bad.tsv", header, rows), n_options)


@pytest.mark.parametrize(
    ("value", "message"),
    [("5", r"Q0='5' is outside 1..4"), ("2.5", "not a whole answer number"), ("good", "not a number"), ("-1", "outside")],
)
def test_bad_human_answer_is_an_error_naming_line_and_column(tmp_path, n_options, value, message):
    header, rows = _rows(REAL_HUMANS)
    rows[2]["Q0"] = value
    with pytest.raises(RubricDataError, match=message) as err:
        load_labels(_write(tmp_path / "humans.tsv", header, rows), n_options)
    assert ":4:" in str(err.value)


def test_q8_answer_4_is_out_of_range(tmp_path, n_options):
    header, rows = _rows(REAL_HUMANS)
    rows[0]["Q8"] = "4"
    with pytest.raises(RubricDataError, match=r"Q8='4' is outside 1..3"):
        load_labels(_write(tmp_path / "humans.tsv", header, rows), n_options)


def test_missing_columns_and_missing_files_are_errors(tmp_path, n_options):
    header, rows = _rows(REAL_HUMANS)
    header.remove("annotator_id")
    for r in rows:
        del r["annotator_id"]
    with pytest.raises(RubricDataError, match="lacks columns.*annotator_id"):
        load_labels(_write(tmp_path / "humans.tsv", header, rows), n_options)
    with pytest.raises(RubricDataError, match="cannot open"):
        load_labels(tmp_path / "absent.tsv", n_options)
    with pytest.raises(RubricDataError, match="cannot open"):
        load_features(tmp_path / "absent.tsv", n_options)
    with pytest.raises(RubricDataError, match="unknown split"):
        load_split(DATA, "test")


def test_rubric_data_rejects_inconsistent_labels_and_features(n_options):
    x = {"c1": np.zeros(35)}
    with pytest.raises(RubricDataError, match="outside 1..3"):
        RubricData(QUESTION_IDS, n_options, x, (Label("c1", "Q8", "a", 4),))
    with pytest.raises(RubricDataError, match="has no features"):
        RubricData(QUESTION_IDS, n_options, x, (Label("c2", "Q0", "a", 1),))
    with pytest.raises(RubricDataError, match="shape"):
        RubricData(QUESTION_IDS, n_options, {"c1": np.zeros(36)}, ())
    with pytest.raises(RubricDataError, match="outside 1..4"):
        RubricData(QUESTION_IDS, n_options, x, (Label("c1", "Q0", "a", 0),))


def test_subset_and_restrict_questions_keep_the_right_pieces():
    real = load_split(DATA, "real")
    some = real.text_ids[:10]
    sub = real.subset(some)
    assert set(sub.text_ids) == set(some)
    assert all(lab.text_id in some for lab in sub.labels)
    q0 = real.restrict_questions(["Q0", "Q8"])
    assert q0.input_size == 7
    assert {lab.question for lab in q0.labels} == {"Q0", "Q8"}
    tid = real.text_ids[0]
    assert np.array_equal(q0.features[tid], np.concatenate([real.features[tid][:4], real.features[tid][-3:]]))
    assert real.content_hash() != sub.content_hash()
    assert real.content_hash() == load_split(DATA, "real").content_hash()


def test_build_data_drops_labels_without_features(n_options):
    labels = [Label("c1", "Q0", "a", 2), Label("c2", "Q0", "a", 3)]
    data = build_data({"c1": np.zeros(35)}, labels, n_options)
    assert data.labels == (labels[0],)
    assert data.dropped_labels == 1
