"""Switching the live schema to a rebuilt one (blue-green): catch the rebuilt schema up with the
log, check it holds what the live one holds, and swap the two under the switch lock
(``streams.worker.switch_lock``) while the workers wait; the old schema is kept (``<live>_old_<n>``)
unless dropped, and the read caches of the old epochs are dropped."""
from __future__ import annotations

import asyncio
import logging
import time

import asyncpg
from aiokafka import TopicPartition

from memstream.config import Settings
from memstream.projections import db
from memstream.projections import positions as pos
from memstream.keys import data_keys
from memstream.streams.log.kafka_util import drain, groupless_consumer, partitions_of
from memstream.streams.ops.replay import ReplayError
from memstream.streams.log.sealing import RecordSealer
from memstream.streams.worker import switch_lock

log = logging.getLogger("memstream.rebuild")


class SwitchRefused(ReplayError):
    """A switch that would not be safe now (workers running, the rebuilt schema behind or unequal)."""


async def catch_up(settings: Settings, dsn: str, schema: str, *, until: str | None = None) -> int:
    """Apply to ``schema`` what the log holds past its stored positions, through the live
    projections' steps, up to the high-water marks now or, with ``until``, up to where schema
    ``until``'s projections stand (never past the marks); returns the records read."""
    from memstream.streams.ops.replay import SkippedLetters, replay_steps

    pool, bound, read = await db.create_pool(dsn, schema, max_size=2), None, 0
    try:
        if until is not None:
            bound = await db.create_pool(dsn, until, max_size=1)
        keys = await data_keys(settings, pool)
        sink = SkippedLetters()
        async with groupless_consumer(settings.kafka_bootstrap, auto_offset_reset="earliest") as consumer:
            events = len(await partitions_of(consumer, settings.events_topic)) or None  # screening's count
            groups = {t: replay_steps(settings, pool, schema, sink, names, events)
                      for t, names in ((settings.decisions_topic, ["episodes", "facts", "graph"]),
                                       (settings.events_topic, ["commands"]))}
            for topic, steps in groups.items():
                stored = {s.name: await pos.load(pool, s.name, topic) for s in steps}
                tps = [TopicPartition(topic, p) for p in await partitions_of(consumer, topic)]
                consumer.assign(tps)
                for tp in tps:
                    consumer.seek(tp, min(stored[s.name].get(tp.partition, 0) for s in steps))
                # Read to the marks even when bounded: a partition left mid-fetch keeps records
                # buffered, and aiokafka then holds back fetching the others (its prefetch backoff).
                high = await consumer.end_offsets(tps)
                upto = {s.name: {tp.partition: high[tp] for tp in tps} for s in steps}
                if bound is not None:
                    for s in steps:
                        at = await pos.load(bound, s.name, topic)
                        upto[s.name] = {p: min(end, at.get(p, 0)) for p, end in upto[s.name].items()}
                sealer = RecordSealer(keys)

                async def apply(batch) -> None:
                    nonlocal read
                    batch = await sealer.open(batch)
                    for step in steps:
                        mine = [r for r in batch if stored[step.name].get(r.partition, 0) <= r.offset
                                < upto[step.name][r.partition]]
                        if mine:
                            await step.process(mine)
                    read += len(batch)

                await drain(consumer, tps, high, apply)
    finally:
        await pool.close()
        if bound is not None:
            await bound.close()
    return read


async def _built_from_the_live_topics(settings: Settings, dsn: str, schema: str) -> None:
    """Refuse a schema built from other topics, before the catch-up would apply this log to it
    too: one built before the log moved to more partitions (its positions and identity offsets
    are on the old topics; ``streams.ops.partition_growth`` moves the live ones), one replayed from a
    reform's topic, or another deployment's."""
    from memstream.streams.log.log_topics import moves

    conn = await asyncpg.connect(dsn)
    try:
        topics = {r[0] for r in await conn.fetch(f'SELECT DISTINCT topic FROM "{schema}".projection_positions')}
        moved = {m["from_decisions"]: m["to_decisions"] for m in await moves(conn, settings) if m["state"] == "moved"}
    finally:
        await conn.close()
    if settings.decisions_topic not in topics and (old := topics & set(moved)):
        raise SwitchRefused(f"{schema} was built from {', '.join(sorted(old))}, before the log moved to "
                            f"{settings.decisions_topic}: drop it and rebuild it from the log")
    if foreign := topics - {settings.events_topic, settings.decisions_topic, settings.ingress_topic}:
        raise SwitchRefused(f"{schema} holds positions of {', '.join(sorted(foreign))}, not of this log's topics: "
                            "a schema replayed from a reform's topic goes live with the workers and readers "
                            "pointed at that topic and schema, not by a switch (which would apply this log's "
                            "decisions to it too); left unchanged")


