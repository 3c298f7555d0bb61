"""Owner-only state directories: what convowatch keeps on disk (conversation text, scores, logs) is the owner's alone.

``mkdir(mode=0o700)`` applies its mode only to a directory it creates, so a directory left by an older version, made
by hand or under a looser umask kept what it had (0755: every local user could read every conversation). Here an
existing directory is tightened too: itself and the directories below it to 0700, the files in them to 0600.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

OWNER_ONLY_DIR_MODE = 0o700
OWNER_ONLY_FILE_MODE = 0o600


def make_owner_only_dir(path: Path) -> None:
    """Create ``path`` (and its parents) if missing, then tighten it and everything below it to the owner only.

    Symlinks are left alone (never followed: a link could point anywhere); entries of another owner are left alone
    too (chmod would fail on them, and they are not ours to change). Raises OSError if ``path`` cannot be made."""
    path.mkdir(parents=True, exist_ok=True, mode=OWNER_ONLY_DIR_MODE)
    _tighten(path, OWNER_ONLY_DIR_MODE)
    for root, dirs, files in os.walk(path):
        for name in dirs:
            _tighten(Path(root) / name, OWNER_ONLY_DIR_MODE)
        for name in files:
            _tighten(Path(root) / name, OWNER_ONLY_FILE_MODE)


def _tighten(path: Path, mode: int) -> None:
    """Take group and other permissions off ``path`` (not a symlink, owned by this user), keeping the owner's bits
    up to ``mode``."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:  # removed meanwhile (chDB renames its parts)
        return
    if stat.S_ISLNK(st.st_mode) or st.st_uid != os.geteuid():
        return
    current = stat.S_IMODE(st.st_mode)
    wanted = current & mode if stat.S_ISREG(st.st_mode) else mode
    if current != wanted:
        try:
            os.chmod(path, wanted)
        except FileNotFoundError:
            return
