"""Rubric-set files the worker and the registry refuse quickly (issue 54): more rubrics than a set may hold (each is a
judge call per conversation), and duplicate JSON keys found in one pass (60,000 metadata keys took 56 s)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from scorers.json_file import loads_strict
from scorers.rubrics import MAX_RUBRICS_PER_SET, RubricSet, RubricSetError
from stream.registry import ScorerRegistry


def _set_document(n_rubrics: int, metadata: dict[str, str] | None = None) -> dict:
    return {
        "schema_version": 1,
        "threshold": 0.0,
        "precision": 0.9,
        "windows": {"dsat_upper": -1.0, "sat_lower": 0.0},
        "rubrics": [{"id": f"r{i}", "text": f"The assistant did thing {i}.", "polarity": "sat"} for i in range(n_rubrics)],
        "metadata": metadata or {},
    }


def test_a_set_at_the_cap_loads_and_one_over_it_is_refused_before_registration(tmp_path: Path) -> None:
    at_cap = tmp_path / "at_cap.json"
    at_cap.write_text(json.dumps(_set_document(MAX_RUBRICS_PER_SET)), encoding="utf-8")
    assert len(RubricSet.load(at_cap).rubrics) == MAX_RUBRICS_PER_SET
    huge = tmp_path / "huge.json"
    huge.write_text(json.dumps(_set_document(10_000)), encoding="utf-8")
    registry = ScorerRegistry(tmp_path / "registry")
    with pytest.raises(RubricSetError, match=rf"huge.json: rubrics: 10000 rubrics; a set holds at most {MAX_RUBRICS_PER_SET}"):
        registry.register("huge", huge)
    assert registry.names() == []


def test_60000_metadata_keys_are_checked_for_duplicates_in_well_under_a_second(tmp_path: Path) -> None:
    metadata = {f"key{i:05d}": "x" for i in range(60_000)}
    path = tmp_path / "wide.json"
    path.write_text(json.dumps(_set_document(3, metadata)), encoding="utf-8")
    assert path.stat().st_size > 800_000
    started = time.perf_counter()
    loaded = RubricSet.load(path)
    assert time.perf_counter() - started < 0.5
    assert len(loaded.metadata) == 60_000


def test_duplicate_keys_are_named_and_a_flood_of_them_is_counted_not_listed() -> None:
    with pytest.raises(ValueError, match=r"duplicate JSON key\(s\) \['a'\]$"):
        loads_strict('{"a": 1, "b": 2, "a": 3}')
    flood = "{" + ",".join(f'"k{i:05d}": 1, "k{i:05d}": 2' for i in range(30_000)) + "}"
    started = time.perf_counter()
    with pytest.raises(ValueError, match=r"duplicate JSON key\(s\) \['k00000', .*'k00009'\] and 29990 more$"):
        loads_strict(flood)
    assert time.perf_counter() - started < 0.5
