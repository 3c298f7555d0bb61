"""The GPT-ABCEval reader on the real file (read from ../shared, never copied) and on malformed ones."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from scorers.datasets.abc_eval import BEHAVIOURS, AbcEvalFormatError, load_abc_eval
from tests.data_paths import ABC_EVAL


def test_the_real_file_holds_108_conversations_of_four_bots_and_the_judges_bias() -> None:
    dialogues = load_abc_eval(ABC_EVAL)
    turns = [t for d in dialogues for t in d.turns]
    assert len(dialogues) == 108 and len(turns) == 1634
    assert {d.bot for d in dialogues} == {"blender2_3B", "emora", "bart_fid_rag_bcb", "rerank_blender"}
    # The data README's figures, computed here independently of bench/rates.py.
    human = np.mean([sum(t.human["ignore"]) / 2 for t in turns])
    gpt = np.mean([t.gpt["ignore"] for t in turns])
    assert round(float(human), 2) == 0.10 and round(float(gpt), 2) == 0.43


def _write(tmp_path: Path, raw: object) -> Path:
    path = tmp_path / "results.json"
    path.write_text(json.dumps(raw))
    return path


def _turn(**labels: object) -> dict:
    behaviours = {b: {"human": [0, 1], "gpt": 0} for b in BEHAVIOURS} | labels
    return {"user": "hi", "system": "hello", "behaviors": behaviours}


@pytest.mark.parametrize(
    "raw, says",
    [
        ({"(1,1)": [_turn()]}, "bot suffix"),
        ({"(1,1)_emora": []}, "list of turns"),
        ({"(1,1)_emora": [{"user": "hi"}]}, "'user' and 'system'"),
        ({"(1,1)_emora": [_turn(ignore={"human": [0], "gpt": 0})]}, "two human labels"),
        ({"(1,1)_emora": [_turn(ignore={"human": [0, 2], "gpt": 0})]}, "0 or 1"),
        ({"(1,1)_emora": [_turn(ignore={"human": [0, 1], "gpt": True})]}, "0 or 1"),
        ({"(1,1)_emora": [dict(_turn(), behaviors={"ignore": {"human": [0, 0], "gpt": 0}})]}, "nine behaviours"),
    ],
)
def test_a_malformed_file_gives_one_clear_error(tmp_path: Path, raw: object, says: str) -> None:
    with pytest.raises(AbcEvalFormatError, match=says):
        load_abc_eval(_write(tmp_path, raw))


def test_a_file_that_is_no_json_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "results.json"
    path.write_text("{")
    with pytest.raises(AbcEvalFormatError, match="cannot read it as JSON"):
        load_abc_eval(path)
