"""Issue 54's poison pills on the real components: Apache Kafka, a worker and a sink process, the embedded ClickHouse.

Each of these events, from any producer, once crashed the worker, and a restarted worker died again on the same
records, so the partition stayed blocked. Sent here with the worker's default bounds, between real conversations:

- one turn with ``turn_index`` 2**31 - 1 (a 148-byte event the contract accepts), then its end: closing built
  ``set(range(2**31))`` (MemoryError);
- a turn with ``turn_index`` 1,000,000: a 6.9 MB closed record (MessageSizeTooLargeError in the send);
- forty valid 32 KB turns of one conversation: a 1.2 MB changelog state (the same error);
- a 262 KB event with 3,797 unknown field names made of DEL characters: a 1.17 MB dead-letter detail;
- a valid event under a 300 KB record key (key_mismatch): a dead letter whose key alone is 400 KB in base64.

Afterwards the worker still runs (never restarted), every real conversation is scored and stored, and each poison
pill is where the contract says: dead-lettered with its reason, or (the forty turns) closed at
``assembly.max_conversation_bytes`` and scored with the turns it had, the rest dead-lettered as after any close.
"""

from __future__ import annotations

import json

from stream.contract import DEAD_LETTER_DETAIL_CHARS, DeadLetter, EndEvent, TurnEvent, encode_event
from stream.settings import AssemblySettings
from tests.integration.test_pipeline import _ids, _real_items, _wait_scores, _wait_sink_caught_up
from tests.pipeline import Pipeline

T = 1_707_000_000.0
TURNS_32K = 40
BIG_TEXT_BYTES = 32_760
HUGE_KEY = b"k" * 300_000


def _turn(cid: str, index: int, text: str = "hello") -> tuple[bytes, bytes]:
    return cid.encode(), encode_event(TurnEvent(cid, index, "user" if index % 2 == 0 else "assistant", text, T + index, {}))


def _end(cid: str) -> tuple[bytes, bytes]:
    return cid.encode(), encode_event(EndEvent(cid, T + 100))


def poison_pills() -> list[tuple[bytes, bytes]]:
    """The issue's poison pills as (key, value) records of the events topic, in the order sent (see the module)."""
    big_text = "x" * BIG_TEXT_BYTES  # a valid turn: at most 32,768 bytes
    del_fields = {f"{i:04}" + "\x7f" * 56: 1 for i in range(3_797)}
    unknown = json.dumps(
        {"schema_version": 1, "type": "end", "conversation_id": "p-del", "timestamp": "2024-02-09T00:00:00Z", **del_fields},
        ensure_ascii=False,
    )
    poison = [
        _turn("p-maxint", 2**31 - 1),
        _end("p-maxint"),
        _turn("p-million", 0),
        _turn("p-million", 1_000_000),
        _end("p-million"),
        *(_turn("p-forty", i, big_text) for i in range(TURNS_32K)),
        _end("p-forty"),
        (b"p-del", unknown.encode()),
        (HUGE_KEY, _turn("p-key", 0)[1]),
    ]
    assert len(poison[0][1]) < 200 and 250_000 < len(unknown.encode()) <= 262_144
    return poison


def test_no_poison_pill_stops_the_worker_and_each_is_where_the_contract_says(pipeline: Pipeline) -> None:
    worker = pipeline.start_worker()
    sink = pipeline.start_sink()
    pipeline.wait_assigned([worker])
    items = _real_items()
    real = sorted(_ids(items))[:10]
    poison = poison_pills()
    half = len(real) // 2
    first = [(i.key, i.raw) for i in items if i.event is not None and i.event.conversation_id in real[:half]]
    last = [(i.key, i.raw) for i in items if i.event is not None and i.event.conversation_id in real[half:]]
    pipeline.produce(first + poison + last)

    scores = _wait_scores(pipeline, {*real, "p-million", "p-forty"})
    assert worker.popen.poll() is None, worker.log_tail()
    assert worker.metric_sum("convowatch_quarantined_records_total") == 0  # the bounds caught them all

    forty = scores["p-forty"][0].conversation
    kept = -(-AssemblySettings().max_conversation_bytes // (BIG_TEXT_BYTES + 2))  # each text "..." in JSON: 9 of 262,144
    assert (forty.close_cause, len(forty.turns)) == ("max_bytes", kept)
    million = scores["p-million"][0].conversation
    assert ([t.index for t in million.turns], million.missing_turn_indices) == ([0], ())

    letters = [DeadLetter.from_json(m.value) if b'"key_truncated"' not in m.value else json.loads(m.value)
               for m in pipeline.consume("dead_letter", 5 + TURNS_32K - kept)]  # fmt: skip
    reasons = sorted(d["reason"] if isinstance(d, dict) else d.reason for d in letters)
    assert reasons == sorted(
        ["turn_index_too_large", "empty_conversation", "turn_index_too_large", "unknown_field", "key_mismatch"]
        + ["conversation_closed"] * (TURNS_32K - kept)
    )
    [fields] = [d for d in letters if not isinstance(d, dict) and d.reason == "unknown_field"]
    assert len(fields.detail) <= DEAD_LETTER_DETAIL_CHARS and "3797 unknown field(s)" in fields.detail
    [key] = [d for d in letters if isinstance(d, dict)]
    assert (key["reason"], key["key_size"], key["key_truncated"]) == ("key_mismatch", len(HUGE_KEY), True)

    _wait_sink_caught_up(pipeline)
    sink.terminate()
    stored = {
        r["conversation_id"] for r in pipeline.query_store("SELECT conversation_id FROM convowatch.conversation_scores FINAL")
    }
    assert stored == {*real, "p-million", "p-forty"}
