"""bench/injection.py's corpus and draw on the real USS files: at least 50 injection texts, the planted turn, the
dissatisfied conversations none of the fitted sets saw, and the figures' arithmetic. No judge runs."""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import pytest

from scorers.conversation import parse_transcript, render_transcript

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "bench")]

import injection as bench  # noqa: E402


def test_the_corpus_has_fifteen_texts_of_each_kind_and_each_is_planted_once() -> None:
    assert {kind: len(texts) for kind, texts in bench.INJECTIONS.items()} == {kind: 15 for kind in bench.INJECTIONS}
    pairs = bench.assignments(60, seed=1)
    assert len(set(pairs)) == 60 and Counter(kind for kind, _ in pairs) == {kind: 15 for kind in bench.INJECTIONS}
    assert bench.assignments(60, seed=1) == pairs and bench.assignments(60, seed=2) != pairs


def test_the_draw_is_dissatisfied_unseen_and_balanced() -> None:
    items = bench.dissatisfied_conversations(seed=1)
    assert len(items) == 60 and len({x.conversation.id for x in items}) == 60
    assert not any(x.positive for x in items)
    assert Counter(x.conversation.id.split("-")[0] for x in items) == {"MWOZ": 30, "SGD": 30}
    judged_for_the_starter_set = set(json.loads(bench.JUDGE_COST_RESULTS.read_text())["conversations"]["ids"])
    assert not judged_for_the_starter_set & {x.conversation.id for x in items}


def test_a_planted_turn_is_the_users_last_and_cannot_close_itself() -> None:
    clean = bench.dissatisfied_conversations(seed=1)[0].conversation
    forged = bench.INJECTIONS["forged_turns"][0]
    planted = bench.planted(clean, forged)
    n = len(clean.turns)
    assert planted.turns[:n] == clean.turns and planted.turns[-1].role == "user"
    assert f"<<<end user turn {n}>>>" in planted.turns[-1].text  # the delimiters name the turn they try to close
    parsed = parse_transcript(render_transcript(planted))
    assert len(parsed) == n + 1 and parsed[-1] == (n, "user", planted.turns[-1].text)


def test_moves_compares_each_version_with_the_clean_one() -> None:
    def version(label: str, netsat: float, p: float) -> dict:
        return {"label": label, "threshold_label": label, "netsat": netsat, "p_dsat": p}

    records = [
        {"clean": version("dsat", -2.0, 0.8), "injected": version("sat", 1.0, 0.5)},
        {"clean": version("uncertain", 0.0, 0.5), "injected": version("uncertain", 0.5, 0.5)},
    ]
    m = bench.moves(records, "injected")
    assert m["label_changed"]["hits"] == 1 and m["label_towards_sat"]["hits"] == 1
    assert m["netsat_change"]["estimate"] == 1.75 and m["p_dsat_change"]["estimate"] == pytest.approx(-0.15)
