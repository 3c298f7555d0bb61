"""Labels from user feedback in the store, `convowatch learn --from-store` and `convowatch calibrate adapt
--from-store`, on the real chDB engine.

The command tests write the store in a child process (the embedded store is one-process, as after `convowatch
sink`): the 223 real LLM-Rubric conversations, each rated by its human label (negative: thumbs-down on an
assistant turn; positive: thumbs-up) and scored as a whole by its human judge's Q0 (a rating event on a 1..4
scale), learned from with the recorded GPT-3.5 judge.
"""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from scorers.datasets.llm_rubric import load_real_conversations, load_split, satisfaction_labels
from scorers.ordinal_calibration import OrdinalCalibrator
from scorers.rubrics import RubricSet
from stream.feedback_labels import USERS, FeedbackLabelRules, answers_from_store, labelled_from_store
from stream.records import ClosedConversation, FeedbackRow, RatingRow, ScoreRecord, TurnRecord
from stream.store import ClickHouseStore
from tests.chdb_fixture import chdb_dsn, chdb_store, store_factory  # noqa: F401
from tests.data_paths import LLM_RUBRIC
from tests.infra import convowatch
from tests.integration.test_cli import QUESTIONS, calibrator  # noqa: F401
from tests.integration.test_learn_cli import domain, error_line, llm_rubric_files, recorded  # noqa: F401

REPO = Path(__file__).resolve().parents[2]
T0 = 1_707_480_000.0  # 2024-02-09 12:00 UTC
DAY = 86_400.0


def utc(t: float) -> datetime:
    return datetime.fromtimestamp(t, tz=UTC)


def record(cid: str, turns: list[tuple[str, str]], attributes: dict[str, str], closed_at: float = T0) -> ScoreRecord:
    """A stored conversation (its score does not matter to the labels: unscored here)."""
    conversation = ClosedConversation(
        conversation_id=cid,
        turns=tuple(TurnRecord(i, role, text, closed_at - 60 + i) for i, (role, text) in enumerate(turns)),
        attributes=attributes,
        close_cause="end",
        closed_at=closed_at,
        first_event_at=closed_at - 60,
        last_event_at=closed_at - 60 + len(turns),
    )
    return ScoreRecord(
        conversation=conversation,
        status="unscored",
        scorer_version="v1",
        judge="recorded:test",
        rubric_set_version="rs1",
        calibrator_version="",
        scored_at=closed_at + 1,
        attempts=1,
        unscored_reason="JudgeUnavailable: test",
    )


def rating(cid: str, turn: int, value: str, at: float = T0) -> FeedbackRow:
    return FeedbackRow(cid, turn, value, "", at, {}, at + 1)


CHAT = {"product": "chat"}
TURNS = [("user", "where is my order?"), ("assistant", "It ships today."), ("user", "thanks"), ("assistant", "Welcome!")]


@pytest.fixture
def rated_store(store_factory) -> ClickHouseStore:
    store = store_factory()
    store.write_scores(
        [
            record("down", TURNS, CHAT),
            record("up", TURNS, CHAT),
            record("both", TURNS, CHAT),
            record("changed-mind", TURNS, CHAT),
            record("unrated", TURNS, CHAT),
            record("last-week", TURNS, CHAT, closed_at=T0 - 7 * DAY),
            record("other-product", TURNS, {"product": "search"}),
        ]
    )
    feedback = [
        rating("down", 1, "down"),
        rating("up", 3, "up"),
        rating("both", 1, "up"),
        rating("both", 3, "down"),
        rating("changed-mind", 1, "down", T0),
        rating("changed-mind", 1, "up", T0 + 30),  # the latest rating of a turn counts
        rating("last-week", 1, "down"),
        rating("other-product", 1, "down"),
    ]
    store.write_feedback(feedback)
    store.write_feedback(feedback[:2])  # redelivered: counted once
    return store


