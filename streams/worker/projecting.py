"""The projection steps: decisions in, rows and positions out (one transaction per step).

Each projection has its own positions and its own gate, so one can be rebuilt or lag without
the other. Undecodable decision records are dead-lettered once, by the episodes step (it runs
first); the other steps skip them.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from typing import Callable

import asyncpg

from memstream.projections import cache_keys, kept_schemas, session_cache
from memstream.projections.episodes import core as episodes
from memstream.projections.episodes import query as episodes_query
from memstream.projections.positions import claim, epoch, events_covered
from memstream.projections.episodes.store import EpisodeStore, Forgotten
from memstream.projections.facts.store import FactStore
from memstream.projections.graph.store import GraphStore
from memstream.projections.commands.core import Logged
from memstream.projections.commands.store import CommandStore
from memstream.projections.profile import store as profile_store
from memstream.projections.redaction import refusal
from memstream.schemas import EpisodeRecorded, EpisodesSwept, FactDecision, GraphDecision, InvalidEvent, MemoryForgotten, decode_decision
from memstream.schemas.errors import Refused, Retryable
from memstream.schemas.events import COMMAND_TYPES
from memstream.streams.log.screening import screen
from memstream.streams.log.dead_letter import InputRefused
from memstream.streams.log.records import Record, next_offsets

log = logging.getLogger("memstream.projections")

STALE_KEPT = 10_000  # conversations whose Tier 0 push failed, rebuilt once Redis answers
STALE_PER_PUSH = 256  # of them rebuilt by one push: one write too big to make would fail them all


def _refused_by_server(exc: BaseException) -> bool:
    """The server rejected this data: a data exception or constraint violation (SQLSTATE class
    22/23), or a value past a limit (54000, e.g. an index row too large). Client-side encoding
    errors carry no severity: those are bugs, never a record's fault."""
    state = getattr(exc, "sqlstate", None) or ""
    return (isinstance(exc, asyncpg.PostgresError) and getattr(exc, "severity", None) is not None
            and (state[:2] in ("22", "23") or state == "54000"))


async def _one_by_one(conn, dead_letters, stage: str, items, batch_error: BaseException, *, apply, finish
                      ) -> set[int]:
    """A batch the store or the database refused: each ``(record, item)`` applied on its own
    savepoint, inside one transaction that also moves the positions past the whole batch
    (``finish``). The ones refused (``Refused``: e.g. the store lacks a row they name; or the
    database refuses their rows) are dead-lettered with the reason, and the letters are durable before
    that transaction commits: a position never passes a record whose letter could be lost.
    When the database refuses every item of several users, that is our bug or our schema, not
    bad records: the batch's error is raised instead (one user's records refused alike are that
    user's input: dead-lettered, or a stranger could stop the worker). Returns the ``id()`` of
    the records refused."""
    refused, by_database = [], 0
    async with conn.transaction():
        # Deferred constraints (the edges' overlap, the foreign keys) checked at each item, not
        # at the commit: else one item's violation fails the commit and stops the projection for good.
        await conn.execute("SET CONSTRAINTS ALL IMMEDIATE")
        for r, item in items:
            try:
                await apply(r, item)
            except Refused as exc:
                refused.append((r, stage, InputRefused(exc) if exc.users_input else str(exc)))
            except asyncpg.PostgresError as exc:
                if not _refused_by_server(exc):
                    raise
                refused.append((r, stage, f"database refused it: {refusal(exc)}"))
                by_database += 1
        if by_database == len(items) and len({r.key for r, _ in items}) > 1:
            raise batch_error
        await finish()
        await dead_letters.send(refused)
    return {id(r) for r, *_ in refused}


