"""The JSON Faust writes (the table's changelog keys and values), the same bytes whatever JSON library is installed.

Faust's ``json`` codec writes with orjson whenever orjson is importable, and orjson writes non-ASCII characters as
UTF-8 where the standard library escapes them (``"é"`` against ``"\\u00e9"``). The changelog of open conversations is
compacted by key: if installing a package that pulls orjson in changed a conversation's key bytes, compaction would
keep the old key's open state after the conversation closed, and a restore would bring it back. The worker registers
`StandardJson` as Faust's ``json`` codec, and the batch assemble stage writes its keys with `dumps`, so both consumers
write the standard library's bytes in every environment.
"""

from __future__ import annotations

import json
from typing import Any

from faust.serializers import codecs
from faust.utils.json import on_default


def dumps(obj: Any) -> bytes:
    """``obj`` as Faust's JSON codec writes it without orjson: ASCII with escapes, no spaces."""
    return json.dumps(obj, default=on_default, separators=(",", ":")).encode("utf-8")


class StandardJson(codecs.Codec):
    """Faust's ``json`` codec on the standard library's `json` only."""

    def _dumps(self, obj: Any) -> bytes:
        return dumps(obj)

    def _loads(self, s: bytes) -> Any:
        return json.loads(s)


def register() -> None:
    """Make `StandardJson` Faust's ``json`` codec in this process (for every table and topic that names it)."""
    codecs.register("json", StandardJson())
