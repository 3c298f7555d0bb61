"""What the worker and the sink spend on JSON per record: msgspec (the service's codec) against the standard library.

py-spy on the worker during `bench/pipeline_throughput.py --quick --conversations 3000 --consumer batch` (2026-11-27,
Intel Xeon) put ~13 % of the samples holding the GIL in the standard library's JSON: encoding closed conversations
and score records, decoding events. This benchmark times, in-process and without Kafka, the calls that do it on the
pipeline benchmark's workload (`synthetic_events`, 10 turns of 200 bytes and an end per conversation):

* `ClosedConversation.to_json` / `from_json` of every conversation (the assemble and score stages);
* `ScoreRecord.to_json` / `from_json` of a scored record of each (the score stage and the sink), with ``--rubrics``
  rubric scores and ``--dimensions`` calibrated dimensions of 4 answers (the real LLM-Rubric calibrator has 9);

each with the service's codec (msgspec, stream/records.py) and with the standard library's in its place (the code
before msgspec), best of ``--runs``, alternating the two. Events stay with the standard library: an orjson-first
`parse_event` (with the standard library reading again whatever orjson refused, commit 1f7b15a) took 24.1 against
24.5 µs per event in this benchmark (best of 9, Intel Xeon), so it was not kept.

Run: ``.venv/bin/python bench/record_codec.py [--conversations 2000] [--runs 5]``; figures to
bench/results/record_codec.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, str(ROOT))

from results_file import cpu_model  # noqa: E402

from stream import records  # noqa: E402
from stream.contract import EndEvent, TurnEvent, parse_event  # noqa: E402
from stream.records import ClosedConversation, DimensionPrediction, RubricHit, ScoreRecord, TurnRecord  # noqa: E402
from stream.replay.sources import synthetic_events  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "record_codec.json"


def _stdlib_dump(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")


def _stdlib_load(raw: bytes | None) -> dict[str, Any]:
    d = json.loads(raw)  # type: ignore[arg-type]  # never None here
    if not isinstance(d, dict) or d.get("record_version") != records.RECORD_VERSION:
        raise records.RecordError("not a record")
    return d


@contextmanager
def standard_library() -> Iterator[None]:
    """The service's code with the standard library's JSON where msgspec is now."""
    with (
        mock.patch.object(records, "_dump", _stdlib_dump),
        mock.patch.object(records, "_load", _stdlib_load),
    ):
        yield


def workload(n: int, rubrics: int, dimensions: int, seed: int) -> tuple[list[bytes], list[ClosedConversation], list[ScoreRecord]]:
    """The raw events, the closed conversations they make, and a scored record of each."""
    events = [item.raw for item in synthetic_events(n, 10, seed=seed)]
    turns: dict[str, list[TurnRecord]] = {}
    closed: list[ClosedConversation] = []
    for raw in events:
        event = parse_event(raw)
        if isinstance(event, TurnEvent):
            turns.setdefault(event.conversation_id, []).append(
                TurnRecord(event.turn_index, event.role, event.text, event.timestamp)
            )
        elif isinstance(event, EndEvent):
            ts = sorted(turns.pop(event.conversation_id), key=lambda t: t.index)
            closed.append(
                ClosedConversation(
                    event.conversation_id,
                    tuple(ts),
                    dict(event.attributes),
                    "end",
                    event.timestamp,
                    ts[0].timestamp,
                    event.timestamp,
                )
            )
    rng = random.Random(seed)

    def probabilities() -> tuple[float, ...]:
        w = [rng.random() for _ in range(4)]
        return tuple(x / sum(w) for x in w)

    scored = [
        ScoreRecord(
            conversation=c,
            status="scored",
            scorer_version="0123456789ab",
            judge="recorded:gpt-3.5",
            rubric_set_version="fedcba987654",
            calibrator_version="a1b2c3d4e5f6",
            scored_at=c.closed_at + 0.1,
            attempts=1,
            netsat=rng.uniform(-1, 1),
            label=rng.choice(("sat", "dsat", "uncertain")),
            threshold_label="sat",
            main_question_id="Q0",
            main_probabilities=probabilities(),
            main_expected_value=rng.uniform(1, 4),
            dissatisfaction_probability=rng.random(),
            dimensions=tuple(DimensionPrediction(f"Q{i}", probabilities(), rng.uniform(1, 4)) for i in range(dimensions)),
            rubrics=tuple(RubricHit(f"rubric-{i}", "dsat" if i % 2 else "sat", rng.uniform(-1, 1)) for i in range(rubrics)),
        )
        for c in closed
    ]
    return events, closed, scored


def per_call_us(call: Callable[[Any], Any], items: list[Any]) -> float:
    started = time.perf_counter()
    for item in items:
        call(item)
    return (time.perf_counter() - started) / len(items) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", type=int, default=2000)
    parser.add_argument("--rubrics", type=int, default=12)
    parser.add_argument("--dimensions", type=int, default=9)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    events, closed, scored = workload(args.conversations, args.rubrics, args.dimensions, args.seed)
    closed_json = [c.to_json() for c in closed]
    score_json = [s.to_json() for s in scored]
    calls: dict[str, tuple[Callable[[Any], Any], list[Any]]] = {
        "ClosedConversation.to_json": (lambda c: c.to_json(), closed),
        "ClosedConversation.from_json": (ClosedConversation.from_json, closed_json),
        "ScoreRecord.to_json": (lambda s: s.to_json(), scored),
        "ScoreRecord.from_json": (ScoreRecord.from_json, score_json),
    }
    best: dict[str, dict[str, float]] = {name: {"msgspec": float("inf"), "stdlib": float("inf")} for name in calls}
    for _ in range(args.runs):
        for name, (call, items) in calls.items():
            best[name]["msgspec"] = min(best[name]["msgspec"], per_call_us(call, items))
            with standard_library():
                best[name]["stdlib"] = min(best[name]["stdlib"], per_call_us(call, items))
    sizes = {
        "event_bytes_mean": sum(map(len, events)) / len(events),
        "closed_bytes_mean": sum(map(len, closed_json)) / len(closed_json),
        "score_bytes_mean": sum(map(len, score_json)) / len(score_json),
    }
    print(
        f"{len(events)} events, {len(closed)} conversations; mean bytes: " + ", ".join(f"{k} {v:,.0f}" for k, v in sizes.items())
    )
    print(f"{'call':38s} {'stdlib µs':>10s} {'msgspec µs':>10s} {'ratio':>6s}")
    for name, b in best.items():
        print(f"{name:38s} {b['stdlib']:10.1f} {b['msgspec']:10.1f} {b['stdlib'] / b['msgspec']:6.2f}")
    out = {
        "args": vars(args),
        "host": {"cpu": platform.processor() or platform.machine(), "python": platform.python_version()},
        "cpu_model": cpu_model(),
        "date": time.strftime("%Y-%m-%d"),
        "sizes": sizes,
        "best_us_per_call": best,
    }  # fmt: skip
    RESULTS.write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
