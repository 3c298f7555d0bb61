"""bench/behaviour_detection.py's draw on the real USS files: proxy labels follow the declared rule, one turn per
dialogue, balanced per class and corpus, reproducible. No judge runs."""

from __future__ import annotations

import statistics
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "bench")]

import behaviour_detection as bench  # noqa: E402


def test_the_draw_is_balanced_one_turn_per_dialogue_and_reproducible() -> None:
    turns = bench.draw(5, seed=3)
    assert len(turns) == 20 and len({t.dialogue.id for t in turns}) == 20
    assert Counter((t.dialogue.id.split("-")[0], t.problem) for t in turns) == {
        (c, p): 5 for c in bench.CORPORA for p in (True, False)
    }
    assert [t.problem for t in turns] == [True, False] * 10  # interleaved: every prefix is balanced
    assert [t.id for t in bench.draw(5, seed=3)] == [t.id for t in turns]
    assert [t.id for t in bench.draw(5, seed=4)] != [t.id for t in turns]


def test_a_turns_label_is_the_next_user_turns_median_rating() -> None:
    for turn in bench.draw(5, seed=3):
        turns = turn.dialogue.conversation.turns
        assert turns[turn.index].role == "assistant" and turns[turn.index + 1].role == "user"
        median = statistics.median(turn.dialogue.turn_ratings[turn.index + 1])
        assert turn.next_median == median
        assert turn.problem == (median <= bench.PROBLEM_AT_MOST)
        assert turn.problem or median >= bench.FINE_AT_LEAST


def test_the_benchmark_asks_the_error_behaviours_only() -> None:
    behaviours = bench.error_behaviours().behaviours
    assert len(behaviours) == 10 and all(b.error for b in behaviours)


SLICES = sorted((ROOT / "bench" / "results" / "behaviour_detection_slices").glob("start_*.json"))


def test_the_committed_slices_join_into_the_committed_figures() -> None:
    """Real Qwen answers on the real draw: the join covers every drawn turn once and reproduces the results file."""
    import json

    joined = bench.join(SLICES)
    committed = json.loads(bench.OUTPUT.read_text(encoding="utf-8"))
    assert joined["figures"] == committed["figures"] and joined["figures"]["turns"] == {"n": 100, "problem": 50}
    assert [r["id"] for r in joined["per_turn"]] == [t.id for t in bench.draw(25, 1)]


def test_a_missing_or_foreign_slice_is_refused(tmp_path: Path) -> None:
    import json

    import pytest

    with pytest.raises(bench.uss.BenchError, match="missing or repeated"):
        bench.join(SLICES[:-1])
    foreign = json.loads(SLICES[-1].read_text(encoding="utf-8"))
    foreign["settings"]["seed"] = 2
    path = tmp_path / "foreign.json"
    path.write_text(json.dumps(foreign), encoding="utf-8")
    with pytest.raises(bench.uss.BenchError, match="seed 2 differs"):
        bench.join([*SLICES[:-1], path])
