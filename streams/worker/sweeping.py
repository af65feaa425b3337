"""A decay sweep's plan: find the facts that have faded and the requests that ask, on each user's
log, for them to be archived — for ``memstream sweep decay`` (``streams.ops.sweep``) and the
formation workers' timer, each for the users it sweeps.

The sweep reads the facts projection and the recall counts (``fact_uses``) at its own time,
weighs every current fact with the decay policy (``projections.facts.decay``) and appends one
``DecaySwept`` request per user with facts below the threshold: its time, its id and, for each
fact, the strength and the inputs it was computed from. Formation turns each request into
``FactArchived`` decisions in its place among the user's turns, so a fact said again before the
request is read is not archived on a stale strength, and a replay applies the recorded
decisions without a sweep, a clock or a model. ``--dry-run`` appends nothing.
"""
from __future__ import annotations

import logging
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Callable, Iterable, Mapping, Sequence

import msgspec

from memstream.config import Settings
from memstream.projections.facts import decay
from memstream.projections.facts.core import FactRow, Key
from memstream.schemas import DecaySwept, EpisodesSwept, FactArchived, SweptFact, new_event_id
from memstream.streams.log.screening import expected_partition

log = logging.getLogger("memstream.sweep")

# One request names at most this many facts (DecaySwept.facts): a user with more gets several.
PER_REQUEST = 1000

_CURRENT = """
SELECT f.user_id, f.fact_id, f.category, f.attribute, f.confidence, f.observation_count,
       coalesce(f.last_said_at, f.last_observed_at) AS last_said_at,
       coalesce(u.uses, 0) AS uses, u.last_used_at
FROM memory_facts f LEFT JOIN fact_uses u ON u.user_id = f.user_id AND u.fact_id = f.fact_id
WHERE f.status = 'current' AND ($1::text IS NULL OR f.user_id = $1)
ORDER BY f.user_id, f.recorded_at, f.fact_id
"""


# The episodes to move between the vector indexes: hot ones said (occurred, or recorded if that
# is earlier: a turn dated in the future is not kept hot by its date) and used before $2, and
# cold ones used since $2 — not since they cooled: a use dated before a sweep may be counted
# after it (the commands projection lagging), and would never warm its episode. Cooling off ($3
# false): none go cold, and those cooled before come back once used since.
_EPISODES = """
SELECT e.user_id, e.episode_id, e.cooled_at IS NULL AS hot
FROM episodes e LEFT JOIN episode_uses u ON u.user_id = e.user_id AND u.episode_id = e.episode_id
WHERE ($1::text IS NULL OR e.user_id = $1)
  AND CASE WHEN e.cooled_at IS NULL
           THEN $3 AND least(e.occurred_at, e.recorded_at) < $2 AND (u.last_used_at IS NULL OR u.last_used_at < $2)
           ELSE u.last_used_at >= CASE WHEN $3 THEN $2 ELSE e.cooled_at END END
ORDER BY e.user_id, e.occurred_at, e.episode_id
"""


