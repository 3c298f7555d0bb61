"""A benchmark's figures written to bench/results/, with the machine and the time they were measured on."""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path
from typing import Any


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), so that seconds from different hosts are told apart."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def write_results(path: Path, figures: dict[str, Any]) -> None:
    """Write ``figures`` and the machine (CPU, CPUs, Python, platform) and UTC time as JSON to ``path``; say so."""
    out = {
        **figures,
        "machine": {
            "cpu": cpu_model(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {path}")
