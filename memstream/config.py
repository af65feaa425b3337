"""Settings for every memstream component. No global state; nothing reads the environment
except ``Settings.from_env()``, which a host (or the CLI) calls on purpose."""
from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, SecretStr, ValidationInfo, field_validator
from pydantic.dataclasses import dataclass as pydantic_dataclass

from memstream.projections.schema_names import check_schema_name
from memstream.read_settings import EPISODE_WEIGHTS, FACT_WEIGHTS, READ_DEADLINE_S, Budgets, Weights

def local_dsn(pgdata: Path) -> str | None:
    """The DSN of the local stack's Postgres with data in ``pgdata``: its Unix socket, as its
    ``postmaster.pid`` names it (pid, data dir, start time, port, socket dir, ...: Postgres' own
    layout), or None when it is not running there."""
    try:
        socket_dir = (pgdata / "postmaster.pid").read_text().splitlines()[4].strip()
    except (OSError, IndexError):
        return None
    return f"postgresql://postgres:@/postgres?host={socket_dir}" if socket_dir else None


@pydantic_dataclass(frozen=True)
class TenantLimits:
    """The HTTP API's limits per tenant (``memstream.api.limits``)."""

    rate: float = Field(50.0, gt=0)  # requests per second, sustained
    burst: int = Field(100, ge=1)  # requests at once above the rate
    concurrent: int = Field(16, ge=1)  # requests that read the stores, in flight at once
    forgets_per_minute: int = Field(60, ge=1)


