"""The `convowatch` command line, run as a real subprocess on the LLM-Rubric release."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest

from scorers.calibration import CalibrationNetwork
from scorers.calibrators import load_calibrator
from scorers.datasets.labelled import load_labelled_jsonl, write_labelled_jsonl
from scorers.datasets.llm_rubric import load_split
from scorers.ordinal_calibration import OrdinalCalibrator
from tests.data_paths import LLM_RUBRIC
from tests.infra import convowatch

SYNTH_ANSWERS = LLM_RUBRIC / "gpt-3.5-turbo-16k_synth_evaluations_FIXED.tsv"
SYNTH_HUMANS = LLM_RUBRIC / "human_judges_synth_all_FIXED_ANON.tsv"
REAL_ANSWERS = LLM_RUBRIC / "gpt-3.5-turbo-16k_real_evaluations_FIXED.tsv"
REAL_HUMANS = LLM_RUBRIC / "human_judges_real_convs_FIXED_ANON.tsv"
QUESTIONS = LLM_RUBRIC / "questions.json"


def model_inputs():
    import numpy as np

    return np.full((1, 35), 0.25)


def recorded(answers: Path) -> dict[str, str]:
    return {"CONVOWATCH_JUDGE__BACKEND": "recorded", "CONVOWATCH_JUDGE__RECORDED_ANSWERS": str(answers)}


@pytest.fixture(scope="module")
def calibrator(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("cal") / "calibrator"
    r = convowatch(
        "calibrate",
        "train",
        "--judge-answers",
        SYNTH_ANSWERS,
        "--human-labels",
        SYNTH_HUMANS,
        "--questions",
        QUESTIONS,
        "--grid",
        "none",
        "--out",
        out,
    )
    assert r.returncode == 0, r.stderr
    assert "wrote calibrator" in r.stdout
    return out


def test_calibrate_train_then_evaluate_on_real_labels(calibrator):
    model = load_calibrator(calibrator)
    assert isinstance(model, OrdinalCalibrator)  # the default model
    assert model.question_ids_ == ("Q0", "Q1", "Q2", "Q3", "Q4", "Q5", "Q6", "Q7", "Q8")
    assert set(model.predict_proba(model_inputs(), "Q3").values) == {1.0, 2.0, 3.0, 4.0}  # every ordinal question is fitted
    r = convowatch(
        "calibrate",
        "evaluate",
        "--calibrator",
        calibrator,
        "--judge-answers",
        REAL_ANSWERS,
        "--human-labels",
        REAL_HUMANS,
        "--json",
    )
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["calibrator"] == model.version_ and got["question"] == "Q0" and got["n"] == 223
    # Trained on synthetic only; bench/calibration_transfer.py measures r ≈ 0.24 on real (default penalties
    # here, not the CV choice). It must at least correlate positively.
    assert got["pearson"] > 0.1
    assert got["rmse"] >= got["rmse_bound"]


def test_calibrate_train_chooses_the_ordinal_penalties_by_cv(tmp_path):
    r = convowatch(
        "calibrate", "train", "--judge-answers", SYNTH_ANSWERS, "--human-labels", SYNTH_HUMANS, "--questions", QUESTIONS,
        "--folds", "2", "--out", tmp_path / "c",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "chosen by 2-fold CV: {'weight_decay':" in r.stderr and "not predicted: Q8" in r.stderr
    chosen = OrdinalCalibrator.load(tmp_path / "c")
    assert chosen.weight_decay in (0.01, 0.1, 1.0, 10.0, 100.0) and sorted(chosen.predict_all(model_inputs())) == [
        f"Q{i}" for i in range(8)
    ]
    r = convowatch(
        "calibrate", "train", "--judge-answers", SYNTH_ANSWERS, "--human-labels", SYNTH_HUMANS, "--questions", QUESTIONS,
        "--members", "3", "--out", tmp_path / "d",
    )  # fmt: skip
    assert r.returncode == 2 and "options of --model network" in r.stderr and not (tmp_path / "d").exists()


def test_calibrate_train_holds_out_whole_groups_as_the_transfer_benchmark_chose(tmp_path):
    train = ("calibrate", "train", "--judge-answers", SYNTH_ANSWERS, "--human-labels", SYNTH_HUMANS, "--questions", QUESTIONS)
    r = convowatch(*train, "--cv-groups", "^(V[0-9]+)_", "--out", tmp_path / "c")
    assert r.returncode == 0, r.stderr
    assert "chosen by CV holding out each of 5 groups: {'weight_decay': 10.0, 'judge_shrinkage': 1.0}" in r.stderr
    results = json.loads((Path(__file__).parents[2] / "bench/results/calibration_transfer.json").read_text())
    assert results["default"] == "ordinal_system_cv"
    assert results["candidates"]["ordinal_system_cv"]["chosen"][0] == {"weight_decay": 10.0, "judge_shrinkage": 1.0}
    for pattern, message in (
        ("^(V[0-9]+", "not a regular expression"),
        ("^V[0-9]+_", "needs a capture group"),
        ("^(W[0-9]+)_", "does not match"),
        ("^(V)", "at least 2 groups"),
    ):
        r = convowatch(*train, "--cv-groups", pattern, "--out", tmp_path / "bad")
        assert r.returncode != 0 and message in r.stderr and "Traceback" not in r.stderr, (pattern, r.stderr)
        assert not (tmp_path / "bad").exists()


def test_calibrate_train_the_network_with_cv_grid_reports_its_choice(tmp_path):
    r = convowatch(
        "calibrate",
        "train",
        "--model",
        "network",
        "--judge-answers",
        SYNTH_ANSWERS,
        "--human-labels",
        SYNTH_HUMANS,
        "--questions",
        QUESTIONS,
        "--grid",
        "small",
        "--folds",
        "2",
        "--out",
        tmp_path / "c",
    )
    assert r.returncode == 0, r.stderr
    assert "chosen by 2-fold CV: {'h1':" in r.stderr
    chosen = CalibrationNetwork.load(tmp_path / "c")
    assert chosen.h1 in (10, 25, 50) and chosen.h2 in (25, 50)


def test_calibrate_adapt_to_a_teams_own_labels(tmp_path, calibrator):
    lines = REAL_HUMANS.read_text().splitlines()
    few, many = tmp_path / "few.tsv", tmp_path / "many.tsv"
    few.write_text("\n".join(lines[:10]) + "\n")  # header + 9 labelled conversations
    many.write_text("\n".join(lines[:61]) + "\n")
    args = ("calibrate", "adapt", "--calibrator", calibrator, "--judge-answers", REAL_ANSWERS)
    r = convowatch(*args, "--human-labels", many, "--out", tmp_path / "adapted")
    assert r.returncode == 0, r.stderr
    assert "chosen by 5-fold CV on these labels: strength" in r.stderr
    adapted = OrdinalCalibrator.load(tmp_path / "adapted")
    assert adapted.adaptation_[0]["conversations"] == 60 and adapted.version_ in r.stdout
    base = load_calibrator(calibrator)
    assert isinstance(base, OrdinalCalibrator) and adapted.judge_offsets() != base.judge_offsets()
    r = convowatch(*args, "--human-labels", few, "--strength", "10", "--out", tmp_path / "few")
    assert r.returncode == 2 and "at least 10 conversations" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "few").exists()
    real = load_split(LLM_RUBRIC, "real")
    network = CalibrationNetwork(pretrain_epochs=1, finetune_epochs=1).fit(real.subset(real.text_ids[:20]))
    network.save(tmp_path / "network")
    r = convowatch(
        "calibrate",
        "adapt",
        "--calibrator",
        tmp_path / "network",
        "--judge-answers",
        REAL_ANSWERS,
        "--human-labels",
        many,
        "--out",
        tmp_path / "n",
    )
    assert r.returncode == 2 and "only an ordinal calibrator can be adapted" in r.stderr


def test_calibrate_adapt_with_a_labels_file_asks_the_judge_once_and_matches_the_recorded_files(tmp_path, calibrator):
    """--labels: the team's conversations and answers in one JSONL; the (recorded GPT-3.5) judge answers the
    calibrator's questions about them. The same 60 real conversations and labels as TSV files adapt to the same
    calibrator; a second run takes every answer from the cache (its judge's recording knows none of these
    conversations, so any question asked would fail)."""
    from scorers.datasets.llm_rubric import load_labels, load_real_conversations

    base = load_calibrator(calibrator)
    lines = REAL_HUMANS.read_text().splitlines()
    many = tmp_path / "many.tsv"
    many.write_text("\n".join(lines[:61]) + "\n")
    labels = load_labels(many, base.n_options_, base.question_ids_)
    texts = load_real_conversations(LLM_RUBRIC / "real_data.json")
    by_conversation: dict[str, list[dict]] = {}
    for lab in labels:
        by_conversation.setdefault(lab.text_id, []).append(
            {"question": lab.question, "answer": lab.answer, "annotator": lab.judge}
        )
    labels_file = tmp_path / "labels.jsonl"
    labels_file.write_text(
        "".join(
            json.dumps(
                {
                    "conversation_id": cid,
                    "turns": [{"role": t.role, "text": t.text} for t in texts[cid].turns],
                    "labels": answers,
                }
            )
            + "\n"
            for cid, answers in by_conversation.items()
        )
    )
    cache = tmp_path / "answers.sqlite"
    adapt = ("calibrate", "adapt", "--calibrator", calibrator, "--strength", "10")
    with_labels = (*adapt, "--labels", labels_file, "--questions", QUESTIONS, "--cache", cache)
    r = convowatch(*with_labels, "--out", tmp_path / "from-labels", env=recorded(REAL_ANSWERS))
    assert r.returncode == 0, r.stderr
    assert "60 conversations, " in r.stderr and "540 answers asked" in r.stderr and "0 from the cache" in r.stderr
    r = convowatch(*adapt, "--judge-answers", REAL_ANSWERS, "--human-labels", many, "--out", tmp_path / "from-files")
    assert r.returncode == 0, r.stderr
    from_labels, from_files = (OrdinalCalibrator.load(tmp_path / d) for d in ("from-labels", "from-files"))
    assert from_labels.adaptation_[0]["conversations"] == 60
    for question, prediction in from_files.predict_all(model_inputs()).items():
        np.testing.assert_allclose(from_labels.predict_all(model_inputs())[question].probabilities, prediction.probabilities)
    assert from_labels.judge_offsets() == from_files.judge_offsets()

    unknowing = tmp_path / "unknowing" / REAL_ANSWERS.name  # same judge identity (the file's name), other answers
    unknowing.parent.mkdir()
    unknowing.write_text("".join(SYNTH_ANSWERS.read_text().splitlines(keepends=True)[:10]))
    r = convowatch(*with_labels, "--out", tmp_path / "again", env=recorded(unknowing))
    assert r.returncode == 0, r.stderr
    assert "0 answers asked (0 calls), 540 from the cache" in r.stderr

    # One clear error each: both forms, neither, a label file with a bad line, k below the minimum.
    r = convowatch(*with_labels, "--human-labels", many, "--out", tmp_path / "x", env=recorded(REAL_ANSWERS))
    assert r.returncode == 2 and "give one of --labels FILE, --from-store, or both --judge-answers and --human-labels" in r.stderr
    r = convowatch(*adapt, "--out", tmp_path / "x")
    assert r.returncode == 2 and "give one of --labels FILE" in r.stderr
    bad = tmp_path / "bad.jsonl"
    bad.write_text(labels_file.read_text().replace('"question": "Q0", "answer": ', '"question": "Q0", "answer": 4', 1))
    r = convowatch(*adapt, "--labels", bad, "--questions", QUESTIONS, "--out", tmp_path / "x", env=recorded(REAL_ANSWERS))
    assert r.returncode == 2 and f"{bad}:1: labels[" in r.stderr and "in 1..4" in r.stderr and "Traceback" not in r.stderr
    few = tmp_path / "few.jsonl"
    few.write_text("".join(labels_file.read_text().splitlines(keepends=True)[:9]))
    r = convowatch(*adapt, "--labels", few, "--questions", QUESTIONS, "--out", tmp_path / "x", env=recorded(REAL_ANSWERS))
    assert r.returncode == 2 and "at least 10 conversations" in r.stderr and "Traceback" not in r.stderr
    r = convowatch(*adapt, "--labels", few, "--out", tmp_path / "x", env=recorded(REAL_ANSWERS))
    assert r.returncode == 2 and "--questions FILE or scoring.questions" in r.stderr
    assert not (tmp_path / "x").exists()


def test_calibrate_refuses_bad_input_with_one_clear_line(tmp_path, calibrator):
    r = convowatch(
        "calibrate",
        "train",
        "--judge-answers",
        SYNTH_ANSWERS,
        "--human-labels",
        SYNTH_HUMANS,
        "--questions",
        QUESTIONS,
        "--main-question",
        "Q42",
        "--out",
        tmp_path / "x",
    )
    assert r.returncode == 2 and "--main-question 'Q42' is not in" in r.stderr and "Traceback" not in r.stderr
    bad = tmp_path / "bad.tsv"
    bad.write_text(REAL_HUMANS.read_text().replace("\t4\t22\n", "\tfour\t22\n", 1))
    r = convowatch("calibrate", "evaluate", "--calibrator", calibrator, "--judge-answers", REAL_ANSWERS, "--human-labels", bad)
    assert r.returncode == 2 and f"{bad}:" in r.stderr and "Traceback" not in r.stderr
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "calibrator.json").write_text("{}")
    r = convowatch(
        "calibrate", "evaluate", "--calibrator", broken, "--judge-answers", REAL_ANSWERS, "--human-labels", REAL_HUMANS
    )
    assert r.returncode == 2 and "convowatch: error:" in r.stderr and "Traceback" not in r.stderr


def test_rubrics_fit_and_evaluate_with_the_recorded_judge(tmp_path):
    synth, real, dims, fitted = (tmp_path / n for n in ("synth.jsonl", "real.jsonl", "dims.json", "fitted.json"))
    r = convowatch(
        "data", "llm-rubric", "--data-dir", LLM_RUBRIC, "--split", "synth", "--labelled-out", synth, "--rubric-set-out", dims
    )
    assert r.returncode == 0, r.stderr
    r = convowatch("data", "llm-rubric", "--data-dir", LLM_RUBRIC, "--split", "real", "--labelled-out", real)
    assert r.returncode == 0, r.stderr
    real_items = load_labelled_jsonl(real)
    assert len(real_items) == 223 and sum(i.positive for i in real_items) == 150
    assert all(i.conversation.turns for i in real_items)  # real conversations carry their text

    r = convowatch("rubrics", "fit", "--rubric-set", dims, "--labelled", synth, "--out", fitted, env=recorded(SYNTH_ANSWERS))
    assert r.returncode == 0, r.stderr
    doc = json.loads(fitted.read_text())
    assert doc["version"] != json.loads(dims.read_text())["version"]  # θ and windows are part of the version
    moments = doc["metadata"]["score_moments"]  # for approximate early stopping
    assert moments["rubric_ids"] == [r["id"] for r in doc["rubrics"]] and len(moments["covariance"]) == len(doc["rubrics"])

    r = convowatch("rubrics", "evaluate", "--rubric-set", fitted, "--labelled", synth, "--json", env=recorded(SYNTH_ANSWERS))
    assert r.returncode == 0, r.stderr
    m = json.loads(r.stdout)
    assert m["n"] == 223 and m["n_positive"] == 210
    f = {k: v["value"] for k, v in m["figures"].items()}
    # The windows were fitted on this data at P = 0.9, so the confident labels reach that precision here.
    if f["yield_rate"] > 0:
        assert f["confident_accuracy"] >= 0.9


def test_rubrics_refuse_one_class_data_and_unknown_conversations(tmp_path):
    dims, labelled = tmp_path / "dims.json", tmp_path / "l.jsonl"
    convowatch(
        "data", "llm-rubric", "--data-dir", LLM_RUBRIC, "--split", "real", "--labelled-out", labelled, "--rubric-set-out", dims
    )
    positives = [line for line in labelled.read_text().splitlines() if '"label": "positive"' in line]
    one_class = tmp_path / "pos.jsonl"
    one_class.write_text("\n".join(positives) + "\n")
    r = convowatch(
        "rubrics", "fit", "--rubric-set", dims, "--labelled", one_class, "--out", tmp_path / "f.json", env=recorded(REAL_ANSWERS)
    )
    assert r.returncode == 2 and "needs both positive and negative" in r.stderr
    # Real conversation ids are unknown to the synthetic recording: a clear error, not a crash.
    r = convowatch(
        "rubrics", "fit", "--rubric-set", dims, "--labelled", labelled, "--out", tmp_path / "f.json", env=recorded(SYNTH_ANSWERS)
    )
    assert r.returncode == 2 and "has no answer for conversation" in r.stderr
    assert not (tmp_path / "f.json").exists()


def test_config_masks_secrets_and_names_missing_settings(tmp_path):
    r = convowatch("config", env={"CONVOWATCH_JUDGE__API_KEY": "sk-secret-123", "CONVOWATCH_JUDGE__BACKEND": "openai"})
    assert r.returncode == 0 and "sk-secret-123" not in r.stdout and '"backend": "openai"' in r.stdout
    r = convowatch(
        "rubrics",
        "evaluate",
        "--rubric-set",
        LLM_RUBRIC / "questions.json",
        "--labelled",
        LLM_RUBRIC / "questions.json",
        env={"CONVOWATCH_JUDGE__BACKEND": "telepathy"},
    )
    assert r.returncode == 2 and "judge.backend" in r.stderr
    dims, labelled = tmp_path / "dims.json", tmp_path / "l.jsonl"
    convowatch(
        "data", "llm-rubric", "--data-dir", LLM_RUBRIC, "--split", "real", "--labelled-out", labelled, "--rubric-set-out", dims
    )
    r = convowatch(
        "rubrics", "evaluate", "--rubric-set", dims, "--labelled", labelled, env={"CONVOWATCH_JUDGE__BACKEND": "openai"}
    )
    assert r.returncode == 2 and "judge.base_url" in r.stderr and "judge.model" in r.stderr


def test_rubrics_evaluate_keeps_the_judge_budget(tmp_path, scoring_artifacts):
    """scoring.budget holds the offline commands too: no 2-s window sees more judge requests than the limit.

    The endpoint is a real HTTP server with a stand-in answer (tests/integration/test_pipeline.py): no local model answers fast
    enough to fill a window several times in a test."""
    from tests.integration.test_pipeline import _completion
    from tests.servers import Reply, ScriptedServer

    rubric_set, _ = scoring_artifacts
    real, labelled = tmp_path / "real.jsonl", tmp_path / "few.jsonl"
    r = convowatch("data", "llm-rubric", "--data-dir", LLM_RUBRIC, "--split", "real", "--labelled-out", real)
    assert r.returncode == 0, r.stderr
    items = load_labelled_jsonl(real)
    write_labelled_jsonl(labelled, [i for i in items if i.positive][:2] + [i for i in items if not i.positive][:2])
    n_questions = len(json.loads(rubric_set.read_text())["rubrics"])
    arrived: list[float] = []

    def answer(index, request):
        arrived.append(time.monotonic())
        return Reply(200, json.dumps(_completion()).encode())

    with ScriptedServer(answer) as server:
        env = {
            "CONVOWATCH_JUDGE__BACKEND": "openai",
            "CONVOWATCH_JUDGE__BASE_URL": server.url + "/v1",
            "CONVOWATCH_JUDGE__MODEL": "stand-in",
            "CONVOWATCH_JUDGE__API_KEY": "k",
            "CONVOWATCH_SCORING__BUDGET__CALLS_PER_MINUTE": str(n_questions),  # one conversation per window
            "CONVOWATCH_SCORING__BUDGET__MINUTE_S": "2",
        }
        cache = ("--cache", tmp_path / "answers.sqlite")  # a fresh cache: every answer is asked
        r = convowatch("rubrics", "evaluate", "--rubric-set", rubric_set, "--labelled", labelled, "--json", *cache, env=env)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["n"] == 4
    assert len(arrived) == 4 * n_questions
    arrived.sort()
    # Request i + limit arrives at least one window after request i.
    assert min(b - a for a, b in zip(arrived, arrived[n_questions:])) >= 2.0
    assert "waiting up to" in r.stderr and "judge budget (calls_per_minute)" in r.stderr


def test_rubrics_evaluate_with_early_stopping_gives_the_labels_of_asking_every_rubric(scoring_artifacts):
    rubric_set, _ = scoring_artifacts
    synth = rubric_set.parent / "synth.jsonl"
    r = convowatch("rubrics", "evaluate", "--rubric-set", rubric_set, "--labelled", synth, "--json", env=recorded(SYNTH_ANSWERS))
    assert r.returncode == 0, r.stderr
    full = json.loads(r.stdout)
    r = convowatch(
        "rubrics",
        "evaluate",
        "--rubric-set",
        rubric_set,
        "--labelled",
        synth,
        "--json",
        "--rubrics-per-round",
        "2",
        env=recorded(SYNTH_ANSWERS),
    )
    assert r.returncode == 0, r.stderr
    early = json.loads(r.stdout)
    assert (early["n"], early["n_positive"]) == (full["n"], full["n_positive"])
    for key in ("yield_rate", "accuracy", "precision", "recall", "f1", "confident_accuracy"):
        assert early["figures"][key]["value"] == full["figures"][key]["value"], key
    # stopped NetSATs are only bounded
    assert early["figures"]["delta_netsat"]["value"] is None and full["figures"]["delta_netsat"]["value"] is not None
    assert "early stopping" in early["figures"]["delta_netsat"]["reason"]
    n_rubrics = len(json.loads(rubric_set.read_text())["rubrics"])
    assert early["rubric_questions_of_all"] == full["n"] * n_rubrics
    assert 0 < early["rubric_questions_asked"] <= early["rubric_questions_of_all"]
    r = convowatch(
        "rubrics",
        "evaluate",
        "--rubric-set",
        rubric_set,
        "--labelled",
        synth,
        "--rubrics-per-round",
        "0",
        env=recorded(SYNTH_ANSWERS),
    )
    assert r.returncode == 2 and "--rubrics-per-round" in r.stderr


def test_rubrics_evaluate_approximate_early_stopping_asks_less_and_needs_moments(scoring_artifacts, tmp_path):
    rubric_set, _ = scoring_artifacts
    synth = rubric_set.parent / "synth.jsonl"
    runs = {}
    for p in ("0", "0.1"):
        r = convowatch(
            "rubrics", "evaluate", "--rubric-set", rubric_set, "--labelled", synth, "--json", "--rubrics-per-round", "2",
            "--max-label-change-probability", p, env=recorded(SYNTH_ANSWERS),
        )  # fmt: skip
        assert r.returncode == 0, r.stderr
        runs[p] = json.loads(r.stdout)
    assert runs["0.1"]["max_label_change_probability"] == 0.1 and "max_label_change_probability" not in runs["0"]
    assert runs["0.1"]["rubric_questions_asked"] < runs["0"]["rubric_questions_asked"]

    r = convowatch(
        "rubrics", "evaluate", "--rubric-set", rubric_set, "--labelled", synth, "--max-label-change-probability", "0.1",
        env=recorded(SYNTH_ANSWERS),
    )  # fmt: skip
    assert r.returncode == 2 and "needs --rubrics-per-round" in r.stderr
    doc = json.loads(rubric_set.read_text())
    del doc["metadata"]["score_moments"]
    no_moments = tmp_path / "no-moments.json"
    no_moments.write_text(json.dumps(doc))
    r = convowatch(
        "rubrics", "evaluate", "--rubric-set", no_moments, "--labelled", synth, "--rubrics-per-round", "2",
        "--max-label-change-probability", "0.1", env=recorded(SYNTH_ANSWERS),
    )  # fmt: skip
    assert r.returncode == 2 and "refit it with `convowatch rubrics fit`" in r.stderr


# --- rubrics evaluate / compare: answer cache, intervals, groups, paired differences ------------------------------


def _real_labelled(tmp_path: Path) -> Path:
    """The 223 real LLM-Rubric conversations (with their texts), labelled, each with a `cohort` attribute (even/odd)."""
    real = tmp_path / "real.jsonl"
    r = convowatch("data", "llm-rubric", "--data-dir", LLM_RUBRIC, "--split", "real", "--labelled-out", real)
    assert r.returncode == 0, r.stderr
    items = load_labelled_jsonl(real)
    for n, item in enumerate(items):
        item.conversation.attributes["cohort"] = "even" if n % 2 == 0 else "odd"
    write_labelled_jsonl(real, items)
    return real


def _no_nan(text: str) -> dict:
    def refuse(constant: str) -> None:
        raise AssertionError(f"not JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


def test_rubrics_evaluate_caches_answers_and_reports_intervals_groups_and_rows(tmp_path, scoring_artifacts):
    from scorers.statistics import auroc

    rubric_set, _ = scoring_artifacts
    labelled, cache, rows = _real_labelled(tmp_path), tmp_path / "answers.sqlite", tmp_path / "rows.csv"
    args = ("rubrics", "evaluate", "--rubric-set", rubric_set, "--labelled", labelled, "--cache", cache, "--json")
    first = convowatch(*args, "--by", "cohort", "--per-conversation", rows, env=recorded(REAL_ANSWERS))
    assert first.returncode == 0, first.stderr
    n_rubrics = len(json.loads(rubric_set.read_text())["rubrics"])
    assert f"judge: 0 answers from the cache, {223 * n_rubrics} asked" in first.stderr
    assert "HTTP Request" not in first.stderr and "INFO" not in first.stderr  # quiet by default
    doc = _no_nan(first.stdout)
    assert (doc["n"], doc["n_positive"], doc["bootstrap"]["stratified_by"]) == (223, 150, ["class", "cohort"])
    auc = doc["figures"]["auroc"]
    assert auc["low"] <= auc["value"] <= auc["high"] and 0 < auc["high"] - auc["low"] < 0.5
    assert set(doc["groups"]) == {"even", "odd"} and sum(g["n"] for g in doc["groups"].values()) == 223

    # the rows carry what the figures come from: AUROC of their NetSATs for the positives
    import csv

    with rows.open(encoding="utf-8") as f:
        table = list(csv.DictReader(f))
    assert len(table) == 223 and {r["group"] for r in table} == {"even", "odd"}
    netsat = np.array([float(r["netsat"]) for r in table])
    assert auc["value"] == pytest.approx(auroc(netsat, np.array([r["human_label"] == "positive" for r in table])))
    rubric_columns = [k for k in table[0] if k.startswith("rubric:")]
    assert len(rubric_columns) == n_rubrics
    assert netsat[0] == pytest.approx(sum(float(table[0][k]) for k in rubric_columns))

    # again: every answer from the cache, the same figures (text output this time)
    again = convowatch(*args[:-1], "--bootstrap", "200", env=recorded(REAL_ANSWERS))
    assert again.returncode == 0, again.stderr
    assert f"judge: {223 * n_rubrics} answers from the cache, 0 asked" in again.stderr
    assert f"AUROC                     {auc['value']:.3f} (" in again.stdout and "200 bootstrap resamples" in again.stdout


def test_rubrics_compare_gives_paired_differences_and_refuses_one_set_or_the_same_twice(tmp_path, scoring_artifacts):
    rubric_set, _ = scoring_artifacts
    labelled, cache = _real_labelled(tmp_path), tmp_path / "answers.sqlite"
    doc = json.loads(rubric_set.read_text())
    fewer = tmp_path / "fewer.json"
    subset = {k: v for k, v in doc.items() if k != "version"} | {"rubrics": doc["rubrics"][:3]}
    fewer.write_text(json.dumps(subset))  # a different set (a new version): three of its rubrics
    r = convowatch(
        "rubrics", "compare", rubric_set, fewer, "--labelled", labelled, "--cache", cache, "--json", env=recorded(REAL_ANSWERS)
    )
    assert r.returncode == 0, r.stderr
    # the three rubrics the second set shares with the first are read from the cache
    assert f"{223 * 3} answers from the cache, {223 * len(doc['rubrics'])} asked" in r.stderr
    out = _no_nan(r.stdout)
    reference, other = (s["rubric_set"] for s in out["rubric_sets"])
    assert out["reference"] == reference != other and out["bootstrap"]["paired"] is True
    d = out["differences_from_reference"][other]["auroc"]
    a, b = (s["figures"]["auroc"]["value"] for s in out["rubric_sets"])
    assert d["value"] == pytest.approx(b - a) and d["low"] <= d["value"] <= d["high"] and 0 <= d["p_value"] <= 1

    r = convowatch("rubrics", "compare", rubric_set, "--labelled", labelled, env=recorded(REAL_ANSWERS))
    assert r.returncode == 2 and "two or more" in r.stderr
    same = tmp_path / "same.json"
    same.write_text(rubric_set.read_text())
    r = convowatch("rubrics", "compare", rubric_set, same, "--labelled", labelled, env=recorded(REAL_ANSWERS))
    assert r.returncode == 2 and "the same rubric set is given twice" in r.stderr


def test_compare_sets_with_different_answer_scales_from_one_set_of_answers(tmp_path, scoring_artifacts):
    """The same questions scored on another scale are another set; the judge's answers are shared through the cache."""
    rubric_set, _ = scoring_artifacts
    labelled, cache, rows = _real_labelled(tmp_path), tmp_path / "answers.sqlite", tmp_path / "rows.jsonl"
    doc = json.loads(rubric_set.read_text())
    harsh = {k: v for k, v in doc.items() if k != "version"}
    for rubric in harsh["rubrics"]:  # only the top answer earns anything
        rubric["scale"] = [{**o, "score": 10.0 if i == len(rubric["scale"]) - 1 else 0.0} for i, o in enumerate(rubric["scale"])]
    other = tmp_path / "harsh.json"
    other.write_text(json.dumps(harsh))
    args = ("rubrics", "compare", rubric_set, other, "--labelled", labelled, "--cache", cache, "--per-conversation", rows)
    r = convowatch(*args, "--json", env=recorded(REAL_ANSWERS))
    assert r.returncode == 0, r.stderr
    n = 223 * len(doc["rubrics"])
    assert f"{n} answers from the cache, {n} asked" in r.stderr  # the harsh set's answers all come from the cache
    table = [json.loads(line) for line in rows.read_text().splitlines()]
    by_set: dict[str, dict[str, dict]] = {}
    for row in table:
        by_set.setdefault(row["rubric_set"], {})[row["conversation_id"]] = row
    first, second = by_set.values()
    cid = next(iter(first))
    for rid, score in second[cid]["rubric_scores"].items():  # harsh rating = 10 × P(top answer) ≤ the even scale's
        assert 0 <= score <= first[cid]["rubric_scores"][rid] + 1e-9
    assert _no_nan(r.stdout)["differences_from_reference"]


