"""Operating it on the real stack: a worker that finds partitions added under it stops, saying
what happened and what to do, rather than project users whose records now straddle partitions."""
from __future__ import annotations

import asyncio

import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewPartitions

pytestmark = pytest.mark.asyncio


async def test_a_worker_stops_with_a_clear_error_when_partitions_are_added_under_it(settings, workers):
    w = workers()
    await w.wait_assigned()
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap)
    await admin.start()
    try:  # what `kafka-topics --alter --partitions 6` does
        await admin.create_partitions({settings.events_topic: NewPartitions(total_count=settings.partitions + 2)})
    finally:
        await admin.close()
    code = await asyncio.to_thread(w.proc.wait, 60)
    assert code == 78, w.log()[-3000:]
    assert "the partition count changed under this worker" in w.log()
    assert "docs/operations.md" in w.log()  # where to read what to do


@pytest.mark.slow  # a load test (the longest of the suite); the switch itself is covered by the tests below
async def test_a_rebuilt_schema_is_switched_in_under_read_and_write_load_and_the_workers_continue_on_it(
        settings, conn, dsn, workers):
    """Rebuild into a side schema while the live one serves, then switch with the workers running:
    readers reading all along never fail nor see a half-built schema, and see the new one at once
    (its rows carry a mark the old ones lack); hosts appending all along lose nothing; the
    workers pause for the swap and project onto the new schema what was appended meanwhile."""
    from memstream.embedding import default_embedder
    from memstream.projections.db import drop_schema
    from memstream.read_client import MemoryReader
    from memstream.streams.log.producer import TurnLog
    from memstream.streams.ops.switch import SwitchRefused, switch
    from memstream.streams.ops.replay import replay

    from .conftest import wait_until
    from .helpers import schemas_named, turns

    w = workers()
    await w.wait_assigned()
    async with TurnLog(settings) as log:
        await log.append_many(turns(40, users=2, prefix="bg"))
    await wait_until(lambda: conn.fetchval("SELECT count(*) = 40 FROM episodes"), what="40 episodes")
    side = settings.postgres_schema + "_next"
    await replay(settings, dsn, side, ["episodes", "facts", "graph", "commands"])
    async with TurnLog(settings) as log:  # decided after the rebuild: the switch catches the side schema up
        await log.append_many(turns(4, users=2, prefix="bg2"))
    await wait_until(lambda: conn.fetchval("SELECT count(*) = 44 FROM episodes"), what="44 episodes")
    await conn.execute(f'UPDATE "{side}".episodes SET assistant_message = assistant_message || \' [next]\'')

    reader = await MemoryReader.connect(settings, dsn, embedder=default_embedder())
    seen, stop = [], asyncio.Event()

    async def read_all_along():
        while not stop.is_set():
            ctx = await reader.read("bg-user-0", "conv-0-0", "tell me about my cat Miso", k=5)
            assert not ctx.degraded, ctx.degraded
            seen.append(all(e.assistant_message.endswith("[next]") for e in ctx.episodes) and bool(ctx.episodes))

    appended = []

    async def append_all_along():  # hosts go on appending: only the projections pause for the switch
        async with TurnLog(settings) as log:
            while not stop.is_set():
                appended.append(await log.append(turns(1, users=1, prefix=f"bgw{len(appended)}")[0]))
                await asyncio.sleep(0.1)

    load = asyncio.ensure_future(read_all_along())
    writes = asyncio.ensure_future(append_all_along())
    try:
        await asyncio.sleep(1)
        # A rebuild of the log as it is, switched without --force while hosts go on appending:
        # compared where the paused workers left the live schema, not at the log's end, it is equal.
        again = settings.postgres_schema + "_again"
        await replay(settings, dsn, again, ["episodes", "facts", "graph", "commands"])
        plain = await switch(settings, dsn, again, drop_old=True)
        assert plain["differences"] == {} and plain["old"] is None
        with pytest.raises(SwitchRefused, match="differs"):  # the mark: not what a replay of the log writes
            await asyncio.wait_for(switch(settings, dsn, side), 120)
        done = await asyncio.wait_for(switch(settings, dsn, side, force=True), 120)
        await asyncio.sleep(1)
    finally:
        stop.set()
        await load
        await writes
        await reader.close()
    assert done["old"] == f"{settings.postgres_schema}_old_1"
    # The old build's caches are gone (none expires), and only they.
    from memstream.projections import cache_keys
    import redis.asyncio as aioredis

    epochs = dict(await conn.fetch("SELECT projection, epoch FROM projection_epochs"))
    redis = aioredis.from_url(settings.redis_url)
    try:
        keys = [cache_keys.parse(settings.postgres_schema, k.decode())
                async for k in redis.scan_iter(match=f"memstream:{settings.postgres_schema}:*")]
    finally:
        await redis.aclose()
    assert done["stale_cache_keys_dropped"] > 0
    assert all(epoch == epochs[cache_keys.TIERS[tier]] for epoch, tier, _ in keys), keys
    carried = "SELECT projection, topic, partition, next_offset FROM {}.projection_positions " \
              "WHERE projection IN ('formation', 'sealing') ORDER BY 1, 2, 3"
    now, then = (await conn.fetch(carried.format(settings.postgres_schema)), await conn.fetch(carried.format(done["old"])))
    assert [r[:3] for r in now] == [r[:3] for r in then] and all(a[3] >= b[3] for a, b in zip(now, then))
    assert appended and await conn.fetchval("SELECT count(*) FROM episodes WHERE user_id LIKE 'bg%-user-%' "
                                            "AND user_id NOT LIKE 'bgw%'") == 44  # the 4 decided after the rebuild
    flips = [a for a, b in zip(seen, seen[1:]) if a != b]
    assert seen[0] is False and seen[-1] is True and len(flips) == 1  # old, then new, never back
    assert await schemas_named(dsn, side) == set()  # the side schema is the live one now
    assert "a switch of schema" in w.log() and w.proc.poll() is None  # paused for it, going on after it
    try:
        async with TurnLog(settings) as log:
            await log.append(turns(1, users=1, prefix="bg3")[0])
        total = 45 + len(appended)  # and every turn appended during the switch
        await wait_until(lambda: conn.fetchval("SELECT count(*) = $1 FROM episodes", total), timeout=90,
                         what="the turns appended during the switch and a new one, postings and all")
        assert await conn.fetchval("SELECT count(*) FROM episodes_terms WHERE user_id = 'bg3-user-0'") > 0
    finally:
        await drop_schema(dsn, done["old"])