class Settings(BaseModel):
    kafka_bootstrap: str = "127.0.0.1:19092"
    events_topic: str = "memstream.events"
    decisions_topic: str = "memstream.decisions"
    dead_letter_topic: str = "memstream.dead-letter"
    # Plain JSON turns from any Kafka client; the worker seals them into the events topic.
    ingress_topic: str = "memstream.ingress"
    # How long plaintext may stay on Kafka: the ingress and dead-letter topics' retention.
    plaintext_retention_s: float = Field(7 * 86400, gt=0, le=7 * 86400)
    partitions: int = Field(4, ge=1)
    replication_factor: int = Field(1, ge=1)
    group_id: str = "memstream-worker"

    # None means "the local stack's Postgres under ``home``" (``dsn()``).
    postgres_dsn: str | None = None
    postgres_schema: str = "memstream"
    redis_url: str = "redis://127.0.0.1:16379/0"

    # Crypto-shredding (memstream.keys): every record of a user on the log is sealed with a
    # data key of theirs. The wrapped keys live in ``keys_schema`` (never rebuilt: back it up),
    # wrapped by ``kek``: "local" (key files under ``home``/keys), "file:<path>" (key files at
    # <path>, <path>.2, ...: keep them off the disk the database is on) or "kms:<key id, ARN or
    # alias>" (an alias, to rotate). ``kek_retire_days``: how long KMS keeps a rotated-out key.
    # ``seal_records=False`` writes new records plain (a replay still opens sealed ones): then
    # forgetting a user cannot reach the log's copies.
    seal_records: bool = True
    keys_schema: str = "memstream_keys"
    kek: str = "local"
    kek_retire_days: int = Field(7, ge=7, le=30)

    home: Path = Path(".memstream")  # local stack data, logs and jars
    tier0_turns: int = Field(20, ge=1)  # recent turns kept per conversation in Redis
    tier0_ttl_s: int = Field(3 * 86400, ge=60)  # ...for this long after the conversation's last turn
    batch_size: int = Field(256, ge=1)
    batch_seconds: float = Field(0.01, gt=0)  # linger per hop: at low load latency ~ 2 x this
    embed_threads: int = Field(1, ge=1)  # worker: leave a core for Kafka, Postgres and the other role
    read_embed_threads: int = Field(1, ge=1)  # read client: one core embeds while Postgres uses the other
    # MiniLM variant (memstream.embedding.minilm): "dynamic" int8 compute or "weights" as shipped.
    embedding_variant: Literal["dynamic", "weights"] = "dynamic"
    # The embedder: "minilm" (in process, 384-d), "openai" (an OpenAI-compatible /v1/embeddings:
    # ``embedding_base_url`` / ``embedding_api_key`` default to the ``openai_*`` ones) or "titan"
    # (Bedrock Titan Text Embeddings v2, ``bedrock_region``). ``embedding_dimensions``: asked of a
    # model that shortens its vectors; the stores' vector columns take it (docs/models.md).
    embedder: Literal["minilm", "openai", "titan"] = "minilm"
    embedding_model: str | None = None
    embedding_dimensions: int | None = Field(None, ge=1, le=2000)  # pgvector indexes (HNSW) up to 2,000
    embedding_base_url: str | None = None
    embedding_api_key: SecretStr | None = None
    # "openai": what the model takes in one vector, in characters (a service has no tokenizer to
    # ask); a longer text is also embedded as passages of this length. None: sent whole (its
    # first 24,000 characters, the most a service is sent of one text).
    embedding_window_chars: int | None = Field(None, ge=64, le=24_000)
    # The worker stops (rather than keep dead-lettering) past this many dead letters per batch
    # window of 1000 records: a flood of bad records usually means a bad deploy, not bad data.
    max_dead_letters_per_1000: int = Field(100, ge=0)

    # Formation: "offline" (deterministic rules) or "bedrock" (AWS Bedrock Converse); the test
    # double "offline+latency" is the rules answering as slowly as a hosted model.
    extractor: str = "offline"
    bedrock_region: str = "us-east-1"
    bedrock_extraction_model: str = "anthropic.claude-3-5-haiku-20241022-v1:0"
    bedrock_resolution_model: str = "anthropic.claude-3-5-haiku-20241022-v1:0"
    # extractor "openai": an OpenAI-compatible chat API (OpenAI, Azure OpenAI, Ollama, vLLM,
    # LM Studio, llama.cpp's server; docs/models.md). ``openai_api_key``: None reads the SDK's
    # OPENAI_API_KEY; local servers take any. ``openai_structured``: how the answer is held to its
    # schema, "json_schema" (a response format) or "tools" (a forced tool call).
    openai_base_url: str = "https://api.openai.com/v1"
    openai_api_key: SecretStr | None = None
    openai_model: str = "gpt-4o-mini"
    openai_resolution_model: str | None = None  # None: openai_model
    openai_structured: Literal["json_schema", "tools"] = "json_schema"
    openai_timeout_s: float = Field(60.0, gt=0)
    openai_max_tokens: int = Field(1024, ge=64)
    # LLM calls in flight per formation worker: different users' turns of a batch are formed
    # concurrently up to this many calls (one user's stay in order).
    formation_concurrency: int = Field(16, ge=1, le=1024)
    # Records formation holds in flight, decided but not yet produced or still being decided:
    # past this many, the worker stops taking batches until the oldest are recorded.
    formation_in_flight: int = Field(1024, ge=1)
    # Times a turn's extraction, or its resolution, is asked when the model gives no usable answer
    # (Unanswered) before formation gives the turn up: its episode kept, the turn dead-lettered.
    formation_model_attempts: int = Field(5, ge=1)
    # extractor "offline+latency" only (benchmarks and tests: memstream.llm.latency): seconds per
    # call (p50, and p95 of a log-normal; None: always p50) and the calls at once past which it throttles.
    stand_in_latency_p50: float = Field(0.8, ge=0)
    stand_in_latency_p95: float | None = Field(None, ge=0)
    stand_in_max_in_flight: int | None = Field(None, ge=1)
    # An inferred change to an identity or constraint fact commits on this many observations.
    gate_observations: int = Field(3, ge=1)
    # A decay sweep archives a fact whose strength (projections.facts.decay) is below this.
    decay_threshold: float = Field(0.2, ge=0, le=1)
    # Formation workers sweep the users of their partitions this often (0: never; `memstream sweep decay` only).
    decay_sweep_every_s: float = Field(86400.0, ge=0)
    # A decay sweep moves an episode not said or used in this many days out of the hot vector index
    # into the cold one (0: never). Off: on both dev sets it cost recall and bought no read time
    # (BENCHMARKS.md, "Decay"); for a deployment whose hot index no longer fits in memory.
    episode_cold_after_days: float = Field(0.0, ge=0)
    # Reflections (Tier 3): a reflection sweep clusters each user's facts and turns said within
    # the window (cosine of their embeddings at least ``reflect_similarity`` to a cluster's
    # centre), and asks for a reflection on each cluster said ``reflect_min_observations`` times
    # or more. Formation workers run it this often (0: never; `memstream sweep reflect` only).
    reflect_similarity: float = Field(0.5, gt=0, le=1)
    reflect_min_observations: int = Field(3, ge=2)
    reflect_window_days: float = Field(90.0, gt=0)
    # A cluster of turns alone (no fact) is asked about only if a word runs through it (in two of
    # its turns or more, and half of them) that at most this share of the user's turns the sweep
    # read hold: a topic of theirs, not the small talk every conversation repeats (0: never).
    reflect_topic_share: float = Field(0.05, ge=0, le=1)
    reflect_sweep_every_s: float = Field(86400.0, ge=0)
    # Prices for the estimated LLM cost in the workers' metrics, USD per million tokens
    # (defaults: Claude 3.5 Haiku on Bedrock, on demand).
    llm_usd_per_mtok_input: float = Field(0.8, ge=0)
    llm_usd_per_mtok_output: float = Field(4.0, ge=0)

    # Workers serve Prometheus metrics on this port (formation) and the next (projections).
    metrics_port: int | None = Field(None, ge=1, le=65534)
    # Where the metrics listen: loopback unless asked (a container's scraper: "0.0.0.0"). They
    # carry no user id or content, but no auth either.
    metrics_host: str = "127.0.0.1"

    # Read path (``MemoryReader.connect``). From the environment, a JSON object naming only the
    # fields to change, e.g. MEMSTREAM_READ_FACT_WEIGHTS='{"recency": 0.2}'; the rest keep the
    # measured defaults (memstream/read_settings.py).
    read_fact_weights: Weights = FACT_WEIGHTS
    read_episode_weights: Weights = EPISODE_WEIGHTS
    read_budgets: Budgets = Budgets()
    read_keyword_mode: Literal["words", "names"] = "words"
    read_deadline_s: float = Field(READ_DEADLINE_S, gt=0)  # a read's channels end by then, degraded if a store hangs
    # The HTTP API's limits per tenant (memstream/api/limits.py), e.g. MEMSTREAM_API_LIMITS='{"rate": 20}'.
    api_limits: TenantLimits = TenantLimits()

    _check_schema = field_validator("postgres_schema", "keys_schema")(lambda cls, v: check_schema_name(v))

    @field_validator("kek")
    @classmethod
    def _known_kek(cls, value: str) -> str:
        if value != "local" and not (value.startswith(("kms:", "file:")) and len(value.split(":", 1)[1]) > 0):
            raise ValueError("'local', 'file:' and a path, or 'kms:' and a KMS key id, ARN or alias")
        return value

    @field_validator("read_fact_weights", "read_episode_weights", "read_budgets", "api_limits", mode="before")
    @classmethod
    def _onto_default(cls, value: Any, info: ValidationInfo) -> Any:
        """A mapping (or its JSON) changes the named fields of the default, nothing else."""
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as exc:
                raise ValueError(f"not JSON: {exc}") from None
        if not isinstance(value, dict):
            return value
        default = cls.model_fields[info.field_name].default
        known = [f.name for f in dataclasses.fields(default)]
        if unknown := sorted(set(value) - set(known)):
            raise ValueError(f"unknown fields {unknown}; known: {known}")
        return {**dataclasses.asdict(default), **value}

    def dsn(self) -> str:
        """``postgres_dsn``, or the Unix socket of the local stack's Postgres under ``home``
        (``memstream stack up``). Raises ``LookupError`` when neither is there."""
        if self.postgres_dsn:
            return self.postgres_dsn
        if (found := local_dsn(Path(self.home).resolve() / "postgres")) is None:
            raise LookupError(f"no Postgres: set MEMSTREAM_POSTGRES_DSN, or start the local stack "
                              f"(memstream stack up) under {self.home}")
        return found

    def to_env(self) -> dict[str, str]:
        """Every setting as the ``MEMSTREAM_<FIELD>`` variable ``from_env`` reads back (a setting
        left ``None`` has none): how a process hands its settings to a child worker."""
        env = {}
        for name, value in self:
            if value is None:
                continue
            if dataclasses.is_dataclass(value):
                value = json.dumps(dataclasses.asdict(value))
            elif isinstance(value, SecretStr):
                value = value.get_secret_value()
            env[f"MEMSTREAM_{name.upper()}"] = str(value)
        return env

    @classmethod
    def from_env(cls, **overrides: object) -> Settings:
        """Read ``MEMSTREAM_<FIELD>`` variables (e.g. ``MEMSTREAM_POSTGRES_SCHEMA``)."""
        values: dict[str, object] = {}
        for name in cls.model_fields:
            raw = os.environ.get(f"MEMSTREAM_{name.upper()}")
            if raw is not None:
                values[name] = raw
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)
