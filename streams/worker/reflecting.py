"""A reflection sweep's plan: cluster each user's recent facts by their recorded embeddings and
ask, on the user's log, for a reflection on each cluster said often enough — for ``memstream
sweep reflect`` (``streams.ops.sweep``) and the formation workers' timer.

The clusters are a deterministic function of the facts projection at the sweep's time: the
user's current facts (not reflections) said within ``reflect_window_days``, taken oldest first,
each joining the cluster whose centre (the normalised mean of its members' embeddings) it is
closest to, if at least ``reflect_similarity`` (cosine), else opening one. A cluster of two facts
or more, said ``reflect_min_observations`` times all told, is asked about — unless a reflection
still believed was drawn from some of its facts and none joined them since. One
``ReflectRequested`` per user carries its clusters; formation asks the model in the request's
place among the user's turns and records the answer, so a replay applies the reflections without
a sweep, a clock or a model.
"""
from __future__ import annotations

import logging
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Callable, Sequence

import numpy as np

from memstream.config import Settings
from memstream.embedding import from_bytes
from memstream.schemas import ReflectionCluster, ReflectRequested, new_event_id

log = logging.getLogger("memstream.sweep")

POLICY = "reflect-v1"
MAX_SOURCES = 32  # ReflectionCluster.sources: a larger cluster is asked about by its latest facts
MAX_CLUSTERS = 100  # ReflectRequested.clusters: a user's largest clusters first

_RECENT = """
SELECT user_id, fact_id, embedding, observation_count, embedding_model, recorded_at
FROM memory_facts
WHERE status = 'current' AND category <> 'reflection'
  AND coalesce(last_said_at, last_observed_at) BETWEEN $2 AND $3
  AND ($1::text IS NULL OR user_id = $1)
ORDER BY user_id, recorded_at, fact_id
"""
_REFLECTED = """
SELECT user_id, derived_from, recorded_at FROM memory_facts
WHERE category = 'reflection' AND status IN ('current', 'archived') AND ($1::text IS NULL OR user_id = $1)
"""


@dataclass
class Plan:
    """What a reflection sweep found, by user: the clusters it would ask about, largest first."""

    sweep_id: uuid.UUID
    swept_at: datetime
    facts_read: int = 0
    clusters: dict[str, list[ReflectionCluster]] = field(default_factory=dict)
    texts: dict[tuple[str, uuid.UUID], str] = field(default_factory=dict)  # a dry run's listing, never logged

    @property
    def asking(self) -> int:
        return sum(len(v) for v in self.clusters.values())

    def as_dict(self) -> dict:
        return {"sweep_id": str(self.sweep_id), "swept_at": self.swept_at.isoformat(), "policy": POLICY,
                "facts_read": self.facts_read, "users": len(self.clusters), "clusters": self.asking,
                "asked": [{"user_id": user, "observations": c.observations,
                           "sources": [{"fact_id": str(f), "text": self.texts.get((user, f), "")} for f in c.sources]}
                          for user, cs in sorted(self.clusters.items()) for c in cs]}


def cluster(vectors: Sequence[np.ndarray], similarity: float) -> list[list[int]]:
    """Indexes of ``vectors`` (unit vectors, in the order given) grouped as the module says."""
    groups: list[list[int]] = []
    sums: list[np.ndarray] = []
    for i, v in enumerate(vectors):
        best, closest = None, similarity
        for g, total in enumerate(sums):
            closeness = float(total @ v) / (float(np.linalg.norm(total)) or 1.0)
            if closeness >= closest:  # ties: the first cluster opened
                best, closest = g, closeness + 1e-12
        if best is None:
            groups.append([i])
            sums.append(np.array(v, dtype=np.float64))
        else:
            groups[best].append(i)
            sums[best] = sums[best] + v
    return groups


