"""Scorer versions and their rollout: a directory every worker watches.

A *scorer version* is a named, immutable pair of a rubric set and (optionally) a
calibrator, copied into the registry when it is registered. The *rollout* says
which version is active (scores every conversation and feeds the metrics and
alerts) and which, if any, is the shadow (scores a share of the conversations
beside the active one, stored in ``shadow_scores``, compared by ``convowatch
scorers compare``). Workers read the rollout every ``scoring.registry_poll_s``
and switch without a restart (stream/rollout.py).

    REGISTRY/
      rollout.json              {"active": "v2", "shadow": "v3", "shadow_rate": 0.2, "changed_at": ...}
      versions/v2/version.json  {"name": "v2", "rubric_set_version": ..., "calibrator_version": ..., ...}
      versions/v2/rubric_set.json
      versions/v2/calibrator/   (a saved calibrator directory; absent for a version without one)

A directory rather than a database table: workers need no store connection
(data flows one way, events → scores → store), and the same layout works on
one machine, on a shared volume, and from a Kubernetes ConfigMap or a synced
object-store prefix. Every write is atomic (a temporary file or directory
renamed into place), so a worker never reads half a version or half a rollout.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scorers.calibrators import Calibrator, load_calibrator
from scorers.errors import ConvowatchError, UserError
from scorers.rubrics import RubricSet

ROLLOUT_FILE = "rollout.json"
VERSIONS_DIR = "versions"
VERSION_FILE = "version.json"
RUBRIC_SET_FILE = "rubric_set.json"
CALIBRATOR_DIR = "calibrator"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


class RegistryError(UserError, ValueError):
    """A scorer version or rollout that cannot be used; the message names the version or file."""


@dataclass(frozen=True)
class Rollout:
    """Which registered version is active, and which (if any) scores a share of conversations as its shadow."""

    active: str | None = None
    shadow: str | None = None
    shadow_rate: float = 0.0

    def __post_init__(self) -> None:
        if self.shadow is not None and not 0 < self.shadow_rate <= 1:
            raise RegistryError(f"shadow_rate {self.shadow_rate!r} is not in (0, 1]")
        if self.shadow is not None and self.shadow == self.active:
            raise RegistryError(f"{self.shadow!r} cannot be both the active version and its shadow")

    def to_dict(self) -> dict[str, Any]:
        return {"active": self.active, "shadow": self.shadow, "shadow_rate": self.shadow_rate if self.shadow else 0.0}


@dataclass(frozen=True)
class ScorerVersion:
    """A registered version, loaded and checked: its rubric set and calibrator are ready to score with."""

    name: str
    rubric_set: RubricSet
    calibrator: Calibrator | None
    registered_at: float

    @property
    def calibrator_version(self) -> str:
        return self.calibrator.version_ if self.calibrator is not None else ""


def check_name(name: str) -> str:
    """``name`` if it can name a version (letters, digits, ``.``, ``_``, ``-``; at most 64), else `RegistryError`."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise RegistryError(
            f"version name {name!r} must be 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit"
        )
    return name


