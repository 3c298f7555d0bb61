"""bench/pipeline_throughput.py's CPU window: the samples bracketing the phase's exact start and end (read from the
store afterwards) count, not the /metrics polls seconds apart that found the end (they added up to 2 s of an idle
worker to a 5 s window, so every cores figure read low)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "bench")]

import pipeline_throughput as bench  # noqa: E402


def _samples(rows: list[tuple[float, float]]) -> bench.CpuSamples:
    """Samples at wall-clock ``t`` with the workers' CPU seconds ``cpu`` (the other counters at 0)."""
    usage = bench.CpuSamples(None, broker_pid=0, worker_pids=[])
    usage.samples = [(t, cpu, 0.0, 0.0, 0.0, 0.0, 0.0) for t, cpu in rows]
    return usage


def test_the_window_is_the_samples_bracketing_start_and_end() -> None:
    usage = _samples([(100.0, 0.0), (101.0, 0.2), (102.0, 1.1), (103.0, 2.0), (105.0, 2.0)])
    used = usage.between(101.5, 102.5)
    assert used["window_s"] == 2.0 and used["workers_cpu_seconds"] == 1.8  # 101 → 103, not 100 → 105
    assert usage.between(101.0, 103.0)["window_s"] == 2.0  # a sample exactly at a bound is that bound
    assert usage.between(99.0, 110.0)["window_s"] == 5.0  # before the first or after the last: those


def test_samples_read_this_host_and_process() -> None:
    me = os.getpid()
    usage = bench.CpuSamples(me, broker_pid=me, worker_pids=[me])
    usage.take()
    start, busy_until = time.time(), time.process_time() + 0.3
    while time.process_time() < busy_until:  # a little CPU
        pass
    usage.take()
    used = usage.between(start, time.time())
    assert used["workers_cpu_seconds"] >= 0.2 and 0 < used["window_s"] < 10
    cores = used["cores"]
    assert cores["sink"] > 0.1 and cores["broker"] > 0.1 and cores["host"] > 0.1
    # "sink" and "broker" are this process, read one after the other: a clock tick may fall between the two reads
    assert abs(cores["sink"] - cores["broker"]) < 0.1
