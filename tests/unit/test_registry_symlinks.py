"""The scorer registry copies regular files only (issue 54): a symlinked calibrator file, calibrator directory or rubric
set is refused with an error naming the link, and nothing is registered; a link put into a registered version by
hand makes the version refuse to load."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from stream.registry import CALIBRATOR_DIR, VERSIONS_DIR, RegistryError, ScorerRegistry
from tests.unit.test_rollout import files as files
from tests.unit.test_scoring import judge as judge
from tests.unit.test_scoring import rubric_set as rubric_set
from tests.unit.test_scoring import unfitted as unfitted


def _calibrator_with_a_linked_file(files: dict[str, Path], tmp_path: Path) -> Path:
    """A copy of the calibrator whose metadata file is a link to a file elsewhere (the same content, so only the link
    is wrong)."""
    calibrator = tmp_path / "calibrator"
    shutil.copytree(files["calibrator"], calibrator)
    metadata = calibrator / "calibrator.json"
    elsewhere = tmp_path / "elsewhere.json"
    shutil.move(metadata, elsewhere)
    metadata.symlink_to(elsewhere)
    return calibrator


def test_a_symlinked_calibrator_file_is_refused_and_nothing_registered(tmp_path: Path, files: dict[str, Path]) -> None:
    calibrator = _calibrator_with_a_linked_file(files, tmp_path)
    registry = ScorerRegistry(tmp_path / "registry")
    with pytest.raises(RegistryError, match=r"the calibrator: .*calibrator\.json is a symlink"):
        registry.register("v1", files["v1"], calibrator)
    assert registry.names() == []
    assert not (registry.root / VERSIONS_DIR / "v1").exists()


def test_a_symlinked_calibrator_directory_or_rubric_set_is_refused(tmp_path: Path, files: dict[str, Path]) -> None:
    registry = ScorerRegistry(tmp_path / "registry")
    linked_dir = tmp_path / "linked-calibrator"
    linked_dir.symlink_to(files["calibrator"])
    with pytest.raises(RegistryError, match="the calibrator: .*linked-calibrator is a symlink"):
        registry.register("v1", files["v1"], linked_dir)
    linked_set = tmp_path / "linked.json"
    linked_set.symlink_to(files["v1"])
    with pytest.raises(RegistryError, match="the rubric set: .*linked.json is a symlink"):
        registry.register("v1", linked_set)
    assert registry.names() == []


def test_a_link_put_into_a_registered_version_makes_it_refuse_to_load(tmp_path: Path, files: dict[str, Path]) -> None:
    registry = ScorerRegistry(tmp_path / "registry")
    registry.register("v1", files["v1"], files["calibrator"])
    metadata = registry.root / VERSIONS_DIR / "v1" / CALIBRATOR_DIR / "calibrator.json"
    elsewhere = tmp_path / "elsewhere.json"
    shutil.move(metadata, elsewhere)
    metadata.symlink_to(elsewhere)
    with pytest.raises(RegistryError, match="version 'v1': .*calibrator.json is a symlink"):
        registry.version("v1")