@dataclass
class Plan:
    """What a sweep found, by user: the facts it would archive, weakest first, and the episodes
    it would move out of the hot vector index (``cooled``) and back into it (``warmed``)."""

    sweep_id: uuid.UUID
    swept_at: datetime
    threshold: float
    cold_after_days: float = 0.0
    facts_weighed: int = 0
    weak: dict[str, list[SweptFact]] = field(default_factory=dict)
    cooled: dict[str, list[uuid.UUID]] = field(default_factory=dict)
    warmed: dict[str, list[uuid.UUID]] = field(default_factory=dict)
    texts: dict[tuple[str, uuid.UUID], str] = field(default_factory=dict)  # for a dry run's listing, never logged
    appended: dict[str, object] = field(default_factory=dict)  # user -> their last request's LogPosition

    @property
    def archiving(self) -> int:
        return sum(len(v) for v in self.weak.values())

    @property
    def cooling(self) -> int:
        return sum(len(v) for v in self.cooled.values())

    @property
    def warming(self) -> int:
        return sum(len(v) for v in self.warmed.values())

    @property
    def users(self) -> list[str]:
        return sorted({*self.weak, *self.cooled, *self.warmed})

    def as_dict(self) -> dict:
        return {"sweep_id": str(self.sweep_id), "swept_at": self.swept_at.isoformat(), "threshold": self.threshold,
                "policy": decay.POLICY, "facts_weighed": self.facts_weighed, "users": len(self.users),
                "archiving": self.archiving, "cold_after_days": self.cold_after_days,
                "cooling_episodes": self.cooling, "warming_episodes": self.warming,
                "facts": [{"user_id": user, **msgspec.to_builtins(f),
                           "text": self.texts.get((user, f.fact_id), "")}
                          for user, facts in sorted(self.weak.items()) for f in facts],
                "episodes": [{"user_id": user, "cooling": len(self.cooled.get(user, ())),
                              "warming": len(self.warmed.get(user, ()))}
                             for user in sorted({*self.cooled, *self.warmed})]}


async def plan(conn, *, at: datetime, threshold: float, cold_after_days: float = 0.0, user_id: str | None = None,
               kept: Callable[[str], bool] | None = None, listing: bool = True) -> Plan:
    """Weigh every current fact (of ``user_id``, or everyone's; of the users ``kept`` accepts) as
    of ``at``, and find the episodes not said or used in ``cold_after_days`` (0: none) and the
    cold ones used within them. ``listing``: read what the weak facts say, for an operator."""
    found = Plan(sweep_id=uuid.uuid4(), swept_at=at, threshold=threshold, cold_after_days=cold_after_days)
    weak: dict[str, list[SweptFact]] = defaultdict(list)
    async with conn.transaction(readonly=True, isolation="repeatable_read"):
        async for r in conn.cursor(_CURRENT, user_id, prefetch=1000):
            if kept is not None and not kept(r["user_id"]):
                continue
            found.facts_weighed += 1
            if not decay.decays(r["category"], r["attribute"]):
                continue
            last = max(t for t in (r["last_said_at"], r["last_used_at"]) if t is not None)
            w = decay.strength(category=r["category"], attribute=r["attribute"], confidence=r["confidence"],
                               observations=r["observation_count"], uses=r["uses"],
                               idle_days=(at - last).total_seconds() / 86400)
            if w.strength < threshold:
                weak[r["user_id"]].append(SweptFact(fact_id=r["fact_id"], strength=round(w.strength, 4),
                                                    observations=r["observation_count"], uses=r["uses"],
                                                    idle_days=round(w.idle_days, 2), rate=w.rate))
    if weak and listing:
        # By user and id: two users' turns given one event id gave their facts one id.
        rows = await conn.fetch("SELECT f.user_id, f.fact_id, f.text FROM memory_facts f JOIN unnest($1::text[], "
                                "$2::uuid[]) AS w(user_id, fact_id) USING (user_id, fact_id)",
                                *zip(*[(u, f.fact_id) for u, facts in weak.items() for f in facts]))
        found.texts = {(r["user_id"], r["fact_id"]): r["text"] for r in rows}
    found.weak = {u: sorted(fs, key=lambda f: (f.strength, str(f.fact_id))) for u, fs in weak.items()}
    # Cooling off (0 days): none go cold, and those an earlier sweep cooled still come back when
    # used since (``_EPISODES``' third argument: no cut-off needed).
    before = at - timedelta(days=cold_after_days)
    async with conn.transaction(readonly=True):
        async for r in conn.cursor(_EPISODES, user_id, before, cold_after_days > 0, prefetch=5000):
            if kept is None or kept(r["user_id"]):
                (found.cooled if r["hot"] else found.warmed).setdefault(r["user_id"], []).append(r["episode_id"])
    return found