async def _indexed_as_live(dsn: str, live: str, schema: str) -> None:
    """Refuse a schema whose indexes are not all there and valid, as a bulk rebuild killed before
    it built them leaves it (rows without their vector and text indexes: reads would time out)."""
    conn = await asyncpg.connect(dsn)
    try:
        lacking = await conn.fetch(
            "SELECT indexname FROM pg_indexes WHERE schemaname = $1 EXCEPT "
            "SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
            "WHERE c.relnamespace = $2::regnamespace AND i.indisvalid ORDER BY 1", live, schema)
    finally:
        await conn.close()
    if lacking:
        raise SwitchRefused(f"{schema} lacks indexes the live schema has, or holds them unbuilt "
                            f"({', '.join(r[0] for r in lacking)}): its rebuild did not finish; drop it and rebuild it")


async def switch(settings: Settings, dsn: str, schema: str, *, drop_old: bool = False, force: bool = False,
                 workers_timeout_s: float = 60.0) -> dict:
    """Make ``schema`` (a rebuild) the live one: catch it up with the log, pause the workers
    (``streams.worker.switch_lock``: they restart and wait; ``workers_timeout_s`` for them to leave
    their groups), catch up the tail they applied meanwhile, compare it with the live schema
    table by table, then in one transaction rename the live
    schema to ``<live>_old_<n>`` and ``schema`` to the live name — every reader's next statement
    reads the new one (Postgres re-resolves a session's search path when a schema is renamed,
    prepared statements included) — and give the new schema's projections epochs past the old
    ones, so no Redis cache of the old build is read. The workers go on on it by themselves."""
    from memstream.projections.compare import TABLES, diff_counts
    from memstream.streams.log.log_topics import live_log_at
    from memstream.streams.ops.status import worker_groups

    live = settings.postgres_schema
    if schema == live:
        raise SwitchRefused("that is the live schema already")
    if schema == settings.keys_schema or schema.startswith(f"{live}_old_"):
        raise SwitchRefused(f"{schema} is not a rebuild of {live}: the key store, or a schema a switch set aside")
    # The log's topics and groups now, not when the caller read its settings (a rebuild takes
    # long enough for ``partitions grow`` to move the log meanwhile).
    settings = await live_log_at(settings, dsn)
    conn = await asyncpg.connect(dsn)
    try:  # first: a build under way fails the checks below, which would say to drop it
        if await switch_lock.being_built(conn, schema):
            raise SwitchRefused(f"a replay or rebuild is still writing {schema}: switch once it is done")
    finally:
        await conn.close()
    await _built_from_the_live_topics(settings, dsn, schema)
    await _indexed_as_live(dsn, live, schema)
    # The bulk with the workers going on, up to where the live projections stand now: no further,
    # or the comparison below would find rows the paused live schema has not applied yet.
    phases, t = {}, time.monotonic()
    caught = await catch_up(settings, dsn, schema, until=live)
    phases["catch_up"], t = time.monotonic() - t, time.monotonic()
    conn = await asyncpg.connect(dsn)
    try:
        # Pause the workers: they see the lock within seconds and restart, waiting on it; once
        # they have left their groups nothing writes the live schema, and the tail is caught up.
        await switch_lock.hold(conn, live)
        t = paused = time.monotonic()
        while running := {g: m for g, m in (await worker_groups(settings)).items() if m}:
            if time.monotonic() - t > workers_timeout_s:
                raise SwitchRefused(f"workers are still running after {workers_timeout_s:.0f} s ({', '.join(running)}): "
                                    "are they of this version? stop them, then switch")
            await asyncio.sleep(0.5)
        gone_s = phases["workers_gone"] = time.monotonic() - t
        t = time.monotonic()
        # To where the paused workers left the live schema: compared there, and they go on from there.
        caught += await catch_up(settings, dsn, schema, until=live)
        phases["catch_up_paused"], t = time.monotonic() - t, time.monotonic()
        differ = {table: d for table in (x for ts in TABLES.values() for x in ts)
                  if (d := await diff_counts(conn, live, schema, table)) != (0, 0)}
        phases["compare"], t = time.monotonic() - t, time.monotonic()
        if differ and not force:
            ahead = await conn.fetchval(
                f'SELECT count(*) FROM "{schema}".projection_positions s JOIN "{live}".projection_positions l '
                "USING (projection, topic, partition) WHERE s.next_offset > l.next_offset")
            why = (f" ({schema} had read past where the workers left {live} on {ahead} partition(s): they were behind; "
                   "switch again once they have caught up)" if ahead else "")
            raise SwitchRefused(f"{schema} differs from {live} (rows only in each): {differ}{why}; "
                                "--force to switch anyway")
        # Past the highest kept: an operator may have dropped some of them, in any order.
        n = 1 + max([int(x[len(f"{live}_old_"):]) for x, in await conn.fetch(
            "SELECT nspname FROM pg_namespace WHERE starts_with(nspname, $1)", f"{live}_old_")
            if x[len(f"{live}_old_"):].isdigit()] or [0])
        old = f"{live}_old_{n}"
        if (await live_log_at(settings, dsn)).decisions_topic != settings.decisions_topic:
            raise SwitchRefused(f"the log moved off {settings.decisions_topic} during the switch: {schema} holds "
                                "positions of the old topics; drop it and rebuild it from the log")
        async with conn.transaction():
            # Formation's and the ingress sealing's positions are not rebuilt (they are where the
            # stopped workers left the log): without them the workers would start those again at 0.
            await conn.execute(
                f'INSERT INTO "{schema}".projection_positions SELECT * FROM "{live}".projection_positions p '
                f'WHERE NOT EXISTS (SELECT FROM "{schema}".projection_positions q WHERE q.projection = p.projection)')
            # The deployment's registry of reforms is not a projection either: it goes on.
            await conn.execute(f'INSERT INTO "{schema}".reforms SELECT * FROM "{live}".reforms ON CONFLICT DO NOTHING')
            epoch = await _next_epoch(conn, settings.keys_schema, live, schema)
            await conn.execute(f'ALTER SCHEMA "{live}" RENAME TO "{old}"')
            await conn.execute(f'ALTER SCHEMA "{schema}" RENAME TO "{live}"')
            for name in (old, live):  # functions fixed to their schema's name (the postings triggers)
                for fn in await conn.fetch(
                        "SELECT p.oid::regprocedure::text FROM pg_proc p WHERE p.pronamespace = $1::regnamespace "
                        "AND EXISTS (SELECT FROM unnest(p.proconfig) c WHERE c LIKE 'search_path=%')", name):
                    await conn.execute(f'ALTER FUNCTION {fn[0]} SET search_path = "{name}", public')
            await conn.execute(f'UPDATE "{live}".projection_epochs SET epoch = $1', epoch)
        if drop_old:
            await conn.execute(f'DROP SCHEMA "{old}" CASCADE')
        epochs = dict(await conn.fetch(f'SELECT projection, epoch FROM "{live}".projection_epochs'))
    finally:
        await conn.close()  # the lock goes with it: the workers go on
    paused_s = time.monotonic() - paused
    stale = await _drop_stale_caches(settings, live, epochs)
    if stale is None:  # Redis did not answer: the projections delete them once it does (``CacheEpoch.purge``)
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute(f'UPDATE "{live}".projection_epochs SET purge_pending = true')
        finally:
            await conn.close()
    log.info("switched: %s is live (was %s), the old one %s; %d records caught up; workers paused %.1f s "
             "(%.1f s of it for them to leave their groups; phases %s)", live, schema,
             "dropped" if drop_old else f"kept as {old}", caught, paused_s, gone_s,
             {k: round(v, 2) for k, v in phases.items()})
    return {"live": live, "from": schema, "old": None if drop_old else old, "caught_up_records": caught,
            "workers_paused_s": round(paused_s, 2), "seconds": {k: round(v, 2) for k, v in phases.items()},
            "differences": differ, "stale_cache_keys_dropped": stale}


