"""The LLM-Rubric calibration network: learning, per-judge weights, fallback, persistence, CV.

Small synthetic problems (labels generated from x, so the right answer is
known) keep training fast; real LLM-Rubric data checks the pieces that touch
the release (recorded judge → features → prediction, CV splits).
"""

from __future__ import annotations

import copy
import csv
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from scorers.calibration import WEIGHTS_FILE, CalibrationNetwork, TrainingProgress, _nll
from scorers.calibration_selection import (
    conversation_folds,
    cross_validate,
    group_folds,
    parameter_grid,
    predict_labels,
    select_hyperparameters,
)
from scorers.calibrators import METADATA_FILE, CalibrationError, CalibrationFileError, Prediction
from scorers.conversation import Conversation, Turn
from scorers.datasets.llm_rubric import Label, RubricData, build_data, load_features, load_labels, load_n_options, load_split
from scorers.judges import RecordedJudge
from scorers.judges.base import Answer, Judgement, Provenance
from scorers.ordinal_calibration import OrdinalCalibrator
from scorers.questions import load_questions
from tests.data_paths import LLM_RUBRIC as DATA

QUESTIONS = ("Q0", "Q1")
N_OPTIONS = {"Q0": 4, "Q1": 4}
FAST = dict(h1=16, h2=16, batch_size=32, learning_rate=1e-2, pretrain_epochs=15, finetune_epochs=15)

needs_release = pytest.mark.skipif(not DATA.is_dir(), reason=f"LLM-Rubric release not found at {DATA}")


def _toy(n: int, seed: int, judges: dict[str, int], prefix: str = "c") -> RubricData:
    """Conversations with random answer distributions; the 'truth' is argmax of Q0's block.

    Each judge answers truth + its offset (clipped to 1..4) on Q0, and argmax of Q1's block on Q1.
    """
    rng = np.random.default_rng(seed)
    features, labels = {}, []
    for i in range(n):
        tid = f"{prefix}{i}"
        x = np.concatenate([rng.dirichlet(np.full(4, 0.3)), rng.dirichlet(np.full(4, 0.3))])
        features[tid] = x
        truth0, truth1 = int(x[:4].argmax()) + 1, int(x[4:].argmax()) + 1
        for judge, offset in judges.items():
            labels.append(Label(tid, "Q0", judge, int(np.clip(truth0 + offset, 1, 4))))
            labels.append(Label(tid, "Q1", judge, truth1))
    return RubricData(QUESTIONS, N_OPTIONS, features, tuple(labels))


@pytest.fixture(scope="module")
def biased() -> tuple[CalibrationNetwork, RubricData]:
    train = _toy(300, 0, {"lo": -1, "mid": 0, "hi": 1})
    return CalibrationNetwork(**FAST, seed=3).fit(train), _toy(200, 1, {"lo": -1, "mid": 0, "hi": 1}, prefix="t")


def test_prediction_summaries_of_a_known_distribution():
    p = Prediction("Q0", np.array([[0.0, 0.5, 0.5, 0.0], [1.0, 0.0, 0.0, 0.0]]), np.arange(1.0, 5.0))
    assert p.expected_value == pytest.approx([2.5, 1.0])
    assert p.variance == pytest.approx([0.25, 0.0])
    assert p.entropy == pytest.approx([np.log(2), 0.0])
    assert p.prob_at_most(2) == pytest.approx([0.5, 1.0])


def test_learns_labels_generated_from_the_features(biased):
    model, test = biased
    held = predict_labels(model, test, "Q0")
    mid = np.array([j == "mid" for j in held.judges])
    accuracy = np.mean(held.probabilities[mid].argmax(axis=1) + 1 == held.answers[mid])
    assert accuracy > 0.85
    q1 = predict_labels(model, test, "Q1")
    # Fine-tuning on Q0 moves the shared layers under the Q1 head; Q1 is still far above chance (0.25).
    assert np.mean(q1.probabilities.argmax(axis=1) + 1 == q1.answers) > 0.75


