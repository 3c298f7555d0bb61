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
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from scorers.errors import UserError
from scorers.redaction import Redactor

try:  # Python >= 3.11
    import tomllib
except ModuleNotFoundError:  # pragma: no cover
    import tomli as tomllib  # type: ignore[no-redef]


class SettingsError(UserError, ValueError):
    """Configuration that cannot be used; the message names the setting."""


class Section(BaseModel):
    """A section of the settings: an unknown key is an error (a misspelt or leftover setting is never ignored)."""

    model_config = ConfigDict(extra="forbid")


class PriceSettings(Section):
    """What the judge's tokens cost, per million (docs/budget.md): cached prompt tokens at their own rate."""

    prompt_per_million: float = Field(ge=0, description="Price of 1M prompt tokens not served from the server's prompt cache.")
    cached_prompt_per_million: float | None = Field(
        default=None, ge=0, description="Price of 1M cached prompt tokens; None = the prompt price (no cache discount)."
    )
    completion_per_million: float = Field(ge=0, description="Price of 1M completion tokens.")
    currency: str = Field(default="USD", min_length=1, description="Label of the cost metric and the report, e.g. USD, EUR.")


class JudgeSettings(Section):
    """Which judge scores conversations, and how to reach it."""

    backend: Literal["openai", "local", "recorded"] = "local"
    # OpenAI-compatible HTTP judge
    base_url: str | None = None
    model: str | None = None
    api_key: SecretStr | None = Field(default=None, description="From CONVOWATCH_JUDGE__API_KEY only.")
    questions_per_call: int = Field(default=1, ge=1, description="1 = one call per question; >1 = several answer lines per call.")
    answer_format: Literal["lines", "grammar", "sequence", "json_schema"] = Field(
        default="lines",
        description="How multi-question replies are held to their format: lines = not at all, grammar = numbered lines "
        "held by a llama.cpp grammar, sequence = the answers alone, one token each, held by a llama.cpp grammar, "
        "json_schema = OpenAI structured outputs (scorers/judges/answer_format.py).",
    )
    top_logprobs: int = Field(default=20, ge=1, le=20)
    max_concurrency: int = Field(default=4, ge=1)
    max_calls_per_conversation: int = Field(
        default=2,
        ge=1,
        description="Of the max_concurrency calls in flight, how many one conversation's questions may take, so a "
        "conversation the judge answers slowly leaves slots to the others scored beside it (scoring.concurrency).",
    )
    max_retries: int = Field(default=5, ge=0)
    backoff_initial_s: float = Field(default=0.5, gt=0)
    backoff_max_s: float = Field(default=30.0, gt=0)
    timeout_s: float = Field(default=60.0, gt=0)
    prompt_reuse: Literal["any", "within_conversation", "none"] = Field(
        default="any",
        description="What a server's prompt cache may reuse: any = whatever it has (fastest; answers vary slightly "
        "with what was asked before), within_conversation = a reset before each conversation, none = a reset before "
        "each question (identical answers on repeat, a full prompt evaluation each) (docs/judge-cost.md).",
    )
    # Local judge (in-process llama.cpp, extra "llama"): a GGUF file; None = packaged Gemma 3 270M.
    local_model: Path | None = None
    # Recorded judge: an LLM-Rubric-style evaluations TSV.
    recorded_answers: Path | None = None
    # Transcript size cap (characters) before the truncation policy applies.
    max_transcript_chars: int = Field(default=24_000, ge=200)
    price: PriceSettings | None = Field(
        default=None, description="Price table for the cost metric and report; None = no cost figures."
    )


