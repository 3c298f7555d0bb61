"""Building the configured judge from settings: each backend, and clear errors for what is missing."""

import pytest

from scorers.judges.local import LocalModelError
from scorers.judges.openai_http import OpenAIJudge
from scorers.judges.recorded import RecordedJudge
from stream.judge_factory import judge_from_settings
from stream.settings import JudgeSettings, SettingsError
from tests.data_paths import LLM_RUBRIC


def test_recorded_backend_reads_the_configured_file(tmp_path):
    judge = judge_from_settings(
        JudgeSettings(backend="recorded", recorded_answers=LLM_RUBRIC / "gpt-3.5-turbo-16k_real_evaluations_FIXED.tsv"), tmp_path
    )
    assert isinstance(judge, RecordedJudge) and len(judge.table) == 2007
    with pytest.raises(SettingsError, match="CONVOWATCH_JUDGE__RECORDED_ANSWERS"):
        judge_from_settings(JudgeSettings(backend="recorded"), tmp_path)


def test_openai_backend_passes_the_settings_through(tmp_path):
    settings = JudgeSettings(
        backend="openai",
        base_url="http://127.0.0.1:9/v1",
        model="m",
        api_key="sk-factory-secret",
        questions_per_call=3,
        answer_format="grammar",
        max_retries=1,
    )
    judge = judge_from_settings(settings, tmp_path)
    assert isinstance(judge, OpenAIJudge) and judge.model == "m"
    assert (judge.questions_per_call, judge.answer_format, judge.endpoint.max_retries) == (3, "grammar", 1)
    assert "sk-factory-secret" not in repr(judge)
    with pytest.raises(SettingsError, match="judge.base_url .*judge.model"):
        judge_from_settings(JudgeSettings(backend="openai"), tmp_path)


def test_local_backend_uses_the_configured_model_path(tmp_path):
    with pytest.raises(LocalModelError, match="no-such-model"):
        judge_from_settings(JudgeSettings(backend="local", local_model=tmp_path / "no-such-model"), tmp_path)
