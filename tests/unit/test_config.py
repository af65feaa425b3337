import pytest

from memstream.config import Settings, check_schema_name


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
