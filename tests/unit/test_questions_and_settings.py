"""Question definitions and the settings object (env vars, config file, secrets)."""

import json

import pytest

from scorers.questions import Question, QuestionError, likert_question, load_questions
from stream.settings import Settings, SettingsError, load_settings


def test_question_validation():
    with pytest.raises(QuestionError, match="at least 2"):
        Question("q", "?", ("1",), ("a",))
    with pytest.raises(QuestionError, match="duplicate"):
        Question("q", "?", ("1", "1"), ("a", "b"))
    with pytest.raises(QuestionError, match="2 keys but 1 labels"):
        Question("q", "?", ("1", "2"), ("a",))


def test_likert_question_has_five_ordered_options():
    q = likert_question("r1", "The assistant fixes the bug.")
    assert q.option_keys == ("1", "2", "3", "4", "5")
    assert "The assistant fixes the bug." in q.prompt_block()


def test_load_questions_refuses_bad_files(tmp_path):
    bad = tmp_path / "q.json"
    bad.write_text(json.dumps({"questions": {"Q0": {"text": "x"}}}))
    with pytest.raises(QuestionError, match="questions.Q0"):
        load_questions(bad)
    bad.write_text("{not json")
    with pytest.raises(QuestionError, match="cannot read"):
        load_questions(bad)


def test_env_overrides_file_and_secrets_are_masked(tmp_path, monkeypatch):
    cfg = tmp_path / "convowatch.yaml"
    cfg.write_text("judge:\n  backend: openai\n  model: file-model\n  max_retries: 2\n")
    monkeypatch.setenv("CONVOWATCH_CONFIG", str(cfg))
    monkeypatch.setenv("CONVOWATCH_JUDGE__MODEL", "env-model")
    monkeypatch.setenv("CONVOWATCH_JUDGE__API_KEY", "sk-very-secret")
    s = load_settings()
    assert s.judge.backend == "openai"
    assert s.judge.model == "env-model"  # environment beats the file
    assert s.judge.max_retries == 2  # file beats the default
    assert s.judge.api_key is not None and s.judge.api_key.get_secret_value() == "sk-very-secret"
    assert "sk-very-secret" not in json.dumps(s.redacted())
    assert "sk-very-secret" not in repr(s)


def test_api_key_in_config_file_is_refused(tmp_path, monkeypatch):
    cfg = tmp_path / "c.toml"
    cfg.write_text('[judge]\napi_key = "sk-x"\n')
    monkeypatch.setenv("CONVOWATCH_CONFIG", str(cfg))
    with pytest.raises(SettingsError, match="api_key must come from CONVOWATCH_JUDGE__API_KEY"):
        load_settings()


def test_invalid_values_name_the_setting(monkeypatch):
    monkeypatch.setenv("CONVOWATCH_JUDGE__MAX_CONCURRENCY", "0")
    with pytest.raises(SettingsError, match="judge.max_concurrency"):
        load_settings()
    monkeypatch.delenv("CONVOWATCH_JUDGE__MAX_CONCURRENCY")
    monkeypatch.setenv("CONVOWATCH_NO_SUCH_SETTING", "1")
    assert isinstance(load_settings(), Settings)  # unknown env vars are ignored by design


@pytest.mark.parametrize("section", ["KAFKA", "JUDGE", "ASSEMBLY", "SCORING", "STORE", "METRICS"])
def test_an_unknown_key_in_a_section_is_refused(monkeypatch, section):
    # a leftover of a removed setting (kafka.producer_max_batch_size was silently ignored)
    monkeypatch.setenv(f"CONVOWATCH_{section}__PRODUCER_MAX_BATCH_SIZE", "5")
    with pytest.raises(SettingsError, match=f"{section.lower()}.producer_max_batch_size"):
        load_settings()


def test_unreadable_config_file_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("CONVOWATCH_CONFIG", str(tmp_path / "missing.yaml"))
    with pytest.raises(SettingsError, match="cannot read"):
        load_settings()
    bad = tmp_path / "bad.yaml"
    bad.write_text("judge: [unclosed")
    monkeypatch.setenv("CONVOWATCH_CONFIG", str(bad))
    with pytest.raises(SettingsError, match="not valid YAML"):
        load_settings()
