"""A tracked pid is trusted only if its command line is the service's: for Kafka, java started with the stack's
mark, never any java process (the stack signals what it trusts)."""

from __future__ import annotations

import os
import sys

import pytest

from deploy.local.kafka import JAVA_MARK
from deploy.local.processes import process_alive, runs
from deploy.local.stack import EXECUTABLES

KAFKA = f"java {JAVA_MARK}"


@pytest.mark.parametrize(
    ("argv", "executable", "expected"),
    [
        (["/usr/bin/prometheus", "--config.file=x"], "prometheus", True),
        (["/usr/bin/prometheusx"], "prometheus", False),
        ([""], "prometheus", False),
        (["/usr/lib/jvm/x/bin/java", JAVA_MARK, "-Xmx1G", "kafka.Kafka", "server.properties"], KAFKA, True),
        (["/usr/bin/java", "-jar", "other.jar"], KAFKA, False),
        (["/usr/bin/java"], KAFKA, False),
        (["/usr/bin/javac", JAVA_MARK], KAFKA, False),
    ],
)
def test_runs_matches_the_basename_and_the_arguments_that_must_follow(argv, executable, expected) -> None:  # type: ignore[no-untyped-def]
    assert runs(argv, executable) is expected


def test_this_python_process_is_not_taken_for_the_broker() -> None:
    here = os.path.basename(sys.executable)
    assert not process_alive(os.getpid(), EXECUTABLES["kafka"])
    with open(f"/proc/{os.getpid()}/cmdline", "rb") as f:
        first_two = f.read().split(b"\0")[1:3]
    if first_two[0] == b"-m":  # run as `python -m pytest`: the same check accepts the module it names
        assert process_alive(os.getpid(), [f"{here} -m {first_two[1].decode()}"])
