"""`convowatch report`: windows, numbers read back from the real chDB engine, images, the page, errors."""

from __future__ import annotations

import dataclasses
import functools
import html
import math
import re
import struct
import subprocess
import sys
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from stream.records import DimensionPrediction, RubricHit, ScoreRecord
from stream.report.data import (
    IMAGES,
    PAGE,
    Counts,
    ReportError,
    Window,
    bucket_seconds,
    load_report,
    resolve_window,
)
from stream.report.render import write_report
from tests.chdb_fixture import chdb_dsn, chdb_store, store_factory  # noqa: F401
from tests.infra import convowatch
from tests.integration.test_store import T0, closed, scored, unscored, utc
from tests.pipeline import REPO

NOW = datetime(2024, 2, 10, 12, 0, tzinfo=UTC)
DAY = Window(utc(T0 - 3600), utc(T0 + 86400))


def at(record, closed_at: float):
    """``record`` closed at ``closed_at`` instead of the fixture's fixed time."""
    c = record.conversation
    return dataclasses.replace(record, conversation=closed(c.conversation_id, c.attributes, closed_at=closed_at))


def dims(*values: float) -> tuple[DimensionPrediction, ...]:
    return tuple(DimensionPrediction(f"Q{i + 1}", (0.25, 0.25, 0.25, 0.25), v) for i, v in enumerate(values))


def fixture_records():
    """Two model versions over 6 hours; p_dsat chosen so the worst order and the rates are known by hand."""
    a, b = {"product": "shop", "model_version": "a"}, {"product": "shop", "model_version": "b"}
    hits = (RubricHit("dsat.rude", "dsat", -8.0), RubricHit("dsat.vague", "dsat", -2.0), RubricHit("sat.helpful", "sat", 1.0))
    return [
        at(scored("c1", "sat", 12.0, 0.10, 3.6, attributes=a, dimensions=dims(3.5, 3.0)), T0 + 600),
        at(scored("c2", "dsat", -9.0, 0.90, 1.4, attributes=a, rubrics=hits, dimensions=dims(1.5, 2.0)), T0 + 3600),
        at(scored("c3", "uncertain", 1.0, 0.40, 2.6, attributes=b, dimensions=dims(2.5, 2.5)), T0 + 7200),
        at(
            scored(
                "<script>alert(1)</script>",
                "uncertain",
                -2.0,
                0.60,
                2.2,
                attributes=b,
                rubrics=(RubricHit("<b>rubric</b>", "dsat", -6.0),),
            ),
            T0 + 14400,
        ),
        at(unscored("c5", attributes=b), T0 + 18000),
        at(scored("outside", "dsat", -5.0, 0.99, 1.0, attributes=a), T0 + 3 * 86400),  # after the window
    ]


@pytest.fixture
def store(store_factory):
    s = store_factory()
    s.write_scores(fixture_records())
    return s


# --- the window ----------------------------------------------------------------------------


def test_durations_count_back_from_now_and_iso_times_are_utc() -> None:
    assert resolve_window("6h", now=NOW) == Window(NOW - timedelta(hours=6), NOW)
    assert resolve_window("2024-02-09", "2024-02-09T12:00:00+02:00", now=NOW) == Window(
        datetime(2024, 2, 9, tzinfo=UTC), datetime(2024, 2, 9, 10, tzinfo=UTC)
    )


@pytest.mark.parametrize("since, until, message", [
    ("yesterday", None, "neither a duration"),
    ("0m", None, "must be positive"),
    ("1h", "2h", "is not before"),
    ("1800-01-01", None, "outside 1970-01-01"),
])  # fmt: skip
def test_bad_windows_are_refused_with_the_reason(since: str, until: str | None, message: str) -> None:
    with pytest.raises(ReportError, match=message):
        resolve_window(since, until, now=NOW)


def test_buckets_are_round_and_keep_the_axis_short() -> None:
    assert bucket_seconds(3600) == 120  # 1 min would need 61 buckets
    for span in (10, 3600, 6 * 3600, 7 * 86400, 400 * 86400):
        b = bucket_seconds(span)
        assert span / b <= 59, (span, b)


# --- numbers -----------------------------------------------------------------------------------


