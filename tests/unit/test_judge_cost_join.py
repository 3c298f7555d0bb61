"""bench/judge_cost_join.py: slices of the judge-cost draw join only when they are one draw, and the joined
agreement is the count of matching labels in the slices' own records.

Reads the slice files committed under bench/results/judge_cost_slices (real Qwen answers on real USS dialogues)
and the USS data in ../shared/data; no judge runs.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "bench")]

import judge_cost_join as join  # noqa: E402

from scorers.conversation import Conversation  # noqa: E402
from scorers.questions import Question  # noqa: E402

SLICES = ROOT / "bench" / "results" / "judge_cost_slices"


@pytest.fixture
def slice_dir(tmp_path: Path) -> Path:
    for path in sorted(SLICES.glob("*.json"))[:2]:
        shutil.copy(path, tmp_path / path.name)
    return tmp_path


def _rewrite(path: Path, change) -> None:
    doc = json.loads(path.read_text(encoding="utf-8"))
    change(doc)
    path.write_text(json.dumps(doc), encoding="utf-8")


def test_slices_join_in_draw_order_at_their_positions(slice_dir: Path) -> None:
    docs = join.load_slices(slice_dir)
    starts = [d["settings"]["start"] for d in docs]
    assert starts == sorted(starts) and len(starts) == 2
    human, draw = join.human_labels(docs[0])
    join.check_positions(docs, draw)
    assert all(i in human for d in docs for i in d["conversations"]["ids"])


def test_a_slice_of_another_draw_is_refused(slice_dir: Path) -> None:
    first = sorted(slice_dir.glob("*.json"))[0]
    _rewrite(first, lambda d: d["settings"].update(seed=d["settings"]["seed"] + 1))
    with pytest.raises(join.JoinError, match="different draws"):
        join.load_slices(slice_dir)


def test_a_slice_with_another_rubric_set_version_is_refused(slice_dir: Path) -> None:
    first = sorted(slice_dir.glob("*.json"))[0]
    _rewrite(first, lambda d: d["sets"]["learned"].update(version="other"))
    with pytest.raises(join.JoinError, match="rubric set versions"):
        join.load_slices(slice_dir)


def test_overlapping_slices_are_refused(slice_dir: Path) -> None:
    first, second = sorted(slice_dir.glob("*.json"))
    shutil.copy(first, slice_dir / "copy_of_first.json")
    with pytest.raises(join.JoinError, match="already in an earlier slice"):
        join.load_slices(slice_dir)
    (slice_dir / "copy_of_first.json").unlink()
    _rewrite(second, lambda d: d["conversations"]["ids"].__setitem__(0, json.loads(first.read_text())["conversations"]["ids"][0]))
    with pytest.raises(join.JoinError, match="already in an earlier slice"):
        join.load_slices(slice_dir)


def test_a_slice_at_the_wrong_position_is_refused(slice_dir: Path) -> None:
    first = sorted(slice_dir.glob("*.json"))[0]
    _rewrite(first, lambda d: d["settings"].update(start=d["settings"]["start"] + 1))
    docs = join.load_slices(slice_dir)
    _, draw = join.human_labels(docs[0])
    with pytest.raises(join.JoinError, match="not positions"):
        join.check_positions(docs, draw)


def test_no_slice_with_both_modes_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(join.JoinError, match="no slice"):
        join.load_slices(tmp_path)


def test_agreement_counts_the_records_labels(slice_dir: Path) -> None:
    docs = join.load_slices(slice_dir)
    human, _ = join.human_labels(docs[0])
    records = {m: [r for d in docs for r in d["modes"][m]["per_conversation"]] for m in ("b", "c")}
    figures = join.set_figures(records, "learned", human, docs)
    same = sum(
        b["sets"]["learned"]["threshold_label"] == c["sets"]["learned"]["threshold_label"]
        for b, c in zip(records["b"], records["c"])
    )
    agreement = figures["agreement"]["threshold_label"]
    assert (agreement["hits"], agreement["n"]) == (same, len(records["b"]))
    assert agreement["low"] <= agreement["rate"] <= agreement["high"]
    assert sum(s["same_threshold_label"] for s in figures["agreement"]["per_slice"]) == same


def test_recorded_answers_are_returned_for_their_own_question() -> None:
    judge = join.AnswersJudge({"c1": {"q1": [0.1, 0.9], "q2": [0.7, 0.3]}})
    questions = [Question(id=q, text=f"{q}?", option_keys=("1", "2"), option_labels=("no", "yes")) for q in ("q2", "q1")]
    judgement = judge.judge(Conversation.from_messages("c1", [{"role": "user", "content": "hi"}]), questions)
    assert judgement.answers["q1"].probabilities == (0.1, 0.9)
    assert judgement.answers["q2"].probabilities == (0.7, 0.3)
    with pytest.raises(KeyError):
        judge.judge(Conversation.from_messages("c2", [{"role": "user", "content": "hi"}]), questions)


def test_pooled_cost_weights_each_slice_by_its_conversations(slice_dir: Path) -> None:
    _rewrite(sorted(slice_dir.glob("*.json"))[0], lambda d: d["modes"]["b"]["cost"].update(conversations=2))
    docs = join.load_slices(slice_dir)
    pooled = join.pooled_cost(docs, "b")
    costs = [d["modes"]["b"]["cost"] for d in docs]
    key = "evaluated_prompt_tokens_in_one_transcript_passes"
    assert pooled["conversations"] == 2 + costs[1]["conversations"]
    assert pooled[key] == pytest.approx((2 * costs[0][key] + costs[1]["conversations"] * costs[1][key]) / pooled["conversations"])


def test_repeated_sampling_of_the_real_labels_is_unbiased(slice_dir: Path) -> None:
    """Mode e repeated over salts: the Horvitz–Thompson share averages to the share over all conversations."""
    docs = join.load_slices(slice_dir)
    records = [r for d in docs for r in d["modes"]["b"]["per_conversation"]]
    result = join.sampling_on_b(records, ["learned"])["sets"]["learned"]
    assert result["dsat_share_all"] == pytest.approx(
        sum(r["sets"]["learned"]["threshold_label"] == "dsat" for r in records) / len(records)
    )
    for rate, r in result["rates"].items():
        assert r["judged_mean"] == pytest.approx(float(rate) * len(records), rel=0.15)
        assert abs(r["estimate_mean"] - result["dsat_share_all"]) < 4 * r["estimate_sd"] / join.SAMPLING_SALTS**0.5