class EpisodesProjection:
    """decisions -> episodes rows (Postgres) and Tier 0 turns (Redis)."""

    name = "episodes"

    def __init__(self, *, pool: asyncpg.Pool, redis, schema: str, dead_letters, tier0_turns: int,
                 tier0_ttl_s: int = session_cache.TTL_S):
        self._pool, self._redis, self._schema = pool, redis, schema
        self._dead, self._keep, self._ttl_s = dead_letters, tier0_turns, tier0_ttl_s
        self._store = EpisodeStore()
        self._cache = CacheEpoch("episodes")
        # Conversations whose Tier 0 push failed, in the order they failed, with their partition:
        # rebuilt from Postgres by a later push of that partition (its owner: another worker
        # may be forgetting them), or their keys would lack those turns.
        self._stale: dict[tuple[str, str], int] = {}

    async def process(self, records: list[Record]) -> None:
        await _abandoning(self._cache, self._pool, self._process, records)

    async def _process(self, records: list[Record], abandoned: bool = False) -> None:
        rows, letters, decided = [], [], []
        for r in records:
            if r.sealing is not None:  # shredded: skipped; else it does not open
                if not r.shredded:
                    letters.append((r, self.name, r.sealing))
                continue
            try:
                decision = decode_decision(r.value or b"")
            except InvalidEvent as exc:
                letters.append((r, self.name, f"undecodable decision: {exc}"))
                continue
            decided.append((r, decision))
            if isinstance(decision, EpisodeRecorded):
                rows.append((r, episodes.apply(decision)))
            elif (isinstance(decision, MemoryForgotten) and decision.kind in ("episode", "user")) \
                    or isinstance(decision, EpisodesSwept):
                rows.append((r, decision))
        # Dead letters first: the position must not pass a record before its letter is durable.
        await self._dead.send(letters)
        self._dead.observe(len(records) - len(letters))
        forgotten = Forgotten([], [], set())
        async with self._pool.acquire() as conn:
            await self._cache.purge(conn, self._redis, self._schema)
            async with conn.transaction():
                unapplied = await _claimed(conn, self.name, records)
                epoch_now = await self._cache.read(conn)
                rows = [(r, row) for r, row in rows if unapplied(r)]
                positions = {**next_offsets(records), **events_covered(d for r, d in decided if unapplied(r))}

                async def erase() -> None:  # what a forget removes beyond this schema's rows
                    await kept_schemas.forget_users(conn, self._schema, forgotten.erased)
                    if self._redis is not None and (forgotten.episodes or forgotten.users):
                        await _erased("tier 0", session_cache.forget(self._redis, self._schema, epoch_now,
                                                                     forgotten.episodes, forgotten.users), abandoned)

                try:
                    async with _checked(conn):
                        forgotten = await self._store.apply_batch(conn, [row for _, row in rows], positions)
                    await erase()
                except asyncpg.PostgresError as exc:
                    if not _refused_by_server(exc):
                        raise
                    log.warning("episodes batch refused (%s); applying record by record", refusal(exc))

                    async def one(r, row) -> None:
                        gone = await self._store.apply_batch(conn, [row], {})
                        forgotten.episodes.extend(gone.episodes)
                        forgotten.users.extend(gone.users)
                        forgotten.erased.extend(gone.erased)
                        forgotten.kept_out.update(gone.kept_out)

                    async def finish() -> None:  # erased before the letters go: a retry sends them again
                        await self._store.apply_batch(conn, [], positions)
                        await erase()

                    refused = await _one_by_one(conn, self._dead, self.name, rows, exc, apply=one, finish=finish)
                    rows = [(r, row) for r, row in rows if id(r) not in refused]  # not in Tier 0 either
                # Before the commit, as a forget's erasure: a worker killed before the commit leaves
                # turns in Tier 0 that Postgres gets when the batch is applied again; one killed
                # after it would have left them out of Tier 0 for good.
                partition = {(row.user_id, row.conversation_id): r.partition for r, row in rows
                             if not isinstance(row, (MemoryForgotten, EpisodesSwept))}
                rebuilt = await self._push(conn, epoch_now, [t for t in _not_forgotten_after(rows)
                                                             if (t.user_id, t.episode_id) not in forgotten.kept_out],
                                           partition, {r.partition for r in records})
        for c in rebuilt:
            del self._stale[c]

    async def _push(self, conn, epoch_now: int, turns: list, partition: dict, partitions: set[int]) -> list:
        """Tier 0 given ``turns`` (the keys it lacks, and up to ``STALE_PER_PUSH`` stale ones of
        ``partitions``, seeded from ``conn``'s view of the store); returns the stale ones it
        rebuilt. A failure is logged and remembered, not raised: a derived cache."""
        due = [c for c, p in self._stale.items() if p in partitions][:STALE_PER_PUSH]
        if self._redis is None or not (turns or due):
            return []
        try:
            async def history(conversations, n: int):
                async with conn.transaction():  # a savepoint: its failure must not fail the batch
                    return await episodes_query.recent_of(conn, conversations, n)

            await session_cache.push_turns(self._redis, self._schema, epoch_now, turns, self._keep, history,
                                           stale=due, ttl_s=self._ttl_s)
            return due
        except Exception:  # the read path falls back to Postgres for a conversation with no key
            log.exception("tier 0 cache update failed for %d turns and %d stale conversations", len(turns), len(due))
            for c in due:  # last in line: a rebuild that always fails must not hold back the others
                self._stale[c] = self._stale.pop(c)
            for t in turns:
                self._stale.setdefault((t.user_id, t.conversation_id), partition[t.user_id, t.conversation_id])
            while len(self._stale) > STALE_KEPT:  # Redis long gone: the oldest are left as they are
                del self._stale[next(iter(self._stale))]
            return []


