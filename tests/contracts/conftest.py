"""Contract suites: one abstract test case per contract, run against every implementation.

Implementations backed by the local stack get its session-scoped services from the integration
tier's fixtures, and each test its own Postgres schema (or Kafka topic)."""
from __future__ import annotations

import uuid

import pytest

from memstream.projections.db import create_pool
from tests import pooled_schemas
from tests.integration.conftest import dsn, no_postgres_crash, stack  # noqa: F401  (fixtures, shared)


@pytest.fixture
async def schema(dsn: str):  # noqa: F811
    name = f"contract_{uuid.uuid4().hex[:10]}"
    await pooled_schemas.fresh(dsn, name)
    yield name
    await pooled_schemas.done(dsn, name)


@pytest.fixture
async def pool(dsn: str, schema: str):  # noqa: F811
    p = await create_pool(dsn, schema, max_size=2)
    yield p
    await p.close()