class KafkaSettings(Section):
    """The broker, topic names and client tuning. Defaults suit a real Apache Kafka."""

    bootstrap_servers: str = "127.0.0.1:9092"
    events_topic: str = "convowatch.events"
    closed_topic: str = "convowatch.closed"
    scores_topic: str = "convowatch.scores"
    dead_letter_topic: str = "convowatch.dead-letters"
    partitions: int = Field(default=4, ge=1, description="Partitions of each topic created on start (= max workers).")
    replication_factor: int = Field(default=1, ge=1)
    changelog_segment_s: float = Field(
        default=3600.0,
        gt=0,
        description="segment.ms of the changelog topic created on start: Kafka compacts only closed segments, and at its "
        "default (7 days) a restore would read up to a week of every conversation's states (bench/changelog_restore.py).",
    )
    app_id: str = Field(
        default="convowatch",
        description="Faust app id; the workers' consumer groups are <app_id>-assemble and <app_id>-score (consumer "
        "batch), or <app_id> (faust).",
    )
    data_dir: Path = Field(
        default=Path(".convowatch/worker"),
        description="The worker's local directory (Faust needs one even though its table lives in memory and the broker); "
        "created with its parents, owner-only (0700), on start.",
    )
    sink_group: str = "convowatch-sink"
    group_instance_id: str | None = Field(
        default=None,
        description="Kafka static group membership (group.instance.id) of this worker's or sink's consumers: a process "
        "restarted with the same id within session_timeout_s takes its partitions back with no rebalance. Give each "
        "process its own (the systemd units use the host and instance names). A static member does not leave its group when "
        "it stops: its partitions wait session_timeout_s for it before they move. None = dynamic membership.",
    )
    session_timeout_s: float = Field(default=30.0, gt=0)
    heartbeat_interval_s: float = Field(default=3.0, gt=0)
    max_poll_interval_s: float = Field(default=300.0, gt=0)
    commit_interval_s: float = Field(default=2.0, gt=0)
    admin_timeout_s: float = Field(default=30.0, gt=0, description="How long topic creation and replay wait for the broker.")
    # Longest a fetch waits for data (Kafka's fetch.max.wait.ms, default 500 ms; Faust hard-codes 1.5 s). The broker
    # answers as soon as data arrives; this bounds an idle fetch.
    fetch_max_wait_s: float = Field(default=0.5, gt=0, le=30)
    max_record_bytes: int = Field(
        default=1_000_000,
        ge=65_536,
        description="Largest record the worker and the sink produce (the producer's max request size; at most the "
        "broker's), and the largest batch the worker's stages send to one partition at once. A dead letter whose "
        "original does not fit keeps its start, size and SHA-256.",
    )
    refetch_idle_s: float = Field(
        default=10.0,
        gt=0,
        description="A worker partition with records waiting while its agent has been idle this long is fetched again.",
    )
    max_poll_records: int = Field(
        default=500,
        ge=1,
        description="Most records one poll hands the worker (Kafka's max.poll.records). Time spent delivering a poll's "
        "records to the agents counts against max_poll_interval_s, so a backlog must not arrive in one huge poll.",
    )
    consumer: Literal["batch", "faust"] = Field(
        default="batch",
        description="How the worker reads its topics: batch = a consumer group of its own per stage, a whole poll at a "
        "time, the conversations' state in memory and in the changelog topic (stream/poll_stage.py); faust = the "
        "assemble and score agents, the state a Faust table on the same changelog (the default before 2026-11-27; "
        "slower, docs/benchmarks.md). To switch a deployment from faust, stop every faust worker first: the batch "
        "groups start where the Faust group left off (the other way, the Faust group would read both topics again).",
    )
    stream_buffer_maxsize: int = Field(
        default=4096,
        ge=1,
        description="Events buffered per worker agent before Faust stops fetching (Faust's stream_buffer_maxsize).",
    )


