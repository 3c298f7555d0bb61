"""A tracked pid is trusted only if its command line is the service's: for the files broker, python running its
module, never any python process (the stack signals what it trusts)."""

from __future__ import annotations

import os
import sys

import pytest

from deploy.local.processes import process_alive, runs
from deploy.local.stack import EXECUTABLES


@pytest.mark.parametrize(
    ("argv", "executable", "expected"),
    [
        (["/usr/bin/tansu", "broker", "--listener-url", "x"], "tansu", True),
        (["/usr/bin/tansux"], "tansu", False),
        ([""], "tansu", False),
        (["/v/bin/python", "-m", "deploy.local.kafka_broker", "--port", "1"], "python -m deploy.local.kafka_broker", True),
        (["/v/bin/python", "-m", "pytest"], "python -m deploy.local.kafka_broker", False),
        (["/v/bin/python"], "python -m deploy.local.kafka_broker", False),
        (["/v/bin/python3", "-m", "deploy.local.kafka_broker"], "python -m deploy.local.kafka_broker", False),
    ],
)
def test_runs_matches_the_basename_and_the_arguments_that_must_follow(argv, executable, expected) -> None:  # type: ignore[no-untyped-def]
    assert runs(argv, executable) is expected


def test_this_python_process_is_not_taken_for_the_files_broker() -> None:
    here = os.path.basename(sys.executable)
    assert not process_alive(os.getpid(), EXECUTABLES["kafka"])
    with open(f"/proc/{os.getpid()}/cmdline", "rb") as f:
        first_two = f.read().split(b"\0")[1:3]
    if first_two[0] == b"-m":  # run as `python -m pytest`: the same check accepts the module it names
        assert process_alive(os.getpid(), [f"{here} -m {first_two[1].decode()}"])