def test_per_judge_weights_capture_judges_biases(biased):
    model, test = biased
    x = np.stack([test.features[t] for t in test.text_ids])
    lo = model.predict_proba(x, "Q0", "lo").expected_value
    hi = model.predict_proba(x, "Q0", "hi").expected_value
    mid = model.predict_proba(x, "Q0", "mid").expected_value
    assert np.mean(hi - lo) > 1.0
    assert np.mean(lo) < np.mean(mid) < np.mean(hi)
    # Each judge's own labels are predicted better with its own weights than with another judge's.
    for own, other in (("lo", "hi"), ("hi", "lo")):
        labels = [lab for lab in test.labels_for("Q0") if lab.judge == own]
        xs = np.stack([test.features[lab.text_id] for lab in labels])
        y = np.array([lab.answer for lab in labels])
        err_own = np.mean((model.predict_proba(xs, "Q0", own).expected_value - y) ** 2)
        err_other = np.mean((model.predict_proba(xs, "Q0", other).expected_value - y) ** 2)
        assert err_own < err_other / 2


def test_unknown_judge_uses_exactly_the_shared_weights(biased):
    model, test = biased
    x = np.stack([test.features[t] for t in test.text_ids[:20]])
    unknown = model.predict_proba(x, "Q0", "someone-new").probabilities
    none = model.predict_proba(x, "Q0", None).probabilities
    assert np.array_equal(unknown, none)
    # Zero every judge-specific weight: each known judge now predicts what the unknown one does.
    shared_only = copy.deepcopy(model)
    with torch.no_grad():
        for net in shared_only._members:
            for w in net.judge_parameters():
                w.zero_()
    assert np.allclose(shared_only.predict_proba(x, "Q0", "hi").probabilities, unknown, atol=1e-6)
    assert not np.allclose(model.predict_proba(x, "Q0", "hi").probabilities, unknown, atol=1e-3)
    # Per-row judges mix known and unknown.
    rows = model.predict_proba(x[:2], "Q0", ["hi", "nobody"]).probabilities
    assert np.allclose(rows[0], model.predict_proba(x[0], "Q0", "hi").probabilities[0])
    assert np.allclose(rows[1], unknown[1])


def test_aggregate_over_trusted_judges_is_the_mixture(biased):
    model, test = biased
    tid = test.text_ids[0]
    x, spans = test.features[tid], np.cumsum([0] + [model.n_options_[q] for q in model.question_ids_])
    answers = {q: Answer(q, tuple(x[spans[i] : spans[i + 1]])) for i, q in enumerate(model.question_ids_)}
    judgement = Judgement(tid, answers, Provenance(judge="toy", model="toy"))
    assert np.allclose(model.features_from_judgement(judgement), x)
    agg = model.predict_judgement(judgement, judges=["lo", "hi"], questions=["Q0"])["Q0"]
    parts = [model.predict_proba(test.features[tid], "Q0", j) for j in ("lo", "hi")]
    assert np.allclose(agg.probabilities, (parts[0].probabilities + parts[1].probabilities) / 2)
    assert np.allclose(agg.expected_value, (parts[0].expected_value + parts[1].expected_value) / 2)
    with pytest.raises(CalibrationError, match="not in the training data"):
        model.predict_judgement(judgement, judges=["lo", "typo"])


def test_loss_ignores_entries_that_are_not_labels():
    logits = torch.randn(3, 2, 4, requires_grad=True)
    targets = torch.tensor([[0, -1], [-1, 3], [2, -1]])
    loss = _nll(logits, targets)
    loss.backward()
    assert logits.grad is not None
    assert torch.all(logits.grad[0, 1] == 0) and torch.all(logits.grad[1, 0] == 0) and torch.all(logits.grad[2, 1] == 0)
    changed = logits.detach().clone()
    changed[0, 1] += 5.0
    assert float(_nll(changed, targets)) == pytest.approx(float(loss.detach()))