class AssemblySettings(Section):
    """How events become conversations."""

    idle_timeout_s: float = Field(default=1800.0, gt=0, description="Close a conversation this long after its last event.")
    idle_check_interval_s: float = Field(default=10.0, gt=0)
    max_turns: int = Field(
        default=200, ge=1, description="A conversation is closed (cause max_turns) when it reaches this many turns."
    )
    max_open_conversations: int = Field(
        default=50_000,
        ge=1,
        description="Open conversations a worker keeps (about 4.5 KB each), each partition at most its share "
        "(this / kafka.partitions); past it, a partition's longest idle is closed at once (cause capacity) and "
        "scored with the turns it has.",
    )
    max_turn_index: int = Field(
        default=9_999,
        ge=0,
        description="Turns with a higher turn_index are dead-lettered (turn_index_too_large): every index below a "
        "conversation's highest that never came is listed in its missing_turn_indices, so the index bounds that list.",
    )
    max_conversation_bytes: int = Field(
        default=262_144,
        ge=1,
        description="A conversation is closed (cause max_bytes) when its turns' texts reach this many bytes (JSON-encoded, "
        "about 64k tokens: more than a judge reads at once), so its state, closed record and score record stay "
        "below kafka.max_record_bytes.",
    )
    max_text_bytes: int = Field(default=32_768, ge=1, description="Turn texts larger than this (UTF-8 bytes) are dead-lettered.")
    max_event_bytes: int = Field(default=262_144, ge=1, description="Whole events larger than this are dead-lettered.")
    closed_retention_s: float = Field(
        default=86_400.0,
        gt=0,
        description="How long a closed conversation is remembered to recognise late and redelivered events.",
    )
    batch_max_events: int = Field(
        default=500,
        ge=1,
        description="Events the assemble agent takes at a time; each conversation changed in a batch is written to "
        "the table (its changelog) once.",
    )
    batch_max_wait_s: float = Field(
        default=0.05, gt=0, description="Longest the assemble agent waits for a batch to fill before it processes it."
    )
    max_closed_conversations: int = Field(
        default=200_000,
        ge=1,
        description="Closed conversations a worker remembers (turn fingerprints, about 1.5 KB each), each partition at "
        "most its share (this / kafka.partitions); past it, a partition's oldest is forgotten before closed_retention_s.",
    )


class SamplingRuleSettings(Section):
    """Conversations whose attributes hold every ``match`` pair are judged with probability ``rate``."""

    match: dict[str, str] = Field(
        min_length=1, description="Attribute values a conversation must all have, e.g. {product: search}."
    )
    rate: float = Field(gt=0, le=1, description="Inclusion probability π of the matching conversations, in (0, 1].")


class SamplingSettings(Section):
    """Which closed conversations the judge scores (stream/sampling.py; docs/sampling.md).

    The default (rate 1, no rules) judges every conversation: behaviour as without sampling.
    """

    default_rate: float = Field(default=1.0, gt=0, le=1, description="π of conversations no rule matches, in (0, 1].")
    rules: list[SamplingRuleSettings] = Field(default_factory=list, description="First matching rule wins.")
    always_first_per_model_version: int = Field(
        default=0, ge=0, description="Judge (π = 1) the first N conversations of every model version a worker sees."
    )
    always_score_negative_feedback: bool = Field(
        default=True,
        description="Judge (π = 1) every conversation that received a thumbs-down while it was open "
        "(feedback after the close cannot change the decision).",
    )
    always_score_rated: bool = Field(
        default=True,
        description="Judge (π = 1) every conversation that received any rating (up or down) while it was open, so the "
        "agreement of the scorer with its users (convowatch_user_feedback_conversations_total) is counted on all of them.",
    )
    salt: str = Field(default="", description="Mixed into the hash of the conversation id: a new salt draws a new sample.")


class BudgetSettings(Section):
    """Judge budget per worker (stream/budget.py, docs/budget.md); None = no limit. While spent, scoring waits."""

    calls_per_minute: int | None = Field(default=None, gt=0, description="Judge requests per sliding minute.")
    tokens_per_minute: int | None = Field(
        default=None, gt=0, description="Judge tokens (prompt + completion) per sliding minute."
    )
    tokens_per_day: int | None = Field(default=None, gt=0, description="Judge tokens (prompt + completion) per sliding day.")
    minute_s: float = Field(default=60.0, gt=0, description="Length of the per-minute window in seconds (shorter only in tests).")
    day_s: float = Field(default=86_400.0, gt=0, description="Length of the per-day window in seconds (shorter only in tests).")


