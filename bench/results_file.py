"""A benchmark's figures written to bench/results/, with the machine and the time they were measured on."""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path
from typing import Any


def write_results(path: Path, figures: dict[str, Any]) -> None:
    """Write ``figures`` and the machine (CPUs, Python, platform) and UTC time as JSON to ``path``; say so."""
    out = {
        **figures,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {path}")
