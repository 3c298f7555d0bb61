"""ABC-Eval behaviours in the real pipeline: Apache Kafka, worker and sink processes, chDB, and a real judge
(llama-cpp-python's server on Gemma 3 270M, session fixture ``llama_server``).

Gemma 270M is far too weak for its yes/no answers to mean anything; this checks that every assistant turn's
behaviours are asked, carried on the scores topic, stored one row per turn × behaviour and counted in the
metrics, with the calls they cost. What a judge detects is measured in the benchmark, not here.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scorers.behaviours import BehaviourSet
from scorers.statistics import wilson_interval
from stream.contract import TurnEvent
from stream.replay.sources import ReplayItem
from stream.sampling import unit_hash
from stream.scoring import BEHAVIOUR_SALT
from tests.infra import convowatch
from tests.integration.test_pipeline import _ids, _real_items, _shortest_conversations, _wait_scores, _wait_sink_caught_up
from tests.pipeline import Pipeline
from tests.servers import LlamaServer

BEHAVIOURS = {
    "schema_version": 1,
    "name": "two",
    "behaviours": [
        {"id": "ignore", "label": "Ignore", "definition": "The response does not respond to what the user just said."},
        {"id": "redundant", "label": "Redundant", "definition": "The response repeats earlier information without need."},
    ],
}


def _assistant_turns(items: list[ReplayItem], ids: set[str]) -> dict[str, list[int]]:
    """Each conversation's assistant turn indexes, in order."""
    turns: dict[str, set[int]] = {cid: set() for cid in ids}
    for e in (i.event for i in items):
        if isinstance(e, TurnEvent) and e.conversation_id in ids and e.role == "assistant":
            turns[e.conversation_id].add(e.turn_index)
    return {cid: sorted(t) for cid, t in turns.items()}


@pytest.mark.slow
def test_behaviours_of_every_assistant_turn_are_judged_stored_and_counted(
    pipeline: Pipeline, llama_server: LlamaServer, tmp_path: Path
) -> None:
    behaviours_file = tmp_path / "behaviours.json"
    behaviours_file.write_text(json.dumps(BEHAVIOURS), encoding="utf-8")
    pipeline.extra_env.update(
        {
            "CONVOWATCH_JUDGE__BACKEND": "openai",
            "CONVOWATCH_JUDGE__BASE_URL": llama_server.url,
            "CONVOWATCH_JUDGE__MODEL": llama_server.model,
            "CONVOWATCH_JUDGE__API_KEY": str(llama_server.api_key),
            "CONVOWATCH_JUDGE__TIMEOUT_S": "300",  # a loaded 2-core host; this is not a timed test
            # One call per conversation for its questions and one per assistant turn for its behaviours, each reply held
            # to one option key per question by a grammar (Gemma 270M unconstrained often answers none of the options).
            "CONVOWATCH_JUDGE__QUESTIONS_PER_CALL": "20",
            "CONVOWATCH_JUDGE__ANSWER_FORMAT": "sequence",
            "CONVOWATCH_SCORING__BEHAVIOURS": str(behaviours_file),
        }
    )
    worker = pipeline.start_worker()
    sink = pipeline.start_sink()
    pipeline.wait_assigned([worker])
    items, ids = _shortest_conversations(2)  # 4 assistant turns in all: Gemma on CPU answers each in seconds
    assistant_turns = _assistant_turns(items, ids)
    pipeline.produce((i.key, i.raw) for i in items)

    records = {cid: rs[-1] for cid, rs in _wait_scores(pipeline, ids, timeout=900).items()}
    version = BehaviourSet.from_dict(BEHAVIOURS).version
    for cid, record in records.items():
        assert record.status == "scored", record.unscored_reason
        assert record.behaviour_set_version == version
        assert [(b.turn_index, b.behaviour_id) for b in record.behaviours] == [
            (t, b) for t in assistant_turns[cid] for b in ("ignore", "redundant")
        ]
        assert all(0 <= b.probability <= 1 and b.hit == (b.probability > 0.5) for b in record.behaviours)
        # one call for the rubric and calibrator questions, then one per assistant turn (fallbacks would add calls)
        assert record.judge_calls >= 1 + len(assistant_turns[cid])

    n_turns = sum(len(t) for t in assistant_turns.values())
    assert worker.metric_sum("convowatch_behaviour_turns_total") == n_turns
    hits = sum(b.hit for r in records.values() for b in r.behaviours if b.behaviour_id == "ignore")
    assert worker.metric_sum("convowatch_behaviour_hits_total", behaviour="ignore") == hits

    _wait_sink_caught_up(pipeline)
    sink.terminate()
    rows = pipeline.query_store(
        "SELECT conversation_id, turn_index, behaviour_id, probability, hit FROM convowatch.behaviour_turns FINAL "
        "ORDER BY conversation_id, turn_index, behaviour_id"
    )
    assert rows == [
        {
            "conversation_id": cid,
            "turn_index": b.turn_index,
            "behaviour_id": b.behaviour_id,
            "probability": b.probability,
            "hit": b.hit,
        }
        for cid in sorted(records)
        for b in sorted(records[cid].behaviours, key=lambda b: (b.turn_index, b.behaviour_id))
    ]
    [score] = pipeline.query_store("SELECT DISTINCT behaviour_set_version AS v FROM convowatch.conversation_scores FINAL")
    assert score == {"v": version}