class ScoringSettings(Section):
    """Retries and aggregation when scoring closed conversations."""

    max_attempts: int = Field(default=5, ge=1, description="Judge attempts per conversation before it is stored as unscored.")
    retry_initial_s: float = Field(default=1.0, gt=0)
    retry_max_s: float = Field(default=60.0, gt=0)
    concurrency: int = Field(
        default=4,
        ge=1,
        description="Conversations scored at once per worker: a slow judge answer holds one slot, not the "
        "conversations behind it (bench/slow_judge.py).",
    )
    drain_s: float = Field(
        default=10.0,
        ge=0,
        description="How long a rebalance or a stop waits for the conversations being scored before it calls them off "
        "(the partition's next owner scores them again).",
    )
    deadline_s: float = Field(
        default=600.0,
        gt=0,
        description="Time one conversation may take across all its judge attempts and backoffs; when it passes the "
        "conversation is stored unscored with reason DeadlinePassed.",
    )
    trusted_judges: list[str] = Field(
        default_factory=list, description="Human judges the calibrator aggregates over; empty = shared weights."
    )
    dissatisfied_max_value: float = Field(default=2.0, description="Main-question answers <= this count as dissatisfied.")
    questions: Path | None = Field(
        default=None, description="Questions file defining the calibrator's questions (their texts for the judge)."
    )
    rubrics_per_round: int | None = Field(
        default=None,
        ge=1,
        description="Early stopping: rubrics asked per judge round, stopping once the label provably cannot change "
        "(scorers/early_stopping.py); None = every question in one round.",
    )
    max_label_change_probability: float = Field(
        default=0.0,
        ge=0.0,
        lt=1.0,
        description="Approximate early stopping (needs rubrics_per_round and the score moments `rubrics fit` records): "
        "also stop once the chance that the unasked rubrics would change a label is at most this; 0 = exact only.",
    )
    behaviours: str | None = Field(
        default=None,
        description="ABC-Eval behaviours judged on every assistant turn of a scored conversation: 'abc-eval' (the 16 "
        "shipped with convowatch) or a behaviour-set file; None = off. Costs one judge call per assistant turn and "
        "behaviour at judge.questions_per_call = 1 (docs/behaviours.md).",
    )
    behaviour_judge: Literal["judge", "local"] = Field(
        default="judge",
        description="Which judge answers the behaviour questions: judge = the configured judge; local = an in-process "
        "llama.cpp model (judge.local_model, default the packaged Gemma 3 270M), e.g. to keep one call per assistant "
        "turn and behaviour off a paid API. Its calls count under its own judge label, not in the scores' judge cost.",
    )
    behaviour_rate: float = Field(
        default=1.0,
        gt=0.0,
        le=1.0,
        description="Share of judged conversations whose assistant turns are judged for behaviours, chosen by a hash of "
        "the conversation id (the same on every worker and after a restart), so the rates per turn stay unbiased.",
    )
    injection_policy: Literal["flag", "abstain"] = Field(
        default="flag",
        description="What a scored conversation whose users' turns hold an injection attempt (scorers/injection.py) "
        "gets: flag = its label as judged, with the kinds found in injection_signals and the metric; abstain = also "
        "labelled uncertain (the judged label kept in extra).",
    )
    sampling: SamplingSettings = Field(default_factory=SamplingSettings)
    budget: BudgetSettings = Field(default_factory=BudgetSettings)
    registry: Path | None = Field(
        default=None,
        description="Scorer registry directory (stream/registry.py, docs/rollout.md): the active rubric set and "
        "calibrator and an optional shadow version, switched without restarting workers; None = the rubric_set and "
        "calibrator settings, fixed for the worker's lifetime.",
    )
    registry_poll_s: float = Field(
        default=10.0,
        gt=0,
        description="How often workers read the registry's rollout: a promotion applies within this plus the time to "
        "load the version.",
    )