async def plan(conn, settings: Settings, *, at: datetime, model: str, user_id: str | None = None,
               kept: Callable[[str], bool] | None = None) -> Plan:
    """The clusters of every user's recent facts embedded by ``model`` (of ``user_id``, or of the
    users ``kept`` accepts) as of ``at``."""
    found = Plan(sweep_id=uuid.uuid4(), swept_at=at)
    since = at - timedelta(days=settings.reflect_window_days)
    facts: dict[str, list] = defaultdict(list)
    reflected: dict[str, list[tuple[frozenset, datetime]]] = defaultdict(list)
    async with conn.transaction(readonly=True, isolation="repeatable_read"):
        async for r in conn.cursor(_RECENT, user_id, since, at, prefetch=1000):
            if r["embedding_model"] != model or (kept is not None and not kept(r["user_id"])):
                continue
            found.facts_read += 1
            facts[r["user_id"]].append(r)
        for r in await conn.fetch(_REFLECTED, user_id):
            reflected[r["user_id"]].append((frozenset(r["derived_from"]), r["recorded_at"]))
    for user, rows in facts.items():
        vectors = [from_bytes(_bytes(r["embedding"])) for r in rows]
        asked = []
        for group in cluster(vectors, settings.reflect_similarity):
            members = [rows[i] for i in group][-MAX_SOURCES:]
            observations = sum(m["observation_count"] for m in members)
            ids = [m["fact_id"] for m in members]
            if (len(ids) < 2 or observations < settings.reflect_min_observations
                    or _reflected_on(members, reflected[user])):
                continue
            asked.append(ReflectionCluster(sources=ids, observations=observations))
        if asked:
            found.clusters[user] = sorted(asked, key=lambda c: (-c.observations, str(c.sources[0])))[:MAX_CLUSTERS]
    if found.clusters:
        wanted = [(u, f) for u, cs in found.clusters.items() for c in cs for f in c.sources]
        rows = await conn.fetch("SELECT f.user_id, f.fact_id, f.text FROM memory_facts f JOIN unnest($1::text[], "
                                "$2::uuid[]) AS w(user_id, fact_id) USING (user_id, fact_id)", *zip(*wanted))
        found.texts = {(r["user_id"], r["fact_id"]): r["text"] for r in rows}
    return found


def _reflected_on(members, reflections: list[tuple[frozenset, datetime]]) -> bool:
    """Whether a reflection still believed was drawn from some of ``members`` only, and none of
    them was recorded after it (a fact joined since: asked again, the new one replaces it)."""
    ids = {m["fact_id"] for m in members}
    drawn = [at for sources, at in reflections if sources <= ids]
    return bool(drawn) and all(m["recorded_at"] <= max(drawn) for m in members)


def _bytes(embedding) -> bytes:
    values = embedding.to_numpy() if hasattr(embedding, "to_numpy") else embedding
    return np.asarray(values, dtype="<f4").tobytes()


def requests(found: Plan, actor: str = "operator") -> list[ReflectRequested]:
    """The requests that carry ``found`` onto the users' logs, at the sweep's own time."""
    return [ReflectRequested(event_id=new_event_id(), user_id=user, occurred_at=found.swept_at, actor=actor,
                             reason="reflection sweep", sweep_id=found.sweep_id, policy=POLICY, clusters=clusters)
            for user, clusters in sorted(found.clusters.items())]


async def sweep(settings: Settings, pool, *, at: datetime, model: str, user_id: str | None = None,
                mine: Sequence[int] | None = None, dry_run: bool = False, on_progress=None) -> Plan:
    """A reflection sweep as of ``at``: of ``user_id``, of the users of the events partitions
    ``mine`` (a formation worker's), or of everyone; unless ``dry_run``, its requests appended and
    the sweep recorded for each partition it swept (``memstream status``)."""
    from memstream.streams.worker.sweeping import record, send, users_of

    kept = await users_of(settings, mine)
    async with pool.acquire() as conn:
        found = await plan(conn, settings, at=at, model=model, user_id=user_id, kept=kept)
    log.info("reflection sweep %s: %d facts read, %d clusters of %d users%s", found.sweep_id, found.facts_read,
             found.asking, len(found.clusters), " (dry run)" if dry_run else "")
    if dry_run:
        return found
    topic, partitions, swept = await send(settings, requests(found), user_id=user_id, mine=mine,
                                          on_progress=on_progress)
    async with pool.acquire() as conn:
        await record(conn, "reflection_sweeps", topic, found.sweep_id, found.swept_at,
                     {"clusters": {user: len(clusters) for user, clusters in found.clusters.items()}}, partitions,
                     only=swept)
    return found