@needs_release
def test_zero_coded_answers_do_not_change_training(tmp_path):
    """Blanking the human file's 0 (not applicable) cells must not change the trained model: 0 is no label."""
    path = DATA / "human_judges_real_convs_FIXED_ANON.tsv"
    with path.open(encoding="utf-8", newline="") as f:
        reader = csv.DictReader(f, delimiter="\t")
        header, rows = list(reader.fieldnames or []), list(reader)
    n_zero = sum(r[q] == "0" for r in rows for q in ("Q1", "Q3", "Q4", "Q5"))
    assert n_zero > 0
    for r in rows:
        for q in ("Q1", "Q3", "Q4", "Q5"):
            if r[q] == "0":
                r[q] = ""
    blank = tmp_path / "blank.tsv"
    with blank.open("w", encoding="utf-8", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=header, delimiter="\t")
        writer.writeheader()
        writer.writerows(rows)
    n_options = load_n_options(DATA / "questions.json")
    feats = load_features(DATA / "gpt-3.5-turbo-16k_real_evaluations_FIXED.tsv", n_options)
    a = build_data(feats, load_labels(path, n_options), n_options)
    b = build_data(feats, load_labels(blank, n_options), n_options)
    params = dict(FAST, pretrain_epochs=3, finetune_epochs=2)
    ma, mb = CalibrationNetwork(**params).fit(a), CalibrationNetwork(**params).fit(b)
    x = np.stack([a.features[t] for t in a.text_ids[:10]])
    assert np.array_equal(ma.predict_proba(x, "Q0", "7").probabilities, mb.predict_proba(x, "Q0", "7").probabilities)


def test_same_seed_same_model_different_seed_different_model():
    data = _toy(80, 2, {"a": 0, "b": 1})
    params = dict(FAST, pretrain_epochs=3, finetune_epochs=3)
    x = np.stack([data.features[t] for t in data.text_ids])
    p1 = CalibrationNetwork(**params, seed=5).fit(data).predict_proba(x, "Q0", "a").probabilities
    p2 = CalibrationNetwork(**params, seed=5).fit(data).predict_proba(x, "Q0", "a").probabilities
    p3 = CalibrationNetwork(**params, seed=6).fit(data).predict_proba(x, "Q0", "a").probabilities
    assert np.array_equal(p1, p2)
    assert not np.allclose(p1, p3)


def test_ensemble_members_average_and_early_stopping_restores_the_best_epoch():
    data = _toy(120, 4, {"a": 0, "b": 1})
    seen: list[TrainingProgress] = []
    model = CalibrationNetwork(
        **{**FAST, "pretrain_epochs": 30, "finetune_epochs": 30}, early_stopping=True, patience=3, n_members=2
    ).fit(data, progress=seen.append)
    assert len(model._members) == 2
    assert seen[-1].step == seen[-1].total == 120
    assert all(a.step <= b.step for a, b in zip(seen, seen[1:]))
    stopped_early = False
    for history in model.history_:
        val = history["finetune_val"]
        assert 1 <= len(val) <= 30
        stopped_early |= len(val) < 30
        # Stopped after `patience` epochs without improvement: the best epoch is `patience` before the last.
        if len(val) < 30:
            assert int(np.argmin(val)) == len(val) - 1 - 3
    assert stopped_early
    x = np.stack([data.features[t] for t in data.text_ids[:5]])
    members = []
    for net in model._members:
        single = copy.copy(model)
        single._members = [net]
        members.append(single.predict_proba(x, "Q0", "a").probabilities)
    assert np.allclose(model.predict_proba(x, "Q0", "a").probabilities, np.mean(members, axis=0))


