"""The worker's CPU per conversation for scoring, in-process: what the score stage does with a closed conversation.

The pipeline benchmark (`bench/pipeline_throughput.py`) measures the whole worker, but on these 2-core VMs its runs
vary by ±20 % with the host, more than most single changes save. This benchmark times the score stage's own work,
without Kafka, on the pipeline benchmark's workload (`synthetic_events`, 10 turns and an end per conversation, ids
re-keyed to real LLM-Rubric ids), with the recorded GPT-3.5 judge and the same cached rubric set and calibrator:

* ``score_once``: judge (the recorded answers), rubric score, calibrated predictions, the `ScoreRecord`;
* of it, ``predict_judgement``: the calibrator's predictions for every question of one conversation;
* ``observe``: the scoring metrics of one record;
* ``to_json``: the record's JSON for the scores topic;
* ``score (event loop)``: ``ConversationScorer.score`` awaited one conversation after another, as the score stage does
  (sampling, scoring, the metrics): the recorded judge answers from memory, so `score_once` runs on the event loop;
* ``score (thread)``: the same with the judge seen as one that waits (a network judge): `score_once` in the loop's
  default executor, one thread hand-off per conversation;
* ``score_many (64)``: ``ConversationScorer.score_many`` on 64 conversations at a time, what the score stage does with
  a poll when the judge answers from memory (one calibrator call per poll; ``--poll`` sets the 64).

Best of ``--runs`` over ``--conversations``, in µs per conversation. Run from the repository root:
``.venv/bin/python bench/scoring_cpu.py [--conversations 2000] [--runs 5]``; figures to bench/results/scoring_cpu.json.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "bench"):
    if str(path) not in sys.path:  # run as a script from a checkout
        sys.path.insert(0, str(path))

import pipeline_throughput  # noqa: E402  (bench/, beside this script)
from prometheus_client import CollectorRegistry  # noqa: E402
from results_file import write_results  # noqa: E402

from stream.contract import TurnEvent  # noqa: E402
from stream.records import ClosedConversation, TurnRecord  # noqa: E402
from stream.scoring import ConversationScorer  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "scoring_cpu.json"


def closed_conversations(work: pipeline_throughput.Workload) -> list[ClosedConversation]:
    """Each conversation of the workload as the assemble stage closes it (its turns, closed by its end event)."""
    turns: dict[str, list[TurnRecord]] = {}
    for item in work.items:
        event = item.event
        if isinstance(event, TurnEvent):
            turns.setdefault(event.conversation_id, []).append(
                TurnRecord(event.turn_index, event.role, event.text, event.timestamp)
            )
    return [
        ClosedConversation(cid, tuple(ts), {}, "end", ts[-1].timestamp, ts[0].timestamp, ts[-1].timestamp)
        for cid, ts in turns.items()
    ]


class WaitingJudge:
    """The recorded judge as the scorer sees a network judge: without ``answers_in_memory``, so it is called in a thread."""

    def __init__(self, judge) -> None:
        self.inner, self.name, self.model = judge, judge.name, judge.model

    def judge(self, conversation, questions):
        return self.inner.judge(conversation, questions)


def awaited_one_by_one(scorer, conversations: list[ClosedConversation]) -> Callable[[], object]:
    """A call that awaits ``scorer.score`` for each conversation in turn on a fresh event loop."""

    async def all_of_them() -> None:
        for closed in conversations:
            await scorer.score(closed)

    return lambda: asyncio.run(all_of_them())


def awaited_in_polls(scorer, conversations: list[ClosedConversation], poll: int) -> Callable[[], object]:
    """A call that awaits ``scorer.score_many`` for ``poll`` conversations at a time on a fresh event loop."""

    async def all_of_them() -> None:
        for start in range(0, len(conversations), poll):
            await scorer.score_many(conversations[start : start + poll])

    return lambda: asyncio.run(all_of_them())


def best_us(call: Callable[[], object], n: int, runs: int) -> float:
    """Best of ``runs`` timings of ``call`` (which does ``n`` items), in µs per item."""
    best = float("inf")
    for _ in range(runs):
        started = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - started)
    return best * 1e6 / n


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--conversations", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--poll", type=int, default=64, help="conversations per score_many call")
    args = parser.parse_args(argv)

    rubric_set, calibrator = pipeline_throughput.scoring_artifacts(pipeline_throughput.CACHE)
    header, rows = pipeline_throughput.real_answer_rows()
    work = pipeline_throughput.workload("s", args.conversations, 10, seed=1, real_ids=list(rows))
    with tempfile.TemporaryDirectory() as tmp:
        answers = Path(tmp) / "answers.tsv"
        pipeline_throughput.write_judge_answers(answers, header, rows, work.ids)
        env = pipeline_throughput.base_env(rubric_set, calibrator, answers)
        os.environ.update(env)
        from stream.metrics import ServiceMetrics
        from stream.service import build_scorer
        from stream.settings import Settings

        scorer = build_scorer(Settings(), ServiceMetrics(registry=CollectorRegistry()))
    # The same judge, rubric set and calibrator, with metrics of its own.
    threaded = ConversationScorer(
        WaitingJudge(scorer.judge),
        scorer.rubric_set,
        scorer.calibrator,
        scorer.settings,
        ServiceMetrics(registry=CollectorRegistry()),
    )
    calibration = scorer.calibrator
    assert calibration is not None
    conversations = closed_conversations(work)
    judgements = [scorer._judge_rubrics(c.to_conversation()).judgement for c in conversations]
    records = [scorer.score_once(c) for c in conversations]
    n, runs = len(conversations), args.runs
    figures = {
        "score_once": best_us(lambda: [scorer.score_once(c) for c in conversations], n, runs),
        "predict_judgement": best_us(lambda: [calibration.predict_judgement(j) for j in judgements], n, runs),
        "observe": best_us(lambda: list(map(scorer.observe, records)), n, runs),
        "to_json": best_us(lambda: [r.to_json() for r in records], n, runs),
        "score (event loop)": best_us(awaited_one_by_one(scorer, conversations), n, runs),
        "score (thread)": best_us(awaited_one_by_one(threaded, conversations), n, runs),
        f"score_many ({args.poll})": best_us(awaited_in_polls(scorer, conversations, args.poll), n, runs),
    }
    print(f"{n} conversations of 10 turns, best of {runs}, µs per conversation:")
    for name, us in figures.items():
        print(f"  {name:<20} {us:8.1f}")
    write_results(
        RESULTS,
        {
            "conversations": n,
            "runs": runs,
            "us_per_conversation": {k: round(v, 1) for k, v in figures.items()},
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
