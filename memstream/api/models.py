"""The HTTP API's request and answer bodies (those not in ``memstream.schemas.read_models``)."""
from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from memstream.read_client.arguments import MAX_K
from memstream.schemas import LogPosition
from memstream.schemas.read_models import AsOf


class Position(BaseModel):
    topic: str
    partition: int = Field(ge=0, lt=2**31)
    offset: int = Field(ge=0, lt=2**63)


class Appended(BaseModel):
    position: Position
    reminder_id: uuid.UUID | None = None  # of a ReminderScheduled appended: to resolve it later


TYPED_ROUTES = {"FactCorrected": "POST /v1/users/{user}/facts/{id}/correct",
                "FactForgotten": "POST /v1/users/{user}/forget", "EpisodeForgotten": "POST /v1/users/{user}/forget",
                "EdgeForgotten": "POST /v1/users/{user}/forget", "UserForgotten": "DELETE /v1/users/{user}",
                "DecaySwept": "an operator's `memstream sweep decay` (a sweep's own record, not a host's)",
                "ReflectRequested": "an operator's `memstream sweep reflect` (a sweep's own record, not a host's)"}


class TurnIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    conversation_id: str
    user_message: str
    assistant_message: str
    occurred_at: datetime | None = None
    metadata: dict[str, Any] | None = None


class ContextIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    conversation_id: str
    message: str
    k: int = Field(5, ge=1, le=MAX_K)
    k_facts: int = Field(10, ge=0, le=MAX_K)
    k_edges: int = Field(8, ge=0, le=MAX_K)
    as_of: AsOf | None = None
    after: Position | None = Field(None, description="read your writes: a position an append returned")
    wait_timeout: float = Field(5.0, ge=0, le=30)
    include_archived: bool = Field(False, description="let facts a decay sweep archived compete too")


class SearchIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    query: str = Field(max_length=10_000)
    kinds: list[Literal["facts", "episodes", "edges"]] = ["facts", "episodes", "edges"]
    k: int = 10
    as_of: AsOf | None = None
    since: datetime | None = Field(None, description="episodes that occurred at or after this time")
    until: datetime | None = Field(None, description="episodes that occurred before this time")


class CorrectIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    value: str
    text: str | None = None
    actor: Literal["user", "host", "operator"] = "host"
    reason: str = ""


class ForgetIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    fact_id: uuid.UUID | None = None
    episode_id: uuid.UUID | None = None
    edge_id: uuid.UUID | None = None
    actor: Literal["user", "host", "operator"] = "host"
    reason: str = ""
    keep_episodes: bool = Field(False, description="with fact_id: keep the turns the fact was read from")


class CaughtUpIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    position: Position
    timeout: float = Field(5.0, ge=0, le=30)


class CaughtUp(BaseModel):
    caught_up: bool = Field(description="every read projection has applied the position")


class Me(BaseModel):
    name: str
    tenant: str | None
    operator: bool


def appended_at(p: LogPosition) -> Appended:
    return Appended(position=Position(topic=p.topic, partition=p.partition, offset=p.offset))