def test_progress_callback_counts_to_total():
    data = _toy(40, 5, {"a": 0})
    seen: list[TrainingProgress] = []
    CalibrationNetwork(**{**FAST, "pretrain_epochs": 2, "finetune_epochs": 3}, n_members=2).fit(data, progress=seen.append)
    assert [p.step for p in seen] == list(range(1, 11))
    assert seen[-1].total == 10
    assert [p.phase for p in seen[:5]] == ["pretrain"] * 2 + ["finetune"] * 3


def test_save_load_round_trip_gives_identical_predictions(tmp_path, biased):
    model, test = biased
    model.save(tmp_path / "cal")
    loaded = CalibrationNetwork.load(tmp_path / "cal")
    x = np.stack([test.features[t] for t in test.text_ids])
    for judge in ("lo", "hi", None):
        for q in QUESTIONS:
            assert np.array_equal(loaded.predict_proba(x, q, judge).probabilities, model.predict_proba(x, q, judge).probabilities)
    assert loaded.version_ == model.version_
    meta = json.loads((tmp_path / "cal" / METADATA_FILE).read_text())
    assert meta["question_ids"] == list(QUESTIONS)
    assert meta["n_options"] == N_OPTIONS
    assert meta["judges"] == ["hi", "lo", "mid"]
    assert meta["hyperparameters"]["h1"] == FAST["h1"]
    assert meta["training_data_hash"] == model.training_data_hash_
    assert meta["version"] == model.version_


def test_version_changes_with_the_weights():
    data = _toy(40, 6, {"a": 0})
    params = dict(FAST, pretrain_epochs=1, finetune_epochs=1)
    assert CalibrationNetwork(**params, seed=1).fit(data).version_ != CalibrationNetwork(**params, seed=2).fit(data).version_


def test_corrupted_or_mismatched_files_are_rejected(tmp_path, biased):
    model, _ = biased
    good = model.save(tmp_path / "good")

    def copy_of(name: str) -> Path:
        dst = tmp_path / name
        dst.mkdir()
        for f in (METADATA_FILE, WEIGHTS_FILE):
            (dst / f).write_bytes((good / f).read_bytes())
        return dst

    flipped = copy_of("flipped")
    raw = bytearray((flipped / WEIGHTS_FILE).read_bytes())
    raw[-10] ^= 0xFF
    (flipped / WEIGHTS_FILE).write_bytes(bytes(raw))
    with pytest.raises(CalibrationFileError, match="SHA-256"):
        CalibrationNetwork.load(flipped)

    for name, edit, message in (
        ("bigger", lambda m: m["hyperparameters"].update(h1=99), "do not fit"),
        ("options", lambda m: m["n_options"].update(Q1=5), "do not fit"),
        ("judges", lambda m: m.update(judges=["hi", "lo", "mid", "new"]), "do not fit"),
        ("renamed", lambda m: m.update(question_ids=["Q0", "Q9"], n_options={"Q0": 4, "Q9": 4}), "version"),
        ("format", lambda m: m.update(format="something-else"), "not a"),
        ("fields", lambda m: m.pop("training_data_hash"), "missing fields"),
    ):
        d = copy_of(name)
        meta = json.loads((d / METADATA_FILE).read_text())
        edit(meta)
        (d / METADATA_FILE).write_text(json.dumps(meta))
        with pytest.raises(CalibrationFileError, match=message):
            CalibrationNetwork.load(d)

    broken = copy_of("json")
    (broken / METADATA_FILE).write_text("{not json")
    with pytest.raises(CalibrationFileError, match="cannot read"):
        CalibrationNetwork.load(broken)
    with pytest.raises(CalibrationFileError, match="cannot read"):
        CalibrationNetwork.load(tmp_path / "absent")


def test_bad_inputs_are_clear_errors(biased):
    model, _ = biased
    with pytest.raises(CalibrationError, match="not fitted"):
        CalibrationNetwork().predict_proba(np.zeros(8))
    with pytest.raises(CalibrationError, match="8 columns"):
        model.predict_proba(np.zeros(7))
    with pytest.raises(CalibrationError, match="unknown question"):
        model.predict_proba(np.zeros(8), "Q7")
    with pytest.raises(CalibrationError, match="h1 must be a positive integer"):
        CalibrationNetwork(h1=0)
    with pytest.raises(CalibrationError, match="unknown hyperparameters"):
        model.clone(depth=3)
    with pytest.raises(CalibrationError, match="main_question"):
        CalibrationNetwork(main_question="Q9").fit(_toy(10, 0, {"a": 0}))