def test_totals_rates_and_worst_match_the_store(store) -> None:
    data = load_report(store, DAY)
    t = data.totals
    assert (t.conversations, t.scored, t.unscored, t.sat, t.dsat, t.uncertain, t.calibrated) == (5, 4, 1, 1, 1, 2, 4)
    independent = store.query(
        "SELECT count() AS n FROM latest_scores WHERE closed_at >= {a:DateTime64(6, 'UTC')} AND closed_at < {b:DateTime64(6, 'UTC')}",
        {"a": DAY.since, "b": DAY.until},
    )[0]["n"]
    assert t.conversations == independent
    p = [0.10, 0.90, 0.40, 0.60]
    assert t.calibrated_dsat_rate == pytest.approx(sum(p) / 4)
    lo, hi = t.calibrated_dsat_interval
    se = math.sqrt((sum(x * x for x in p) / 4 - (sum(p) / 4) ** 2) / 4)
    assert (lo, hi) == (pytest.approx(0.5 - 1.959964 * se), pytest.approx(0.5 + 1.959964 * se))
    by_version = dict(data.by("model_version"))
    assert by_version["a"].calibrated_dsat_rate == pytest.approx(0.5)
    assert by_version["b"].conversations == 3
    assert [w.conversation_id for w in data.worst] == ["c2", "<script>alert(1)</script>", "c3", "c1"]
    # a DSAT hit is a rating >= 5 (score <= -5): c2's "vague" (-2) is not one
    assert data.worst[0].dsat_hits == (RubricHit("dsat.rude", "dsat", -8.0),)
    assert {d.question_id: d.n for d in data.dimensions} == {"Q1": 3, "Q2": 3}


def test_sampled_rows_are_weighted_and_unsampled_ones_count_as_volume_only(store_factory) -> None:
    """Model version a judged at π = 0.25 (each of its rows stands for 4), b fully: rates weight by 1/π."""
    store = store_factory()
    a, b = {"product": "shop", "model_version": "a"}, {"product": "shop", "model_version": "b"}
    sampled = [
        dataclasses.replace(
            at(scored(f"a{i}", "dsat", -3.0, 0.8, 1.5, attributes=a), T0 + 600),
            inclusion_probability=0.25,
            sampling_reason="rate",
        )
        for i in range(2)
    ]
    left_out = [
        dataclasses.replace(
            at(ScoreRecord(closed(f"u{i}", a), "unsampled", "v1", "recorded:test", "rs1", "cal1", T0 + 100, 0), T0 + 600),
            inclusion_probability=0.25,
            sampling_reason="rate",
        )
        for i in range(6)
    ]
    full = [at(scored(f"b{i}", "sat", 3.0, 0.2, 3.5, attributes=b), T0 + 600) for i in range(8)]
    store.write_scores(sampled + left_out + full)
    t = load_report(store, DAY).totals
    assert (t.conversations, t.scored, t.unsampled, t.dsat, t.sat) == (16, 10, 6, 2, 8)  # unsampled: volume, never scored
    # 2 judged at π = 0.25 stand for 8 conversations with P 0.8; 8 judged at π = 1 have P 0.2: the rate is 0.5, not 0.32
    assert t.calibrated_dsat_rate == pytest.approx((8 * 0.8 + 8 * 0.2) / 16)
    assert t.share("dsat") == pytest.approx(0.5) and t.yield_rate == pytest.approx(1.0)
    assert t.calibrated_weight == pytest.approx(16) and t.sampling_s0 == pytest.approx(2 * 0.75 / 0.0625)
    lo, hi = t.calibrated_dsat_interval
    assert lo < 0.5 < hi


def test_filters_keep_one_model_version(store) -> None:
    data = load_report(store, DAY, model_version="a")
    assert data.totals.conversations == 2 and {w.conversation_id for w in data.worst} == {"c1", "c2"}


def test_counts_without_calibration_have_no_rate() -> None:
    assert Counts(conversations=3, scored=3, uncertain=3).calibrated_dsat_rate is None
    assert Counts().calibrated_dsat_interval is None


# --- images and page ----------------------------------------------------------------------------


