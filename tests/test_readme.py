"""The README shows what the code does: its embedded event schema is the published schema file."""

from __future__ import annotations

import json
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_readme_embeds_the_event_schema_file_unchanged() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    m = re.search(r"<!-- events-schema:start -->\n```json\n(.*?)\n```\n<!-- events-schema:end -->", readme, re.S)
    assert m, "README lost its events-schema block"
    assert json.loads(m.group(1)) == json.loads((REPO / "stream" / "schemas" / "events.schema.json").read_text(encoding="utf-8"))