def _not_forgotten_after(rows) -> list:
    """The turns of ``rows`` (in log order) that no later forget of the batch forgot: a user
    who came back after their forget keeps what they said since."""
    users, turns, out = set(), set(), []
    for row in reversed(rows):
        row = row[1]
        if isinstance(row, EpisodesSwept):
            continue  # the index a turn is in: Tier 0 holds the turns themselves
        if isinstance(row, MemoryForgotten):
            if row.kind == "user":
                users.add(row.user_id)
            else:  # the store forgets only the user's own turn of that id
                turns.add((row.user_id, episodes.episode_id(row.target)))
        elif row.user_id not in users and (row.user_id, row.episode_id) not in turns:
            out.append(row)
    return out[::-1]


async def _claimed(conn, name: str, records: list[Record]) -> Callable[[Record], bool]:
    """Claim ``name``'s positions on ``records``' partitions (``positions.claim``) and say which
    of them are not applied yet: a batch begun before a rebalance may reach its commit after the
    partitions' next owner (this worker again, or a worker the group dropped and its successor)
    applied part of it; projections are functions of the log, so the rest is applied, once."""
    stored = await claim(conn, name, next_offsets(records))
    return lambda r: r.offset >= stored[r.topic, r.partition]


@contextlib.asynccontextmanager
async def _checked(conn):
    """A savepoint whose deferred constraints are checked at its end, where a violation can still
    be caught (``_one_by_one``), not at the commit of the transaction around it."""
    async with conn.transaction():
        yield
        await conn.execute("SET CONSTRAINTS ALL IMMEDIATE")


class CacheUnavailable(Retryable):
    """Redis could not erase what a forget removed: the batch is applied again once the cache's
    epoch is abandoned (``CacheEpoch.abandon``), its position unmoved meanwhile."""


async def _erased(cache: str, erasing, abandoned: bool = False) -> None:
    # Before the commit: once the position passes a forget, no cache may serve what it forgot
    # (the read path reads Redis whenever it holds something; Redis back from an outage would
    # still hold it). Unless the cache's epoch was abandoned since: no reader reads those keys.
    try:
        await erasing
    except Exception as exc:
        if not abandoned:
            raise CacheUnavailable(f"{cache}: {type(exc).__name__}: {exc}") from exc
        log.warning("%s: Redis could not erase a forget's keys (%s); they are of an abandoned epoch, deleted "
                    "when Redis answers", cache, type(exc).__name__)


