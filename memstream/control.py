"""The control plane: what a person (``actor="user"``), the host on their behalf or an operator
does to a user's memory — see it, correct it, forget part of it or all of it. Every change is a
request on the user's own log, applied by the projections like any event and recorded with its
actor and reason; nothing here edits a projection. Each function checks, before appending, that
the id it is given is the user's (``NotFound`` says whether it is unknown or another user's),
and returns the request's log position, for ``read(after=...)``."""
from __future__ import annotations

import uuid
from datetime import datetime, timezone

from memstream.schemas import (EdgeForgotten, EpisodeForgotten, FactCorrected, FactForgotten, LogPosition,
                               UserForgotten, new_event_id)
from memstream.schemas.codec import validated
from memstream.schemas.errors import InvalidArgument, InvalidEvent, MemstreamError
from memstream.schemas.events import ERASURE_REASONS

class NotFound(MemstreamError, LookupError):
    """The id names nothing of this user's: unknown, or another user's (the message says which,
    for an operator; ``public`` does not, for a caller who may only know of this user's)."""

    def __init__(self, message: str, public: str | None = None):
        super().__init__(message)
        self.public = public or message


async def _own(reader, kind: str, user_id: str, memory_id: uuid.UUID) -> dict:
    row, what = await reader.holder(kind, memory_id, user_id), kind[:-1]
    if row is None:
        raise NotFound(f"no {what} {memory_id}")
    if row["user_id"] != user_id:
        raise NotFound(f"{what} {memory_id} belongs to another user, not {user_id!r}", public=f"no {what} {memory_id}")
    return row


def _envelope(user_id: str, actor: str, reason: str) -> dict:
    return dict(event_id=new_event_id(), user_id=user_id, occurred_at=datetime.now(timezone.utc), actor=actor,
                reason=reason)


async def correct_fact(log, reader, user_id: str, fact_id: uuid.UUID, value: str, *, text: str | None = None,
                       actor: str = "user", reason: str = "") -> LogPosition:
    """A new version of the fact saying ``value`` (and ``text``), explicit: it passes the safety gate."""
    row = await _own(reader, "facts", user_id, fact_id)
    if row["status"] not in ("current", "archived"):
        raise NotFound(f"fact {fact_id} is not current ({row['status']}): correct its current version")
    return await log.append(FactCorrected(**_envelope(user_id, actor, reason), fact_id=fact_id, value=value, text=text))


async def forget_fact(log, reader, user_id: str, fact_id: uuid.UUID, *, actor: str = "user",
                      reason: str = "", keep_episodes: bool = False) -> LogPosition:
    """The fact ends as forgotten; no replay or reform learns it again from the turns it came from.
    The edges stating the same relationship go with it, and so do those turns' episodes
    (``episodes_of_fact`` lists them first) unless ``keep_episodes``; their other facts and edges
    stay, noted."""
    row = await _own(reader, "facts", user_id, fact_id)
    if row["status"] not in ("current", "archived"):  # archived: believed still, off the read path
        raise NotFound(f"fact {fact_id} is not current ({row['status']})")
    return await log.append(_naming(FactForgotten, {"attribute": row["attribute"], "value": row["value"]},
                                    **_envelope(user_id, actor, reason), fact_id=fact_id, keep_episodes=keep_episodes))


async def episodes_of_fact(reader, user_id: str, fact_id: uuid.UUID) -> list:
    """The remembered turns forgetting the fact would forget with it (``Episode``, oldest first)."""
    await _own(reader, "facts", user_id, fact_id)
    return await reader.fact_episodes(user_id, fact_id)


async def forget_episode(log, reader, user_id: str, episode_id: uuid.UUID, *, actor: str = "user",
                         reason: str = "") -> LogPosition:
    """The turn leaves episodes, Tier 0 and the keyword search, with the facts and edges it alone supports."""
    row = await _own(reader, "episodes", user_id, episode_id)
    return await log.append(EpisodeForgotten(**_envelope(user_id, actor, reason), turn_event_id=row["source_event_id"]))


async def forget_edge(log, reader, user_id: str, edge_id: uuid.UUID, *, actor: str = "user",
                      reason: str = "") -> LogPosition:
    """The relationship ends, and the graph shows it no more, now or as of any date."""
    row = await _own(reader, "edges", user_id, edge_id)
    if row["forgotten"]:
        raise NotFound(f"edge {edge_id} is already forgotten")
    return await log.append(_naming(EdgeForgotten, {k: row[k] for k in ("relation", "source", "target")},
                                    **_envelope(user_id, actor, reason), edge_id=edge_id))


def _naming(cls, said: dict, **fields):
    """A forget of ``cls`` that also names what the memory says (so a reform that gave it another
    id finds it), or by its id alone when a stored value is longer than the request carries."""
    try:
        return validated(cls(**fields, **said))
    except InvalidEvent:
        return cls(**fields)  # anything else wrong with it is refused as the append checks it


async def forget_user(log, user_id: str, *, actor: str = "user", reason: str = "unspecified") -> LogPosition:
    """Every row and cache key of the user goes, in every projection (idempotent). ``reason``: an
    ``ErasureReason`` (the forget stays plain on the log: no free text)."""
    if reason not in ERASURE_REASONS:
        raise InvalidArgument(f"reason must be one of {', '.join(ERASURE_REASONS)}, not {reason!r}: a user's "
                              "forget stays readable on the log forever, so it carries no free text")
    return await log.append(UserForgotten(**_envelope(user_id, actor, reason)))
