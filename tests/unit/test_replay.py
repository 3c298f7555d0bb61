"""Replay sources on the real corpora (shipped LLM-Rubric data, shared USS files), JSONL files, pacing, synthetic load."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from scorers.datasets.uss import UssFormatError, read_uss, uss_labelled
from stream.contract import EndEvent, InvalidEvent, TurnEvent, encode_event, parse_event
from stream.replay.sources import (
    DEFAULT_START,
    LLM_RUBRIC_REAL_DATA,
    ReplayError,
    ReplayItem,
    jsonl_events,
    llm_rubric_events,
    object_id_time,
    paced,
    synthetic_events,
    uss_events,
)
from tests.data_paths import LLM_RUBRIC, SHARED_DATA

SHIPPED = LLM_RUBRIC_REAL_DATA.parent
USS = SHARED_DATA / "uss"


def assert_contract_items(items: list[ReplayItem]) -> None:
    """Every item is a valid contract event whose bytes and key are what the worker will check."""
    for item in items:
        assert item.error is None
        assert parse_event(item.raw, key=item.key) == item.event
        assert encode_event(item.event) == item.raw
        assert item.at == item.event.timestamp
    assert all(a.at <= b.at for a, b in zip(items, items[1:])), "not in event-time order"


def by_conversation(items: list[ReplayItem]) -> dict[str, list[ReplayItem]]:
    out: dict[str, list[ReplayItem]] = {}
    for item in items:
        out.setdefault(item.event.conversation_id, []).append(item)
    return out


# --- LLM-Rubric --------------------------------------------------------------------


def test_shipped_llm_rubric_data_is_the_unchanged_release() -> None:
    shared = sorted(p.name for p in LLM_RUBRIC.iterdir())
    assert "LICENSE" in shared and "real_data.json" in shared
    for name in shared:
        assert (SHIPPED / name).read_bytes() == (LLM_RUBRIC / name).read_bytes(), name
    readme = (SHIPPED / "README.md").read_text(encoding="utf-8")
    assert "70d56fc4" in readme and "MIT" in readme
    assert not (SHIPPED.parent / "uss").exists()  # USS is not redistributable


def test_llm_rubric_replays_all_223_conversations_in_time_order() -> None:
    raw = json.loads(LLM_RUBRIC_REAL_DATA.read_text(encoding="utf-8"))
    items = list(llm_rubric_events())
    conversations = by_conversation(items)
    assert len(conversations) == 223 == len(raw)
    assert len(items) == sum(len(c["messages"]) + 1 for c in raw)
    assert_contract_items(items)
    for c in raw:
        conv = conversations[c["_id"]]
        turns, end = conv[:-1], conv[-1]
        assert [(t.event.role, t.event.text) for t in turns] == [(m["role"], m["content"]) for m in c["messages"]]
        assert [t.event.turn_index for t in turns] == list(range(len(c["messages"])))
        assert isinstance(end.event, EndEvent) and end.event.cause == "end"
        assert end.event.attributes == {
            "dialogue_version": str(c["dialogue_version"]),
            "topic": c["topic"],
            "product": "llm-rubric-demo",
            "model_version": f"variant-{c['dialogue_version']}",
        }
    # The release spans 2024-02-09 .. 2024-02-12 and its conversations overlap in time: the stream interleaves them.
    switches = sum(a.event.conversation_id != b.event.conversation_id for a, b in zip(items, items[1:]))
    assert switches > 223


def test_llm_rubric_times_come_from_the_object_id() -> None:
    """65c5b4b9... : 0x65c5b4b9 = 1707455673 s = 2024-02-09 05:14:33 UTC (6*16^7 + 5*16^6 + ... by hand)."""
    assert 6 * 16**7 + 5 * 16**6 + 12 * 16**5 + 5 * 16**4 + 11 * 16**3 + 4 * 16**2 + 11 * 16 + 9 == 1707455673
    start = datetime(2024, 2, 9, 5, 14, 33, tzinfo=UTC).timestamp()
    assert start == 1707455673 == object_id_time("65c5b4b9f174b2897703736a")
    conv = by_conversation(list(llm_rubric_events(turn_gap_s=45.0)))["65c5b4b9f174b2897703736a"]
    assert [i.at for i in conv] == [start + 45.0 * k for k in range(len(conv))]
    assert conv[0].raw.count(b'"timestamp":"2024-02-09T05:14:33.000000Z"') == 1
    assert conv[0].at == min(i.at for i in llm_rubric_events())  # it is the release's first conversation
    with pytest.raises(ValueError, match="ObjectId"):
        object_id_time("65C5B4B9F174B2897703736A0")


def test_llm_rubric_extra_attributes_and_bad_arguments(tmp_path: Path) -> None:
    first = next(llm_rubric_events(attributes={"locale": "en-US", "product": "staging"}))
    assert first.event.attributes["locale"] == "en-US" and first.event.attributes["product"] == "staging"
    with pytest.raises(ValueError, match="turn_gap_s"):
        llm_rubric_events(turn_gap_s=0)
    raw = json.loads(LLM_RUBRIC_REAL_DATA.read_text(encoding="utf-8"))[:2]
    raw[1]["_id"] = "not-an-object-id"
    bad = tmp_path / "real_data.json"
    bad.write_text(json.dumps(raw), encoding="utf-8")
    with pytest.raises(ReplayError, match="not-an-object-id.*ObjectId"):
        llm_rubric_events(bad)
    raw[1]["_id"], raw[1]["messages"] = "65c5b4b9f174b2897703736b", [{"role": "bot", "content": "hi"}]
    bad.write_text(json.dumps(raw), encoding="utf-8")
    with pytest.raises(ReplayError, match=r"conversation \[1\].*bot"):
        llm_rubric_events(bad)
    with pytest.raises(ReplayError, match="cannot read"):
        llm_rubric_events(tmp_path / "missing.json")


# --- USS ---------------------------------------------------------------------------------


def test_uss_events_ids_attributes_and_times() -> None:
    items = list(uss_events(USS / "MWOZ.txt", start=DEFAULT_START, turn_gap_s=30.0, conversation_gap_s=60.0))
    conversations = by_conversation(items)
    assert sorted(conversations) == [f"MWOZ-{k:04d}" for k in range(1, 1001)]
    assert len(items) == 22108 + 1000  # every turn line (counted independently in test_uss_data) and one end per dialogue
    assert_contract_items(items)
    first = conversations["MWOZ-0001"]
    assert first[0].event == TurnEvent(
        "MWOZ-0001", 0, "user", "I'm looking for a cheap restaurant in the east part of town.", DEFAULT_START,
        {"product": "uss-mwoz", "dataset": "mwoz", "uss_overall_mean": "2.75"},  # OVERALL 3,3,2,3
    )  # fmt: skip
    assert first[1].event.role == "assistant"
    assert [i.event.turn_index for i in first[:-1]] == list(range(13))  # 13 turns, then the OVERALL line
    assert first[-1].event == EndEvent("MWOZ-0001", DEFAULT_START + 13 * 30.0, "end", first[0].event.attributes)
    assert conversations["MWOZ-0002"][0].at == DEFAULT_START + 60.0
    assert conversations["MWOZ-1000"][0].at == DEFAULT_START + 999 * 60.0
    assert not any(isinstance(i.event, TurnEvent) and i.event.text == "OVERALL" for i in items)
    sgd = next(uss_events(USS / "SGD.txt"))
    assert sgd.event.conversation_id == "SGD-0001" and sgd.event.attributes["product"] == "uss-sgd"


def test_a_replayed_uss_dialogue_has_its_learning_data_id_and_turns() -> None:
    """The learning data (read_uss -> uss_labelled) and the replay name and hold each dialogue the same way."""
    path = USS / "SGD.txt"
    conversations = by_conversation(list(uss_events(path)))
    labelled, middle = uss_labelled(read_uss(path))
    assert len(labelled) + len(middle) == len(conversations) == 1000
    for item in labelled:
        replayed = conversations[item.conversation.id]
        assert [(i.event.role, i.event.text) for i in replayed[:-1]] == [(t.role, t.text) for t in item.conversation.turns]
    for d in middle:
        assert conversations[d.id][0].event.attributes["uss_overall_mean"] == f"{d.mean_overall:.2f}"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("USER\thi\t\t3\nUSER\tOVERALL\t\t3\n\nUSER\tcaf\xe9\t\t3\n", r"bad\.txt:4: not UTF-8"),
        ("USER\thi\t\t3\nSYSTEM\tok\t\t\n", r"bad\.txt:2: the dialogue starting at line 1 has no"),
        ("USER\thi\t\t3,3\nSYSTEM\thello\t\t4\nUSER\tOVERALL\t\t3\n", r"bad\.txt:2: a SYSTEM line carries ratings"),
    ],
)
def test_malformed_uss_files_are_replay_errors_naming_file_and_line(tmp_path: Path, content: str, message: str) -> None:
    """The library parser refuses the file (all its cases: tests/unit/test_uss_data.py); replay says the same as a ReplayError."""
    path = tmp_path / "bad.txt"
    path.write_bytes(content.encode("latin-1"))
    with pytest.raises(UssFormatError, match=message) as library:
        read_uss(path)
    with pytest.raises(ReplayError, match=message) as replay:
        uss_events(path)
    assert str(replay.value) == str(library.value)


def test_a_missing_uss_file_is_a_replay_error(tmp_path: Path) -> None:
    with pytest.raises(ReplayError, match=r"missing\.txt: cannot read"):
        uss_events(tmp_path / "missing.txt")


def test_uss_accepts_crlf(tmp_path: Path) -> None:
    path = tmp_path / "tiny.txt"
    path.write_bytes(b"USER\thi\tgreet\t3,4\r\nSYSTEM\thello\t\t\r\nUSER\tOVERALL\t\t4,5\r\n\r\n")
    items = list(uss_events(path))
    assert [i.event.conversation_id for i in items] == ["tiny-0001"] * 3
    assert items[1].event.text == "hello" and items[2].event.attributes["uss_overall_mean"] == "4.50"


# --- JSONL -----------------------------------------------------------------------------


def test_jsonl_good_and_bad_lines(tmp_path: Path) -> None:
    good_turn = b'{"schema_version": 1, "type": "turn", "conversation_id": "c1", "turn_index": 0, "role": "user", "text": "hi", "timestamp": "2024-02-09T05:14:33+01:00"}'
    bad_role = b'{"schema_version": 1, "type": "turn", "conversation_id": "c1", "turn_index": 1, "role": "bot", "text": "x", "timestamp": "2024-02-09T05:15:00Z"}'
    good_end = b'{"schema_version":1,"type":"end","conversation_id":"c1","timestamp":"2024-02-09T05:16:00Z"}'
    path = tmp_path / "events.jsonl"
    path.write_bytes(good_turn + b"\n" + b"{not json\n" + b"\n" + bad_role + b"\r\n" + b"\xff\xfe\n" + good_end)
    items = list(jsonl_events(path))
    assert [i.where for i in items] == [f"{path}:{n}" for n in (1, 2, 4, 5, 6)]
    assert [i.error.reason if i.error else None for i in items] == [None, "not_json", "unknown_role", "invalid_utf8", None]
    assert items[0].raw == good_turn and items[0].key == b"c1"  # sent byte for byte, not re-encoded
    assert items[0].at == datetime(2024, 2, 9, 4, 14, 33, tzinfo=UTC).timestamp()
    assert items[2].raw == bad_role and items[2].key == b"c1" and items[2].event is None
    assert items[1].key is None and items[1].at == items[0].at  # a bad line keeps the previous time
    assert isinstance(items[4].event, EndEvent) and items[4].raw == good_end
    assert isinstance(items[2].error, InvalidEvent) and "bot" in items[2].error.detail


def test_jsonl_limits_and_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "big.jsonl"
    path.write_bytes(encode_event(TurnEvent("c", 0, "user", "x" * 100, 0.0, {})) + b"\n")
    assert next(jsonl_events(path)).error is None
    assert next(jsonl_events(path, max_text_bytes=99)).error.reason == "oversized_text"
    assert next(jsonl_events(path, max_event_bytes=50)).error.reason == "too_large"
    with pytest.raises(ReplayError, match="no such file"):
        jsonl_events(tmp_path / "nope.jsonl")


# --- pacing ------------------------------------------------------------------------------


class FakeClock:
    """Pacing is pure timing logic: a clock that moves only when slept on (or when the test says)."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def item(at: float, error: bool = False) -> ReplayItem:
    return ReplayItem(at, None, b"", None, InvalidEvent("not_json", "x") if error else None)