def requests(found: Plan, actor: str = "operator") -> list[DecaySwept]:
    """The requests that carry ``found`` onto the users' logs, at the sweep's own time: each
    names at most ``PER_REQUEST`` of each of a user's facts, cooled and warmed episodes."""
    out = []
    for user in found.users:
        facts, cooled, warmed = found.weak.get(user, []), found.cooled.get(user, []), found.warmed.get(user, [])
        for i in range(0, max(len(facts), len(cooled), len(warmed)), PER_REQUEST):
            out.append(DecaySwept(event_id=new_event_id(), user_id=user, occurred_at=found.swept_at, actor=actor,
                                  reason=f"decay sweep below strength {found.threshold:g}",
                                  sweep_id=found.sweep_id, policy=decay.POLICY, facts=facts[i:i + PER_REQUEST],
                                  cooled=cooled[i:i + PER_REQUEST], warmed=warmed[i:i + PER_REQUEST]))
    return out


def archivals(request: DecaySwept, rows: Mapping[Key, FactRow], common: dict) -> list[FactArchived]:
    """What ``request`` archives of the facts in ``rows`` (keyed as the facts core keys them):
    each fact it names that is still the current version the sweep weighed — not observed again
    since, not ended, not archived already, of the kind (the decay rate) it weighed; its strength
    is not the one recorded otherwise.
    ``common``: the decisions' envelope (source event, position, time, user)."""
    out = []
    for n, f in enumerate(request.facts):
        row = rows.get((request.user_id, f.fact_id))
        if row is None or not row.current or row.observation_count != f.observations:
            continue
        # A fact of another kind than the one weighed (a reform's extractor may give its id to
        # another candidate of the turn): never one that does not decay, nor one of another rate.
        if not decay.decays(row.category, row.attribute) or decay.rate(row.category, row.attribute) != f.rate:
            continue
        out.append(FactArchived(
            **common, decision_id=uuid.uuid5(request.event_id, f"archived:{n}"), extractor=f"decay:{request.policy}",
            resolver=f"control:{request.actor}", confidence=row.confidence, explicit=row.explicit, target=row.fact_id,
            sweep_id=request.sweep_id, strength=f.strength,
            reason=f"decayed to strength {f.strength:.2f}: idle {f.idle_days:.0f} days, observed "
                   f"{f.observations}x, used {f.uses}x (rate {f.rate:g}/day)"))
    return out


def moved(request: DecaySwept, common: dict) -> list[EpisodesSwept]:
    """The episodes ``request`` moves between the vector indexes, as one decision: passed on as
    the sweep found them (the episodes projection moves those still there, in their tier)."""
    if not (request.cooled or request.warmed):
        return []
    return [EpisodesSwept(**common,
                          decision_id=uuid.uuid5(request.event_id, "episodes"), sweep_id=request.sweep_id,
                          swept_at=request.occurred_at, cooled=request.cooled, warmed=request.warmed)]


async def sweep(settings: Settings, pool, *, at: datetime, user_id: str | None = None,
                mine: Sequence[int] | None = None, dry_run: bool = False, on_progress=None,
                listing: bool = True) -> Plan:
    """A decay sweep as of ``at``: of ``user_id``, of the users of the events partitions ``mine``
    (a formation worker's), or of everyone; unless ``dry_run``, its requests appended and the
    sweep recorded for each partition it swept (``memstream status``). ``listing``: with what
    the facts it found say (an operator's sweep; a worker's timer reads no words of anyone's)."""
    kept = await users_of(settings, mine)
    async with pool.acquire() as conn:
        found = await plan(conn, at=at, threshold=settings.decay_threshold,
                           cold_after_days=settings.episode_cold_after_days, user_id=user_id, kept=kept,
                           listing=listing)
    log.info("decay sweep %s: %d facts weighed, %d of %d users below %.2f; episodes %d cooling, %d warming%s",
             found.sweep_id, found.facts_weighed, found.archiving, len(found.weak), found.threshold, found.cooling,
             found.warming, " (dry run)" if dry_run else "")
    if dry_run:
        return found
    topic, partitions, swept = await send(settings, requests(found), user_id=user_id, mine=mine,
                                          on_progress=on_progress, appended=found.appended)
    async with pool.acquire() as conn:
        await record(conn, "decay_sweeps", topic, found.sweep_id, found.swept_at,
                     {"archived": {user: len(facts) for user, facts in found.weak.items()},
                      "cooled": {user: len(ids) for user, ids in found.cooled.items()}}, partitions, only=swept)
    return found


