"""`pip install` of a built wheel gives a working service outside the checkout (no Makefile tricks).

faust-streaming pins click < 8.4; transformers >= 5.18's hub client needs
click >= 8.4.2. The dependency set must resolve as declared: pip's resolver,
run in a fresh virtualenv (no system site-packages) on the wheel as a dry run,
settles the whole set or fails with the conflict. The wheel itself is then
installed without its dependencies into a second virtualenv that borrows the
test environment's packages (the same declared set, installed by `make
install`), and the console script and the worker, sink and replay modules load
from it. Downloading and unpacking the ~120 packages again took 4.5 min of a CI
run; the resolver's dry run makes the same choice in about a minute.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
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
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """convowatch's wheel, built from a copy of the checkout."""
    base = tmp_path_factory.mktemp("wheel")
    # Built from a copy: setuptools writes build/ into the source tree, and a stale build/ would leak into wheels.
    source = base / "source"
    shutil.copytree(
        REPO, source, ignore=shutil.ignore_patterns(".git", ".venv", "build", "*.egg-info", "__pycache__", ".convowatch")
    )
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(base / "dist"), str(source)])
    (built,) = (base / "dist").glob("convowatch-*.whl")
    return built


@pytest.fixture(scope="module")
def resolved(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """What ``pip install <wheel>`` in a fresh virtualenv would install: name -> version, from the resolver's report."""
    base = tmp_path_factory.mktemp("resolve")
    venv.EnvBuilder(with_pip=True, system_site_packages=False).create(base / "venv")
    report = base / "report.json"
    argv = [str(base / "venv" / "bin" / "python"), "-m", "pip", "install", "--dry-run", "--quiet", "--ignore-installed"]
    _run([*argv, "--report", str(report), str(wheel)], timeout=INSTALL_TIMEOUT_S)
    chosen = json.loads(report.read_text(encoding="utf-8"))["install"]
    return {item["metadata"]["name"].lower(): item["metadata"]["version"] for item in chosen}


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A virtualenv with the wheel installed (no dependencies) over the test environment's packages.

    A ``.pth`` line appends the test environment's site-packages after the virtualenv's own, so ``import stream``
    finds the installed wheel; that directory's own ``.pth`` files (the checkout's editable install) are not read.
    """
    env_dir = tmp_path_factory.mktemp("installed") / "venv"
    venv.EnvBuilder(with_pip=True, system_site_packages=False).create(env_dir)
    python = env_dir / "bin" / "python"
    own = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"]).stdout.strip())
    borrowed = dict.fromkeys([sysconfig.get_path("purelib"), sysconfig.get_path("platlib")])
    (own / "borrowed-test-environment.pth").write_text("".join(f"{path}\n" for path in borrowed), encoding="utf-8")
    _run([str(python), "-m", "pip", "install", "--quiet", "--no-deps", str(wheel)])
    return env_dir


def test_the_declared_dependency_set_resolves_without_conflict(wheel: Path, resolved: dict[str, str]) -> None:
    assert resolved["convowatch"] == wheel.name.split("-")[1]
    for name in ("faust-streaming", "transformers", "torch", "msgspec", "clickhouse-connect", "chdb"):
        assert name in resolved, name
    assert tuple(int(p) for p in resolved["click"].split(".")[:2]) < (8, 4)
    assert resolved["torch"].startswith("2.13.0")


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