def test_paced_divides_gaps_by_speed() -> None:
    fake = FakeClock()
    out = list(paced([item(0), item(10), item(10), item(25), item(20)], speed=5, clock=fake.clock, sleep=fake.sleep))
    assert [i.at for i in out] == [0, 10, 10, 25, 20]
    assert fake.sleeps == pytest.approx([2.0, 3.0])  # equal and past times: no sleep
    assert fake.now == pytest.approx(1005.0)


def test_paced_schedule_absorbs_the_callers_time() -> None:
    fake = FakeClock()
    stream = paced([item(100), item(101), item(103), item(104)], speed=1, clock=fake.clock, sleep=fake.sleep)
    next(stream)
    fake.now += 0.25  # sending took a quarter second
    next(stream)
    fake.now += 5.0  # a slow send: the next item is already late
    next(stream)
    next(stream)
    assert fake.sleeps == pytest.approx([0.75])


def test_paced_fast_modes_and_errors() -> None:
    for speed in (0, float("inf")):
        fake = FakeClock()
        assert len(list(paced([item(0), item(1e6)], speed, fake.clock, fake.sleep))) == 2
        assert fake.sleeps == []
    fake = FakeClock()
    list(paced([item(0, error=True), item(50), item(0, error=True), item(60)], 10, fake.clock, fake.sleep))
    assert fake.sleeps == pytest.approx([1.0])  # error items neither wait nor set the origin
    for bad in (-1, float("nan")):
        with pytest.raises(ValueError, match="speed"):
            list(paced([item(0)], bad))


