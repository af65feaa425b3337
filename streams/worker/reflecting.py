"""A reflection sweep's plan: cluster each user's recent memories by their recorded embeddings
and ask, on the user's log, for a reflection on each cluster said often enough — for ``memstream
sweep reflect`` (``streams.ops.sweep``) and the formation workers' timer.

The memories are the user's current facts (not reflections) said within ``reflect_window_days``
and their turns of that time no such fact was read from (the user's own words: more of what a
fact is about than the extractor kept — "I started volunteering here a year ago" beside "Likes
volunteering"). The clusters are a deterministic function of the projections at the sweep's
time: the memories taken oldest first, each joining the cluster whose centre (the normalised
mean of its members' embeddings) it is closest to, if at least ``reflect_similarity`` (cosine),
else opening one. A cluster of two memories or more, said ``reflect_min_observations`` times
all told (a fact's observations, one per turn), is asked about — unless a reflection still
believed was drawn from some of its memories and none joined them since. A cluster of turns
alone must also have a topic: a word running through it that few of the user's turns the sweep
read hold (``topical``). Small talk is alike in meaning ("thanks!", "cool, see you") and
clusters as readily as a topic does, but the words it shares ("thanks", "that", "you") are in
many of the user's turns. One ``ReflectRequested`` per user carries its clusters; formation
asks the model in the request's place among the user's turns and records the answer, so a
replay applies the reflections without a sweep, a clock or a model.
"""
from __future__ import annotations

import asyncio
import logging
import re
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Callable, NamedTuple, Sequence

import numpy as np

from memstream.config import Settings
from memstream.embedding import from_bytes
from memstream.projections.episodes.core import episode_id
from memstream.schemas import ReflectionCluster, ReflectRequested, new_event_id

log = logging.getLogger("memstream.sweep")

# The sweep's rules, named apart from the prompt's versions. Earlier sweeps' policies were
# "reflect-v1" and "reflect-v2" (their clusters of turns alone were not held to a topic).
POLICY = "cluster-topic-v1"
MAX_SOURCES = 32  # memories a cluster is asked about by (its facts first, then turns; the latest of each)
MAX_CLUSTERS = 100  # ReflectRequested.clusters: a user's largest clusters first
# A turn of fewer words ("ok", "thanks!", "see you") says nothing a reflection could rest on.
MIN_TURN_WORDS = 4
_WORDS = r"\S+" + r"\s+\S+" * (MIN_TURN_WORDS - 1)  # so many words, matched without splitting a long turn
_WORD = re.compile(r"[^\W\d_]{3,}")
TOPIC_CHARS = 4000  # of a turn read for its words: a pasted document's first pages say its topic

_RECENT = """
SELECT user_id, fact_id, embedding, observation_count, embedding_model, recorded_at, source_event_id, observed_in
FROM memory_facts
WHERE status = 'current' AND category <> 'reflection'
  AND coalesce(last_said_at, last_observed_at) BETWEEN $2 AND $3
  AND ($1::text IS NULL OR user_id = $1)
ORDER BY user_id, recorded_at, fact_id
"""
# Every turn a fact was read from, whatever became of the fact (corrected, retracted, archived,
# forgotten with its turns kept): that turn's words are the fact's, not more of the user's own.
_READ_FROM = """
SELECT user_id, source_event_id, observed_in FROM memory_facts
WHERE category <> 'reflection' AND ($1::text IS NULL OR user_id = $1)
"""
_RECENT_TURNS = f"""
SELECT user_id, source_event_id, embedding, embedding_model, recorded_at,
       CASE WHEN $4 THEN left(user_message, {TOPIC_CHARS}) ELSE '' END AS said
FROM episodes
WHERE occurred_at BETWEEN $2 AND $3 AND ($1::text IS NULL OR user_id = $1)
  AND user_message ~ '{_WORDS}'
ORDER BY user_id, recorded_at, source_event_id
"""
# Not the archived ones: a reflection that faded while its sources are still said is drawn again
# (the new one replaces it).
_REFLECTED = """
SELECT user_id, derived_from, derived_from_turns, recorded_at FROM memory_facts
WHERE category = 'reflection' AND status = 'current' AND ($1::text IS NULL OR user_id = $1)
"""


class _Memory(NamedTuple):
    """A fact or a turn a sweep may cluster."""

    id: uuid.UUID  # a fact id, or a turn's event id
    is_turn: bool
    embedding: bytes
    observations: int
    recorded_at: datetime
    words: frozenset[str] = frozenset()  # a turn's words, for the topic test


def words(text: str) -> frozenset[str]:
    """The words of three letters or more in ``text``, folded."""
    return frozenset(_WORD.findall(text.casefold()))


def topical(turns: Sequence[frozenset[str]], held: Counter, of: int, share: float) -> bool:
    """Whether a word runs through ``turns`` (two or more, and half of them) that at most
    ``share`` of the user's ``of`` turns hold (``held``: how many hold each word)."""
    if share <= 0 or len(turns) < 2:
        return False
    within = Counter(w for t in turns for w in t)
    return any(n >= 2 and 2 * n >= len(turns) and held[w] <= share * of for w, n in within.items())


