"""The cumulative-link calibrator: it recovers a known model, shrinks judges, adapts to a shifted domain."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
from scipy.optimize import check_grad
from scipy.special import expit

from scorers.calibration_selection import cross_validate, select_adaptation_strength, select_hyperparameters
from scorers.calibrators import METADATA_FILE, CalibrationError, CalibrationFileError, load_calibrator
from scorers.datasets.llm_rubric import Label, RubricData
from scorers.judges.base import Answer, Judgement, Provenance
from scorers.ordinal_calibration import OrdinalCalibrator, _LinkProblem

QUESTIONS = ("Q0", "Q1", "Q8")
N_OPTIONS = {"Q0": 4, "Q1": 4, "Q8": 3}
TRUE_WEIGHTS = np.array([1.5, -0.8])  # on the standardised expected answers of Q0 and Q1
TRUE_CUTS = np.array([-1.5, 0.0, 1.5])
TRUE_OFFSETS = {"lo": -1.0, "mid": 0.0, "hi": 1.0}
PROVENANCE = Provenance(judge="test", model="test")


def _block(expected: float) -> np.ndarray:
    """Four option probabilities with the given expected answer (mass on the two nearest options)."""
    low = int(np.floor(expected))
    block = np.zeros(4)
    block[low - 1], block[low] = low + 1 - expected, expected - low
    return block


def _simulated(n: int, seed: int, prefix: str = "c", kinder: bool = False) -> RubricData:
    """Judge-LLM answers drawn at random; human answers drawn from a known cumulative-link model.

    With ``kinder`` the same conversations and labels, but the judge LLM reads them as another domain:
    its expected answers are squeezed and moved up (e → 0.5·e + 1.5). Human answers depend on where an
    answer falls within its own domain, so only standardising on the new domain recovers them.
    """
    rng = np.random.default_rng(seed)
    features, labels = {}, []
    for i in range(n):
        tid = f"{prefix}{i}"
        expected = rng.uniform(1.5, 3.5, size=2)
        z = (expected - 2.5) / (2 / np.sqrt(12))  # standardised within the home domain
        shown = 0.5 * expected + 1.5 if kinder else expected
        features[tid] = np.concatenate([_block(shown[0]), _block(shown[1]), rng.dirichlet(np.ones(3))])
        for judge, offset in TRUE_OFFSETS.items():
            at_most = expit(TRUE_CUTS - (TRUE_WEIGHTS @ z + offset))
            labels.append(Label(tid, "Q0", judge, int(np.searchsorted(at_most, rng.random())) + 1))
            labels.append(Label(tid, "Q1", judge, int(rng.integers(1, 5))))
    return RubricData(QUESTIONS, N_OPTIONS, features, tuple(labels))


@pytest.fixture(scope="module")
def train() -> RubricData:
    return _simulated(600, 0)


@pytest.fixture(scope="module")
def model(train: RubricData) -> OrdinalCalibrator:
    return OrdinalCalibrator(input_questions=("Q0", "Q1"), weight_decay=0.01, judge_shrinkage=0.01).fit(train)


def test_the_analytic_gradient_is_the_gradient() -> None:
    rng = np.random.default_rng(0)
    y = rng.integers(1, 5, 300)
    precision = np.concatenate([np.full(3, 0.5), np.full(4, 2.0), np.full(3, 0.1)])
    problem = _LinkProblem(rng.normal(size=(300, 3)), y, rng.integers(0, 4, 300), 4, 4, precision, rng.normal(size=10))
    for _ in range(3):
        point = rng.normal(size=3 + 4 + 3)
        assert check_grad(lambda p: problem.loss(p)[0], lambda p: problem.loss(p)[1], point) < 1e-6


def test_the_analytic_gradient_is_the_gradient_with_label_weights() -> None:
    rng = np.random.default_rng(1)
    y = rng.integers(1, 5, 200)
    precision = np.concatenate([np.full(3, 0.5), np.full(4, 2.0), np.zeros(3)])
    weights = rng.exponential(size=200)
    problem = _LinkProblem(rng.normal(size=(200, 3)), y, rng.integers(0, 4, 200), 4, 4, precision, weights=weights)
    for _ in range(3):
        point = rng.normal(size=3 + 4 + 3)
        assert check_grad(lambda p: problem.loss(p)[0], lambda p: problem.loss(p)[1], point) < 1e-6


def test_a_conversation_weighted_twice_counts_as_two_copies_of_it(train: RubricData) -> None:
    ids = list(train.text_ids)[:200]
    data = train.subset(ids)
    doubled = set(ids[:50])
    copies = RubricData(
        data.question_ids,
        data.n_options,
        {**data.features, **{t + "_copy": data.features[t] for t in doubled}},
        data.labels
        + tuple(
            Label(lab.text_id + "_copy", lab.question, lab.judge, lab.answer) for lab in data.labels if lab.text_id in doubled
        ),
    )
    # Without penalties the fitted predictions do not depend on the feature scale (the copies shift it).
    base = OrdinalCalibrator(input_questions=("Q0", "Q1"), weight_decay=0.0, judge_shrinkage=0.0)
    weighted = base.clone().fit(data, {t: 2.0 if t in doubled else 1.0 for t in ids})
    x = np.stack([data.features[t] for t in ids])
    expected = base.clone().fit(copies).predict_proba(x, judge="mid").probabilities
    np.testing.assert_allclose(weighted.predict_proba(x, judge="mid").probabilities, expected, atol=1e-4)
    unweighted = base.clone().fit(data).predict_proba(x, judge="mid").probabilities
    assert np.abs(unweighted - expected).max() > 1e-3


def test_conversation_weights_must_cover_every_labelled_conversation_and_be_valid(train: RubricData) -> None:
    base = OrdinalCalibrator(input_questions=("Q0",))
    ids = list(train.text_ids)
    with pytest.raises(CalibrationError, match="no weight for 1 labelled"):
        base.clone().fit(train, {t: 1.0 for t in ids[1:]})
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(CalibrationError, match="finite, >= 0"):
            base.clone().fit(train, {t: (bad if t == ids[0] else 1.0) for t in ids})
    with pytest.raises(CalibrationError, match="not all 0"):
        base.clone().fit(train, dict.fromkeys(ids, 0.0))


def test_raw_features_are_each_inputs_expected_answer_or_a_nominal_ones_shares(train: RubricData) -> None:
    """Layout Q0 (4 options), Q1 (4), Q8 (3, nominal by default); inputs in the order Q8, Q0 (Q1 not read)."""
    model = OrdinalCalibrator(input_questions=("Q8", "Q0"), weight_decay=0.01).fit(train)
    rows = np.array(
        [
            [0.0, 2.0, 2.0, 0.0, 9.0, 9.0, 9.0, 9.0, 1.0, 1.0, 2.0],  # unnormalised mass is renormalised per block
            [0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0],  # no mass on Q0 or Q8: not asked
            [1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 3.0, 1.0],
        ]
    )
    expected = np.array([[0.25, 0.25, 2.5], [np.nan, np.nan, np.nan], [0.0, 0.75, 1.0]])  # Q8's first two shares, Q0's E
    np.testing.assert_allclose(model.raw_features(rows), expected, rtol=0, atol=1e-12)
    with pytest.raises(CalibrationError, match="expected at least 11"):
        model.raw_features(rows[:, :10])


def test_recovers_the_weights_and_the_judges_offsets_of_a_known_model(model: OrdinalCalibrator) -> None:
    link = model._models["Q0"]
    scale = model._sd[:2] / (2 / np.sqrt(12))  # the model standardises with the sample SD
    assert link.weights * scale == pytest.approx(TRUE_WEIGHTS, abs=0.25)
    assert link.cuts == pytest.approx(TRUE_CUTS, abs=0.3)
    offsets = model.judge_offsets()
    assert offsets["hi"] - offsets["lo"] == pytest.approx(2.0, abs=0.35)
    assert offsets["lo"] < offsets["mid"] < offsets["hi"]
    assert np.all(np.diff(link.cuts) > 0)


def test_predictions_are_distributions_that_follow_the_judge(model: OrdinalCalibrator) -> None:
    test = _simulated(200, 1, prefix="t")
    x = np.stack([test.features[t] for t in test.text_ids])
    lo, hi = model.predict_proba(x, "Q0", "lo"), model.predict_proba(x, "Q0", "hi")
    assert lo.probabilities.sum(axis=1) == pytest.approx(np.ones(len(x)))
    assert np.all(lo.probabilities >= 0)
    assert np.all(hi.expected_value > lo.expected_value)
    unseen = model.predict_proba(x, "Q0", "nobody").expected_value
    assert np.all((lo.expected_value < unseen) & (unseen < hi.expected_value))


def test_shrinkage_pulls_the_judges_offsets_towards_the_average_judge(train: RubricData) -> None:
    loose = OrdinalCalibrator(input_questions=("Q0", "Q1"), judge_shrinkage=0.01).fit(train).judge_offsets()
    tight = OrdinalCalibrator(input_questions=("Q0", "Q1"), judge_shrinkage=1000.0).fit(train).judge_offsets()
    assert abs(tight["hi"] - tight["lo"]) < 0.2 * abs(loose["hi"] - loose["lo"])


def test_adapting_to_a_shifted_domain_restores_the_predictions(model: OrdinalCalibrator) -> None:
    """The same conversations judged by a kinder LLM: standardising on the new domain undoes the shift."""
    home, shifted = _simulated(400, 2, prefix="h"), _simulated(400, 2, prefix="h", kinder=True)
    assert home.labels == shifted.labels
    labels = home.labels_for("Q0")
    y = np.array([lab.answer for lab in labels])
    judges = [lab.judge for lab in labels]

    def error(m: OrdinalCalibrator, data: RubricData) -> float:
        x = np.stack([data.features[lab.text_id] for lab in labels])
        return float(np.mean((m.predict_proba(x, "Q0", judges).expected_value - y) ** 2))

    unadapted = error(model, shifted)
    adapted = model.clone().fit(_simulated(600, 0)).adapt_features(np.stack(list(shifted.features.values())))
    assert error(adapted, shifted) < unadapted - 0.1
    assert error(adapted, shifted) == pytest.approx(error(model, home), abs=0.03)


def test_selection_and_cross_validation_take_the_calibrator() -> None:
    train = _simulated(60, 3)
    base = OrdinalCalibrator(input_questions=("Q0", "Q1"))
    search = select_hyperparameters(train, {"weight_decay": [0.01, 1000.0]}, base=base, k=3)
    assert search.best_params["weight_decay"] == 0.01  # a huge penalty erases the signal
    held = cross_validate(base, train, k=3)
    assert len(held.answers) == len(train.labels_for("Q0"))
    assert held.scores()["pearson"] > 0.4


def test_bad_inputs_are_clear_errors(train: RubricData, model: OrdinalCalibrator) -> None:
    with pytest.raises(CalibrationError, match="not fitted"):
        OrdinalCalibrator().predict_proba(np.zeros((1, 11)))
    with pytest.raises(CalibrationError, match="not ordinal"):
        OrdinalCalibrator(questions=("Q8",)).fit(train)
    with pytest.raises(CalibrationError, match="unknown questions"):
        OrdinalCalibrator(input_questions=("Q9",)).fit(train)
    with pytest.raises(CalibrationError, match=">= 0"):
        OrdinalCalibrator(weight_decay=-1.0)
    with pytest.raises(CalibrationError, match="expected at least 8"):
        model.predict_proba(np.zeros((2, 5)))
    with pytest.raises(CalibrationError, match="no model for 'Q1'"):
        model.predict_proba(np.zeros((2, 11)), "Q1")
    with pytest.raises(CalibrationError, match="2 judges for 1 feature rows"):
        model.predict_proba(np.zeros((1, 11)), "Q0", ["lo", "hi"])
    with pytest.raises(CalibrationError, match="at least 2 unlabelled"):
        model.clone().fit(train).adapt_features(np.zeros((1, 11)))


def test_save_load_round_trip_gives_identical_predictions_and_any_kind_loads(tmp_path, model: OrdinalCalibrator) -> None:
    saved = model.save(tmp_path / "c")
    loaded = load_calibrator(saved)
    assert isinstance(loaded, OrdinalCalibrator) and loaded.version_ == model.version_
    x = np.random.default_rng(5).dirichlet(np.ones(11), size=20)
    for judge in ("lo", None, "nobody"):
        assert np.array_equal(
            loaded.predict_proba(x, "Q0", judge).probabilities, model.predict_proba(x, "Q0", judge).probabilities
        )
    adapted = OrdinalCalibrator.load(saved).adapt_features(x)
    assert adapted.version_ != model.version_  # the scale is part of what the version names


def test_corrupted_or_mismatched_files_are_rejected(tmp_path, model: OrdinalCalibrator) -> None:
    good = json.loads((model.save(tmp_path / "good") / METADATA_FILE).read_text())
    for name, edit, message in (
        ("weights", lambda m: m["models"]["Q0"]["weights"].append(1.0), "do not match"),
        ("weight", lambda m: m["models"]["Q0"]["weights"].__setitem__(0, 9.0), "version"),
        ("cuts", lambda m: m["models"]["Q0"].update(cuts=[1.0, 0.0, 2.0]), "increasing"),
        ("layout", lambda m: m.update(layout=[["Q0", 4]]), "inconsistent|do not match"),
        ("format", lambda m: m.update(format="something-else"), "not a"),
        ("fields", lambda m: m.pop("scale"), "inconsistent"),
        ("params", lambda m: m["hyperparameters"].update(weight_decay=-1), "inconsistent"),
    ):
        meta = copy.deepcopy(good)
        edit(meta)
        (tmp_path / name).mkdir()
        (tmp_path / name / METADATA_FILE).write_text(json.dumps(meta))
        with pytest.raises(CalibrationFileError, match=message):
            OrdinalCalibrator.load(tmp_path / name)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / METADATA_FILE).write_text(json.dumps({"format": "pickle"}))
    with pytest.raises(CalibrationFileError, match="neither"):
        load_calibrator(tmp_path / "other")
    with pytest.raises(CalibrationFileError, match="cannot read"):
        load_calibrator(tmp_path / "absent")


def test_predictions_from_a_judgement_read_only_its_inputs_and_mix_trusted_judges(train: RubricData) -> None:
    model = OrdinalCalibrator(input_questions=("Q1",), questions=("Q0", "Q1")).fit(train)
    assert model.question_ids_ == ("Q1",)  # the worker asks the judge only this
    tid = train.text_ids[0]
    x = np.asarray(train.features[tid])
    judgement = Judgement(tid, {"Q1": Answer("Q1", tuple(x[4:8]))}, PROVENANCE)
    assert np.array_equal(model.features_from_judgement(judgement), np.concatenate([np.zeros(4), x[4:8], np.zeros(3)]))
    plain = model.predict_judgement(judgement)
    assert sorted(plain) == ["Q0", "Q1"]
    assert np.allclose(plain["Q0"].probabilities, model.predict_proba(x, "Q0").probabilities)
    trusted = model.predict_judgement(judgement, judges=["lo", "hi"], questions=["Q0"])
    mixture = np.mean([model.predict_proba(x, "Q0", j).probabilities for j in ("lo", "hi")], axis=0)
    assert list(trusted) == ["Q0"] and np.allclose(trusted["Q0"].probabilities, mixture)
    with pytest.raises(CalibrationError, match="not in the training data"):
        model.predict_judgement(judgement, judges=["stranger"])
    with pytest.raises(CalibrationError, match="lacks answers"):
        model.predict_judgement(Judgement(tid, {}, PROVENANCE))


def test_judgements_predicted_together_give_each_ones_own_prediction(train: RubricData) -> None:
    """What the worker calls for a poll of conversations: row i is exactly `predict_judgement` of judgement i."""
    model = OrdinalCalibrator(input_questions=("Q1", "Q8"), questions=("Q0", "Q1")).fit(train)
    judgements = [
        Judgement(tid, {"Q1": Answer("Q1", tuple(x[4:8])), "Q8": Answer("Q8", tuple(x[8:11]))}, PROVENANCE)
        for tid, x in ((t, np.asarray(train.features[t])) for t in train.text_ids[:25])
    ]
    for judges in (None, ["lo", "hi"]):
        together = model.predict_judgements(judgements, judges=judges)
        assert sorted(together) == ["Q0", "Q1"]
        for i, judgement in enumerate(judgements):
            alone = model.predict_judgement(judgement, judges=judges)
            for q in together:
                assert np.allclose(together[q].probabilities[i], alone[q].probabilities[0], rtol=0, atol=1e-12)
    assert len({tuple(row) for row in together["Q0"].probabilities.round(9)}) > 1  # the rows are not one row repeated
    with pytest.raises(CalibrationError, match="no judgements"):
        model.predict_judgements([])


def _relabelled(data: RubricData, shift: int) -> RubricData:
    """The same conversations and features; every judge now answers ``shift`` options higher (clipped)."""
    labels = tuple(Label(lab.text_id, lab.question, lab.judge, int(np.clip(lab.answer + shift, 1, 4))) for lab in data.labels)
    return RubricData(data.question_ids, data.n_options, data.features, labels)


def test_adaptation_follows_many_labels_and_stays_near_the_model_with_few(model: OrdinalCalibrator) -> None:
    target = _relabelled(_simulated(400, 7, prefix="a"), 1)
    test = _relabelled(_simulated(200, 8, prefix="b"), 1)
    x = np.stack([test.features[lab.text_id] for lab in test.labels_for("Q0")])
    y = np.array([lab.answer for lab in test.labels_for("Q0")])
    judges = [lab.judge for lab in test.labels_for("Q0")]

    def error(m: OrdinalCalibrator) -> float:
        return float(np.mean((m.predict_proba(x, "Q0", judges).expected_value - y) ** 2))

    many = model.adapt(target, strength=1.0)
    assert error(many) < error(model) - 0.2  # the shift is learned
    few = target.subset(target.text_ids[:10])
    weak, strong = model.adapt(few, strength=1.0), model.adapt(few, strength=1e4)
    base_cuts = model._models["Q0"].cuts
    assert np.abs(strong._models["Q0"].cuts - base_cuts).max() < 0.05  # a strong prior barely moves
    assert np.abs(weak._models["Q0"].cuts - base_cuts).max() > np.abs(strong._models["Q0"].cuts - base_cuts).max()
    assert many.adaptation_[-1]["conversations"] == 400 and many.version_ != model.version_
    assert model.adaptation_ == []  # adapting returns a copy


def test_adaptation_refuses_too_few_labels_and_other_questions(model: OrdinalCalibrator, train: RubricData) -> None:
    with pytest.raises(CalibrationError, match="at least 10 conversations"):
        model.adapt(train.subset(train.text_ids[:9]), strength=1.0)
    with pytest.raises(CalibrationError, match="> 0"):
        model.adapt(train, strength=0.0)
    with pytest.raises(CalibrationError, match="not the calibrator's"):
        model.adapt(train.restrict_questions(["Q0", "Q1"]), strength=1.0)
    with pytest.raises(CalibrationError, match="give the strength instead"):
        select_adaptation_strength(model, train.subset(train.text_ids[:12]))


def test_the_adaptation_strength_is_chosen_on_the_teams_labels_alone(model: OrdinalCalibrator) -> None:
    shifted = _relabelled(_simulated(150, 9, prefix="s"), 1)
    best, scores = select_adaptation_strength(model, shifted, strengths=(1.0, 1e5))
    assert best == 1.0 and scores[1.0] < scores[1e5]  # a shift the labels show plainly: follow them


def test_an_adapted_calibrator_saves_and_loads_with_its_history(tmp_path, model: OrdinalCalibrator) -> None:
    adapted = model.adapt(_relabelled(_simulated(60, 11, prefix="h"), 1), strength=10.0)
    loaded = OrdinalCalibrator.load(adapted.save(tmp_path / "a"))
    assert loaded.version_ == adapted.version_ and loaded.adaptation_ == adapted.adaptation_