async def test_memstream_rebuild_builds_beside_the_live_schema_and_switches_with_the_workers_running(
        settings, conn, dsn, workers):
    import json
    import subprocess
    import sys

    from memstream.projections.db import drop_schema
    from memstream.stack.worker_process import worker_env
    from memstream.streams.log.producer import TurnLog

    from .conftest import HOME, ROOT, wait_until
    from .helpers import schemas_named, turns

    env = worker_env(settings.model_copy(update={"home": HOME}))

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "memstream.cli", *args], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=300)

    w = workers()
    await w.wait_assigned()
    async with TurnLog(settings) as log:
        await log.append_many(turns(20, users=2, prefix="rb"))
    await wait_until(lambda: conn.fetchval("SELECT count(*) = 20 FROM episodes"), what="20 episodes")
    built = settings.postgres_schema + "_rebuild"
    await conn.execute("INSERT INTO reforms VALUES ('a.reform', 'offline', NULL, now(), NULL, NULL)")
    try:
        done = cli("rebuild", "--drop-old", "--json")
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["live"] == settings.postgres_schema
        assert await conn.fetchval("SELECT count(*) FROM episodes") == 20
        assert await conn.fetchval("SELECT topic FROM reforms") == "a.reform"  # the registry went on with it
        assert await schemas_named(dsn, built) == set() and await schemas_named(dsn, f"{settings.postgres_schema}_old") == set()
        async with TurnLog(settings) as log:  # the workers went on, on the rebuilt schema
            await log.append(turns(1, users=1, prefix="rb2")[0])
        await wait_until(lambda: conn.fetchval("SELECT count(*) = 21 FROM episodes"), timeout=60, what="a new turn")
        assert w.proc.poll() is None
    finally:
        await drop_schema(dsn, built)


async def test_a_switch_refuses_an_unfinished_rebuild_and_the_key_store_and_names_the_old_schema_past_the_kept_ones(
        settings, conn, dsn):
    from memstream.projections.db import drop_schema
    from memstream.streams.ops.switch import SwitchRefused, switch
    from memstream.streams.ops.replay import ReplayError, replay

    side, live = settings.postgres_schema + "_next", settings.postgres_schema
    await replay(settings, dsn, side, ["episodes", "facts", "graph", "commands"])
    try:
        from memstream.streams.worker import switch_lock

        async with switch_lock.building(dsn, side):  # as a replay or rebuild into it holds it
            with pytest.raises(SwitchRefused, match="still writing"):
                await switch(settings, dsn, side)
        await conn.execute(f'DROP INDEX "{side}".episodes_tsv_gin')  # a bulk rebuild killed before its indexes
        with pytest.raises(SwitchRefused, match="lacks indexes"):
            await switch(settings, dsn, side)
        with pytest.raises(SwitchRefused, match="key store"):
            await switch(settings, dsn, settings.keys_schema)
        with pytest.raises(ReplayError, match="key store"):
            await replay(settings, dsn, settings.keys_schema, ["episodes"])
        await drop_schema(dsn, side)
        await replay(settings, dsn, side, ["episodes", "facts", "graph", "commands"])
        # Replayed from a reform's topic (or another deployment's): a catch-up would mix this
        # log's decisions into it, so it is refused before anything is applied.
        await conn.execute(f'INSERT INTO "{side}".projection_positions VALUES '
                           f"('facts', '{settings.decisions_topic}.reform-offline-strict', 0, 3)")
        held = await conn.fetchval(f'SELECT sum(next_offset) FROM "{side}".projection_positions')
        with pytest.raises(SwitchRefused, match="reform-offline-strict, not of this log's topics"):
            await switch(settings, dsn, side)
        assert await conn.fetchval(f'SELECT sum(next_offset) FROM "{side}".projection_positions') == held
        await conn.execute(f'DELETE FROM "{side}".projection_positions WHERE topic LIKE \'%.reform-%\'')
        await conn.execute(f'CREATE SCHEMA "{live}_old_2"')  # _old_1 dropped, _old_2 kept
        done = await switch(settings, dsn, side)
        assert done["old"] == f"{live}_old_3"
        given = await conn.fetchval(f'SELECT max(epoch) FROM "{live}".projection_epochs')
        # Undone as docs/operations.md says (the old schema renamed back, the new one aside, here dropped),
        # then a fresh rebuild switched in: its epoch is past the undone build's, whose Redis
        # keys may be there still (a forget since the undo never reached them).
        await conn.execute(f'DROP SCHEMA "{live}" CASCADE')
        await conn.execute(f'ALTER SCHEMA "{live}_old_3" RENAME TO "{live}"')
        await replay(settings, dsn, side, ["episodes", "facts", "graph", "commands"])
        await switch(settings, dsn, side)
        assert await conn.fetchval(f'SELECT min(epoch) FROM "{live}".projection_epochs') > given
    finally:
        for name in (side, f"{live}_old_2", f"{live}_old_3"):
            await drop_schema(dsn, name)