@dataclass
class Plan:
    """What a reflection sweep found, by user: the clusters it would ask about, largest first."""

    sweep_id: uuid.UUID
    swept_at: datetime
    facts_read: int = 0
    turns_read: int = 0
    clusters: dict[str, list[ReflectionCluster]] = field(default_factory=dict)
    texts: dict[tuple[str, uuid.UUID], str] = field(default_factory=dict)  # a dry run's listing, never logged
    appended: dict = field(default_factory=dict)  # each user's request's log position, once sent

    @property
    def asking(self) -> int:
        return sum(len(v) for v in self.clusters.values())

    def as_dict(self) -> dict:
        def listed(user: str, ids: list[uuid.UUID], key: str) -> list[dict]:
            return [{key: str(i), "text": self.texts.get((user, i), "")} for i in ids]

        return {"sweep_id": str(self.sweep_id), "swept_at": self.swept_at.isoformat(), "policy": POLICY,
                "facts_read": self.facts_read, "turns_read": self.turns_read, "users": len(self.clusters),
                "clusters": self.asking,
                "asked": [{"user_id": user, "observations": c.observations,
                           "sources": listed(user, c.sources, "fact_id"), "turns": listed(user, c.turns, "turn_id")}
                          for user, cs in sorted(self.clusters.items()) for c in cs]}


def cluster(vectors: Sequence[np.ndarray], similarity: float) -> list[list[int]]:
    """Indexes of ``vectors`` (unit vectors, in the order given) grouped as the module says."""
    groups: list[list[int]] = []
    sums = np.zeros((16, len(vectors[0]) if len(vectors) else 0), dtype=np.float64)  # grows by doubling
    for i, v in enumerate(vectors):
        v = np.asarray(v, dtype=np.float64)
        if groups:
            opened = sums[:len(groups)]
            closeness = (opened @ v) / np.maximum(np.linalg.norm(opened, axis=1), 1e-12)
            best = int(np.argmax(closeness))  # ties: the first cluster opened
            if closeness[best] >= similarity:
                groups[best].append(i)
                sums[best] += v
                continue
        if len(groups) == len(sums):
            sums = np.vstack([sums, np.zeros_like(sums)])
        sums[len(groups)] = v
        groups.append([i])
    return groups


async def plan(conn, settings: Settings, *, at: datetime, model: str, user_id: str | None = None,
               kept: Callable[[str], bool] | None = None, listing: bool = True) -> Plan:
    """The clusters of every user's recent memories embedded by ``model`` (of ``user_id``, or of
    the users ``kept`` accepts) as of ``at``."""
    found = Plan(sweep_id=uuid.uuid4(), swept_at=at)
    since = at - timedelta(days=settings.reflect_window_days)
    memories: dict[str, list[_Memory]] = defaultdict(list)
    read_from: dict[str, set[uuid.UUID]] = defaultdict(set)  # the turns the facts were read from
    reflected: dict[str, list[tuple[frozenset, datetime]]] = defaultdict(list)

    def wanted(r) -> bool:
        return r["embedding_model"] == model and (kept is None or kept(r["user_id"]))

    async with conn.transaction(readonly=True, isolation="repeatable_read"):
        async for r in conn.cursor(_RECENT, user_id, since, at, prefetch=1000):
            if wanted(r):
                found.facts_read += 1
                memories[r["user_id"]].append(_Memory(r["fact_id"], False, _bytes(r["embedding"]),
                                                      r["observation_count"], r["recorded_at"]))
        async for r in conn.cursor(_READ_FROM, user_id, prefetch=1000):
            read_from[r["user_id"]].update((r["source_event_id"], *r["observed_in"]))
        async for r in conn.cursor(_RECENT_TURNS, user_id, since, at, settings.reflect_topic_share > 0,
                                   prefetch=1000):
            if wanted(r) and r["source_event_id"] not in read_from[r["user_id"]]:
                found.turns_read += 1
                memories[r["user_id"]].append(_Memory(r["source_event_id"], True, _bytes(r["embedding"]), 1,
                                                      r["recorded_at"], words(r["said"])))
        for r in await conn.fetch(_REFLECTED, user_id):
            reflected[r["user_id"]].append((frozenset((*r["derived_from"], *r["derived_from_turns"])),
                                            r["recorded_at"]))
    # Off the event loop: clustering a heavy user's memories takes seconds, and the worker's
    # heartbeats to its group run on that loop.
    found.clusters = await asyncio.to_thread(_clusters, memories, reflected, settings)
    if found.clusters and listing:
        found.texts = await _texts(conn, found.clusters)
    return found