@pytest.mark.slow
def test_behaviours_on_the_local_model_beside_the_recorded_judge_for_a_share_of_conversations(
    pipeline: Pipeline, tmp_path: Path
) -> None:
    """scoring.behaviour_judge=local (the packaged Gemma 270M in the worker) and behaviour_rate=0.5: the recorded
    judge answers the rubric questions; the chosen conversations' assistant turns are judged by the local model."""
    behaviours_file = tmp_path / "behaviours.json"
    behaviours_file.write_text(json.dumps(BEHAVIOURS), encoding="utf-8")
    pipeline.extra_env.update(
        {
            "CONVOWATCH_SCORING__BEHAVIOURS": str(behaviours_file),
            "CONVOWATCH_SCORING__BEHAVIOUR_JUDGE": "local",
            "CONVOWATCH_SCORING__BEHAVIOUR_RATE": "0.5",
        }
    )
    worker = pipeline.start_worker()
    sink = pipeline.start_sink()
    pipeline.wait_assigned([worker])
    items = _real_items()
    ordered = sorted(_ids(items))
    chosen = [c for c in ordered if unit_hash(BEHAVIOUR_SALT, c) < 0.5][:2]
    left_out = [c for c in ordered if unit_hash(BEHAVIOUR_SALT, c) >= 0.5][:2]
    ids = {*chosen, *left_out}
    items = [i for i in items if i.event is not None and i.event.conversation_id in ids]
    assistant_turns = _assistant_turns(items, ids)
    pipeline.produce((i.key, i.raw) for i in items)

    records = {cid: rs[-1] for cid, rs in _wait_scores(pipeline, ids, timeout=600).items()}
    for cid, record in records.items():
        assert record.status == "scored", record.unscored_reason
        # the recorded judge reports no calls; the local model's calls stay out of the score's judge cost
        assert record.judge.startswith("recorded") and record.judge_calls == 0
        expected = [(t, b) for t in assistant_turns[cid] for b in ("ignore", "redundant")] if cid in chosen else []
        assert [(b.turn_index, b.behaviour_id) for b in record.behaviours] == expected
    judges = {dict(labels)["judge"] for (name, labels) in worker.metrics() if name == "convowatch_judge_calls_total"}
    local = [name for name in judges if name.startswith("local:")]
    assert len(local) == 1 and "gemma" in local[0].lower()
    n_turns = sum(len(assistant_turns[c]) for c in chosen)
    assert worker.metric_sum("convowatch_judge_calls_total", judge=local[0]) >= n_turns  # counted under its own label
    assert worker.metric_sum("convowatch_behaviour_turns_total") == n_turns

    _wait_sink_caught_up(pipeline)
    sink.terminate()  # the embedded store opens in one process at a time
    r = convowatch("summary", env=pipeline.env)
    assert r.returncode == 0, r.stderr
    section = r.stdout.split("behaviours per assistant turn", 1)[1]
    for behaviour in ("ignore", "redundant"):
        hits = sum(b.hit for c in chosen for b in records[c].behaviours if b.behaviour_id == behaviour)
        ci = wilson_interval(hits, n_turns)
        line = next(line for line in section.splitlines() if line.strip().startswith(behaviour))
        assert line.split()[1:] == [f"{hits / n_turns:.1%}", f"{ci.low:.1%}", "..", f"{ci.high:.1%}", str(hits), str(n_turns)]
