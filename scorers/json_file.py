"""Writing JSON documents (rubric sets, pools, reports) so that a reader never sees half a file."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def write_json(path: str | Path, doc: Any) -> None:
    """Write ``doc`` as indented UTF-8 JSON to a temporary file beside ``path``, then rename it over ``path``.

    Raises ValueError/TypeError (nothing written) if ``doc`` holds NaN, infinity or a non-JSON value."""
    path = Path(path)
    text = json.dumps(doc, indent=2, ensure_ascii=False, allow_nan=False)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text + "\n", encoding="utf-8")
    os.replace(tmp, path)
