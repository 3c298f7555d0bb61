"""The changelog keys of the batch assemble stage (stream/assembly_stage.py) are the Faust table's.

A deployment switched from ``kafka.consumer`` faust to batch reads the open conversations back from the changelog the
Faust table wrote (tests/integration/test_pipeline.py switches one mid-replay; before the keys matched, every open
conversation lost its turns there), and one switched back reads the stage's.
"""

from __future__ import annotations

import pytest
from faust.serializers import codecs

from stream.assembly_stage import changelog_key, conversation_of

# 'quote " and é': Faust's JSON codec escapes non-ASCII (\u00e9) with the standard library, not with orjson, which it
# uses whenever orjson is importable: installing orjson would change the changelog's key bytes under every deployment.
IDS = ["65c5d5f9f174b289770373d6", "12345", "true", 'quote " and é', "null"]


@pytest.mark.parametrize("conversation_id", IDS)
def test_a_key_is_written_as_the_faust_table_writes_it_and_read_back(conversation_id: str) -> None:
    faust_key = codecs.dumps("json", conversation_id)  # the table's key serializer, as its changelog holds it
    assert changelog_key(conversation_id) == faust_key
    assert conversation_of(faust_key) == conversation_id


@pytest.mark.parametrize("conversation_id", [i for i in IDS if not i.startswith("quote")])
def test_a_raw_key_the_stage_wrote_before_is_still_read(conversation_id: str) -> None:
    assert conversation_of(conversation_id.encode("utf-8")) == conversation_id