def test_rated_conversations_in_the_window_become_labels(rated_store: ClickHouseStore) -> None:
    found = labelled_from_store(rated_store, utc(T0 - DAY), utc(T0 + DAY), {"product": "chat"})
    assert {c.conversation.id: c.positive for c in found.conversations} == {"down": False, "up": True, "changed-mind": True}
    assert found.conflicts == 1  # "both": excluded and counted
    down = next(c.conversation for c in found.conversations if c.conversation.id == "down")
    assert [(t.role, t.text) for t in down.turns] == TURNS and down.attributes == CHAT
    meta = found.metadata()
    assert (meta["source"], meta["conversations"], meta["positive"], meta["conflicts_excluded"]) == ("store", 3, 2, 1)
    assert meta["query_parameters"]["v0"] == "chat" and "attributes[{k0:String}]" in meta["query"]


def test_conflicts_can_count_as_negative_and_filters_and_window_select(rated_store: ClickHouseStore) -> None:
    found = labelled_from_store(rated_store, utc(T0 - DAY), utc(T0 + DAY), None, FeedbackLabelRules(on_conflict="negative"))
    assert {c.conversation.id: c.positive for c in found.conversations} == {
        "both": False,
        "changed-mind": True,
        "down": False,
        "other-product": False,
        "up": True,
    }
    assert found.conflicts == 0
    last_week = labelled_from_store(rated_store, utc(T0 - 8 * DAY), utc(T0 - DAY))
    assert [c.conversation.id for c in last_week.conversations] == ["last-week"]


def score(cid: str, score: int, scale: int = 4, at: float = T0) -> RatingRow:
    return RatingRow(cid, score, scale, "", at, {}, at + 1)


def test_scores_of_whole_conversations_become_answers_on_their_scale(rated_store: ClickHouseStore) -> None:
    rated_store.write_ratings(
        [
            score("down", 1),
            score("up", 4),
            score("changed-mind", 2, at=T0),
            score("changed-mind", 3, at=T0 + 30),  # the latest score counts
            score("both", 5, scale=5),  # another scale: left out, counted
            score("last-week", 1),
            score("other-product", 4),
        ]
    )
    rated_store.write_ratings([score("down", 1)])  # redelivered: counted once
    found = answers_from_store(rated_store, utc(T0 - DAY), utc(T0 + DAY), "Q0", 4, {"product": "chat"})
    assert [(c.id, c.turns[1].text) for c in found.labels.conversations] == [
        ("changed-mind", "It ships today."),
        ("down", "It ships today."),
        ("up", "It ships today."),
    ]
    assert {(lab.text_id, lab.question, lab.judge, lab.answer) for lab in found.labels.labels} == {
        ("changed-mind", "Q0", USERS, 3),
        ("down", "Q0", USERS, 1),
        ("up", "Q0", USERS, 4),
    }
    assert found.other_scale == 1
    meta = found.metadata()
    assert (meta["source"], meta["question"], meta["conversations"], meta["scores"]) == (
        "store",
        "Q0",
        3,
        {"1": 1, "3": 1, "4": 1},
    )
    assert meta["other_scale_excluded"] == 1 and len(meta["data_sha256"]) == 64
    on_five = answers_from_store(rated_store, utc(T0 - DAY), utc(T0 + DAY), "Q0", 5)
    assert [lab.answer for lab in on_five.labels.labels] == [5] and on_five.other_scale == 4


def test_the_data_hash_changes_with_the_labels_and_only_with_them(rated_store: ClickHouseStore) -> None:
    window = (utc(T0 - DAY), utc(T0 + DAY))
    first = labelled_from_store(rated_store, *window)
    assert labelled_from_store(rated_store, *window).data_sha256 == first.data_sha256
    rated_store.write_feedback([rating("up", 3, "down", T0 + 60)])  # the user changed their mind
    assert labelled_from_store(rated_store, *window).data_sha256 != first.data_sha256


# ---------------------------------------------------------------------------- the command