async def _next_epoch(conn, keys_schema: str, live: str, schema: str) -> int:
    """An epoch past every one a switch ever gave out under the name ``live``, and past both
    schemas' own: kept in the key store, which no switch renames, since an undo (the old schema
    renamed back) lowers the live epochs while Redis still holds keys of the undone build's —
    reusing one of those would serve that build's caches, forgotten facts and all."""
    await conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{keys_schema}"')
    await conn.execute(f'CREATE TABLE IF NOT EXISTS "{keys_schema}".switch_epochs '
                       "(live text PRIMARY KEY, epoch bigint NOT NULL)")
    epoch = 1 + await conn.fetchval(
        f'SELECT greatest((SELECT max(epoch) FROM "{live}".projection_epochs), '
        f'(SELECT max(epoch) FROM "{schema}".projection_epochs), '
        f'(SELECT epoch FROM "{keys_schema}".switch_epochs WHERE live = $1 FOR UPDATE), 0)', live)
    await conn.execute(f'INSERT INTO "{keys_schema}".switch_epochs VALUES ($1, $2) '
                       "ON CONFLICT (live) DO UPDATE SET epoch = excluded.epoch", live, epoch)
    return epoch


async def _drop_stale_caches(settings: Settings, live: str, epochs: dict[str, int]) -> int | None:
    """The old build's Redis keys, dropped once no reader can still be reading them (a reader
    trusts the epochs it read for ``EPOCH_FRESH_S``, and may fill a key of them until then):
    none of them expires, and they hold what the old build held."""
    from memstream.projections import cache_keys, redis_client

    await asyncio.sleep(cache_keys.EPOCH_FRESH_S + 4)  # and a read begun just before then
    redis = redis_client.connect(settings.redis_url, timeout_s=5, connect_timeout_s=2)
    try:
        return await cache_keys.drop_stale(redis, live, epochs)
    except Exception:  # a user's forget still deletes theirs, of every epoch
        log.warning("could not drop the old build's Redis keys (memstream:%s:e<old epoch>:*): delete them by hand",
                    live, exc_info=True)
        return None
    finally:
        await redis.aclose()