def png_size(path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", path
    return struct.unpack(">II", head[16:24])


def test_the_page_shows_the_images_totals_and_escaped_worst_conversations(store, tmp_path) -> None:
    page = write_report(load_report(store, DAY), tmp_path)
    text = page.read_text(encoding="utf-8")
    for name in IMAGES.values():
        width, height = png_size(tmp_path / name)
        assert width >= 800 and height >= 400
        assert f'src="{name}"' in text
    assert "<script>alert(1)</script>" not in text and "<b>rubric</b>" not in text
    assert html.escape("<script>alert(1)</script>") in text and html.escape("<b>rubric</b>") in text
    assert "dsat.rude" in text and "outside" not in text
    assert re.search(r"50\.0%", text)  # the calibrated dissatisfaction rate


def test_an_empty_window_writes_a_page_that_says_so_and_no_stale_images(store, tmp_path) -> None:
    write_report(load_report(store, DAY), tmp_path)
    empty = Window(utc(T0 - 10 * 86400), utc(T0 - 9 * 86400))
    page = write_report(load_report(store, empty), tmp_path)
    assert "no conversation closed in this window" in page.read_text(encoding="utf-8").lower()
    assert not any((tmp_path / name).exists() for name in IMAGES.values())


def test_a_store_without_the_database_is_a_clear_error(store_factory) -> None:
    with pytest.raises(ReportError, match="nothing has been stored"):
        load_report(store_factory(migrate=False), DAY)


# --- the command --------------------------------------------------------------------------------


def test_the_command_refuses_a_bad_window_with_exit_2(tmp_path) -> None:
    done = convowatch("report", "--since", "yesterday", "--out", str(tmp_path))
    assert done.returncode == 2
    assert done.stderr.startswith("convowatch: error: --since 'yesterday' is neither a duration")


def test_the_command_renders_a_store_written_by_another_process(tmp_path) -> None:
    """The embedded store is one-process: write it in a child, report from another (as after `convowatch sink`)."""
    dsn = f"chdb://{tmp_path / 'clickhouse'}"
    code = (
        "import sys\n"
        "from stream.store import ClickHouseStore\n"
        "from tests.integration.test_report import fixture_records\n"
        "with ClickHouseStore(sys.argv[1]) as s:\n"
        "    s.migrate(); s.write_scores(fixture_records())\n"
    )
    subprocess.run([sys.executable, "-c", code, dsn], cwd=REPO, check=True, timeout=300)
    done = convowatch(
        "report",
        "--since",
        "2024-02-09T00:00:00Z",
        "--until",
        "2024-02-11",
        "--out",
        str(tmp_path / "report"),
        env={"CONVOWATCH_STORE__DSN": dsn},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("5 conversations (4 scored, 1 unscored); wrote")
    assert (tmp_path / "report" / PAGE).is_file() and (tmp_path / "report" / IMAGES["overview"]).is_file()


# --- the real conversations ---------------------------------------------------------------------

REAL_DATA = REPO / "data" / "llm-rubric"
WEEK_END = datetime(2024, 3, 1, tzinfo=UTC).timestamp()
WEEK_START = WEEK_END - 7 * 86400
LABEL_PIXELS = {
    "sat": (0x2A, 0x9D, 0x5C),
    "dsat": (0xD1, 0x49, 0x5B),
    "uncertain": (0xE9, 0xA2, 0x3B),
    "unscored": (0x9A, 0xA5, 0xB1),
}


@functools.lru_cache(maxsize=1)
def real_records() -> tuple[ScoreRecord, ...]:
    """The 223 real LLM-Rubric conversations scored as the worker scores them, closed evenly over a week.

    Replayed as events and assembled by the real assembler; scored by `ConversationScorer` with the
    recorded GPT-3.5 judge, the Q1-Q8 rubric set (Q6 redundancy and Q7 verbosity as DSAT rubrics, so
    there are DSAT hits) fitted on the human labels at P = 0.75, and a calibrator trained on the synthetic
    split. Model version ``model-b`` takes two in three conversations from 40% of the week on; the product
    says whether the assistant showed references. Every 45th conversation is stored unscored with the
    reason a judge outage gives (`ConversationScorer.unscored`, as the worker does when retries run out).
    """
    from scorers.calibration import CalibrationNetwork
    from scorers.conversation import Conversation
    from scorers.datasets.llm_rubric import QUESTIONS_FILE, dimension_rubric_set, load_split, satisfaction_labels
    from scorers.judges.recorded import RecordedJudge
    from scorers.rubrics import Polarity, Rubric, RubricSet, Scale
    from stream.assembly import ConversationAssembler
    from stream.metrics import ServiceMetrics
    from stream.replay.sources import llm_rubric_events
    from stream.scoring import ConversationScorer
    from stream.settings import AssemblySettings, ScoringSettings

    judge = RecordedJudge.from_tsv(REAL_DATA / "gpt-3.5-turbo-16k_real_evaluations_FIXED.tsv")
    rubrics = tuple(
        Rubric(r.id, r.text, Polarity.DSAT, Scale(r.scale.keys, r.scale.labels, tuple(reversed(r.scale.scores))))
        if r.id in ("Q6", "Q7") else r
        for r in dimension_rubric_set(REAL_DATA / QUESTIONS_FILE).rubrics
    )  # fmt: skip
    labels = satisfaction_labels(load_split(REAL_DATA, "real"))
    ids = sorted(labels)
    unfitted = RubricSet(rubrics)
    netsats = unfitted.netsats(judge, (Conversation(i, ()) for i in ids))
    rubric_set = unfitted.fit_windows(netsats, np.array([labels[i] for i in ids]), precision=0.75)
    calibrator = CalibrationNetwork(seed=0).fit(load_split(REAL_DATA, "synth"))
    scorer = ConversationScorer(
        judge, rubric_set, calibrator, ScoringSettings(questions=REAL_DATA / QUESTIONS_FILE), ServiceMetrics()
    )

    assembler, states, closed_conversations = ConversationAssembler(AssemblySettings()), {}, []
    for item in llm_rubric_events(REAL_DATA / "real_data.json"):
        cid = item.event.conversation_id
        step = assembler.apply(states.get(cid), item.event, 0, item.at)
        states[cid] = step.state
        if step.closed is not None:
            closed_conversations.append(step.closed)
    n = len(closed_conversations)
    out = []
    for i, c in enumerate(closed_conversations):
        t = WEEK_START + (i + 0.5) * (WEEK_END - WEEK_START) / n
        attributes = {
            **c.attributes,
            "model_version": "model-b" if i >= 0.4 * n and i % 3 else "model-a",
            "product": "plain-chat" if c.attributes["dialogue_version"] == "0" else "chat-with-sources",
        }
        c = dataclasses.replace(c, attributes=attributes, closed_at=t, first_event_at=t - 60, last_event_at=t - 1)
        record = scorer.unscored(c, "JudgeUnavailable: connection refused", 5) if i % 45 == 7 else scorer.score_once(c)
        out.append(dataclasses.replace(record, scored_at=t + 2))
    return tuple(out)


def page_totals(text: str) -> dict[str, str]:
    return dict(re.findall(r'data-total="(\w+)">([^<]*)<', text))


def test_a_week_of_real_conversations(store_factory, tmp_path) -> None:
    """Real scored conversations, delivered twice: the page's totals, worst table and images hold up against the records."""
    from matplotlib.image import imread

    from scorers.datasets.llm_rubric import QUESTIONS_FILE
    from stream.report.data import question_names

    records = real_records()
    assert len(records) == 223
    store = store_factory()
    store.write_scores(records)
    store.write_scores(records)  # re-delivered: must not count twice
    window = Window(utc(WEEK_START + 86400), utc(WEEK_END))  # the last six of the seven days
    data = load_report(store, window, dimension_names=question_names(REAL_DATA / QUESTIONS_FILE))
    page = write_report(data, tmp_path)
    text = page.read_text(encoding="utf-8")

    inside = [r for r in records if window.since.timestamp() <= r.conversation.closed_at < window.until.timestamp()]
    scored_ = [r for r in inside if r.status == "scored"]
    expected = {
        "conversations": len(inside), "scored": len(scored_), "unscored": len(inside) - len(scored_),
        **{label: sum(r.label == label for r in scored_) for label in ("sat", "dsat", "uncertain")},
        "calibrated": len(scored_),
    }  # fmt: skip
    assert 150 < len(inside) < 223 and all(expected[k] > 0 for k in expected)
    shown = page_totals(text)
    assert {k: int(shown[k]) for k in expected} == expected
    assert (
        store.query("SELECT count() AS n FROM latest_scores WHERE closed_at >= {a:DateTime64(6, 'UTC')}", {"a": window.since})[0][
            "n"
        ]
        == expected["conversations"]
    )
    p = sum(r.dissatisfaction_probability for r in scored_) / len(scored_)
    assert data.totals.calibrated_dsat_rate == pytest.approx(p)
    assert shown["calibrated_dsat_rate"] == f"{p:.1%}"

    worst = sorted(scored_, key=lambda r: (-r.dissatisfaction_probability, r.netsat, r.conversation_id))[:20]
    assert re.findall(r'<tr data-conversation-id="([^"]+)"', text) == [r.conversation_id for r in worst]
    for row, record in zip(data.worst, worst):
        hits = sorted((h for h in record.rubrics if h.polarity == "dsat" and h.score <= -5), key=lambda h: (h.score, h.rubric_id))
        assert row.dsat_hits == tuple(hits)
    assert any(row.dsat_hits for row in data.worst)
    assert "Q6 · redundancy" in text and "Q0 · overall satisfaction" in text

    for name in IMAGES.values():
        assert f'src="{name}"' in text
        width, height = png_size(tmp_path / name)
        assert width >= 1000 and height >= 600, (name, width, height)
    overview = (imread(tmp_path / IMAGES["overview"])[..., :3] * 255).round().astype(int).reshape(-1, 3)
    assert all(
        np.all(overview == rgb, axis=1).any() for rgb in LABEL_PIXELS.values()
    )  # the stacked volume bars show all four outcomes

    b = load_report(store, window, model_version="model-b")
    assert b.totals.conversations == sum(r.conversation.attributes["model_version"] == "model-b" for r in inside)
    assert {g.model_version for g in b.groups} == {"model-b"}