def _clusters(memories: dict[str, list[_Memory]], reflected: dict, settings: Settings
              ) -> dict[str, list[ReflectionCluster]]:
    """Each user's clusters worth a reflection, at most ``MAX_CLUSTERS``, the most observed first."""
    out = {}
    for user, rows in memories.items():
        rows.sort(key=lambda m: (m.recorded_at, m.is_turn, m.id))
        said = [m.words for m in rows if m.is_turn]
        held = Counter(w for t in said for w in t)
        asked = []
        for group in cluster([from_bytes(m.embedding) for m in rows], settings.reflect_similarity):
            members = [rows[i] for i in group]
            facts = [m for m in members if not m.is_turn][-MAX_SOURCES:]
            turns = [m for m in members if m.is_turn][len(facts) - MAX_SOURCES:] if len(facts) < MAX_SOURCES else []
            members = facts + turns
            observations = sum(m.observations for m in members)
            if (len(members) < 2 or observations < settings.reflect_min_observations
                    or _reflected_on(members, reflected[user])):
                continue
            if not facts and not topical([m.words for m in turns], held, len(said), settings.reflect_topic_share):
                continue
            asked.append(ReflectionCluster(sources=[m.id for m in facts], turns=[m.id for m in turns],
                                           observations=observations))
        if asked:
            out[user] = sorted(asked, key=lambda c: (-c.observations, str([*c.sources, *c.turns][0])))[:MAX_CLUSTERS]
    return out


async def _texts(conn, clusters: dict[str, list[ReflectionCluster]]) -> dict[tuple[str, uuid.UUID], str]:
    """What each clustered fact says and each clustered turn's user said (a dry run's listing)."""
    facts = [(u, f) for u, cs in clusters.items() for c in cs for f in c.sources]
    turns = [(u, t) for u, cs in clusters.items() for c in cs for t in c.turns]
    texts = {}
    if facts:
        rows = await conn.fetch("SELECT f.user_id, f.fact_id, f.text FROM memory_facts f JOIN unnest($1::text[], "
                                "$2::uuid[]) AS w(user_id, fact_id) USING (user_id, fact_id)", *zip(*facts))
        texts.update(((r["user_id"], r["fact_id"]), r["text"]) for r in rows)
    if turns:
        rows = await conn.fetch("SELECT e.user_id, e.source_event_id, e.user_message FROM episodes e JOIN "
                                "unnest($1::text[], $2::uuid[]) AS w(user_id, episode_id) USING (user_id, episode_id)",
                                [u for u, _ in turns], [episode_id(t) for _, t in turns])
        texts.update(((r["user_id"], r["source_event_id"]), r["user_message"]) for r in rows)
    return texts


def _reflected_on(members: list[_Memory], reflections: list[tuple[frozenset, datetime]]) -> bool:
    """Whether a reflection still believed was drawn from some of ``members`` only, and none of
    them was recorded after it (a memory joined since: asked again, the new one replaces it)."""
    ids = {m.id for m in members}
    drawn = [at for sources, at in reflections if sources <= ids]
    return bool(drawn) and all(m.recorded_at <= max(drawn) for m in members)


def _bytes(embedding) -> bytes:
    values = embedding.to_numpy() if hasattr(embedding, "to_numpy") else embedding
    return np.asarray(values, dtype="<f4").tobytes()


def requests(found: Plan, actor: str = "operator") -> list[ReflectRequested]:
    """The requests that carry ``found`` onto the users' logs, at the sweep's own time."""
    return [ReflectRequested(event_id=new_event_id(), user_id=user, occurred_at=found.swept_at, actor=actor,
                             reason="reflection sweep", sweep_id=found.sweep_id, policy=POLICY, clusters=clusters)
            for user, clusters in sorted(found.clusters.items())]


async def sweep(settings: Settings, pool, *, at: datetime, model: str, user_id: str | None = None,
                mine: Sequence[int] | None = None, dry_run: bool = False, on_progress=None,
                listing: bool = True) -> Plan:
    """A reflection sweep as of ``at``: of ``user_id``, of the users of the events partitions
    ``mine`` (a formation worker's), or of everyone; unless ``dry_run``, its requests appended and
    the sweep recorded for each partition it swept (``memstream status``)."""
    from memstream.streams.worker.sweeping import record, send, users_of

    kept = await users_of(settings, mine)
    async with pool.acquire() as conn:
        found = await plan(conn, settings, at=at, model=model, user_id=user_id, kept=kept, listing=listing)
    log.info("reflection sweep %s: %d facts and %d turns read, %d clusters of %d users%s", found.sweep_id,
             found.facts_read, found.turns_read, found.asking, len(found.clusters), " (dry run)" if dry_run else "")
    if dry_run:
        return found
    topic, partitions, swept = await send(settings, requests(found), user_id=user_id, mine=mine,
                                          on_progress=on_progress, appended=found.appended)
    async with pool.acquire() as conn:
        await record(conn, "reflection_sweeps", topic, found.sweep_id, found.swept_at,
                     {"clusters": {user: len(clusters) for user, clusters in found.clusters.items()}}, partitions,
                     only=swept)
    return found