def write_llm_rubric_store(dsn: str, only_negative: str = "") -> None:
    """The real LLM-Rubric conversations with one thumb each from their human label and their human judge's Q0 as
    a rating on 1..4; ten of them scored again on a 1..5 scale, later (child process)."""
    real = load_split(LLM_RUBRIC, "real")
    human = satisfaction_labels(real)
    q0 = {lab.text_id: lab.answer for lab in real.labels if lab.question == "Q0"}
    conversations = load_real_conversations(LLM_RUBRIC / "real_data.json")
    records, feedback, scores = [], [], []
    for cid, positive in sorted(human.items()):
        if only_negative and positive:
            continue
        turns = [(t.role, t.text) for t in conversations[cid].turns]
        records.append(record(cid, turns, {"product": "research"}))
        last_assistant = max(i for i, (role, _) in enumerate(turns) if role == "assistant")
        feedback.append(rating(cid, last_assistant, "up" if positive else "down"))
        scores.append(score(cid, q0[cid]))
    scores += [score(r.conversation_id, 5, scale=5, at=T0 + 60) for r in records[:10]]
    with ClickHouseStore(dsn) as store:
        store.migrate()
        store.write_scores(records)
        store.write_feedback(feedback)
        store.write_ratings(scores)


def _store(tmp_path: Path, only_negative: bool = False) -> dict[str, str]:
    dsn = f"chdb://{tmp_path / 'clickhouse'}"
    code = "import sys\nfrom tests.integration.test_learn_from_store import write_llm_rubric_store as w\nw(*sys.argv[1:])\n"
    subprocess.run([sys.executable, "-c", code, dsn, "yes" if only_negative else ""], cwd=REPO, check=True, timeout=300)
    return {**recorded(), "CONVOWATCH_STORE__DSN": dsn}


WINDOW = ("--since", "2024-02-08", "--until", "2024-02-10")


def test_learn_from_the_store_records_where_its_labels_came_from(tmp_path, llm_rubric_files, domain) -> None:
    _, candidates = llm_rubric_files
    out = tmp_path / "rubricset.json"
    args = ["learn", "--from-store", *WINDOW, "--where", "product=research", "--domain", domain, "--candidates", candidates]
    r = convowatch(*args, "--out", out, "--n-sat", "3", "--n-dsat", "0", env=_store(tmp_path))
    assert r.returncode == 0, r.stderr
    human = satisfaction_labels(load_split(LLM_RUBRIC, "real"))
    n, positive = len(human), sum(human.values())
    assert f"from the store: {n} rated conversations" in r.stderr and f"({positive} positive; 0 rated both" in r.stderr
    source = RubricSet.load(out).metadata["training_data"]
    assert (source["source"], source["conversations"], source["positive"]) == ("store", n, positive)
    assert source["query_parameters"] == {
        "since": "2024-02-08T00:00:00+00:00",
        "until": "2024-02-10T00:00:00+00:00",
        "k0": "product",
        "v0": "research",
    }
    assert len(source["data_sha256"]) == 64 and json.dumps(source)  # plain data


def test_learn_from_the_store_refuses_a_one_class_window(tmp_path, llm_rubric_files, domain) -> None:
    _, candidates = llm_rubric_files
    r = convowatch(
        "learn", "--from-store", *WINDOW, "--domain", domain, "--candidates", candidates, "--out", tmp_path / "o.json",
        env=_store(tmp_path, only_negative=True),
    )  # fmt: skip
    assert "needs both positive and negative" in error_line(r) or "both classes" in error_line(r), r.stderr
    assert not (tmp_path / "o.json").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--from-store"], "--from-store needs --since"),
        (["--data", "DATA", "--from-store", *WINDOW], "either --data FILE or --from-store"),
        ([], "either --data FILE or --from-store"),
        (["--from-store", *WINDOW, "--where", "product"], "'product' is not KEY=VALUE"),
        (["--from-store", "--since", "yesterday"], "--since 'yesterday'"),
    ],
)
def test_learn_refuses_bad_source_options(tmp_path, domain, args, message) -> None:
    data = tmp_path / "x.jsonl"
    data.write_text('{"conversation_id": "a", "label": "positive"}\n')
    args = [str(data) if a == "DATA" else a for a in args]
    r = convowatch(
        "learn",
        *args,
        "--domain",
        domain,
        "--out",
        tmp_path / "o.json",
        env={**recorded(), "CONVOWATCH_STORE__DSN": f"chdb://{tmp_path}/ch"},
    )
    assert message in r.stderr, r.stderr
    assert r.returncode == 2


