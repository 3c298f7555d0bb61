"""The one settings object.

Values come, highest priority first, from: explicit arguments, environment
variables ``CONVOWATCH_<FIELD>`` (nested with ``__``, e.g.
``CONVOWATCH_JUDGE__BASE_URL``), a YAML/TOML config file named by
``CONVOWATCH_CONFIG``, then the defaults below. Secrets (the judge API key)
are read from the environment only and are never printed: they are
`SecretStr`, and `Settings.redacted()` is what logs and ``convowatch config``
show.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

try:  # Python >= 3.11
    import tomllib
except ModuleNotFoundError:  # pragma: no cover
    import tomli as tomllib  # type: ignore[no-redef]


class SettingsError(ValueError):
    """Configuration that cannot be used; the message names the setting."""


class JudgeSettings(BaseModel):
    """Which judge scores conversations, and how to reach it."""

    backend: Literal["openai", "local", "recorded"] = "local"
    # OpenAI-compatible HTTP judge
    base_url: str | None = None
    model: str | None = None
    api_key: SecretStr | None = Field(default=None, description="From CONVOWATCH_JUDGE__API_KEY only.")
    questions_per_call: int = Field(default=1, ge=1, description="1 = one call per question; >1 = several answer lines per call.")
    top_logprobs: int = Field(default=20, ge=1, le=20)
    max_concurrency: int = Field(default=4, ge=1)
    max_retries: int = Field(default=5, ge=0)
    backoff_initial_s: float = Field(default=0.5, gt=0)
    backoff_max_s: float = Field(default=30.0, gt=0)
    timeout_s: float = Field(default=60.0, gt=0)
    # Local transformers judge: a Hugging Face model directory or a GGUF file; None = packaged Gemma 3 270M.
    local_model: Path | None = None
    # Recorded judge: an LLM-Rubric-style evaluations TSV.
    recorded_answers: Path | None = None
    # Transcript size cap (characters) before the truncation policy applies.
    max_transcript_chars: int = Field(default=24_000, ge=200)


class Settings(BaseSettings):
    """All of convowatch's configuration."""

    model_config = SettingsConfigDict(env_prefix="CONVOWATCH_", env_nested_delimiter="__", extra="forbid")

    judge: JudgeSettings = Field(default_factory=JudgeSettings)
    rubric_set: Path | None = None
    calibrator: Path | None = None
    cache_dir: Path = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "convowatch"
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"

    @field_validator("cache_dir")
    @classmethod
    def _expand(cls, v: Path) -> Path:
        return v.expanduser()

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, _ConfigFileSource(settings_cls))

    def redacted(self) -> dict[str, Any]:
        """Settings as plain data with secrets masked: safe to print or log."""
        return self.model_dump(mode="json")  # SecretStr dumps as '**********'


class _ConfigFileSource(PydanticBaseSettingsSource):
    """Reads the YAML or TOML file named by CONVOWATCH_CONFIG; refuses secrets in it."""

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:  # pragma: no cover - unused
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        name = os.environ.get("CONVOWATCH_CONFIG")
        if not name:
            return {}
        path = Path(name).expanduser()
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as e:
            raise SettingsError(f"CONVOWATCH_CONFIG={path}: cannot read: {e}") from e
        try:
            data = tomllib.loads(text) if path.suffix == ".toml" else yaml.safe_load(text)
        except (tomllib.TOMLDecodeError, yaml.YAMLError) as e:
            raise SettingsError(f"CONVOWATCH_CONFIG={path}: not valid {'TOML' if path.suffix == '.toml' else 'YAML'}: {e}") from e
        if data is None:
            return {}
        if not isinstance(data, dict):
            raise SettingsError(f"CONVOWATCH_CONFIG={path}: top level must be a mapping")
        if isinstance(data.get("judge"), dict) and "api_key" in data["judge"]:
            raise SettingsError(f"CONVOWATCH_CONFIG={path}: judge.api_key must come from CONVOWATCH_JUDGE__API_KEY, not a file")
        return data


def load_settings(**overrides: Any) -> Settings:
    """Build the settings, turning validation failures into one readable `SettingsError`."""
    try:
        return Settings(**overrides)
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in e.errors())
        raise SettingsError(f"invalid configuration: {problems}") from e
