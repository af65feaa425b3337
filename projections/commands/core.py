"""Commands, the pure core: reminders and identities as the host put them on the log."""
from __future__ import annotations

import uuid
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Mapping

from memstream.schemas.errors import Refused
from memstream.schemas import (Event, ExpertIdentityDeleted, ExpertIdentityUpserted, MemoriesUsed, PersonIdentitySet,
                               ReminderResolved, ReminderScheduled, UserForgotten)


class UnknownReminder(Refused, LookupError):
    """A ReminderResolved names a reminder never scheduled: the host's bug, dead-lettered."""

    users_input = True


@dataclass(frozen=True)
class ReminderRow:
    reminder_id: uuid.UUID
    user_id: str
    text: str
    due_at: datetime
    status: str
    scheduled_at: datetime
    resolved_at: datetime | None
    source_event_id: uuid.UUID


@dataclass(frozen=True)
class Logged:
    """A command and its offset on its events partition: identities are replaced in log order
    (``source_offset``), whatever order their statements are applied in."""

    offset: int
    event: Event


@dataclass(frozen=True)
class PersonIdentityRow:
    user_id: str
    attributes: Mapping[str, Any]
    updated_at: datetime
    source_event_id: uuid.UUID
    source_offset: int


@dataclass(frozen=True)
class ExpertIdentityRow:
    identity_id: str
    name: str
    instructions: str
    attributes: Mapping[str, Any] | None
    updated_at: datetime
    source_event_id: uuid.UUID
    source_offset: int


@dataclass(frozen=True)
class ExpertIdentityGone:
    identity_id: str
    updated_at: datetime
    source_event_id: uuid.UUID
    source_offset: int


@dataclass(frozen=True)
class UserGone:
    user_id: str


@dataclass(frozen=True)
class Used:
    """One more use of each of ``fact_ids`` and ``episode_ids`` (counted once per event: by its offset)."""

    user_id: str
    fact_ids: tuple[uuid.UUID, ...]
    episode_ids: tuple[uuid.UUID, ...]
    used_at: datetime
    source_offset: int


Row = ReminderRow | PersonIdentityRow | ExpertIdentityRow | ExpertIdentityGone | UserGone | Used


ReminderKey = tuple[str, uuid.UUID]


def reminder_key(row: ReminderRow) -> ReminderKey:
    return row.user_id, row.reminder_id


def reminder_targets(logged: Logged) -> list[ReminderKey]:
    """The ``(user_id, reminder_id)`` keys whose rows ``apply`` needs: a reminder id names the
    user's own reminder only (a host that gave two users' events one id gave their reminders one id)."""
    e = logged.event
    return [(e.user_id, e.reminder_id)] if isinstance(e, (ReminderScheduled, ReminderResolved)) else []


def apply(reminders: Mapping[ReminderKey, ReminderRow], logged: Logged) -> list[Row]:
    e, at = logged.event, logged.offset
    if isinstance(e, ReminderScheduled):
        if (e.user_id, e.reminder_id) in reminders:
            return []
        return [ReminderRow(e.reminder_id, e.user_id, e.text, e.due_at, "pending", e.occurred_at, None, e.event_id)]
    if isinstance(e, ReminderResolved):
        r = reminders.get((e.user_id, e.reminder_id))
        if r is None:
            raise UnknownReminder(f"reminder {e.reminder_id} was never scheduled for this user")
        if r.status != "pending":
            return []
        return [replace(r, status=e.status, resolved_at=e.occurred_at)]
    if isinstance(e, PersonIdentitySet):
        return [PersonIdentityRow(e.user_id, dict(e.attributes), e.occurred_at, e.event_id, at)]
    if isinstance(e, ExpertIdentityUpserted):
        return [ExpertIdentityRow(e.identity_id, e.name, e.instructions, e.attributes, e.occurred_at, e.event_id, at)]
    if isinstance(e, ExpertIdentityDeleted):
        return [ExpertIdentityGone(e.identity_id, e.occurred_at, e.event_id, at)]
    if isinstance(e, UserForgotten):
        return [UserGone(e.user_id)]
    if isinstance(e, MemoriesUsed):
        return [Used(e.user_id, tuple(dict.fromkeys(e.fact_ids)), tuple(dict.fromkeys(e.episode_ids)), e.occurred_at, at)]
    return []
