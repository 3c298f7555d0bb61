"""`pip install` of a built wheel gives a working service in a fresh virtualenv (no Makefile tricks).

faust-streaming pins click < 8.4; transformers >= 5.18's hub client needs
click >= 8.4.2. The dependency set must resolve as declared, so pip installs
the wheel with its dependencies, `pip check` finds no conflict, and the
service's commands and the worker, sink and replay modules load.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from dashboards import catalog

REPO = Path(__file__).resolve().parents[2]
INSTALL_TIMEOUT_S = 1500

pytestmark = pytest.mark.slow


def _run(argv: list[str], timeout: float = 300, **kwargs) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kwargs)
    assert done.returncode == 0, f"{' '.join(argv)} failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtualenv (no system site-packages) with convowatch's wheel and its declared dependencies."""
    base = tmp_path_factory.mktemp("wheel")
    dist = base / "dist"
    # Built from a copy: setuptools writes build/ into the source tree, and a stale build/ would leak into wheels.
    source = base / "source"
    shutil.copytree(
        REPO, source, ignore=shutil.ignore_patterns(".git", ".venv", "build", "*.egg-info", "__pycache__", ".convowatch")
    )
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(dist), str(source)])
    (wheel,) = dist.glob("convowatch-*.whl")
    env_dir = base / "venv"
    venv.EnvBuilder(with_pip=True, system_site_packages=False).create(env_dir)
    python = env_dir / "bin" / "python"
    _run([str(python), "-m", "pip", "install", "--quiet", str(wheel)], timeout=INSTALL_TIMEOUT_S)
    return env_dir


def test_the_dependency_set_has_no_conflict(installed: Path) -> None:
    done = _run([str(installed / "bin" / "python"), "-m", "pip", "check"])
    assert "No broken requirements" in done.stdout


def test_the_console_script_and_the_service_commands_work(installed: Path, tmp_path: Path) -> None:
    convowatch = str(installed / "bin" / "convowatch")
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONVOWATCH_")}
    top = _run([convowatch, "--help"], cwd=tmp_path, env=env).stdout
    for command in ("run", "sink", "replay", "summary", "learn"):
        assert command in top
    for command in ("run", "sink", "replay"):
        assert "Usage:" in _run([convowatch, command, "--help"], cwd=tmp_path, env=env).stdout


def test_the_worker_sink_and_replay_modules_load_outside_the_checkout(installed: Path, tmp_path: Path) -> None:
    code = (
        "import stream.app, stream.sink, stream.replay.sources, scorers.rubrics, dashboards.catalog, faust, click;"
        "import stream, pathlib; print(pathlib.Path(stream.__file__).parent); print(click.__version__)"
    )
    where, click_version = _run([str(installed / "bin" / "python"), "-c", code], cwd=tmp_path).stdout.split()
    assert Path(where).is_relative_to(installed), where  # the installed package, not the checkout
    assert tuple(int(p) for p in click_version.split(".")[:2]) < (8, 4)


def test_package_data_ships_in_the_wheel(installed: Path, tmp_path: Path) -> None:
    code = (
        "import json, stream.contract as c, pathlib, dashboards;"
        "d = pathlib.Path(dashboards.__file__).parent;"
        "print(len(list((d / 'json').glob('*.json'))), len(list((d / 'alerts').glob('*.yml'))))"
    )
    dashboards, rules = _run([str(installed / "bin" / "python"), "-c", code], cwd=tmp_path).stdout.split()
    assert int(dashboards) == len(catalog.dashboards()) == 5 and int(rules) == 1