# --- synthetic -------------------------------------------------------------------------------


def test_synthetic_is_deterministic_and_interleaved() -> None:
    a = list(synthetic_events(120, 6, seed=3, text_bytes=150))
    assert [i.raw for i in a] == [i.raw for i in synthetic_events(120, 6, seed=3, text_bytes=150)]
    assert [i.raw for i in a] != [i.raw for i in synthetic_events(120, 6, seed=4, text_bytes=150)]
    assert len(a) == 120 * 7
    assert_contract_items(a)
    assert all(b.at > x.at for x, b in zip(a, a[1:]))
    conversations = by_conversation(a)
    assert len(conversations) == 120
    for conv in conversations.values():
        assert [i.event.turn_index for i in conv[:-1]] == list(range(6)) and isinstance(conv[-1].event, EndEvent)
        assert [i.event.role for i in conv[:2]] == ["user", "assistant"]
        assert all(len(i.event.text.encode()) == 150 for i in conv[:-1])
    open_now, most = set(), 0
    for i in a:
        (open_now.discard if isinstance(i.event, EndEvent) else open_now.add)(i.event.conversation_id)
        most = max(most, len(open_now))
    assert 40 <= most <= 50  # at most the window (a conversation counts once it has sent a turn)


def test_synthetic_edge_arguments() -> None:
    assert list(synthetic_events(0, 3, seed=1)) == []
    one = list(synthetic_events(1, 1, seed=1, text_bytes=0, window=1))
    assert [type(i.event) for i in one] == [TurnEvent, EndEvent] and one[0].event.text == ""
    with pytest.raises(ValueError):
        synthetic_events(1, 0, seed=1)