def test_evaluate_and_compare_refuse_one_class_and_unwritable_rows_before_judging(tmp_path, scoring_artifacts):
    rubric_set, _ = scoring_artifacts
    labelled = _real_labelled(tmp_path)
    items = load_labelled_jsonl(labelled)
    one_class = tmp_path / "positives.jsonl"
    write_labelled_jsonl(one_class, [i for i in items if i.positive])
    for command in (("evaluate", "--rubric-set", rubric_set), ("compare", rubric_set, rubric_set)):
        r = convowatch("rubrics", *command, "--labelled", one_class, env=recorded(REAL_ANSWERS))
        assert r.returncode == 2 and "Traceback" not in r.stderr
    r = convowatch("rubrics", "evaluate", "--rubric-set", rubric_set, "--labelled", one_class, env=recorded(REAL_ANSWERS))
    assert "needs both positive and negative" in r.stderr
    for rows, message in ((tmp_path, "a directory"), (tmp_path / "missing" / "rows.csv", "does not exist")):
        r = convowatch(
            "rubrics", "evaluate", "--rubric-set", rubric_set, "--labelled", labelled, "--per-conversation", rows,
            env=recorded(REAL_ANSWERS),
        )  # fmt: skip
        assert r.returncode == 2 and message in r.stderr and "judging" not in r.stderr, r.stderr


def test_rubrics_fit_judges_through_the_cache(tmp_path, scoring_artifacts):
    rubric_set, _ = scoring_artifacts
    labelled, cache = _real_labelled(tmp_path), tmp_path / "answers.sqlite"
    n = 223 * len(json.loads(rubric_set.read_text())["rubrics"])
    outs = []
    for run, expected in enumerate((f"0 answers from the cache, {n} asked", f"{n} answers from the cache, 0 asked")):
        out = tmp_path / f"fitted-{run}.json"
        r = convowatch(
            "rubrics", "fit", "--rubric-set", rubric_set, "--labelled", labelled, "--out", out, "--cache", cache,
            env=recorded(REAL_ANSWERS),
        )  # fmt: skip
        assert r.returncode == 0 and expected in r.stderr, r.stderr
        outs.append(json.loads(out.read_text()))
    assert outs[0]["version"] == outs[1]["version"]  # the same answers fit the same θ and windows