class ScorerRegistry:
    """The registry directory: register versions, read them back checked, and change the rollout."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root).expanduser()

    def __repr__(self) -> str:
        return f"ScorerRegistry({str(self.root)!r})"

    # -- versions ---------------------------------------------------------------------------------

    def names(self) -> list[str]:
        """Registered version names, oldest first."""
        versions = self.root / VERSIONS_DIR
        if not versions.is_dir():
            return []
        found = [d for d in versions.iterdir() if d.is_dir() and _NAME.fullmatch(d.name) and (d / VERSION_FILE).is_file()]
        return [d.name for d in sorted(found, key=lambda d: (d.stat().st_mtime, d.name))]

    def register(self, name: str, rubric_set: Path, calibrator: Path | None = None) -> ScorerVersion:
        """Copy a rubric set file (and a calibrator directory) into the registry as version ``name``.

        Both are loaded first, so a file that cannot score is refused here rather than by the workers; an existing
        name is refused (versions are immutable: register a new name instead). A symlink (the file, the calibrator
        directory or anything in it) is refused: the copy would hold whatever it points to, not what was reviewed."""
        check_name(name)
        target = self.root / VERSIONS_DIR / name
        if target.exists():
            raise RegistryError(f"version {name!r} is already registered in {self.root}; versions cannot be replaced")
        _refuse_symlinks(rubric_set, "the rubric set")
        if calibrator is not None:
            _refuse_symlinks(calibrator, "the calibrator")
        loaded_set = RubricSet.load(rubric_set)
        loaded_calibrator = load_calibrator(calibrator) if calibrator is not None else None
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=target.parent))
        try:
            shutil.copyfile(rubric_set, staging / RUBRIC_SET_FILE)
            if calibrator is not None:
                shutil.copytree(calibrator, staging / CALIBRATOR_DIR)
            registered_at = time.time()
            meta = {
                "name": name,
                "registered_at": registered_at,
                "rubric_set_version": loaded_set.version,
                "calibrator_version": loaded_calibrator.version_ if loaded_calibrator is not None else None,
                "source": {"rubric_set": str(rubric_set), "calibrator": str(calibrator) if calibrator else None},
            }
            (staging / VERSION_FILE).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
            os.rename(staging, target)  # atomic; fails if another register took the name meanwhile
        except OSError as e:
            shutil.rmtree(staging, ignore_errors=True)
            if target.exists():
                raise RegistryError(f"version {name!r} is already registered in {self.root}") from None
            raise RegistryError(f"cannot register {name!r} in {self.root}: {e}") from e
        return ScorerVersion(name, loaded_set, loaded_calibrator, registered_at)

    def version(self, name: str) -> ScorerVersion:
        """Version ``name`` loaded and checked; `RegistryError` naming what is wrong if it cannot score."""
        check_name(name)
        directory = self.root / VERSIONS_DIR / name
        if not (directory / VERSION_FILE).is_file():
            known = ", ".join(self.names()) or "none"
            raise RegistryError(f"no version {name!r} in {self.root} (registered: {known})")
        _refuse_symlinks(directory, f"version {name!r}")
        try:
            meta = json.loads((directory / VERSION_FILE).read_text(encoding="utf-8"))
            rubric_set = RubricSet.load(directory / RUBRIC_SET_FILE)
            calibrator_dir = directory / CALIBRATOR_DIR
            calibrator = load_calibrator(calibrator_dir) if calibrator_dir.exists() else None
        except (OSError, ValueError, ConvowatchError) as e:
            raise RegistryError(f"version {name!r} in {self.root} cannot be loaded: {e}") from e
        if rubric_set.version != meta.get("rubric_set_version"):
            raise RegistryError(
                f"version {name!r}: its rubric set is {rubric_set.version}, registered as {meta.get('rubric_set_version')}: "
                "the registry was edited by hand"
            )
        return ScorerVersion(name, rubric_set, calibrator, float(meta.get("registered_at", 0.0)))

    # -- rollout ----------------------------------------------------------------------------------

    def rollout(self) -> Rollout:
        """The current rollout (no active version when none was ever promoted)."""
        path = self.root / ROLLOUT_FILE
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return Rollout()
        except (OSError, ValueError) as e:
            raise RegistryError(f"{path}: cannot read the rollout: {e}") from e
        if not isinstance(doc, dict):
            raise RegistryError(f"{path}: the rollout must be a JSON object")
        try:
            rollout = Rollout(doc.get("active"), doc.get("shadow"), float(doc.get("shadow_rate") or 0.0))
        except (TypeError, ValueError) as e:
            raise RegistryError(f"{path}: {e}") from e
        for name in (rollout.active, rollout.shadow):
            if name is not None:
                check_name(name)
        return rollout

    def promote(self, name: str) -> Rollout:
        """Make ``name`` the active version (checked first); a shadow of the same name stops shadowing."""
        self.version(name)
        old = self.rollout()
        shadow = None if old.shadow == name else old.shadow
        return self._write(Rollout(name, shadow, old.shadow_rate if shadow else 0.0))

    def start_shadow(self, name: str, rate: float) -> Rollout:
        """Score a share ``rate`` of the judged conversations with ``name`` too (checked first), beside the active."""
        self.version(name)
        old = self.rollout()
        if old.active is None:
            raise RegistryError(f"no active version in {self.root} to shadow; promote one first")
        return self._write(Rollout(old.active, name, rate))

    def stop_shadow(self) -> Rollout:
        old = self.rollout()
        return self._write(Rollout(old.active))

    def _write(self, rollout: Rollout) -> Rollout:
        self.root.mkdir(parents=True, exist_ok=True)
        doc = {**rollout.to_dict(), "changed_at": time.time()}
        fd, tmp = tempfile.mkstemp(prefix=".rollout.", dir=self.root)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(json.dumps(doc, indent=2) + "\n")
            os.replace(tmp, self.root / ROLLOUT_FILE)
        except OSError as e:
            Path(tmp).unlink(missing_ok=True)
            raise RegistryError(f"cannot write {self.root / ROLLOUT_FILE}: {e}") from e
        return rollout


def _refuse_symlinks(path: Path, what: str) -> None:
    """`RegistryError` if ``path`` or anything below it is a symlink: a registered version is a copy of real files,
    never of what a link points to (a calibrator file linked to /etc/passwd, or a link changed after review)."""
    if path.is_symlink():
        raise RegistryError(f"{what}: {path} is a symlink; register the file itself, not a link to it")
    if not path.is_dir():
        return
    for root, dirs, files in os.walk(path):
        for entry in (*dirs, *files):
            if (Path(root) / entry).is_symlink():
                raise RegistryError(
                    f"{what}: {Path(root) / entry} is a symlink; a registered version holds only regular files "
                    "(copy what it points to into the directory)"
                )
