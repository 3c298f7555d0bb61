"""The changelog keys of the batch assemble stage (stream/assembly_stage.py) are the Faust table's.

A deployment switched from ``kafka.consumer`` faust to batch reads the open conversations back from the changelog the
Faust table wrote (tests/integration/test_pipeline.py switches one mid-replay; before the keys matched, every open
conversation lost its turns there), and one switched back reads the stage's.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import faust.serializers.codecs
import faust.utils.json
import pytest
from faust.serializers import codecs

from stream import changelog_codec
from stream.app import create_app
from stream.assembly_stage import changelog_key, conversation_of
from stream.service import build_rollout, new_metrics
from stream.settings import Settings
from tests.pipeline import LLM_RUBRIC_DATA, RECORDED_REAL_ANSWERS

# 'quote " and é': the standard library escapes non-ASCII (\u00e9); orjson, which Faust's own JSON codec uses whenever
# it is importable, writes UTF-8: installing orjson would change the changelog's key bytes under every deployment.
IDS = ["65c5d5f9f174b289770373d6", "12345", "true", 'quote " and é', "null"]


@pytest.fixture
def worker_codec() -> Iterator[None]:
    """Faust's codecs as the worker sets them (`create_app` registers `changelog_codec.StandardJson`), then restored."""
    faust_json = codecs.codecs["json"]
    changelog_codec.register()
    yield
    codecs.register("json", faust_json)


@pytest.mark.parametrize("conversation_id", IDS)
def test_a_key_is_written_as_the_faust_table_writes_it_and_read_back(conversation_id: str, worker_codec: None) -> None:
    faust_key = codecs.dumps("json", conversation_id)  # the table's key serializer, as its changelog holds it
    assert changelog_key(conversation_id) == faust_key
    assert conversation_of(faust_key) == conversation_id


def test_the_keys_stay_the_standard_librarys_when_faust_would_write_json_with_orjson(
    monkeypatch: pytest.MonkeyPatch, worker_codec: None
) -> None:
    """Mocked: Faust's JSON functions as they are when orjson is importable (UTF-8, no escapes). Installing orjson for
    real would switch Faust's codec for the whole test process."""

    def as_orjson(obj: object, **_: object) -> bytes:
        return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode("utf-8")

    monkeypatch.setattr(faust.utils.json, "dumps", as_orjson)
    assert codecs.codecs["json"].dumps("é") == b'"\\u00e9"' == changelog_key("é")
    assert faust.serializers.codecs.json().dumps("é") == '"é"'.encode()  # what Faust's own codec would write
    assert codecs.loads("json", b'"\\u00e9"') == "é" == codecs.loads("json", '"é"'.encode())


def test_the_worker_app_registers_the_standard_librarys_codec(tmp_path: Path) -> None:
    faust_json = codecs.codecs["json"]
    settings = Settings(
        judge={"backend": "recorded", "recorded_answers": RECORDED_REAL_ANSWERS},
        scoring={"questions": LLM_RUBRIC_DATA / "questions.json"},
        kafka={"data_dir": tmp_path / "worker"},
    )
    metrics = new_metrics(settings)
    try:
        create_app(settings, build_rollout(settings, metrics), metrics)
        assert isinstance(codecs.codecs["json"], changelog_codec.StandardJson)
    finally:
        codecs.register("json", faust_json)


@pytest.mark.parametrize("conversation_id", [i for i in IDS if not i.startswith("quote")])
def test_a_raw_key_the_stage_wrote_before_is_still_read(conversation_id: str) -> None:
    assert conversation_of(conversation_id.encode("utf-8")) == conversation_id
