import os

import pytest

from memstream.config import Settings
from memstream.projections.schema_names import check_schema_name


@pytest.mark.parametrize("name", ["public", "Public", "pg_catalog", "1abc", "a-b", "", "x" * 64])
def test_unsafe_or_reserved_schema_names_are_refused(name):
    with pytest.raises(ValueError):
        check_schema_name(name)


def test_settings_read_only_memstream_variables(monkeypatch):
    monkeypatch.setenv("MEMSTREAM_POSTGRES_SCHEMA", "tenant_a")
    monkeypatch.setenv("MEMSTREAM_PARTITIONS", "8")
    s = Settings.from_env()
    assert (s.postgres_schema, s.partitions) == ("tenant_a", 8)
    with pytest.raises(ValueError):
        Settings(postgres_schema="public")


def test_read_weights_and_budgets_from_the_environment_change_only_the_fields_named(monkeypatch):
    from dataclasses import replace

    from memstream.read_settings import EPISODE_WEIGHTS, FACT_WEIGHTS, Budgets

    monkeypatch.setenv("MEMSTREAM_READ_FACT_WEIGHTS", '{"recency": 0.3, "recency_half_life_days": 7}')
    monkeypatch.setenv("MEMSTREAM_READ_BUDGETS", '{"edges": 0}')
    monkeypatch.setenv("MEMSTREAM_READ_KEYWORD_MODE", "names")
    s = Settings.from_env()
    assert s.read_fact_weights == replace(FACT_WEIGHTS, recency=0.3, recency_half_life_days=7.0)
    assert s.read_episode_weights == EPISODE_WEIGHTS
    assert (s.read_budgets, s.read_keyword_mode) == (Budgets(edges=0), "names")


@pytest.mark.parametrize("raw, says", [('{"recncy": 0.3}', "unknown fields ['recncy']"), ("recency=0.3", "not JSON"),
                                       ('{"recency": "high"}', "valid number")])
def test_a_misspelt_or_malformed_read_weight_is_refused_with_its_reason(monkeypatch, raw, says):
    monkeypatch.setenv("MEMSTREAM_READ_FACT_WEIGHTS", raw)
    with pytest.raises(ValueError, match=says.replace("[", r"\[").replace("]", r"\]")):
        Settings.from_env()


def test_a_negative_token_budget_is_refused(monkeypatch):
    monkeypatch.setenv("MEMSTREAM_READ_BUDGETS", '{"episodes": -5}')
    with pytest.raises(ValueError, match="episodes budget must be a whole number of tokens >= 0"):
        Settings.from_env()


def test_every_setting_survives_the_trip_to_a_child_workers_environment(monkeypatch):
    from pathlib import Path

    from memstream.read_settings import Budgets
    from memstream.stack.worker_process import worker_env

    s = Settings(kafka_bootstrap="k:1", partitions=7, postgres_dsn="postgresql://x/y", postgres_schema="other",
                 home=Path("/tmp/h"), tier0_turns=3, batch_size=9, batch_seconds=0.5, embed_threads=2,
                 embedding_variant="weights", extractor="offline-strict", gate_observations=5,
                 read_budgets=Budgets(facts=10, episodes=20, edges=30), read_keyword_mode="names",
                 read_fact_weights=Settings().read_fact_weights.__class__(recency=0.3))
    monkeypatch.setenv("MEMSTREAM_REDIS_URL", "redis://stale:1/0")  # inherited, but not this run's
    env = worker_env(s.model_copy(update={"redis_url": "redis://fresh:2/0"}))
    for name in [n for n in os.environ if n.startswith("MEMSTREAM_") and n not in env]:
        monkeypatch.delenv(name)  # the child would not see it either (a developer's own settings)
    for name in list(env):
        if name.startswith("MEMSTREAM_"):
            monkeypatch.setenv(name, env[name])
    assert Settings.from_env() == s.model_copy(update={"redis_url": "redis://fresh:2/0"})
    assert sorted(n for n in Settings.model_fields if getattr(s, n) is not None) == sorted(
        k.removeprefix("MEMSTREAM_").lower() for k in s.to_env())