class RedactionSettings(Section):
    """Personal data replaced before a conversation's text leaves for the judge (scorers/redaction.py); off by default."""

    kinds: list[Literal["email", "phone", "card", "key"]] = Field(
        default_factory=list,
        description="What to replace with a placeholder ([EMAIL], [PHONE], [CARD], [KEY]) before the judge reads a "
        "conversation: e-mail addresses, phone numbers, payment card numbers (Luhn-checked), API keys and private "
        "keys; empty = off.",
    )
    phone_region: str = Field(
        default="US", description="Region whose national phone numbers are recognised without a country code (ISO 3166)."
    )
    stored: bool = Field(
        default=False,
        description="Also store (and publish on the scores topic) the redacted text; false = the store keeps what the "
        "users wrote and only the judge sees the redacted text.",
    )

    def redactor(self) -> Redactor | None:
        """The redactor these settings ask for; None when redaction is off."""
        return Redactor(tuple(self.kinds), self.phone_region) if self.kinds else None


class StoreSettings(Section):
    """Where scores are written (ClickHouse)."""

    dsn: str = Field(
        default="chdb://.convowatch/clickhouse", description="chdb://DIR (embedded) or http(s)://user:pass@host:port."
    )
    database: str = "convowatch"
    batch_size: int = Field(default=500, ge=1)
    flush_interval_s: float = Field(default=1.0, gt=0)
    max_write_share: float = Field(
        default=0.5,
        gt=0,
        le=1,
        description="Most of its time the sink spends writing once caught up: after a write of w seconds it waits "
        "w * (1 / share - 1) before the next one, so a busy stream makes fewer, larger inserts.",
    )


class MetricsSettings(Section):
    """The Prometheus endpoint and its label policy."""

    host: str = "127.0.0.1"
    port: int = Field(default=9464, ge=0, le=65535, description="0 = no /metrics endpoint.")
    label_attributes: list[str] = Field(default_factory=lambda: ["product", "model_version"])
    max_label_values: int = Field(
        default=50, ge=1, description="Distinct values per attribute label; more are reported as 'other'."
    )
    max_label_combinations: int = Field(
        default=200,
        ge=1,
        description="Distinct combinations of the attribute labels; a combination without a slot keeps its first "
        "attribute and reports the others as 'other'.",
    )
    label_slot_window_s: float = Field(
        default=900.0,
        gt=0,
        description="Label slots (values per attribute, combinations) go to the values with the most conversations "
        "in each window of this length, re-evaluated at its end; a free slot goes to the first value until then.",
    )


class Settings(BaseSettings):
    """All of convowatch's configuration."""

    model_config = SettingsConfigDict(env_prefix="CONVOWATCH_", env_nested_delimiter="__", extra="forbid")

    judge: JudgeSettings = Field(default_factory=JudgeSettings)
    kafka: KafkaSettings = Field(default_factory=KafkaSettings)
    assembly: AssemblySettings = Field(default_factory=AssemblySettings)
    scoring: ScoringSettings = Field(default_factory=ScoringSettings)
    store: StoreSettings = Field(default_factory=StoreSettings)
    metrics: MetricsSettings = Field(default_factory=MetricsSettings)
    redaction: RedactionSettings = Field(default_factory=RedactionSettings)
    rubric_set: Path | None = None
    calibrator: Path | None = None
    cache_dir: Path = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "convowatch"
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    log_conversation_text: bool = Field(
        default=False,
        description="Let DEBUG logs show the payloads the client libraries (Kafka, HTTP, openai) log: records sent "
        "and fetched, requests and responses (they hold conversation text); false = bytes are logged as their size, "
        "Kafka protocol objects as their class name (stream/log_privacy.py).",
    )

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