def test_conversation_folds_partition_conversations():
    ids = [f"c{i}" for i in range(23)]
    folds = conversation_folds(ids + ids[:5], k=5, seed=1)
    tests = [set(test) for _, test in folds]
    assert set().union(*tests) == set(ids)
    assert sum(len(t) for t in tests) == len(ids)
    for train, test in folds:
        assert not set(train) & set(test)
        assert set(train) | set(test) == set(ids)
    assert conversation_folds(ids, 5, seed=1) == folds
    with pytest.raises(CalibrationError):
        conversation_folds(ids, 1)


def test_group_folds_hold_out_each_group_once_and_whole():
    ids = [f"{g}_{i}" for g in ("a", "b", "c") for i in range(4)]
    folds = group_folds(ids + ids[:2], lambda t: t.split("_")[0])
    assert [sorted({t.split("_")[0] for t in test}) for _, test in folds] == [["a"], ["b"], ["c"]]
    for train, test in folds:
        assert len(test) == 4 and set(train) == set(ids) - set(test)
    with pytest.raises(CalibrationError, match="at least 2 groups"):
        group_folds(ids, lambda t: "one")


def test_cross_validation_and_the_search_use_given_folds():
    data = _toy(30, 0, {"a": 0, "b": 1})
    folds = group_folds(data.text_ids, lambda t: str(int(t[1:]) % 3))
    held = cross_validate(OrdinalCalibrator(), data, folds=folds)
    assert sorted(set(held.fold)) == [0, 1, 2]
    for i, (_, test) in enumerate(folds):
        assert {t for t, f in zip(held.text_ids, held.fold) if f == i} == set(test)
    search = select_hyperparameters(data, {"weight_decay": [0.1, 10.0]}, base=OrdinalCalibrator(), folds=folds)
    assert [r["scores"] for r in search.results][0] == cross_validate(
        OrdinalCalibrator(weight_decay=0.1), data, folds=folds
    ).scores()


@needs_release
def test_cross_validation_holds_out_whole_conversations():
    real = load_split(DATA, "real").restrict_questions(["Q0", "Q1"])
    # Duplicate every conversation's Q0 label under a second judge: both copies must share a fold.
    extra = tuple(Label(x.text_id, x.question, "second", x.answer) for x in real.labels)
    data = RubricData(real.question_ids, real.n_options, real.features, real.labels + extra)
    held = cross_validate(CalibrationNetwork(**{**FAST, "pretrain_epochs": 1, "finetune_epochs": 1}), data, k=5, seed=0)
    assert len(held.answers) == 2 * len(real.labels_for("Q0"))
    fold_of: dict[str, set[int]] = {}
    for t, f in zip(held.text_ids, held.fold):
        fold_of.setdefault(t, set()).add(int(f))
    assert all(len(f) == 1 for f in fold_of.values())
    assert len(set(held.fold)) == 5
    expected = {t: i for i, (_, test) in enumerate(conversation_folds(data.text_ids, 5, 0)) for t in test}
    assert all(expected[t] == f.pop() for t, f in fold_of.items())