def test_calibrate_adapt_from_the_store_asks_the_judge_and_records_where_its_labels_came_from(tmp_path, calibrator) -> None:
    cache = tmp_path / "answers.sqlite"
    adapt = ["calibrate", "adapt", "--calibrator", calibrator, "--from-store", *WINDOW, "--where", "product=research"]
    r = convowatch(*adapt, "--questions", QUESTIONS, "--strength", "10", "--cache", cache, "--out", tmp_path / "adapted",
                   env=_store(tmp_path))  # fmt: skip
    assert r.returncode == 0, r.stderr
    real = load_split(LLM_RUBRIC, "real")
    q0 = [lab.answer for lab in real.labels if lab.question == "Q0"]
    assert f"from the store: {len(q0) - 10} conversations" in r.stderr and "10 scored on another scale, left out" in r.stderr
    adapted = OrdinalCalibrator.load(tmp_path / "adapted")
    assert adapted.adaptation_[-1]["conversations"] == len(q0) - 10 and USERS in adapted.judges_
    provenance = json.loads((tmp_path / "adapted" / "provenance.json").read_text())
    assert provenance["adapted_from"] in r.stdout and provenance["strength"] == 10
    labels = provenance["labels"]
    assert (labels["source"], labels["question"], labels["conversations"], labels["other_scale_excluded"]) == (
        "store", "Q0", len(q0) - 10, 10
    )  # fmt: skip
    assert sum(labels["scores"].values()) == len(q0) - 10 and len(labels["scores"]) >= 3
    assert labels["query_parameters"]["v0"] == "research" and len(labels["data_sha256"]) == 64


def test_calibrate_adapt_from_the_store_refuses_a_window_with_one_score_and_bad_options(tmp_path, calibrator) -> None:
    env = _store(tmp_path)
    adapt = ["calibrate", "adapt", "--calibrator", calibrator, "--questions", QUESTIONS, "--out", tmp_path / "x"]
    assert "no conversation on a 1..4 scale" in error_line(convowatch(*adapt, "--from-store", "--since", "2020-01-01",
                                                                      "--until", "2020-01-02", env=env))  # fmt: skip
    one_score = convowatch(*adapt, "--from-store", *WINDOW, "--question", "Q8", env=env)  # Q8 has 3 options: none on 1..3
    assert "no conversation on a 1..3 scale" in error_line(one_score)
    assert "'Q9' is not one of the calibrator's questions" in error_line(
        convowatch(*adapt, "--from-store", *WINDOW, "--question", "Q9", env=env)
    )
    assert "--from-store needs --since" in error_line(convowatch(*adapt, "--from-store", env=env))
    assert "use them with --from-store" in error_line(convowatch(*adapt, "--labels", QUESTIONS, *WINDOW, env=env))
    assert "give one of --labels FILE, --from-store" in error_line(convowatch(*adapt, env=env))
    assert not (tmp_path / "x").exists()


def test_calibrate_train_from_the_store_fits_the_main_question_on_the_users_scores(tmp_path) -> None:
    train = ["calibrate", "train", "--from-store", *WINDOW, "--questions", QUESTIONS, "--grid", "none"]
    r = convowatch(*train, "--cache", tmp_path / "answers.sqlite", "--out", tmp_path / "trained", env=_store(tmp_path))
    assert r.returncode == 0, r.stderr
    model = OrdinalCalibrator.load(tmp_path / "trained")
    assert model.main_question == "Q0" and list(model.judges_) == [USERS] and model.version_ in r.stdout
    provenance = json.loads((tmp_path / "trained" / "provenance.json").read_text())["labels"]
    assert (provenance["source"], provenance["question"], provenance["other_scale_excluded"]) == ("store", "Q0", 10)
    assert "fitted questions Q0" in r.stderr
    network = convowatch(*train, "--model", "network", "--out", tmp_path / "n", env=_store(tmp_path))
    assert "--from-store trains --model ordinal" in network.stderr and network.returncode == 2
    both = convowatch(*train, "--judge-answers", QUESTIONS, "--out", tmp_path / "b", env=_store(tmp_path))
    assert "give one of --from-store, or both --judge-answers and --human-labels" in both.stderr