async def _abandoning(cache: "CacheEpoch", pool, process, records: list[Record]) -> None:
    """``process(records)``; applied again on an abandoned cache epoch when Redis cannot erase
    what a forget of them removed."""
    try:
        await process(records)
    except CacheUnavailable:
        await cache.abandon(pool)
        await process(records, abandoned=True)


class CacheEpoch:
    """A projection's cache epoch (part of its Redis keys), read again at every batch: another
    worker may have abandoned it. Abandoning is how a forget passes while Redis is down (docs/failure-scenarios.md:
    Redis is reported, not required): the epoch moves on, every reader reads it again within
    ``EPOCH_FRESH_S`` and so never reads the old keys, and those are deleted once Redis answers
    (``purge``). The cost: that projection's cache starts cold, and the batch waits 5 s."""

    PURGE_EVERY_S = 5.0  # how often a pending purge is looked for (and tried, while Redis does not answer)

    def __init__(self, projection: str):
        self.projection, self.value, self._tried = projection, None, 0.0

    async def read(self, conn) -> int:
        self.value = await epoch(conn, self.projection)
        return self.value

    async def abandon(self, pool) -> int:
        async with pool.acquire() as conn:
            self.value = await conn.fetchval("UPDATE projection_epochs SET epoch = epoch + 1, purge_pending = true "
                                             "WHERE projection = $1 RETURNING epoch", self.projection)
        log.warning("%s cache: epoch %d abandoned (Redis could not erase a forget's keys); now %d",
                    self.projection, self.value - 1, self.value)
        # Committed before the batch is applied again: by the time its position passes the
        # forget, every reader has read the new epoch, and a read begun before then has ended
        # (its deadline is 2 s: the wait is a switch's, ``switch._drop_stale_caches``).
        await asyncio.sleep(cache_keys.EPOCH_FRESH_S + 4)
        return self.value

    async def purge(self, conn, redis, schema: str) -> None:
        """Delete the keys of abandoned epochs, if any wait and Redis answers (best effort)."""
        # Looked at once every PURGE_EVERY_S, not at every batch: a batch already reads its epoch.
        if redis is None or time.monotonic() - self._tried < self.PURGE_EVERY_S:
            return
        self._tried = time.monotonic()
        rows = await conn.fetch("SELECT projection, epoch, purge_pending FROM projection_epochs")
        if not any(r["purge_pending"] for r in rows):
            return
        epochs = {r["projection"]: r["epoch"] for r in rows}
        try:
            gone = await cache_keys.drop_stale(redis, schema, epochs)
        except Exception as exc:
            log.warning("abandoned cache keys not deleted yet (%s: %s)", type(exc).__name__, exc)
            return
        await conn.execute("UPDATE projection_epochs SET purge_pending = false WHERE purge_pending AND "
                           "epoch = ($1::jsonb ->> projection)::int", json.dumps(epochs))
        log.info("deleted %d keys of abandoned cache epochs", gone)