async def users_of(settings: Settings, mine: Sequence[int] | None) -> Callable[[str], bool] | None:
    """Whether a user is one of the events partitions ``mine`` (None: everyone is)."""
    if mine is None:
        return None
    owned, count = set(mine), await partition_count(settings, settings.events_topic)
    return lambda user: expected_partition(user.encode(), count) in owned


async def send(settings: Settings, asked: Sequence, *, user_id: str | None, mine: Sequence[int] | None,
               on_progress=None, appended: dict | None = None) -> tuple[str, int, Sequence[int] | None]:
    """Append a sweep's requests to the users' logs; the events topic, its partition count and
    the partitions the sweep covered (``mine``, ``user_id``'s, or None: all). ``appended``, if
    given, gets each user's last request's log position (to wait on, read-your-writes)."""
    from memstream.streams.log.producer import TurnLog

    async with TurnLog(settings) as turns:
        for i in range(0, len(asked), 100):
            chunk = list(asked[i:i + 100])
            for request, position in zip(chunk, await turns.append_many(chunk)):
                if appended is not None:
                    appended[request.user_id] = position
            if on_progress:
                on_progress(min(i + 100, len(asked)), len(asked))
        topic = turns.events_topic
    partitions = await partition_count(settings, topic)
    swept = mine if mine is not None else None if user_id is None else [expected_partition(user_id.encode(), partitions)]
    return topic, partitions, swept


async def partition_count(settings: Settings, topic: str) -> int:
    from memstream.streams.log.kafka_util import groupless_consumer, partitions_of

    async with groupless_consumer(settings.kafka_bootstrap) as consumer:
        return len(await partitions_of(consumer, topic))


async def record(conn, table: str, topic: str, sweep_id: uuid.UUID, swept_at: datetime,
                 counted: Mapping[str, Mapping[str, int]], partitions: int, only: Iterable[int] | None = None) -> None:
    """Record a sweep as the last of ``table`` (``decay_sweeps``, ``reflection_sweeps``) for
    each partition of ``topic`` it swept (``only``, or every one of the ``partitions``): how many
    users it asked about there and how many of each column of ``counted`` (by user), for
    ``memstream status``."""
    columns = sorted(counted)
    counts: dict[int, list[int]] = {p: [0] * (1 + len(columns)) for p in (range(partitions) if only is None else only)}
    for user in sorted({u for by_user in counted.values() for u in by_user}):
        c = counts.setdefault(expected_partition(user.encode(), partitions), [0] * (1 + len(columns)))
        c[0] += 1
        for i, column in enumerate(columns, 1):
            c[i] += counted[column].get(user, 0)
    names = ", ".join(columns)
    values = ", ".join(f"${i}" for i in range(6, 6 + len(columns)))
    updates = ", ".join(f"{c} = EXCLUDED.{c}" for c in columns)
    await conn.executemany(
        f"INSERT INTO {table} (topic, partition, sweep_id, swept_at, users, {names}) "
        f"VALUES ($1, $2, $3, $4, $5, {values}) ON CONFLICT (topic, partition) DO UPDATE SET sweep_id = "
        f"EXCLUDED.sweep_id, swept_at = EXCLUDED.swept_at, users = EXCLUDED.users, {updates}",
        [(topic, p, sweep_id, swept_at, *c) for p, c in sorted(counts.items())])
