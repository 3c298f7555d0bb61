"""One exception hierarchy (`scorers.errors`), one place that maps it to exit codes (`stream.commands.cli.main`).

Every exception class defined in scorers/, stream/, dashboards/ and deploy/ derives from `ConvowatchError`, so
a new class that forgets fails here; scorers/ (the library) never imports the service, the dashboards or the
deployment code; and the CLI turns any `ConvowatchError` into one ``convowatch: error: ...`` line and exit code 2.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

from scorers.errors import ConvowatchError, ModelAuthError, ModelError, ModelReplyError, ServiceError, UserError
from scorers.judges.base import JudgeAuthError, JudgeError, JudgeReplyError, JudgeUnavailable
from scorers.learning.generators import GeneratorAuthError, GeneratorError, GeneratorReplyError, GeneratorUnavailable
from scorers.rubrics import RubricSetError
from stream.commands import cli as cli_module

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("scorers", "stream", "dashboards", "deploy")


def _exception_classes() -> dict[str, type[BaseException]]:
    """``{"module.Class": class}`` for every exception class defined at the top level of a module in `PACKAGES`."""
    found: dict[str, type[BaseException]] = {}
    for package in PACKAGES:
        root = importlib.import_module(package)
        modules = [root] + [importlib.import_module(info.name) for info in pkgutil.walk_packages(root.__path__, f"{package}.")]
        for module in modules:
            for name, obj in vars(module).items():
                if inspect.isclass(obj) and issubclass(obj, BaseException) and obj.__module__ == module.__name__:
                    found[f"{module.__name__}.{name}"] = obj
    return found


def test_every_exception_class_derives_from_convowatch_error() -> None:
    classes = _exception_classes()
    assert "scorers.rubrics.RubricSetError" in classes and "stream.store.StoreError" in classes  # the walk saw them
    outside = {name for name, cls in classes.items() if not issubclass(cls, ConvowatchError)}
    assert not outside, (
        f"derive these from scorers.errors.UserError or ServiceError (keep their ValueError/RuntimeError): {sorted(outside)}"
    )


def test_every_error_is_either_a_user_error_or_a_service_error() -> None:
    roots = {"scorers.errors.ConvowatchError", "scorers.errors.UserError", "scorers.errors.ServiceError"}
    classes = {n: c for n, c in _exception_classes().items() if n not in roots}
    wrong = sorted(n for n, c in classes.items() if issubclass(c, UserError) == issubclass(c, ServiceError))
    assert not wrong, f"each error is a UserError or a ServiceError, not both or neither: {wrong}"


def test_judges_and_generators_are_one_family() -> None:
    for judge, generator, shared in [
        (JudgeError, GeneratorError, ModelError),
        (JudgeAuthError, GeneratorAuthError, ModelAuthError),
        (JudgeReplyError, GeneratorReplyError, ModelReplyError),
    ]:
        assert issubclass(judge, shared) and issubclass(generator, shared)
        assert issubclass(judge, RuntimeError) and issubclass(generator, RuntimeError)  # `except RuntimeError` still holds
    assert JudgeUnavailable.transient and GeneratorUnavailable.transient
    assert not JudgeAuthError.transient and not GeneratorReplyError.transient
    assert issubclass(RubricSetError, UserError) and issubclass(RubricSetError, ValueError)


def _imported_top_level_names(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_the_scoring_library_never_imports_the_service() -> None:
    """scorers/ is a plain library: no import (top-level or inside a function) of stream/, dashboards/, deploy/, bench/."""
    files = sorted((REPO / "scorers").rglob("*.py"))
    assert files
    offending = {
        str(path.relative_to(REPO)): sorted(bad)
        for path in files
        if (bad := _imported_top_level_names(path) & {"stream", "dashboards", "deploy", "bench", "tests"})
    }
    assert not offending, f"scorers/ must not import these: {offending}"


# --- the CLI maps errors in one place --------------------------------------------------------------------


@pytest.mark.parametrize(
    "error",
    [
        RubricSetError("rubrics[0].text", "must not be empty", "rs.json"),
        JudgeUnavailable("judge 'm' at http://x still failing after 3 attempt(s): timed out"),
        FileNotFoundError(2, "No such file or directory", "missing.json"),
    ],
    ids=["user", "service", "missing-file"],
)
def test_cli_turns_convowatch_errors_into_one_line_and_exit_code_2(monkeypatch, capsys, error: Exception) -> None:
    def fail(*args, **kwargs):
        raise error

    monkeypatch.setattr(cli_module.cli, "main", fail)
    with pytest.raises(SystemExit) as exited:
        cli_module.main(["config"])
    assert exited.value.code == 2
    assert capsys.readouterr().err == f"convowatch: error: {error}\n"


def test_cli_lets_a_bug_keep_its_traceback(monkeypatch) -> None:
    def fail(*args, **kwargs):
        raise KeyError("a bug")

    monkeypatch.setattr(cli_module.cli, "main", fail)
    with pytest.raises(KeyError):
        cli_module.main(["config"])


def test_cli_run_on_a_bad_rubric_set_file_prints_one_line_and_exits_2(tmp_path: Path) -> None:
    answers = tmp_path / "answers.tsv"  # the recorded judge, so no model or server is needed
    answers.write_text("text_id\tcriterion\tsample_llm\tanswer1_prob\tanswer2_prob\nc1\tQ0\t1\t0.5\t0.5\n")
    rubric_set = tmp_path / "rubric-set.json"
    rubric_set.write_text('{"rubrics": []}')
    labelled = tmp_path / "labelled.jsonl"
    labelled.write_text("")
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONVOWATCH_")}
    env.update({"CONVOWATCH_JUDGE__BACKEND": "recorded", "CONVOWATCH_JUDGE__RECORDED_ANSWERS": str(answers)})
    args = ["rubrics", "fit", "--rubric-set", rubric_set, "--labelled", labelled, "--out", tmp_path / "fitted.json"]
    done = subprocess.run(
        [sys.executable, "-m", "stream.commands.cli", *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(f"convowatch: error: {rubric_set}: ") and done.stderr.count("\n") == 1, done.stderr
    assert done.stdout == ""
