"""State directories are owner-only even when they existed before (issue 54): the store's chDB directory and the
worker's data directory are tightened to 0700, their subdirectories to 0700 and their files to 0600."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from stream.owner_only import make_owner_only_dir
from stream.service import prepare_data_dir
from stream.store import _chdb_dir


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def _loose_state_dir(root: Path) -> Path:
    """A directory as an older version, a hand-made one or a 022 umask left it: everyone may read it."""
    state = root / "state"
    (state / "store" / "data").mkdir(parents=True)
    (state / "store" / "data" / "part.bin").write_bytes(b"conversation text")
    (state / "status").write_text("pid")
    for d in (state, state / "store", state / "store" / "data"):
        os.chmod(d, 0o755)
    os.chmod(state / "store" / "data" / "part.bin", 0o644)
    os.chmod(state / "status", 0o666)
    return state


def _assert_owner_only(state: Path) -> None:
    assert _mode(state) == 0o700
    assert _mode(state / "store") == 0o700
    assert _mode(state / "store" / "data") == 0o700
    assert _mode(state / "store" / "data" / "part.bin") == 0o600
    assert _mode(state / "status") == 0o600


def test_an_existing_chdb_store_directory_is_tightened(tmp_path: Path) -> None:
    state = _loose_state_dir(tmp_path)
    assert _chdb_dir(f"chdb://{state}") == state.resolve()
    _assert_owner_only(state)


def test_an_existing_worker_data_dir_is_tightened(tmp_path: Path) -> None:
    state = _loose_state_dir(tmp_path)
    prepare_data_dir(state)
    _assert_owner_only(state)


def test_symlinks_are_not_followed_and_their_targets_keep_their_mode(tmp_path: Path) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text("not ours to change")
    os.chmod(outside, 0o644)
    state = tmp_path / "state"
    state.mkdir(mode=0o755)
    (state / "link").symlink_to(outside)
    make_owner_only_dir(state)
    assert _mode(state) == 0o700
    assert _mode(outside) == 0o644
