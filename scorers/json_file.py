"""JSON documents (rubric sets, pools, behaviour sets, reports): read strictly, written so that a reader never sees half a file."""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

DUPLICATE_KEYS_SHOWN = 10  # an error names this many duplicated keys, then how many more


def write_json(path: str | Path, doc: Any) -> None:
    """Write ``doc`` as indented UTF-8 JSON to a temporary file beside ``path``, then rename it over ``path``.

    Raises ValueError/TypeError (nothing written) if ``doc`` holds NaN, infinity or a non-JSON value."""
    path = Path(path)
    text = json.dumps(doc, indent=2, ensure_ascii=False, allow_nan=False)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text + "\n", encoding="utf-8")
    os.replace(tmp, path)


def loads_strict(text: str) -> Any:
    """Parse JSON, refusing what `json.loads` lets through: duplicate keys and NaN/Infinity (ValueError)."""
    return json.loads(text, object_pairs_hook=_no_duplicate_keys, parse_constant=_no_constant)


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """The object's dict, or ValueError naming its duplicated keys. One pass (a dict is shorter than the pairs exactly
    when a key repeats): 60,000 keys took 56 s with a count per key, quadratic."""
    out = dict(pairs)
    if len(out) != len(pairs):
        duplicated = sorted(key for key, n in Counter(k for k, _ in pairs).items() if n > 1)
        shown = duplicated[:DUPLICATE_KEYS_SHOWN]
        more = f" and {len(duplicated) - len(shown)} more" if len(duplicated) > len(shown) else ""
        raise ValueError(f"duplicate JSON key(s) {shown}{more}")
    return out


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not valid JSON")


def json_path(parts: Sequence[str | int]) -> str:
    """``rubrics[2].scale`` from a validation error's path parts."""
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out