def test_select_hyperparameters_picks_the_best_by_criterion():
    data = _toy(60, 7, {"a": 0, "b": 1})
    grid = {"h1": [4, 16], "learning_rate": [1e-4, 1e-2]}
    assert len(parameter_grid(grid)) == 4
    assert len(parameter_grid([grid, {"h1": [8]}])) == 5
    base = CalibrationNetwork(**{**FAST, "pretrain_epochs": 4, "finetune_epochs": 4})
    search = select_hyperparameters(data, grid, base=base, k=3, criterion="rmse")
    rmses = [r["scores"]["rmse"] for r in search.results]
    best = search.results[int(np.argmin(rmses))]["params"]
    assert {k: search.best_params[k] for k in best} == best
    assert search.best_params["learning_rate"] == 1e-2  # 1e-4 for 8 epochs barely moves from the start
    with pytest.raises(CalibrationError, match="criterion"):
        select_hyperparameters(data, grid, criterion="accuracy")


@needs_release
def test_predict_from_a_recorded_judgement_matches_the_loaded_features():
    real = load_split(DATA, "real")
    model = CalibrationNetwork(**{**FAST, "pretrain_epochs": 2, "finetune_epochs": 2}).fit(real.subset(real.text_ids[:60]))
    judge = RecordedJudge.from_tsv(DATA / "gpt-3.5-turbo-16k_real_evaluations_FIXED.tsv")
    questions = load_questions(DATA / "questions.json")
    tid = real.text_ids[100]
    judgement = judge.judge(Conversation(tid, (Turn("user", "hi"),)), [questions[q] for q in real.question_ids])
    assert np.allclose(model.features_from_judgement(judgement), real.features[tid])
    preds = model.predict_judgement(judgement)
    assert set(preds) == set(real.question_ids)
    assert preds["Q8"].probabilities.shape == (1, 3)
    assert np.allclose(preds["Q0"].probabilities, model.predict_proba(real.features[tid], "Q0").probabilities)
    trusted = model.predict_judgement(judgement, judges=list(model.judges_[:3]), questions=["Q0"])
    mixture = np.mean([model.predict_proba(real.features[tid], "Q0", j).probabilities for j in model.judges_[:3]], axis=0)
    assert np.allclose(trusted["Q0"].probabilities, mixture)
    partial = judge.judge(Conversation(tid, (Turn("user", "hi"),)), [questions["Q0"]])
    with pytest.raises(CalibrationError, match="lacks answers"):
        model.predict_judgement(partial)
    tids = real.text_ids[100:110]
    judgements = [judge.judge(Conversation(t, (Turn("user", "hi"),)), [questions[q] for q in real.question_ids]) for t in tids]
    together = model.predict_judgements(judgements)
    for i, judgement in enumerate(judgements):  # row i is judgement i's own prediction
        alone = model.predict_judgement(judgement)
        assert all(np.allclose(together[q].probabilities[i], alone[q].probabilities[0], atol=1e-9) for q in together)


def test_input_questions_restrict_what_the_network_reads():
    data = _toy(150, 8, {"a": 0})
    model = CalibrationNetwork(**FAST, input_questions=["Q1"], main_question="Q1").fit(data)
    x = np.stack([data.features[t] for t in data.text_ids])
    scrambled = x.copy()
    scrambled[:, :4] = scrambled[::-1, :4]  # change Q0's block only
    assert np.array_equal(model.predict_proba(x, "Q0").probabilities, model.predict_proba(scrambled, "Q0").probabilities)
    # Q1's block still drives Q1's prediction.
    assert np.mean(model.predict_proba(x, "Q1").probabilities.argmax(1) + 1 == x[:, 4:].argmax(1) + 1) > 0.85


def test_one_forward_pass_for_all_questions_equals_per_question_predictions(biased) -> None:
    """`predict_all`/`predict_judgement` (what the worker calls) give exactly `predict_proba`'s numbers."""
    model, data = biased
    x = np.stack([data.features[t] for t in data.text_ids[:5]])
    every = model.predict_all(x)
    judge = model.judges_[0]
    with_judge = model.predict_all(x, judge)
    for q in model.question_ids_:
        np.testing.assert_allclose(every[q].probabilities, model.predict_proba(x, q).probabilities, atol=1e-12)
        np.testing.assert_allclose(with_judge[q].probabilities, model.predict_proba(x, q, judge).probabilities, atol=1e-12)