class _DecisionProjection:
    """Applies one family of records with its store; undecodable records are dead-lettered by the
    step that owns their topic (episodes for decisions, formation for events). A record naming a
    row the store lacks, or one whose rows the database refuses, is dead-lettered with the reason,
    the rest applied (each on its own savepoint: `_one_by_one`)."""

    name: str
    kinds: tuple[type, ...]

    def __init__(self, *, pool: asyncpg.Pool, dead_letters, redis=None, schema: str | None = None):
        self._pool, self._dead, self._redis, self._schema = pool, dead_letters, redis, schema
        self._store = self.store()
        self._abandoned = False

    cache: CacheEpoch | None = None  # of a projection with a Redis cache a forget erases

    async def process(self, records: list[Record]) -> None:
        await _abandoning(self.cache, self._pool, self._process, records)

    async def _process(self, records: list[Record], abandoned: bool = False) -> None:
        self._abandoned = abandoned
        decoded = self.decoded(records)
        async with self._pool.acquire() as conn:
            if self.cache is not None:
                await self.cache.purge(conn, self._redis, self._schema)
            async with conn.transaction():
                unapplied = await _claimed(conn, self.name, records)
                decoded = [(r, d) for r, d in decoded if unapplied(r)]
                decisions = [(r, self.item(r, d)) for r, d in decoded if isinstance(d, self.kinds)]
                positions = {**next_offsets(records), **events_covered(d for _, d in decoded)}
                try:
                    async with _checked(conn):
                        result = await self._store.apply_batch(conn, [d for _, d in decisions], positions)
                    await self.before_commit(conn, decisions, result)
                except (Refused, asyncpg.PostgresError) as exc:
                    if not isinstance(exc, Refused) and not _refused_by_server(exc):
                        raise
                    results = []

                    async def one(r, d) -> None:
                        results.append(await self._store.apply_batch(conn, [d], {}))

                    async def finish() -> None:  # before the letters go: a retry sends them again
                        await self._store.apply_batch(conn, [], positions)
                        await self.before_commit(conn, decisions, self.merged(results))

                    await _one_by_one(conn, self._dead, self.name, decisions, exc, apply=one, finish=finish)

    def item(self, r: Record, d):
        """What the store applies for ``d`` (decoded from ``r``)."""
        return d

    def decoded(self, records: list[Record]) -> list[tuple[Record, object]]:
        """The records this step may apply, decoded; the others are the owning step's to dead-letter."""
        out = []
        for r in records:
            if r.sealing is not None:
                continue
            try:
                out.append((r, decode_decision(r.value or b"")))
            except InvalidEvent:
                continue
        return out

    def merged(self, results: list):
        """The store's results of a batch applied record by record, as one batch's."""
        return None

    async def before_commit(self, conn, items, result) -> None:
        """Under the claim, before the position passes ``items``: a forget's erasure from a cache,
        and the caches derived from ``result`` (so a dropped worker's write never lands last)."""


class FactsProjection(_DecisionProjection):
    """decisions -> memory_facts (every version, with history) and Tier 1 profiles."""

    name, kinds, store = "facts", (FactDecision, MemoryForgotten), FactStore

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.cache = CacheEpoch("profile")

    def merged(self, results: list) -> dict:
        return {user: profile for profiles in results for user, profile in profiles.items()}

    async def before_commit(self, conn, items, profiles) -> None:
        # Under the claim, as Tier 0: a worker dropped from its group after committing must not
        # write its profiles after its successor wrote newer ones (they carry no TTL). A batch
        # with a forget: every profile it changed (emptied, or without a forgotten fact), the
        # forgetting users' keys of other epochs gone first (a switch's leftovers), or no commit.
        if self._redis is None:
            return
        forgetting = {d.user_id for _, d in items if isinstance(d, MemoryForgotten)}
        now = await self.cache.read(conn)
        if forgetting:
            if stale := cache_keys.older(self._schema, now, "t1", forgetting):
                await _erased("tier 1", self._redis.delete(*stale), self._abandoned)
            await _erased("tier 1", profile_store.cache(self._redis, self._schema, now, profiles or {}),
                          self._abandoned)
        elif profiles:
            try:  # best effort: the read path falls back to Postgres
                await profile_store.cache(self._redis, self._schema, now, profiles)
            except Exception as exc:
                log.warning("tier 1 cache update failed for %d profiles: %s", len(profiles), type(exc).__name__)


class CommandsProjection(_DecisionProjection):
    """events -> reminders and identities (the commands hosts put on the log; turns are skipped)."""

    name, kinds, store = "commands", COMMAND_TYPES, CommandStore

    def __init__(self, *, partitions: int | None = None, **kwargs):
        super().__init__(**kwargs)
        self._partitions = partitions

    def decoded(self, records: list[Record]) -> list[tuple[Record, object]]:
        # The records formation screens in, no others: it dead-letters the rest.
        return screen(records, self.name, self._partitions)[0]

    def item(self, r: Record, e) -> Logged:
        return Logged(r.offset, e)  # identities are replaced in log order


class GraphProjection(_DecisionProjection):
    """decisions -> entities and bi-temporal memory_edges."""

    name, kinds, store = "graph", (GraphDecision, MemoryForgotten), GraphStore
