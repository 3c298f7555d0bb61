"""The worker's local directory (``kafka.data_dir``): created with its parents, owner-only, or a clear error."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from stream.service import prepare_data_dir
from stream.settings import SettingsError


def test_a_missing_directory_and_its_parents_are_created_owner_only(tmp_path: Path) -> None:
    target = tmp_path / ".convowatch" / "worker"  # a fresh checkout has neither
    prepare_data_dir(target)
    assert target.is_dir()
    assert stat.S_IMODE(target.stat().st_mode) == 0o700
    prepare_data_dir(target)  # a restart finds it there


def test_a_file_in_the_way_is_a_settings_error_naming_the_setting(tmp_path: Path) -> None:
    (tmp_path / "worker").write_text("not a directory")
    with pytest.raises(SettingsError, match=r"kafka\.data_dir: cannot create the worker's directory .*worker"):
        prepare_data_dir(tmp_path / "worker")
